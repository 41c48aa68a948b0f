"""switch: flip `current` and restart; the guard timer that puts the last good release back
unless the deploy is confirmed in time."""
from __future__ import annotations

import json
import shlex
import time

from opsctl.brake import BRAKE, Interrupted
from opsctl.config import HostConfig
from opsctl.drain import Gap, run_hook
from opsctl.errors import HostError, OpsctlError
from opsctl.flow.steps import Steps, noop
from opsctl.host import facts
from opsctl.host.connection import Connection
from opsctl.releases import profile_slug
from opsctl.ledger import append_ledger, signed


def host_epoch(conn: Connection) -> int:
    return facts.get(conn, facts.HostTime())


def guard_unit(host: HostConfig) -> str:
    return f"opsctl-guard-{host.service_name}"


GUARD_PROGRAM = "opsctl-guard"   # playbooks/files/opsctl-guard, installed in <root>/bin by every stage
SWITCH_ROOM = 16 << 20          # bytes a switch needs free under the install root: its links and the ledger
                                # records that follow it (the same number in playbooks/files/opsctl-switch)


def arm_guard(conn: Connection, host: HostConfig, fallbacks: str | list[str], seconds: int,
              expect: str | None = None, drain_s: float | None = None) -> None:
    """A transient timer on the host that puts the first of `fallbacks` that becomes ready back
    unless disarmed (`<root>/bin/opsctl-guard`: it records `rollback ok` only once the release
    it switched to is ready, else `rollback failed`, and tries the next, issue #32 item 5)."""
    unit = guard_unit(host)
    root = host.install_root
    targets = [fallbacks] if isinstance(fallbacks, str) else [f for f in fallbacks if f]
    # it takes the host's deploy lock first (waits up to 15 min): a guard never switches inside
    # another deploy (that deploy stops it, or re-arms its own); it acts only if `expect` is
    # still live, and records itself under the inventory's host name
    argv = [str(host.host_python), f"{root}/bin/{GUARD_PROGRAM}", "--root", str(root), "--service",
            host.service_name, "--host", host.name, "--port", str(host.http_port), "--min-free", str(SWITCH_ROOM),
            "--expect", expect or "", *(["--drain-deadline", f"{drain_s:g}"] if drain_s else []), "--", *targets]
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; systemctl reset-failed {unit}.timer "
             f"{unit}.service >/dev/null 2>&1; systemd-run --quiet --unit {unit} --on-active={seconds}s "
             f"--timer-property=AccuracySec=1s flock -w 900 {shlex.quote(f'{root}/.lock')} "
             + " ".join(shlex.quote(a) for a in argv), check=True)


def require_room(conn: Connection, host: HostConfig, need: int = SWITCH_ROOM, doing: str = "a switch") -> None:
    """Refuse before anything changes when the install root cannot take a switch and the ledger
    records after it: a switch whose record then fails leaves the live release and the ledger
    disagreeing (issue #32 item 7)."""
    root = host.install_root
    free = facts.get(conn, facts.DiskFree(str(root)))
    if free is None or free >= need:
        return  # (no df on the host: the pre-checks report disk space)
    raise HostError(f"{host.name}: {free / 2**20:.1f} MiB free under {root}, {doing} needs {need / 2**20:.0f} MiB "
                    f"(the switch and its ledger records); nothing was switched or recorded",
                    f"free space under {root} on the host (old releases under {root}/releases: 'opsctl status' "
                    f"names the live one), then run the same command again")


def disarm_guard(conn: Connection, host: HostConfig) -> None:
    unit = guard_unit(host)
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; "
             f"systemctl reset-failed {unit}.timer {unit}.service >/dev/null 2>&1; true", check=False)


def switch(conn: Connection, host: HostConfig, release: str, *, record: dict | None = None,
           disarm: bool = False) -> int:
    """Flip current to `release` and restart; returns the host's epoch just before. Refused
    (HostError, nothing changed) when the install root has no room for it (require_room).
    `record`: the switch's ledger record, appended on the host by bin/opsctl-switch as it flips
    `current` (signed here, timed there; issue #50), so a controller killed after the switch
    leaves it on record. `disarm`: the same program stops the deploy guard right after the
    restart (a switch away from the release the guard was armed for: the rollback's)."""
    require_room(conn, host)
    since = host_epoch(conn)
    env = []
    if record is not None:
        env += [f"OPSCTL_SWITCH_RECORD={shlex.quote(json.dumps(signed(host, record), default=str))}",
                f"OPSCTL_PYTHON={shlex.quote(str(host.host_python))}"]
    if disarm:
        env.append(f"OPSCTL_SWITCH_DISARM_GUARD={shlex.quote(guard_unit(host))}")
    conn.run(" ".join([*env, f"{host.install_root}/bin/opsctl-switch {host.install_root} {host.service_name} "
                             f"{shlex.quote(release)}"]))
    return since


