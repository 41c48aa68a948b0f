"""Helpers shared by the end-to-end tests that deploy to the lab host."""
from __future__ import annotations

import json
import os
import re
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


def ledger(lab, root: str = "/opt/opsctl", *, raw: bool = False) -> list[dict]:
    """The host's ledger records (a torn or foreign line skipped: the tests that make one read past it),
    as opsctl reads them: a switch recorded on the host and the controller's `start` record after it
    as one switch record (opsctl.onhost.ledger_records.fold_switches); `raw`: the lines as written."""
    from opsctl.onhost.ledger_records import fold_switches, json_records

    out = json_records(lab.run(f"cat {root}/ledger.jsonl", check=False).stdout.encode())
    return out if raw else fold_switches(out)


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
            "/run/opsctl-lab/crash_loop.json /var/lib/prometheus/node-exporter/opsctl.prom; "
            "systemctl reset-failed opsctl-lab-load 2>/dev/null; true", check=False)
    lab.run("systemctl stop opsctl-guard-sglang-k26.timer opsctl-drain-sglang-k26.timer sglang-k26 2>/dev/null; "
            "systemctl disable sglang-k26 "
            "2>/dev/null; rm -rf /opt/opsctl/releases /opt/opsctl/current /opt/opsctl/ledger.jsonl "
            "/opt/opsctl/baselines /opt/opsctl/shared/drafters /opt/opsctl/shared/control "
            "/etc/systemd/system/sglang-k26.service; "
            "systemctl daemon-reload; systemctl reset-failed 2>/dev/null; true", check=False)


# The state a deploy leaves on the host, as reset_host removes it (the base environment, the host
# scripts and the wheel cache stay: every module's first deploy reuses them).
STATE_PATHS = ("opt/opsctl/releases", "opt/opsctl/current", "opt/opsctl/ledger.jsonl", "opt/opsctl/baselines",
               "opt/opsctl/shared/drafters", "etc/systemd/system/sglang-k26.service",
               "etc/systemd/system/multi-user.target.wants/sglang-k26.service")
SAVED_STATE = "/var/tmp/opsctl-tests-baselined.tar"
HEALTH = ("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/health_generate', "
          "timeout=5).status)\" 2>/dev/null || echo 0")


def save_state(lab) -> None:
    """The host's release tree, ledger, baselines, drafters and unit links, saved in the guest."""
    paths = " ".join(STATE_PATHS)
    lab.run(f"cd / && tar -cpf {SAVED_STATE}.tmp $(for p in {paths}; do [ -e $p ] || [ -L $p ] && echo $p; done) "
            f"&& mv {SAVED_STATE}.tmp {SAVED_STATE}", check=True, timeout=120)


def restore_state(lab, timeout: float = 60) -> None:
    """Put back what save_state saved and start the service on it, as if the deploy had just ended."""
    import time

    reset_host(lab)
    lab.run(f"tar -C / -xpf {SAVED_STATE} && systemctl daemon-reload && systemctl start sglang-k26", check=True,
            timeout=120)
    deadline = time.monotonic() + timeout
    while lab.run(HEALTH, check=False).stdout.strip() != "200":
        assert time.monotonic() < deadline, "the restored release did not become healthy"
        time.sleep(0.2)


PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                   "offset"}


def dashboard_metric_names(dash: dict) -> set[str]:
    """Metric names in every target's and annotation's `expr` of a Grafana dashboard: the words
    of each query less label matchers, strings, ranges, functions (a word before `(`), keywords,
    numbers and template variables."""
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", []) if t.get("expr")]
    exprs += [a["expr"] for a in dash.get("annotations", {}).get("list", []) if a.get("expr")]
    names = set()
    for e in exprs:
        e = re.sub(r'\{[^}]*\}', "", re.sub(r'"[^"]*"', '""', e))
        e = re.sub(r"\[[^\]]*\]", "", e)
        e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
        for m in re.finditer(r"(?<![\w$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", e):
            if not m.group(2) and m.group(1) not in PROMQL_KEYWORDS:
                names.add(m.group(1))
    return names
