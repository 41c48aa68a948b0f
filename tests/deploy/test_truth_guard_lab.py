"""Rollback you can trust when the fallback itself fails (lab host, issue #32): the guard's revert to a
release that does not start, a revert where nothing starts, a manual rollback whose target does not
start, a rollback without room, a deleted ledger, an edited runtime tree."""
from __future__ import annotations

import json

import pytest

from truthlab import FAST, ROOT, live, ledger, health, wait_until, opsctl, status, Controller, back_on_baseline

pytestmark = pytest.mark.lab


# ---------------------------------------------------------------------------------------------------
# issue #32 items 5, 7, 8, 9: each starts from this module's state (the baseline restored by
# `truth_lab`, releases of the earlier tests on disk) and puts the baseline back at its end.


def _guard_records(lab, new: str) -> list[dict]:
    """The guard's records after the last `started` record of a deploy of a release named new*."""
    recs = ledger(lab)
    start = max(i for i, r in enumerate(recs) if r.get("result") == "started"
                and str(r.get("to_release") or "").startswith(new))
    return [r for r in recs[start:] if r.get("reason") == "guard-timeout"]


_GOOD: dict[str, str] = {}


def _good_ddtree(lab) -> str:
    """A DDTree release made live and the latest good one (budget 11): through its gate the first time
    (a release no gate passed is never good, issue #50), then put back by a rollback (a switch and a
    restart, seconds)."""
    good = _GOOD.get("b11")
    if good is None or lab.run(f"test -d {ROOT}/releases/{good}", check=False).returncode != 0:
        p = opsctl("deploy", "ddtree", "--budget", "11", "--json", "--yes", "--skip-checks", inv=lab.inv)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr
        good = _GOOD["b11"] = json.loads(p.stdout.splitlines()[-1])["outcomes"][0]["release"]
    elif live(lab)["current"] != good:
        p = opsctl("rollback", "--to", good, inv=lab.inv)
        assert p.returncode == 0, p.stderr
    assert status(lab.inv)["last_good"] == good
    return good


# item 5: the guard's revert is `ok` only once the release it switched to is ready
def test_the_guard_records_a_fallback_that_does_not_start_as_failed_and_goes_on_to_the_baseline(truth_lab):
    good = _good_ddtree(truth_lab)
    # every DDTree start fails (capture): the new release, and the guard's first fallback, `good`
    with truth_lab.fault("capture_failure", algorithm="DDTREE"):
        c = Controller("ddtree", "--budget", "13", *FAST, inv=truth_lab.inv)
        c.kill_at("] ready      ...")
        back_on_baseline(truth_lab)   # the guard (15 s): `good` does not start, the baseline does
        assert wait_until(lambda: ledger(truth_lab)[-1].get("result") == "ok", 60)
    recs = _guard_records(truth_lab, "ddtree-b13-")
    # `good` first; other good DDTree releases (up to 2 in all) fail the same way; the baseline last
    assert recs[0]["result"] == "failed" and recs[0]["to_release"] == good and recs[0]["switched"] is True
    assert "capture" in recs[0]["error"].lower() or "restart" in recs[0]["error"], recs[0]
    assert all(r["result"] == "failed" for r in recs[:-1]) and len(recs) <= 3
    assert recs[-1]["result"] == "ok" and recs[-1]["to_release"] == truth_lab.baseline
    assert recs[-1]["tried"] == [r["to_release"] for r in recs[:-1]]
    st = status(truth_lab.inv)
    assert st["release"] == truth_lab.baseline and st["live_not_ready"] is None


def test_a_revert_where_nothing_starts_is_failed_in_the_ledger_and_in_status(truth_lab):
    good = _good_ddtree(truth_lab)
    # nothing starts (no algorithm scope: the baseline fails too)
    with truth_lab.fault("capture_failure"):
        c = Controller("ddtree", "--budget", "13", *FAST, inv=truth_lab.inv)
        c.kill_at("] ready      ...")
        # the guard tries up to 3 (`good`, maybe another good one, the baseline) and records each as failed
        assert wait_until(lambda: truth_lab.run("systemctl is-failed opsctl-guard-sglang-k26.service",
                                                check=False).stdout.strip() == "failed", 180, 1)
        recs = _guard_records(truth_lab, "ddtree-b13-")
        assert recs[0]["to_release"] == good and recs[-1]["to_release"] == truth_lab.baseline
        assert [r["result"] for r in recs] == ["failed"] * len(recs)
        st = status(truth_lab.inv)
        assert st["release"] == truth_lab.baseline and st["live_not_ready"]["reason"] == "guard-timeout"
        p = opsctl("status", inv=truth_lab.inv, timeout=60)
        assert "NOT READY (rollback failed)" in p.stdout and "did NOT become ready" in p.stderr, p.stdout + p.stderr
    p = opsctl("rollback", "--to", "baseline", inv=truth_lab.inv)   # the fault gone: the operator's fix works
    assert p.returncode == 0, p.stderr
    back_on_baseline(truth_lab)
    assert status(truth_lab.inv)["live_not_ready"] is None


