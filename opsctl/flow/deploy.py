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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from opsctl.brake import BRAKE, Interrupted
from opsctl.config import HostConfig, Inventory, Profile
from opsctl.errors import ConfigError, DeployFailed, OpsctlError
from opsctl.flow.bench import require_baseline
from opsctl.flow.checks import run_post_checks, run_pre_checks
from opsctl.flow.judge import bench_and_judge
from opsctl.flow.plan import Plan, make_plan
from opsctl.flow.promote import fallback_release, prune, roll_back_after_failure
from opsctl.flow.ready import crash_cause, wait_ready, with_start_diagnosis
from opsctl.flow.stage import stage
from opsctl.flow.steps import Progress, Steps, as_inventory, noop
from opsctl.flow.switch import arm_guard, disarm_guard, switch
from opsctl.flow.validate import validate_release
from opsctl.host.connection import Connection, connect
from opsctl.releases import HostLock, append_ledger

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


def deploy(inventory: str | Path | Inventory, profile_name: str, budget: int | None = None, *,
           budget_schedule: str | None = None, limit: str | None = None, dry_run: bool = False, gates: bool = True, pre_checks: bool = True,
           progress: Progress | None = None, confirm: Callable[[Plan], bool] | None = None,
           verify_weights: bool = False) -> list[DeployOutcome]:
    """Deploy PROFILE to each selected host, host by host, stopping at the first failure."""
    inv = as_inventory(inventory)
    hosts = inv.select(limit)
    profiles = {h.name: h.profile(profile_name, budget, budget_schedule) for h in hosts}  # all bad input before any host I/O
    if gates and not dry_run:
        from opsctl.bench.workloads import WorkloadSet

        for h in hosts:  # a malformed workload file is bad input: found before anything is deployed
            WorkloadSet.load(h.gate_policy().workloads)
    outcomes = []
    with BRAKE.engaged(on_note=lambda m: (progress or noop)({"event": "note", "host": "opsctl", "message": m})):
        for host in hosts:
            outcomes.append(deploy_one(inv, host, profiles[host.name], dry_run=dry_run, gates=gates,
                                        pre_checks=pre_checks, progress=progress, confirm=confirm,
                                        verify_weights=verify_weights))
    return outcomes


def deploy_one(inv: Inventory, host: HostConfig, profile: Profile, *, dry_run: bool, gates: bool, pre_checks: bool,
                progress: Progress | None, confirm: Callable[[Plan], bool] | None,
                verify_weights: bool = False, trial: Callable | None = None) -> DeployOutcome:
    steps = Steps(progress, host.name)
    conn = connect(host)
    try:
        t0 = steps.start("plan", f"{profile.label} on {host.name}")
        plan = make_plan(conn, host, profile, verify_weights=verify_weights)
        if gates and profile.speculative and not dry_run:

            require_baseline(conn, host)
        steps.done("plan", t0, f"release {plan.release}", plan=plan.as_dict())
        if dry_run:
            return DeployOutcome(host.name, plan.release, "dry-run", plan.as_dict())
        if pre_checks:

            t0 = steps.start("pre-checks", "host checks before touching the host")
            run_pre_checks(inv, host, steps, t0)
        if confirm is not None and not confirm(plan):
            raise ConfigError("deploy not confirmed", "re-run with --yes to skip the question")
        with HostLock(conn, host, f"deploy {profile.label}"):
            # the state may have moved while we planned; plan again under the lock
            plan = make_plan(conn, host, profile, verify_weights=verify_weights)
            try:
                return _apply(conn, inv, host, profile, plan, steps, gates, checks=pre_checks and trial is None,
                              trial=trial)
            except Interrupted as exc:
                if exc.details.get("switched"):
                    raise
                raise _interrupted_before_switch(conn, host, plan, steps, exc) from None
    except Interrupted as exc:
        if "step" not in exc.details:  # before the lock: nothing on the host was touched
            raise Interrupted(f"{exc.problem} during {steps.current}, before anything on {host.name} changed: "
                              f"it still serves what it served", "nothing to undo",
                              signal_name=exc.signal_name, details={"step": steps.current, "switched": False}) from None
        raise
    finally:
        conn.close()


