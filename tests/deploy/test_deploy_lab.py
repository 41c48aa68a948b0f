"""Deploy and rollback end to end on the lab host (a real systemd host over SSH).

Gates (validation, benchmark) are off here with --no-gate so these tests speak
about the release machinery; the gate tests live in tests/gates/.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]

pytestmark = pytest.mark.lab
FAST = ("--yes", "--no-gate", "--skip-checks")


def live(lab) -> dict:
    out = lab.run("readlink /opt/opsctl/current; systemctl is-active sglang-k26; "
                  "cat /proc/$(systemctl show -p MainPID --value sglang-k26)/cmdline 2>/dev/null | tr '\\0' ' '",
                  check=False).stdout.splitlines() + ["", "", ""]
    return {"current": out[0].split("/")[-1], "active": out[1], "cmdline": out[2]}


def ledger(lab) -> list[dict]:
    text = lab.run("cat /opt/opsctl/ledger.jsonl", check=False).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def health(lab) -> int:
    return int(lab.run("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/health_generate', "
                       "timeout=20).status)\" 2>/dev/null || echo 0", check=False).stdout.strip() or 0)


def test_deploy_baseline_then_ddtree_then_history(clean_lab, ops):
    rc, out, err = ops.json("deploy", "ar-tp8", *FAST)
    assert rc == 0, err
    first = out["outcomes"][0]
    assert first["result"] == "promoted"
    rc, out, err = ops.json("deploy", "ddtree", "--budget", "16", *FAST)
    assert rc == 0, err
    second = out["outcomes"][0]
    assert second["result"] == "promoted" and second["release"].startswith("ddtree-b16-")
    state = live(clean_lab)
    assert state["current"] == second["release"] and state["active"] == "active"
    # the unit runs the emulator (the lab's SGLang) with budget + 1 draft tokens
    assert "-m sglang.launch_server" in state["cmdline"]
    assert "--speculative-algorithm DDTREE" in state["cmdline"]
    assert "--speculative-num-draft-tokens 17" in state["cmdline"]
    assert health(clean_lab) == 200
    proc = ops("history", "--json")
    recs = [json.loads(line) for line in proc.stdout.splitlines()]
    promoted = [r["to_release"] for r in recs if r["action"] == "promote"]
    assert promoted == [first["release"], second["release"]]
    proc = ops("status")
    assert second["release"] in proc.stdout and "active" in proc.stdout


def ensure_promoted(lab, ops, *profile: str) -> str:
    """PROFILE's release live, active and the ledger's last promotion: as the test before leaves the
    host when the module runs in order (no deploy then), deployed here when a test runs alone or
    after another order (issue #53: the idempotence test needed the previous test's deploy)."""
    rc, plan, err = ops.json("deploy", *profile, "--dry-run")
    assert rc == 0, err
    release = plan["outcomes"][0]["release"]
    state = live(lab)
    promoted = [r["to_release"] for r in ledger(lab) if r["action"] == "promote"]
    if not (state["current"] == release and state["active"] == "active" and promoted and promoted[-1] == release):
        rc, out, err = ops.json("deploy", *profile, *FAST)
        assert rc == 0 and out["outcomes"][0]["result"] == "promoted", err
        assert out["outcomes"][0]["release"] == release
    return release


def test_same_deploy_again_changes_nothing(clean_lab, ops):
    release = ensure_promoted(clean_lab, ops, "ddtree", "--budget", "16")
    before = live(clean_lab)
    assert before["current"] == release and before["active"] == "active"
    rc, out, err = ops.json("deploy", "ddtree", "--budget", "16", *FAST)
    assert rc == 0, err
    o = out["outcomes"][0]
    assert o["result"] == "unchanged"
    assert o["ansible_changed"] == 0
    assert o["drafter_bytes_sent"] == 0
    after = live(clean_lab)
    assert after == before  # same release, same process: no restart


def test_dry_run_changes_nothing_and_shows_the_plan(clean_lab, ops, snapshot):
    before = snapshot(clean_lab)
    proc = ops("deploy", "ddtree", "--budget", "8", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "stage release ddtree-b8-" in proc.stdout and "unit diff" in proc.stdout
    assert "--speculative-num-draft-tokens 9" in proc.stdout
    assert snapshot(clean_lab) == before


def test_rollback_puts_previous_release_back(clean_lab, ops):
    if len({r["to_release"] for r in ledger(clean_lab) if r["action"] == "promote"}) < 2:   # run alone
        ensure_promoted(clean_lab, ops, "ar-tp8")
    ensure_promoted(clean_lab, ops, "ddtree", "--budget", "16")
    recs = ledger(clean_lab)
    promoted = [r["to_release"] for r in recs if r["action"] == "promote"]
    t0 = time.monotonic()
    rc, out, err = ops.json("rollback")
    assert rc == 0, err
    assert time.monotonic() - t0 < 120
    assert live(clean_lab)["current"] == promoted[-2]
    assert health(clean_lab) == 200
    last = ledger(clean_lab)[-1]
    assert last["action"] == "rollback" and last["result"] == "ok" and last["to_release"] == promoted[-2]
    assert last["from_release"] == promoted[-1] and last["who"]


def test_rollback_to_unknown_release_is_a_clear_error(clean_lab, ops, snapshot):
    before = snapshot(clean_lab)
    proc = ops("rollback", "--to", "no-such-release")
    assert proc.returncode == 2
    assert "release 'no-such-release' is not on lab" in proc.stderr and "fix:" in proc.stderr
    assert snapshot(clean_lab) == before


def test_start_failure_rolls_back_automatically(clean_lab, ops):
    before = live(clean_lab)
    with clean_lab.fault("capture_failure", algorithm="DDTREE"):
        rc, out, err = ops.json("deploy", "ddtree", "--budget", "8", *FAST)
    assert rc == 5, err
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "start failed" in error_lines[0] and "rolled back to" in error_lines[0]
    assert live(clean_lab)["current"] == before["current"]
    assert health(clean_lab) == 200
    last = ledger(clean_lab)[-1]
    assert last["action"] == "rollback" and last["automatic"] and "start failed" in last["reason"]


def test_bad_input_changes_nothing_on_the_host(clean_lab, ops, snapshot, tmp_path):
    before = snapshot(clean_lab)
    assert ops("deploy", "nope", "--yes").returncode == 2
    assert ops("deploy", "ddtree", "--budget", "0", "--yes").returncode == 2
    assert ops("deploy", "ar-tp8", "--budget", "4", "--yes").returncode == 2
    unconfirmed = ops("deploy", "ddtree", "--budget", "3", "--no-gate", "--skip-checks")  # no --yes, no terminal
    assert unconfirmed.returncode == 2 and "add --yes" in unconfirmed.stderr
    inv = tmp_path / "inv"
    shutil.copytree(clean_lab.inventory_dir, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("source: /var/lib/opsctl-lab/drafter", "source: /nonexistent/drafter"))
    proc = ops("deploy", "ddtree", "--budget", "16", "--yes", "--skip-checks", inventory=inv)
    assert proc.returncode == 2 and "drafter weights directory /nonexistent/drafter does not exist" in proc.stderr
    shutil.rmtree(inv)
    shutil.copytree(clean_lab.inventory_dir, inv)
    hosts = inv / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("ansible_port: 22", "ansible_port: 2222"))
    proc = ops("deploy", "ar-tp8", "--yes", "--skip-checks", inventory=inv)
    assert proc.returncode == 3 and "unreachable" in proc.stderr and "fix:" in proc.stderr
    assert snapshot(clean_lab) == before


def test_concurrent_deploys_one_fails_naming_the_lock_holder(clean_lab, ops):
    cmd = [*OPSCTL, "deploy", "ddtree", "--budget", "4", *FAST, "-i", str(clean_lab.inventory_dir)]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.5)  # let it take the lock (planning takes about a second)
    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    out1, err1 = first.communicate(timeout=600)
    codes = sorted([first.returncode, second.returncode])
    assert codes == [0, 4], (err1, second.stderr)
    loser = second if second.returncode == 4 else first
    loser_err = loser.stderr if loser is second else err1
    assert "is locked by" in loser_err and "deploy ddtree --budget 4" in loser_err
    state = live(clean_lab)
    assert state["current"].startswith("ddtree-b4-") and state["active"] == "active"


