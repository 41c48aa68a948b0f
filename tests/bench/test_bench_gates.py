"""The release gate, with plain data: pass / marginal / fail and every reason."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from opsctl.config import resolve_profile
from opsctl.errors import ConfigError
from opsctl.gate.canary import CanaryMismatch
from opsctl.gate.decide import GatePolicy, finalize, judge, judge_with_remeasure, next_action
from opsctl.gate.results import BenchLevel, BenchRun
from opsctl.onhost.analysis import build_spec

SITE_BASELINE = {1: 98.0, 4: 330.0, 16: 1000.0}     # autoregressive TP8 (C=1 from the site)


def run(tok_s: dict[int, float | list[float]], *, accept: float | None = None, errors: int = 0,
        itl: float = 10.0) -> BenchRun:
    """A bench with one level line per (level, repeat); a list gives per-repeat values."""
    levels = []
    for c, v in tok_s.items():
        for rep, x in enumerate(v if isinstance(v, list) else [v] * 3):
            levels.append(BenchLevel(max_concurrency=c, repeat=rep, output_throughput=x, median_itl_ms=itl,
                                     completed=8, errors=errors if rep == 0 else 0, level_accept_length=accept))
    return BenchRun(levels=levels)


BASE = run(SITE_BASELINE)


def scaled(f: float, **kw) -> BenchRun:
    return run({c: v * f for c, v in SITE_BASELINE.items()}, **kw)


def test_the_sites_ddtree_budget_32_fails_with_every_reason():
    # ~50 tok/s at C=1 against the baseline's ~98, accept length 1.51
    cand = run({1: 50.0, 4: 170.0, 16: 520.0}, accept=1.51)
    v = judge(cand, BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "fail" and next_action(v) == "rollback"
    text = "\n".join(v.reasons)
    assert "C=1: output 50.0 tok/s vs baseline 98.0 (-49.0%), needs at least +5.0%" in text
    assert "C=16: output 520.0 tok/s is 48.0% below the baseline's 1000.0 (limit -10%)" in text
    assert "accept length 1.51 below the ddtree floor 2.00 (C=1: 1.51, C=4: 1.51, C=16: 1.51)" in text
    assert not any(r.startswith("C=1: output 50.0 tok/s is") for r in v.reasons)   # one reason per cause
    row = v.rows[0]
    assert (row.concurrency, row.baseline_tok_s, row.candidate_tok_s, round(row.delta_pct, 1), row.status) == \
        (1, 98.0, 50.0, -49.0, "fail")
    assert "-49.0%" in v.table() and "fail" in v.table()


def test_a_faster_lossless_release_passes():
    v = judge(scaled(1.10, accept=4.4), BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "pass" and v.ok and v.reasons == [] and next_action(v) == "promote"
    assert [r.status for r in v.rows] == ["pass"] * 3
    assert v.canary == {"identical": True}


def test_a_speedup_just_under_the_threshold_is_marginal_then_fails_if_still_marginal():
    v = judge(scaled(1.03, accept=3.0), BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "marginal" and "(marginal)" in v.reasons[0] and next_action(v) == "remeasure"
    again = v.model_copy(update={"attempts": 2})
    assert next_action(again) == "rollback"
    final = finalize(again)
    assert final.status == "fail" and "still marginal after one re-measure" in final.reasons[-1]


def test_remeasure_once_merges_repeats_and_decides():
    calls = []

    def measure_good():
        calls.append(1)
        return scaled(1.12, accept=3.0)

    v, merged = judge_with_remeasure(measure_good, BASE, profile_kind="ddtree", canary_ran=True,
                                     first=scaled(1.03, accept=3.0))
    assert len(calls) == 1 and v.status == "pass" and v.attempts == 2 and merged.repeats == 6
    v, _ = judge_with_remeasure(lambda: scaled(1.03, accept=3.0), BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "fail" and v.attempts == 2


def test_regression_at_a_higher_level_marginal_then_fail():
    cand = run({1: 110.0, 4: 340.0, 16: 885.0}, accept=3.0)        # -11.5% at C=16
    v = judge(cand, BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "marginal" and [r.status for r in v.rows] == ["pass", "pass", "marginal"]
    cand = run({1: 110.0, 4: 340.0, 16: 800.0}, accept=3.0)        # -20%
    v = judge(cand, BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "fail" and "C=16" in v.reasons[0] and "20.0% below" in v.reasons[0]


def test_any_failed_request_fails():
    v = judge(scaled(1.2, accept=3.0, errors=1), BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "fail" and all("failed requests" in r for r in v.reasons)


def test_accept_length_is_required_for_speculative_kinds_only():
    v = judge(scaled(1.2), BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "fail" and "no accept length reported" in v.reasons[0]
    v = judge(scaled(1.2), BASE, profile_kind="autoregressive")
    assert v.status == "pass"


def test_a_canary_mismatch_fails_and_names_prompt_and_position():
    m = CanaryMismatch(prompt=3, position=17, expected=11, got=12)
    v = judge(scaled(1.2, accept=4.0), BASE, profile_kind="ddtree", canary_mismatch=m)
    assert v.status == "fail"
    assert v.reasons == ["canary: greedy output differs from the baseline at prompt 3, token 17 (expected 11, got 12)"]
    # loadgen's dict form works too
    v = judge(scaled(1.2, accept=4.0), BASE, profile_kind="ddtree",
              canary_mismatch={"prompt": 0, "position": 1, "expected": 1, "got": 2})
    assert v.status == "fail" and v.canary["identical"] is False


def test_a_missing_canary_fails_speculative_but_not_autoregressive():
    v = judge(scaled(1.2, accept=4.0), BASE, profile_kind="ddtree", canary_ran=False)
    assert v.status == "fail" and "canary: not run" in v.reasons[0]
    m = {"prompt": 0, "position": 1, "expected": 1, "got": 2}
    v = judge(scaled(1.2), BASE, profile_kind="autoregressive", canary_mismatch=m)
    assert v.status == "pass" and "not gated" in v.notes[0]


def test_noisy_repeats_cap_a_level_at_marginal():
    cand = run({1: [80.0, 110.0, 150.0], 4: 360.0, 16: 1100.0}, accept=3.0)   # median +12%, spread 64%
    v = judge(cand, BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "marginal" and "too noisy" in v.reasons[0]


def test_medians_over_repeats_ignore_one_outlier():
    cand = run({1: [20.0, 108.0, 109.0], 4: 363.0, 16: 1100.0}, accept=3.0)
    v = judge(cand, BASE, GatePolicy(max_spread=10.0), profile_kind="ddtree", canary_ran=True)
    assert v.rows[0].candidate_tok_s == 108.0 and v.status == "pass"


def test_a_level_missing_from_the_candidate_fails():
    cand = run({1: 110.0, 4: 360.0}, accept=3.0)
    v = judge(cand, BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "fail" and "C=16: the candidate has no measurement" in v.reasons[0]


def test_a_baseline_that_cannot_be_compared_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        judge(scaled(1.1), run({4: 300.0}), profile_kind="autoregressive")
    assert "no C=1 measurement" in e.value.problem and "--save-baseline" in e.value.fix
    with pytest.raises(ConfigError):
        judge(scaled(1.1), BenchRun(), profile_kind="autoregressive")


def test_policy_is_overridable_like_an_inventory_does_and_rejects_typos():
    pol = GatePolicy(**{"concurrency": [1, 4, 16, 128], "min_speedup": 0.0, "accept_length_floor": {"ddtree": 3.0}})
    assert pol.concurrency == [1, 4, 16, 128]
    assert pol.analysis("ddtree-b32").accept_length.floor == 3.0 and pol.analysis("ar-tp8").accept_length.floor is None
    assert "--concurrency" in pol.loadgen_args() and "1,4,16,128" in pol.loadgen_args()
    with pytest.raises(ValidationError):
        GatePolicy(**{"min_speedupp": 0.1})
    # with min_speedup 0, an equal-speed release passes
    v = judge(scaled(1.0, accept=3.5), BASE, GatePolicy(min_speedup=0.0), profile_kind="ddtree", canary_ran=True)
    assert v.status == "pass"


def test_verdict_findings_and_record_for_the_ledger():
    v = judge(run({1: 50.0, 4: 170.0, 16: 520.0}, accept=1.51), BASE, profile_kind="ddtree", canary_ran=True)
    f = v.findings()
    assert f[-1].check == "gate" and not f[-1].ok and "gate FAIL" in f[-1].diagnosis
    rec = v.record()
    assert rec["status"] == "fail" and rec["rows"][0]["concurrency"] == 1 and rec["policy"]["min_speedup"] == 0.05


def test_a_level_inside_the_regression_limit_says_so_never_better():
    # C=1 +30 %, C=4 -5 % (a loss, allowed), C=16 +2 %
    cand = run({1: 98.0 * 1.3, 4: 330.0 * 0.95, 16: 1000.0 * 1.02}, accept=3.1)
    v = judge(cand, BASE, profile_kind="ddtree", canary_ran=True)
    assert v.status == "pass"
    why = {r.concurrency: r.why for r in v.rows}
    assert why[1].startswith("pass (+30.0 %, at least +5 % needed here")
    assert why[4].startswith("pass (-5.0 %, within the -10 % limit")
    assert why[16].startswith("pass (+2.0 %, faster than the baseline")
    assert "accept 3.10 >= floor 2.00" in why[4]
    from opsctl.gate.decide import verdict_summary

    summary = verdict_summary(v)
    assert "C=4: pass (-5.0 %, within the -10 % limit" in summary and "better" not in summary


def test_a_budget_schedules_undrafted_level_is_not_held_to_the_accept_floor():
    """A schedule that decodes without a tree at C=16 (budget 0) reports accept length 1 there
    by design; the floor still holds where it drafts."""
    levels = []
    for c, tok, acc in ((1, 250.0, 5.2), (4, 420.0, 3.1), (16, 990.0, 1.0)):
        levels += [BenchLevel(max_concurrency=c, repeat=r, output_throughput=tok, median_itl_ms=10.0, completed=8,
                              level_accept_length=acc) for r in range(3)]
    cand = BenchRun(levels=levels)
    plain = judge(cand, BASE, profile_kind="ddtree", canary_ran=True)
    assert plain.status == "fail" and any("below the ddtree floor 2.00 (C=16: 1.00)" in r for r in plain.reasons)
    # the profile's analysis: batches of 15 and more replay at the graph for 16 and up, in the 16:0 band
    profile = resolve_profile("ddtree", budget_schedule="1:16,16:0")
    spec = build_spec(profile.model_dump(mode="json"), GatePolicy().model_dump(mode="json"))
    assert spec.accept_length.undrafted == [[15, None]]
    sched = judge(cand, BASE, profile_kind="ddtree", canary_ran=True, spec=spec)
    assert sched.status == "pass", sched.reasons
    assert any("C=16: the budget schedule does not draft at this level" in n for n in sched.notes)
    low = BenchRun(levels=[lv.model_copy(update={"level_accept_length": 1.4}) if lv.max_concurrency == 4 else lv
                           for lv in levels])
    v = judge(low, BASE, profile_kind="ddtree", canary_ran=True, spec=spec)
    assert v.status == "fail" and any("(C=4: 1.40)" in r for r in v.reasons)
