"""validate: CUDA-graph capture and decode lines from the journal of the new release,
under a short probe load; `opsctl validate` on the live release."""
from __future__ import annotations

import shlex
from pathlib import Path

from opsctl import journal, journal_findings
from opsctl.config import HostConfig, Inventory, Profile
from opsctl.errors import CheckFailed, ConfigError, HostError
from opsctl.findings import Finding
from opsctl.flow.steps import GateOutcome, Steps, as_inventory
from opsctl.gate.measure import onhost_program
from opsctl.host import facts
from opsctl.host.connection import Connection, connect
from opsctl.ledger import append_ledger
from opsctl.releases import read_state, release_profile

# --------------------------------------------------------------------------- startup validation


PROBE_ROUNDS = 12


def probe_load_args(profile: Profile, round_no: int = 0) -> list[str]:
    """One round of a short probe load. SGLang prints a decode line every
    decode_log_interval forward steps, and a speculative step emits ~accept_len tokens,
    so the number of rounds needed depends on the (unknown) accept length: the caller
    repeats rounds until decode lines appear."""
    output_len = max(32, min(2 * profile.decode_log_interval * min(profile.verify_width, 4), 2048))
    return ["--concurrency", "2", "--requests-per-level", "2", "--repeats", "1", "--warmup", "0",
            "--input-len", "64", "--output-len", str(output_len), "--seed", str(7 + round_no)]


def run_probe(conn: Connection, host: HostConfig, profile: Profile, since: int | str):
    """Probe load in rounds until the journal holds at least two decode lines of the
    running server; returns the parsed journal."""
    parsed = None
    for round_no in range(PROBE_ROUNDS):
        run_loadgen(conn, host, probe_load_args(profile, round_no), timeout=600)
        parsed = journal.parse(facts.get(conn, facts.JournalWindow(host.unit_name, since)))
        if len(parsed.decodes_of()) >= 2:
            break
    return parsed


def run_loadgen(conn: Connection, host: HostConfig, args: list[str], *, timeout: float = 900) -> str:
    cmd = (f"{host.host_python} {onhost_program(host)} loadgen "
           f"--url http://127.0.0.1:{host.http_port} --json {' '.join(shlex.quote(a) for a in args)}")
    res = conn.run(cmd, check=False, timeout=timeout)
    if not res.ok:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [""]
        raise HostError(f"load generator on {host.name} failed (exit {res.rc}): {tail[0][:300]}",
                        "check the server answers on 127.0.0.1:%d" % host.http_port)
    return res.stdout


def validate_release(conn: Connection, host: HostConfig, profile: Profile, since: int, steps: Steps,
                     start: list[Finding] | None = None) -> GateOutcome:
    """`start`: findings about the start itself, made before (startup.slower, a warning): they go
    in the validation's record and ledger record; the start-up block already printed them."""
    t0 = steps.start("validate", "CUDA-graph capture and decode lines from the journal")
    entries = facts.get(conn, facts.JournalWindow(host.unit_name, since))
    findings = journal_findings.validate_startup(journal.parse(entries), profile)
    if journal_findings.all_ok(findings):
        findings = journal_findings.validate(run_probe(conn, host, profile, since), profile, require_decode=True)
    return _finish_validation(conn, host, profile, findings, steps, t0, start or [])


def _finish_validation(conn: Connection, host: HostConfig, profile: Profile, findings: list[Finding],
                       steps: Steps, t0: float, start: list[Finding] | None = None) -> GateOutcome:
    ok = journal_findings.all_ok(findings)
    failed = [f for f in findings if f.failed]
    steps.progress({"event": "findings", "host": host.name, "step": "validate",
                    "findings": [f.model_dump() for f in (failed or findings)]})
    start = start or []
    warned = [f for f in start if f.warned]
    record = {"ok": ok, "findings": [f.model_dump() for f in [*findings, *start]]}
    kept = failed or [f for f in findings if f.check.startswith("capture.")]
    append_ledger(conn, host, {"action": "validation", "result": "ok" if ok else "failed",
                               "profile": profile.name, "budget": profile.budget,
                               "reason": ("all checks passed" if ok else failed[0].one_line())
                               + "".join(f"; {f.one_line()}" for f in warned),
                               "findings": [f.model_dump() for f in [*kept, *start]]})
    if ok:
        steps.done("validate", t0, f"{len(findings)} checks passed"
                   + "".join(f"; warning: {f.check}" for f in warned), status="warn" if warned else "ok")
        return GateOutcome(True, "", record)
    steps.done("validate", t0, failed[0].one_line(), status="fail")
    return GateOutcome(False, f"{failed[0].check}: {failed[0].diagnosis}", record)


def validate_live(inventory: str | Path | Inventory, limit: str | None = None) -> list[Finding]:
    """`opsctl validate` against the live release: its journal since the service's
    current start, checked for the live release's profile, under a short probe load."""
    inv = as_inventory(inventory)

    out: list[Finding] = []
    for host in inv.select(limit):
        conn = connect(host)
        try:
            state = read_state(conn, host)
            if state.current_release is None:
                raise ConfigError(f"no live release on {host.name}", "deploy one first: opsctl deploy ar-tp8")
            profile = release_profile(state.current_release, host)
            since_arg = facts.get(conn, facts.ServiceStartEpoch(host.unit_name))
            if since_arg is None:
                raise CheckFailed(f"{host.unit_name} is not running on {host.name}",
                                  f"start it (systemctl start {host.unit_name}) or roll back")
            findings = journal_findings.validate(run_probe(conn, host, profile, since_arg), profile, require_decode=True)
            out.extend(f.model_copy(update={"details": {**f.details, "host": host.name}}) for f in findings)
        finally:
            conn.close()
    return out

