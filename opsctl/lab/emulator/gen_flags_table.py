#!/usr/bin/env python3
"""Generate the emulator's accepted-flag table FROM THE REAL SGLang parser.

Run with a Python that can import sglang 0.5.23 (scripts/sglang-venv builds
.venv-sglang):

    PYTHONHASHSEED=0 .venv-sglang/bin/python opsctl/lab/emulator/gen_flags_table.py   # writes the table
    .venv-sglang/bin/python opsctl/lab/emulator/gen_flags_table.py --stdout   # prints it

The table (sglang/lab/flags_table.json) lists every argparse action that
`ServerArgs.add_cli_args(parser)` registers: option strings, dest, nargs,
choices, the kind of action and the type's name. The emulator rebuilds an
argparse parser from it, so it rejects exactly the flags, choices and value
types that SGLang 0.5.23 rejects. tests/lab/test_flags_table.py checks the
committed table against the real parser.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "sglang" / "lab" / "flags_table.json"


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def build_table() -> dict:
    # this file sits next to the emulator's own `sglang` package: import the REAL one
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    actions = []
    for act in parser._actions:
        if isinstance(act, argparse._HelpAction):
            continue
        kind = type(act).__name__
        type_name = None
        if act.type is not None:
            type_name = getattr(act.type, "__name__", type(act.type).__name__)
        actions.append({
            "option_strings": list(act.option_strings),
            "dest": act.dest,
            "kind": kind,
            "nargs": act.nargs if not isinstance(act.nargs, int) else int(act.nargs),
            "choices": _jsonable(list(act.choices)) if act.choices is not None else None,
            "type": type_name,
            "const": _jsonable(act.const),
            "default": _jsonable(act.default),
            "required": bool(act.required),
        })
    return {"sglang_version": getattr(sglang, "__version__", "?"), "generated_by": "gen_flags_table.py",
            "actions": actions}


def main() -> int:
    table = build_table()
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    if "--stdout" in sys.argv:
        sys.stdout.write(text)
    else:
        OUT.write_text(text)
        print(f"wrote {OUT} ({len(table['actions'])} actions, sglang {table['sglang_version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
