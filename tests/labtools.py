"""Helpers shared by the end-to-end tests that deploy to the lab host."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPSCTL = [sys.executable, "-m", "opsctl"]


class Ops:
    """Runs the opsctl CLI as a user would, against the lab inventory."""

    def __init__(self, inventory: Path):
        self.inventory = inventory

    def __call__(self, *args: str, inventory: Path | None = None, timeout: float = 600,
                 env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([*OPSCTL, *args, "-i", str(inventory or self.inventory)], capture_output=True,
                              text=True, cwd=REPO, timeout=timeout, env={**os.environ, **(env or {})})

    def json(self, *args: str, **kw) -> tuple[int, object, str]:
        proc = self(*args, "--json", **kw)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        last = json.loads(lines[-1]) if lines else None
        return proc.returncode, last, proc.stderr


def host_snapshot(lab) -> str:
    """Everything a deploy may change on the host, as text."""
    return lab.run(
        "cd /opt/opsctl 2>/dev/null && find . -path ./shared/envs -prune -o -printf '%p %s %l\\n' | sort; "
        "cat /opt/opsctl/ledger.jsonl 2>/dev/null; readlink /etc/systemd/system/sglang-k26.service; "
        "systemctl show sglang-k26 -p MainPID -p ActiveState -p NRestarts", check=False).stdout


def reset_host(lab) -> None:
    lab.clear_faults()
    lab.run("systemctl disable --now opsctl-watch-sglang-k26 opsctl-lab-load 2>/dev/null; rm -rf "
            "/etc/systemd/system/opsctl-watch-sglang-k26.service /opt/opsctl/watch.json /var/lib/opsctl-watch "
            "/run/opsctl-lab/crash_loop.json; systemctl reset-failed opsctl-lab-load 2>/dev/null; true", check=False)
    lab.run("systemctl stop opsctl-guard-sglang-k26.timer sglang-k26 2>/dev/null; systemctl disable sglang-k26 "
            "2>/dev/null; rm -rf /opt/opsctl/releases /opt/opsctl/current /opt/opsctl/ledger.jsonl "
            "/opt/opsctl/baselines /opt/opsctl/shared/drafters /etc/systemd/system/sglang-k26.service; "
            "systemctl daemon-reload; systemctl reset-failed 2>/dev/null; true", check=False)
