"""promote | rollback: what a failed, interrupted or unconfirmed deploy goes back to (the
last judged-good release, else the baseline), `opsctl rollback`, and pruning old releases."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from opsctl.brake import BRAKE
from opsctl.config import HostConfig, Inventory
from opsctl.errors import CheckFailed, ConfigError, DeployFailed, OpsctlError
from opsctl.flow.ready import wait_ready
from opsctl.flow.steps import Progress, Steps, as_inventory, noop
from opsctl.flow.bench import drain_deadline_s
from opsctl.flow.switch import back_in_pool, switch_drained, disarm_guard, drain_before_switch, require_room, stop_service, switch
from opsctl.host.connection import Connection, connect
from opsctl.integrity import Integrity, verify_release
from opsctl.releases import HostState, ledger_lost_problem, read_state, release_profile
from opsctl.ledger import append_ledger
from opsctl.lock import HostLock

if TYPE_CHECKING:  # only the deploy's failure path passes a Plan: a rollback does not import the planner
    from opsctl.flow.plan import Plan


GAP_FIELDS = ("drain_s", "stop_s", "start_s", "gap_s", "inflight_at_start", "aborted")


def gap_fields(rec: dict | None) -> dict:
    """A switch's gap figures (its `switch` record), copied onto the record that ends the operation."""
    return {k: rec.get(k) for k in GAP_FIELDS} if rec else {}


FALLBACK_TRIES = 3  # releases a rollback tries in turn before it gives up (each up to its readiness timeout)


def fallback_releases(state: HostState, host: HostConfig, exclude: str | Iterable[str] | None,
                      limit: int = FALLBACK_TRIES) -> list[str]:
    """What a failed, interrupted or unconfirmed deploy goes back to, in the order a rollback
    tries them when one does not become ready: the releases the host's ledger shows promoted
    (or put back by a rollback), newest first, then the baseline release; never one nobody
    judged. Empty: nothing to go back to (the service stops)."""
    skip = {exclude} if isinstance(exclude, str) else set(exclude or ())
    good = state.good_releases(exclude=skip)
    base = state.baseline(host.baseline_profile)
    if not base or base in skip or (good and good[0] == base):
        return good[:limit]   # the baseline is what served last: it goes first
    # else the baseline is the last resort, also when it served more recently than an older good one
    return [r for r in good if r != base][:limit - 1] + [base]


def fallback_release(state: HostState, host: HostConfig, exclude: str | None) -> str | None:
    """The first of fallback_releases: the last good release, else the baseline; None:
    nothing to go back to (the service stops)."""
    good = state.last_good(exclude=exclude)
    if good:
        return good
    base = state.baseline(host.baseline_profile)
    return base if base and base != exclude else None


def check_release_files(conn: Connection, host: HostConfig, release: str, *, quick: bool = False) -> Integrity:
    """The release's rendered files, runtime tree and drafter against its manifest, before a
    rollback switches to it (issue #32 item 9): full sha256, or with `quick` the drafter by
    sampled hashes (sizes where the host recorded none)."""
    return verify_release(conn, host, release, drafter="sampled" if quick else "full")


