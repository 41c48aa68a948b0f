"""Issue #49, the verdict's wording: what a level needs reads right with its sign ("the whole
interval is below the +5 % this level needs", never "below needs at least"; a loss allowed is
"within the -15 % limit", never "at least -15 % needed"), and where the aggregate delta and the
judged per-request delta disagree in sign, the level's line says so and why."""
from __future__ import annotations

import random

from opsctl.gate.decide import GatePolicy, judge, level_table, sign_disagreement
from opsctl.gate.results import BenchLevel, BenchRun
from opsctl.onhost.analysis import build_spec


def rates(mean: float, n: int, noise: float = 0.05, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.uniform(-noise, noise)) for _ in range(n)]


def level(c: int, per_request: list[float], *, aggregate: float | None = None, accept: float | None = None,
          workload: str = "chat") -> BenchLevel:
    samples = [[workload, 48, 48 / r, 0.05, int(48 / accept) if accept else 0, 1] for r in per_request]
    return BenchLevel(max_concurrency=c, repeat=0, output_throughput=aggregate or sum(per_request) / c,
                      completed=len(samples), level_accept_length=accept, samples=samples)


def run_of(levels: dict[int, tuple[list[float], float | None]], accept: float | None = None) -> BenchRun:
    return BenchRun(levels=[level(c, rs, aggregate=agg, accept=accept) for c, (rs, agg) in levels.items()])


POLICY = GatePolicy(concurrency=[1, 4], min_requests=8)


def test_a_level_whose_whole_interval_is_below_its_need_says_the_need_in_words():
    base = run_of({1: (rates(100, 16, seed=1), None), 4: (rates(100, 16, seed=2), None)})
    cand = run_of({1: (rates(60, 16, seed=3), None), 4: (rates(60, 16, seed=4), None)}, accept=3.0)
    v = judge(cand, base, POLICY, profile_kind="ddtree", canary_ran=True)
    assert v.status == "fail"
    by_level = {r.split(":")[0]: r for r in v.reasons if ": speedup " in r}
    assert by_level["C=1"].endswith("the whole interval is below the +5 % this level needs"), by_level["C=1"]
    assert by_level["C=4"].endswith(
        f"the whole interval is below the -{POLICY.max_regression * 100:.0f} % limit"), by_level["C=4"]
    assert not any("below needs" in r or "below limit" in r for r in v.reasons), v.reasons


def test_a_loss_allowed_at_the_speedup_level_is_a_limit_not_a_need():
    # the baseline profile redeployed: its C=1 may lose up to max_regression (min_speedup negative)
    policy = GatePolicy(concurrency=[1, 4], max_regression=0.15)
    spec = build_spec({"name": "ar-tp8", "kind": "autoregressive"}, policy.model_dump(), deploy=True)
    assert spec.throughput.min_speedup == -0.15
    base = BenchRun(levels=[BenchLevel(max_concurrency=c, repeat=0, output_throughput=t, completed=8)
                            for c, t in ((1, 100.0), (4, 300.0))])
    cand = BenchRun(levels=[BenchLevel(max_concurrency=c, repeat=0, output_throughput=t, completed=8)
                            for c, t in ((1, 95.0), (4, 290.0))])
    v = judge(cand, base, policy, profile_kind="autoregressive", spec=spec)
    why = {r.concurrency: r.why for r in v.rows}
    assert why[1].startswith("pass (-5.0 %, within the -15 % limit"), why[1]
    assert not any("needed" in w for w in why.values()), why
    worse = BenchRun(levels=[BenchLevel(max_concurrency=c, repeat=0, output_throughput=t, completed=8)
                             for c, t in ((1, 50.0), (4, 290.0))])
    v = judge(worse, base, policy, profile_kind="autoregressive", spec=spec)
    (reason,) = [r for r in v.reasons if r.startswith("C=1")]
    assert "below the -15.0% limit" in reason and "needs at least -" not in reason, reason


