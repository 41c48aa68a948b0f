"""The lab is one per machine: who holds it, and `opsctl lab down` by anyone else."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl.errors import LabError
from opsctl.lab import constants as C
from opsctl.lab import holder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def lab_files(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "STATE_DIR", tmp_path)
    monkeypatch.setattr(C, "HOLDER_FILE", tmp_path / "holder.json")
    monkeypatch.setattr(C, "SESSION_LOCK", tmp_path / "session.lock")
    return tmp_path


def test_a_lab_brought_up_by_another_live_session_is_not_taken_down(lab_files):
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)  # another login session, alive
    try:
        (lab_files / "holder.json").write_text(json.dumps(
            {"who": "alice@gpu-dev", "via": "opsctl lab up", "pid": other.pid, "sid": other.pid, "since": "t"}))
        with pytest.raises(LabError) as exc:
            holder.check_may_take_down(force=False)
        assert "alice@gpu-dev" in exc.value.problem and "--force" in exc.value.fix
        holder.check_may_take_down(force=True)  # --force overrides a holder record
    finally:
        other.kill()
        other.wait()


def test_own_session_or_a_dead_holder_may_take_it_down(lab_files):
    holder.write_holder("opsctl lab up")
    holder.check_may_take_down(force=False)  # the same login session
    dead = subprocess.Popen(["true"], start_new_session=True)
    dead.wait()
    (lab_files / "holder.json").write_text(json.dumps({"who": "bob@x", "via": "opsctl lab up", "pid": dead.pid,
                                                       "sid": dead.pid, "since": "t"}))
    holder.check_may_take_down(force=False)  # a stale record does not block


def test_a_held_session_lock_refuses_naming_the_holder(lab_files):
    (lab_files / "holder.json").write_text(json.dumps({"who": "ci@runner", "via": "pytest session", "pid": 1,
                                                       "sid": 1, "since": "t"}))
    locker = subprocess.Popen(["flock", str(lab_files / "session.lock"), "sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # until flock(1) holds it
            try:
                with holder.session_lock("probe"):
                    time.sleep(0.05)
            except LabError:
                break
        with pytest.raises(LabError) as exc:
            with holder.session_lock("take the lab down"):
                pass
        assert "ci@runner (pytest session" in exc.value.problem
    finally:
        locker.kill()
        locker.wait()


@pytest.mark.lab
def test_lab_down_during_a_test_session_is_refused_and_the_lab_stays_up(lab_host):
    proc = subprocess.run([sys.executable, "-m", "opsctl", "lab", "down", "--force"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert "in use by" in proc.stderr and "pytest session" in proc.stderr
    assert lab_host.run("systemctl is-system-running", check=False).stdout.strip() in ("running", "degraded")