def drain_guard_unit(host: HostConfig) -> str:
    return f"opsctl-drain-{host.service_name}"


DRAIN_GUARD_MARGIN_S = 15   # past the drain's deadline: the controller switches right after it


def arm_drain_guard(conn: Connection, host: HostConfig, deadline_s: float) -> None:
    """Before the drain stops the live server: a transient timer on the host that starts it again
    unless the switch (or the controller's own restart) disarms it first. A controller killed
    (-9, a lost link) between that SIGTERM and the switch would otherwise leave the host serving
    nothing once its requests finished: with it, the old release serves again at most the
    deadline + DRAIN_GUARD_MARGIN_S after the drain began."""
    unit = drain_guard_unit(host)
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; systemctl reset-failed {unit}.timer "
             f"{unit}.service >/dev/null 2>&1; systemd-run --quiet --unit {unit} "
             f"--on-active={int(deadline_s) + DRAIN_GUARD_MARGIN_S}s --timer-property=AccuracySec=1s "
             f"/bin/sh -c {shlex.quote(drain_guard_script(host, deadline_s))}", check=True)


def drain_guard_script(host: HostConfig, deadline_s: float) -> str:
    """What the drain guard runs on the host: the old release's restart, then its ledger record
    (`action: restart`, signed `opsctl-drain-guard@<host>`): an outage a controller left behind is
    in the ledger, as every switch is (issue #50)."""
    root = str(host.install_root)
    rec = {"action": "restart", "result": "ok", "host": host.name, "who": f"opsctl-drain-guard@{host.name}",
           "automatic": True, "reason": f"drain guard: no switch within the drain's deadline ({int(deadline_s)} s) "
                                        f"+ {DRAIN_GUARD_MARGIN_S} s (the controller was lost): the release that "
                                        f"was drained started again"}
    body = json.dumps(rec)[1:-1]   # the record's fields, after the ts and release the host fills in
    return (f"systemctl restart --no-block {shlex.quote(host.unit_name)}; "
            f"rel=$(basename \"$(readlink {shlex.quote(root)}/current)\"); "
            f"printf '{{\"ts\": \"%s\", \"release\": \"%s\", %s}}\\n' "
            f"\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" \"$rel\" {shlex.quote(body)} "
            f"| {shlex.quote(root)}/bin/opsctl-ledger-append {shlex.quote(root)}/ledger.jsonl")


def disarm_drain_guard(conn: Connection, host: HostConfig) -> None:
    unit = drain_guard_unit(host)
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; "
             f"systemctl reset-failed {unit}.timer {unit}.service >/dev/null 2>&1; true", check=False)


def switch_drained(conn: Connection, host: HostConfig, release: str, gap: Gap, do_switch=None, *,
                   disarm: bool = False) -> int:
    """`switch` after drain_before_switch: a drain that reached its deadline with requests still
    running ends them first (counted in `gap.aborted`: SGLang would wait for them with no deadline
    of its own); the stop's times go on `gap`. `do_switch`: the caller's switch (its module's).
    The switch's record (`gap.switch_record()`) is written on the host by the switch itself;
    back_in_pool adds the start's figures (`gap.start_record()`). `disarm`: see `switch`."""
    if gap.stop_at is not None:   # the drain stopped the server and armed its restart: the switch starts it
        disarm_drain_guard(conn, host)
    if gap.deadline_hit and gap.aborted:
        conn.run(f"systemctl kill --signal=SIGKILL {shlex.quote(host.unit_name)} >/dev/null 2>&1; true", check=False)
    if gap.stop_at is None:
        gap.stop_at = gap.now()
    since = (do_switch or switch)(conn, host, release, record=gap.switch_record(), disarm=disarm)
    gap.recorded_on_host = True
    gap.stopped_at = gap.now()
    return since


# --------------------------------------------------------------------------- the drain (issue #35)


def _loads(conn: Connection, host: HostConfig):
    return facts.get(conn, facts.Loads(str(host.host_python), host.http_port), timeout=30)


