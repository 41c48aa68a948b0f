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

import difflib
import hashlib
import json
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from opsctl import __version__, wheelhouse
from opsctl.brake import BRAKE, Interrupted
from opsctl.artifacts import (DrafterManifest, SyncResult, drafter_manifest, plan_drafter, runtime_wheel,
                              sha256_file, sync_drafter)
from opsctl.config import HostConfig, Inventory, Profile, load_inventory
from opsctl.errors import ConfigError, DeployFailed, HostError, OpsctlError
from opsctl.hosts import Connection, connect
from opsctl.playbook import PlayResult, PlayStep, run_playbook
from opsctl.releases import HostLock, HostState, ReleaseInfo, append_ledger, now_iso, read_state, release_id, who
from opsctl.render import Rendered, env_python, render
from opsctl import watch

Progress = Callable[[dict], None]


def _noop(_: dict) -> None:
    pass


class Steps:
    """Emits one progress event per step with elapsed time (the CLI prints them)."""

    def __init__(self, progress: Progress | None, host: str):
        self.progress = progress or _noop
        self.host = host
        self.current = "plan"  # the step in progress, for an interrupt's report

    def start(self, step: str, detail: str = "") -> float:
        self.current = step
        self.progress({"event": "step", "host": self.host, "step": step, "status": "start", "detail": detail})
        return time.monotonic()

    def done(self, step: str, t0: float, detail: str = "", status: str = "ok", **extra: Any) -> None:
        self.progress({"event": "step", "host": self.host, "step": step, "status": status,
                       "elapsed_s": round(time.monotonic() - t0, 2), "detail": detail, **extra})

    def task(self, step: PlayStep) -> None:
        self.progress({"event": "task", "host": self.host, **step.as_dict()})

    def note(self, message: str) -> None:
        self.progress({"event": "note", "host": self.host, "message": message})


# --------------------------------------------------------------------------- plan


@dataclass
class Plan:
    host: HostConfig
    profile: Profile
    rendered: Rendered
    release: str
    state: HostState
    runtime_wheel: Path | None
    runtime_sha: str | None
    drafter: DrafterManifest | None
    drafter_plan: dict | None
    unit_diff: str
    changes: list[str] = field(default_factory=list)
    bytes_to_send: int = 0
    verify_weights: bool = False
    base_env: dict | None = None  # the wheelhouse to ship and install from, when the host lacks the base env

    @property
    def previous(self) -> str | None:
        return self.state.current

    @property
    def release_exists(self) -> bool:
        return self.release in self.state.releases

    @property
    def is_live(self) -> bool:
        return self.state.current == self.release and self.state.service.get("ActiveState") == "active"

    def manifest(self) -> dict:
        return {
            "id": self.release, "profile": self.profile.model_dump(mode="json"),
            "verify_width": self.profile.verify_width, "rendered_digest": self.rendered.digest(),
            "files": {n: _sha(t) for n, t in sorted(self.rendered.release_files.items())},
            "secrets": self.host.settings.secrets_file is not None,  # never their values or hash
            "runtime_wheel": ({"name": self.runtime_wheel.name, "sha256": self.runtime_sha}
                              if self.runtime_wheel else None),
            "drafter": ({"digest": self.drafter.digest, "bytes": self.drafter.total_bytes} if self.drafter else None),
            "created_at": now_iso(), "created_by": who(), "opsctl_version": __version__,
        }

    def as_dict(self) -> dict:
        return {"host": self.host.name, "profile": self.profile.name, "budget": self.profile.budget,
                "verify_width": self.profile.verify_width, "release": self.release,
                "current": self.state.current, "release_exists": self.release_exists, "live": self.is_live,
                "changes": self.changes, "unit_diff": self.unit_diff, "bytes_to_send": self.bytes_to_send,
                "drafter": self.drafter_plan, "base_env": self.base_env, "argv": self.rendered.argv}


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def secrets_digest(host: HostConfig) -> str | None:
    """sha256 of the configured secrets file (None when none is configured). A missing file,
    or one that group/others can read, is refused before anything touches the host."""
    path = host.settings.secrets_file
    if path is None:
        return None
    import stat

    try:
        st = path.stat()
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"secrets_file {path} (host {host.name}) does not exist",
                          "create it (KEY=VALUE lines, chmod 600) or remove secrets_file from the inventory") from None
    except OSError as exc:
        raise ConfigError(f"secrets_file {path} cannot be read: {exc.strerror}", "check its owner and mode") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) and not host.settings.secrets_mode_ok:
        raise ConfigError(f"secrets_file {path} is readable by group/others (mode {stat.S_IMODE(st.st_mode):04o})",
                          f"chmod 600 {path} (or set secrets_mode_ok: true to accept it)")
    return hashlib.sha256(data).hexdigest()


