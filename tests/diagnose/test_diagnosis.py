"""opsctl diagnose's arithmetic (opsctl/onhost/diagnosis.py, opsctl/diagnose.py): the site's own
numbers, the forward model, the accept curve, the step line, and the model's truth."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from opsctl import diagnose as dx
from opsctl.onhost import diagnosis as dg

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "opsctl" / "lab" / "emulator"))
from sglang.lab import perf  # noqa: E402  (the emulator's performance model: the lab's truth)

SITE_REFERENCE = {8: 4.48, 16: 5.3}   # context.md: the same drafter on NVLink


def site_diagnosis() -> dict:
    """context.md's table: AR TP8 ~98 tok/s at C=1; DDTree budget 32 ~50 tok/s at C=1 and ~87 at
    C=128, accept 1.51-1.65 (aggregate rates: what the site measured)."""
    cand = [dg.Side(1, 1.51 * 1000 / 50.0, 1.51, "aggregate", tok_s=50.0),
            dg.Side(128, 128 * 1.65 * 1000 / 87.0, 1.65, "aggregate", tok_s=87.0)]
    base = [dg.Side(1, 1000 / 98.0, 1.0, "aggregate", tok_s=98.0)]
    return dx.diagnose(cand, base, budget=32, reference=SITE_REFERENCE, baseline_label="ar-tp8")


def level(d: dict, c: int) -> dict:
    return next(r for r in d["levels"] if r["concurrency"] == c)


def test_the_sites_budget_32_needs_acceptance_3_and_had_half_of_it():
    d = site_diagnosis()
    c1 = level(d, 1)
    assert 2.8 <= c1["step_ratio"] <= 3.1                 # 30 ms against 10.2 ms
    assert c1["break_even_accept"] == c1["step_ratio"]
    assert c1["accept"] == pytest.approx(1.51) and c1["accept"] < c1["break_even_accept"] / 1.9
    assert c1["speedup"] == pytest.approx(50 / 98, rel=0.01) and c1["loses"]
    kinds = [c["kind"] for c in c1["causes"]]
    assert "acceptance" in kinds and "verify_compute" in kinds     # both acceptance and step cost named
    acc = next(c for c in c1["causes"] if c["kind"] == "acceptance")
    assert "5.30 at budget 16" in acc["evidence"] and "larger tree can only add" in acc["evidence"]
    pred = {(p["budget"], p["concurrency"]): p for p in d["predictions"]}
    assert pred[(8, 1)]["tok_s"] > pred[(32, 1)]["tok_s"]        # budget 8 predicted to beat budget 32 at C=1
    assert pred[(8, 1)]["tok_s"] > pred[(0, 1)]["tok_s"]         # ... and the baseline
    assert pred[(32, 1)]["tok_s"] == pytest.approx(50.0, rel=0.01)  # its own budget is what was measured
    assert d["best"]["1"] == 8
    assert d["schedule"] and d["schedule"].startswith("1:8")
    assert "predicted best: C=1: budget 8" in d["headline"]


def test_every_level_has_the_fields_other_tools_read():
    d = site_diagnosis()
    for r in d["levels"]:
        for k in ("concurrency", "accept", "step_ms", "step_ratio", "break_even_accept", "verify_ms", "verify_source",
                  "remainder_ms", "speedup"):
            assert k in r, k
    for c in d["causes"]:
        assert set(c) == {"kind", "share", "evidence"} and 0 < c["share"] <= 1
    assert abs(sum(c["share"] for c in d["causes"]) - 1) < 0.06
    for p in d["predictions"]:
        assert {"budget", "concurrency", "tok_s"} <= set(p)


def test_a_one_level_baseline_bounds_the_verify_by_the_whole_step_and_says_so():
    c1 = level(site_diagnosis(), 1)
    assert c1["verify_source"] == "bound" and c1["remainder_ms"] == 0


def test_the_forward_model_interpolates_extrapolates_and_says_which():
    m = dg.ForwardModel([(1, 10.2, "baseline"), (4, 11.76, "baseline"), (8, 13.84, "baseline")])
    ms, how = m.estimate(6)
    assert how == "interpolated" and ms == pytest.approx(12.8, abs=0.01)
    ms, how = m.estimate(8 * 33)
    assert how == "extrapolated" and ms == pytest.approx(9.68 + 0.52 * 264, rel=0.01)
    ms, how = m.estimate(8)
    assert how == "interpolated" and ms == 13.84
    m2 = dg.ForwardModel([(1, 10.2, "baseline"), (136, 80.4, "measured")])
    assert m2.estimate(136) == (80.4, "measured")


def test_the_accept_curve_never_falls_below_a_smaller_tree_except_for_the_measured_release():
    curve = dg.AcceptCurve([dg.AcceptPoint(8, 4.48, "profile reference"), dg.AcceptPoint(16, 5.3, "profile reference"),
                            dg.AcceptPoint(32, 1.58, "this release")])
    assert curve.at(32) == (1.58, "this release")
    acc, how = curve.at(64)
    assert acc == 5.3 and "at least budget 16" in how
    acc, how = curve.at(12)
    assert 4.48 < acc < 5.3 and how == "interpolated"
    assert curve.reference_for(32)[0] == 5.3
    assert curve.reference_for(4)[0] is None


def test_a_measured_point_on_this_host_beats_the_reference():
    curve = dg.AcceptCurve([dg.AcceptPoint(16, 5.3, "profile reference"),
                            dg.AcceptPoint(16, 4.1, "measured on this host (ddtree-b16-x)")])
    assert curve.at(16) == (4.1, "measured on this host (ddtree-b16-x)")


def test_no_cause_for_a_release_that_wins():
    model, ar = perf.Model("tp", "DDTREE", 17), perf.Model("tp")
    cand = [dg.Side(1, model.step_ms(1), 5.5, "requests", measured_speedup=2.5)]
    base = [dg.Side(c, ar.step_ms(c), 1.0, "requests") for c in (1, 4, 8)]
    d = dx.diagnose(cand, base, budget=16, reference=SITE_REFERENCE)
    assert not d["causes"] and not level(d, 1)["causes"] and not level(d, 1)["loses"]
    assert d["headline"].startswith("no level loses")


def model_truth(model: "perf.Model", c: int, accept: float, healthy_accept: float) -> dict[str, float]:
    """The shares the performance model knows: its own forward, drafter, tree and host parts."""
    parts = model.step_parts(c)
    step = sum(parts.values())
    return dg.shares(dg.loss_parts(accept, step, parts["target_ms"], perf.Model("tp").step_ms(c), healthy_accept))


@pytest.mark.parametrize("case,budget,c,faults,top", [
    ("accept_collapse", 32, 1, {"accept_override": 1.58, "cpu_tree_ms_per_req": 1.0}, "acceptance"),
    ("host_overhead", 8, 1, {"host_ms_per_step": 40.0}, "overhead"),
    ("verify_compute", 32, 8, {}, "verify_compute"),
])
def test_the_diagnosis_from_step_times_finds_the_models_cause(case, budget, c, faults, top):
    """Steps and accept as the model produces them (no noise), the baseline at the lab's levels, the
    verify estimated (no step line): the top cause and its share against the model's truth."""
    model, ar = perf.Model("tp", "DDTREE", budget + 1, **faults), perf.Model("tp")
    accept = model.accept_len()
    cand = [dg.Side(c, model.step_ms(c), accept, "requests")]
    base = [dg.Side(x, ar.step_ms(x), 1.0, "requests") for x in (1, 4, 8)]
    d = dx.diagnose(cand, base, budget=budget, reference=SITE_REFERENCE)
    causes = level(d, c)["causes"]
    assert causes and causes[0]["kind"] == top, causes
    truth = model_truth(model, c, accept, perf.ddtree_accept_len(budget))
    assert causes[0]["share"] == pytest.approx(truth[top], rel=0.2), (causes, truth)


