"""Issue #34: the gate decides by the profile's analysis (HostConfig.analysis, opsctl/onhost/
analysis.py), the same spec the watch holds the release to after promotion; a verdict decides
as it did when the deploy spread these rules over the policy and the flow."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opsctl.config import load_inventory
from opsctl.errors import ConfigError
from opsctl.flow import judge as judge_step
from opsctl.gate import measure as measure_mod
from opsctl.gate.decide import GatePolicy, judge
from opsctl.gate.results import BenchLevel, BenchRun

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def host(tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories/lab", inv)
    return load_inventory(inv).hosts["lab"]


def run(tok_s: dict[int, float], accept: float | None = None) -> BenchRun:
    return BenchRun(levels=[BenchLevel(max_concurrency=c, repeat=rep, output_throughput=v, median_itl_ms=10.0,
                                       completed=8, level_accept_length=accept)
                            for c, v in tok_s.items() for rep in range(3)])


def test_a_baseline_kind_release_is_held_to_no_regression_by_its_deploys_analysis(host):
    """What the flow did by rewriting the policy (min_speedup = -max_regression) is the
    analysis' rule now; the verdict records the same threshold as before."""
    ar = host.profile("ar-tp8")
    policy = host.gate_policy(ar)
    levels = {c: 100.0 * c for c in policy.concurrency}
    base, cand = run(levels), run({c: v * 0.97 for c, v in levels.items()})   # 3 % slower everywhere
    spec = host.analysis(ar, policy)
    assert spec.throughput.min_speedup == -policy.max_regression and spec.throughput.threshold_at(1) == 1 - policy.max_regression
    v = judge(cand, base, policy, profile_kind=ar.kind, spec=spec, canary_ran=True)
    assert v.status == "pass", v.reasons
    assert v.record()["policy"]["min_speedup"] == -policy.max_regression
    # a result file judged by the policy as written (`opsctl report`, `bench compare`): unchanged
    plain = judge(cand, base, policy, profile_kind=ar.kind, canary_ran=True)
    assert plain.status == "fail" and plain.record()["policy"]["min_speedup"] == policy.min_speedup


def test_the_specs_thresholds_are_the_policys_for_a_speculative_profile(host):
    ddtree = host.profile("ddtree", 16)
    policy = host.gate_policy(ddtree)
    spec = host.analysis(ddtree, policy)
    assert (spec.throughput.min_speedup, spec.throughput.max_regression, spec.throughput.marginal_band,
            spec.throughput.max_spread, spec.throughput.speedup_concurrency) == \
        (policy.min_speedup, policy.max_regression, policy.marginal_band, policy.max_spread,
         policy.speedup_concurrency)
    assert (spec.interval.confidence, spec.interval.min_requests, spec.interval.min_workload_requests) == \
        (policy.confidence, policy.min_requests, policy.min_workload_requests)
    assert spec.errors.max_failed_requests == policy.max_errors and spec.canary.required
    assert not host.analysis(host.profile("ar-tp8")).canary.required   # exempt kinds ("autoregressive", "ar")
    # judged with the deploy's spec or with the policy's own rules for the kind: the same verdict
    levels = {c: 100.0 * c for c in policy.concurrency}
    for f, acc in ((1.2, 4.0), (1.03, 4.0), (0.8, 4.0), (1.2, 1.5), (1.2, None)):
        cand = run({c: v * f for c, v in levels.items()}, acc)
        a = judge(cand, run(levels), policy, profile_kind="ddtree", spec=spec, canary_ran=True)
        b = judge(cand, run(levels), policy, profile_kind="ddtree", canary_ran=True)
        # the same verdict; each records the spec it judged by (the deploy's carries the watch's rules too)
        assert a.model_dump(exclude={"analysis"}) == b.model_dump(exclude={"analysis"}), (f, acc)
        assert a.spec() == spec and b.spec() == policy.analysis("ddtree")


def test_measuring_against_a_baseline_needs_the_analysis(host):
    with pytest.raises(ValueError, match="pass spec"):
        measure_mod.measure(None, host, GatePolicy(), baseline=run({1: 100.0}))


def test_the_deploys_gate_builds_the_profiles_analysis(host, monkeypatch):
    """bench_and_judge asks the host for the profile's analysis (not the policy's rules for a kind)."""
    seen = []

    class Stop(Exception):
        pass

    def analysis(self, profile, policy=None):
        seen.append((profile, policy))
        raise Stop

    monkeypatch.setattr(type(host), "analysis", analysis)
    profile = host.profile("ddtree", budget_schedule="1:16,8:4,32:0")
    with pytest.raises(Stop):
        judge_step.bench_and_judge(None, host, profile, "r1", None)
    assert seen == [(profile, host.gate_policy(profile))]


def test_a_policy_for_a_kind_is_no_profile_and_no_watch():
    spec = GatePolicy().analysis("ddtree")
    assert spec.accept_length.floor == 2.0 and spec.accept_length.undrafted is None
    assert not spec.watched
    with pytest.raises(ValueError, match="without the watch"):
        from opsctl.onhost.analysis import evaluate_window

        evaluate_window([], spec, 0.0)
    with pytest.raises(ConfigError):
        judge(run({4: 100.0}), run({4: 100.0}), profile_kind="ddtree")   # no C=1 in the baseline: not comparable
