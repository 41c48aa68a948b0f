"""What the rollback-truth lab modules share (test_truth_*_lab.py): the live release, the ledger,
health, `opsctl` as a subprocess, status, orphans of a killed controller, and a controller to kill
at a step. Their module fixture `truth_lab` is in conftest.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from labtools import ledger  # noqa: F401  (the modules import it from here)

REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]
FAST = ("--yes", "--no-gate", "--skip-checks")
ROOT = "/opt/opsctl"


def live(lab) -> dict:
    out = lab.run(f"readlink {ROOT}/current; systemctl is-active sglang-k26; "
                  "systemctl show -p MainPID --value sglang-k26", check=False).stdout.splitlines() + ["", "", ""]
    return {"current": out[0].split("/")[-1], "active": out[1], "pid": out[2]}


def health(lab) -> int:
    return int(lab.run("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/health_generate', "
                       "timeout=20).status)\" 2>/dev/null || echo 0", check=False).stdout.strip() or 0)


def wait_until(pred, timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def opsctl(*args: str, inv: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*OPSCTL, *args, "-i", str(inv)], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def status(inv: Path) -> dict:
    p = opsctl("status", "--json", inv=inv, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)[0]


def no_orphans(lab, inv: Path) -> str:
    """ansible-playbook or rsync children of a dead controller (deploying INV to LAB) still running here;
    those of another test worker's deploy, to its own lab host, are not this controller's."""
    out = subprocess.run(["pgrep", "-af", "ansible-playbook .*prepare.yml|rsync .*opsctl"], capture_output=True,
                         text=True).stdout
    return "\n".join(line for line in out.splitlines() if str(inv) in line or lab.address in line)


class Controller:
    """An `opsctl deploy` we can kill -9 at a step, its output read line by line."""

    def __init__(self, *args: str, inv: Path):
        self.lines: list[str] = []
        self.proc = subprocess.Popen([*OPSCTL, "deploy", *args, "-i", str(inv)], cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def kill_at(self, needle: str, timeout: float = 240) -> None:
        ok = wait_until(lambda: any(needle in x for x in self.lines) or self.proc.poll() is not None, timeout, 0.05)
        assert ok and any(needle in x for x in self.lines), "\n".join(self.lines)
        os.kill(self.proc.pid, signal.SIGKILL)  # the controller alone: its children must end with it
        self.proc.wait(30)


def back_on_baseline(lab) -> None:
    assert wait_until(lambda: live(lab)["current"] == lab.baseline and live(lab)["active"] == "active", 90, 1)
    assert wait_until(lambda: health(lab) == 200, 60, 1)
