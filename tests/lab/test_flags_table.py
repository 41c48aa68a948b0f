"""The emulator's accepted-flag table equals SGLang 0.5.23's real parser (ServerArgs.add_cli_args).

Needs a Python that imports sglang 0.5.23: .venv-sglang (scripts/sglang-venv), or
OPSCTL_SGLANG_PYTHON=/path/to/python. Skipped when neither is there.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GEN = REPO / "opsctl" / "lab" / "emulator" / "gen_flags_table.py"
TABLE = REPO / "opsctl" / "lab" / "emulator" / "sglang" / "lab" / "flags_table.json"


def _sglang_python() -> str | None:
    for cand in (os.environ.get("OPSCTL_SGLANG_PYTHON"), str(REPO / ".venv-sglang" / "bin" / "python")):
        if cand and Path(cand).exists():
            ok = subprocess.run([cand, "-c", "import sglang.srt.server_args"], capture_output=True, timeout=300)
            if ok.returncode == 0:
                return cand
    return None


@pytest.mark.sglang
def test_flag_table_matches_the_real_parser():
    py = _sglang_python()
    if py is None:
        pytest.skip("no Python with sglang 0.5.23 (run scripts/sglang-venv or set OPSCTL_SGLANG_PYTHON)")
    proc = subprocess.run([py, str(GEN), "--stdout"], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONHASHSEED="0"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    real = json.loads(proc.stdout)
    committed = json.loads(TABLE.read_text())
    assert real["sglang_version"] == "0.5.23"
    def norm(actions):  # some choice lists come from sets: their order is not part of the contract
        return [{**a, "choices": sorted(map(str, a["choices"])) if a["choices"] is not None else None}
                for a in actions]

    assert norm(committed["actions"]) == norm(real["actions"]), (
        "flags_table.json is stale: regenerate with "
        f"{py} opsctl/lab/emulator/gen_flags_table.py")


def test_flag_table_has_the_deployment_flags():
    table = json.loads(TABLE.read_text())
    opts = {o for a in table["actions"] for o in a["option_strings"]}
    for flag in ("--model-path", "--tp-size", "--ep-size", "--dp-size", "--moe-a2a-backend",
                 "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-draft-tokens",
                 "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-draft-load-format",
                 "--speculative-dflash-block-size", "--cuda-graph-max-bs-decode", "--cuda-graph-bs-decode",
                 "--cuda-graph-backend-decode", "--disable-decode-cuda-graph", "--host", "--port",
                 "--mem-fraction-static", "--attention-backend", "--load-format", "--skip-tokenizer-init",
                 "--enable-metrics", "--decode-log-interval"):
        assert flag in opts, flag
    for gone in ("--cuda-graph-max-bs", "--enable-ep-moe"):
        assert gone not in opts
