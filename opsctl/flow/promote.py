"""promote | rollback: what a failed, interrupted or unconfirmed deploy goes back to (the
last judged-good release, else the baseline), `opsctl rollback`, and pruning old releases."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from opsctl.brake import BRAKE
from opsctl.config import HostConfig, Inventory
from opsctl.errors import ConfigError, DeployFailed, OpsctlError
from opsctl.flow.plan import Plan
from opsctl.flow.ready import wait_ready
from opsctl.flow.steps import Progress, Steps, as_inventory, noop
from opsctl.flow.switch import disarm_guard, stop_service, switch
from opsctl.host.connection import Connection, connect
from opsctl.releases import HostLock, HostState, append_ledger, read_state, release_profile


def fallback_release(state: HostState, host: HostConfig, exclude: str | None) -> str | None:
    """Where a failed, interrupted or unconfirmed deploy goes back to: the newest release
    the host's ledger shows promoted (or put back by a rollback), else the baseline
    release; never one nobody judged. None: nothing to go back to (the service stops)."""
    good = state.last_good(exclude=exclude)
    if good:
        return good
    base = state.baseline(host.baseline_profile)
    return base if base and base != exclude else None


def roll_back_after_failure(conn: Connection, host: HostConfig, plan: Plan, target: str | None, reason: str,
                             exc: OpsctlError | None, steps: Steps) -> str:
    """Put `target` back after `plan.release` failed (or was interrupted) past its switch.
    The guard armed for `plan.release` stays armed until the switch back has happened: a
    controller killed before that leaves the guard to revert it, so a release that failed
    its gate never serves unguarded (the guard waits for the deploy lock, and does nothing
    once `plan.release` is no longer live)."""
    t0 = steps.start("rollback", f"back to {target or 'nothing (no judged release or baseline on the host)'}")
    record: dict[str, Any] = {"action": "rollback", "from_release": plan.release, "to_release": target,
                              "profile": plan.profile.name, "budget": plan.profile.budget, "reason": reason,
                              "automatic": True}
    if exc is not None and exc.details:
        record["details"] = exc.details
    if not target or target == plan.release:
        stop_service(conn, host)
        disarm_guard(conn, host)
        append_ledger(conn, host, {**record, "result": "ok", "to_release": None})
        steps.done("rollback", t0, "service stopped: no judged-good release or baseline to go back to")
        return "the service was stopped (no judged-good release or baseline on the host to go back to)"
    since = switch(conn, host, target)
    disarm_guard(conn, host)  # only now: plan.release no longer serves
    info = plan.state.releases.get(target)
    try:
        wait_ready(conn, host, release_profile(info, host), since, steps)
    except DeployFailed as again:
        append_ledger(conn, host, {**record, "result": "failed", "error": again.problem})
        steps.done("rollback", t0, f"rolled back to {target} but it did not become ready", status="fail")
        return f"rolled back to {target}, which did NOT become ready: {again.problem}"
    append_ledger(conn, host, {**record, "result": "ok",
                               "to_profile": info.label if info else None})
    steps.done("rollback", t0, f"{target} serves again")
    return f"rolled back to {target}, which serves again"




def prune(conn: Connection, host: HostConfig) -> list[str]:
    """Keep the newest `keep_releases`; never current, the last good one or the baseline."""
    state = read_state(conn, host)
    keep = {state.current, state.last_good(exclude=state.current), state.baseline(host.baseline_profile)}
    ordered = sorted(state.releases.values(), key=lambda r: r.created_at, reverse=True)
    doomed = [r.id for r in ordered[host.settings.keep_releases:] if r.id not in keep]
    if doomed:
        conn.run(" && ".join(f"rm -rf {host.install_root}/releases/{shlex.quote(r)}" for r in doomed))
    return doomed


# --------------------------------------------------------------------------- rollback


def rollback(inventory: str | Path | Inventory, to: str | None = None, *, limit: str | None = None,
             reason: str = "manual rollback", progress: Progress | None = None, force: bool = False) -> list[dict]:
    inv = as_inventory(inventory)
    results = []
    with BRAKE.engaged(on_note=lambda m: (progress or noop)({"event": "note", "host": "opsctl", "message": m})):
        for host in inv.select(limit):
            results.extend(rollback_host(host, to, reason, progress, force=force))
    return results


def rollback_host(host: HostConfig, to: str | None, reason: str, progress: Progress | None, *,
                  force: bool = False) -> list[dict]:
    """Switch one host to TO (None: its last good release), wait until ready, record it. A
    release whose gate verdict failed is refused unless `force`; forced, it serves but is
    recorded as forced, so it never becomes last good."""
    results = []
    steps = Steps(progress, host.name)
    conn = connect(host)
    try:
        _rollback_target(host, read_state(conn, host), to, force)  # bad input fails before the lock is taken
        BRAKE.check()  # interrupted before anything changed: stop here
        with HostLock(conn, host, "rollback"), BRAKE.shielded("rolling back: it finishes first"):
            state = read_state(conn, host)
            target = _rollback_target(host, state, to, force)
            info = state.releases[target]
            failed = state.gate_failed(target)
            forced = {"forced": True, "verdict": failed.get("status")} if failed else {}
            t0 = steps.start("switch", f"{state.current or 'none'} -> {target}")
            since = switch(conn, host, target)
            disarm_guard(conn, host)  # after the switch: a rollback killed before it leaves any guard armed
            steps.done("switch", t0, f"current -> {target}")
            try:
                ready = wait_ready(conn, host, release_profile(info, host), since, steps)
            except DeployFailed as exc:
                append_ledger(conn, host, {"action": "rollback", "result": "failed", "from_release": state.current,
                                           "to_release": target, "reason": reason, "error": exc.problem, **forced})
                raise
            rec = append_ledger(conn, host, {"action": "rollback", "result": "ok", "from_release": state.current,
                                             "to_release": target, "profile": info.profile, "budget": info.budget,
                                             "reason": reason, "ready_s": round(ready.seconds, 2), **forced})
            results.append(rec)
    finally:
        conn.close()
    return results


def _rollback_target(host: HostConfig, state: HostState, to: str | None, force: bool = False) -> str:
    target = _named_target(host, state, to)
    failed = state.gate_failed(target)
    if failed and not force:
        why = failed.get("reason") or "; ".join(failed.get("reasons") or []) or "no reason recorded"
        raise ConfigError(f"release {target} on {host.name} failed its gate (verdict {failed.get('status')}, "
                          f"{failed.get('ts') or 'time unknown'}: {why})",
                          "roll back to a release that passed ('opsctl rollback' picks the last good one), or "
                          "add --force to serve it anyway (it will not become last good)")
    return target


def _named_target(host: HostConfig, state: HostState, to: str | None) -> str:
    if to in (None, "previous"):
        target = state.last_good(exclude=state.current)
        if target is None:
            raise ConfigError(f"nothing to roll back to on {host.name}: no earlier good release is on the host",
                              "deploy the baseline with 'opsctl deploy " + host.baseline_profile + "'")
        return target
    if to == "baseline":
        target = state.baseline(host.baseline_profile)
        if target is None:
            raise ConfigError(f"no {host.baseline_profile} (baseline) release on {host.name}",
                              f"deploy it with 'opsctl deploy {host.baseline_profile}'")
        if target == state.current:
            raise ConfigError(f"the baseline release {target} is already live on {host.name}", "nothing to do")
        return target
    if to not in state.releases:
        known = ", ".join(sorted(state.releases)) or "none"
        raise ConfigError(f"release {to!r} is not on {host.name}", f"pick one of: {known} (see 'opsctl history')")
    if to == state.current:
        raise ConfigError(f"release {to} is already live on {host.name}", "nothing to do")
    return to


