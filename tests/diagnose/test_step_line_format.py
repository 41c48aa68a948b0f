"""The runtime's `DDTree step parts:` line has three copies of its format: the runtime writes it
(runtime/src/sglang_ddtree/stepparts.py), the lab's emulator writes it (runtime_msgs.py) and
opsctl reads it (opsctl/onhost/diagnosis.py). Each writer's line is read back by both readers."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from opsctl.onhost.diagnosis import PART_KEYS, parse_step_parts

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "opsctl" / "lab" / "emulator"))
from sglang.lab import runtime_msgs  # noqa: E402

PARTS = {"drafter_ms": 0.334, "tree_ms": 0.041, "prep_ms": 1.162, "target_ms": 18.52, "commit_ms": 0.111}
RUNTIME_MS = {k.removesuffix("_ms"): v for k, v in {**PARTS, "step_ms": 21.004}.items()}   # the runtime's part names


@pytest.fixture(scope="module")
def runtime_stepparts():
    # standard library only: loaded from its file, without the package (whose __init__ imports torch)
    spec = importlib.util.spec_from_file_location("ddtree_stepparts", REPO / "runtime/src/sglang_ddtree/stepparts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_runtimes_line_is_read_by_opsctl(runtime_stepparts):
    line = "[2026-12-05 10:00:00 TP0] " + runtime_stepparts.format_line(8, 16, 10, 200, RUNTIME_MS)
    assert line.endswith("DDTree step parts: bs=8 budget=16 sampled=10 of=200 drafter_ms=0.334 tree_ms=0.041 "
                         "prep_ms=1.162 target_ms=18.520 commit_ms=0.111 step_ms=21.004")
    (sp,) = parse_step_parts([line])
    assert (sp.bs, sp.budget, sp.sampled, sp.of, sp.step_ms) == (8, 16, 10, 200, 21.004)
    assert sp.parts == PARTS and tuple(PART_KEYS) == tuple(f"{k}_ms" for k in runtime_stepparts.PARTS if k != "step")


def test_the_emulators_line_is_the_runtimes(runtime_stepparts):
    line = runtime_msgs.DDTREE_STEP_PARTS.format(bs=8, budget=16, sampled=10, of=200, step_ms=21.004, **PARTS)
    assert line == runtime_stepparts.format_line(8, 16, 10, 200, RUNTIME_MS)
    assert runtime_stepparts.parse_line(line) == {"bs": 8, "budget": 16, "sampled": 10, "of": 200, **PARTS,
                                                  "step_ms": 21.004}
    assert runtime_stepparts.StepParts.from_env(env={}).every == runtime_msgs.STEP_PARTS_EVERY_DEFAULT  # both 200
