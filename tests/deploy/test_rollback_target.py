"""`opsctl rollback --to RELEASE`: which targets are refused before the lock, on plain data."""
from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.config import load_inventory
from opsctl.errors import ConfigError
from opsctl.flow.promote import _rollback_target
from opsctl.releases import HostState, ReleaseInfo

HOST = load_inventory(Path(__file__).resolve().parents[2] / "inventories/blackwell").hosts["blackwell"]


def host_state() -> HostState:
    rels = {r: ReleaseInfo(r, {"profile": {"name": r.split("-")[0]}}) for r in ("ar-1", "dd-2", "dd-3")}
    return HostState(current="dd-3", releases=rels, ledger=[
        {"action": "promote", "result": "ok", "to_release": "ar-1"},
        {"action": "verdict", "status": "fail", "result": "failed", "release": "dd-2", "to_release": "dd-2",
         "reason": "C=8: -75.9 % (needs >= +5.0 %)", "ts": "2026-12-01T10:00:00Z"},
        {"action": "rollback", "result": "ok", "from_release": "dd-2", "to_release": "ar-1", "automatic": True},
        {"action": "verdict", "status": "pass", "result": "ok", "release": "dd-3", "to_release": "dd-3"},
        {"action": "promote", "result": "ok", "to_release": "dd-3"}])


def test_rollback_to_a_gate_failed_release_is_refused_naming_its_verdict():
    with pytest.raises(ConfigError) as exc:
        _rollback_target(HOST, host_state(), "dd-2")
    e = exc.value
    assert e.exit_code == 2
    assert "dd-2" in e.problem and "failed its gate" in e.problem and "verdict fail" in e.problem
    assert "-75.9 %" in e.problem and "--force" in e.fix and "\n" not in e.one_line()


def test_forced_rollback_to_a_gate_failed_release_is_allowed_and_others_need_no_force():
    assert _rollback_target(HOST, host_state(), "dd-2", force=True) == "dd-2"
    assert _rollback_target(HOST, host_state(), "ar-1") == "ar-1"
    assert _rollback_target(HOST, host_state(), None) == "ar-1"  # the last good: never the failed dd-2


def test_the_fallback_chain_starts_with_what_served_last_and_ends_with_the_baseline():
    from opsctl.flow.promote import fallback_releases

    names = ("ar-tp8-1", "ddtree-b5", "ddtree-b11", "ddtree-b13")
    rels = {r: ReleaseInfo(r, {"profile": {"name": r.rsplit("-", 1)[0] if r.startswith("ar") else "ddtree"}},
                           ) for r in names}
    state = HostState(current="ddtree-b13", releases=rels, ledger=[
        {"action": "promote", "result": "ok", "to_release": "ar-tp8-1"},
        {"action": "promote", "result": "ok", "to_release": "ddtree-b5"},
        {"action": "rollback", "result": "ok", "to_release": "ar-tp8-1"},   # the baseline served last
        {"action": "promote", "result": "ok", "to_release": "ddtree-b11"}])
    assert HOST.baseline_profile == "ar-tp8"
    assert fallback_releases(state, HOST, exclude="ddtree-b13") == ["ddtree-b11", "ddtree-b5", "ar-tp8-1"]
    assert fallback_releases(state, HOST, exclude="ddtree-b13", limit=2) == ["ddtree-b11", "ar-tp8-1"]
    assert fallback_releases(state, HOST, exclude="ar-tp8-1") == ["ddtree-b11", "ddtree-b5"]
    # the baseline served last (rolled back to it, then a new release failed): it goes first
    state.ledger.append({"action": "rollback", "result": "ok", "to_release": "ar-tp8-1"})
    assert fallback_releases(state, HOST, exclude="ddtree-b13") == ["ar-tp8-1", "ddtree-b11", "ddtree-b5"]


def test_a_live_release_that_never_became_ready_can_be_rolled_back_to_again():
    """A revert whose start failed leaves its target live but not serving: `rollback --to baseline`
    (or --to it by name) starts it again once the operator fixed the cause; a serving one is refused."""
    rels = {r: ReleaseInfo(r, {"profile": {"name": "ar-tp8" if r.startswith("ar") else "ddtree"}})
            for r in ("ar-tp8-1", "ddtree-b13")}
    state = HostState(current="ar-tp8-1", releases=rels, ledger=[
        {"action": "promote", "result": "ok", "to_release": "ar-tp8-1"},
        {"action": "deploy", "result": "started", "to_release": "ddtree-b13"},
        {"action": "rollback", "result": "failed", "switched": True, "from_release": "ddtree-b13",
         "to_release": "ar-tp8-1", "reason": "guard-timeout", "error": "not ready within 120 s"}])
    assert state.live_not_ready() is not None
    assert _rollback_target(HOST, state, "baseline") == "ar-tp8-1"
    assert _rollback_target(HOST, state, "ar-tp8-1") == "ar-tp8-1"
    state.ledger.append({"action": "rollback", "result": "ok", "to_release": "ar-tp8-1"})
    for to in ("baseline", "ar-tp8-1"):
        with pytest.raises(ConfigError, match="already live"):
            _rollback_target(HOST, state, to)
