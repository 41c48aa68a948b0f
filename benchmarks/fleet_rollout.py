#!/usr/bin/env python3
"""Wall time of a 3-host rollout (inventories/lab-fleet: canary lab1, then lab2+lab3 as one
wave, 5 s soak) against three single-host deploys in a row (`--limit lab1`, then lab2, then
lab3), both with every gate on, and how each splits by step. The singles deploy budget + 1,
so that both stage a release no host has yet.

Each run starts from the ar-tp8 baseline on all three hosts (put back with `opsctl rollback
--to baseline` between runs, not timed). Needs root and the lab (takes its session lock; boots
three hosts if they are down and takes them down again). About 8 minutes.

    sudo .venv/bin/python benchmarks/fleet_rollout.py [--budget 16] [--runs 1]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HOSTS = ("lab1", "lab2", "lab3")


def _steps(stdout: str) -> dict[str, float]:
    """Seconds per step summed over hosts, from the deploy's JSON events."""
    out: dict[str, float] = defaultdict(float)
    for line in stdout.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("event") == "step" and ev.get("status") in ("ok", "fail"):
            out[ev["step"]] += ev.get("elapsed_s", 0.0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=12)
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args(argv)
    from opsctl import lab
    from opsctl.lab import constants as C
    from opsctl.lab import holder
    from opsctl.lab.host import _locked

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    inv = tmp / "lab-fleet"
    shutil.copytree(ROOT / "inventories" / "lab-fleet", inv)

    def opsctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "opsctl", *args, "-i", str(inv)], cwd=ROOT, capture_output=True,
                              text=True, timeout=3600)

    def must(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
        if p.returncode != 0:
            raise SystemExit(f"{p.args}: exit {p.returncode}\n{p.stderr[-2000:]}")
        return p

    with _locked(C.SESSION_LOCK, 1800):
        up_before = [s.running for s in lab.fleet_status()]
        lab.up(say=lambda m: None, hosts=3)
        holder.write_holder("benchmarks/fleet_rollout.py")
        rows = []
        try:
            for i in range(1, 4):
                lab.clear_fault(None, host=i)
            must(opsctl("deploy", "ar-tp8", "--yes", "--skip-checks"))
            for run in range(a.runs):
                # a release never staged before for each: the singles must not reuse the rollout's staging
                budget, single_budget = str(a.budget + 2 * run), str(a.budget + 2 * run + 1)
                t0 = time.monotonic()
                fleet = must(opsctl("deploy", "ddtree", "--budget", budget, "--yes", "--skip-checks", "--json"))
                fleet_wall = time.monotonic() - t0
                must(opsctl("rollback", "--to", "baseline"))
                singles = []
                single_steps: dict[str, float] = defaultdict(float)
                for host in HOSTS:
                    t0 = time.monotonic()
                    p = must(opsctl("deploy", "ddtree", "--budget", single_budget, "--limit", host, "--yes",
                                    "--skip-checks", "--json"))
                    singles.append(time.monotonic() - t0)
                    for k, v in _steps(p.stdout).items():
                        single_steps[k] += v
                must(opsctl("rollback", "--to", "baseline"))
                rows.append((budget, fleet_wall, _steps(fleet.stdout), singles, single_steps))
        finally:
            if not any(up_before):
                lab.down(say=lambda m: None)
                holder.clear_holder()
    print("| run | budget (singles: +1) | 3-host rollout | 3 single-host deploys in a row | rollout / singles |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for n, (budget, fw, _fs, singles, _ss) in enumerate(rows, 1):
        print(f"| {n} | {budget} | {fw:.1f} s | {sum(singles):.1f} s ({' + '.join(f'{s:.1f}' for s in singles)}) "
              f"| {fw / sum(singles):.2f} |")
    print()
    print("step seconds summed over the three hosts (last run):")
    _, fw, fs, _, ss = rows[-1]
    print("| step | rollout | singles |")
    print("| --- | ---: | ---: |")
    for step in sorted(set(fs) | set(ss), key=lambda s: -(ss.get(s, 0))):
        print(f"| {step} | {fs.get(step, 0):.1f} | {ss.get(step, 0):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
