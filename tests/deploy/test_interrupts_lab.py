"""The operator's brake, end to end on the lab host: SIGINT (or SIGTERM) to the opsctl
process at each step of a deploy. Before the switch nothing live changes; after it the
release that served before is put back, the ledger says `interrupted`, exit 130; a
second SIGINT during that rollback does not abandon it."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]
FAST = ("--yes", "--no-gate", "--skip-checks")

pytestmark = pytest.mark.lab


def live(lab) -> dict:
    out = lab.run("readlink /opt/opsctl/current; systemctl is-active sglang-k26; "
                  "systemctl show -p MainPID --value sglang-k26", check=False).stdout.splitlines() + ["", "", ""]
    return {"current": out[0].split("/")[-1], "active": out[1], "pid": out[2]}


def ledger(lab) -> list[dict]:
    text = lab.run("cat /opt/opsctl/ledger.jsonl", check=False).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def health(lab) -> int:
    return int(lab.run("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/health_generate', "
                       "timeout=20).status)\" 2>/dev/null || echo 0", check=False).stdout.strip() or 0)


class Deploy:
    """`opsctl deploy ...` in its own session (no terminal), its output read line by line."""

    def __init__(self, *args: str, inventory: Path):
        self.lines: list[str] = []
        self.proc = subprocess.Popen([*OPSCTL, "deploy", *args, "-i", str(inventory)], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(needle in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                self._reader.join(5)
                break
            time.sleep(0.1)
        raise AssertionError(f"never saw {needle!r}; output:\n" + "\n".join(self.lines))

    def signal(self, sig: int = signal.SIGINT) -> None:
        os.kill(self.proc.pid, sig)  # the opsctl process alone, as `kill -INT PID` does

    def finish(self, timeout: float = 240) -> tuple[int, str]:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        return rc, "\n".join(self.lines)


@pytest.fixture(scope="module")
def brake_lab(clean_lab, baselined, tmp_path_factory):
    """The lab with ar-tp8 judged and live (baseline stored: the gated steps can run)."""
    inv = tmp_path_factory.mktemp("inv") / "inv"
    shutil.copytree(clean_lab.inventory_dir, inv)
    baselined.restore(clean_lab)
    clean_lab.inv = inv
    return clean_lab


def _assert_back_on(lab, before: dict, out: str, step: str) -> None:
    after = live(lab)
    assert after["current"] == before["current"] and after["active"] == "active", out
    assert health(lab) == 200
    recs = ledger(lab)
    interrupted = [r for r in recs if r.get("action") == "deploy" and r.get("result") == "interrupted"]
    assert interrupted and interrupted[-1]["step"] == step and interrupted[-1]["switched"] is True, recs[-3:]
    assert recs[-1]["action"] == "rollback" and recs[-1]["result"] == "ok" \
        and recs[-1]["to_release"] == before["current"], recs[-1]
    assert "interrupted (SIGINT)" in recs[-1]["reason"]
    assert "Traceback" not in out


@pytest.mark.parametrize("step,fault", [
    ("ready", {"name": "slow_start", "load_s": 40, "algorithm": "DDTREE"}),
    ("validate", None),
    ("bench", None),
])
def test_sigint_after_the_switch_puts_the_previous_release_back(brake_lab, step, fault):
    before = live(brake_lab)
    if fault:
        brake_lab.set_fault(fault.pop("name"), **fault)
    try:
        d = Deploy("ddtree", "--budget", "6", "--yes", "--skip-checks", inventory=brake_lab.inv)
        d.wait_for(f"] {step:<10} ...")
        time.sleep(0.5)
        d.signal()
        rc, out = d.finish()
    finally:
        brake_lab.clear_faults()
    assert rc == 130, out
    assert f"during {step}, after the switch: rolled back to {before['current']}, which serves again" in out
    _assert_back_on(brake_lab, before, out, step)
    # the next status names no verdict that is not the live release's own
    proc = subprocess.run([*OPSCTL, "status", "--json", "-i", str(brake_lab.inv)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    row = json.loads(proc.stdout)[0]
    assert row["release"] == before["current"] and row["judged"] is True
    assert row["last_verdict"] is None or row["last_verdict"]["release"] == before["current"]


def test_sigint_during_staging_leaves_the_live_release_untouched(brake_lab):
    before = live(brake_lab)
    d = Deploy("ddtree", "--budget", "5", *FAST, inventory=brake_lab.inv)
    d.wait_for("] prepare    ...")
    time.sleep(1.0)
    d.signal()
    rc, out = d.finish()
    assert rc == 130, out
    assert live(brake_lab) == before  # same release, same process: nothing live changed
    assert "before the switch" in out and "nothing live changed" in out and "left staged:" in out, out
    assert "host command failed" not in out and "Traceback" not in out
    rec = ledger(brake_lab)[-1]
    assert rec["action"] == "deploy" and rec["result"] == "interrupted" and rec["switched"] is False
    # no ansible left running on the controller after opsctl exited (this deploy's: its inventory; another
    # test worker's deploy to its own lab host may be running)
    time.sleep(1)
    left = subprocess.run(["pgrep", "-af", "ansible-playbook.*prepare.yml"], capture_output=True, text=True).stdout
    assert [line for line in left.splitlines() if str(brake_lab.inv) in line] == []


def test_second_sigint_during_the_rollback_does_not_abandon_it(brake_lab):
    before = live(brake_lab)
    brake_lab.set_fault("slow_start", load_s=40, algorithm="DDTREE")
    try:
        d = Deploy("ddtree", "--budget", "7", *FAST, inventory=brake_lab.inv)
        d.wait_for("] ready      ...")
        time.sleep(0.5)
        d.signal()
        d.wait_for("] rollback   ...")
        d.signal()
        d.signal(signal.SIGTERM)
        rc, out = d.finish()
    finally:
        brake_lab.clear_faults()
    assert rc == 130, out
    assert "received: rolling back to" in out and "it finishes first" in out
    assert "ready, after the switch: rolled back to" in out
    _assert_back_on(brake_lab, before, out, "ready")


def test_sigterm_is_handled_like_sigint(brake_lab):
    before = live(brake_lab)
    brake_lab.set_fault("slow_start", load_s=40, algorithm="DDTREE")
    try:
        d = Deploy("ddtree", "--budget", "9", *FAST, inventory=brake_lab.inv)
        d.wait_for("] ready      ...")
        d.signal(signal.SIGTERM)
        rc, out = d.finish()
    finally:
        brake_lab.clear_faults()
    assert rc == 130, out
    assert live(brake_lab)["current"] == before["current"]
    rec = [r for r in ledger(brake_lab) if r.get("result") == "interrupted"][-1]
    assert rec["signal"] == "SIGTERM"
