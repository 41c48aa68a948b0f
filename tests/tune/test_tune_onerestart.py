"""opsctl tune in one restart (issue #37), its decisions driven through `tune()` with a test double
for the host: the double restarts, switches and measures a performance model instead of a server
(every switch it makes is a ledger switch record, as on a host), the trials, the schedule, the
recommendation and what serves afterwards are tune's own code. Also the plan's restart counts, the
plausible schedules a trial release captures, and the fallback to a restart per trial."""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from opsctl import schedule as schedule_mod
from opsctl.brake import Interrupted
from opsctl.config import load_inventory, resolve_profile
from opsctl.errors import CheckFailed, ConfigError, DeployFailed, HostError, OpsctlError
from opsctl.tune import (MAX_TRIAL_SCHEDULES, ONE_RESTART, RESTART_PER_TRIAL, LevelResult, _worth_a_trial,
                         plan_restarts, plan_tune, plausible_schedules, recorded_active, schedule_text, share_problem,
                         tune)

REPO = Path(__file__).resolve().parents[2]
LEVELS = [1, 8, 32]
BASE = {1: 100.0, 8: 600.0, 32: 1300.0}
# speedup over the baseline by budget and level: deeper trees win alone, lose under load
MODEL = {4: {1: 1.6, 8: 1.25, 32: 0.95}, 8: {1: 2.2, 8: 1.35, 32: 0.9}, 16: {1: 2.8, 8: 1.2, 32: 0.8},
         32: {1: 2.9, 8: 1.0, 32: 0.6}}
HALF_WIDTH = 0.05
BASE_RELEASE = "ar-tp8-0123456789"


def inventory(tmp_path: Path, extra: str = "") -> Path:
    inv = tmp_path / "inv"
    if inv.exists():
        shutil.rmtree(inv)
    shutil.copytree(REPO / "inventories/lab", inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text() + extra)
    return inv


class FakeHost:
    """TuneHost: releases, restarts (switch records), the control file and a model's measurements."""

    def __init__(self, plan, *, fail_start=False, fail_switch=(), die_on=None, interrupt_on=None, gate_ok=True):
        self.plan = plan
        self.capture_bs = plan.capture_bs
        self.fail_start, self.fail_switch, self.die_on = fail_start, set(fail_switch), die_on
        self.interrupt_on, self.gate_ok = interrupt_on, gate_ok
        self.current = BASE_RELEASE
        self.clock = 1_000_000.0
        self.switches: list[dict] = []
        self.ledger: list[dict] = []
        self.events: list[tuple] = []
        self.control: dict[str, str] = {}
        self.live_profile = None
        self.active: str | None = None
        self.dead = False
        self.kept = None

    # -- what a host does ------------------------------------------------------
    def now(self) -> float:
        self.clock += 1.0
        return self.clock

    def _restart(self, why: str, to: str) -> dict:
        rec = {"action": "switch", "why": why, "to_release": to, "from_release": self.current, "gap_s": 3.0,
               "time_scale": 10.0, "pool_out_at": self.now()}
        self.switches.append(rec)
        self.current = to
        return rec

    def prepare(self):
        return BASE_RELEASE, {c: BASE[c] for c in self.plan.levels}

    def deploy_trial(self, profile, while_live):
        release = f"{profile.slug}-abcdef0123"
        before = self.current
        gap = self._restart("trial", release)
        if self.fail_start:
            self._restart("rollback", before)
            raise DeployFailed(f"lab: start failed: CUDA out of memory; rolled back to {before}")
        self.live_profile, self.dead = profile, False
        self.active = profile.trial_set[0] if profile.trial_set else None
        try:
            out = while_live(release)
        except Interrupted:
            self._restart("rollback", before)
            raise
        except OpsctlError as exc:
            self._restart("rollback", before)
            raise DeployFailed(f"{exc.problem}; rolled back to {before}") from None
        return release, gap, out

    def switch_live(self, candidate: str) -> dict:
        if candidate not in (self.live_profile.trial_set or ()):
            raise CheckFailed(f"the runtime refused the switch to {candidate}: not captured")
        if candidate in self.fail_switch:
            raise CheckFailed(f"no switch to {candidate} within 120 s: still serving {self.active}")
        self.control[self.plan.control_file] = candidate
        self.active = candidate
        self.events.append(("switch", candidate))
        return {"candidate": candidate, "since_step": 32, "seconds": 0.4, "warmup_requests": 1}

    def serving_candidate(self) -> str:
        p = self.live_profile
        return self.active if p.trial_set else (p.budget_schedule or str(p.budget))

    def measure(self, label: str) -> dict[int, LevelResult]:
        cand = self.serving_candidate()
        if cand == self.interrupt_on:
            raise Interrupted("SIGINT received")
        if cand == self.die_on:
            self.dead = True
            raise HostError("bench on lab failed (exit 1): connection refused")
        self.events.append(("measure", cand))
        return levels_of(cand, self.plan.levels, self.capture_bs)

    def serving(self) -> bool:
        return not self.dead

    def apply_live(self, release, candidate, gate_profile, from_release):
        self.events.append(("gate", release, candidate, gate_profile.label))
        if not self.gate_ok:
            raise DeployFailed(f"lab: gate failed for {gate_profile.label} on {release}: C=32 below the baseline")
        if candidate is not None:
            self.control[self.plan.control_file] = candidate
            self.active = candidate
        self.ledger.append({"action": "promote", "result": "ok", "to_release": release, "ddtree_active": candidate})
        return {"release": release, "candidate": candidate, "verdict": {"status": "pass"}, "restart": False}

    def deploy(self, profile) -> dict:
        release = f"{profile.slug}-9876543210"
        self._restart("deploy", release)
        self.events.append(("deploy", profile.label))
        return {"release": release, "result": "promoted"}

    def keep(self, release, candidate) -> None:
        self.kept = (release, candidate)
        if candidate is not None:
            self.control[self.plan.control_file] = candidate
            self.active = candidate

    def finish(self, restore, record):
        gap = None
        if restore is not None and self.current != restore:
            gap = self._restart("restore", restore)
        self.ledger.append(record)
        return gap, 0.5

    def switches_since(self, began: float) -> list[dict]:
        return [s for s in self.switches if s["pool_out_at"] >= began]


