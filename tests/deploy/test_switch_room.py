"""Issue #32 item 7: free space is checked on the host before any switch (deploy, rollback, the
guard's revert): without room for the switch and its ledger records it is refused before
anything changes, so the live release and the ledger never disagree."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hostdirs import REPO, current, host_config, install_programs, make_current, read_ledger, release
from opsctl.errors import HostError
from opsctl.flow import deploy, promote, switch as switch_mod
from opsctl.flow.steps import Steps
from opsctl.host.connection import Result


class FullDisk:
    """A connection to a host whose install root has FREE bytes left: it answers df, records the rest."""

    def __init__(self, free: int):
        self.free, self.commands = free, []

    def run(self, command, *, check=True, timeout=None, stdin=None, on_stderr_line=None):
        self.commands.append(command)
        out = f"{self.free}\n" if "df -P -B1" in command else "1767000000\n" if command == "date +%s" else ""
        return Result(command, 0, out, "", 0.0, "lab")

    def close(self):
        pass


def _host():
    return SimpleNamespace(name="lab", install_root=Path("/opt/opsctl"), service_name="sglang-k26",
                           unit_name="sglang-k26.service", baseline_profile="ar-tp8")


def test_a_switch_without_room_is_refused_before_opsctl_switch_runs():
    conn = FullDisk(2 << 20)
    with pytest.raises(HostError) as exc:
        switch_mod.switch(conn, _host(), "ar-tp8-base")
    assert exc.value.exit_code == 3
    line = exc.value.one_line()
    assert "2.0 MiB free under /opt/opsctl" in line and "needs 16 MiB" in line and "nothing was switched" in line
    assert "(fix: free space under /opt/opsctl" in line and "\n" not in line
    assert not any("opsctl-switch" in c for c in conn.commands)


def test_a_switch_with_room_goes_ahead():
    conn = FullDisk(1 << 30)
    switch_mod.switch(conn, _host(), "ar-tp8-base")
    assert any("bin/opsctl-switch" in c for c in conn.commands)


def test_a_manual_rollback_without_room_is_refused_before_the_lock_and_records_nothing(monkeypatch):
    state = SimpleNamespace(current="ddtree-b8-new", releases={"ar-tp8-base": object()}, gate_failed=lambda r: None)
    conn = FullDisk(1 << 20)
    monkeypatch.setattr(promote, "connect", lambda host: conn)
    monkeypatch.setattr(promote, "read_state", lambda c, host: state)
    monkeypatch.setattr(promote, "_rollback_target", lambda host, st, to, force=False: "ar-tp8-base")

    def no_lock(*a):
        raise AssertionError("the lock is taken only once the rollback can go ahead")

    monkeypatch.setattr(promote, "HostLock", no_lock)
    monkeypatch.setattr(promote, "append_ledger", no_lock)
    with pytest.raises(HostError, match="the rollback needs 16 MiB"):
        promote.rollback_host(_host(), None, "manual", None)


def test_a_deploy_without_room_for_its_switch_records_and_arms_nothing(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(deploy, "append_ledger", lambda c, h, rec: calls.append(rec["result"]))
    monkeypatch.setattr(deploy, "arm_guard", lambda *a, **k: calls.append("arm"))
    monkeypatch.setattr(deploy, "fallback_releases", lambda state, host, exclude: ["ar-tp8-base"])
    plan = SimpleNamespace(release="ddtree-b8-new", previous="ar-tp8-base", is_live=False, repairs=[],
                           state=SimpleNamespace(judged=lambda r: False), triton_outcome=None,
                           profile=SimpleNamespace(name="ddtree", budget=8, readiness_timeout_s=60))
    host = SimpleNamespace(**vars(_host()), settings=SimpleNamespace(guard_s=None))
    with pytest.raises(HostError, match="the switch of this deploy needs 64 MiB"):
        deploy._apply(FullDisk(10 << 20), None, host, plan.profile, plan, Steps(None, "lab"), True,
                      staged=(SimpleNamespace(changed=False), None))
    assert calls == []   # no `started` record, no guard: nothing to undo


def test_the_host_switch_refuses_without_room_and_changes_nothing(tmp_path):
    root = tmp_path / "root"
    release(root, "ar-tp8-base")
    release(root, "ddtree-b8-new", "ddtree")
    make_current(root, "ddtree-b8-new")
    install_programs(root, ("opsctl-switch", "opsctl-ledger-append"))
    res = subprocess.run([str(root / "bin/opsctl-switch"), str(root), "sglang-k26", "ar-tp8-base", "guard-timeout",
                          "lab"], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "OPSCTL_SWITCH_MIN_FREE": str(1 << 60)})
    assert res.returncode == 28, res.stderr
    assert "MiB free under" in res.stderr and "nothing switched" in res.stderr
    assert current(root) == "ddtree-b8-new" and read_ledger(root) == []


def test_the_host_switch_and_the_controller_agree_on_the_room_a_switch_needs():
    text = (REPO / "playbooks/files/opsctl-switch").read_text()
    assert int(re.search(r"OPSCTL_SWITCH_MIN_FREE:-(\d+)", text).group(1)) == switch_mod.SWITCH_ROOM


def test_the_guard_passes_the_room_to_its_switch(tmp_path):
    host = host_config(tmp_path, tmp_path / "root")
    sent: list[str] = []
    switch_mod.arm_guard(SimpleNamespace(run=lambda cmd, check=True: sent.append(cmd)), host, ["ar-tp8-base"], 30,
                         expect="ddtree-b8-new")
    assert f"--min-free {switch_mod.SWITCH_ROOM}" in sent[0]