def test_a_manual_rollback_whose_target_does_not_start_goes_on_and_says_so(truth_lab):
    good = _good_ddtree(truth_lab)
    assert opsctl("rollback", "--to", "baseline", inv=truth_lab.inv).returncode == 0
    with truth_lab.fault("capture_failure", algorithm="DDTREE"):
        p = opsctl("rollback", "--to", good, inv=truth_lab.inv)
    assert p.returncode == 5, p.stderr
    assert f"rollback to {good} failed" in p.stderr and "serves instead" in p.stderr
    recs = [r for r in ledger(truth_lab) if r.get("reason") == "manual rollback"]
    i = max(k for k, r in enumerate(recs) if r.get("to_release") == good)
    assert recs[i]["result"] == "failed" and recs[-1]["result"] == "ok"
    assert recs[-1]["to_release"] == truth_lab.baseline   # the other good DDTree releases fail the same way
    back_on_baseline(truth_lab)


# issue #50 item 1: a release no gate passed is not good: not last good, --force for `rollback --to`,
# skipped by a plain rollback and by the guard's chain, "judged": false in status
def test_a_no_gate_release_is_never_good_and_neither_rollback_nor_the_guard_goes_to_it(truth_lab):
    good = _good_ddtree(truth_lab)
    p = opsctl("deploy", "ddtree", "--budget", "9", "--json", *FAST, inv=truth_lab.inv)
    assert p.returncode == 0, p.stderr
    nogate = json.loads(p.stdout.splitlines()[-1])["outcomes"][0]["release"]
    rec = ledger(truth_lab)[-1]
    assert rec["action"] == "promote" and rec["to_release"] == nogate and rec["gated"] is False, rec
    st = status(truth_lab.inv)
    assert st["release"] == nogate and st["judged"] is False and st["never_judged"] == "deployed with --no-gate"
    assert st["last_good"] == good
    p = opsctl("status", inv=truth_lab.inv, timeout=60)
    assert f"{nogate} was never judged (deployed with --no-gate); the last good release is {good}" in p.stdout
    # the same --no-gate deploy again changes nothing (no restart)
    pid = live(truth_lab)["pid"]
    p = opsctl("deploy", "ddtree", "--budget", "9", "--json", *FAST, inv=truth_lab.inv)
    assert p.returncode == 0 and json.loads(p.stdout.splitlines()[-1])["outcomes"][0]["result"] == "unchanged"
    assert live(truth_lab)["pid"] == pid
    # a plain rollback goes to the last release that passed its gate
    p = opsctl("rollback", inv=truth_lab.inv)
    assert p.returncode == 0, p.stderr
    assert live(truth_lab)["current"] == good
    # --to it: refused in one line, nothing changed; forced: it serves, recorded forced, still not good
    n = len(ledger(truth_lab))
    p = opsctl("rollback", "--to", nogate, inv=truth_lab.inv)
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(err) == 1, p.stderr
    assert f"release {nogate} on lab was never judged (deployed with --no-gate)" in err[0] and "--force" in err[0]
    assert live(truth_lab)["current"] == good and len(ledger(truth_lab)) == n
    p = opsctl("rollback", "--to", nogate, "--force", inv=truth_lab.inv)
    assert p.returncode == 0, p.stderr
    assert "forced: it was never judged (deployed with --no-gate), so it is not last good" in p.stdout + p.stderr
    rec = ledger(truth_lab)[-1]
    assert rec["to_release"] == nogate and rec["forced"] is True and rec["never_judged"] == "deployed with --no-gate"
    st = status(truth_lab.inv)
    assert st["release"] == nogate and st["judged"] is False and st["last_good"] == good
    # the guard of a deploy killed after its switch: its chain is the judged release, then the baseline,
    # never the release that served before the deploy (no gate passed it)
    with truth_lab.fault("capture_failure", algorithm="DDTREE"):
        c = Controller("ddtree", "--budget", "13", *FAST, inv=truth_lab.inv)
        c.kill_at("] ready      ...")
        back_on_baseline(truth_lab)
        assert wait_until(lambda: ledger(truth_lab)[-1].get("result") == "ok", 60)
    started = [r for r in ledger(truth_lab) if r.get("result") == "started"][-1]
    assert started["from_release"] == nogate and started["fallback"] == good
    recs = _guard_records(truth_lab, "ddtree-b13-")
    assert [(r["to_release"], r["result"]) for r in recs] == [(good, "failed"), (truth_lab.baseline, "ok")], recs
    # a plain rollback from the baseline skips the no-gate release the ledger names more recently
    p = opsctl("rollback", inv=truth_lab.inv)
    assert p.returncode == 0, p.stderr
    assert live(truth_lab)["current"] == good
    assert opsctl("rollback", "--to", "baseline", inv=truth_lab.inv).returncode == 0
    back_on_baseline(truth_lab)


