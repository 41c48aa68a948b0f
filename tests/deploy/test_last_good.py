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
