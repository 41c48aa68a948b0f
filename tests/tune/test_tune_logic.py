"""opsctl tune's decisions on plain data: early stop, best budget per level, the budget
schedule and the single-budget recommendation."""
from __future__ import annotations

import pytest

from opsctl.errors import ConfigError
from opsctl.tune import (LevelResult, TrialResult, best_per_level, parse_budgets, recommend, schedule_text,
                         should_stop)

LEVELS = [1, 8, 32, 64]
BASE = {1: 98.0, 8: 600.0, 32: 1300.0, 64: 1600.0}


def trial(budget: int, speedups: dict[int, float], width: float = 0.05) -> TrialResult:
    return TrialResult(budget, f"ddtree-b{budget}-x", "measured", {
        c: LevelResult(c, BASE[c] * s, s, s - width, s + width, 24) for c, s in speedups.items()})


def test_budgets_parse_sorted_and_bounded():
    assert parse_budgets("16,4,8,4") == [4, 8, 16]
    for bad in ("4,x", "", ","):
        with pytest.raises(ConfigError):
            parse_budgets(bad)
    # the range is the profile's (0, 512): plan_tune refuses them with --budget N's own line
    # (tests/foundation/test_schedule.py::test_tune_budgets_get_the_line_a_deploy_budget_gets)
    assert parse_budgets("0,4") == [0, 4] and parse_budgets("512") == [512]


def test_schedule_gives_each_level_its_best_budget_and_zero_where_the_baseline_wins():
    trials = [trial(8, {1: 2.2, 8: 1.3, 32: 1.08, 64: 0.8}), trial(16, {1: 2.8, 8: 1.2, 32: 0.9, 64: 0.6}),
              trial(32, {1: 3.0, 8: 1.0, 32: 0.7, 64: 0.4})]
    best = best_per_level(trials, LEVELS)
    assert best == {1: 32, 8: 8, 32: 8, 64: 0}
    # bands start between the levels (a load of C decodes in batches a little under C)
    assert schedule_text(best) == "1:32,3:8,46:0"
    # ... moved up to a captured graph batch size, so every band holds one
    assert schedule_text(best, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]) == "1:32,4:8,48:0"
    assert schedule_text({1: 16, 2: 8}, [1, 2]) == "1:16,2:8"
    assert schedule_text({1: 16, 32: 0}) == "1:16,6:0"


def test_a_win_inside_the_noise_does_not_count():
    best = best_per_level([trial(8, {1: 1.03, 8: 1.02, 32: 0.9, 64: 0.8}, width=0.06)], LEVELS)
    assert best == {1: 0, 8: 0, 32: 0, 64: 0} and schedule_text(best) == "1:0"


def test_recommendation_when_speculation_wins_at_low_concurrency_only_is_keep_the_baseline():
    trials = [trial(8, {1: 2.2, 8: 1.3, 32: 0.93, 64: 0.8}), trial(16, {1: 2.8, 8: 1.2, 32: 0.9, 64: 0.6})]
    best, reason = recommend(trials, LEVELS, BASE)
    assert best is None
    assert reason.startswith("no budget beats the baseline at these levels: keep the baseline")
    assert "budget 8: below the baseline at C=32,64" in reason


def test_recommendation_takes_the_best_weighted_throughput_without_a_losing_level():
    trials = [trial(4, {1: 1.6, 8: 1.2, 32: 1.05, 64: 1.01}), trial(8, {1: 2.2, 8: 1.3, 32: 1.1, 64: 0.9})]
    best, reason = recommend(trials, LEVELS, BASE)
    assert best is not None and best.budget == 4 and "no level proven below the baseline" in reason and "+" in reason


def test_a_loss_inside_the_noise_does_not_disqualify():
    """A level whose interval still holds 1 is not proven slower (as a win inside the noise
    is not proven faster): 0.97 +- 0.05 at C=64 keeps budget 8 in the running."""
    trials = [trial(4, {1: 1.6, 8: 1.2, 32: 1.05, 64: 1.01}), trial(8, {1: 2.2, 8: 1.3, 32: 1.1, 64: 0.97})]
    best, _ = recommend(trials, LEVELS, BASE)
    assert best is not None and best.budget == 8


def test_the_schedule_trial_is_recommended_when_it_wins_and_never_enters_best_per_level():
    single = [trial(8, {1: 2.2, 8: 1.3, 32: 0.9, 64: 0.8}), trial(16, {1: 2.8, 8: 1.2, 32: 0.8, 64: 0.6})]
    sched = trial(16, {1: 2.8, 8: 1.3, 32: 1.0, 64: 1.0})
    sched.schedule = "1:16,8:8,32:0"
    best, reason = recommend(single + [sched], LEVELS, BASE)
    assert best is sched and reason.startswith("schedule 1:16,8:8,32:0: traffic-weighted")
    assert best_per_level(single + [sched], LEVELS) == best_per_level(single, LEVELS)
    assert not should_stop(single + [sched])


def test_early_stop_after_two_falls_at_every_level():
    t = [trial(4, {1: 2.0, 8: 1.5}), trial(8, {1: 1.9, 8: 1.4}), trial(16, {1: 1.8, 8: 1.3})]
    assert should_stop(t)
    assert not should_stop(t[:2])
    mixed = [trial(4, {1: 2.0, 8: 1.5}), trial(8, {1: 2.1, 8: 1.4}), trial(16, {1: 1.8, 8: 1.3})]
    assert not should_stop(mixed)