def levels_of(candidate: str, levels, capture_bs) -> dict[int, LevelResult]:
    """The model's measurement of a candidate: a budget's speedups; a schedule's, per level, those of
    the band a batch of that level decodes in (budget 0: the baseline's own decoding)."""
    out = {}
    for c in levels:
        if ":" in candidate:
            b = schedule_mod.parse(candidate).band_for(c, capture_bs).budget
            s = MODEL[b][c] if b else 1.0
        else:
            s = MODEL[int(candidate)][c]
        out[c] = LevelResult(c, BASE[c] * s, s, s - HALF_WIDTH, s + HALF_WIDTH, 24)
    return out


def run(tmp_path, budgets=(4, 8, 16), extra="", **kw):
    doubles = ("fail_start", "fail_switch", "die_on", "interrupt_on", "gate_ok")
    host_kw = {k: kw.pop(k) for k in list(kw) if k in doubles}
    plan = plan_tune(inventory(tmp_path, extra), list(budgets), concurrency=LEVELS, **kw)
    fake = FakeHost(plan, **host_kw)
    return plan, fake, tune(inventory(tmp_path, extra), plan, ops=fake)


SCHEDULE = "1:16,3:8,16:0"   # the model's winners 16 at C=1, 8 at C=8, the baseline at C=32


# --------------------------------------------------------------------------- one restart


def test_one_restart_measures_every_candidate_on_one_trial_release_and_restores(tmp_path):
    plan, fake, res = run(tmp_path)
    assert plan.mode == ONE_RESTART and res.mode == ONE_RESTART
    assert [s["why"] for s in fake.switches] == ["trial", "restore"]
    assert res.restarts == 2 and res.planned_restarts == 2 and res.as_dict()["restarts"]["by_why"] == {
        "trial": 1, "restore": 1}
    # each budget switched to live then measured, then the schedule built from the winners, on the same start
    assert fake.events == [("switch", "4"), ("measure", "4"), ("switch", "8"), ("measure", "8"),
                           ("switch", "16"), ("measure", "16"), ("switch", SCHEDULE), ("measure", SCHEDULE)]
    assert [t.candidate for t in res.trials] == ["4", "8", "16", SCHEDULE]
    assert all(t.status == "measured" and t.release == res.trials[0].release for t in res.trials)
    assert res.trials[0].release.startswith("ddtree-t4-8-16-s")
    assert res.trials[0].gap is not None and all(t.gap is None for t in res.trials[1:])  # one shared restart
    assert all(t.live_switch["candidate"] == t.candidate for t in res.trials)
    assert res.best == {1: 16, 8: 8, 32: 0} and res.schedule == SCHEDULE
    assert res.recommended_schedule == SCHEDULE and res.recommendation is None
    assert res.after == "restored" and res.restored == BASE_RELEASE and fake.current == BASE_RELEASE
    assert res.outage_s == 6.0 and res.outage_site_s == 60.0
    assert fake.ledger[-1]["action"] == "tune" and fake.ledger[-1]["restored"] == BASE_RELEASE


