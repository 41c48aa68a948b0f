"""Command line of `sglang.launch_server` 0.5.23, rebuilt from flags_table.json.

The table is generated from the real `ServerArgs.add_cli_args(parser)` by
opsctl/lab/emulator/gen_flags_table.py, so this parser accepts and rejects
exactly what SGLang 0.5.23's does (unknown flags, bad choices, bad value
types all exit 2 with argparse's usage error, as SGLang does).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("flags_table.json")


def load_table() -> dict:
    return json.loads(TABLE_PATH.read_text())


def _human_readable_int(value: str) -> int:
    v = value.strip().lower()
    mult = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3}
    if v and v[-1] in mult:
        return int(float(v[:-1]) * mult[v[-1]])
    return int(v)


def _json_list(value: str):
    out = json.loads(value)
    if not isinstance(out, list):
        raise argparse.ArgumentTypeError(f"expected a JSON list, got {value!r}")
    return out


def _nullable_str(value: str):
    return None if value.lower() in ("none", "null", "") else value


def _lower_str(value: str) -> str:
    return value.lower()


TYPES = {
    "int": int, "float": float, "str": str, "loads": json.loads, "json_list_type": _json_list,
    "human_readable_int": _human_readable_int, "nullable_str": _nullable_str,
    "parse_cuda_graph_backend_arg": _lower_str,
}


class _Deprecated(argparse.Action):
    """SGLang's Deprecated*Action: accepted, warns."""

    def __init__(self, option_strings, dest, nargs=0, const=True, **kw):
        kw.pop("type", None)
        super().__init__(option_strings, dest, nargs=nargs, const=const, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"WARNING: {option_string} is deprecated.", file=sys.stderr, flush=True)
        setattr(namespace, self.dest, self.const)


def build_parser(prog: str = "sglang serve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    for a in load_table()["actions"]:
        opts = a["option_strings"]
        if not opts:
            continue
        kind = a["kind"]
        kw: dict = {"dest": a["dest"], "default": a["default"]}
        if a.get("required"):
            kw["required"] = True
        if kind == "_StoreTrueAction":
            parser.add_argument(*opts, action="store_true", **kw)
        elif kind == "_StoreFalseAction":
            parser.add_argument(*opts, action="store_false", **kw)
        elif kind == "_StoreConstAction":
            parser.add_argument(*opts, action="store_const", const=a["const"], **kw)
        elif kind == "BooleanOptionalAction":
            parser.add_argument(*opts, action=argparse.BooleanOptionalAction, **kw)
        elif kind.startswith("Deprecated"):
            parser.add_argument(*opts, action=_Deprecated, nargs=0,
                                const=a["const"] if a["const"] is not None else True, **kw)
        else:  # _StoreAction, _AppendAction, custom store-like actions (LoRAPathAction)
            typ = TYPES.get(a["type"] or "str", str)
            if a["nargs"] is not None:
                kw["nargs"] = a["nargs"]
            if a["choices"] is not None:
                kw["choices"] = a["choices"]
                if typ not in (str, _lower_str, int, float):
                    typ = str
            action = "append" if kind == "_AppendAction" else "store"
            if a["nargs"] == 0:
                parser.add_argument(*opts, action="store_const", const=a["const"], **kw)
            else:
                parser.add_argument(*opts, action=action, type=typ, **kw)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)
