"""Issue #32 item 1: the watch's deploy lock is released on every path, a full disk included."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess

import pytest

from opsctl.onhost import watch_agent as agent


def _lock_is_free(root) -> bool:
    fd = os.open(os.path.join(root, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the probe's own lock


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_holder_write_keeps_the_lock_until_release(tmp_path, monkeypatch):
    (tmp_path / ".lock.holder").write_text(json.dumps({"who": "gone@ctl", "pid": 1, "action": "deploy"}))
    monkeypatch.setattr(agent, "_write_atomic", _enospc)
    lock = agent.HostLock(str(tmp_path), "watch rollback")
    assert lock.acquire(wait_s=0.5) is True      # the rollback still goes ahead
    assert not _lock_is_free(tmp_path)
    assert not (tmp_path / ".lock.holder").exists()   # no stale holder naming a finished deploy
    lock.release()
    assert _lock_is_free(tmp_path)


def test_an_unexpected_error_after_the_flock_releases_it(tmp_path, monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(agent.HostLock, "_write_holder", boom)
    lock = agent.HostLock(str(tmp_path), "watch rollback")
    with pytest.raises(RuntimeError):
        lock.acquire(wait_s=0.5)
    assert lock.fd is None and _lock_is_free(tmp_path)


def test_busy_lock_returns_false_and_leaks_nothing(tmp_path):
    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        lock = agent.HostLock(str(tmp_path), "watch rollback")
        assert lock.acquire(wait_s=0.3) is False and lock.fd is None
    finally:
        os.close(fd)
    assert _lock_is_free(tmp_path)


def test_release_clears_its_own_holder_only(tmp_path):
    lock = agent.HostLock(str(tmp_path), "watch rollback")
    assert lock.acquire(wait_s=0.5)
    assert json.loads((tmp_path / ".lock.holder").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / ".lock.holder").exists() and _lock_is_free(tmp_path)


def test_watch_rollback_on_a_full_disk_leaves_the_lock_free(tmp_path, monkeypatch):
    """A breach while the disk is full: the switch runs, the ledger append fails with ENOSPC; the
    tick fails, but the next deploy or rollback can take the lock."""
    root = tmp_path / "root"
    root.mkdir()
    cfg = {"root": str(root), "unit": "sglang-k26.service", "service": "sglang-k26", "port": 1,
           "state_dir": str(tmp_path / "state"), "host": "h", "mode": "rollback", "window_s": 60, "interval_s": 15,
           "baseline_profile": "ar-tp8", "ready_timeout_s": 5, "notify": {}}
    w = agent.Watch(cfg)
    w.state["last"] = {}
    monkeypatch.setattr(agent, "_write_atomic", _enospc)
    monkeypatch.setattr(agent, "_run", lambda argv, timeout=30, **kw: subprocess.CompletedProcess(argv, 0, "", ""))
    monkeypatch.setattr(agent.Watch, "wait_ready", lambda self, since, timeout: (1.0, None))
    monkeypatch.setattr(agent, "append_ledger", _enospc)
    manifests = {"base-1": {"profile": {"name": "ar-tp8"}, "created_at": "1"},
                 "dd-2": {"profile": {"name": "ddtree", "budget": 16}, "created_at": "2"}}
    with pytest.raises(OSError):
        w.act("dd-2", manifests["dd-2"], manifests, [], [{"rule": "accept_len", "status": "breach", "detail": "1.2 < 2.0"}], 0.0)
    assert _lock_is_free(root)


def test_status_says_failing_when_ticks_stop_completing(monkeypatch):
    """The state file keeps the last tick that worked; `watch status` must not show it as now."""
    cfg = {"service": "sglang-k26", "interval_s": 5}
    journal = "opsctl-watch: tick failed: OSError: [Errno 28] No space left on device\n"
    monkeypatch.setattr(agent, "_run", lambda argv, timeout=30, **kw: subprocess.CompletedProcess(argv, 0, journal, ""))
    st = {"last": {"ts": 1000.0, "state": "idle"}}
    assert agent._failing(cfg, st, {"ActiveState": "active"}, now=1010.0) is None     # within 3 intervals
    f = agent._failing(cfg, st, {"ActiveState": "active"}, now=1100.0)
    assert f["seconds"] == 100.0 and "No space left on device" in f["error"]
    assert agent._failing(cfg, st, {"ActiveState": "failed"}, now=1100.0) is None     # down: said otherwise
    from opsctl.watch import summary
    assert summary({"unit": {"ActiveState": "active"}, "last": st["last"], "failing": f})["state"] == "failing"
    assert summary({"unit": {"ActiveState": "active"}, "last": st["last"], "failing": None})["state"] == "idle"


def test_no_room_means_no_drain_no_switch_and_no_trip(tmp_path, monkeypatch):
    """A breach on a full disk: the watch neither drains nor switches (a drained server whose switch
    then failed left it tripped on a failed rollback, for good); the tick fails and the next one,
    with room again, acts."""
    root = tmp_path / "root"
    root.mkdir()
    cfg = {"root": str(root), "unit": "sglang-k26.service", "service": "sglang-k26", "port": 1,
           "state_dir": str(tmp_path / "state"), "host": "h", "mode": "rollback", "window_s": 60, "interval_s": 15,
           "baseline_profile": "ar-tp8", "ready_timeout_s": 5, "notify": {}}
    w = agent.Watch(cfg)
    w.state["last"] = {}
    calls = []
    real_statvfs = os.statvfs
    full = type("Full", (), {"f_bavail": 8, "f_frsize": 1 << 20})()     # 8 MiB free
    monkeypatch.setattr(agent.os, "statvfs", lambda p: full if str(p) == str(root) else real_statvfs(p))
    monkeypatch.setattr(agent, "drain_server", lambda *a, **k: calls.append("drain") or {})
    monkeypatch.setattr(agent, "_run", lambda argv, timeout=30, **kw: calls.append("switch")
                        or subprocess.CompletedProcess(argv, 0, "", ""))
    monkeypatch.setattr(agent, "append_ledger", lambda *a, **k: calls.append("ledger") or {})
    manifests = {"base-1": {"profile": {"name": "ar-tp8"}, "created_at": "1"},
                 "dd-2": {"profile": {"name": "ddtree", "budget": 16}, "created_at": "2"}}
    breach = [{"rule": "accept_len", "status": "breach", "detail": "1.2 < 2.0"}]
    with pytest.raises(OSError) as e:
        w.act("dd-2", manifests["dd-2"], manifests, [], breach, 0.0)
    assert e.value.errno == errno.ENOSPC and "No space left on device" in str(e.value)
    assert calls == [] and not w.state.get("tripped") and _lock_is_free(root)
    assert "8 MiB free" in w.state["last"]["note"]


def test_a_watch_rollback_is_signed_with_the_inventorys_host_name(tmp_path, monkeypatch):
    """docs/watch.md: `opsctl-watch@<host>`, the inventory's name (as the guard signs `opsctl-guard@<host>`),
    in the ledger record and in the lock holder a refused deploy names; not the machine's hostname (#50)."""
    root = tmp_path / "root"
    root.mkdir()
    cfg = {"root": str(root), "unit": "sglang-k26.service", "service": "sglang-k26", "port": 1,
           "state_dir": str(tmp_path / "state"), "host": "blackwell", "mode": "rollback", "window_s": 60,
           "interval_s": 15, "baseline_profile": "ar-tp8", "ready_timeout_s": 5, "notify": {}}
    w = agent.Watch(cfg)
    w.state["last"] = {}
    records, holders = [], []
    real_write = agent.HostLock._write_holder

    def write_holder(self):
        real_write(self)
        holders.append(json.loads((root / ".lock.holder").read_text())["who"])

    monkeypatch.setattr(agent.HostLock, "_write_holder", write_holder)
    monkeypatch.setattr(agent, "drain_server", lambda *a, **k: {"drain_s": 0.0, "inflight_at_start": 0, "aborted": 0})
    monkeypatch.setattr(agent, "_run", lambda argv, timeout=30, **kw: subprocess.CompletedProcess(argv, 0, "", ""))
    monkeypatch.setattr(agent.Watch, "wait_ready", lambda self, since, timeout: (1.0, None))
    monkeypatch.setattr(agent, "append_ledger", lambda r, rec: records.append(rec) or rec)
    monkeypatch.setattr(agent.socket, "gethostname", lambda: "gpuhost")
    manifests = {"base-1": {"profile": {"name": "ar-tp8"}, "created_at": "1"},
                 "dd-2": {"profile": {"name": "ddtree", "budget": 16}, "created_at": "2"}}
    w.act("dd-2", manifests["dd-2"], manifests, [], [{"rule": "accept_len", "status": "breach", "detail": "1.2 < 2.0"}],
          0.0)
    rollback = [r for r in records if r.get("action") == "rollback"]
    assert rollback and rollback[-1]["who"] == "opsctl-watch@blackwell" and rollback[-1]["host"] == "blackwell"
    assert holders == ["opsctl-watch@blackwell"]
