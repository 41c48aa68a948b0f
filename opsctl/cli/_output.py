"""Printing for the CLI: rich for people, JSON for machines. Core modules never print."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

def _width(stream) -> int | None:
    # piped output (logs, CI, tests) is not a terminal: do not wrap tables at 80 columns
    return None if stream.isatty() else 200


console = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err_console = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


@dataclass
class _State:
    json: bool = False
    emitted: bool = False  # a JSON document already went to stdout
    stream: bool = False   # stdout is a stream of JSON event lines: an error ends it with its own line


STATE = _State()


def set_json(enabled: bool) -> None:
    STATE.json = enabled


def error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)


def info(message: str) -> None:
    """Human progress/status; goes to stderr in --json mode so stdout stays parseable."""
    (err_console if STATE.json else console).print(message, markup=False, highlight=False)


def emit_json(obj: Any) -> None:
    STATE.emitted = True
    sys.stdout.write(json.dumps(obj, indent=None, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def table(title: str | None, columns: list[str], rows: list[list[Any]], *, narrow: bool = False) -> None:
    """`narrow`: no vertical rules and one space between columns (a table that must fit 80 columns)."""
    t = Table(title=title, show_lines=False, header_style="bold",
              **({"box": box.SIMPLE_HEAD, "padding": (0, 1), "collapse_padding": True, "pad_edge": False,
                 "show_edge": False} if narrow else {}))
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    (err_console if STATE.json else console).print(t)