def test_measured_parts_from_the_step_line_replace_the_estimate():
    model, ar = perf.Model("tp", "DDTREE", 9, host_ms_per_step=40.0), perf.Model("tp")
    p = model.step_parts(1)
    line = ("[2026-12-05 10:00:00 TP0] DDTree step parts: bs=1 budget=8 sampled=20 of=200 "
            + " ".join(f"{k}={v:.3f}" for k, v in p.items()) + f" step_ms={sum(p.values()):.3f}")
    parts = dg.parse_step_parts([line, "unrelated", "DDTree step parts: bs=x"])
    assert len(parts) == 1 and parts[0].parts["prep_ms"] == 40.0
    cand = [dg.Side(1, model.step_ms(1) + 0.5, 4.5, "requests")]
    d = dx.diagnose(cand, [dg.Side(1, ar.step_ms(1), 1.0)], budget=8, step_parts=parts)
    r = level(d, 1)
    assert r["verify_source"] == "measured" and r["verify_ms"] == pytest.approx(p["target_ms"], abs=1e-3)
    assert r["parts"]["prep_ms"] == 40.0 and r["parts"]["outside_ms"] == pytest.approx(0.5, abs=1e-3)
    assert r["causes"][0]["kind"] == "overhead" and "verify preparation 40.00" in r["causes"][0]["evidence"]


