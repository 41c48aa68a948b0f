"""Validation and the benchmark gate inside `opsctl deploy`, end to end on the lab.

The lab's emulator models the site (AR TP8 ~98 tok/s at C=1, a healthy DDTree that
wins at low concurrency) and injects the site's failures as faults.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "opsctl" / "lab" / "emulator"))
from sglang.lab import perf  # noqa: E402  (the emulator's performance model: the truth `diagnose` is held to)

pytestmark = pytest.mark.lab
YES = ("--yes", "--skip-checks")


def ledger(lab) -> list[dict]:
    text = lab.run("cat /opt/opsctl/ledger.jsonl", check=False).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def current(lab) -> str:
    return lab.run("readlink /opt/opsctl/current", check=False).stdout.strip().split("/")[-1]


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_speculative_deploy_without_baseline_is_refused_before_touching_the_host(clean_lab, ops, snapshot):
    before = snapshot(clean_lab)
    proc = ops("deploy", "ddtree", "--budget", "16", *YES)
    assert proc.returncode == 2
    line = error_line(proc.stderr)
    assert "no ar-tp8 baseline" in line and "opsctl deploy ar-tp8" in line
    assert snapshot(clean_lab) == before


def test_baseline_deploy_stores_the_baseline_then_healthy_ddtree_is_promoted(clean_lab, ops):
    proc = ops("deploy", "ar-tp8", *YES)
    assert proc.returncode == 0, proc.stderr
    assert "stored this run as the ar-tp8 baseline" in proc.stdout
    assert clean_lab.run("test -s /opt/opsctl/baselines/kimi-k2.6/ar-tp8.*.jsonl && "
                         "test -s /opt/opsctl/baselines/kimi-k2.6/ar-tp8.canary.json").returncode == 0
    proc = ops("bench", "--save-baseline")  # refresh, as an operator would
    assert proc.returncode == 0, proc.stderr
    proc = ops("deploy", "ddtree", "--budget", "16", *YES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validate" in proc.stdout and "PASS" in proc.stdout
    assert current(clean_lab).startswith("ddtree-b16-")
    verdicts = [r for r in ledger(clean_lab) if r["action"] == "verdict"]
    assert verdicts[-1]["status"] == "pass" and verdicts[-1]["rows"]
    assert [r for r in ledger(clean_lab) if r["action"] == "validation"][-1]["result"] == "ok"
    # a win: nothing to explain at C=1, and the verify forward there is the runtime's measured one
    rc, d, err = ops.json("diagnose")
    assert rc == 0, err
    c1 = level(d, 1)
    assert not c1["loses"] and not c1["causes"] and c1["speedup"] > 1.5
    assert c1["verify_source"] == "measured" and c1["verify_ms"] == pytest.approx(9.68 + 0.52 * 17, rel=0.05)


def level(d: dict, c: int) -> dict:
    return next(r for r in d["levels"] if r["concurrency"] == c)


def model_shares(budget: int, row: dict, **faults) -> dict[str, float]:
    """The shares of a level's loss the performance model knows: its own forward, drafter, tree and
    host parts at the level's running batch, its own accept length against its healthy one."""
    from opsctl.onhost.diagnosis import loss_parts, shares

    model = perf.Model("tp", "DDTREE", budget + 1, **faults)
    b = row["running_batch"]
    parts = model.step_parts(b)
    return shares(loss_parts(model.accept_len(), sum(parts.values()), parts["target_ms"], perf.Model("tp").step_ms(b),
                             perf.ddtree_accept_len(budget)))


def diagnosed(ops, release: str, c: int, budget: int, **faults) -> tuple[dict, dict]:
    """`opsctl diagnose RELEASE --json`: level c's top cause, and the model's share of that cause."""
    rc, d, err = ops.json("diagnose", release)
    assert rc == 0, err
    row = level(d, c)
    assert row["loses"] and row["causes"], row
    return row["causes"][0], model_shares(budget, row, **faults)


@pytest.mark.parametrize("fault,expect", [
    ("wrong_verify_tokens", "target verify graph captured with 8 tokens/request"),
    ("capture_failure", "Capture cuda graph failed"),
])
def test_graph_faults_fail_validation_and_roll_back(clean_lab, ops, fault, expect):
    before = current(clean_lab)
    # budget 8 alone (--speculative-num-draft-tokens 9): `before` (another DDTree budget) still starts
    with clean_lab.fault(fault, algorithm="DDTREE", num_draft_tokens=9):
        proc = ops("deploy", "ddtree", "--budget", "8", *YES)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    line = error_line(proc.stderr)
    assert expect in line and "rolled back to " + before in line
    assert expect in proc.stdout  # the diagnosis is printed with the findings
    assert current(clean_lab) == before
    last = ledger(clean_lab)[-1]
    assert last["action"] == "rollback" and last["automatic"] and expect in last["reason"]


