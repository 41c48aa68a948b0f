"""The deploy workflow, top to bottom:

    plan -> pre-checks -> lock -> stage (drafter sync + prepare playbook) -> guard ->
    switch -> ready -> validate -> bench -> judge -> promote | rollback

Nothing on the host changes before `stage`, and nothing live changes before
`switch`: a deploy interrupted earlier leaves the host serving what it served. From
`switch` on, a guard timer on the host puts the previous release back unless the
deploy is confirmed (promoted or rolled back) in time, so a controller that dies
mid-gate cannot leave an unjudged release serving.
"""
from __future__ import annotations

import contextlib
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from opsctl.brake import BRAKE, Interrupted
from opsctl.config import HostConfig, Inventory, Profile, RolloutPolicy
from opsctl.errors import ConfigError, DeployFailed, OpsctlError
from opsctl.flow.bench import require_baseline
from opsctl.flow.checks import run_post_checks, run_pre_checks
from opsctl.flow.judge import bench_and_judge
from opsctl.flow.plan import LEDGER_ROOM, Plan, make_plan
from opsctl.flow.promote import fallback_release, fallback_releases, gap_fields, prune, roll_back_after_failure, rollback_host
from opsctl.flow.ready import crash_cause, wait_ready, with_start_diagnosis
from opsctl.releases import NO_GATE_REASON
from opsctl.flow.rollout import Wave, new_rollout_id, plan_waves, rollout_policy, sleep_soak, wave_failed
from opsctl.flow.stage import stage_wave
from opsctl.flow.steps import Progress, Steps, as_inventory, noop
from opsctl.flow.bench import drain_deadline_s
from opsctl.flow.switch import arm_guard, back_in_pool, switch_drained, disarm_guard, drain_before_switch, require_room, switch
from opsctl.findings import Finding
from opsctl.flow.validate import validate_release
from opsctl.host import facts
from opsctl.host.connection import Connection, connect
from opsctl.ledger import append_ledger, ledger_rollout
from opsctl.lock import HostLock

# --------------------------------------------------------------------------- deploy


@dataclass
class DeployOutcome:
    host: str
    release: str
    result: str  # promoted | unchanged | rolled-back | dry-run
    plan: dict
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"host": self.host, "release": self.release, "result": self.result, "plan": self.plan, **self.details}


@dataclass
class _HostRun:
    """One host of a deploy, from preflight to its outcome."""

    host: HostConfig
    profile: Profile
    steps: Steps
    conn: Connection | None = None
    plan: Plan | None = None
    wave: str | None = None
    outcome: DeployOutcome | None = None
    error: OpsctlError | None = None

    @property
    def name(self) -> str:
        return self.host.name


def deploy(inventory: str | Path | Inventory, profile_name: str, budget: int | None = None, *,
           budget_schedule: str | None = None, limit: str | None = None, dry_run: bool = False, gates: bool = True, pre_checks: bool = True,
           progress: Progress | None = None, confirm: Callable[[Plan], bool] | None = None,
           verify_weights: bool = False, capture_from_traffic: dict | None = None) -> list[DeployOutcome]:
    """Deploy PROFILE to the selected hosts in the inventory's rollout waves (`opsctl.rollout`;
    by default one host after another), stopping at the first failed wave.

    `capture_from_traffic` ({"since": "24h", "max_padding": 0.03}): each host's profile captures
    the batch sizes its own traffic uses (opsctl.flow.traffic), read before anything changes; the
    plan is in each outcome's `capture_plan`."""
    inv = as_inventory(inventory)
    hosts = inv.select(limit)
    profiles = {h.name: h.profile(profile_name, budget, budget_schedule) for h in hosts}  # all bad input before any host I/O
    capture_plans: dict[str, dict] = {}
    if capture_from_traffic is not None:
        from opsctl.flow.traffic import capture_from_host

        for h in hosts:   # reads only: every host's journal before any host changes
            profiles[h.name], cplan = capture_from_host(h, profiles[h.name], **capture_from_traffic)
            capture_plans[h.name] = cplan.as_dict()
    if gates and not dry_run:
        from opsctl.gate.workloads import WorkloadSet

        for h in hosts:  # a malformed workload file is bad input: found before anything is deployed
            WorkloadSet.load(h.gate_policy().workloads)
    policy = rollout_policy(hosts)
    waves = plan_waves(hosts, policy, list(inv.hosts))
    with BRAKE.engaged(on_note=lambda m: (progress or noop)({"event": "note", "host": "opsctl", "message": m})):
        outcomes = _deploy_hosts(inv, hosts, profiles, waves, policy, dry_run=dry_run, gates=gates,
                                 pre_checks=pre_checks, progress=progress, confirm=confirm, verify_weights=verify_weights)
    for o in outcomes:
        if o.host in capture_plans:
            o.details["capture_plan"] = capture_plans[o.host]
    return outcomes


