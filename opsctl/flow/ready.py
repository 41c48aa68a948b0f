"""ready: the ready line in this start's journal and a 200 from /health_generate; a failed
start says why, in the words `opsctl validate` uses."""
from __future__ import annotations

import time
from dataclasses import dataclass

from opsctl import journal
from opsctl.config import HostConfig, Profile
from opsctl.errors import DeployFailed, OpsctlError
from opsctl.flow.steps import Steps
from opsctl.host import facts
from opsctl.host.connection import Connection


@dataclass
class Ready:
    seconds: float
    main_pid: str


def wait_ready(conn: Connection, host: HostConfig, profile: Profile, since: int, steps: Steps) -> Ready:
    """Ready = the ready line in this start's journal and a 200 from /health_generate.
    A unit that fails, restarts or changes PID while we wait is a failed start."""
    t0 = steps.start("ready", f"waiting up to {profile.readiness_timeout_s}s for the ready line and /health_generate")
    deadline = time.monotonic() + profile.readiness_timeout_s
    first_pid = None
    last = ""
    ready_seen = False
    while True:
        # /health_generate is asked only once the ready line is there (it cannot answer 200 before):
        # a start polled for minutes runs no HTTP client on the host until then
        asked = (facts.ServiceState(host.unit_name), facts.CauseLines(host.unit_name, since),
                 facts.ReadyLines(host.unit_name, since))
        if ready_seen:
            asked += (facts.HealthCode(str(host.host_python), host.http_port),)
        props, causes, ready_lines, *health_code = facts.gather(conn, *asked)
        health = health_code[0] if health_code else 0
        active, sub = props.get("ActiveState", ""), props.get("SubState", "")
        restarts, pid = props.get("NRestarts", "0"), props.get("MainPID", "0")
        cause = journal.first_cause(causes)
        error_line = cause[1] if cause else ""
        if pid not in ("", "0"):
            if first_pid is None:
                first_pid = pid
            elif pid != first_pid:
                raise _start_failed(host, f"the server restarted during startup (PID {first_pid} -> {pid})"
                                    + (f": {error_line}" if error_line else ""), steps, t0)
        if restarts.isdigit() and int(restarts) > 0:
            raise _start_failed(host, f"the unit restarted {restarts} time(s) during startup"
                                + (f": {error_line}" if error_line else ""), steps, t0)
        if sub == "auto-restart":  # the server exited and systemd is about to start it again
            raise _start_failed(host, "the server exited during startup and systemd scheduled a restart"
                                + (f": {error_line}" if error_line else ""), steps, t0)
        if active == "failed" or (active == "inactive" and first_pid is not None) or \
                (first_pid is not None and pid in ("", "0") and active != "activating"):
            raise _start_failed(host, f"the server exited during startup ({active}/{sub})"
                                + (f": {error_line}" if error_line else ""), steps, t0)
        if ready_lines > 0 and health == 200:
            steps.done("ready", t0, f"ready in {time.monotonic() - t0:.1f}s (pid {pid})")
            return Ready(time.monotonic() - t0, pid)
        if ready_lines > 0 and not ready_seen:
            ready_seen = True
            continue  # ask /health_generate now
        last = f"{active}/{sub}, ready line {'seen' if ready_lines else 'not seen'}, /health_generate {health}"
        if time.monotonic() > deadline:
            raise _start_failed(host, f"not ready within {profile.readiness_timeout_s} s: the server was still "
                                f"starting ({last})" + (f"; last error line: {error_line}" if error_line else ""),
                                steps, t0, timed_out=True)
        # a quick start (a small model, a warm cache) is seen within a quarter second; a long one
        # is polled once a second (each poll is one SSH command)
        time.sleep(0.25 if time.monotonic() - t0 < 15 else 1.0)


def _start_failed(host: HostConfig, reason: str, steps: Steps, t0: float, *, timed_out: bool = False) -> DeployFailed:
    steps.done("ready", t0, reason, status="fail")
    fix = (f"raise readiness_timeout_s for the profile if the model needs longer to load, or see 'journalctl -u "
           f"{host.unit_name}' on the host" if timed_out else f"see 'journalctl -u {host.unit_name}' on the host")
    return DeployFailed(f"{host.name}: start failed: {reason}", fix, details={"timed_out": timed_out})



_SPECIFIC_START_FAILURES = ("startup.capture_failed", "startup.cuda_oom", "capture.verify_width")
_DIAGNOSIS_ORDER = ("startup.capture_failed", "startup.cuda_oom", "capture.verify_width", "startup.errors",
                    "capture.complete", "capture.expected_graphs", "startup.restarts")


def with_start_diagnosis(conn: Connection, host: HostConfig, profile: Profile, since: int, steps: Steps,
                          exc: DeployFailed) -> DeployFailed:
    """A failed start says why, from the journal, in the same words `opsctl validate` uses."""
    from opsctl import journal_findings  # a failed start only: a rollback that gets ready never loads it

    try:
        parsed = journal.parse(facts.get(conn, facts.JournalWindow(host.unit_name, since)))
        failed = [f for f in journal_findings.validate_startup(parsed, profile) if not f.ok]
    except OpsctlError:
        return exc
    if exc.details.get("timed_out"):
        # a slow start has no capture yet: "capture did not run" would name the wrong cause
        failed = [f for f in failed if f.check in _SPECIFIC_START_FAILURES]
    if not failed:
        return exc
    failed.sort(key=lambda f: _DIAGNOSIS_ORDER.index(f.check) if f.check in _DIAGNOSIS_ORDER else 99)
    steps.progress({"event": "findings", "host": host.name, "step": "ready",
                    "findings": [f.model_dump() for f in failed]})
    top = failed[0]
    details = {**exc.details, "findings": [f.model_dump() for f in failed]}
    if top.check not in _SPECIFIC_START_FAILURES:
        # the probe's cause line (port in use, the crash line) already names what happened
        return DeployFailed(exc.problem, exc.fix, details=details)
    return DeployFailed(f"{exc.problem}; {top.check}: {top.diagnosis}", top.fix or exc.fix, details=details)


def crash_cause(conn: Connection, host: HostConfig, since: int) -> str | None:
    """The most specific failure line this release's server logged since the switch (a gate
    that failed because the server crashed names the crash, not only its symptom)."""
    try:
        lines = facts.get(conn, facts.CauseLines(host.unit_name, since, limit=200))
    except OpsctlError:
        return None  # the rollback matters more than the diagnosis
    cause = journal.first_cause(lines)
    return cause[1] if cause and cause[0] != "error" else None