def test_interrupted_deploy_keeps_old_release_and_next_deploy_resumes(clean_lab, ops, tmp_path):
    # a 96 MiB drafter sent at 8 MiB/s gives the test time to kill the controller mid-transfer
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text('{"block_size": 8, "note": "interrupt test"}\n')
    with (drafter / "model.safetensors").open("wb") as f:
        for i in range(96):
            f.write(bytes([i % 251]) * (1 << 20))
    inv = tmp_path / "inv"
    shutil.copytree(clean_lab.inventory_dir, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("source: /var/lib/opsctl-lab/drafter", f"source: {drafter}")
                  .replace("  keep_releases: 5", "  keep_releases: 5\n  transfer_limit_mib_s: 8"))
    before = live(clean_lab)
    proc = subprocess.Popen([*OPSCTL, "deploy", "ddtree", "--budget", "16", *FAST, "-i", str(inv)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    partial = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and partial < 16 << 20:
        time.sleep(0.5)
        out = clean_lab.run("du -sb /opt/opsctl/shared/drafters/.incoming-* 2>/dev/null | "
                            "awk '{s+=$1} END {print s+0}'", check=False).stdout.strip()
        partial = int(out or 0)
    import os

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert partial >= 16 << 20, "the transfer never got going"
    time.sleep(1)
    assert live(clean_lab) == before  # old release still serving, same process
    assert health(clean_lab) == 200
    rc, out, err = ops.json("deploy", "ddtree", "--budget", "16", *FAST, inventory=inv)
    assert rc == 0, err
    o = out["outcomes"][0]
    assert o["result"] == "promoted"
    # resumed: less than the whole file went over the wire the second time
    assert 0 < o["drafter_bytes_sent"] < 96 << 20


def test_controller_killed_after_switch_the_host_reverts_by_itself(clean_lab, ops, tmp_path):
    """The guard timer: a deploy whose controller dies between switch and verdict must not
    leave an unjudged release serving."""
    inv = tmp_path / "inv"
    shutil.copytree(clean_lab.inventory_dir, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("  keep_releases: 5", "  keep_releases: 5\n  guard_s: 15"))
    rc, _, err = ops.json("deploy", "ar-tp8", *FAST)  # the release to fall back to: not touched by the fault
    assert rc == 0, err
    before = live(clean_lab)
    with clean_lab.fault("slow_start", load_s=60, algorithm="DDTREE"):  # the new release never gets ready in time
        proc = subprocess.Popen([*OPSCTL, "deploy", "ddtree", "--budget", "6", *FAST, "-i", str(inv)], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not live(clean_lab)["current"].startswith("ddtree-b6-"):
            time.sleep(0.5)
        assert live(clean_lab)["current"].startswith("ddtree-b6-"), "the deploy never switched"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and live(clean_lab)["current"] != before["current"]:
            time.sleep(1)
    assert live(clean_lab)["current"] == before["current"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and health(clean_lab) != 200:
        time.sleep(1)
    assert health(clean_lab) == 200
    # the guard records `ok` once the release it switched to is ready (issue #32 item 5): a moment after /health
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and ledger(clean_lab)[-1].get("reason") != "guard-timeout":
        time.sleep(0.5)
    last = ledger(clean_lab)[-1]
    assert last["action"] == "rollback" and last["reason"] == "guard-timeout" and last["to_release"] == before["current"]
    assert last["result"] == "ok" and last.get("ready_s") is not None