def deploy_one(inv: Inventory, host: HostConfig, profile: Profile, *, dry_run: bool, gates: bool, pre_checks: bool,
                progress: Progress | None, confirm: Callable[[Plan], bool] | None,
                verify_weights: bool = False, trial: Callable | None = None) -> DeployOutcome:
    """One host, one wave (what `opsctl tune` runs for each trial)."""
    return _deploy_hosts(inv, [host], {host.name: profile}, [Wave(0, "wave 1", (host.name,))], RolloutPolicy(),
                         dry_run=dry_run, gates=gates, pre_checks=pre_checks, progress=progress, confirm=confirm,
                         verify_weights=verify_weights, trial=trial)[0]


def _deploy_hosts(inv: Inventory, hosts: list[HostConfig], profiles: dict[str, Profile], waves: list[Wave],
                  policy: RolloutPolicy, *, dry_run: bool, gates: bool, pre_checks: bool,
                  progress: Progress | None, confirm: Callable[[Plan], bool] | None,
                  verify_weights: bool = False, trial: Callable | None = None) -> list[DeployOutcome]:
    runs = {h.name: _HostRun(h, profiles[h.name], Steps(progress, h.name)) for h in hosts}
    fleet = len(hosts) > 1
    rollout_id = new_rollout_id() if fleet else None
    for w in waves:
        for n in w.hosts:
            runs[n].wave = w.name
    try:
        with ledger_rollout(rollout_id):
            current = next(iter(runs.values()))
            try:
                # every host is read and planned before any host changes: an unreachable host,
                # a missing baseline or a full disk stops the rollout with nothing changed
                for current in runs.values():
                    current.conn = connect(current.host)
                    t0 = current.steps.start("plan", f"{current.profile.label} on {current.name}")
                    current.plan = make_plan(current.conn, current.host, current.profile,
                                             verify_weights=verify_weights)
                    if gates and current.profile.speculative and not dry_run:
                        require_baseline(current.conn, current.host)
                    current.steps.done("plan", t0, f"release {current.plan.release}", plan=current.plan.as_dict())
                if dry_run:
                    return [DeployOutcome(r.name, r.plan.release, "dry-run", r.plan.as_dict(),
                                          {"wave": r.wave} if fleet else {}) for r in runs.values()]
                if fleet:
                    (progress or noop)({"event": "rollout", "host": "opsctl", "rollout": rollout_id,
                                        "waves": [w.as_dict() for w in waves],
                                        "policy": policy.model_dump(mode="json")})
                if pre_checks:
                    for current in runs.values():
                        t0 = current.steps.start("pre-checks", "host checks before touching the host")
                        run_pre_checks(inv, current.host, current.steps, t0)
                if confirm is not None:
                    for current in runs.values():
                        if not confirm(current.plan):
                            raise ConfigError("deploy not confirmed", "re-run with --yes to skip the question")
            except Interrupted as exc:
                raise _before_any_change(exc, current, list(runs)) from None
            return _roll_out(inv, runs, waves, policy, rollout_id, gates=gates,
                             checks=pre_checks and trial is None, verify_weights=verify_weights,
                             progress=progress, trial=trial)
    finally:
        for run in runs.values():
            if run.conn is not None:
                run.conn.close()