def make_plan(conn: Connection, host: HostConfig, profile: Profile, *, verify_weights: bool = False) -> Plan:
    """Work out what a deploy would change. Reads the host, writes nothing."""
    rendered = render(host, profile)
    wheel = runtime_wheel(host) if profile.kind == "ddtree" else None
    wheel_sha = sha256_file(wheel) if wheel else None
    manifest = drafter_manifest(host.drafter.source) if profile.speculative else None
    secrets_sha = secrets_digest(host)
    rid = release_id(profile.slug, rendered.digest(), wheel_sha, manifest.digest if manifest else None, secrets_sha)
    state = read_state(conn, host)
    current_unit = ""
    if state.current:
        current_unit = conn.run(f"cat {host.install_root}/current/{host.unit_name} 2>/dev/null", check=False).stdout
    new_unit = rendered.release_files[host.unit_name]
    diff = "".join(difflib.unified_diff(current_unit.splitlines(True), new_unit.splitlines(True),
                                        fromfile=f"live ({state.current or 'none'})", tofile=f"new ({rid})"))
    dplan = plan_drafter(conn, host, manifest, source=host.drafter.source, full_verify=verify_weights) \
        if manifest else None
    plan = Plan(host, profile, rendered, rid, state, wheel, wheel_sha, manifest, dplan, diff,
                verify_weights=verify_weights)
    env_ready = conn.run(f"test -f {env_python(host).parent.parent}/.opsctl-complete", check=False).ok
    changes: list[str] = []
    send = 0
    if not env_ready:
        # the wheelhouse matches its lock and every wheel fits the host's Python and glibc, or nothing ships
        plan.base_env = wheelhouse.plan_base_env(conn, host)
        be = plan.base_env
        changes.append(f"create base environment sglang-{host.runtime.sglang_version} from {be['packages']} "
                       f"wheels ({be['bytes_total'] / 2**20:.1f} MiB; send {be['send']} file(s), "
                       f"{be['bytes_to_send'] / 2**20:.1f} MiB, reuse {be['link']})")
        send += be["bytes_to_send"]
    if plan.release_exists:
        if state.current == rid:
            changes.append(f"release {rid} is already live" + ("" if plan.is_live else
                           f" but the service is {state.service.get('ActiveState', 'unknown')}: restart it"))
        else:
            changes.append(f"release {rid} is already staged: switch to it")
    else:
        changes.append(f"stage release {rid}: {', '.join(sorted(rendered.release_files))}"
                       + (f", runtime {wheel.name}" if wheel else ""))
        send += sum(len(t.encode()) for t in rendered.release_files.values()) + (wheel.stat().st_size if wheel else 0)
    if dplan is not None:
        if dplan["present"]:
            changes.append(f"drafter {manifest.digest[:12]} already on the host, content checked "
                           f"({'every byte' if verify_weights else 'sizes and sampled hashes'}; 0 bytes)")
        elif dplan.get("repair"):
            changes.append(f"drafter {manifest.digest[:12]} on the host differs in {len(dplan['repair'])} file(s) "
                           f"({', '.join(dplan['repair'][:3])}): re-send them ({dplan['bytes_to_send'] / 2**20:.1f} MiB)")
            send += dplan["bytes_to_send"]
        else:
            changes.append(f"drafter {manifest.digest[:12]}: send {len(dplan['send'])} file(s) "
                           f"({dplan['bytes_to_send'] / 2**20:.1f} MiB), reuse {len(dplan['link'])}")
            send += dplan["bytes_to_send"]
    if not plan.is_live:
        changes.append(f"switch current: {state.current or 'none'} -> {rid}; restart {host.unit_name}")
    plan.changes = changes
    plan.bytes_to_send = send
    _check_room(conn, host, send)
    return plan


