"""Which release is "last good": facts from the ledger, on plain data."""
from opsctl.releases import HostState, ReleaseInfo


def state(*recs):
    rels = {r: ReleaseInfo(r, {"profile": {"name": r.split("-")[0]}}) for r in ("ar-1", "dd-2", "dd-3")}
    return HostState(current="ar-1", releases=rels, ledger=list(recs))


def test_an_interrupted_or_trial_release_is_never_last_good():
    s = state({"action": "promote", "result": "ok", "to_release": "ar-1"},
              {"action": "deploy", "result": "interrupted", "switched": True, "to_release": "dd-2"},
              {"action": "deploy", "result": "trial", "to_release": "dd-3"})
    assert s.last_good() == "ar-1" and not s.judged("dd-2") and not s.judged("dd-3")


def test_a_release_the_watch_rolled_back_from_is_not_last_good_until_promoted_again():
    recs = [{"action": "promote", "result": "ok", "to_release": "ar-1"},
            {"action": "promote", "result": "ok", "to_release": "dd-2"},
            {"action": "rollback", "result": "ok", "from_release": "dd-2", "to_release": "ar-1", "watch": {"rule": "x"}}]
    assert state(*recs).last_good(exclude="ar-1") is None
    assert state(*recs, {"action": "promote", "result": "ok", "to_release": "dd-2"}).last_good(exclude="ar-1") == "dd-2"


FAILED = {"action": "verdict", "status": "fail", "result": "failed", "release": "dd-2", "to_release": "dd-2",
          "reason": "C=8: -75.9 %", "ts": "2026-12-01T10:00:00Z"}


def test_a_release_whose_gate_failed_is_never_last_good_even_after_a_forced_rollback_to_it():
    recs = [{"action": "promote", "result": "ok", "to_release": "ar-1"},
            {"action": "deploy", "result": "started", "to_release": "dd-2"},
            FAILED,
            {"action": "rollback", "result": "ok", "from_release": "dd-2", "to_release": "ar-1", "automatic": True},
            {"action": "rollback", "result": "ok", "from_release": "ar-1", "to_release": "dd-2", "forced": True,
             "verdict": "fail"}]
    s = state(*recs)
    s.current = "dd-2"
    assert s.gate_failed("dd-2") == FAILED and s.gate_failed("ar-1") is None
    assert s.last_good() == "ar-1" and s.last_good(exclude="dd-2") == "ar-1"
    assert not s.judged("dd-2")
    # even an unforced rollback record (an older controller's) does not make a failed release good
    unforced = dict(recs[-1])
    unforced.pop("forced")
    assert state(*recs[:-1], unforced).last_good() == "ar-1"


def test_a_release_that_failed_and_later_passed_its_gate_is_good_again():
    passed = {**FAILED, "status": "pass", "result": "ok"}
    s = state({"action": "promote", "result": "ok", "to_release": "ar-1"}, FAILED,
              {"action": "rollback", "result": "ok", "to_release": "ar-1"}, passed,
              {"action": "promote", "result": "ok", "to_release": "dd-2"})
    assert s.gate_failed("dd-2") is None and s.last_good() == "dd-2" and s.judged("dd-2")


def test_the_ctrl_c_restore_goes_to_the_last_passed_release_not_a_forced_one():
    from opsctl.config import load_inventory
    from opsctl.flow.promote import fallback_release
    from pathlib import Path

    host = load_inventory(Path(__file__).resolve().parents[2] / "inventories/blackwell").hosts["blackwell"]
    s = state({"action": "promote", "result": "ok", "to_release": "ar-1"}, FAILED,
              {"action": "rollback", "result": "ok", "from_release": "ar-1", "to_release": "dd-2", "forced": True})
    s.current = "dd-2"
    assert fallback_release(s, host, exclude="dd-3") == "ar-1"  # a deploy of dd-3 interrupted after its switch