def _roll_out(inv: Inventory, runs: dict[str, _HostRun], waves: list[Wave], policy: RolloutPolicy,
              rollout_id: str | None, *, gates: bool, checks: bool, verify_weights: bool,
              progress: Progress | None, trial: Callable | None) -> list[DeployOutcome]:
    fleet = len(runs) > 1
    note = (lambda m: (progress or noop)({"event": "note", "host": "opsctl", "message": m}))
    took: list[_HostRun] = []     # promoted in this rollout: what rollback_all puts back
    failed: list[_HostRun] = []
    for i, wave in enumerate(waves):
        if i > 0 and policy.soak_s and took:
            try:
                sleep_soak(policy.soak_s, note)
            except Interrupted as exc:
                raise _interrupted_rollout(exc, runs, took, policy, rollout_id, note) from None
            sick = _soak_check(took)
            if sick:
                for run, why in sick:
                    took.remove(run)
                    failed.append(run)
                    with BRAKE.shielded(f"rolling {run.name} back"):
                        back = _put_back(run, f"rollout {rollout_id}: unhealthy after the soak: {why}", note)
                    run.error = DeployFailed(f"{run.name}: unhealthy after the {policy.soak_s}s soak: {why} "
                                             f"(rolled back: {back})", "see 'opsctl status' and the service's journal")
                _stop(runs, waves, f"the soak after {waves[i - 1].name}", [n for w in waves[i:] for n in w.hosts],
                      took, failed, policy, rollout_id, note)
        wave_runs = [runs[n] for n in wave.hosts]
        if fleet:
            note(f"{wave.name}: {', '.join(wave.hosts)}")
        try:
            wave_failures = _run_wave(inv, wave_runs, policy, rollout_id, gates=gates, checks=checks,
                                      verify_weights=verify_weights, trial=trial)
        except Interrupted as exc:
            if not fleet:
                raise
            took += _promoted(wave_runs)
            raise _interrupted_rollout(exc, runs, took, policy, rollout_id, note) from None
        took += _promoted(wave_runs)
        failed += wave_failures
        if not fleet and wave_failures:
            raise wave_failures[0].error  # one host: its own error, as it was raised
        if wave_failures and wave_failed(len(wave_failures), len(wave_runs), policy):
            _stop(runs, waves, wave.name, [n for w in waves[i + 1:] for n in w.hosts], took, failed, policy,
                  rollout_id, note)
    if failed:  # within max_fail_percentage: the rollout went on, and says who failed
        lines = "; ".join(r.error.problem for r in failed if r.error)
        raise DeployFailed(f"rollout {rollout_id} reached every wave, but {len(failed)} host(s) failed and were rolled "
                           f"back (within max_fail_percentage {policy.max_fail_percentage:g} %): {lines}",
                           "see 'opsctl status' and 'opsctl history'",
                           details=_rollout_details(runs, waves, policy, rollout_id, "completed-with-failures"))
    outcomes = [r.outcome for w in waves for r in (runs[n] for n in w.hosts) if r.outcome is not None]
    for o in outcomes:
        if fleet:
            o.details.update({"rollout": rollout_id, "wave": runs[o.host].wave})
    return outcomes


def _promoted(runs: list[_HostRun]) -> list[_HostRun]:
    return [r for r in runs if r.outcome is not None and r.outcome.result == "promoted"]


def _run_wave(inv: Inventory, runs: list[_HostRun], policy: RolloutPolicy, rollout_id: str | None, *,
              gates: bool, checks: bool, verify_weights: bool, trial: Callable | None) -> list[_HostRun]:
    """Lock, re-plan, stage together, then switch and judge host by host. Returns the failed hosts."""
    fleet_wave = len(runs) > 1
    failures: list[_HostRun] = []
    with contextlib.ExitStack() as locks:
        staging: list[_HostRun] = []
        for run in runs:
            try:
                locks.enter_context(HostLock(run.conn, run.host, f"deploy {run.profile.label}"
                                             + (f" (rollout {rollout_id})" if rollout_id else "")))
                # the state may have moved while we planned; plan again under the lock
                run.plan = make_plan(run.conn, run.host, run.profile, verify_weights=verify_weights)
            except Interrupted as exc:
                if not staging:  # no host of this wave was touched yet
                    raise _before_any_change(exc, run, [r.name for r in runs]) from None
                raise
            except OpsctlError as exc:
                if not rollout_id:
                    raise
                run.error = exc
                failures.append(run)
                continue
            staging.append(run)
        if not staging:
            return failures
        try:
            staged = stage_wave(inv, [(r.conn, r.plan, r.steps) for r in staging])
        except Interrupted as exc:
            records = [_interrupted_before_switch(r.conn, r.host, r.plan, r.steps, exc) for r in staging]
            if not fleet_wave:
                raise records[0] from None
            raise Interrupted(f"{exc.problem} while staging {', '.join(r.name for r in staging)}, before any switch: "
                              "nothing live changed on them", "run the same deploy again to finish it",
                              signal_name=exc.signal_name,
                              details={"step": "prepare", "switched": False}) from None
        for run in staging:
            play, sync, error = staged[run.name]
            if error is not None:
                run.error = error
                failures.append(run)
        for run in staging:
            if run.error is not None:
                continue
            if failures and wave_failed(len(failures), len(runs), policy):
                break  # past the wave's failure limit: no further host of it is switched
            down = _out_of_pool(failures)
            if down and len(down) + 1 > policy.max_unavailable:
                # hosts switch one at a time; one left out of the pool by a failed start (and a
                # failed rollback) counts against max_unavailable: the next would make one too many
                run.error = DeployFailed(f"{run.name}: not switched: {', '.join(down)} still out of the pool, and "
                                         f"opsctl.rollout.max_unavailable is {policy.max_unavailable}",
                                         "bring the failed host back ('opsctl rollback --limit HOST'), then deploy "
                                         "again")
                failures.append(run)
                continue
            play, sync, _ = staged[run.name]
            try:
                run.outcome = _apply(run.conn, inv, run.host, run.profile, run.plan, run.steps, gates,
                                     checks=checks, trial=trial, staged=(play, sync))
            except Interrupted as exc:
                if exc.details.get("switched"):
                    raise
                raise _interrupted_before_switch(run.conn, run.host, run.plan, run.steps, exc) from None
            except OpsctlError as exc:
                run.error = exc
                failures.append(run)
    return failures