def drain_before_switch(conn: Connection, host: HostConfig, *, why: str, from_release: str | None,
                        to_release: str | None, deadline_s: float, steps: Steps | None = None,
                        readiness_timeout_s: int = 1800) -> Gap:
    """Take the host out and let its requests finish before the switch (`opsctl.drain`):

    1. the `out` hook (a failure: HostError, exit 3, nothing changed);
    2. with an out hook, wait until /v1/loads shows no running or waiting request (the balancer
       sends no more), or the deadline — nothing live changed yet: an interrupt here runs the
       `in` hook and raises Interrupted;
    3. SIGTERM to the server (SGLang 0.5.23 answers 503 on /health* and finishes its requests;
       a balancer that health-checks takes it out here), and wait until none runs or the
       deadline. Requests still running at the deadline are counted (`gap.aborted`) and end
       with the switch (`switch(..., gap)` kills the old server). An interrupt here restarts
       the same release (nothing was switched), waits for its health and runs the `in` hook.

    Returns the Gap that switch_drained, the ready step and `back_in_pool` fill in."""
    steps = steps or Steps(noop, host.name)
    cfg = host.settings.drain
    gap = Gap(why, from_release, to_release, float(deadline_s), drain=cfg.enabled, enabled=cfg.enabled,
              hooks=cfg.hooks.out is not None)
    active = facts.get(conn, facts.ServiceState(host.unit_name, ("ActiveState",))).get("ActiveState")
    if active != "active":  # nothing serves: nothing to drain
        gap.drain = False
        gap.out_at = gap.now()
        gap.inflight_at_start = 0
        return gap
    load = _loads(conn, host)
    gap.inflight_at_start = load.busy if load is not None else 0
    if not cfg.enabled:
        gap.out_at = gap.now()
        return gap
    t0 = steps.start("drain", f"{gap.inflight_at_start} request(s) in flight; deadline {deadline_s:g} s")
    if cfg.hooks.out is not None:
        run_hook(cfg.hooks.out, host, "out")   # HostError: nothing changed
    gap.out_at = gap.now()
    end = time.monotonic() + deadline_s
    try:
        if cfg.hooks.out is not None:
            load = _wait_idle(conn, host, end, cfg.poll_s)
    except Interrupted as exc:
        with BRAKE.shielded(f"putting {host.name} back in the pool"):
            back = _in_hook_quietly(host, steps)
        steps.done("drain", t0, "interrupted: nothing switched", status="fail")
        raise Interrupted(f"{exc.problem} during the drain, before the switch: {host.name} still serves "
                          f"{from_release or 'nothing'} (nothing live changed){back}",
                          "run the same command again when ready", signal_name=exc.signal_name,
                          details={"step": "drain", "switched": False}) from None
    arm_drain_guard(conn, host, deadline_s)   # a controller lost from here on: the old release starts again
    gap.stop_at = gap.now()
    conn.run(f"systemctl kill --kill-whom=main --signal=SIGTERM {shlex.quote(host.unit_name)}", check=False)
    try:
        load = _wait_idle(conn, host, end, cfg.poll_s)
    except Interrupted as exc:
        with BRAKE.shielded(f"restarting {from_release or 'the live release'}: the drain stopped it"):
            conn.run(f"systemctl restart --no-block {shlex.quote(host.unit_name)}", check=False)
            disarm_drain_guard(conn, host)
            ok = _wait_health(conn, host, readiness_timeout_s)
            back = _in_hook_quietly(host, steps)
        steps.done("drain", t0, "interrupted: the live release was restarted, nothing switched", status="fail")
        raise Interrupted(f"{exc.problem} during the drain, before the switch: {from_release or 'the live release'} "
                          f"was restarted on {host.name} " + ("and serves again" if ok else "but is NOT healthy yet")
                          + f" (nothing switched){back}", "run the same command again when ready",
                          signal_name=exc.signal_name, details={"step": "drain", "switched": False,
                                                               "restarted": True}) from None
    if load is not None and load.busy:
        gap.deadline_hit, gap.aborted = True, load.busy
        steps.done("drain", t0, f"deadline {deadline_s:g} s reached: {load.busy} request(s) still running, "
                   f"ended by the switch (recorded)", status="warn")
    else:
        # the drain as the switch record counts it (out of the pool to SIGTERM), then the wait for the
        # last request after SIGTERM, which the record counts in the stop (issue #49: one figure each)
        after = max(0.0, gap.now() - gap.stop_at) if gap.stop_at is not None else 0.0
        steps.done("drain", t0, f"drained in {gap.drain_s if gap.drain_s is not None else 0.0:.1f} s, "
                   f"then SIGTERM: idle {after:.1f} s later (part of the stop)")
    return gap


