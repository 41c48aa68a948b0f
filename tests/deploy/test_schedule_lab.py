"""A DDTree budget schedule deployed end to end on the lab: rendered into the release, loaded
by the (emulated) runtime, validated band by band, gated at every level against the
baseline; and a capture whose width does not match its band is caught and rolled back."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
SCHEDULE = "1:16,3:4,16:0"  # what tune derives from the levels 1, 8, 32 (bands start between levels)


def opsctl(*args: str, inv: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opsctl", *args, "-i", str(inv)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


def current(lab) -> str:
    return lab.run("readlink /opt/opsctl/current", check=False).stdout.strip().split("/")[-1]


def ledger(lab) -> list[dict]:
    return [json.loads(x) for x in lab.run("cat /opt/opsctl/ledger.jsonl", check=False).stdout.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def sched_lab(clean_lab, baselined, tmp_path_factory):
    """ar-tp8 live with its baseline at the levels 1, 8 and 32 (the model: a big tree wins at 1,
    a small one at 8, none at 32)."""
    inv = tmp_path_factory.mktemp("sched") / "inv"
    shutil.copytree(clean_lab.inventory_dir, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("concurrency: [1, 4, 8]", "concurrency: [1, 8, 32]"))
    baselined.restore(clean_lab)   # benched at 1, 8 and 32 among its levels
    clean_lab.inv = inv
    return clean_lab


def test_schedule_is_deployed_validated_per_band_and_passes_the_gate_at_every_level(sched_lab):
    p = opsctl("deploy", "ddtree", "--budget-schedule", SCHEDULE, "--yes", "--skip-checks", "--json", inv=sched_lab.inv)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])["outcomes"][0]
    assert out["result"] == "promoted", out
    rel = current(sched_lab)
    assert rel.startswith("ddtree-s1b16-3b4-16b0-")
    doc = json.loads(sched_lab.run(f"cat /opt/opsctl/releases/{rel}/ddtree-schedule.json").stdout)
    assert doc["schedule"] == SCHEDULE
    env = sched_lab.run(f"cat /opt/opsctl/releases/{rel}/sglang.env").stdout
    assert "SGLANG_DDTREE_SCHEDULE_FILE=/opt/opsctl/current/ddtree-schedule.json" in env
    # validation at deploy time checked every band's width on every rank
    val = [r for r in ledger(sched_lab) if r["action"] == "validation"][-1]
    assert val["result"] == "ok"
    # the gate: every level passed against the baseline; the schedule's bands did what the model says
    verdict = [r for r in ledger(sched_lab) if r["action"] == "verdict"][-1]
    assert verdict["status"] == "pass", verdict
    st = json.loads(opsctl("status", "--json", inv=sched_lab.inv).stdout)[0]
    assert st["budget_schedule"] == SCHEDULE and st["release"] == rel
    live = opsctl("validate", "--json", inv=sched_lab.inv)
    assert live.returncode == 0, live.stdout[-2000:]
    found = {f["check"]: f for f in json.loads(live.stdout)["findings"]}
    assert found["capture.band_widths"]["ok"]
    assert "batch 1-2: 17 tokens/request" in found["capture.band_widths"]["diagnosis"]
    assert "batch 16+: 1 token/request" in found["capture.band_widths"]["diagnosis"]
    human = opsctl("status", inv=sched_lab.inv)
    assert SCHEDULE in human.stdout


def test_a_band_captured_at_the_wrong_width_is_caught_and_rolled_back(sched_lab):
    before = current(sched_lab)
    with sched_lab.fault("wrong_verify_tokens", num_tokens_per_req=8, band=1, algorithm="DDTREE"):
        p = opsctl("deploy", "ddtree", "--budget-schedule", "1:16,3:8,16:0", "--yes", "--skip-checks",
                   inv=sched_lab.inv)
    assert p.returncode != 0, p.stdout[-2000:]
    text = p.stdout + p.stderr
    assert "capture.band_widths" in text and "batch 3-14 (budget 8)" in text
    assert "has its verify graph captured with 8 tokens/request" in text
    assert "needs 9" in text
    assert current(sched_lab) == before  # back on the last good release (the schedule that passed)
    assert sched_lab.run("systemctl is-active sglang-k26").stdout.strip() == "active"