def _out_of_pool(failed: list[_HostRun]) -> list[str]:
    """Failed hosts of this wave that do not serve (their rollback did not bring a release back)."""
    down = []
    for run in failed:
        if run.conn is None or run.plan is None or run.error is None or "not switched" in run.error.problem:
            continue
        try:
            code = facts.get(run.conn, facts.HealthCode(str(run.host.host_python), run.host.http_port), timeout=30)
        except OpsctlError:
            code = 0
        if code != 200:
            down.append(run.name)
    return down


def _before_any_change(exc: Interrupted, run: _HostRun, hosts: list[str]) -> Interrupted:
    """Interrupted before HOSTS (the step's host, or every host of a wave) changed."""
    where = run.name if hosts == [run.name] else ", ".join(hosts)
    serving = "it still serves what it served" if hosts == [run.name] else "they still serve what they served"
    return Interrupted(f"{exc.problem} during {run.steps.current}, before anything on {where} changed: {serving}",
                       "nothing to undo", signal_name=exc.signal_name,
                       details={"step": run.steps.current, "switched": False})


def _soak_check(took: list[_HostRun]) -> list[tuple[_HostRun, str]]:
    """Hosts that took the release and are no longer active and healthy."""
    sick = []
    for run in took:
        conn = connect(run.host)  # a fresh channel: the wave's may have idled through the soak
        try:
            state, code = facts.gather(conn, facts.ServiceState(run.host.unit_name),
                                       facts.HealthCode(str(run.host.host_python), run.host.http_port), timeout=30)
        except OpsctlError as exc:
            sick.append((run, exc.problem))
            continue
        finally:
            conn.close()
        active = state.get("ActiveState")
        if active != "active" or code != 200:
            sick.append((run, f"service {active or 'unknown'}, /health answered {code or 'nothing'}"))
    return sick


def _put_back(run: _HostRun, reason: str, note: Callable[[str], None]) -> str:
    """Roll one host that took the release back to what it went back to on failure."""
    target = fallback_release(run.plan.state, run.host, exclude=run.plan.release) if run.plan else None
    if not target:
        note(f"{run.name}: nothing served before this rollout: it keeps {run.plan.release if run.plan else '?'}")
        return f"{run.name} keeps {run.plan.release if run.plan else '?'} (nothing to go back to)"
    try:
        rollback_host(run.host, target, reason, None)
    except OpsctlError as exc:
        note(f"{run.name}: rollback to {target} failed: {exc.problem}")
        return f"{run.name}: rollback to {target} FAILED: {exc.problem}"
    if run.outcome is not None:
        run.outcome.result = "rolled-back"
        run.outcome.details["rolled_back_to"] = target
    return f"{run.name} -> {target}"


