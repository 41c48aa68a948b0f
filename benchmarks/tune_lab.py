#!/usr/bin/env python3
"""Wall time of a 4-budget `opsctl tune ddtree` on the lab and how it splits (per trial:
deploy = plan/stage/switch/ready/validate, bench; then the restore). Also prints the tune's
findings (best budget per level, schedule, recommendation) and, per level, the budget
schedule's trial against the best single budget and the baseline.

Needs root and the lab (takes its session lock; boots it if down and takes it down again).
About 5 minutes.

    sudo .venv/bin/python benchmarks/tune_lab.py [--budgets 4,8,16,32] [--concurrency 1,8,32]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="4,8,16,32")
    ap.add_argument("--concurrency", default="1,8,32")
    a = ap.parse_args(argv)
    from opsctl import lab
    from opsctl.lab import constants as C
    from opsctl.lab import holder
    from opsctl.lab.host import _locked

    tmp = Path(tempfile.mkdtemp(prefix="tune-bench-"))
    inv = tmp / "inv"
    shutil.copytree(ROOT / "inventories" / "lab", inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("concurrency: [1, 4, 8]", f"concurrency: [{a.concurrency}]")
                  .replace("max_concurrency: 32", "max_concurrency: 64").replace("cuda_graph_max_bs: 32",
                                                                                 "cuda_graph_max_bs: 64"))

    def opsctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "opsctl", *args, "-i", str(inv)], cwd=ROOT, capture_output=True,
                              text=True, timeout=1800)

    with _locked(C.SESSION_LOCK, 1800):
        was_up = lab.status(probe_ssh=False).running
        if not was_up:
            lab.up(say=lambda m: None)
            holder.write_holder("benchmarks/tune_lab.py")
        try:
            lab.clear_fault(None)
            p = opsctl("deploy", "ar-tp8", "--yes", "--skip-checks")
            assert p.returncode == 0, p.stderr
            t0 = time.monotonic()
            p = opsctl("tune", "ddtree", "--budgets", a.budgets, "--yes", "--json", "--out", str(tmp / "tune"))
            wall = time.monotonic() - t0
            assert p.returncode == 0, p.stderr
            res = json.loads(p.stdout.splitlines()[-1])
        finally:
            if not was_up:
                lab.down(say=lambda m: None)
                holder.clear_holder()
    print(f"tune ddtree --budgets {a.budgets} on the lab, levels {a.concurrency}: {wall:.1f} s in all")
    print("| budget | status | deploy s | bench s | " + " | ".join(f"C={c} tok/s (speedup)" for c in res["levels"]) + " |")
    print("|---:|---|---:|---:|" + "---:|" * len(res["levels"]))
    print("| baseline | stored | - | - | " + " | ".join(f"{res['baseline_tok_s'][str(c)]:.1f}" for c in res["levels"])
          + " |")
    for t in res["trials"]:
        cells = []
        for c in res["levels"]:
            lv = t["levels"].get(str(c))
            cells.append("-" if not lv else f"{lv['tok_s']:.1f} ({(lv['speedup'] - 1) * 100:+.0f} % "
                         f"[{(lv['low'] - 1) * 100:+.0f}, {(lv['high'] - 1) * 100:+.0f}])")
        name = f"schedule {t['schedule']}" if t.get("schedule") else t["budget"]
        print(f"| {name} | {t['status'][:40]} | {t['deploy_s']:.1f} | {t['bench_s']:.1f} | " + " | ".join(cells)
              + " |")
    deploy = sum(t["deploy_s"] for t in res["trials"])
    bench = sum(t["bench_s"] for t in res["trials"])
    print(f"\nsplit: deploy {deploy:.1f} s, bench {bench:.1f} s, restore {res['restore_s']:.1f} s, "
          f"other (plan, baseline read, report) {wall - deploy - bench - res['restore_s']:.1f} s")
    print(f"best per level: {res['best']}; schedule {res['schedule']}; {res['reason']}")
    sched = next((t for t in res["trials"] if t.get("schedule") and t["status"] == "measured"), None)
    singles = [t for t in res["trials"] if not t.get("schedule") and t["status"] == "measured"]
    if sched and singles:
        print(f"\n| level | schedule {sched['schedule']} tok/s | best single budget tok/s | schedule / best single "
              "| schedule / baseline |")
        print("|---:|---:|---:|---:|---:|")
        for c in res["levels"]:
            k = str(c)
            best = max(singles, key=lambda t: t["levels"][k]["tok_s"])
            s_tok, b_tok = sched["levels"][k]["tok_s"], best["levels"][k]["tok_s"]
            print(f"| C={c} | {s_tok:.1f} | {b_tok:.1f} (budget {best['budget']}) | {s_tok / b_tok:.2f} | "
                  f"{s_tok / res['baseline_tok_s'][k]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