def _interrupted_before_switch(conn: Connection, host: HostConfig, plan: Plan, steps: Steps,
                               exc: Interrupted) -> Interrupted:
    """Nothing live changed: say so, and what the interrupted staging left on the host."""
    step = steps.current
    with BRAKE.shielded("recording the interrupt"):
        root = host.install_root
        res = conn.run(f"cd {root} 2>/dev/null && {{ test -f releases/{plan.release}/manifest.json && echo RELEASE; "
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


def _apply(conn: Connection, inv: Inventory, host: HostConfig, profile: Profile, plan: Plan, steps: Steps,
           gates: bool, *, checks: bool = True, trial: Callable | None = None) -> DeployOutcome:
    play, sync = stage(conn, inv, plan, steps)
    details = {"ansible_changed": play.changed, "drafter_bytes_sent": sync.bytes_sent if sync else 0}
    if plan.is_live and plan.state.judged(plan.release) and trial is None:
        append_ledger(conn, host, {"action": "deploy", "result": "unchanged", "from_release": plan.release,
                                   "to_release": plan.release, "profile": profile.name, "budget": profile.budget,
                                   "reason": "already live", "ansible_changed": play.changed,
                                   "drafter_bytes_sent": details["drafter_bytes_sent"]})
        return DeployOutcome(host.name, plan.release, "unchanged", plan.as_dict(), details)
    if plan.is_live:
        steps.note(f"release {plan.release} is live but was never judged (its deploy was interrupted or killed): "
                   f"restarting it and running every gate again")
    previous = plan.previous
    # what a failure, an interrupt or the guard puts back: the last judged-good release (or the
    # baseline), never a release nobody judged, whatever happens to be live
    fallback = fallback_release(plan.state, host, exclude=plan.release)
    switched = False
    try:
        with BRAKE.held():  # these three run whole: a signal here is acted on right after the switch
            append_ledger(conn, host, {"action": "deploy", "result": "started", "from_release": previous,
                                       "to_release": plan.release, "fallback": fallback, "profile": profile.name,
                                       "budget": profile.budget})
            if fallback:
                arm_guard(conn, host, fallback, host.settings.guard_s or profile.readiness_timeout_s + 1800,
                          expect=plan.release)
            t0 = steps.start("switch", f"{previous or 'none'} -> {plan.release}")
            since = switch(conn, host, plan.release)
            switched = True
            steps.done("switch", t0, f"current -> {plan.release}")
        try:
            ready = wait_ready(conn, host, profile, since, steps)
        except DeployFailed as exc:
            raise with_start_diagnosis(conn, host, profile, since, steps, exc) from None
        details["ready_s"] = round(ready.seconds, 2)
        if gates:
            outcome = validate_release(conn, host, profile, since, steps)
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
                                           "summary": details["trial"].get("summary")})
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
            back = roll_back_after_failure(conn, host, plan, fallback, f"interrupted ({exc.signal_name}) during {step}",
                                            None, steps)
        raise Interrupted(f"{exc.problem} during {step}, after the switch: {back}",
                          "'opsctl status' shows what serves; deploy again when ready",
                          signal_name=exc.signal_name, details={"step": step, "switched": True, **details}) from None
    except OpsctlError as exc:
        if not switched:
            raise
        reason = exc.problem
        crash = crash_cause(conn, host, since) if "start failed" not in reason else None
        if crash and crash not in reason:
            reason = f"{reason}; the server logged: {crash}"
        with BRAKE.shielded(f"rolling back to {fallback or 'nothing (stopping the service)'}"):
            back = roll_back_after_failure(conn, host, plan, fallback, reason, exc, steps)
        raise DeployFailed(f"{reason}; {back}", exc.fix, details={**exc.details, **details}) from None
    disarm_guard(conn, host)
    append_ledger(conn, host, {"action": "promote", "result": "ok", "from_release": previous,
                               "to_release": plan.release, "profile": profile.name, "budget": profile.budget,
                               "reason": "gates passed" if gates else "gates skipped (--no-gate)",
                               **{k: v for k, v in details.items() if k in ("ready_s", "drafter_bytes_sent")}})
    prune(conn, host)
    return DeployOutcome(host.name, plan.release, "promoted", plan.as_dict(), details)