def _undo_took(took: list[_HostRun], policy: RolloutPolicy, rollout_id: str | None, why: str,
               note: Callable[[str], None]) -> str:
    if not took:
        return "no other host had taken the release"
    if policy.on_failure == "hold":
        return (f"on_failure: hold: {', '.join(r.name for r in took)} keep{'s' if len(took) == 1 else ''} "
                f"the new release")
    done = []
    with BRAKE.shielded("rolling back every host that took the release"):
        for run in reversed(took):
            note(f"{run.name}: rolling back (on_failure: rollback_all)")
            done.append(_put_back(run, f"rollout {rollout_id}: {why}", note))
    return "rolled back (on_failure: rollback_all): " + ", ".join(done)


def _stop(runs: dict[str, _HostRun], waves: list[Wave], where: str, later: list[str], took: list[_HostRun],
          failed: list[_HostRun], policy: RolloutPolicy, rollout_id: str | None, note: Callable[[str], None]) -> None:
    first = failed[0]
    why = f"{first.name} failed in {first.wave}"
    back = _undo_took(took, policy, rollout_id, why, note)
    failures = "; ".join(r.error.problem for r in failed if r.error)
    raise DeployFailed(f"rollout {rollout_id} stopped in {where}: {failures}; {back}"
                       + (f"; not reached: {', '.join(later)}" if later else ""),
                       "see 'opsctl status' and 'opsctl history'; fix the cause and deploy again",
                       details=_rollout_details(runs, waves, policy, rollout_id, "stopped"))


def _interrupted_rollout(exc: Interrupted, runs: dict[str, _HostRun], took: list[_HostRun], policy: RolloutPolicy,
                         rollout_id: str | None, note: Callable[[str], None]) -> Interrupted:
    back = _undo_took(took, policy, rollout_id, f"interrupted ({exc.signal_name})", note)
    return Interrupted(f"rollout {rollout_id}: {exc.problem}; {back}",
                       "'opsctl status' shows what each host serves; deploy again when ready",
                       signal_name=exc.signal_name,
                       details={**exc.details, "rollout": rollout_id,
                                "hosts": {n: _host_summary(r) for n, r in runs.items()}})


def _host_summary(run: _HostRun) -> dict:
    out: dict = {"wave": run.wave, "release": run.plan.release if run.plan else None,
                 "result": run.outcome.result if run.outcome else ("failed" if run.error else "not-reached")}
    if run.error is not None:
        out["error"] = run.error.problem
    if run.outcome is not None and run.outcome.details.get("rolled_back_to"):
        out["rolled_back_to"] = run.outcome.details["rolled_back_to"]
    return out


def _rollout_details(runs: dict[str, _HostRun], waves: list[Wave], policy: RolloutPolicy, rollout_id: str | None,
                     result: str) -> dict:
    return {"rollout": rollout_id, "result": result, "policy": policy.model_dump(mode="json"),
            "waves": [w.as_dict() for w in waves], "hosts": {n: _host_summary(r) for n, r in runs.items()}}


def _interrupted_before_switch(conn: Connection, host: HostConfig, plan: Plan, steps: Steps,
                               exc: Interrupted) -> Interrupted:
    """Nothing live changed: say so, and what the interrupted staging left on the host."""
    step = steps.current
    with BRAKE.shielded("recording the interrupt"):
        root = host.install_root
        res = conn.run(f"cd {shlex.quote(str(root))} 2>/dev/null && {{ test -f "
                       f"{shlex.quote(f'releases/{plan.release}/manifest.json')} && echo RELEASE; "
                       f"ls -d releases/.staging-* shared/drafters/.incoming-* 2>/dev/null; true; }}",
                       check=False, timeout=30)
        lines = res.stdout.split()
        left = []
        if "RELEASE" in lines:
            left.append(f"release {plan.release} (complete, not live)")
        left += [f"{p} (partial: the next deploy resumes or replaces it)" for p in lines if p != "RELEASE"]
        append_ledger(conn, host, {"action": "deploy", "result": "interrupted", "step": step, "switched": False,
                                   "signal": exc.signal_name, "to_release": plan.release,
                                   "from_release": plan.previous, "profile": plan.profile.name,
                                   "budget": plan.profile.budget, "left_staged": left})
    serving = plan.previous or "nothing"
    return Interrupted(f"{exc.problem} during {step}, before the switch: {host.name} still serves {serving} "
                       f"(nothing live changed); left staged: {', '.join(left) or 'nothing'}",
                       "run the same deploy again to finish it, or leave it: 'opsctl status' shows what is live",
                       signal_name=exc.signal_name, details={"step": step, "switched": False, "left_staged": left})


