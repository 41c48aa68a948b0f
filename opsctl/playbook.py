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

    @property
    def succeeded(self) -> bool:
        return self.rc == 0 and self.failed == 0 and self.unreachable == 0


ProgressFn = Callable[[PlayStep], None]


def _ansible_bin_dir() -> str:
    return str(Path(sys.executable).parent)


def run_playbook(inventory: Inventory, host: HostConfig, playbook: str, extravars: dict[str, Any], *,
                 progress: ProgressFn | None = None, timeout_s: int = 3600) -> PlayResult:
    import ansible_runner

    pb = PLAYBOOKS_DIR / playbook
    if not pb.is_file():
        raise HostError(f"playbook {pb} is missing", "reinstall opsctl from a full checkout")
    work = Path(tempfile.mkdtemp(prefix="opsctl-ansible-"))
    envvars = {
        "PATH": _ansible_bin_dir() + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_HOME": str(work / "home"),
        "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / "cp"),
        **host.ssh.ansible_envvars(),  # ssh args and host-key checking (opsctl/host/ssh.py)
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_PYTHON_INTERPRETER": str(host.host_python),  # the inventory says which python the host has
        "ANSIBLE_TIMEOUT": "10",
    }
    # the connection variables too: extra vars win over the inventory's, so Ansible connects
    # as the rest of opsctl does (same key path, same jump host)
    extravars = {**extravars, **host.ssh.ansible_extravars()}
    steps: list[PlayStep] = []
    started: dict[str, float] = {}

    def on_event(event: dict) -> bool:
        name = event.get("event", "")
        data = event.get("event_data", {})
        task = data.get("task") or ""
        if name == "runner_on_start":
            started[data.get("task_uuid", task)] = time.monotonic()
            return True
        status = {"runner_on_ok": "ok", "runner_on_failed": "failed", "runner_on_skipped": "skipped",
                  "runner_on_unreachable": "unreachable"}.get(name)
        if status is None or task in ("Gathering Facts",):
            return True
        res = data.get("res", {}) or {}
        if status == "ok" and res.get("changed"):
            status = "changed"
        if status == "failed" and data.get("ignore_errors"):
            status = "ok"
        t0 = started.pop(data.get("task_uuid", task), time.monotonic())
        msg = ""
        if status in ("failed", "unreachable"):
            items = [r for r in res.get("results", []) if isinstance(r, dict) and r.get("failed")]
            first = items[0] if items else res
            msg = str(first.get("module_stderr") or first.get("stderr") or first.get("msg") or "")
            msg = " ".join(msg.split())[:400]
        step = PlayStep(task, status, time.monotonic() - t0, msg.strip())
        steps.append(step)
        if progress:
            progress(step)
        return True

    t0 = time.monotonic()
    # A signal must not unwind through ansible-runner's pexpect loop (the playbook would run on
    # without us): it is held, the runner's cancel callback sees it within 0.25 s and kills
    # ansible-playbook's process group, and the brake raises Interrupted once we are out.
    with BRAKE.held():
        result = _run(ansible_runner, work, pb, inventory, host, extravars, envvars, on_event, timeout_s, steps, t0)
        if result is None:
            return PlayResult(playbook, -1, "canceled", 0, 0, 0, 0, steps, time.monotonic() - t0)
    if not result.succeeded:
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
    return result


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


def _run(ansible_runner, work: Path, pb: Path, inventory: Inventory, host: HostConfig, extravars: dict,
         envvars: dict, on_event, timeout_s: int, steps: list[PlayStep], t0: float) -> PlayResult | None:
    playbook = pb.name
    first = _dies_with_us(work)
    if first:
        envvars = {**envvars, "PATH": first + os.pathsep + envvars["PATH"]}
    try:
        runner = ansible_runner.run(
            private_data_dir=str(work), playbook=str(pb), inventory=str(inventory.path.resolve()),
            limit=host.name, extravars=extravars, envvars=envvars, quiet=True, event_handler=on_event,
            timeout=timeout_s, json_mode=False, cancel_callback=lambda: BRAKE.requested,
            settings={"pexpect_timeout": 0.25},
        )
        if runner.status == "canceled":
            return None
        stats = runner.stats or {}

        def count(key: str) -> int:
            return int(stats.get(key, {}).get(host.name, 0)) if stats else 0

        result = PlayResult(playbook, int(runner.rc), runner.status, count("changed"), count("ok"),
                            count("failures"), count("dark"), steps, time.monotonic() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def as_json_lines(result: PlayResult) -> str:
    return "\n".join(json.dumps(s.as_dict()) for s in result.steps)
