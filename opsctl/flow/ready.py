"""ready: the ready line in this start's journal and a 200 from /health_generate; a failed
start says why, in the words `opsctl validate` uses."""
from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from opsctl import journal, validate
from opsctl.config import HostConfig, Profile
from opsctl.errors import DeployFailed, OpsctlError
from opsctl.flow.steps import Steps
from opsctl.hosts import Connection

READY_LINE = "The server is fired up and ready to roll!"


_CAUSE_GREP = "address already in use|capture cuda graph failed|out of memory|cuda error|illegal memory|error|exception"


def _probe_script(host: HostConfig, since: int) -> str:
    unit = host.unit_name
    url = f"http://127.0.0.1:{host.http_port}/health_generate"
    py = ("import sys,urllib.request\n"
          "try:\n"
          f"    print(urllib.request.urlopen({url!r}, timeout=25).status)\n"
          "except urllib.error.HTTPError as e:\n    print(e.code)\n"
          "except Exception:\n    print(0)\n")
    return (f"systemctl show {unit} -p ActiveState -p SubState -p NRestarts -p MainPID -p Result | tr '\\n' ' '; "
            f"echo; journalctl -u {unit} --since @{since} -o cat --no-pager 2>/dev/null | "
            f"grep -c -e {shlex.quote(READY_LINE)} -e 'Capture cuda graph failed' -e 'Traceback' | tr -d '\\n'; echo; "
            f"journalctl -u {unit} --since @{since} -o cat --no-pager 2>/dev/null | "
            f"grep -i -E {shlex.quote(_CAUSE_GREP)} | head -n 60 | cut -c1-300 | tr '\\n' '\\036'; echo; "
            f"journalctl -u {unit} --since @{since} -o cat --no-pager 2>/dev/null | grep -c -F {shlex.quote(READY_LINE)}; "
            f"{host.host_python} -c {shlex.quote(py)}")


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
    while True:
        res = conn.run(_probe_script(host, since), check=False, timeout=60)
        lines = res.stdout.splitlines() + [""] * 5
        props = dict(f.split("=", 1) for f in lines[0].split() if "=" in f)
        active, sub = props.get("ActiveState", ""), props.get("SubState", "")
        restarts, pid = props.get("NRestarts", "0"), props.get("MainPID", "0")
        from opsctl.journal import first_cause

        cause = first_cause([c for c in lines[2].split("\x1e") if c.strip()])
        error_line = cause[1] if cause else ""
        ready_lines = int(lines[3].strip() or 0) if lines[3].strip().isdigit() else 0
        code = lines[4].strip()
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
        if ready_lines > 0 and code == "200":
            steps.done("ready", t0, f"ready in {time.monotonic() - t0:.1f}s (pid {pid})")
            return Ready(time.monotonic() - t0, pid)
        last = f"{active}/{sub}, ready line {'seen' if ready_lines else 'not seen'}, /health_generate {code or '-'}"
        if time.monotonic() > deadline:
            raise _start_failed(host, f"not ready within {profile.readiness_timeout_s} s: the server was still "
                                f"starting ({last})" + (f"; last error line: {error_line}" if error_line else ""),
                                steps, t0, timed_out=True)
        time.sleep(1.0)


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

    try:
        parsed = journal.parse(journal.read_journal(conn, host.unit_name, since))
        failed = [f for f in validate.validate_startup(parsed, profile) if not f.ok]
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
    from opsctl.journal import first_cause

    try:
        res = conn.run(f"journalctl -u {host.unit_name} --since @{since} -o cat --no-pager 2>/dev/null | "
                       f"grep -i -E {shlex.quote(_CAUSE_GREP)} | head -n 200", check=False, timeout=60)
    except OpsctlError:
        return None  # the rollback matters more than the diagnosis
    cause = first_cause(res.stdout.splitlines())
    return cause[1] if cause and cause[0] != "error" else None