def start_findings(start: dict | None) -> list[Finding]:
    """The start's own finding (startup.slower against the last start of the profile), for the
    validation's record; none when there was no earlier start to compare with."""
    f = ((start or {}).get("slower") or {}).get("finding")
    return [Finding.model_validate(f)] if f else []


def _record_failed_before_switch(conn: Connection, host: HostConfig, plan: Plan, exc: OpsctlError) -> None:
    """A deploy that recorded `started` and failed before its switch (the guard, the switch
    itself): say so in the ledger, best effort (the error is the news). The guard stays armed:
    should a failed switch have flipped `current` after all, it reverts it; else it records that
    it had nothing to do."""
    try:
        append_ledger(conn, host, {"action": "deploy", "result": "failed", "switched": False,
                                   "to_release": plan.release, "from_release": plan.previous,
                                   "profile": plan.profile.name, "budget": plan.profile.budget,
                                   "error": exc.problem})
    except OpsctlError:
        pass


def _apply(conn: Connection, inv: Inventory, host: HostConfig, profile: Profile, plan: Plan, steps: Steps,
           gates: bool, *, staged: tuple, checks: bool = True, trial: Callable | None = None) -> DeployOutcome:
    play, sync = staged
    details = {"ansible_changed": play.changed, "drafter_bytes_sent": sync.bytes_sent if sync else 0}
    if plan.triton_outcome is not None:  # ddtree: the stage's Triton cache step (issue #36)
        details["triton"] = plan.triton_outcome
    repairs = plan.repairs
    if repairs:
        details["repaired"] = repairs
    # live and judged; or live from a --no-gate deploy, deployed again with --no-gate: nothing to do
    if plan.is_live and trial is None and not repairs and (
            plan.state.judged(plan.release) or (not gates and plan.state.served_ungated(plan.release))):
        append_ledger(conn, host, {"action": "deploy", "result": "unchanged", "from_release": plan.release,
                                   "to_release": plan.release, "profile": profile.name, "budget": profile.budget,
                                   "reason": "already live", "ansible_changed": play.changed,
                                   "drafter_bytes_sent": details["drafter_bytes_sent"],
                                   **({"triton": details["triton"]} if "triton" in details else {})})
        return DeployOutcome(host.name, plan.release, "unchanged", plan.as_dict(), details)
    if plan.is_live and repairs:
        steps.note(f"release {plan.release} is live and this deploy repaired {len(repairs)} file(s) it had loaded "
                   f"({', '.join(repairs[:3])}{', ...' if len(repairs) > 3 else ''}): restarting it and running "
                   f"every gate again")
    elif plan.is_live:
        steps.note(f"release {plan.release} is live but was never judged ({plan.state.never_judged_why(plan.release)}): "
                   + ("restarting it and running every gate again" if gates else "restarting it"))
    previous = plan.previous
    # what a failure, an interrupt or the guard puts back: the last judged-good release (or the
    # baseline), then earlier good ones when it does not become ready; never a release nobody
    # judged, whatever happens to be live
    fallbacks = fallback_releases(plan.state, host, exclude=plan.release)
    fallback = fallbacks[0] if fallbacks else None
    # room for the switch and the records after it, checked before the first of them (issue #32 item 7)
    require_room(conn, host, LEDGER_ROOM, doing="the switch of this deploy")
    switched = started = False
    # the drain (issue #35): out of the pool, in-flight requests finish (or the deadline); a
    # failing out hook or an interrupt here changes nothing live
    gap = drain_before_switch(conn, host, why="trial" if trial is not None else "deploy", from_release=previous,
                              to_release=plan.release, deadline_s=drain_deadline_s(conn, host), steps=steps,
                              readiness_timeout_s=profile.readiness_timeout_s)
    try:
        with BRAKE.held():  # these three run whole: a signal here is acted on right after the switch
            append_ledger(conn, host, {"action": "deploy", "result": "started", "from_release": previous,
                                       "to_release": plan.release, "fallback": fallback, "profile": profile.name,
                                       "budget": profile.budget, **({"repairs": repairs} if repairs else {})})
            started = True
            if fallbacks:
                arm_guard(conn, host, fallbacks, host.settings.guard_s or profile.readiness_timeout_s + 1800,
                          expect=plan.release, drain_s=gap.deadline_s if gap.enabled else None)
            t0 = steps.start("switch", f"{previous or 'none'} -> {plan.release}")
            since = switch_drained(conn, host, plan.release, gap, switch)
            switched = True
            steps.done("switch", t0, f"current -> {plan.release}")
        try:
            ready = wait_ready(conn, host, profile, since, steps)
        except DeployFailed as exc:
            back_in_pool(conn, host, gap, since, steps, ready=False)
            raise with_start_diagnosis(conn, host, profile, since, steps, exc) from None
        details["ready_s"] = round(ready.seconds, 2)
        details["gap"] = back_in_pool(conn, host, gap, since, steps)
        details["startup"] = details["gap"].get("startup") or None
        if gates:
            outcome = validate_release(conn, host, profile, since, steps, start=start_findings(details["startup"]))
            details["validation"] = outcome.record
            if not outcome.ok:
                raise DeployFailed(f"{host.name}: validation failed: {outcome.reason}", "see the findings above",
                                   details={"findings": outcome.record.get("findings")})
        if trial is not None:
            # a trial (opsctl tune): measured, never promoted; the guard stays armed until the
            # caller restores what served before
            details["trial"] = trial(conn, host, plan, steps)
            with BRAKE.held():
                append_ledger(conn, host, {"action": "deploy", "result": "trial", "from_release": previous,
                                           "to_release": plan.release, "profile": profile.name,
                                           "budget": profile.budget, "trial": True,
                                           "summary": details["trial"].get("summary"),
                                           **gap_fields(details.get("gap"))})
            return DeployOutcome(host.name, plan.release, "trial", plan.as_dict(), details)
        if gates:
            outcome = bench_and_judge(conn, host, profile, plan.release, steps)
            details["verdict"] = outcome.record
            if not outcome.ok:
                raise DeployFailed(f"{host.name}: gate failed: {outcome.reason}", "see the verdict table above",
                                   details={"verdict": outcome.record})
        if checks:

            outcome = run_post_checks(inv, host, steps)
            details["post_checks"] = outcome.record
            if not outcome.ok:
                raise DeployFailed(f"{host.name}: post-deploy check failed: {outcome.reason}",
                                   "see 'opsctl check post' for every check")
    except Interrupted as exc:
        if not switched:
            raise
        step = steps.current
        with BRAKE.shielded(f"rolling back to {fallback or 'nothing (stopping the service)'}"):
            append_ledger(conn, host, {"action": "deploy", "result": "interrupted", "step": step, "switched": True,
                                       "signal": exc.signal_name, "from_release": previous,
                                       "to_release": plan.release, "profile": profile.name, "budget": profile.budget})
            back = roll_back_after_failure(conn, host, plan, fallbacks, f"interrupted ({exc.signal_name}) during {step}",
                                            None, steps)
        raise Interrupted(f"{exc.problem} during {step}, after the switch: {back}",
                          "'opsctl status' shows what serves; deploy again when ready",
                          signal_name=exc.signal_name, details={"step": step, "switched": True, **details}) from None
    except OpsctlError as exc:
        if not switched:
            if started:  # the started record needs its end (the watch steps aside until it sees one)
                _record_failed_before_switch(conn, host, plan, exc)
            raise
        reason = exc.problem
        crash = crash_cause(conn, host, since) if "start failed" not in reason else None
        if crash and crash not in reason:
            reason = f"{reason}; the server logged: {crash}"
        with BRAKE.shielded(f"rolling back to {fallback or 'nothing (stopping the service)'}"):
            back = roll_back_after_failure(conn, host, plan, fallbacks, reason, exc, steps)
        raise DeployFailed(f"{reason}; {back}", exc.fix, details={**exc.details, **details}) from None
    disarm_guard(conn, host)
    append_ledger(conn, host, {"action": "promote", "result": "ok", "from_release": previous,
                               "to_release": plan.release, "profile": profile.name, "budget": profile.budget,
                               "reason": "gates passed" if gates else NO_GATE_REASON,
                               **({} if gates else {"gated": False}),
                               **{k: v for k, v in details.items()
                                  if k in ("ready_s", "drafter_bytes_sent", "repaired", "triton")},
                               **gap_fields(details.get("gap"))})
    prune(conn, host)
    # a live release whose files this deploy repaired is reported as such, never "unchanged"
    return DeployOutcome(host.name, plan.release, "repaired" if repairs and plan.is_live else "promoted",
                         plan.as_dict(), details)

