"""Printing for the CLI: rich for people, JSON for machines. Core modules never print.

rich is imported when something is first printed for people (`console` and `err_console` are
made on first use): `opsctl --help` and a command that prints JSON only do not pay for it."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    console: Console
    err_console: Console


def _width(stream) -> int | None:
    # piped output (logs, CI, tests) is not a terminal: do not wrap tables at 80 columns
    return None if stream.isatty() else 200


def __getattr__(name: str) -> Any:
    """`console` (stdout) and `err_console` (stderr), made on first use and kept as module globals
    (a test may replace either with monkeypatch.setattr)."""
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    stream = sys.stderr if name == "err_console" else sys.stdout
    made = Console(stderr=name == "err_console", highlight=False, soft_wrap=True, width=_width(stream))
    globals()[name] = made
    return made


def _console(stderr: bool) -> Console:
    name = "err_console" if stderr else "console"
    found = globals().get(name)
    return found if found is not None else __getattr__(name)


@dataclass
class _State:
    json: bool = False
    emitted: bool = False  # a JSON document already went to stdout
    stream: bool = False   # stdout is a stream of JSON event lines: an error ends it with its own line


STATE = _State()


def set_json(enabled: bool) -> None:
    STATE.json = enabled


def error(message: str) -> None:
    _console(True).print(f"[bold red]error:[/] {message}", markup=True, highlight=False)


def info(message: str) -> None:
    """Human progress/status; goes to stderr in --json mode so stdout stays parseable."""
    _console(STATE.json).print(message, markup=False, highlight=False)


def emit_json(obj: Any) -> None:
    STATE.emitted = True
    sys.stdout.write(json.dumps(obj, indent=None, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def table(title: str | None, columns: list[str], rows: list[list[Any]], *, narrow: bool = False) -> None:
    """`narrow`: no vertical rules and one space between columns (a table that must fit 80 columns)."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold",
              **({"box": box.SIMPLE_HEAD, "padding": (0, 1), "collapse_padding": True, "pad_edge": False,
                 "show_edge": False} if narrow else {}))
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    _console(STATE.json).print(t)