LEDGER_ROOM = 64 << 20  # the ledger, the guard's records, manifests and bench files


def _check_room(conn: Connection, host: HostConfig, bytes_to_send: int) -> None:
    """Refuse before anything changes when the install root cannot take the release, the
    ledger and the guard's records (a full disk mid-deploy tears records and releases)."""
    root = host.install_root
    res = conn.run(f"d={shlex.quote(str(root))}; while [ ! -d \"$d\" ]; do d=$(dirname \"$d\"); done; "
                   f"df -P -B1 \"$d\" | awk 'NR==2 {{print $4}}'", check=False)
    try:
        free = int(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return  # no df on the host: the pre-checks report disk space
    need = bytes_to_send + LEDGER_ROOM
    if free < need:
        raise HostError(f"{host.name}: {free / 2**20:.0f} MiB free under {root}, this deploy needs "
                        f"{need / 2**20:.0f} MiB (release {bytes_to_send / 2**20:.0f} MiB + 64 MiB for the ledger "
                        f"and the guard); nothing was changed", f"free space under {root} on the host, then deploy again")


# --------------------------------------------------------------------------- stage / switch / ready


def stage(conn: Connection, inv: Inventory, plan: Plan, steps: Steps) -> tuple[PlayResult, SyncResult | None]:
    host = plan.host
    sync = None
    env_wheelhouse = ""
    if plan.base_env is not None:
        t0 = steps.start("wheelhouse", f"{plan.base_env['bytes_total'] / 2**20:.1f} MiB")
        remote, wsync = wheelhouse.ship(conn, host, progress=steps.note)
        env_wheelhouse = str(remote)
        steps.done("wheelhouse", t0, f"{wsync.bytes_sent} bytes sent, {wsync.files_sent} file(s) sent, "
                   f"{wsync.files_linked} reused", bytes_sent=wsync.bytes_sent)
    if plan.drafter is not None:
        t0 = steps.start("drafter", f"{plan.drafter.total_bytes / 2**20:.1f} MiB")
        sync = sync_drafter(conn, host, host.drafter.source, plan.drafter, progress=steps.note,
                            full_verify=plan.verify_weights)
        steps.done("drafter", t0, f"{sync.bytes_sent} bytes sent, {sync.files_sent} file(s) sent, "
                   f"{sync.files_linked} reused", bytes_sent=sync.bytes_sent)
    with tempfile.TemporaryDirectory(prefix="opsctl-stage-") as tmp:
        stage_dir = Path(tmp) / "release"
        stage_dir.mkdir()
        for name, text in plan.rendered.release_files.items():
            (stage_dir / name).write_text(text)
        existing = plan.state.releases.get(plan.release)
        manifest = existing.manifest if existing else plan.manifest()
        (stage_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        s = host.settings
        extravars = {
            "opsctl_root": str(host.install_root), "opsctl_release_id": plan.release,
            "opsctl_stage_local": str(stage_dir), "opsctl_env_dir": str(env_python(host).parent.parent),
            "opsctl_sglang_version": host.runtime.sglang_version,
            "opsctl_wheelhouse_dir": env_wheelhouse, "opsctl_base_requirements": list(host.runtime.base_requirements),
            "opsctl_host_python": str(host.host_python), "opsctl_service_user": s.service_user or "",
            "opsctl_runtime_wheel": str(plan.runtime_wheel) if plan.runtime_wheel else "",
            "opsctl_drafter_digest": plan.drafter.digest if plan.drafter else "",
            "opsctl_loadgen_src": str(Path(__file__).resolve().parent / "bench" / "loadgen.py"),
            "opsctl_secrets_file": str(s.secrets_file) if s.secrets_file else "",
            **watch.playbook_vars(host),   # the host-side watch: installed (or removed) with every stage
        }
        t0 = steps.start("prepare", "ansible playbook prepare.yml")
        play = run_playbook(inv, host, "prepare.yml", extravars, progress=steps.task)
        steps.done("prepare", t0, f"changed={play.changed} ok={play.ok}", changed=play.changed)
    return play, sync


def host_epoch(conn: Connection) -> int:
    return int(conn.run("date +%s").stdout.strip())


def guard_unit(host: HostConfig) -> str:
    return f"opsctl-guard-{host.service_name}"


def arm_guard(conn: Connection, host: HostConfig, previous: str, seconds: int, expect: str | None = None) -> None:
    """A transient timer on the host that switches back to `previous` unless disarmed."""
    unit = guard_unit(host)
    root = host.install_root
    # it takes the host's deploy lock first (waits up to 15 min): a guard never switches inside
    # another deploy (that deploy stops it, or re-arms its own); it acts only if `expect` is
    # still live, and records itself under the inventory's host name
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; systemctl reset-failed {unit}.timer "
             f"{unit}.service >/dev/null 2>&1; systemd-run --quiet --unit {unit} --on-active={seconds}s "
             f"--timer-property=AccuracySec=1s flock -w 900 {root}/.lock {root}/bin/opsctl-switch {root} "
             f"{host.service_name} {shlex.quote(previous)} guard-timeout {shlex.quote(host.name)} "
             f"{shlex.quote(expect or '')}", check=True)


def disarm_guard(conn: Connection, host: HostConfig) -> None:
    unit = guard_unit(host)
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; "
             f"systemctl reset-failed {unit}.timer {unit}.service >/dev/null 2>&1; true", check=False)