def test_one_restart_and_restart_per_trial_reach_the_same_decisions(tmp_path):
    _, one_fake, one = run(tmp_path)
    plan, per_fake, per = run(tmp_path, restart_per_trial=True)
    assert plan.mode == RESTART_PER_TRIAL and plan.mode_reason == "--restart-per-trial"
    assert (one.best, one.schedule, one.recommendation, one.recommended_schedule, one.reason) == \
        (per.best, per.schedule, per.recommendation, per.recommended_schedule, per.reason)
    assert [t.candidate for t in one.trials] == [t.candidate for t in per.trials]
    assert {t.candidate: {c: lv.tok_s for c, lv in t.levels.items()} for t in one.trials} == \
        {t.candidate: {c: lv.tok_s for c, lv in t.levels.items()} for t in per.trials}
    # per trial: one restart per budget and one for the schedule, then the restore
    assert [s["why"] for s in per_fake.switches] == ["trial"] * 4 + ["restore"]
    assert per.restarts == 5 == per.planned_restarts and one.restarts == 2
    assert len({t.release for t in per.trials}) == 4


def test_early_stop_skips_larger_budgets_on_the_shared_release_too(tmp_path, monkeypatch):
    monkeypatch.setitem(MODEL, 4, {1: 3.0, 8: 1.6, 32: 1.2})   # throughput falls at every level from 4 on
    monkeypatch.setitem(MODEL, 8, {1: 2.8, 8: 1.5, 32: 1.1})
    monkeypatch.setitem(MODEL, 16, {1: 2.6, 8: 1.4, 32: 1.0})
    _, fake, res = run(tmp_path, budgets=(4, 8, 16, 32))
    assert [t.status.split(" ")[0] for t in res.trials] == ["measured", "measured", "measured", "skipped"]
    assert ("switch", "32") not in fake.events
    assert res.recommendation == 4 and [s["why"] for s in fake.switches] == ["trial", "restore"]


def test_a_candidate_that_does_not_switch_fails_alone_and_the_others_are_measured(tmp_path):
    _, fake, res = run(tmp_path, fail_switch={"8"})
    by = {t.candidate: t for t in res.trials}
    assert by["8"].status.startswith("failed: no switch to 8 within 120 s")
    assert by["4"].status == by["16"].status == "measured"
    # without 8 measured, C=8's winner is 4: the schedule is built from what was measured
    assert res.best == {1: 16, 8: 4, 32: 0} and res.trials[-1].schedule == "1:16,3:4,16:0"
    assert res.trials[-1].status == "measured" and [s["why"] for s in fake.switches] == ["trial", "restore"]


def test_a_server_that_dies_during_a_trial_rolls_the_trial_release_back_and_fails_the_rest(tmp_path):
    _, fake, res = run(tmp_path, die_on="8")
    by = {t.candidate: t for t in res.trials}
    assert by["4"].status == "measured"
    assert by["8"].status.startswith("failed: bench on lab failed")
    assert by["16"].status.startswith("failed: the trial release stopped serving during the trial of budget 8")
    assert [s["why"] for s in fake.switches] == ["trial", "rollback"]   # the rollback put the baseline back
    assert res.restored == BASE_RELEASE and fake.current == BASE_RELEASE and res.restarts == 2


