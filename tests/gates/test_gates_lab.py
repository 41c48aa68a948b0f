"""Validation and the benchmark gate inside `opsctl deploy`, end to end on the lab.

The lab's emulator models the site (AR TP8 ~98 tok/s at C=1, a healthy DDTree that
wins at low concurrency) and injects the site's failures as faults.
"""
from __future__ import annotations

import json

import pytest

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


def test_site_ddtree_budget_32_is_judged_worse_and_rolled_back(clean_lab, ops):
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


def test_wrong_greedy_output_fails_the_canary(clean_lab, ops):
    before = current(clean_lab)
    with clean_lab.fault("wrong_output", algorithm="DDTREE"):
        proc = ops("deploy", "ddtree", "--budget", "12", *YES)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "canary" in error_line(proc.stderr)
    assert current(clean_lab) == before
    verdict = [r for r in ledger(clean_lab) if r["action"] == "verdict"][-1]
    assert verdict["canary"]["identical"] is False and "prompt" in verdict["canary"]
