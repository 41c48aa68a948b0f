#!/usr/bin/env python3
"""Requests and wall time to a verdict on the lab: a clear win, a clear loss and a close
call, each measured the way the deploy gate measures (the inventory's workload mix, rounds of
max(C, requests_per_level) requests, stop as soon as the speedup interval clears the
threshold either way, or at the cap).

Needs root and the lab (it takes the lab's session lock as the tests do, boots the lab if it
is down and takes it down again afterwards). About 3-4 minutes.

    sudo .venv/bin/python benchmarks/verdict_cost.py [--max-requests 64]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def opsctl(*args: str, inv: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "opsctl", *args, "-i", str(inv)], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"opsctl {' '.join(args)} failed: {p.stderr.strip().splitlines()[-1:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-requests", type=int, default=64)
    a = ap.parse_args(argv)
    from opsctl.gate import interval as cf
    from opsctl import lab
    from opsctl.config import load_inventory
    from opsctl.flow.bench import load_baseline
    from opsctl.gate.measure import measure
    from opsctl.gate.decide import throughput_decision
    from opsctl.host.connection import connect
    from opsctl.lab import constants as C
    from opsctl.lab import holder
    from opsctl.lab.host import _locked

    tmp = Path(tempfile.mkdtemp(prefix="verdict-cost-"))
    inv = tmp / "inv"
    shutil.copytree(ROOT / "inventories" / "lab", inv)
    rows = []
    with _locked(C.SESSION_LOCK, 1800):
        was_up = lab.status(probe_ssh=False).running
        if not was_up:
            lab.up(say=lambda m: None)
            holder.write_holder("benchmarks/verdict_cost.py")
        try:
            lab.clear_fault(None)
            opsctl("deploy", "ar-tp8", "--yes", "--skip-checks", inv=inv)  # stores the site-mix baseline
            host = load_inventory(inv).hosts["lab"]
            base_policy = host.gate_policy()
            cases = [("clear win", "ddtree", None, 1), ("clear loss (accept collapse)", "ddtree", "accept_collapse", 1),
                     ("close call", "ddtree", None, 8)]
            for label, prof, fault, level in cases:
                if fault:
                    lab.set_fault(fault, algorithm="DDTREE")
                opsctl("deploy", prof, "--budget", "16", "--yes", "--no-gate", "--skip-checks", inv=inv)
                policy = base_policy.model_copy(update={"concurrency": [level], "max_requests": a.max_requests,
                                                        "warmup": 0})
                conn = connect(host)
                try:
                    baseline = load_baseline(conn, host, base_policy)
                    t0 = time.monotonic()
                    spec = host.analysis(host.profile(prof, 16), policy)
                    run = measure(conn, host, policy, baseline=baseline, spec=spec)
                    wall = time.monotonic() - t0
                finally:
                    conn.close()
                cand = cf.rates(cf.samples_of(run.at(level)))
                iv, decision = throughput_decision(policy, level, cand, cf.rates(cf.samples_of(baseline.at(level))),
                                                   spec)
                thr = spec.throughput.threshold_at(level)
                rows.append((label, level, f"{(thr - 1) * 100:+.0f} %", len(cand), decision,
                             iv.pct() if iv else "-", wall))
                lab.clear_fault(None)
                opsctl("rollback", "--to", "baseline", inv=inv)
        finally:
            lab.clear_fault(None)
            if not was_up:
                lab.down(say=lambda m: None)
                holder.clear_holder()
    print(f"requests and wall time to a verdict (lab, site mix humaneval 0.3 / chat 0.5 / math 0.2, rounds of "
          f"max(C, {base_policy.requests_per_level}), cap {a.max_requests}, min {base_policy.min_requests} per side)")
    print("| case | C | threshold | requests | decision | speedup, interval (method, requests) | wall s |")
    print("|---|---:|---:|---:|---|---|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
