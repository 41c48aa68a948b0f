"""ansible-runner behind one function: run a playbook from playbooks/ against one
host of an inventory, turn runner events into progress steps, return the stats.

The inventory directory is handed to Ansible as is (same hosts.yml/group_vars).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from opsctl.brake import BRAKE
from opsctl.config import HostConfig, Inventory
from opsctl.errors import HostError

PLAYBOOKS_DIR = Path(__file__).resolve().parent.parent / "playbooks"


@dataclass
class PlayStep:
    """One task's outcome on the host, as the progress display shows it."""

    task: str
    status: str  # ok | changed | skipped | failed | unreachable
    elapsed_s: float
    message: str = ""

    def as_dict(self) -> dict:
        return {"event": "task", "task": self.task, "status": self.status,
                "elapsed_s": round(self.elapsed_s, 3), **({"message": self.message} if self.message else {})}


@dataclass
class PlayResult:
    playbook: str
    rc: int
    status: str
    changed: int
    ok: int
    failed: int
    unreachable: int
    steps: list[PlayStep] = field(default_factory=list)
    duration_s: float = 0.0
    window: tuple[float, float] | None = None  # epoch seconds of this host's first task start and last task end

    @property
    def succeeded(self) -> bool:
        return self.rc == 0 and self.failed == 0 and self.unreachable == 0


ProgressFn = Callable[[PlayStep], None]


def _ansible_bin_dir() -> str:
    return str(Path(sys.executable).parent)


def run_playbook(inventory: Inventory, host: HostConfig, playbook: str, extravars: dict[str, Any], *,
                 progress: ProgressFn | None = None, timeout_s: int = 3600) -> PlayResult:
    """One host: its PlayResult, or HostError naming the failed step (or the lost host)."""
    results = run_playbook_hosts(inventory, [host], playbook, {host.name: extravars},
                                 progress={host.name: progress} if progress else None, timeout_s=timeout_s)
    result = results[host.name]
    if result.status == "canceled":
        return result
    raise_for(result, host)
    return result


def raise_for(result: PlayResult, host: HostConfig) -> None:
    """HostError for a host the playbook failed on (unreachable, or the first failed step)."""
    if result.succeeded or result.status == "canceled":
        return
    playbook, steps = result.playbook, result.steps
    bad = next((s for s in steps if s.status in ("failed", "unreachable")), None)
    if bad and bad.status == "unreachable" or result.unreachable or not _reachable(host):
        # a connection lost mid-loop surfaces as a failed item ("All items completed"): ask the host
        raise HostError(f"host {host.name} ({host.ssh.describe()}) became unreachable over SSH"
                        + (f": {bad.message}" if bad and bad.message else ""),
                        "check the address/key in the inventory" +
                        ("; for the lab run 'opsctl lab up'" if not host.ssh.strict_host_keys else ""),
                        details={"steps": [s.as_dict() for s in steps]})
    what = f"step '{bad.task}' failed: {bad.message}" if bad else f"ansible status {result.status} rc={result.rc}"
    raise HostError(f"{playbook} on {host.name}: {what}", "see the step output above; the live release was not touched",
                    details={"steps": [s.as_dict() for s in steps]})


