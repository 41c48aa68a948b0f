"""opsctl tune on the lab: the emulator's model of the site decides which budget wins where,
and the release that served before serves afterwards in every case."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]


def opsctl(*args: str, inv: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*OPSCTL, *args, "-i", str(inv)], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def current(lab) -> str:
    return lab.run("readlink /opt/opsctl/current", check=False).stdout.strip().split("/")[-1]


def ledger(lab) -> list[dict]:
    return [json.loads(x) for x in lab.run("cat /opt/opsctl/ledger.jsonl", check=False).stdout.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def tuned_lab(clean_lab, baselined, tmp_path_factory):
    """ar-tp8 live; the gate's levels 1 and 32 (DDTree wins at 1, loses at 32 in the model)."""
    inv = tmp_path_factory.mktemp("tune") / "inv"
    shutil.copytree(clean_lab.inventory_dir, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("concurrency: [1, 4, 8]", "concurrency: [1, 32]")
                  .replace("max_concurrency: 32", "max_concurrency: 64").replace("cuda_graph_max_bs: 32",
                                                                                 "cuda_graph_max_bs: 64"))
    baselined.restore(clean_lab)   # benched at 1 and 32 among its levels
    clean_lab.inv = inv
    clean_lab.baseline = current(clean_lab)
    return clean_lab


def test_tune_finds_the_budget_per_level_measures_its_schedule_and_restores_the_live_release(tuned_lab, tmp_path):
    # one release per trial (the one-restart tune against it: test_tune_onerestart_lab.py)
    p = opsctl("tune", "ddtree", "--budgets", "4,16", "--restart-per-trial", "--yes", "--json", "--out",
               str(tmp_path / "t"), inv=tuned_lab.inv)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.splitlines()[-1])
    assert [t["status"] for t in res["trials"]] == ["measured", "measured", "measured"], res["trials"]
    assert res["best"] == {"1": 16, "32": 0}  # the model: budget 16 wins alone, nothing beats AR at 32
    assert res["schedule"] == "1:16,6:0"  # band starts between the levels: a load of 32 decodes in batches < 32
    single4, single16, sched = res["trials"]
    # the table's diagnose cells: the accept each level needs, and why C=32 loses (32 x 17 tokens a verify)
    s16 = single16["levels"]
    assert s16["1"]["accept"] > s16["1"]["step_ratio"] and s16["1"]["why"] is None
    assert s16["32"]["accept"] < s16["32"]["step_ratio"] and s16["32"]["why"].startswith("verify_compute"), s16
    assert res["prediction_check"] == {"release": None, "ts": None, "levels": []}   # no DDTree verdict on record yet
    assert sched["schedule"] == "1:16,6:0" and sched["release"].startswith("ddtree-s1b16-6b0-")
    lv = {c: sched["levels"][c] for c in ("1", "32")}
    # the schedule speculates where that wins and steps aside where it loses: budget 16's tree at C=1,
    # plain decoding at C=32, where each single budget is far below the baseline
    assert lv["1"]["low"] > 1.5
    assert lv["32"]["tok_s"] > 1.1 * max(single4["levels"]["32"]["tok_s"], single16["levels"]["32"]["tok_s"])
    assert lv["32"]["speedup"] > 0.93
    if res["recommended_schedule"] is None:  # only when C=32's interval fell wholly below 1 by chance
        assert "schedule 1:16,6:0: below the baseline at C=32" in res["reason"], res["reason"]
    else:
        assert res["recommended_schedule"] == "1:16,6:0" and res["reason"].startswith("schedule 1:16,6:0")
    assert res["recommendation"] is None
    assert current(tuned_lab) == tuned_lab.baseline  # restored
    recs = ledger(tuned_lab)
    trials = [r for r in recs if r.get("result") == "trial"]
    assert len(trials) == 3 and all(r["trial"] for r in trials)
    st = json.loads(opsctl("status", "--json", inv=tuned_lab.inv).stdout)[0]
    assert st["last_good"] == tuned_lab.baseline  # a trial never becomes the last good release
    assert (tmp_path / "t" / "tune.png").stat().st_size > 5000


def test_tune_says_keep_the_baseline_when_no_budget_wins(tuned_lab, tmp_path):
    with tuned_lab.fault("accept_collapse", algorithm="DDTREE"):
        p = opsctl("tune", "ddtree", "--budgets", "8,32", "--concurrency", "1", "--yes", "--json",
                   "--out", str(tmp_path / "t"), inv=tuned_lab.inv)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.splitlines()[-1])
    assert res["best"] == {"1": 0} and res["recommendation"] is None
    assert res["reason"].startswith("no budget beats the baseline at these levels: keep the baseline")
    assert current(tuned_lab) == tuned_lab.baseline


def test_tune_restores_after_trials_that_fail_to_start_and_after_an_interrupt(tuned_lab, tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(tuned_lab.inv, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("      readiness_timeout_s: 120\n    ar-tp8",
                                         "      readiness_timeout_s: 10\n    ar-tp8", 1))
    with tuned_lab.fault("slow_start", load_s=60, algorithm="DDTREE"):
        p = opsctl("tune", "ddtree", "--budgets", "4,8", "--concurrency", "1", "--yes", "--json",
                   "--out", str(tmp_path / "t"), inv=inv)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.splitlines()[-1])
    assert all(t["status"].startswith("failed:") for t in res["trials"])
    assert current(tuned_lab) == tuned_lab.baseline
    proc = subprocess.Popen([*OPSCTL, "tune", "ddtree", "--budgets", "4,8", "--concurrency", "1", "--yes",
                             "--out", str(tmp_path / "t2"), "-i", str(tuned_lab.inv)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines = []
    deadline = time.monotonic() + 240
    for line in proc.stdout:
        lines.append(line)
        if "] bench      ..." in line or time.monotonic() > deadline:
            break
    os.kill(proc.pid, signal.SIGINT)
    out = "".join(lines) + proc.stdout.read()
    assert proc.wait(240) == 130, out
    assert "during the tune" in out and f"{tuned_lab.baseline} (what served before) serves again" in out
    assert current(tuned_lab) == tuned_lab.baseline
    assert tuned_lab.run("systemctl is-active sglang-k26").stdout.strip() == "active"