def test_a_trial_release_that_does_not_start_fails_every_candidate_and_says_what_to_try(tmp_path):
    _, fake, res = run(tmp_path, fail_start=True)
    assert [t.candidate for t in res.trials] == ["4", "8", "16"]
    assert all(t.status.startswith("failed: lab: start failed: CUDA out of memory") for t in res.trials)
    assert any("--restart-per-trial" in n for n in res.notes)
    assert res.recommendation is None and res.reason.startswith("no budget beats the baseline")
    assert res.restored == BASE_RELEASE and [s["why"] for s in fake.switches] == ["trial", "rollback"]


def test_an_interrupt_during_a_trial_restores_and_says_so(tmp_path):
    inv = inventory(tmp_path)
    plan = plan_tune(inv, [4, 8, 16], concurrency=LEVELS, apply=True)
    fake = FakeHost(plan, interrupt_on="8")
    with pytest.raises(Interrupted) as exc:
        tune(inv, plan, ops=fake)
    assert f"{BASE_RELEASE} (what served before) serves again" in exc.value.problem
    assert fake.current == BASE_RELEASE and not any(e[0] == "gate" for e in fake.events)   # --apply: nothing applied
    assert fake.ledger[-1]["result"] == "interrupted" and fake.ledger[-1]["restored"] == BASE_RELEASE


# --------------------------------------------------------------------------- after the trials


def test_apply_promotes_the_trial_release_serving_the_winner_without_a_restart(tmp_path):
    plan, fake, res = run(tmp_path, apply=True)
    assert [s["why"] for s in fake.switches] == ["trial"] and res.restarts == 1 == res.planned_restarts
    gate = [e for e in fake.events if e[0] == "gate"]
    assert gate == [("gate", res.trials[0].release, SCHEDULE, f"ddtree --budget-schedule {SCHEDULE}")]
    assert res.after == "applied-live" and res.serving == res.trials[0].release and res.serving_candidate == SCHEDULE
    assert res.restored is None and fake.control[plan.control_file] == SCHEDULE
    assert fake.ledger[-1]["ddtree_active"] == SCHEDULE and fake.ledger[-1]["to_release"] == res.serving


def test_apply_whose_gate_fails_restores_what_served_before(tmp_path):
    _, fake, res = run(tmp_path, apply=True, gate_ok=False)
    assert res.after == "restored" and fake.current == BASE_RELEASE
    assert [s["why"] for s in fake.switches] == ["trial", "restore"]
    assert any("gate failed" in n and f"restoring {BASE_RELEASE}" in n for n in res.notes)


def test_apply_lean_deploys_the_winners_own_release_in_place_of_the_restore(tmp_path):
    _, fake, res = run(tmp_path, apply=True, lean=True)
    assert [s["why"] for s in fake.switches] == ["trial", "deploy"] and res.restarts == 2 == res.planned_restarts
    assert ("deploy", f"ddtree --budget-schedule {SCHEDULE}") in fake.events
    assert res.after == "deployed" and res.serving.startswith("ddtree-s1b16-3b8-16b0-") and res.restored is None


def test_keep_trial_leaves_the_trial_release_serving_the_recommendation(tmp_path):
    plan, fake, res = run(tmp_path, extra="  tune:\n    restore: keep-trial\n")
    assert plan.after == "keep-trial"
    assert [s["why"] for s in fake.switches] == ["trial"] and res.restarts == 1 == res.planned_restarts
    assert res.after == "kept-trial" and fake.kept == (res.trials[0].release, SCHEDULE)
    assert fake.ledger[-1]["ddtree_active"] == SCHEDULE and fake.ledger[-1]["restored"] is None


def test_nothing_to_apply_or_keep_restores(tmp_path, monkeypatch):
    for b in MODEL:
        monkeypatch.setitem(MODEL, b, {1: 0.9, 8: 0.8, 32: 0.7})
    _, fake, res = run(tmp_path, extra="  tune:\n    restore: keep-trial\n")
    assert res.reason.startswith("no budget beats the baseline") and res.after == "restored"
    assert fake.kept is None and [s["why"] for s in fake.switches] == ["trial", "restore"]
    _, fake, res = run(tmp_path, apply=True)
    assert res.after == "restored" and not any(e[0] == "gate" for e in fake.events)


