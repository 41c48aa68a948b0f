"""A controller killed (-9) during the automatic rollback after a failed gate (lab host, issue #50):
the rollback's switch is on record because the host-side switch wrote it (bin/opsctl-switch), the
guard it made pointless was stopped in that same step (no misleading `guard unchanged`), and
`opsctl status` (JSON and the lines people read) says what the host does: the release that serves,
the last switch, the last start, and no guard timer that would revert anything."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from truthlab import ROOT, live, ledger, health, wait_until, opsctl, status, no_orphans, Controller

pytestmark = pytest.mark.lab

GUARD_UNIT = "opsctl-guard-sglang-k26"


def _rollback_switch(lab, bad_prefix: str) -> dict | None:
    for rec in reversed(ledger(lab)):
        if (rec.get("action") == "switch" and rec.get("why") == "rollback"
                and str(rec.get("from_release") or "").startswith(bad_prefix)):
            return rec
    return None


def test_kill_during_the_automatic_rollback_leaves_the_switch_on_the_hosts_record_and_status_true(truth_lab):
    base = truth_lab.baseline
    if live(truth_lab)["current"] != base:
        p = opsctl("rollback", "--to", "baseline", inv=truth_lab.inv)
        assert p.returncode == 0, p.stderr
    n0 = len(ledger(truth_lab, raw=True))
    # the gate fails (DDTree's acceptance collapses); the baseline's start, the rollback's, takes 25 s
    # more: the controller is killed once the rollback's switch is made, while it waits for that start
    truth_lab.set_fault("accept_collapse", algorithm="DDTREE")
    truth_lab.set_fault("slow_start", load_s=25, algorithm="none")
    try:
        c = Controller("ddtree", "--budget", "9", "--yes", "--skip-checks", inv=truth_lab.inv)
        assert wait_until(lambda: _rollback_switch(truth_lab, "ddtree-b9-") is not None
                          or c.proc.poll() is not None, 420, 0.2), "\n".join(c.lines[-40:])
        assert c.proc.poll() is None, "the deploy ended before its rollback's switch:\n" + "\n".join(c.lines[-40:])
        killed_at = time.time()
        os.kill(c.proc.pid, signal.SIGKILL)
        c.proc.wait(30)
        assert any("FAIL" in x for x in c.lines), "\n".join(c.lines[-40:])
        # the host serves the release it rolled back to once its (slow) start is over
        assert wait_until(lambda: live(truth_lab)["current"] == base and health(truth_lab) == 200, 120, 1)
    finally:
        truth_lab.clear_faults()
    assert no_orphans(truth_lab, truth_lab.inv) == ""
    raw = ledger(truth_lab, raw=True)[n0:]   # as written: the host's switch records and the controller's starts
    sw = _rollback_switch(truth_lab, "ddtree-b9-")
    bad = sw["from_release"]
    # the switch's record was written on the host by the switch itself, stamped with the host's time
    assert sw["by"] == "opsctl-switch" and sw["result"] == "switched" and sw["to_release"] == base, sw
    assert sw["host"] == "lab" and sw.get("switch_id") and sw.get("who"), sw
    assert sw["switched_at"] <= killed_at + 1
    # the deploy's own switch too, and the controller's start record names it: one switch each, not two
    fwd = [r for r in raw if r.get("action") == "switch" and r.get("to_release") == bad]
    assert len(fwd) == 1 and fwd[0]["by"] == "opsctl-switch", fwd
    assert [r for r in raw if r.get("action") == "start" and r.get("switch_id") == fwd[0]["switch_id"]]
    assert not [r for r in raw if r.get("action") == "start" and r.get("switch_id") == sw["switch_id"]]
    assert [r["status"] for r in raw if r.get("action") == "verdict" and r.get("release") == bad] == ["fail"]
    # the guard (15 s) was stopped by the switch away from the release it guarded: no timer, and past
    # its time no `guard unchanged` (nor any other record of it)
    time.sleep(max(0.0, killed_at + 20 - time.time()))
    assert truth_lab.run(f"systemctl is-active {GUARD_UNIT}.timer", check=False).stdout.strip() != "active"
    after = ledger(truth_lab, raw=True)[n0:]
    assert not [r for r in after if r.get("action") == "guard" or r.get("reason") == "guard-timeout"], \
        json.dumps(after[-4:], indent=1)
    assert live(truth_lab)["current"] == base and live(truth_lab)["active"] == "active"

    # status --json: every field as the host has it
    st = status(truth_lab.inv)
    assert st["release"] == base and st["service"] == "active"
    assert st["deploy_in_progress_or_interrupted"] is False and st["unfinished_deploy"] is None
    assert st["guard_armed"] is False
    assert st["last_switch"]["to_release"] == base and st["last_switch"]["why"] == "rollback"
    assert st["last_switch"]["from_release"] == bad and st["last_switch"]["result"] == "switched"
    assert st["last_start"]["release"] == base and st["last_start"]["ts"] == sw["ts"]
    assert st["last_start"]["recorded"] is False and st["last_start"]["why"] == "rollback"
    assert st["judged"] is True and st["last_good"] == base
    # the human lines
    p = opsctl("status", inv=truth_lab.inv, timeout=60)
    assert p.returncode == 0, p.stderr
    text = p.stdout + p.stderr
    assert "guard timer reverts" not in text and "has not finished" not in text, text
    [ln_sw] = [ln for ln in text.splitlines() if "last switch" in ln]
    assert f"(rollback, {sw['ts']})" in ln_sw and f"{bad} -> {base}" in ln_sw, ln_sw
    [ln_st] = [ln for ln in text.splitlines() if "last start of" in ln]
    assert f"last start of {base} (rollback, {sw['ts']})" in ln_st and "not recorded" in ln_st, ln_st
    # history: the switch to the baseline is the newest record (no `start` of it, no `guard`)
    h = opsctl("history", "--json", "--last", "8", inv=truth_lab.inv, timeout=60)
    recs = [json.loads(x) for x in h.stdout.splitlines() if x.strip()]
    assert recs[-1]["action"] == "switch" and recs[-1]["to_release"] == base, recs[-1]
