"""Saves, from the lab, the files tests/diagnose/test_diagnose_cli.py reads: the ar-tp8 baseline's
bench, and for a DDTree budget 32 under the `accept_collapse` fault and a budget 8 under
`host_overhead` (40 ms a step), the release's stored bench and its journal since its switch (text,
and `-o json --all`). Run as root from the repository root (about 2 minutes):

    .venv/bin/python tests/diagnose/data/capture.py

It boots the lab if it is down, then holds the lab's session lock as the test suite does.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OUT = Path(__file__).resolve().parent
OPSCTL = [str(REPO / ".venv" / "bin" / "opsctl")]
INV = ["-i", "inventories/lab"]


def opsctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([*OPSCTL, *args], cwd=REPO, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"opsctl {' '.join(args)}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def guest(cmd: str) -> str:
    return opsctl("lab", "ssh", "--", cmd).stdout


def last_verdict() -> dict:
    recs = [json.loads(x) for x in guest("cat /opt/opsctl/ledger.jsonl").splitlines() if x.strip()]
    return [r for r in recs if r.get("action") == "verdict"][-1]


def capture(name: str, budget: int, fault: list[str]) -> None:
    t0 = int(time.time()) - 1
    opsctl("lab", "fault", "set", *fault)
    try:
        p = opsctl("deploy", "ddtree", "--budget", str(budget), "--yes", "--skip-checks", *INV, check=False)
    finally:
        opsctl("lab", "fault", "clear")
    if p.returncode != 5:
        sys.exit(f"deploy ddtree --budget {budget} under {fault}: exit {p.returncode}, wanted a failed gate (5)")
    rel = last_verdict()["release"]
    (OUT / f"{name}.bench.jsonl").write_text(guest(f"cat /opt/opsctl/releases/{rel}/bench.jsonl"))
    (OUT / f"{name}.journal.txt").write_text(guest(f"journalctl -u sglang-k26 --since @{t0} --no-pager"))
    (OUT / f"{name}.journal.json").write_text(guest(f"journalctl -u sglang-k26 --since @{t0} -o json --all --no-pager"))


def main() -> None:
    import fcntl

    opsctl("lab", "up")   # takes the session lock itself, for a moment
    with open("/run/opsctl-lab.session.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        opsctl("deploy", "ar-tp8", "--yes", "--skip-checks", *INV)
        (OUT / "ar-tp8.bench.jsonl").write_text(guest("cat /opt/opsctl/baselines/kimi-k2.6/ar-tp8.*.jsonl"))
        capture("ddtree-b32-accept-collapse", 32, ["accept-collapse", "algorithm=DDTREE"])
        capture("ddtree-b8-host-overhead", 8, ["host-overhead", "algorithm=DDTREE", "ms_per_step=40"])
    print("wrote", ", ".join(sorted(p.name for p in OUT.iterdir() if p.suffix in (".jsonl", ".txt", ".json"))))


if __name__ == "__main__":
    main()