# issue #50 item 3: every fallback failing, the guard starts again the release that served when it began
def test_every_fallback_failing_the_guard_restarts_the_release_that_served_and_says_so(truth_lab):
    good = _good_ddtree(truth_lab)
    env = f"{ROOT}/releases/{truth_lab.baseline}/sglang.env"
    c = Controller("ddtree", "--budget", "12", "--yes", "--skip-checks", inv=truth_lab.inv)
    c.kill_at("] validate   ...")   # the new release started and serves; nobody confirms it
    new = live(truth_lab)["current"]
    assert new.startswith("ddtree-b12-") and health(truth_lab) == 200
    # before the guard fires (15 s): `good` cannot start (the fault hits its 12 draft tokens, not the new
    # release's 13) and the baseline's files differ from its manifest (never switched to)
    truth_lab.run(f"cp -p {env} /root/base.env.keep && echo '# edited' >> {env}", check=True)
    try:
        with truth_lab.fault("capture_failure", algorithm="DDTREE", num_draft_tokens=12):
            assert wait_until(lambda: any(r.get("last_resort") for r in ledger(truth_lab)[-3:]), 240, 1), \
                ledger(truth_lab)[-4:]
    finally:
        truth_lab.run(f"mv /root/base.env.keep {env}", check=True)
    recs = _guard_records(truth_lab, "ddtree-b12-")
    assert [(r["to_release"], r["result"]) for r in recs] == \
        [(good, "failed"), (truth_lab.baseline, "failed"), (new, "ok")], recs
    assert recs[1]["switched"] is False and recs[-1]["last_resort"] is True
    assert recs[-1]["tried"] == [good, truth_lab.baseline] and recs[-1]["from_release"] == good
    assert live(truth_lab)["current"] == new and health(truth_lab) == 200
    st = status(truth_lab.inv)
    assert st["release"] == new and st["live_not_ready"] is None and st["judged"] is False
    assert st["last_resort"]["tried"] == [good, truth_lab.baseline] and st["last_good"] == good
    p = opsctl("status", inv=truth_lab.inv, timeout=60)
    assert f"{new} serves as the deploy guard's last resort" in p.stdout, p.stdout
    assert opsctl("rollback", "--to", "baseline", inv=truth_lab.inv).returncode == 0
    back_on_baseline(truth_lab)


# item 7: no room for a switch: refused before anything changes (the lab's overlay, a 4 GiB tmpfs, filled
# to 8 MiB free for the length of the test: RAM-backed, removed in `finally`)
def test_a_rollback_without_room_on_the_disk_changes_nothing(truth_lab, snapshot):
    good = _good_ddtree(truth_lab)
    free = int(truth_lab.run(f"df -P -B1 {ROOT} | awk 'NR==2 {{print $4}}'").stdout)
    before = snapshot(truth_lab)
    n_ledger = len(ledger(truth_lab))
    try:
        truth_lab.run(f"fallocate -l {free - (8 << 20)} /var/tmp/opsctl-fill", check=True)
        p = opsctl("rollback", "--to", "baseline", inv=truth_lab.inv)
        assert p.returncode == 3, p.stderr
        assert "MiB free under /opt/opsctl" in p.stderr and "nothing was switched" in p.stderr
        assert len([x for x in p.stderr.splitlines() if x.strip()]) == 1
        assert live(truth_lab)["current"] == good and len(ledger(truth_lab)) == n_ledger
        assert snapshot(truth_lab) == before
    finally:
        truth_lab.run("rm -f /var/tmp/opsctl-fill")
    p = opsctl("rollback", "--to", "baseline", inv=truth_lab.inv)   # room again: it goes ahead
    assert p.returncode == 0, p.stderr
    back_on_baseline(truth_lab)