def run_playbook_hosts(inventory: Inventory, hosts: list[HostConfig], playbook: str,
                       vars_by_host: dict[str, dict[str, Any]], *,
                       progress: dict[str, ProgressFn | None] | None = None,
                       timeout_s: int = 3600) -> dict[str, PlayResult]:
    """One ansible-playbook run over HOSTS (Ansible's forks run them in parallel), each with
    its own variables. Variables equal on every host go in as extra vars (they win over the
    inventory's own, so Ansible connects as the rest of opsctl does); the rest go in a
    generated inventory listed after the real one, as host variables. A PlayResult per host
    (status "canceled" for all when the brake stopped the run); raises nothing per host."""
    import ansible_runner

    pb = PLAYBOOKS_DIR / playbook
    if not pb.is_file():
        raise HostError(f"playbook {pb} is missing", "reinstall opsctl from a full checkout")
    names = [h.name for h in hosts]
    work = work_dir()
    try:
        first = hosts[0]
        envvars = {
            "PATH": _ansible_bin_dir() + os.pathsep + os.environ.get("PATH", ""),
            "ANSIBLE_HOME": str(work / "home"),
            "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / "cp"),
            **first.ssh.ansible_envvars(),  # ssh args and host-key checking (opsctl/host/ssh.py); per host below
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_PYTHON_INTERPRETER": str(first.host_python),  # the inventory says which python the host has
            "ANSIBLE_TIMEOUT": "10",
            "ANSIBLE_FORKS": str(max(1, len(hosts))),
        }
        per_host = {h.name: {**vars_by_host[h.name], **h.ssh.ansible_extravars(),
                             "ansible_python_interpreter": str(h.host_python),
                             "ansible_host_key_checking": h.ssh.strict_host_keys} for h in hosts}
        keys = set.intersection(*(set(v) for v in per_host.values()))
        common = {k: per_host[names[0]][k] for k in keys
                  if all(per_host[n][k] == per_host[names[0]][k] for n in names)}
        differing = {n: {k: v for k, v in per_host[n].items() if k not in common} for n in names}
        inventories: list[str] = [str(inventory.path.resolve())]
        if any(differing.values()):
            extra_inv = work / "opsctl-hosts.json"
            extra_inv.write_text(json.dumps({"all": {"hosts": differing}}, default=str))
            inventories.append(str(extra_inv))
        steps: dict[str, list[PlayStep]] = {n: [] for n in names}
        started: dict[str, float] = {}
        window: dict[str, list[float]] = {}   # host -> [first task start, last task end] (epoch seconds)

        def on_event(event: dict) -> bool:
            name = event.get("event", "")
            data = event.get("event_data", {})
            task = data.get("task") or ""
            host_name = data.get("host") or ""
            if name == "runner_on_start":
                started[f"{data.get('task_uuid', task)}/{host_name}"] = time.monotonic()
                if host_name in window:
                    window[host_name][1] = time.time()
                else:
                    window[host_name] = [time.time(), time.time()]
                return True
            status = {"runner_on_ok": "ok", "runner_on_failed": "failed", "runner_on_skipped": "skipped",
                      "runner_on_unreachable": "unreachable"}.get(name)
            if status is None or task in ("Gathering Facts",) or host_name not in steps:
                return True
            window.setdefault(host_name, [time.time(), time.time()])[1] = time.time()
            res = data.get("res", {}) or {}
            if status == "ok" and res.get("changed"):
                status = "changed"
            if status == "failed" and data.get("ignore_errors"):
                status = "ok"
            t0 = started.pop(f"{data.get('task_uuid', task)}/{host_name}", time.monotonic())
            msg = ""
            if status in ("failed", "unreachable"):
                items = [r for r in res.get("results", []) if isinstance(r, dict) and r.get("failed")]
                first_bad = items[0] if items else res
                msg = str(first_bad.get("module_stderr") or first_bad.get("stderr") or first_bad.get("msg") or "")
                msg = " ".join(msg.split())[:400]
            step = PlayStep(task, status, time.monotonic() - t0, msg.strip())
            steps[host_name].append(step)
            fn = (progress or {}).get(host_name)
            if fn:
                fn(step)
            return True

        t0 = time.monotonic()
        # A signal must not unwind through ansible-runner's pexpect loop (the playbook would run on
        # without us): it is held, the runner's cancel callback sees it within 0.25 s and kills
        # ansible-playbook's process group, and the brake raises Interrupted once we are out.
        with BRAKE.held():
            results = _run(ansible_runner, work, pb, inventories, names, common, envvars, on_event, timeout_s, steps, t0)
        for n, r in results.items():
            r.window = tuple(window[n]) if n in window else None
        return results
    finally:  # every exit the controller survives (errors, Ctrl-C); kill -9: the next run sweeps it
        close_control_masters(work / "cp")
        shutil.rmtree(work, ignore_errors=True)