def roll_back_after_failure(conn: Connection, host: HostConfig, plan: Plan, target: str | list[str] | None,
                            reason: str, exc: OpsctlError | None, steps: Steps) -> str:
    """Put `target` back after `plan.release` failed (or was interrupted) past its switch; when
    it does not become ready (or its files differ from its manifest), the next fallback
    (`target` may be the list; else the rest of fallback_releases), and so on: `rollback ok`
    is recorded only for a release that became ready (issue #32 item 5).
    The guard armed for `plan.release` stays armed until the switch back has happened: a
    controller killed before that leaves the guard to revert it, so a release that failed
    its gate never serves unguarded (the guard waits for the deploy lock, and does nothing
    once `plan.release` is no longer live)."""
    first = target[0] if isinstance(target, list) and target else target if isinstance(target, str) else None
    t0 = steps.start("rollback", f"back to {first or 'nothing (no judged release or baseline on the host)'}")
    record: dict[str, Any] = {"action": "rollback", "from_release": plan.release, "to_release": first,
                              "profile": plan.profile.name, "budget": plan.profile.budget, "reason": reason,
                              "automatic": True}
    if exc is not None and exc.details:
        record["details"] = exc.details
    if not first or first == plan.release:
        stop_service(conn, host)
        disarm_guard(conn, host)
        append_ledger(conn, host, {**record, "result": "ok", "to_release": None})
        steps.done("rollback", t0, "service stopped: no judged-good release or baseline to go back to")
        return "the service was stopped (no judged-good release or baseline on the host to go back to)"
    queue = list(target) if isinstance(target, list) else [first]
    extended = isinstance(target, list)  # one release named: the rest of the fallbacks follow it
    tried: list[str] = []
    live, why = plan.release, ""
    disarmed = False
    while queue or not extended:
        if not queue:
            extended = True
            queue = fallback_releases(plan.state, host, exclude={plan.release, *tried})
            continue
        tgt = queue.pop(0)
        if tgt == plan.release or tgt in tried:
            continue
        rec = {**record, "from_release": live, "to_release": tgt, **({"tried": list(tried)} if tried else {})}
        bad = check_release_files(conn, host, tgt)
        if not bad.ok:
            why = f"its files differ from its manifest: {bad.summary()}"
            append_ledger(conn, host, {**rec, "result": "failed", "switched": False, "error": why,
                                       "integrity": bad.problems[:20]})
            steps.note(f"not switching to {tgt}: {why}")
            tried.append(tgt)
            continue
        gap = drain_before_switch(conn, host, why="rollback", from_release=live, to_release=tgt,
                                  deadline_s=drain_deadline_s(conn, host), steps=steps)
        since = switch_drained(conn, host, tgt, gap, switch, disarm=not disarmed)
        live = tgt
        if not disarmed:
            disarm_guard(conn, host)  # only now: plan.release no longer serves
            disarmed = True
        info = plan.state.releases.get(tgt)
        try:
            wait_ready(conn, host, release_profile(info, host), since, steps)
        except DeployFailed as again:
            back_in_pool(conn, host, gap, since, steps, ready=False)
            why = again.problem
            append_ledger(conn, host, {**rec, "result": "failed", "switched": True, "error": why})
            steps.note(f"rolled back to {tgt}, which did not become ready: {why}")
            tried.append(tgt)
            continue
        g = back_in_pool(conn, host, gap, since, steps)
        append_ledger(conn, host, {**rec, "result": "ok", "to_profile": info.label if info else None,
                                   **gap_fields(g)})
        steps.done("rollback", t0, f"{tgt} serves again")
        return f"rolled back to {tgt}, which serves again" + (
            f" (first tried, not ready or damaged: {', '.join(tried)})" if tried else "")
    steps.done("rollback", t0, f"no fallback became ready (tried {', '.join(tried)})", status="fail")
    if live == plan.release:
        return (f"rollback FAILED: no fallback could be switched to (tried {', '.join(tried)}: {why}); "
                f"{plan.release} is still live")
    if tried == [live]:
        return f"rolled back to {live}, which did NOT become ready: {why}"
    return (f"rollback FAILED: none of {', '.join(tried)} became ready; {live} is live and does NOT serve "
            f"(last: {why})")


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
             reason: str = "manual rollback", progress: Progress | None = None, force: bool = False,
             quick_verify: bool = False) -> list[dict]:
    inv = as_inventory(inventory)
    results = []
    with BRAKE.engaged(on_note=lambda m: (progress or noop)({"event": "note", "host": "opsctl", "message": m})):
        for host in inv.select(limit):
            results.extend(rollback_host(host, to, reason, progress, force=force, quick_verify=quick_verify))
    return results


def rollback_host(host: HostConfig, to: str | None, reason: str, progress: Progress | None, *,
                  force: bool = False, quick_verify: bool = False) -> list[dict]:
    """Switch one host to TO (None: its last good release), wait until ready, record it. A
    release whose gate verdict failed is refused unless `force`; forced, it serves but is
    recorded as forced, so it never becomes last good. Before anything changes: room on the
    disk for the switch and its records (issue #32 item 7), and TO's files checked against its
    manifest, full sha256 unless `quick_verify` (item 9): a damaged TO is refused (exit 6).
    A TO that does not become ready is recorded `failed` and the next fallback is tried (item 5):
    the command then fails (exit 5) naming what serves."""
    results: list[dict] = []
    steps = Steps(progress, host.name)
    conn = connect(host)
    try:
        _rollback_target(host, read_state(conn, host), to, force)  # bad input fails before the lock is taken
        require_room(conn, host, doing="the rollback")
        BRAKE.check()  # interrupted before anything changed: stop here
        with HostLock(conn, host, "rollback"), BRAKE.shielded("rolling back: it finishes first"):
            state = read_state(conn, host)
            target = _rollback_target(host, state, to, force)
            _rollback_chain(conn, host, state, target, reason, steps, results, quick_verify=quick_verify)
    finally:
        conn.close()
    return results


