"""The verdict's statistics hold up (issue #34): the fast version of benchmarks/verdict_stats.py,
fixed seeds and fewer cases, on the new method only (opsctl/gate/interval.py, gate.decide.throughput_decision).

- a nominal 90 % interval covers the true ratio at least 88 % of the time at n >= 8, on the lab
  emulator's measured rates and on heavy-tailed server-like rates;
- with the sequential rule, a release exactly at the "+5 % needed" threshold passes, and one
  exactly at the "-10 %" limit fails, at most 5 % of the time over all the gate's looks;
- the lab's verdict cases decide as before: clear win passes, collapse fails, the C=8 close call
  passes, each in its first round.

A few seconds; standard library only (the benchmark's old-method column needs numpy, not this)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import verdict_stats as vs  # noqa: E402

from opsctl.gate.decide import GatePolicy, throughput_decision  # noqa: E402

COVERAGE_TARGET = 0.88
SEED = 34


@pytest.fixture(scope="module")
def lab_data() -> dict:
    return json.loads(vs.LAB_RATES.read_text())


@pytest.mark.parametrize("n_cand,n_base", [(8, 8), (16, 16), (8, 16), (16, 48)])
def test_the_90_percent_interval_covers_on_heavy_tailed_server_rates(n_cand, n_base):
    r = vs.coverage(vs.server_population(1.0), n_cand, n_base, "new", 2000, SEED)
    assert r["coverage"] >= COVERAGE_TARGET, r


@pytest.mark.parametrize("level,n_cand,n_base", [(1, 8, 8), (1, 8, 16), (8, 8, 16), (8, 16, 16)])
def test_the_90_percent_interval_covers_on_the_lab_emulators_rates(lab_data, level, n_cand, n_base):
    r = vs.coverage(vs.lab_population(level, 1.0, data=lab_data), n_cand, n_base, "new", 2000, SEED)
    assert r["coverage"] >= COVERAGE_TARGET, r


def test_the_gate_shapes_match_the_policy():
    lab = GatePolicy(requests_per_level=8, min_requests=8, max_requests=16)
    assert (lab.rounds_at(1), lab.looks_at(1), lab.looks_at(8)) == (vs.LAB_GATE.rounds, vs.LAB_GATE.looks, 4)
    default = GatePolicy()
    assert (default.rounds_at(1), default.looks_at(4)) == (vs.DEFAULT_GATE.rounds, vs.DEFAULT_GATE.looks) == (3, 6)
    # rounds too small to decide are no looks: 2 a round, at least 8 -> rounds 4..8 of both attempts
    assert GatePolicy(requests_per_level=2, min_requests=8, max_requests=8).looks_at(1) == 5


@pytest.mark.parametrize("shape,truth,threshold,what", [
    ("server", 1.05, 1.05, "pass"), ("server", 0.90, 0.90, "fail"),
    ("lab", 1.05, 1.05, "pass"), ("lab", 0.90, 0.90, "fail"),
])
def test_at_the_threshold_the_sequential_gate_errs_at_most_5_percent(lab_data, shape, truth, threshold, what):
    if shape == "server":
        pop, gate = vs.server_population(truth), vs.DEFAULT_GATE
    else:
        pop, gate = vs.lab_population(1 if threshold > 1 else 8, truth, data=lab_data), vs.LAB_GATE
    r = vs.gate_rates(pop, gate, threshold, "new", 300, SEED)
    assert r[what] <= 0.05, r


@pytest.mark.parametrize("case,level,candidate,threshold,want", [
    ("clear win", 1, "ddtree-b16", 1.05, "pass"),
    ("collapse", 1, "ddtree-b32-collapse", 1.05, "fail"),
    ("C=4", 4, "ddtree-b16", 0.90, "pass"),
    ("close call", 8, "ddtree-b16", 0.90, "pass"),
])
def test_the_lab_verdict_cases_decide_as_before_in_the_first_round(lab_data, case, level, candidate, threshold, want):
    pop = vs.lab_population(level, candidate=candidate, data=lab_data)
    r = vs.gate_rates(pop, vs.LAB_GATE, threshold, "new", 100, SEED)
    assert r[want] >= 0.97, (case, r)
    assert r["requests"] <= 1.25 * vs.LAB_GATE.per_round, (case, r)


def test_the_measuring_loop_and_the_judge_share_one_rule():
    """gate.decide.throughput_decision is what measure() stops on and judge() decides by: the
    interval at the analysis' confidence spread over the level's looks the policy plans."""
    policy = GatePolicy(concurrency=[1, 8], requests_per_level=8, min_requests=8, max_requests=16)
    base = [100.0 + (i % 5) for i in range(16)]
    iv, decision = throughput_decision(policy, 8, [r * 0.98 for r in base[:8]], base, policy.analysis("ddtree"))
    assert iv.looks == 4 and iv.method == "log-t" and decision == "pass"
    assert "90 % CI over 4 looks, 97.5 % each; log-t; 8 vs 16 requests" in iv.pct()