def test_site_ddtree_budget_32_is_judged_worse_and_rolled_back(clean_lab, ops, tmp_path):
    before = current(clean_lab)
    with clean_lab.fault("accept_collapse", algorithm="DDTREE"):
        proc = ops("deploy", "ddtree", "--budget", "32", *YES)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    line = error_line(proc.stderr)
    assert "gate failed" in line and "rolled back to " + before in line
    assert "base tok/s" in proc.stdout and "judged Δ" in proc.stdout  # the verdict table
    assert current(clean_lab) == before
    verdict = [r for r in ledger(clean_lab) if r["action"] == "verdict"][-1]
    assert verdict["status"] == "fail" and verdict["budget"] == 32
    c1 = next(r for r in verdict["rows"] if r["concurrency"] == 1)
    assert c1["candidate_tok_s"] < 0.7 * c1["baseline_tok_s"]
    assert any("accept length" in r for r in verdict["reasons"])
    # why (issue #48): the failed gate says it in one line, and diagnose ranks acceptance first at C=1
    why = [r for r in verdict["reasons"] if r.startswith("why: ")]
    assert len(why) == 1 and "break-even" in why[0] and "acceptance" in why[0], verdict["reasons"]
    assert "why: " in proc.stdout
    top, truth = diagnosed(ops, verdict["release"], 1, 32, accept_override=perf.COLLAPSE_ACCEPT_LEN,
                           cpu_tree_ms_per_req=perf.COLLAPSE_CPU_TREE_MS_PER_REQ)
    assert top["kind"] == "acceptance" and "at budget 16" in top["evidence"], top   # the b16 judged above, or the reference
    assert top["share"] == pytest.approx(truth["acceptance"], rel=0.2), (top, truth)
    # the release's report carries the same diagnosis as its "Why", read on the host
    rc, rep, err = ops.json("report", verdict["release"], "--out", str(tmp_path))
    assert rc == 0, err
    assert rep["diagnosis"]["levels"] and "## Why" in (tmp_path / f"{verdict['release']}.md").read_text()


def test_host_overhead_is_diagnosed_as_overhead(clean_lab, ops):
    """A runtime whose every step waits on the host (40 ms): budget 8 loses at C=1, and diagnose puts
    the loss on the overhead, from the step line's verify preparation."""
    with clean_lab.fault("host_overhead", algorithm="DDTREE", ms_per_step=40):
        proc = ops("deploy", "ddtree", "--budget", "8", *YES)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    verdict = [r for r in ledger(clean_lab) if r["action"] == "verdict"][-1]
    assert any(r.startswith("why: ") and "overhead" in r for r in verdict["reasons"]), verdict["reasons"]
    top, truth = diagnosed(ops, verdict["release"], 1, 8, host_ms_per_step=40.0)
    assert top["kind"] == "overhead" and "verify preparation 40.00" in top["evidence"], top
    assert top["share"] == pytest.approx(truth["overhead"], rel=0.2), (top, truth)


def test_a_healthy_budget_32_at_concurrency_8_is_verify_compute(clean_lab, ops):
    """A healthy large tree at the lab's highest level: 8 x 33 tokens per verify forward, no tree can
    win there; diagnose says verify compute, and predicts a smaller budget (or none) for C=8."""
    proc = ops("deploy", "ddtree", "--budget", "32", *YES)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    verdict = [r for r in ledger(clean_lab) if r["action"] == "verdict"][-1]
    assert verdict["budget"] == 32
    top, truth = diagnosed(ops, verdict["release"], 8, 32)
    assert top["kind"] == "verify_compute" and "no tree of budget 32 wins at C=8" in top["evidence"], top
    assert top["share"] == pytest.approx(truth["verify_compute"], rel=0.2), (top, truth)
    rc, d, _ = ops.json("diagnose", verdict["release"])
    assert d["best"]["8"] < 32 and d["best"]["1"] > 0


def test_wrong_greedy_output_fails_the_canary(clean_lab, ops):
    before = current(clean_lab)
    with clean_lab.fault("wrong_output", algorithm="DDTREE"):
        proc = ops("deploy", "ddtree", "--budget", "12", *YES)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "canary" in error_line(proc.stderr)
    assert current(clean_lab) == before
    verdict = [r for r in ledger(clean_lab) if r["action"] == "verdict"][-1]
    assert verdict["canary"]["identical"] is False and "prompt" in verdict["canary"]
