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


# issue #50: a release no gate passed is not good
NOGATE = {"action": "promote", "result": "ok", "to_release": "dd-2", "reason": "gates skipped (--no-gate)",
          "gated": False}


def never_judged_state(*recs) -> HostState:
    rels = {r: ReleaseInfo(r, {"profile": {"name": "ar-tp8" if r.startswith("ar") else "ddtree"}})
            for r in ("ar-1", "dd-2", "dd-3", "dd-4")}
    rels["dd-4"] = ReleaseInfo("dd-4", {"profile": {"name": "ddtree", "trial_set": ["4", "8"]}})
    return HostState(current="dd-3", releases=rels, ledger=[
        {"action": "promote", "result": "ok", "to_release": "ar-1", "reason": "gates passed"}, NOGATE,
        {"action": "deploy", "result": "trial", "trial": True, "to_release": "dd-4"},
        {"action": "promote", "result": "ok", "to_release": "dd-3", "reason": "gates passed"}, *recs])


@pytest.mark.parametrize("rid,why", [("dd-2", "deployed with --no-gate"), ("dd-4", "a trial release of opsctl tune")])
def test_rollback_to_a_never_judged_release_needs_force_and_stays_not_good(rid, why):
    s = never_judged_state()
    with pytest.raises(ConfigError) as exc:
        _rollback_target(HOST, s, rid)
    assert f"release {rid} on blackwell was never judged ({why})" in exc.value.problem and "--force" in exc.value.fix
    assert _rollback_target(HOST, s, rid, force=True) == rid
    assert _rollback_target(HOST, s, None) == "ar-1"      # a plain rollback skips both
    # served again by a rollback (forced or an older controller's unforced record): still never judged
    s = never_judged_state({"action": "rollback", "result": "ok", "from_release": "dd-3", "to_release": rid})
    s.current = rid
    assert not s.judged(rid) and s.last_good() == "dd-3" and s.good_releases() == ["dd-3", "ar-1"]


def test_the_fallback_chain_of_a_deploy_and_the_guard_holds_only_judged_releases():
    from opsctl.flow.promote import fallback_releases

    s = never_judged_state({"action": "rollback", "result": "ok", "to_release": "dd-4"},
                           {"action": "rollback", "result": "ok", "to_release": "dd-2"})
    assert fallback_releases(s, HOST, exclude="dd-5") == ["dd-3", "ar-1"]
    # the baseline stays the last resort, and `--to` it needs no --force even when it ran no gate
    s.ledger[0] = {**s.ledger[0], "reason": "gates skipped (--no-gate)", "gated": False}
    assert fallback_releases(s, HOST, exclude="dd-5") == ["dd-3", "ar-1"]
    assert _rollback_target(HOST, s, "ar-1") == "ar-1"


def test_a_no_gate_promote_of_older_opsctl_is_recognised_by_its_reason_alone():
    s = never_judged_state()
    s.ledger[1] = {k: v for k, v in NOGATE.items() if k != "gated"}
    s.current = "dd-2"
    assert not s.passed_gate("dd-2") and not s.judged("dd-2") and s.served_ungated("dd-2")
    assert s.never_judged_why("dd-2") == "deployed with --no-gate" and s.judged("dd-3")