WORK_PREFIX = "opsctl-ansible-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def work_dir(tmp: str | None = None) -> Path:
    """A private directory for one ansible-runner run, `<tmp>/opsctl-ansible-<pid>-XXXX`. Those
    of opsctl processes that no longer exist (killed with -9: no `finally` ran) are removed
    first, so they never pile up (issue #32 item 12)."""
    tmp = tmp or tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        names = []
    for name in names:
        parts = name[len(WORK_PREFIX):].split("-", 1)
        if not name.startswith(WORK_PREFIX) or not parts[0].isdigit():
            continue
        path = Path(tmp) / name
        try:
            mine = path.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and int(parts[0]) != os.getpid() and not _pid_alive(int(parts[0])):
            shutil.rmtree(path, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=tmp))


def close_control_masters(control_dir: Path) -> list[str]:
    """End the SSH masters Ansible left behind (ControlPersist keeps each open for 60 s after its
    last task, still connected to the host, its socket gone with the run's directory): ask each
    to exit through its socket. Returns the sockets asked."""
    import subprocess

    try:
        socks = sorted(p for p in control_dir.iterdir() if p.is_socket())
    except OSError:
        return []
    for sock in socks:
        try:   # the destination is not contacted: -O talks to the master on the socket only
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "opsctl-control-master"],
                           capture_output=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return [str(s) for s in socks]


def _reachable(host: HostConfig) -> bool:
    import socket

    try:
        socket.create_connection(host.ssh.first_hop, timeout=3).close()
        return True
    except OSError:
        return False


def _dies_with_us(work: Path) -> str | None:
    """A directory to put first on PATH holding an `ansible-playbook` that runs the real one
    behind setpriv --pdeathsig: it ends when opsctl does, also on kill -9 (a staging child
    must not run on without the deploy lock). None where setpriv is missing."""
    setpriv = shutil.which("setpriv")
    real = shutil.which("ansible-playbook", path=_ansible_bin_dir())
    if not setpriv or not real:
        return None
    d = work / "bin"
    d.mkdir(exist_ok=True)
    wrapper = d / "ansible-playbook"
    wrapper.write_text(f"#!/bin/sh\nexec {setpriv} --pdeathsig TERM {real} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(d)


def _run(ansible_runner, work: Path, pb: Path, inventories: list[str], names: list[str], extravars: dict,
         envvars: dict, on_event, timeout_s: int, steps: dict[str, list[PlayStep]],
         t0: float) -> dict[str, PlayResult]:
    playbook = pb.name
    first = _dies_with_us(work)
    if first:
        envvars = {**envvars, "PATH": first + os.pathsep + envvars["PATH"]}
    try:
        runner = ansible_runner.run(
            private_data_dir=str(work), playbook=str(pb), inventory=inventories if len(inventories) > 1 else inventories[0],
            limit=",".join(names), extravars=extravars, envvars=envvars, quiet=True, event_handler=on_event,
            timeout=timeout_s, json_mode=False, cancel_callback=lambda: BRAKE.requested,
            settings={"pexpect_timeout": 0.25},
        )
        elapsed = time.monotonic() - t0
        if runner.status == "canceled":
            return {n: PlayResult(playbook, -1, "canceled", 0, 0, 0, 0, steps[n], elapsed) for n in names}
        stats = runner.stats or {}

        def count(key: str, name: str) -> int:
            return int(stats.get(key, {}).get(name, 0)) if stats else 0

        results = {}
        for n in names:
            rc = int(runner.rc)
            if len(names) > 1:  # the run's rc covers every host: each host gets its own outcome
                rc = 1 if count("failures", n) or count("dark", n) or (rc != 0 and not stats) else 0
            results[n] = PlayResult(playbook, rc, runner.status, count("changed", n), count("ok", n),
                                    count("failures", n), count("dark", n), steps[n], elapsed)
    finally:
        close_control_masters(work / "cp")
        shutil.rmtree(work, ignore_errors=True)
    return results