def test_restart_per_trial_applies_a_winner_that_is_still_live_without_a_restart(tmp_path):
    """The schedule trial runs last: when it wins, its release serves already; --apply gates and
    promotes it where it is. A winner that is not live any more is deployed (one restart)."""
    _, fake, res = run(tmp_path, restart_per_trial=True, apply=True)
    assert res.after == "applied-live" and res.serving_candidate is None
    assert res.serving.startswith("ddtree-s1b16-3b8-16b0-") and [s["why"] for s in fake.switches] == ["trial"] * 4
    _, fake, res = run(tmp_path, restart_per_trial=True, apply=True, schedule_trial=False)
    assert res.recommendation == 4 and res.after == "deployed"   # 8 and 16 are proven below the baseline at C=32
    assert [s["why"] for s in fake.switches] == ["trial"] * 3 + ["deploy"]


# --------------------------------------------------------------------------- the plan


def test_restart_plan_counts_each_way_before_the_start(tmp_path):
    inv = inventory(tmp_path)

    def counts(**kw):
        plan = plan_tune(inv, [4, 8, 16], concurrency=LEVELS, **kw)
        rp = plan_restarts(plan, 420.0, 10.0, 30.0)
        return rp.trial_restarts, rp.after_restarts, rp.restarts, rp.as_dict()["restarts_max"]

    assert counts() == (1, 1, 2, 2)
    assert counts(apply=True) == (1, 0, 1, 2)            # a restore when nothing wins or the gate fails
    assert counts(apply=True, lean=True) == (1, 1, 2, 3)  # the lean deploy's own rollback on a failed gate
    assert counts(restart_per_trial=True) == (4, 1, 5, 5)
    assert counts(restart_per_trial=True, schedule_trial=False) == (3, 1, 4, 4)
    plan = plan_tune(inv, [4, 8, 16], concurrency=LEVELS)
    rp = plan_restarts(plan, 420.0, 10.0, 30.0)
    assert rp.projected_outage_s == 840.0 and rp.as_dict()["projected_outage_lab_s"] == 84.0
    text = rp.describe()
    assert text.startswith("2 restart(s) of SGLang — 1 for the trials (one trial release captures budgets 4, 8, 16 "
                           "and ") and "switches between them live" in text
    assert "~14 min of outage at the site's scale (7 min per start; 1 min 24 s in the lab, time scale 10)" in text
    keep = plan_tune(inventory(tmp_path, "  tune:\n    restore: keep-trial\n"), [4, 8, 16], concurrency=LEVELS)
    assert plan_restarts(keep, None, None, 30.0).restarts == 1


def test_too_many_schedules_to_capture_give_the_schedule_its_own_restart(tmp_path, monkeypatch):
    import opsctl.tune as core

    monkeypatch.setattr(core, "MAX_TRIAL_SCHEDULES", 3)
    plan = plan_tune(inventory(tmp_path), [4, 8, 16], concurrency=LEVELS)
    assert plan.mode == ONE_RESTART and plan.candidates == ("4", "8", "16")
    assert plan.schedule_restart_reason.startswith("more than 3 schedules can be built")
    assert plan_restarts(plan, 420.0, None, 30.0).trial_restarts == 2
    fake = FakeHost(plan)
    res = tune(inventory(tmp_path), plan, ops=fake)
    assert [s["why"] for s in fake.switches] == ["trial", "trial", "restore"]
    assert res.trials[-1].schedule == SCHEDULE and res.trials[-1].live_switch is None
    assert res.trials[-1].release.startswith("ddtree-s1b16-3b8-16b0-")
    assert any("its trial takes its own restart" in n for n in res.notes)


def test_the_schedule_built_from_any_winners_is_among_the_captured_candidates():
    """Whatever wins where, the schedule tune builds is one the trial release captured (the runtime
    refuses to switch to any other), or one not worth a trial."""
    from opsctl.schedule import captured_batch_sizes

    for levels, budgets, max_bs in (([1, 8, 32], [4, 8, 16], 32), ([1, 4, 8], [4, 16], 32),
                                    ([1, 4, 16, 64], [8, 16, 32], 64), ([2, 3], [4], 8)):
        cap = captured_batch_sizes(max_bs)
        captured = set(plausible_schedules(levels, budgets, cap))
        for combo in itertools.product([0, *budgets], repeat=len(levels)):
            text = schedule_text(dict(zip(levels, combo)), cap)
            assert text in captured or not _worth_a_trial(text), (levels, combo, text)
        assert all(set(b for b in (x.budget for x in schedule_mod.parse(s).bands)) <= {0, *budgets} for s in captured)