def _rollback_chain(conn: Connection, host: HostConfig, state: HostState, target: str, reason: str, steps: Steps,
                    results: list[dict], *, quick_verify: bool) -> None:
    """`target`, then (when it does not become ready) the other fallbacks, and last the release the
    rollback left when that one is good, until one is ready."""
    queue, extended = [target], False
    tried: list[str] = []
    errors: dict[str, str] = {}
    live = state.current
    restart = target == state.current   # live but never ready (a revert whose start failed): started again
    disarmed = False
    while queue or not extended:
        if not queue:
            extended = True
            queue = fallback_releases(state, host, exclude={state.current, *tried} - {None})
            # the release this rollback left, when it is a good one, is the last resort: better than nothing
            if state.current and state.current in fallback_releases(state, host, exclude=set(tried)):
                queue.append(state.current)
            if queue:
                steps.note(f"{target} did not become ready: trying {', '.join(queue)} in turn")
            continue
        tgt = queue.pop(0)
        if tgt in tried or (tgt == live and not restart):
            continue
        restart = False
        info = state.releases[tgt]
        failed = state.gate_failed(tgt) if tgt == target else None
        forced = {"forced": True, "verdict": failed.get("status")} if failed else \
            {"forced": True, "verdict": None, "never_judged": state.never_judged_why(tgt)} \
            if tgt == target and needs_force(host, state, tgt) else {}
        base = {"action": "rollback", "from_release": live, "to_release": tgt, "reason": reason,
                **({"tried": list(tried)} if tried else {}), **forced}
        t0 = steps.start("verify", f"files of {tgt} against its manifest ("
                         + ("quick: drafter by sampled hashes" if quick_verify else "full sha256") + ")")
        bad = check_release_files(conn, host, tgt, quick=quick_verify)
        if not bad.ok:
            steps.done("verify", t0, bad.summary(), status="fail")
            if tgt == target:  # the operator's choice: refused, nothing changed
                raise CheckFailed(f"release {tgt} on {host.name} differs from its manifest: {bad.summary()}; "
                                  f"nothing was switched",
                                  f"redeploy its profile ('opsctl deploy {info.profile}"
                                  + (f" --budget {info.budget}" if info.budget and not info.budget_schedule else "")
                                  + " --verify-weights' restages it and re-sends a damaged drafter), or roll back "
                                  "to another release with --to RELEASE", details={"integrity": bad.as_dict()})
            errors[tgt] = f"its files differ from its manifest: {bad.summary()}"
            append_ledger(conn, host, {**base, "result": "failed", "switched": False, "error": errors[tgt],
                                       "integrity": bad.problems[:20]})
            tried.append(tgt)
            continue
        steps.done("verify", t0, bad.checked())
        gap = drain_before_switch(conn, host, why="rollback", from_release=live, to_release=tgt,
                                  deadline_s=drain_deadline_s(conn, host), steps=steps)
        t0 = steps.start("switch", f"{live or 'none'} -> {tgt}")
        since = switch_drained(conn, host, tgt, gap, switch, disarm=not disarmed)
        live = tgt
        if not disarmed:
            disarm_guard(conn, host)  # after the switch: a rollback killed before it leaves any guard armed
            disarmed = True
        steps.done("switch", t0, f"current -> {tgt}")
        try:
            ready = wait_ready(conn, host, release_profile(info, host), since, steps)
        except DeployFailed as exc:
            back_in_pool(conn, host, gap, since, steps, ready=False)
            errors[tgt] = exc.problem
            append_ledger(conn, host, {**base, "result": "failed", "switched": True, "error": exc.problem})
            tried.append(tgt)
            continue
        g = back_in_pool(conn, host, gap, since, steps)
        rec = append_ledger(conn, host, {**base, "result": "ok", "profile": info.profile, "budget": info.budget,
                                         "ready_s": round(ready.seconds, 2), **gap_fields(g)})
        rec.setdefault("gap", g)
        rec.setdefault("startup", g.get("startup") or None)
        results.append(rec)
        if tried:
            raise DeployFailed(f"{host.name}: rollback to {target} failed ({errors.get(target, 'not ready')}); "
                               f"{tgt} serves instead (the next fallback)",
                               f"see 'opsctl history' and 'journalctl -u {host.unit_name}' on the host for why "
                               f"{target} did not start", details={"rollbacks": results, "failed": errors})
        return
    raise DeployFailed(f"{host.name}: rollback to {target} failed ({errors.get(target, 'not ready')})"
                       + (f"; the other fallbacks failed too ({', '.join(t for t in tried if t != target)})"
                          if len(tried) > 1 else "; no other good release or baseline to try")
                       + (f"; {live} is live and does NOT serve" if live in tried else f"; {live or 'nothing'} is live"),
                       f"see 'journalctl -u {host.unit_name}' on the host, then 'opsctl rollback --to RELEASE' "
                       f"or deploy again", details={"failed": errors})