def test_parallelism_is_named_where_the_other_baseline_is_faster():
    tp, ep, dd = perf.Model("tp"), perf.Model("ep"), perf.Model("tp", "DDTREE", 17)
    cand = [dg.Side(128, dd.step_ms(128), 5.5)]
    d = dx.diagnose(cand, [dg.Side(128, tp.step_ms(128))], budget=16,
                    other_baseline=[dg.Side(128, ep.step_ms(128))], baseline_label="ar-tp8", other_label="ar-ep8")
    kinds = {c["kind"]: c for c in level(d, 128)["causes"]}
    assert "parallelism" in kinds and "ar-ep8 runs" in kinds["parallelism"]["evidence"]


def test_the_reason_line_and_the_text_match_the_numbers():
    d = site_diagnosis()
    line = dx.reason_line(d)
    assert line.startswith("why: C=1: accept 1.51 against a break-even of 2.96")
    text = "\n".join(dx.text_lines(d))
    assert "causes, by share of the loss:" in text and "predicted decode tok/s" in text
    assert "--budget-schedule 1:8" in text


def test_reference_accept_parsing():
    assert dx.parse_reference("8:4.48, 16:5.3") == {8: 4.48, 16: 5.3}
    from opsctl.errors import ConfigError
    for bad in ("8=4.48", "0:2", "8:0.5"):
        with pytest.raises(ConfigError):
            dx.parse_reference(bad)


def test_unknown_budget_and_missing_sides_are_clear_errors():
    from opsctl.errors import ConfigError
    side = [dg.Side(1, 30.0, 1.5)]
    with pytest.raises(ConfigError) as e:
        dx.diagnose(side, side, budget=None)
    assert "budget is not known" in e.value.one_line() and "--budget N" in e.value.one_line()
    with pytest.raises(ConfigError) as e:
        dx.diagnose(side, [], budget=32)
    assert "--baseline FILE" in e.value.one_line()


def test_the_watch_line():
    line = dg.window_line(1.58, 50.0, 1, 98.0)
    assert "break-even of 3.10" in line or "break-even of 3.09" in line
    assert dg.window_line(None, 50.0, 1, 98.0) is None


def test_tune_checks_the_recorded_predictions_against_its_trials():
    from opsctl.tune import LevelResult, TrialResult, prediction_check

    recorded = {"release": "ddtree-b32-x", "ts": "t", "predictions": [
        {"budget": 8, "concurrency": 1, "tok_s": 250.0, "accept_source": "profile reference"},
        {"budget": 16, "concurrency": 1, "tok_s": 240.0}]}
    lv = LevelResult(1, 230.0, 2.3, 2.1, 2.5, 8, decode_tok_s=262.0)
    trials = [TrialResult(8, "r8", "measured", {1: lv}), TrialResult(16, "r16", "failed: x", {1: lv}),
              TrialResult(16, "rs", "measured", {1: lv}, schedule="1:16,6:0")]
    check = prediction_check(recorded, trials)
    assert check == [{"budget": 8, "concurrency": 1, "predicted_tok_s": 250.0, "measured_tok_s": 262.0,
                      "error_pct": -4.6, "accept_source": "profile reference"}]
    assert prediction_check(None, trials) == []


def test_the_recorded_predictions_are_the_newest_ddtree_verdicts():
    ledger = [{"action": "verdict", "release": "a", "ts": "1", "diagnosis": {"predictions": [{"budget": 8}]}},
              {"action": "verdict", "release": "b", "ts": "2"},
              {"action": "switch", "diagnosis": {"predictions": [{"budget": 4}]}}]
    rec = dx.recorded_predictions(ledger)
    assert rec["release"] == "a" and rec["predictions"] == [{"budget": 8}]
    assert dx.recorded_predictions([]) is None
