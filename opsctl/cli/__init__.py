"""The opsctl command line. Parses options, calls the core API, prints.

Domain errors become a one-line message and an exit code here, and only here:
2 bad input, 3 host unreachable/command failed, 4 lock held, 5 deploy failed
(rolled back), 6 checks/validation/gate failed, 7 lab failure.
"""
from __future__ import annotations

import importlib
import json
import sys

import typer

from opsctl import __version__
from opsctl.cli import _output
from opsctl.errors import OpsctlError

app = typer.Typer(
    name="opsctl",
    help=(
        "Put a speculative-decoding SGLang configuration live on the GPU host safely, "
        "and take it back.\n\n"
        "A deploy renders the unit and launch config, ships the runtime and drafter as a new "
        "release, switches to it atomically, proves CUDA-graph capture from the journal, "
        "benchmarks it against the autoregressive baseline and rolls back when it is worse "
        "or broken.\n\n"
        "Examples:\n\n"
        "  opsctl lab up                                    # boot the local lab host\n\n"
        "  opsctl deploy ddtree --budget 16 -i inventories/lab\n\n"
        "  opsctl rollback -i inventories/lab\n\n"
        "  opsctl check post -i inventories/lab"
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# command groups, each module exposes register(app)
_COMMAND_MODULES = ["render", "deploy", "validate", "bench", "check", "lab", "wheelhouse"]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"opsctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass


for _name in _COMMAND_MODULES:
    importlib.import_module(f"opsctl.cli.{_name}").register(app)


def main() -> None:
    try:
        app(standalone_mode=False)
    except OpsctlError as exc:
        if _output.STATE.json and not _output.STATE.emitted:
            print(json.dumps({"ok": False, **exc.as_dict()}), file=sys.stdout)
        _output.error(exc.one_line())
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _output.error("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        _output.error("interrupted: the host keeps serving what it served (see 'opsctl status')")
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors and anything unexpected
        import click

        if isinstance(exc, click.exceptions.UsageError):
            exc.show()
            sys.exit(2)
        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
