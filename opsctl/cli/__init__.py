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
_COMMAND_MODULES = ["render", "deploy", "validate", "diagnose", "bench", "tune", "check", "lab", "watch", "wheelhouse",
                    "config"]


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


def _usage_error(exc: BaseException) -> str | None:
    """typer's own usage error (unknown command/option/value, missing argument) as one
    line, or None. Matched by shape, not by importing click: typer >= 0.25 bundles its
    own copy of click, older typer uses click itself."""
    if not any(c.__name__ == "UsageError" for c in type(exc).__mro__) or not hasattr(exc, "format_message"):
        return None
    ctx = getattr(exc, "ctx", None)
    message = " ".join(str(exc.format_message()).split())
    if ctx is None:
        return message
    usage = " ".join(ctx.get_usage().split()).removeprefix("Usage: ")
    return f"{message} (usage: {usage}; see '{ctx.command_path} --help')"


def main() -> None:
    # Ctrl-C/SIGTERM during a deploy, rollback or tune is handled by the core's brake
    # (opsctl/brake.py): it rolls back and raises Interrupted (exit 130).
    try:
        app(prog_name="opsctl", standalone_mode=False)
    except OpsctlError as exc:
        if _output.STATE.json and (not _output.STATE.emitted or _output.STATE.stream):
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
    except Exception as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and getattr(exc, "ctx", None) is not None:
            print(exc.ctx.get_help())  # a bare `opsctl` (or command group) shows its help
            sys.exit(0)
        usage = _usage_error(exc)
        if usage is not None:
            _output.error(usage)
            sys.exit(2)
        if hasattr(exc, "exit_code") and hasattr(exc, "format_message"):  # typer's other command-line errors
            _output.error(" ".join(str(exc.format_message()).split()))
            sys.exit(int(exc.exit_code))
        raise