def test_plausible_schedules_stop_past_the_cap():
    from opsctl.schedule import captured_batch_sizes

    assert plausible_schedules([1, 4, 8, 16, 32], [4, 8, 16, 32], captured_batch_sizes(64)) is None
    found = plausible_schedules([1, 4, 16, 128], [4, 8, 16, 32], captured_batch_sizes(128))
    assert found is not None and 0 < len(found) <= MAX_TRIAL_SCHEDULES


def test_trials_that_cannot_share_one_server_take_a_restart_each_and_the_plan_says_why(tmp_path):
    inv = inventory(tmp_path, "  extra_env:\n    SGLANG_DDTREE_SCHEDULE_FILE: /etc/site/schedule.json\n")
    plan = plan_tune(inv, [4, 8, 16], concurrency=LEVELS)
    assert plan.mode == RESTART_PER_TRIAL and plan.trial_profile is None
    assert plan.mode_reason.startswith("the trials cannot share one server: the inventory sets "
                                       "SGLANG_DDTREE_SCHEDULE_FILE")
    assert plan_restarts(plan, 420.0, None, 30.0).describe().startswith(
        "5 restart(s) of SGLang — 4 for the trials (one per budget and one for the schedule built from the winners)")
    fake = FakeHost(plan)
    res = tune(inv, plan, ops=fake)
    assert res.mode == RESTART_PER_TRIAL and [s["why"] for s in fake.switches] == ["trial"] * 4 + ["restore"]
    assert not any(e[0] == "switch" for e in fake.events)


def test_share_problem_names_what_differs_between_the_budgets_servers(tmp_path):
    host = load_inventory(inventory(tmp_path)).hosts["lab"]
    same = {b: host.profile("ddtree", b) for b in (4, 8)}
    assert share_problem(host, same) is None
    differ = {4: resolve_profile("ddtree", 4), 8: resolve_profile("ddtree", 8, overrides={"ddtree": {"tp_size": 4}})}
    assert share_problem(host, differ) == ("budget 4 and budget 8 run different servers (tp_size: 8 vs 4), and one "
                                           "start captures one server")
    flags = {b: resolve_profile("ddtree", b, overrides={"ddtree": {"extra_args": ["--speculative-num-draft-tokens=9"]}})
             for b in (4, 8)}
    assert "extra_args set --speculative-num-draft-tokens" in share_problem(host, flags)


def test_bad_flags_and_settings_fail_before_any_host_io(tmp_path):
    with pytest.raises(ConfigError, match="--lean applies only with --apply"):
        plan_tune(inventory(tmp_path), [4, 8], lean=True)
    with pytest.raises(ConfigError) as exc:
        load_inventory(inventory(tmp_path, "  tune:\n    restore: keep-trail\n"))
    assert exc.value.exit_code == 2 and "tune.restore" in exc.value.problem
    with pytest.raises(ConfigError) as exc:
        load_inventory(inventory(tmp_path, "  tune:\n    switch_timeout_s: 0\n"))
    assert "switch_timeout_s" in exc.value.problem


def test_a_restored_trial_release_serves_what_the_ledger_recorded_for_it():
    ledger = [{"action": "promote", "result": "ok", "to_release": "ddtree-t4-8-x", "ddtree_active": "8"},
              {"action": "tune", "to_release": "ddtree-t4-8-y", "ddtree_active": "4"},
              {"action": "deploy", "result": "trial", "to_release": "ddtree-t4-8-x"}]
    assert recorded_active(ledger, "ddtree-t4-8-x") == "8"
    assert recorded_active(ledger, "ddtree-t4-8-y") == "4"
    assert recorded_active(ledger, "ar-tp8-z") is None


def test_a_single_candidate_is_its_own_trial_release(tmp_path):
    plan = plan_tune(inventory(tmp_path), [16], concurrency=[1])
    assert plan.mode == RESTART_PER_TRIAL and plan.trial_profile is None
    assert plan.mode_reason == "one candidate (budget 16): its own release is the trial"
    assert plan_restarts(plan, None, None, 30.0).restarts == 2
    # with levels to build a schedule from, the one budget and its schedules share a trial release
    assert plan_tune(inventory(tmp_path), [16], concurrency=[1, 32]).mode == ONE_RESTART
