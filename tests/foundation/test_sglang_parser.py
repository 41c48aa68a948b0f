"""The rendered server arguments are accepted by SGLang 0.5.23's own parser
(`ServerArgs.add_cli_args`), run from the real sglang wheel in .venv-sglang
(built by scripts/sglang-venv; CI builds it before the tests)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from opsctl.config import load_inventory
from opsctl.render import render

REPO = Path(__file__).resolve().parents[2]
SGLANG_PY = REPO / ".venv-sglang/bin/python"

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(not SGLANG_PY.exists(), reason="no .venv-sglang: run scripts/sglang-venv")]

PARSE = r"""
import argparse, json, sys
from importlib.metadata import version
from sglang.srt.server_args import ServerArgs
try:
    from sglang.srt.plugins import load_plugins
    load_plugins()
except Exception as exc:  # plugins are optional for the parse itself
    print("plugins:", exc, file=sys.stderr)
parser = argparse.ArgumentParser(exit_on_error=False)
ServerArgs.add_cli_args(parser)
argv = json.loads(sys.stdin.read())
try:
    ns = parser.parse_args(argv)
except (argparse.ArgumentError, SystemExit) as exc:
    print(json.dumps({"ok": False, "error": str(exc)})); sys.exit(0)
print(json.dumps({"ok": True, "version": version("sglang"), "args": {k: v for k, v in vars(ns).items()
      if isinstance(v, (int, float, str, bool, type(None)))}}))
"""


def parse_with_sglang(args: list[str], env: dict | None = None) -> dict:
    import os

    proc = subprocess.run([str(SGLANG_PY), "-c", PARSE], input=json.dumps(args), capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("profile,budget", [("ar-tp8", None), ("ar-ep8", None), ("dflash", None), ("ddtree", 16),
                                            ("ddtree", 32)])
def test_rendered_argv_is_accepted_by_sglang_0_5_23(profile, budget):
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    rendered = render(host, host.profile(profile, budget))
    assert rendered.argv[1:3] == ["-m", "sglang.launch_server"]
    result = parse_with_sglang(rendered.argv[3:], env=rendered.env)
    assert result["ok"], result
    assert result["version"] == "0.5.23"
    args = result["args"]
    assert args["tp_size"] == 8
    assert args["port"] == 30000
    if budget:
        assert args["speculative_num_draft_tokens"] == budget + 1
        assert args["speculative_algorithm"] == "DDTREE"
    if profile == "ar-ep8":
        assert args["ep_size"] == 8


def test_sglang_parser_rejects_a_flag_it_does_not_know():
    """Guards the test above: a flag removed in 0.5.23 must fail."""
    result = parse_with_sglang(["--model-path", "/m", "--cuda-graph-max-bs", "32"])
    assert not result["ok"]


def test_rendered_capture_list_is_parsed_as_the_decode_batch_sizes():
    """--cuda-graph-bs-decode b1 b2 ... (nargs '+', ints): what --capture-from-traffic renders (issue #51)."""
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    rendered = render(host, host.profile("ddtree", 16, cuda_graph_bs=(1, 2, 4, 9, 16, 32)))
    proc = subprocess.run([str(SGLANG_PY), "-c", PARSE.replace(
        "if isinstance(v, (int, float, str, bool, type(None)))", "if isinstance(v, (int, float, str, bool, list, type(None)))")],
        input=json.dumps(rendered.argv[3:]), capture_output=True, text=True, timeout=300, env=None)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    assert result["args"]["cuda_graph_bs_decode"] == [1, 2, 4, 9, 16, 32]
    assert result["args"]["cuda_graph_max_bs_decode"] == 32
    assert result["args"]["speculative_num_draft_tokens"] == 17