def switch(conn: Connection, host: HostConfig, release: str) -> int:
    """Flip current to `release` and restart; returns the host's epoch just before."""
    since = host_epoch(conn)
    conn.run(f"{host.install_root}/bin/opsctl-switch {host.install_root} {host.service_name} {shlex.quote(release)}")
    return since


def stop_service(conn: Connection, host: HostConfig) -> None:
    """The host served nothing before this deploy: leave it that way."""
    conn.run(f"systemctl disable --now {host.unit_name} >/dev/null 2>&1; rm -f /etc/systemd/system/{host.unit_name} "
             f"{host.install_root}/current; systemctl daemon-reload; systemctl reset-failed {host.unit_name} "
             f">/dev/null 2>&1; true", check=False)


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


# --------------------------------------------------------------------------- gates (validation, bench)


@dataclass
class GateOutcome:
    ok: bool
    reason: str
    record: dict = field(default_factory=dict)


def run_validation(conn: Connection, host: HostConfig, profile: Profile, since: int, steps: Steps) -> GateOutcome:
    from opsctl import gating

    return gating.validate_release(conn, host, profile, since, steps)


def run_bench_gate(conn: Connection, host: HostConfig, profile: Profile, plan: Plan, steps: Steps) -> GateOutcome:
    from opsctl import gating

    return gating.bench_and_judge(conn, host, profile, plan.release, steps)


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
           limit: str | None = None, dry_run: bool = False, gates: bool = True, pre_checks: bool = True,
           progress: Progress | None = None, confirm: Callable[[Plan], bool] | None = None,
           verify_weights: bool = False) -> list[DeployOutcome]:
    """Deploy PROFILE to each selected host, host by host, stopping at the first failure."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    hosts = inv.select(limit)
    profiles = {h.name: h.profile(profile_name, budget) for h in hosts}  # all bad input before any host I/O
    if gates and not dry_run:
        from opsctl.bench.workloads import WorkloadSet

        for h in hosts:  # a malformed workload file is bad input: found before anything is deployed
            WorkloadSet.load(h.gate_policy().workloads)
    outcomes = []
    with BRAKE.engaged(on_note=lambda m: (progress or _noop)({"event": "note", "host": "opsctl", "message": m})):
        for host in hosts:
            outcomes.append(_deploy_one(inv, host, profiles[host.name], dry_run=dry_run, gates=gates,
                                        pre_checks=pre_checks, progress=progress, confirm=confirm,
                                        verify_weights=verify_weights))
    return outcomes


def _deploy_one(inv: Inventory, host: HostConfig, profile: Profile, *, dry_run: bool, gates: bool, pre_checks: bool,
                progress: Progress | None, confirm: Callable[[Plan], bool] | None,
                verify_weights: bool = False, trial: Callable | None = None) -> DeployOutcome:
    steps = Steps(progress, host.name)
    conn = connect(host)
    try:
        t0 = steps.start("plan", f"{profile.label} on {host.name}")
        plan = make_plan(conn, host, profile, verify_weights=verify_weights)
        if gates and profile.speculative and not dry_run:
            from opsctl import gating

            gating.require_baseline(conn, host)
        steps.done("plan", t0, f"release {plan.release}", plan=plan.as_dict())
        if dry_run:
            return DeployOutcome(host.name, plan.release, "dry-run", plan.as_dict())
        if pre_checks:
            from opsctl import gating

            t0 = steps.start("pre-checks", "host checks before touching the host")
            gating.pre_checks(inv, host, steps, t0)
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
                       f"run the same deploy again to finish it, or leave it: 'opsctl status' shows what is live",
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
            raise _with_start_diagnosis(conn, host, profile, since, steps, exc) from None
        details["ready_s"] = round(ready.seconds, 2)
        if gates:
            outcome = run_validation(conn, host, profile, since, steps)
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
            outcome = run_bench_gate(conn, host, profile, plan, steps)
            details["verdict"] = outcome.record
            if not outcome.ok:
                raise DeployFailed(f"{host.name}: gate failed: {outcome.reason}", "see the verdict table above",
                                   details={"verdict": outcome.record})
        if checks:
            from opsctl import gating

            outcome = gating.post_checks(inv, host, steps)
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
            back = _roll_back_after_failure(conn, host, plan, fallback, f"interrupted ({exc.signal_name}) during {step}",
                                            None, steps)
        raise Interrupted(f"{exc.problem} during {step}, after the switch: {back}",
                          "'opsctl status' shows what serves; deploy again when ready",
                          signal_name=exc.signal_name, details={"step": step, "switched": True, **details}) from None
    except OpsctlError as exc:
        if not switched:
            raise
        reason = exc.problem
        crash = _crash_cause(conn, host, since) if "start failed" not in reason else None
        if crash and crash not in reason:
            reason = f"{reason}; the server logged: {crash}"
        with BRAKE.shielded(f"rolling back to {fallback or 'nothing (stopping the service)'}"):
            back = _roll_back_after_failure(conn, host, plan, fallback, reason, exc, steps)
        raise DeployFailed(f"{reason}; {back}", exc.fix, details={**exc.details, **details}) from None
    disarm_guard(conn, host)
    append_ledger(conn, host, {"action": "promote", "result": "ok", "from_release": previous,
                               "to_release": plan.release, "profile": profile.name, "budget": profile.budget,
                               "reason": "gates passed" if gates else "gates skipped (--no-gate)",
                               **{k: v for k, v in details.items() if k in ("ready_s", "drafter_bytes_sent")}})
    prune(conn, host)
    return DeployOutcome(host.name, plan.release, "promoted", plan.as_dict(), details)


_SPECIFIC_START_FAILURES = ("startup.capture_failed", "startup.cuda_oom", "capture.verify_width")
_DIAGNOSIS_ORDER = ("startup.capture_failed", "startup.cuda_oom", "capture.verify_width", "startup.errors",
                    "capture.complete", "capture.expected_graphs", "startup.restarts")


def _with_start_diagnosis(conn: Connection, host: HostConfig, profile: Profile, since: int, steps: Steps,
                          exc: DeployFailed) -> DeployFailed:
    """A failed start says why, from the journal, in the same words `opsctl validate` uses."""
    from opsctl import journal, validate

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


def _crash_cause(conn: Connection, host: HostConfig, since: int) -> str | None:
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


def fallback_release(state: HostState, host: HostConfig, exclude: str | None) -> str | None:
    """Where a failed, interrupted or unconfirmed deploy goes back to: the newest release
    the host's ledger shows promoted (or put back by a rollback), else the baseline
    release; never one nobody judged. None: nothing to go back to (the service stops)."""
    good = state.last_good(exclude=exclude)
    if good:
        return good
    base = state.baseline(host.baseline_profile)
    return base if base and base != exclude else None


def _roll_back_after_failure(conn: Connection, host: HostConfig, plan: Plan, target: str | None, reason: str,
                             exc: OpsctlError | None, steps: Steps) -> str:
    t0 = steps.start("rollback", f"back to {target or 'nothing (no judged release or baseline on the host)'}")
    disarm_guard(conn, host)
    record: dict[str, Any] = {"action": "rollback", "from_release": plan.release, "to_release": target,
                              "profile": plan.profile.name, "budget": plan.profile.budget, "reason": reason,
                              "automatic": True}
    if exc is not None and exc.details:
        record["details"] = exc.details
    if not target or target == plan.release:
        stop_service(conn, host)
        append_ledger(conn, host, {**record, "result": "ok", "to_release": None})
        steps.done("rollback", t0, "service stopped: no judged-good release or baseline to go back to")
        return "the service was stopped (no judged-good release or baseline on the host to go back to)"
    since = switch(conn, host, target)
    info = plan.state.releases.get(target)
    try:
        wait_ready(conn, host, _release_profile(info, host), since, steps)
    except DeployFailed as again:
        append_ledger(conn, host, {**record, "result": "failed", "error": again.problem})
        steps.done("rollback", t0, f"rolled back to {target} but it did not become ready", status="fail")
        return f"rolled back to {target}, which did NOT become ready: {again.problem}"
    append_ledger(conn, host, {**record, "result": "ok",
                               "to_profile": info.label if info else None})
    steps.done("rollback", t0, f"{target} serves again")
    return f"rolled back to {target}, which serves again"


def _release_profile(info: ReleaseInfo | None, host: HostConfig) -> Profile:
    if info is None:
        return host.profile(host.baseline_profile)
    data = info.manifest.get("profile", {})
    try:
        return Profile(**data)
    except Exception:  # noqa: BLE001 - an older manifest: fall back to the inventory's profile
        return host.profile(info.profile, info.budget)


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
             reason: str = "manual rollback", progress: Progress | None = None) -> list[dict]:
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    results = []
    with BRAKE.engaged(on_note=lambda m: (progress or _noop)({"event": "note", "host": "opsctl", "message": m})):
        for host in inv.select(limit):
            results.extend(_rollback_one(host, to, reason, progress))
    return results


def _rollback_one(host: HostConfig, to: str | None, reason: str, progress: Progress | None) -> list[dict]:
    results = []
    steps = Steps(progress, host.name)
    conn = connect(host)
    try:
        _rollback_target(host, read_state(conn, host), to)  # bad input fails before the lock is taken
        BRAKE.check()  # interrupted before anything changed: stop here
        with HostLock(conn, host, "rollback"), BRAKE.shielded("rolling back: it finishes first"):
            state = read_state(conn, host)
            target = _rollback_target(host, state, to)
            info = state.releases[target]
            disarm_guard(conn, host)
            t0 = steps.start("switch", f"{state.current or 'none'} -> {target}")
            since = switch(conn, host, target)
            steps.done("switch", t0, f"current -> {target}")
            try:
                ready = wait_ready(conn, host, _release_profile(info, host), since, steps)
            except DeployFailed as exc:
                append_ledger(conn, host, {"action": "rollback", "result": "failed", "from_release": state.current,
                                           "to_release": target, "reason": reason, "error": exc.problem})
                raise
            rec = append_ledger(conn, host, {"action": "rollback", "result": "ok", "from_release": state.current,
                                             "to_release": target, "profile": info.profile, "budget": info.budget,
                                             "reason": reason, "ready_s": round(ready.seconds, 2)})
            results.append(rec)
    finally:
        conn.close()
    return results


def _rollback_target(host: HostConfig, state: HostState, to: str | None) -> str:
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


# --------------------------------------------------------------------------- status / history


def status(inventory: str | Path | Inventory, *, limit: str | None = None) -> list[dict]:
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    out = []
    for host in inv.select(limit):
        conn = connect(host)
        try:
            state = read_state(conn, host)
            watch_state = watch.brief(conn, host)
        finally:
            conn.close()
        cur = state.current_release
        verdict = state.verdict_for(state.current)  # the live release's own verdict, never another's
        unfinished = state.interrupted_deploy()
        out.append({
            "host": host.name, "release": state.current, "profile": cur.profile if cur else None,
            "budget": cur.budget if cur else None, "verify_width": cur.manifest.get("verify_width") if cur else None,
            "service": state.service.get("ActiveState"), "sub_state": state.service.get("SubState"),
            "since": state.service.get("ActiveEnterTimestamp"), "restarts": state.service.get("NRestarts"),
            "judged": state.judged(state.current) if state.current else None,
            "last_verdict": ({"status": verdict.get("status"), "ts": verdict.get("ts"), "release": verdict.get("release")}
                             if verdict else None),
            "deploy_in_progress_or_interrupted": unfinished is not None,
            "unfinished_deploy": ({k: unfinished.get(k) for k in ("ts", "result", "step", "switched", "to_release",
                                                                  "from_release", "signal", "who")}
                                  if unfinished else None),
            "last_good": state.last_good(),
            "ledger_problems": state.ledger_errors,
            "releases": sorted(state.releases), "baseline": state.baseline(host.baseline_profile),
            "watch": watch_state,
        })
    return out


def history(inventory: str | Path | Inventory, *, limit: str | None = None, last: int | None = None,
            problems: list[str] | None = None) -> list[dict]:
    """The ledger records of each selected host (the last N of each); lines that are not
    records are skipped and, when `problems` is given, reported there with their line."""
    if last is not None and last < 1:
        raise ConfigError(f"--last {last}: the number of records must be at least 1", "e.g. --last 10, or leave it out for all")
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    out = []
    for host in inv.select(limit):
        conn = connect(host)
        try:
            state = read_state(conn, host)
        finally:
            conn.close()
        recs = state.ledger[-last:] if last else state.ledger
        out.extend(recs)
        if problems is not None:
            problems.extend(f"{host.name}: ledger {p} (skipped)" for p in state.ledger_errors)
    return out


def validate_live(inventory: str | Path | Inventory, limit: str | None = None):
    """Findings for the live release of each selected host (see gating.validate_live)."""
    from opsctl import gating

    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    return gating.validate_live(inv, limit)


def bench_live(inventory: str | Path | Inventory, *, limit: str | None = None, overrides: dict | None = None,
               prompt_file: Path | None = None, save_baseline: bool = False, on_host: bool = True,
               progress: Callable[[Any], None] | None = None) -> dict:
    """Bench the live release of each selected host (see gating.bench_live)."""
    from opsctl import gating

    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    return gating.bench_live(inv, limit=limit, overrides=overrides, prompt_file=prompt_file,
                             save_baseline_run=save_baseline, on_host=on_host, progress=progress)


def release_bench(inventory: str | Path | Inventory, release: str, *, limit: str | None = None):
    """(the release's stored bench run, the host's baseline run, the host's gate policy) for
    `opsctl report RELEASE`."""
    from opsctl import gating

    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    host = inv.single(limit)
    conn = connect(host)
    try:
        res = conn.run(f"cat {host.install_root}/releases/{shlex.quote(release)}/bench.jsonl", check=False)
        if not res.ok:
            raise ConfigError(f"no bench results for release {release!r} on {host.name}",
                              "pass a results file, or a release id from 'opsctl history' that was benchmarked")
        run = gating.run_from_text(res.stdout, source=f"{host.name}:{release}/bench.jsonl")
        base = gating.load_baseline(conn, host) if gating.has_baseline(conn, host) else None
    finally:
        conn.close()
    return run, base, host.gate_policy()
