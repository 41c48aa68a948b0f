"""Issue #53: one evaluator for the gate's levels and the watch's windows. The same observation,
judged by a gate level (`gate.decide.judge`) and by a watch window (`analysis.evaluate_window`),
gets the same status at a rule's boundary: at the floor or the limit passes, just past it fails,
in both phases, because both call the rule's one function in onhost/analysis.py. A comparison
edited in one phase only breaks these tests."""
from __future__ import annotations

from dataclasses import replace

import pytest

from opsctl.config import WatchRules
from opsctl.gate.decide import GatePolicy, judge, throughput_decision
from opsctl.gate.interval import Interval
from opsctl.gate.results import BenchLevel, BenchRun
from opsctl.onhost import analysis
from opsctl.onhost.analysis import GATE, build_spec, drafting, evaluate_window, judge_accept_length, judge_throughput

NOW = 10_000.0
WINDOW_S, MIN_SAMPLES = 60, 4
# the gate's defaults (floor 2.0 for ddtree, -10 % regression, no failed request) and the watch's
# rules set to the same thresholds: a floor of 2.0, a curve limit of 1 - 0.10
WATCH = {"accept_len_floor": 2.0, "throughput_fraction": 0.10, "max_error_rate": 0.05, "min_requests": 10,
         "max_journal_errors": 4, "max_restarts": 1}


def spec_for(policy: GatePolicy | None = None, **watch):
    w = WatchRules(**{**WATCH, **watch}).model_dump(mode="json")
    w.update(window_s=WINDOW_S, min_samples=MIN_SAMPLES)
    return build_spec({"name": "ddtree", "kind": "ddtree"}, (policy or GatePolicy()).model_dump(mode="json"), w)


def bench(tok_s: dict[int, float], accept: float | None = None, errors: int = 0) -> BenchRun:
    return BenchRun(levels=[BenchLevel(max_concurrency=c, repeat=rep, output_throughput=v, median_itl_ms=10.0,
                                       completed=16, errors=errors, level_accept_length=accept)
                            for c, v in tok_s.items() for rep in range(3)])


BASE = {1: 100.0, 4: 100.0, 16: 100.0}


def gate_level(spec, c: int, *, tok_s: float = 120.0, accept: float = 3.0, errors: int = 0):
    """The gate's row for level c (every other level comfortably passing)."""
    cand = {lv: (tok_s if lv == c else 120.0) for lv in BASE}
    v = judge(bench(cand, accept, errors), bench(BASE, 3.0), GatePolicy(), profile_kind="ddtree", spec=spec,
              canary_ran=True)
    return next(r for r in v.rows if r.concurrency == c), v


def decode(ts, *, accept=3.0, tps=120.0, expected=100.0, running=4, finished=5, aborted=0, journal_errors=0,
           crashes=0):
    return {"ts": ts, "status": "ok", "decode": True, "accept_len": accept, "gen_tps": tps, "running": running,
            "queue": 0, "finished": finished, "aborted": aborted, "expected_tps": expected,
            "journal": {"cuda_errors": journal_errors, "tracebacks": 0, "crashes": crashes, "restarts": crashes,
                        "examples": []}}


def window(spec, n: int = 6, **kw) -> dict[str, dict]:
    samples = [decode(NOW - 5 * i, **kw) for i in range(n)]
    return {f["rule"]: f for f in evaluate_window(samples, spec, NOW)}


@pytest.mark.parametrize("accept, passes", [(2.0, True), (2.01, True), (1.99, False)])
def test_an_accept_length_at_the_floor_passes_in_both_phases_and_below_it_fails_in_both(accept, passes):
    spec = spec_for()
    assert spec.accept_length.floor == spec.accept_length.watch_floor == 2.0
    row, v = gate_level(spec, 4, accept=accept)
    found = window(spec, accept=accept)["accept_length"]
    assert (row.status == "pass") is passes, v.reasons
    assert found["status"] == ("ok" if passes else "breach"), found
    if passes:
        assert f"accept {accept:.2f} >= floor 2.00" in row.why
        assert found["detail"].startswith(f"median accept length {accept:.2f} >= floor 2.00")
    else:
        assert any(f"accept length {accept:.2f} below the ddtree floor 2.00" in r for r in v.reasons)
        assert found["detail"].startswith(f"median accept length {accept:.2f} < floor 2.00")


