"""What a switch costs (issue #35): drain, stop, start (per start-up phase), serving gap and aborted
requests of a deploy, a rollback and a 2-budget tune on the lab host, at the lab's scale and
projected to the site's (lab seconds x the emulator's time scale).

Needs the lab (`opsctl lab up`) with the ar-tp8 baseline judged and live (its bench stored): e.g.
`opsctl deploy ar-tp8 --yes --skip-checks -i inventories/lab`. Runs the CLI as a user would, then
reads the switch records (`action: switch`) this run appended to the host's ledger.

    python benchmarks/switch_gap.py [-i inventories/lab] [--budgets 4,8] [--json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opsctl.drain import human_s  # noqa: E402

FAST = ("--yes", "--no-gate", "--skip-checks")


def opsctl(*args: str, inv: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opsctl", *args, "-i", inv], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


def switch_records(inv: str, since: float) -> list[dict]:
    p = opsctl("history", "--json", inv=inv, timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"opsctl history failed: {p.stderr.strip()}")
    out = []
    for line in p.stdout.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("action") == "switch" and (rec.get("pool_out_at") or 0) >= since:
            out.append(rec)
    return out


def run_step(name: str, args: list[str], inv: str) -> dict:
    t0 = time.time()
    p = opsctl(*args, inv=inv)
    if p.returncode != 0:
        raise SystemExit(f"{name}: opsctl {' '.join(args)} exited {p.returncode}: "
                         f"{(p.stderr.strip().splitlines() or [''])[-1]}")
    return {"name": name, "since": t0, "records": switch_records(inv, t0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-i", "--inventory", default="inventories/lab")
    ap.add_argument("--budgets", default="4,8")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    steps = [run_step("deploy", ["deploy", "ddtree", "--budget", "8", *FAST], a.inventory),
             run_step("rollback", ["rollback"], a.inventory),
             run_step(f"tune {a.budgets}", ["tune", "ddtree", "--budgets", a.budgets, "--no-schedule-trial",
                                            "--yes", "--out", "/tmp/switch-gap-tune"], a.inventory)]
    rows = []
    for st in steps:
        for rec in st["records"]:
            scale = rec.get("time_scale") or 1.0
            phases = (rec.get("startup") or {}).get("phases") or {}
            rows.append({"operation": st["name"], "switch": rec.get("why"), "to": rec.get("to_release"),
                         "time_scale": rec.get("time_scale"),
                         **{k: rec.get(k) for k in ("drain_s", "stop_s", "start_s", "gap_s", "inflight_at_start",
                                                    "aborted")},
                         "site": {k: (rec.get(k) * scale if rec.get(k) is not None else None)
                                  for k in ("drain_s", "stop_s", "start_s", "gap_s")},
                         "start_phases_site_s": phases})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    head = f"{'operation':<12} {'switch':<9} {'drain':>8} {'stop':>8} {'start':>8} {'gap':>8} {'aborted':>7}   " \
           f"{'site: drain':>12} {'stop':>10} {'start':>12} {'gap':>12}"
    print(head)
    print("-" * len(head))
    for r in rows:
        s = r["site"]
        print(f"{r['operation']:<12} {r['switch']:<9} {human_s(r['drain_s']):>8} {human_s(r['stop_s']):>8} "
              f"{human_s(r['start_s']):>8} {human_s(r['gap_s']):>8} {r['aborted'] or 0:>7}   "
              f"{human_s(s['drain_s']):>12} {human_s(s['stop_s']):>10} {human_s(s['start_s']):>12} "
              f"{human_s(s['gap_s']):>12}")
    for r in rows:
        if r["start_phases_site_s"]:
            print(f"  {r['operation']} / {r['switch']} -> {r['to']}: start at the site's scale: "
                  + ", ".join(f"{k} {human_s(v)}" for k, v in r["start_phases_site_s"].items()))
    scales = {r["time_scale"] for r in rows if r["time_scale"]}
    print(f"time scale: {', '.join(f'{x:g}' for x in scales) or 'none (a real host: figures are the site)'}; "
          f"total gap {human_s(sum(r['gap_s'] or 0 for r in rows))} in the lab = "
          f"{human_s(sum(r['site']['gap_s'] or 0 for r in rows))} at the site")
    return 0


if __name__ == "__main__":
    sys.exit(main())
