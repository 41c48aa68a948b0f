"""Issue #32 end to end on the lab host: when things go wrong twice. Each test starts from the
baselined host (ar-tp8 judged, live and benched), put back in seconds, and runs the CLI as an
operator would.

- item 2: kill -9 of the controller during the automatic rollback of a gate-failed release: the
  host ends on the baseline (the guard stays armed until the switch back), `status` says so.
- item 10: a profile name or an inventory value that would run code on the host is refused
  before any host command (exit 2, one line) and nothing on the host changes.
- item 11: the watch's notify URL (a token in it) lands in a 0600 file and is never printed.
"""
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
import yaml

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]
TOKEN = "SECRETTOKEN-4242"


@pytest.fixture
def base(baselined, lab_host):
    """The baselined host, put back before the test; faults cleared after it."""
    lab_host.clear_faults()
    baselined.restore(lab_host)
    yield baselined
    lab_host.clear_faults()


def _inventory(src: Path, dest: Path, **opsctl_values) -> Path:
    shutil.copytree(src, dest)
    gv = dest / "group_vars/all.yml"
    data = yaml.safe_load(gv.read_text())
    data["opsctl"].update(opsctl_values)
    gv.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def _run(*args: str, inv: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*OPSCTL, *args, "-i", str(inv)], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def _live(lab) -> str:
    return lab.run("readlink /opt/opsctl/current", check=False).stdout.strip().split("/")[-1]


def _ledger(lab) -> list[dict]:
    text = lab.run("cat /opt/opsctl/ledger.jsonl", check=False).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_controller_killed_during_the_automatic_rollback_leaves_the_baseline_serving(base, lab_host, tmp_path):
    """Item 2: the gate fails (the site's collapsed DDTree), the controller starts putting the
    baseline back and is killed with SIGKILL as the rollback begins. Wherever the kill lands, the
    host must end on the baseline: the guard is disarmed only after the switch back, so a kill
    before it leaves the guard to revert."""
    lab = lab_host
    inv = _inventory(base.inventory_dir, tmp_path / "inv", guard_s=15)
    lines: list[str] = []
    with lab.fault("accept_collapse", algorithm="DDTREE"):
        proc = subprocess.Popen([*OPSCTL, "deploy", "ddtree", "--budget", "16", "--yes", "--skip-checks",
                                 "-i", str(inv)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
        reader.start()
        deadline = time.monotonic() + 240
        # the first line of the rollback that follows the failed verdict
        while time.monotonic() < deadline and proc.poll() is None and \
                not any("rollback" in ln.lower() and "verdict" not in ln.lower() for ln in lines):
            time.sleep(0.05)
        assert proc.poll() is None, "".join(lines)[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        text = "".join(lines)
        assert "FAIL" in text, text[-3000:]
        # wherever the kill landed: the switch back done, or the guard (15 s) does it
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and _live(lab) != base.release:
            time.sleep(1)
    assert _live(lab) == base.release, (_live(lab), _ledger(lab)[-4:])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and lab.run("systemctl is-active sglang-k26", check=False).stdout.strip() \
            != "active":
        time.sleep(1)
    status = json.loads(_run("status", "--json", inv=inv).stdout)[0]
    assert status["release"] == base.release, status
    # the switch back is on record whoever made it: the rollback's switch (written on the host by
    # bin/opsctl-switch as it flipped `current`, issue #50), or the guard's revert
    last_back = [r for r in _ledger(lab) if r.get("action") in ("rollback", "switch") and r.get("switched") is not False]
    assert last_back and last_back[-1].get("to_release") == base.release, _ledger(lab)[-4:]
    assert not [r for r in _ledger(lab)[-6:] if r.get("action") == "guard" and r.get("result") == "unchanged"]
    # nothing left to revert: the guard (if it fired) is gone, or disarmed after the switch back
    timers = lab.run("systemctl list-timers --all --no-legend 'opsctl-guard-*' 2>/dev/null", check=False).stdout
    assert "opsctl-guard" not in timers or "n/a" in timers, timers


HOSTILE_PROFILE = "arx$(touch${IFS}/tmp/PWNED)"


def test_hostile_names_are_refused_before_any_host_command_and_nothing_changes(base, lab_host, snapshot, tmp_path):
    """Item 10: a profile named to run code, an install_root with a command substitution: exit 2,
    one line naming the field and the fix, the host untouched and no file created on it."""
    lab = lab_host
    before = snapshot(lab)
    inv = _inventory(base.inventory_dir, tmp_path / "profile",
                     profiles={HOSTILE_PROFILE: {"kind": "autoregressive", "tp_size": 8}})
    p = _run("deploy", HOSTILE_PROFILE, "--yes", inv=inv)
    errs = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(errs) == 1 and "not a safe profile name" in errs[0], p.stderr
    inv2 = _inventory(base.inventory_dir, tmp_path / "root", install_root="/opt/x$(touch${IFS}/tmp/PWNED)")
    for args in (("deploy", "ar-tp8", "--yes"), ("rollback",), ("status",)):
        p = _run(*args, inv=inv2)
        errs = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(errs) == 1 and "install_root" in errs[0], (args, p.stderr)
    assert lab.run("ls /tmp/PWNED /root/PWNED /PWNED 2>/dev/null; true", check=False).stdout.strip() == ""
    assert snapshot(lab) == before


def test_the_watch_notify_url_is_in_a_0600_file_and_never_printed(base, lab_host, tmp_path):
    """Item 11: a webhook URL with a token in it, as operators configure one: the file that
    holds it on the host is 0600 root, and no output of deploy or `watch status` carries it."""
    lab = lab_host
    url = f"https://ops:{TOKEN}@hooks.example.com/services/T0/B0/{TOKEN}?sig={TOKEN}"
    inv = _inventory(base.inventory_dir, tmp_path / "inv",
                     watch={"enabled": True, "mode": "alert", "interval_s": 5, "window_s": 40, "min_samples": 3,
                            "notify": {"url": url}})
    try:
        p = _run("deploy", "ddtree", "--budget", "8", "--yes", "--no-gate", "--skip-checks", inv=inv)
        assert p.returncode == 0, p.stderr[-3000:]
        mode = lab.run("stat -c '%a %U' /opt/opsctl/watch.json", check=False).stdout.strip()
        assert mode == "600 root", mode
        assert TOKEN in lab.run("cat /opt/opsctl/watch.json", check=False).stdout   # the watch can use it
        outputs = [p.stdout, p.stderr]
        for args in (("watch", "status"), ("watch", "status", "--json"), ("status", "--json"), ("history",)):
            q = _run(*args, inv=inv)
            assert q.returncode == 0, (args, q.stderr)
            outputs += [q.stdout, q.stderr]
        assert not any(TOKEN in text for text in outputs)
        assert "hooks.example.com" in "".join(outputs)   # where it posts is shown, without the secret parts
        journal = lab.run("journalctl -u opsctl-watch-sglang-k26 --no-pager -o cat", check=False).stdout
        assert TOKEN not in journal
    finally:
        lab.run("systemctl disable --now opsctl-watch-sglang-k26 2>/dev/null; rm -f "
                "/etc/systemd/system/opsctl-watch-sglang-k26.service /opt/opsctl/watch.json; "
                "systemctl daemon-reload", check=False)