# item 8: a deleted ledger is reported as such, with the releases on disk
def test_a_deleted_ledger_is_reported_by_status_and_rollback(truth_lab):
    _good_ddtree(truth_lab)   # something other than the baseline live, to roll back from
    truth_lab.run(f"mv {ROOT}/ledger.jsonl /root/ledger.jsonl.keep", check=True)
    try:
        st = status(truth_lab.inv)
        assert st["ledger"]["lost"] is True and st["ledger"]["exists"] is False
        on_disk = truth_lab.run(f"cd {ROOT}/releases && ls -d */manifest.json | cut -d/ -f1").stdout.split()
        assert sorted(r["id"] for r in st["releases_on_disk"]) == sorted(on_disk) and len(on_disk) >= 2
        p = opsctl("status", inv=truth_lab.inv, timeout=60)
        assert "ledger.jsonl on lab is missing" in p.stderr and "opsctl rollback --to RELEASE" in p.stderr
        assert "unknown (ledger missing)" in p.stdout and "never judged" not in p.stdout
        p = opsctl("rollback", inv=truth_lab.inv)
        assert p.returncode == 2 and "is missing (deleted?)" in p.stderr and on_disk[0] in p.stderr, p.stderr
        assert "(fix: pick one of them: 'opsctl rollback --to RELEASE'" in p.stderr
        # named (without the ledger, "baseline" would mean the newest ar-tp8 release on disk)
        p = opsctl("rollback", "--to", truth_lab.baseline, inv=truth_lab.inv)
        assert p.returncode == 0, p.stderr
        assert [r["action"] for r in ledger(truth_lab)] == ["switch", "rollback"]   # a new ledger starts (the switch's gap, then the rollback)
    finally:
        truth_lab.run(f"cat {ROOT}/ledger.jsonl >> /root/ledger.jsonl.keep 2>/dev/null; "
                      f"mv /root/ledger.jsonl.keep {ROOT}/ledger.jsonl")
    back_on_baseline(truth_lab)


# item 9: an edit to a staged release's runtime code: check post, rollback and deploy see it
def test_an_edited_runtime_tree_is_refused_by_rollback_and_staged_again_by_deploy(truth_lab):
    p = opsctl("deploy", "ddtree", "--budget", "11", "--json", *FAST, inv=truth_lab.inv)
    assert p.returncode == 0, p.stderr
    dd = json.loads(p.stdout.splitlines()[-1])["outcomes"][0]["release"]
    tree = f"{ROOT}/releases/{dd}/site/sglang_ddtree/tree.py"
    truth_lab.run(f"echo '# edited on the host' >> {tree}", check=True)
    p = opsctl("check", "post", inv=truth_lab.inv)
    assert p.returncode == 6 and "site/sglang_ddtree/tree.py" in p.stdout + p.stderr, p.stdout + p.stderr
    assert opsctl("rollback", "--to", "baseline", inv=truth_lab.inv).returncode == 0
    n = len(ledger(truth_lab))
    p = opsctl("rollback", "--to", dd, inv=truth_lab.inv)
    assert p.returncode == 6, p.stderr
    assert "differs from its manifest: site/sglang_ddtree/tree.py" in p.stderr and "nothing was switched" in p.stderr
    assert live(truth_lab)["current"] == truth_lab.baseline and len(ledger(truth_lab)) == n
    p = opsctl("deploy", "ddtree", "--budget", "11", "--dry-run", inv=truth_lab.inv)
    assert "differs from its manifest" in p.stdout and "stage it again" in p.stdout, p.stdout
    p = opsctl("deploy", "ddtree", "--budget", "11", "--json", *FAST, inv=truth_lab.inv)
    assert p.returncode == 0, p.stderr
    assert "edited on the host" not in truth_lab.run(f"cat {tree}").stdout
    assert opsctl("check", "post", inv=truth_lab.inv).returncode == 0
    assert opsctl("rollback", "--to", "baseline", inv=truth_lab.inv).returncode == 0