def _wait_idle(conn: Connection, host: HostConfig, end: float, poll_s: float):
    """Until no request runs or waits (or the server is gone), or `end`; the last load read."""
    while True:
        load = _loads(conn, host)
        if load is None or load.busy == 0 or time.monotonic() >= end:
            return load
        time.sleep(max(0.05, min(poll_s, end - time.monotonic())))


def _wait_health(conn: Connection, host: HostConfig, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if facts.get(conn, facts.HealthCode(str(host.host_python), host.http_port)) == 200:
            return True
        time.sleep(1.0)
    return False


def _in_hook_quietly(host: HostConfig, steps: Steps) -> str:
    hook = host.settings.drain.hooks.in_
    if hook is None:
        return ""
    try:
        run_hook(hook, host, "in")
    except OpsctlError as exc:
        steps.note(exc.problem)
        return f"; the in hook FAILED ({exc.problem}): put {host.name} back in the pool by hand"
    return f"; {host.name} is back in the pool"


def read_start(conn: Connection, host: HostConfig, since: int, release: str | None) -> dict:
    """The start that just got ready, from its journal (opsctl.startup): every phase at the site's
    scale, the lab's time scale, and the comparison with the previous start of the same profile
    and budget on this host (the ledger's switch records: `slower`, whose `finding` is
    `startup.slower`, a warning, when at least 30 % slower). Empty when the journal cannot be read:
    the switch is recorded without it."""
    from opsctl import startup

    try:
        st = startup.parse(facts.get(conn, facts.JournalWindow(host.unit_name, since)))
    except (OpsctlError, IndexError, ValueError):
        return {}
    profile = profile_slug(release) if release else None
    rec = st.as_record(profile)
    if profile:
        try:
            ledger, _ = facts.get(conn, facts.LedgerRecords(str(host.install_root)))
        except OpsctlError:
            ledger = []   # no ledger to compare with: the start is still recorded
        cmp, prev = startup.compare_with_ledger(st, profile, ledger)
        if prev is not None:
            rec["slower"] = {**cmp.as_dict(), "previous_release": prev.get("to_release"),
                             "previous_ts": prev.get("ts"), "finding": cmp.finding().model_dump()}
    return rec


def back_in_pool(conn: Connection, host: HostConfig, gap: Gap, since: int | None, steps: Steps | None = None, *,
                 ready: bool = True) -> dict:
    """After the ready step: the `in` hook (the host serves again), the start's phases and the lab's
    time scale from its journal (`read_start`), and the switch's record in the ledger; the `gap`
    event carries that record (the CLI prints the gap and the start-up block from it). A start
    that did not become ready stays out of the pool (`ready=False`): the rollback that follows
    brings it back."""
    steps = steps or Steps(noop, host.name)
    if ready:
        gap.ready_at = gap.ready_at or gap.now()
        hook = host.settings.drain.hooks.in_
        if hook is not None and gap.drain:
            try:
                run_hook(hook, host, "in")
            except OpsctlError as exc:
                steps.note(f"{exc.problem}: {host.name} serves but is NOT back in the pool")
                gap.result = "in-hook-failed"
        gap.in_at = gap.now()
    else:
        gap.result = "not-ready"
    if since is not None and ready:
        gap.startup = read_start(conn, host, since, gap.to_release)
        gap.time_scale = gap.startup.get("time_scale") if gap.startup else None
    rec = gap.record()
    try:
        with BRAKE.held():
            # the switch itself is on record already (bin/opsctl-switch wrote it on the host): the
            # start's figures, named by its switch_id (read back as one record: onhost.ledger_records.fold_switches)
            append_ledger(conn, host, gap.start_record() if gap.recorded_on_host else rec)
    except OpsctlError as exc:
        steps.note(f"could not record the switch's gap: {exc.problem}")
    steps.progress({"event": "gap", "host": host.name, "gap": rec})
    return rec


def stop_service(conn: Connection, host: HostConfig) -> None:
    """The host served nothing before this deploy: leave it that way."""
    conn.run(f"systemctl disable --now {host.unit_name} >/dev/null 2>&1; rm -f /etc/systemd/system/{host.unit_name} "
             f"{host.install_root}/current; systemctl daemon-reload; systemctl reset-failed {host.unit_name} "
             f">/dev/null 2>&1; true", check=False)

