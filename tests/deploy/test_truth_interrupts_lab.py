"""Rollback you can trust when a deploy is cut short (lab host): a missing `current` link, a controller
killed after the switch, a re-run of an unjudged release, a failing deploy after it, the guard waiting
for the host lock, a torn ledger line, no room for a release. The last good release (or the baseline)
serves afterwards and the ledger tells the truth."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from truthlab import FAST, ROOT, live, ledger, health, wait_until, opsctl, status, no_orphans, Controller, back_on_baseline

pytestmark = pytest.mark.lab


# 1. a missing `current` link does not turn a failed deploy into an outage
def test_missing_current_link_a_failed_deploy_goes_back_to_the_last_good(truth_lab):
    truth_lab.run(f"rm -f {ROOT}/current")
    with truth_lab.fault("capture_failure", algorithm="DDTREE"):
        p = opsctl("deploy", "ddtree", "--budget", "3", *FAST, inv=truth_lab.inv)
    assert p.returncode == 5, p.stdout + p.stderr
    assert f"rolled back to {truth_lab.baseline}" in p.stderr
    back_on_baseline(truth_lab)
    rec = ledger(truth_lab)[-1]
    assert rec["action"] == "rollback" and rec["to_release"] == truth_lab.baseline and rec["result"] == "ok", rec


# 2. + kill -9 after the switch: the guard reverts; re-running judges, never "unchanged"
@pytest.mark.parametrize("step", ["ready", "validate", "bench"])
def test_controller_killed_after_the_switch(truth_lab, step):
    slow = {"name": "slow_start", "load_s": 60, "algorithm": "DDTREE"} if step == "ready" else None
    if slow:
        truth_lab.set_fault(slow.pop("name"), **slow)
    try:
        c = Controller("ddtree", "--budget", "4", "--yes", "--skip-checks", inv=truth_lab.inv)
        c.kill_at(f"] {step:<10} ...")
    finally:
        truth_lab.clear_faults()
    assert no_orphans(truth_lab, truth_lab.inv) == ""
    # meanwhile status tells the truth: an unjudged release, an unfinished deploy, no borrowed verdict
    st = status(truth_lab.inv)
    assert st["release"].startswith("ddtree-b4-") and st["judged"] is False
    assert st["deploy_in_progress_or_interrupted"] is True
    assert st["last_verdict"] is None or st["last_verdict"]["release"] == st["release"]
    assert st["last_good"] == truth_lab.baseline
    # the guard (15 s) puts the last good release back by itself, under the inventory's host name
    back_on_baseline(truth_lab)
    # it records `ok` once the release it switched to is ready (issue #32 item 5): a moment after /health
    assert wait_until(lambda: ledger(truth_lab)[-1].get("reason") == "guard-timeout", 30)
    rec = [r for r in ledger(truth_lab) if r.get("reason") == "guard-timeout"][-1]
    assert rec["result"] == "ok" and rec.get("ready_s") is not None
    assert rec["host"] == "lab" and rec["to_release"] == truth_lab.baseline


def test_rerunning_a_deploy_whose_release_is_live_but_unjudged_judges_it(truth_lab, tmp_path):
    inv = tmp_path / "inv"  # a guard long enough that the re-run, not the guard, meets the unjudged release
    shutil.copytree(truth_lab.inv, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("guard_s: 15", "guard_s: 300"))
    with truth_lab.fault("slow_start", load_s=8, algorithm="DDTREE"):
        c = Controller("ddtree", "--budget", "5", *FAST, inv=inv)
        c.kill_at("] ready      ...")
    assert live(truth_lab)["current"].startswith("ddtree-b5-")
    # re-run through the gate: a --no-gate re-run would leave it unjudged (never the last good, issue #50)
    p = opsctl("deploy", "ddtree", "--budget", "5", "--json", "--yes", "--skip-checks", inv=inv)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr
    out = json.loads(p.stdout.splitlines()[-1])["outcomes"][0]
    assert out["result"] == "promoted"  # not "unchanged"
    assert "was never judged (its deploy was interrupted or killed)" in p.stdout + p.stderr
    assert status(inv)["judged"] is True and status(inv)["last_good"] == out["release"]
    # the killed deploy's guard was re-armed by this one and disarmed at promote: it never fires
    timer = truth_lab.run("systemctl is-active opsctl-guard-sglang-k26.timer", check=False).stdout.strip()
    assert timer != "active"
    assert live(truth_lab)["current"] == out["release"]
    truth_lab.last_good = out["release"]


# 3. after an interrupted release, a failing deploy goes to the last good one, not to it
def test_a_failing_deploy_after_an_unjudged_one_goes_to_the_last_good(truth_lab):
    good = live(truth_lab)["current"]
    with truth_lab.fault("slow_start", load_s=60, algorithm="DDTREE"):
        c = Controller("ddtree", "--budget", "6", *FAST, inv=truth_lab.inv)
        c.kill_at("] ready      ...")
    unjudged = live(truth_lab)["current"]
    assert unjudged.startswith("ddtree-b6-")
    # the killed deploy's guard may still hold the host lock (a loaded CI machine: the next deploy was
    # refused with "locked by another opsctl run", exit 4, as it should be): this case starts after it
    assert wait_until(lambda: truth_lab.run(f"flock -n {ROOT}/.lock true", check=False).returncode == 0, 120, 0.5)
    # the fault hits budget 7 only (--speculative-num-draft-tokens 8): `good` (budget 5) still starts,
    # and a rollback records ok only for a release that became ready (issue #32 item 5)
    with truth_lab.fault("capture_failure", algorithm="DDTREE", num_draft_tokens=8):
        p = opsctl("deploy", "ddtree", "--budget", "7", *FAST, inv=truth_lab.inv)
    assert p.returncode == 5
    assert live(truth_lab)["current"] == good and f"rolled back to {good}" in p.stderr
    rec = ledger(truth_lab)[-1]
    assert rec["action"] == "rollback" and rec["to_release"] == good


def test_the_guard_waits_for_the_host_lock(truth_lab):
    good = live(truth_lab)["current"]
    with truth_lab.fault("slow_start", load_s=90, algorithm="DDTREE"):
        c = Controller("ddtree", "--budget", "8", *FAST, inv=truth_lab.inv)
        c.kill_at("] ready      ...")
        # another operator's command holds the host lock past the guard's 15 s
        truth_lab.run(f"systemd-run --quiet --unit opsctl-test-lock-holder flock {ROOT}/.lock sleep 120", check=True)
        try:
            # the guard's timer fired and its switch waits for the lock (flock -w 900): it does not cut in
            assert wait_until(lambda: truth_lab.run("systemctl is-active opsctl-guard-sglang-k26.service",
                                                    check=False).stdout.strip() == "active", 60, 0.5)
            time.sleep(2)
            assert live(truth_lab)["current"].startswith("ddtree-b8-")
        finally:
            # the fault off first (b8 read it at its start): `good`, which the guard starts next, starts
            # healthy, and the guard records ok only once it is ready
            truth_lab.clear_faults()
            truth_lab.run("systemctl stop opsctl-test-lock-holder; systemctl reset-failed opsctl-test-lock-holder; true")
    assert wait_until(lambda: live(truth_lab)["current"] == good, 60, 1)
    # the guard is done (it lets the lock go) once `good` is ready, and says so in the ledger
    assert wait_until(lambda: truth_lab.run("systemctl is-active opsctl-guard-sglang-k26.service",
                                            check=False).stdout.strip() != "active", 60, 0.5), ledger(truth_lab)[-3:]
    rec = ledger(truth_lab)[-1]
    assert rec["action"] == "rollback" and rec["reason"] == "guard-timeout" and rec["result"] == "ok", rec
    assert rec["to_release"] == good


# 4. the ledger cannot be damaged silently
def test_a_torn_or_foreign_ledger_line_is_reported_and_repaired(truth_lab):
    truth_lab.run(f"printf '42\\n' >> {ROOT}/ledger.jsonl; printf '{{\"ts\": \"2026-\"' >> {ROOT}/ledger.jsonl")
    for cmd in (("status",), ("history", "--last", "3")):
        p = opsctl(*cmd, inv=truth_lab.inv, timeout=60)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        assert "not a record" in p.stderr and "(skipped)" in p.stderr
    p = opsctl("rollback", "--to", "baseline", inv=truth_lab.inv)
    assert p.returncode == 0, p.stderr
    text = truth_lab.run(f"cat {ROOT}/ledger.jsonl").stdout
    last = text.splitlines()[-1]
    assert json.loads(last)["action"] == "rollback"  # whole, not glued onto the torn line
    torn = truth_lab.run(f"cat {ROOT}/ledger.jsonl.torn").stdout
    assert '"text": "{\\"ts\\": \\"2026-\\""' in torn


def test_no_room_for_the_release_is_refused_before_anything_changes(truth_lab, snapshot, tmp_path):
    # an install root on a 2 MiB filesystem: the release and the ledger's room do not fit
    inv = tmp_path / "inv"
    shutil.copytree(truth_lab.inv, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("install_root: /opt/opsctl", "install_root: /opt/tiny"))
    truth_lab.run("mkdir -p /opt/tiny && mount -t tmpfs -o size=2m tiny /opt/tiny")
    before = snapshot(truth_lab)
    try:
        p = opsctl("deploy", "ddtree", "--budget", "9", *FAST, inv=inv)
        assert p.returncode == 3, p.stderr
        assert "MiB free under /opt/tiny" in p.stderr and "nothing was changed" in p.stderr
        assert truth_lab.run("ls -A /opt/tiny").stdout.strip() == ""
    finally:
        truth_lab.run("umount /opt/tiny; rmdir /opt/tiny; true")
    assert snapshot(truth_lab) == before


# 5. secrets, strictly
