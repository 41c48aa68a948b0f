"""Issue #50: a switch is recorded by the host-side step that makes it (bin/opsctl-switch), not by
the controller after the start; the controller's `start` record adds the start's figures and is
read back as one switch record; old ledgers (one controller-written `switch` record) read as before.
After a controller killed during the automatic rollback the readers say what the host does."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from types import SimpleNamespace

from hostdirs import current, host_config, install_programs, make_current, read_ledger, release
from opsctl.drain import Gap, describe
from opsctl.flow import switch as switch_mod
from opsctl.host import facts
from opsctl.onhost.watch_agent import ledger_view
from opsctl.releases import HostState
from opsctl.startup import last_start

BAD, GOOD = "ddtree-b9-bbbbbbbbbb", "ar-tp8-base"


def test_the_host_switch_that_cannot_record_itself_switches_nothing(tmp_path):
    root = tmp_path / "root"
    release(root, GOOD)
    release(root, BAD, "ddtree")
    make_current(root, BAD)
    install_programs(root, ("opsctl-switch", "opsctl-ledger-append"))
    (root / "ledger.jsonl").mkdir()   # the append fails
    rec = {"action": "switch", "why": "rollback", "from_release": BAD, "to_release": GOOD, "host": "lab"}
    res = subprocess.run([str(root / "bin/opsctl-switch"), str(root), "sglang-k26", GOOD], capture_output=True,
                         text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "OPSCTL_SWITCH_RECORD": json.dumps(rec),
                                                     "OPSCTL_SWITCH_MIN_FREE": "0"})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "could not record the switch" in res.stderr and "nothing switched" in res.stderr
    assert current(root) == BAD   # the flip was undone before anything restarted


def test_the_controller_hands_the_switch_its_record_and_the_guard_to_stop(tmp_path):
    host = host_config(tmp_path, tmp_path / "root")
    sent: list[str] = []
    conn = SimpleNamespace(run=lambda cmd, check=True, timeout=None: sent.append(cmd)
                           or SimpleNamespace(ok=True, stdout="1767000000\n" if "date" in cmd else "", rc=0))
    gap = Gap("rollback", BAD, GOOD, 30.0)
    gap.out_at = gap.stop_at = 100.0
    switch_mod.switch(conn, host, GOOD, record=gap.switch_record(), disarm=True)
    [cmd] = [c for c in sent if "bin/opsctl-switch" in c]
    env = dict(w.split("=", 1) for w in shlex.split(cmd) if w.startswith("OPSCTL_"))
    rec = json.loads(env["OPSCTL_SWITCH_RECORD"])
    assert rec["action"] == "switch" and rec["why"] == "rollback" and rec["switch_id"] == gap.switch_id
    assert rec["host"] == "lab" and "@" in rec["who"] and rec["pool_out_at"] == 100.0
    assert env["OPSCTL_SWITCH_DISARM_GUARD"] == switch_mod.guard_unit(host)
    sent.clear()
    switch_mod.switch(conn, host, GOOD, record=gap.switch_record())
    assert "OPSCTL_SWITCH_DISARM_GUARD" not in " ".join(sent)


def _host_switch(frm, to, why, sid, ts="2026-12-05T10:00:00Z"):
    return {"ts": ts, "action": "switch", "result": "switched", "by": "opsctl-switch", "switch_id": sid, "why": why,
            "from_release": frm, "to_release": to, "host": "lab", "who": "op@ctl", "pool_out_at": 1.0, "stop_at": 2.0}


def test_the_ledger_reads_a_host_switch_and_its_start_as_one_record_and_old_records_as_before():
    old = {"ts": "2026-12-01T00:00:00Z", "action": "switch", "result": "ok", "why": "deploy", "to_release": GOOD,
           "startup": {"total_s": 30.0, "phases": []}, "pool_out_at": 0.5, "pool_in_at": 9.0, "gap_s": 4.0}
    start = {"ts": "2026-12-05T10:01:00Z", "action": "start", "switch_id": "s1", "result": "ok", "ready_at": 8.0,
             "pool_in_at": 8.5, "gap_s": 6.0, "startup": {"total_s": 42.0, "phases": []}, "to_release": BAD}
    lines = "\n".join(json.dumps(r) for r in [old, _host_switch(GOOD, BAD, "deploy", "s1"), start]) + "\n"
    recs, problems = facts.LedgerRecords("/opt/opsctl").process(lines)
    assert problems == [] and [r["action"] for r in recs] == ["switch", "switch"]
    assert recs[0] == old
    assert recs[1]["result"] == "ok" and recs[1]["gap_s"] == 6.0 and recs[1]["pool_in_at"] == 8.5
    assert recs[1]["ts"] == "2026-12-05T10:00:00Z" and recs[1]["start_ts"] == "2026-12-05T10:01:00Z"
    assert last_start(recs, BAD)["total_s"] == 42.0 and last_start(recs, GOOD)["total_s"] == 30.0


def test_after_a_kill_during_the_rollback_the_records_say_what_the_host_does():
    recs = [{"action": "promote", "result": "ok", "to_release": GOOD},
            {"action": "deploy", "result": "started", "from_release": GOOD, "to_release": BAD},
            _host_switch(GOOD, BAD, "deploy", "s1", "2026-12-05T10:00:00Z"),
            {"action": "start", "switch_id": "s1", "result": "ok", "startup": {"total_s": 5.0, "phases": []}},
            {"action": "verdict", "status": "fail", "release": BAD},
            _host_switch(BAD, GOOD, "rollback", "s2", "2026-12-05T10:03:00Z")]   # then kill -9
    folded = facts.fold_switches(recs)
    state = HostState(current=GOOD, releases={}, ledger=folded, service={})
    assert state.interrupted_deploy() is None   # its release no longer serves: not "has not finished"
    st = last_start(folded, GOOD)   # this start, not the one of GOOD's own deploy long ago
    assert st["ts"] == "2026-12-05T10:03:00Z" and st["recorded"] is False and st["why"] == "rollback"
    line = describe(folded[-1])
    assert line.startswith(f"{BAD} -> {GOOD}, recorded on the host by the switch itself") and "not recorded" in line
    # the watch on the host no longer steps aside for a deploy that is over
    assert ledger_view(recs)["deploying"] is False
    assert ledger_view(recs[:-1])["deploying"] is True
    # a re-run that restarts the same release is not a switch away from it: still unfinished
    again = recs[:2] + [_host_switch(BAD, BAD, "deploy", "s3")]
    assert HostState(current=BAD, releases={}, ledger=facts.fold_switches(again), service={}).interrupted_deploy()


def test_two_switches_of_one_host_run_one_after_the_other(tmp_path):
    """bin/opsctl-switch holds ROOT/.switch.lock from reading `current` to its end: a second one (a
    guard's, once a killed controller freed the deploy lock) waits, then reads what the first made."""
    import fcntl
    import time

    root = tmp_path / "root"
    release(root, GOOD)
    release(root, BAD, "ddtree")
    make_current(root, BAD)
    install_programs(root, ("opsctl-switch", "opsctl-ledger-append"))
    fd = os.open(root / ".switch.lock", os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)   # the rollback's switch, in flight
    # the guard's switch: acts only while BAD is live. MIN_FREE beyond any disk: had it read BAD (not
    # waiting), it would stop at the room check (exit 28) before touching anything
    proc = subprocess.Popen([str(root / "bin/opsctl-switch"), str(root), "sglang-k26", GOOD, "guard-timeout", "lab",
                             BAD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "OPSCTL_SWITCH_MIN_FREE": str(2**62)})
    time.sleep(0.6)
    assert proc.poll() is None   # waiting on the lock
    make_current(root, GOOD)     # the rollback flips, then lets go
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "no longer live (" + GOOD in out, out + err
    assert [(r["action"], r["result"]) for r in read_ledger(root)] == [("guard", "unchanged")]
