"""Verdicts with confidence: bootstrap over requests, a minimum sample count, and the one
rule that too few or missing samples is never a pass."""
from __future__ import annotations

import random

from opsctl.gate.results import BenchLevel, BenchRun
from opsctl.gate.interval import decide, speedup_interval
from opsctl.gate.decide import GatePolicy, judge, judge_with_remeasure


def rates(mean: float, n: int, noise: float = 0.05, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.uniform(-noise, noise)) for _ in range(n)]


def test_a_clear_win_or_loss_is_decided_a_close_call_is_not():
    base = rates(100, 16, seed=1)
    assert decide(speedup_interval(rates(160, 8, seed=2), base), 1.05, 8) == "pass"
    assert decide(speedup_interval(rates(60, 8, seed=3), base), 0.90, 8) == "fail"
    noisy = rates(100, 8, noise=0.3, seed=4)
    close = speedup_interval([x * 1.05 for x in reversed(noisy)], noisy)  # +5 % exactly, wide spread
    assert close.low < 1.05 < close.high and decide(close, 1.05, 8) == "inconclusive"


def test_too_few_samples_is_never_a_pass():
    iv = speedup_interval(rates(300, 3, seed=6), rates(100, 3, seed=7))
    assert iv.low > 2 and decide(iv, 1.05, 8) == "inconclusive"
    assert decide(None, 1.05, 8) == "inconclusive"


def level(c: int, rnd: int, per_request: list[tuple[str, float]], accept: float | None = None) -> BenchLevel:
    samples = [[w, 48, 48 / r, 0.05, int(48 / accept) if accept else 0, 1] for w, r in per_request]
    tok_s = sum(r for _, r in per_request)
    return BenchLevel(max_concurrency=c, repeat=rnd, output_throughput=tok_s, completed=len(samples),
                      level_accept_length=accept, samples=samples)


def run_of(c_rates: dict[int, list[tuple[str, float]]], accept=None) -> BenchRun:
    return BenchRun(levels=[level(c, 0, rs, accept) for c, rs in c_rates.items()])


POLICY = GatePolicy(concurrency=[1], min_requests=8)


def test_the_verdict_table_prints_the_interval_and_says_inconclusive_with_few_samples():
    base = run_of({1: [("chat", 100.0)] * 4})
    cand = run_of({1: [("chat", 180.0)] * 4}, accept=3.0)
    v = judge(cand, base, POLICY, profile_kind="ddtree", canary_ran=True)
    assert v.status == "inconclusive"
    assert "too few samples (at least 8 per side)" in v.reasons[0] and "90 % CI" in v.reasons[0]
    row = v.rows[0]
    assert row.low_pct is not None and row.high_pct is not None and row.samples == 4


def test_inconclusive_re_measures_once_then_fails_never_promotes():
    base = run_of({1: [("chat", r) for r in rates(100, 16, noise=0.4, seed=8)]})
    calls = []

    def measure():
        calls.append(1)
        return run_of({1: [("chat", r) for r in rates(104, 4, noise=0.4, seed=9 + len(calls))]}, accept=3.0)

    v, _ = judge_with_remeasure(measure, base, POLICY, profile_kind="ddtree", canary_ran=True)
    assert len(calls) == 2 and v.attempts == 2
    assert v.status == "fail" and "still inconclusive after one re-measure" in v.reasons[-1]


def test_a_workload_that_loses_fails_the_level_even_when_the_mix_wins():
    base = run_of({1: [("humaneval", 100.0)] * 8 + [("chat", 100.0)] * 8})
    cand = run_of({1: [("humaneval", 400.0)] * 8 + [("chat", 40.0)] * 8}, accept=3.0)
    v = judge(cand, base, POLICY, profile_kind="ddtree", canary_ran=True)
    assert v.status == "fail"
    assert any(r.startswith("C=1: chat loses: -60.0 %") for r in v.reasons)
    assert v.rows[0].workloads["humaneval"]["delta_pct"] > 200
    # the same release judged on code alone passes
    code_only = judge(run_of({1: [("humaneval", 400.0)] * 8}, accept=3.0), run_of({1: [("humaneval", 100.0)] * 8}),
                      POLICY, profile_kind="ddtree", canary_ran=True)
    assert code_only.status == "pass" and "+300.0 %" in code_only.rows[0].why