def test_opposite_signs_of_the_aggregate_and_the_judged_delta_are_said_on_the_level_line():
    # the site's "C=1 agg Δ -1.5% judged Δ +62.3%": per-request rates up 62 %, aggregate down 1.5 %
    base = run_of({1: (rates(100, 16, seed=1), 100.0), 4: (rates(100, 16, seed=2), 400.0)})
    cand = run_of({1: (rates(162.3, 16, seed=3), 98.5), 4: (rates(110, 16, seed=4), 440.0)}, accept=3.0)
    v = judge(cand, base, POLICY, profile_kind="ddtree", canary_ran=True)
    rows = {r.concurrency: r for r in v.rows}
    assert round(rows[1].aggregate_delta_pct, 1) == -1.5 and rows[1].delta_pct > 50
    assert rows[4].aggregate_delta_pct > 0 and rows[4].delta_pct > 0
    _, _, lines = level_table(v.rows)
    (c1,) = [ln for ln in lines if ln.startswith("C=1:")]
    (c4,) = [ln for ln in lines if ln.startswith("C=4:")]
    assert "the aggregate (-1.5 %) and the per-request ratio (+" in c1 and "disagree in sign" in c1, c1
    assert "the gate judges the per-request ratio" in c1
    assert "disagree" not in c4 and sign_disagreement(rows[4]) is None
    assert "disagree in sign" in v.table()


# --- the hint that names a cause for a low accept length (issue #49): only where the evidence holds


def mixed(c: int, per_workload: dict[str, tuple[float, float]], n: int = 8) -> BenchLevel:
    """A level whose requests come from several workloads: workload -> (per-request tok/s, accept)."""
    samples = []
    for w, (rate, acc) in per_workload.items():
        samples += [[w, 48, 48 / r, 0.05, round(48 / acc), 1] for r in rates(rate, n, seed=len(samples))]
    agg = sum(48 / s[2] for s in samples) / c
    accept = sum(s[1] for s in samples) / sum(s[4] for s in samples)
    return BenchLevel(max_concurrency=c, repeat=0, output_throughput=agg, completed=len(samples),
                      level_accept_length=accept, samples=samples)


def _accept_reason(per_workload: dict[str, tuple[float, float]]) -> str:
    base = BenchRun(levels=[mixed(c, {w: (100.0, 1.0) for w in per_workload}) for c in (1, 4)])
    cand = BenchRun(levels=[mixed(c, per_workload) for c in (1, 4)])
    v = judge(cand, base, POLICY, profile_kind="ddtree", canary_ran=True)
    (reason,) = [r for r in v.reasons if r.startswith("accept length ")]
    return reason


def test_low_accept_on_every_workload_points_at_a_tree_bug():
    reason = _accept_reason({"chat": (110.0, 1.5), "humaneval": (112.0, 1.6), "math": (108.0, 1.4)})
    assert "low on every workload (chat 1.50, humaneval 1.60, math 1.41)" in reason, reason
    assert "tree-mask, position or graph-padding bug" in reason


def test_high_on_some_workloads_and_low_on_others_is_a_domain_effect_not_a_bug():
    # the case: code wins, chat loses, the level's accept length 1.97 under the 2.00 floor
    reason = _accept_reason({"chat": (90.0, 1.5), "humaneval": (160.0, 2.8)})
    assert reason.startswith("accept length 1.96 below the ddtree floor 2.00"), reason
    assert "per workload chat 1.50, humaneval 2.82" in reason and "domain effect, not a tree bug" in reason
    assert "tree-mask" not in reason and "points at" not in reason, reason


def test_one_workload_names_no_cause():
    reason = _accept_reason({"chat": (110.0, 1.5)})
    assert "cannot tell a tree bug from the drafter's domain" in reason and "tree-mask" not in reason, reason
    plain = BenchRun(levels=[BenchLevel(max_concurrency=c, repeat=0, output_throughput=t, completed=8,
                                        level_accept_length=1.51) for c, t in ((1, 150.0), (4, 450.0))])
    base = BenchRun(levels=[BenchLevel(max_concurrency=c, repeat=0, output_throughput=t, completed=8)
                            for c, t in ((1, 100.0), (4, 300.0))])
    v = judge(plain, base, GatePolicy(concurrency=[1, 4]), profile_kind="ddtree", canary_ran=True)
    (reason,) = [r for r in v.reasons if r.startswith("accept length ")]
    assert "tree-mask" not in reason and "cannot tell" in reason, reason  # no samples: no evidence either way