def needs_force(host: HostConfig, state: HostState, release: str) -> bool:
    """A release no gate ever passed (a --no-gate deploy's, a tune's trial release, one whose
    deploy was killed): `rollback --to` it needs --force (issue #50). Not the baseline (the
    reference every gate compares with, and every fallback chain's last resort), and not while
    the ledger is lost (nothing is known to be good: the operator picks)."""
    if state.passed_gate(release) or state.ledger_lost:
        return False
    info = state.releases.get(release)
    return not (info is not None and info.profile == host.baseline_profile)


def _rollback_target(host: HostConfig, state: HostState, to: str | None, force: bool = False) -> str:
    target = _named_target(host, state, to)
    failed = state.gate_failed(target)
    if failed and not force:
        why = failed.get("reason") or "; ".join(failed.get("reasons") or []) or "no reason recorded"
        raise ConfigError(f"release {target} on {host.name} failed its gate (verdict {failed.get('status')}, "
                          f"{failed.get('ts') or 'time unknown'}: {why})",
                          "roll back to a release that passed ('opsctl rollback' picks the last good one), or "
                          "add --force to serve it anyway (it will not become last good)")
    if not failed and not force and needs_force(host, state, target):
        raise ConfigError(f"release {target} on {host.name} was never judged ({state.never_judged_why(target)}): "
                          f"no gate passed it",
                          "roll back to a release that passed ('opsctl rollback' picks the last good one), or "
                          "add --force to serve it anyway (it will not become last good)")
    return target


def _named_target(host: HostConfig, state: HostState, to: str | None) -> str:
    if to in (None, "previous"):
        target = state.last_good(exclude=state.current)
        if target is None and state.ledger_lost:
            raise ConfigError(f"{ledger_lost_problem(host, state)}: no release is known to be good, so there is "
                              f"no default to roll back to", "pick one of them: 'opsctl rollback --to RELEASE' "
                              "(or --to baseline); its record starts a new ledger")
        if target is None:   # no other judged release: the baseline, as a failed deploy's fallback chain ends
            base = state.baseline(host.baseline_profile)
            target = base if base and (base != state.current or state.live_not_ready() is not None) else None
        if target is None:
            raise ConfigError(f"nothing to roll back to on {host.name}: no earlier good release is on the host",
                              "deploy the baseline with 'opsctl deploy " + host.baseline_profile + "'")
        return target
    if to == "baseline":
        target = state.baseline(host.baseline_profile)
        if target is None:
            raise ConfigError(f"no {host.baseline_profile} (baseline) release on {host.name}",
                              f"deploy it with 'opsctl deploy {host.baseline_profile}'")
        if target == state.current and state.live_not_ready() is None:
            raise ConfigError(f"the baseline release {target} is already live on {host.name}", "nothing to do")
        return target   # live but never became ready (a revert whose start failed): started again
    if to not in state.releases:
        known = ", ".join(sorted(state.releases)) or "none"
        raise ConfigError(f"release {to!r} is not on {host.name}", f"pick one of: {known} (see 'opsctl history')")
    if to == state.current and state.live_not_ready() is None:
        raise ConfigError(f"release {to} is already live on {host.name}", "nothing to do")
    return to