@pytest.mark.parametrize("tok_s", [90.0, 90.5, 89.0, 85.0])
def test_a_throughput_ratio_at_the_limit_passes_in_both_phases_and_below_it_does_not(tok_s):
    """-10 % at a level that is not the speedup level, and 0.90 x the baseline curve: at the limit
    both pass; below it the watch breaches and the gate does not pass (marginal within its band,
    which is the gate's re-measure, then fail)."""
    spec = spec_for()
    assert spec.throughput.threshold_at(4) == spec.throughput.curve_limit == 0.9
    row, v = gate_level(spec, 4, tok_s=tok_s)
    found = window(spec, tps=tok_s, expected=100.0)["throughput"]
    within = tok_s >= 90.0
    assert (row.status == "pass") is within, v.reasons
    assert found["status"] == ("ok" if within else "breach"), found
    if not within:
        band = tok_s / 100.0 >= 0.9 - spec.throughput.marginal_band
        assert row.status == ("marginal" if band else "fail")
        assert f"C=4: output {tok_s:.1f} tok/s is {100 - tok_s:.1f}% below the baseline's 100.0 (limit -10%)" \
            + (" (marginal)" if band else "") in v.reasons
        assert "below the 0.90 limit" in found["detail"]


@pytest.mark.parametrize("journal_errors, breach", [(4, False), (5, True)])
def test_counts_at_their_limit_are_within_it_in_both_phases(journal_errors, breach):
    spec = spec_for()
    # the gate: max_errors failed requests over a level's repeats are allowed, one more fails
    allowed = spec.errors.max_failed_requests
    assert gate_level(spec, 4, errors=allowed)[0].status == "pass"
    row, v = gate_level(spec, 4, errors=allowed + 1)
    assert row.status == "fail" and any(f"(allowed {allowed})" in r for r in v.reasons)
    # the watch: journal lines (spread over the window's samples) and the aborted share
    samples = [decode(NOW - 5 * i, journal_errors=journal_errors if i == 0 else 0) for i in range(6)]
    found = {f["rule"]: f for f in evaluate_window(samples, spec, NOW)}["errors"]
    assert found["status"] == ("breach" if breach else "ok"), found
    assert window(spec, finished=19, aborted=1, n=1)["errors"]["status"] == "insufficient"   # too few to judge
    # 1 aborted of 20 in each of 4 samples: 5 % exactly, the limit
    assert window(spec, n=MIN_SAMPLES, finished=19, aborted=1)["errors"]["status"] == "ok"
    assert window(spec, n=MIN_SAMPLES, finished=18, aborted=2)["errors"]["status"] == "breach"


def test_one_sample_short_of_min_samples_is_insufficient_and_the_last_one_judges():
    spec = spec_for()
    few = window(spec, n=MIN_SAMPLES - 1, accept=1.5, tps=50.0)
    assert few["accept_length"]["status"] == few["throughput"]["status"] == "insufficient"
    enough = window(spec, n=MIN_SAMPLES, accept=1.5, tps=50.0)
    assert enough["accept_length"]["status"] == enough["throughput"]["status"] == "breach"


def iv(low, high, n=8):
    return Interval(ratio=(low + high) / 2, low=low, high=high, n_candidate=n, n_baseline=n, confidence=0.9)


def test_an_interval_is_held_to_the_same_threshold_with_the_same_comparison():
    """The gate's interval at a level: its low end exactly on the threshold proves the level,
    its high end exactly on it does not fail it; and with min_requests a side it decides,
    with one fewer it is inconclusive."""
    spec = spec_for()
    t, need = spec.throughput.threshold_at(4), spec.interval.min_requests
    assert judge_throughput(spec, phase=GATE, interval=iv(t, t + 0.1), at=4).status == "pass"
    assert judge_throughput(spec, phase=GATE, interval=iv(t - 0.1, t), at=4).status == "inconclusive"
    assert judge_throughput(spec, phase=GATE, interval=iv(t - 0.1, t - 1e-9), at=4).status == "fail"
    low = judge_throughput(spec, phase=GATE, interval=iv(t, t + 0.1, need - 1), at=4)
    assert low.status == "inconclusive" and low.detail == f"too few samples (at least {need} per side)"
    # a zero-width interval is judged as the same point (ratio) is, outside the point's marginal band
    for r in (t - 0.05, t - 1e-9, t, t + 1e-9):
        point = judge_throughput(spec, phase=GATE, ratio=r, at=4).status
        interval = judge_throughput(spec, phase=GATE, interval=iv(r, r), at=4).status
        assert (point == "pass") == (interval == "pass"), r
    # and the measuring loop stops on the same decision
    policy = GatePolicy()
    rates = [10.0 + 0.01 * i for i in range(need)]
    interval, decision = throughput_decision(policy, 4, [r * 1.3 for r in rates], rates, spec)
    assert decision == judge_throughput(spec, phase=GATE, interval=interval, at=4).status == "pass"


