"""Issue #32 item 12: the controller's ansible work directories are removed on every exit it
survives (and swept when a killed run left one); a stale `.lock.holder` is cleared when its
holder lets go and never named as the holder once its process is gone."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path, PurePosixPath

import pytest

from opsctl import playbook
from opsctl.config import load_inventory
from opsctl.errors import HostError
from opsctl.host.connection import LocalConnection
from opsctl.lock import describe_holder, lock_command

REPO = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_work_dir_sweeps_those_of_dead_runs_only(tmp_path):
    dead = tmp_path / f"opsctl-ansible-{_dead_pid()}-abcd1234"
    alive = tmp_path / f"opsctl-ansible-{os.getppid()}-efgh5678"
    other = tmp_path / "opsctl-checks-xyz"
    for d in (dead, alive, other):
        d.mkdir()
    work = playbook.work_dir(str(tmp_path))
    assert work.name.startswith(f"opsctl-ansible-{os.getpid()}-") and work.is_dir()
    assert not dead.exists() and alive.exists() and other.exists()


@pytest.mark.parametrize("fail_at", ["before", "during"])
def test_the_work_dir_is_removed_when_the_run_fails(tmp_path, monkeypatch, fail_at):
    pytest.importorskip("ansible_runner")
    made: list[Path] = []
    real = playbook.work_dir
    monkeypatch.setattr(playbook, "work_dir", lambda: made.append(real(str(tmp_path))) or made[-1])
    inv = load_inventory(REPO / "inventories/blackwell")
    host = inv.single()

    def boom(*a, **k):
        raise HostError("ansible blew up")

    if fail_at == "before":  # the SSH variables fail, before ansible-runner starts
        monkeypatch.setattr(type(host.ssh), "ansible_envvars", boom)
    else:
        monkeypatch.setattr(playbook, "_run", boom)
    with pytest.raises(HostError, match="ansible blew up"):
        playbook.run_playbook_hosts(inv, [host], "prepare.yml", {host.name: {"x": 1}})
    assert made and not made[0].exists()


def _root(tmp_path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    return root


def test_the_lock_holder_names_the_host_pid_and_is_cleared_on_release(tmp_path):
    if not shutil.which("flock"):
        pytest.skip("needs flock (util-linux)")
    root = _root(tmp_path)
    holder = json.dumps({"who": "ops@ctl", "pid": 4242, "action": "deploy", "since": "now"})
    proc = subprocess.Popen(["bash", "-c", lock_command(str(root), holder)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "LOCKED"
        info = json.loads((root / ".lock.holder").read_text())
        assert info["who"] == "ops@ctl" and isinstance(info["host_pid"], int)
        os.kill(info["host_pid"], 0)   # the shell that holds the flock
        busy = subprocess.run(["bash", "-c", lock_command(str(root), holder)], capture_output=True, timeout=10)
        assert busy.returncode == 75
    finally:
        proc.stdin.close()             # the SSH channel closes: the lock is let go
        proc.wait(timeout=10)
    assert not (root / ".lock.holder").exists()


def _host(root: Path):
    host = load_inventory(REPO / "inventories/blackwell").single()
    return host.model_copy(update={"settings": host.settings.model_copy(update={"install_root": PurePosixPath(root)})})


def test_a_stale_holder_is_not_named(tmp_path):
    root = _root(tmp_path)
    (root / ".lock.holder").write_text(json.dumps({"who": "gone@ctl", "pid": 1, "action": "deploy",
                                                   "since": "2026-01-01T00:00:00Z", "host_pid": _dead_pid()}))
    desc = describe_holder(LocalConnection(), _host(root))
    assert "stale" in desc and "(pid 1, deploy since" not in desc


def test_a_live_holder_is_named(tmp_path):
    root = _root(tmp_path)
    (root / ".lock.holder").write_text(json.dumps({"who": "ops@ctl", "pid": 7, "action": "deploy",
                                                   "since": "2026-01-01T00:00:00Z", "host_pid": os.getpid()}))
    assert describe_holder(LocalConnection(), _host(root)) == "ops@ctl (pid 7, deploy since 2026-01-01T00:00:00Z)"
    (root / ".lock.holder").unlink()
    assert describe_holder(LocalConnection(), _host(root)) == "another opsctl run"


def test_ansibles_persisting_ssh_masters_are_asked_to_exit_before_the_work_dir_goes(tmp_path, monkeypatch):
    """Ansible's ControlPersist leaves each master connected to the host for 60 s after the run;
    the run's directory (and the socket) is removed, so only opsctl can end them, by their sockets."""
    import socket

    cp = tmp_path / "cp"
    cp.mkdir()
    listening = []
    for name in ("816dc54f19", "0a1b2c3d4e"):
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(cp / name))
        listening.append(s)
    (cp / "not-a-socket").write_text("")
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append(argv))
    try:
        asked = playbook.close_control_masters(cp)
    finally:
        for s in listening:
            s.close()
    assert asked == [str(cp / "0a1b2c3d4e"), str(cp / "816dc54f19")]
    assert [c[:2] + c[3:5] for c in calls] == [["ssh", "-o", "-O", "exit"]] * 2
    assert [c[2] for c in calls] == [f"ControlPath={a}" for a in asked]
    assert playbook.close_control_masters(tmp_path / "gone") == []
