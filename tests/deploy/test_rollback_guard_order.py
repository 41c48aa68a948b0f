"""Issue #32 item 2: a rollback never disarms the guard before it has switched back, so a
controller killed mid-rollback leaves the guard to put the last good release back."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from opsctl.errors import DeployFailed, HostError
from opsctl.flow import promote
from opsctl.flow.steps import Steps
from opsctl.integrity import Integrity


@pytest.fixture
def calls(monkeypatch):
    log: list[str] = []
    monkeypatch.setattr(promote, "disarm_guard", lambda conn, host: log.append("disarm"))
    monkeypatch.setattr(promote, "switch", lambda conn, host, rel, **kw: log.append(f"switch {rel}") or 0)
    monkeypatch.setattr(promote, "stop_service", lambda conn, host: log.append("stop"))
    monkeypatch.setattr(promote, "wait_ready", lambda *a, **k: log.append("ready") or SimpleNamespace(seconds=1.0))
    monkeypatch.setattr(promote, "release_profile", lambda info, host: None)
    monkeypatch.setattr(promote, "append_ledger",
                        lambda conn, host, rec: log.append(f"ledger {rec['action']} {rec['result']}") or rec)
    monkeypatch.setattr(promote, "check_release_files", lambda conn, host, rel, quick=False: Integrity(rel))
    return log


def _plan():
    return SimpleNamespace(release="ddtree-b16-bad", profile=SimpleNamespace(name="ddtree", budget=16),
                           state=SimpleNamespace(releases={}, good_releases=lambda exclude=None: [],
                                                 baseline=lambda profile: None))


def _roll(target):
    return promote.roll_back_after_failure(object(), SimpleNamespace(name="h", baseline_profile="ar-tp8"), _plan(),
                                           target, "gate failed",
                                           None, Steps(None, "h"))


def test_the_guard_is_disarmed_only_after_the_switch_back(calls):
    _roll("ar-tp8-good")
    assert calls.index("switch ar-tp8-good") < calls.index("disarm")
    assert calls == ["switch ar-tp8-good", "disarm", "ready", "ledger rollback ok"]


def test_a_switch_back_that_fails_leaves_the_guard_armed(calls, monkeypatch):
    def dies(conn, host, rel, **kw):
        calls.append(f"switch {rel}")
        raise HostError("opsctl-switch failed")

    monkeypatch.setattr(promote, "switch", dies)
    with pytest.raises(HostError):
        _roll("ar-tp8-good")
    assert "disarm" not in calls


def test_killed_before_the_switch_leaves_the_guard_armed(calls, monkeypatch):
    class Killed(BaseException):
        pass

    def killed(conn, host, rel, **kw):
        raise Killed()

    monkeypatch.setattr(promote, "switch", killed)
    with pytest.raises(Killed):
        _roll("ar-tp8-good")
    assert "disarm" not in calls


def test_target_not_ready_still_recorded_failed_after_the_switch(calls, monkeypatch):
    def not_ready(*a, **k):
        raise DeployFailed("not ready")

    monkeypatch.setattr(promote, "wait_ready", not_ready)
    out = _roll("ar-tp8-good")
    assert calls == ["switch ar-tp8-good", "disarm", "ledger rollback failed"] and "NOT become ready" in out


def test_nothing_to_go_back_to_stops_then_disarms(calls):
    _roll(None)
    assert calls == ["stop", "disarm", "ledger rollback ok"]


def test_manual_rollback_disarms_after_its_switch(calls, monkeypatch):
    info = SimpleNamespace(profile="ar-tp8", budget=None)
    state = SimpleNamespace(current="ddtree-b16-bad", releases={"ar-tp8-good": info}, gate_failed=lambda r: None,
                            passed_gate=lambda r: True, ledger_lost=False)
    monkeypatch.setattr(promote, "connect", lambda host: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(promote, "read_state", lambda conn, host: state)
    monkeypatch.setattr(promote, "_rollback_target", lambda host, st, to, force=False: "ar-tp8-good")
    monkeypatch.setattr(promote, "HostLock", lambda conn, host, action: _NullLock())
    monkeypatch.setattr(promote, "require_room", lambda conn, host, doing="": None)
    promote.rollback_host(SimpleNamespace(name="h"), None, "manual", None)
    assert calls == ["switch ar-tp8-good", "disarm", "ready", "ledger rollback ok"]


class _NullLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None