def test_both_phases_compare_through_the_one_function(monkeypatch):
    """Edit the comparison in analysis.clears (here: the floor itself no longer clears) and the
    gate's level and the watch's window change together: neither phase compares on its own."""
    spec = spec_for()
    assert gate_level(spec, 4, accept=2.0)[0].status == "pass"
    assert window(spec, accept=2.0)["accept_length"]["status"] == "ok"
    monkeypatch.setattr(analysis, "clears", lambda observed, threshold: observed > threshold)
    assert gate_level(spec, 4, accept=2.0)[0].status == "fail"
    assert window(spec, accept=2.0)["accept_length"]["status"] == "breach"
    assert gate_level(spec, 4, tok_s=90.0)[0].status != "pass"
    assert window(spec, tps=90.0)["throughput"]["status"] == "breach"


def test_the_budget_zero_band_is_left_out_by_both_phases_at_the_same_batches():
    """A schedule that serves batches 9-16 without a tree: the gate's level at such a C has no
    floor, and the watch leaves samples at such a running batch out, batch for batch."""
    base = spec_for()
    spec = replace(base, accept_length=replace(base.accept_length, undrafted=[[9, 16]]))
    for b in range(1, 40):
        gate_na = judge_accept_length(spec, 1.0, phase=GATE, at=b).status == "n/a"
        assert gate_na is (drafting(spec, [(1.0, b)]) == []) is (9 <= b <= 16), b
    row, v = gate_level(spec, 16, accept=1.0)
    # accept 1.0 everywhere: C=16 passes with a note, the drafted levels fail
    assert row.status == "pass" and v.status == "fail"
    assert "C=16: the budget schedule does not draft at this level (budget 0): no accept-length floor" in v.notes
    assert not any("C=16: 1.00" in r for r in v.reasons) and any("C=4: 1.00" in r for r in v.reasons)
    samples = [decode(NOW - 5 * i, accept=1.0, running=16) for i in range(6)]
    samples += [decode(NOW - 2 - 5 * i, accept=3.0, running=4) for i in range(MIN_SAMPLES)]
    found = {f["rule"]: f for f in evaluate_window(samples, spec, NOW)}["accept_length"]
    assert found["status"] == "ok" and found["samples"] == MIN_SAMPLES and found["observed"] == 3.0


def test_a_min_speedup_below_the_regression_limit_does_not_loosen_the_speedup_level():
    """Before #53 the speedup level's medians were held to both -max_regression and min_speedup,
    its interval to min_speedup alone: with min_speedup -20 % and max_regression 10 %, -15 % at
    C=1 failed on medians and passed on an interval. One threshold now, for both and the report."""
    policy = GatePolicy(min_speedup=-0.20, max_regression=0.10)
    spec = spec_for(policy)
    assert spec.throughput.threshold_at(1) == spec.throughput.threshold_at(4) == 0.9
    assert judge_throughput(spec, phase=GATE, ratio=0.85, at=1).status == "fail"
    assert judge_throughput(spec, phase=GATE, interval=iv(0.84, 0.86), at=1).status == "fail"
    v = judge(bench({1: 85.0, 4: 100.0, 16: 100.0}, 3.0), bench(BASE, 3.0), policy, profile_kind="ddtree",
              spec=spec, canary_ran=True)
    assert v.rows[0].status == "fail"
    assert "C=1: output 85.0 tok/s vs baseline 100.0 (-15.0%), below the -10.0% limit" in v.reasons
