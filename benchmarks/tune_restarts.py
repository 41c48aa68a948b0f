#!/usr/bin/env python3
"""Restarts and wall time of `opsctl tune ddtree` on the lab, one restart per trial against one
trial release (issue #37), for the same budgets and levels, and both projected to the site's
start-up time.

Runs the CLI as a user would, twice on the same lab host with the ar-tp8 baseline judged and live:
`tune --restart-per-trial` (each budget, then the schedule built from the winners, a release of its
own), then the default (one trial release with every candidate, switched live). Each run's restarts
are the switch records (`action: switch`) it left in the host's ledger (`opsctl history --json`,
from the run's start on; the same records as the result's `switches`): `gap_s` is a restart's
serving gap in the lab, `time_scale` the lab's (its emulator runs a start that many times faster
than the site; its benches run in real time). The projection to the site keeps the lab's wall
time but for the gaps, each replaced by its site figure (the record's `site.gap_s`: the stop as
measured and the start as the emulator modelled it at the site's scale, opsctl.drain.site_figures):

    site wall = lab wall - sum(gap_s) + sum(site.gap_s)

Target: the one-restart tune makes 1 restart for its trials instead of N + 1 (the budgets and the
schedule), and takes at least 3x less wall time at the site's scale. The per-level decisions of both
runs are printed side by side (the same model decides them).

Needs root and the lab (takes its session lock; boots it if down and takes it down again). About
10 minutes with the defaults.

    sudo .venv/bin/python benchmarks/tune_restarts.py [--budgets 4,8,16] [--concurrency 1,8,32] [--json]
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

from opsctl.drain import human_s  # noqa: E402
from opsctl.tune import site_s  # noqa: E402

TARGET_RATIO = 3.0
MODES = (("restart-per-trial", ["--restart-per-trial"]), ("one-restart", []))


def lab_inventory(dest: Path, concurrency: str) -> Path:
    """The lab inventory with the tune's levels as the gate's (the baseline is benched on them) and
    graphs up to 64, as benchmarks/tune_lab.py sets it."""
    shutil.copytree(ROOT / "inventories" / "lab", dest)
    gv = dest / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("concurrency: [1, 4, 8]", f"concurrency: [{concurrency}]")
                  .replace("max_concurrency: 32", "max_concurrency: 64").replace("cuda_graph_max_bs: 32",
                                                                                 "cuda_graph_max_bs: 64"))
    return dest


def opsctl(inv: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opsctl", *args, "-i", str(inv)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def switch_records(inv: Path, since: float) -> list[dict]:
    p = opsctl(inv, "history", "--json", timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"opsctl history failed: {p.stderr.strip()}")
    return [r for r in json_lines(p.stdout) if r.get("action") == "switch" and (r.get("pool_out_at") or 0) >= since]


def run_tune(inv: Path, mode: str, flags: list[str], budgets: str, out: Path) -> dict:
    t0 = time.time()
    p = opsctl(inv, "tune", "ddtree", "--budgets", budgets, "--yes", "--json", "--out", str(out / mode), *flags)
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"tune ({mode}) exited {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1]}")
    docs = json_lines(p.stdout)
    plan = next(d for d in docs if d.get("event") == "restart_plan")
    result = docs[-1]
    records = switch_records(inv, t0)
    gap_lab = sum(r.get("gap_s") or 0 for r in records)
    gap_site = sum(site_s(r) or 0 for r in records)
    scales = sorted({r["time_scale"] for r in records if r.get("time_scale")})
    return {"mode": mode, "wall_lab_s": round(wall, 1), "restarts": len(records),
            "trial_restarts": sum(1 for r in records if r.get("why") == "trial"),
            "by_why": result.get("restarts", {}).get("by_why"), "planned": plan.get("restarts"),
            "planned_max": plan.get("restarts_max"), "result_restarts": result.get("restarts", {}).get("measured"),
            "gap_lab_s": round(gap_lab, 2), "gap_site_s": round(gap_site, 1), "time_scales": scales,
            "wall_site_s": round(wall - gap_lab + gap_site, 1), "projected_start_s": plan.get("start_s"),
            "best": result.get("best"), "schedule": result.get("schedule"),
            "recommendation": result.get("recommendation"), "recommended_schedule": result.get("recommended_schedule"),
            "trials": [(t.get("schedule") or t.get("budget"), t.get("status")) for t in result.get("trials", [])],
            "levels": {str(t["budget"]): t.get("levels") or {} for t in result.get("trials", [])
                       if not t.get("schedule") and t.get("status") == "measured"}}


def _overlap(a: dict | None, b: dict | None) -> bool:
    """Two levels' speedup intervals (vs the same baseline) share a point."""
    if not a or not b or None in (a.get("low"), a.get("high"), b.get("low"), b.get("high")):
        return False
    return a["low"] <= b["high"] and b["low"] <= a["high"]


def compare_decisions(per: dict, one: dict) -> dict[str, str]:
    """Per level: `same` (both runs pick the same budget), `tie` (they differ, but in each run the
    two picks' speedup intervals overlap: the runs' noise decides between them, not the mode), or
    `different`."""
    out = {}
    for c in sorted(set(per.get("best") or {}) | set(one.get("best") or {}), key=int):
        a, b = (per.get("best") or {}).get(c), (one.get("best") or {}).get(c)
        if a == b:
            out[c] = "same"
            continue
        tie = all(_overlap(run["levels"].get(str(a), {}).get(c), run["levels"].get(str(b), {}).get(c))
                  for run in (per, one))
        out[c] = "tie" if tie else "different"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="4,8,16")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--apply", action="store_true", help="both tunes with --apply (the winner stays live: no "
                    "restore restart; restart per trial deploys the winner unless it is the last trial)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    a = ap.parse_args(argv)
    from opsctl import lab
    from opsctl.lab import constants as C
    from opsctl.lab import holder
    from opsctl.lab.host import _locked

    tmp = Path(tempfile.mkdtemp(prefix="tune-restarts-"))
    inv = lab_inventory(tmp / "inv", a.concurrency)
    rows = []
    try:
        with _locked(C.SESSION_LOCK, 3600):
            was_up = lab.status(probe_ssh=False).running
            if not was_up:
                lab.up(say=lambda m: None)
                holder.write_holder("benchmarks/tune_restarts.py")
            else:   # the lab's wheelhouse holds this checkout's emulator and runtime (another session built its own)
                lab.ensure_artifacts()
            try:
                lab.clear_fault(None)
                p = opsctl(inv, "deploy", "ar-tp8", "--yes", "--skip-checks")   # the baseline judged and live
                if p.returncode != 0:
                    raise SystemExit(f"deploy ar-tp8 failed: {p.stderr.strip()}")
                for mode, flags in MODES:
                    if rows and a.apply:   # the second tune starts from the same baseline as the first
                        p = opsctl(inv, "deploy", "ar-tp8", "--yes", "--skip-checks")
                        if p.returncode != 0:
                            raise SystemExit(f"deploy ar-tp8 failed: {p.stderr.strip()}")
                    rows.append(run_tune(inv, mode, [*flags, *(["--apply"] if a.apply else [])], a.budgets, tmp))
            finally:
                if not was_up:
                    lab.down(say=lambda m: None)
                    holder.clear_holder()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    per, one = rows
    n = len([b for b in a.budgets.split(",") if b.strip()])
    ratio = per["wall_site_s"] / one["wall_site_s"] if one["wall_site_s"] else None
    met = bool(ratio and ratio >= TARGET_RATIO and one["trial_restarts"] == 1)
    decisions = compare_decisions(per, one)
    if a.json:
        print(json.dumps({"budgets": a.budgets, "levels": a.concurrency, "apply": a.apply, "runs": rows,
                          "site_wall_ratio": ratio, "decisions": decisions,
                          "site_gap_ratio": per["gap_site_s"] / one["gap_site_s"] if one["gap_site_s"] else None,
                          "target": {"ratio": TARGET_RATIO, "trial_restarts": 1, "met": met}}, indent=1))
        return 0
    print(f"tune ddtree --budgets {a.budgets}{' --apply' if a.apply else ''} on the lab, levels {a.concurrency}")
    print("| mode | restarts (trials / all, planned) | wall, lab | gap, lab | time scale | gap, site | wall, site |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['trial_restarts']} / {r['restarts']} ({r['planned']}) | {human_s(r['wall_lab_s'])} "
              f"| {human_s(r['gap_lab_s'])} | {', '.join(f'{s:g}' for s in r['time_scales']) or '-'} "
              f"| {human_s(r['gap_site_s'])} | {human_s(r['wall_site_s'])} |")
    print(f"\nrestarts for the trials: {one['trial_restarts']} instead of {per['trial_restarts']} "
          f"(N + 1 = {n + 1} with the schedule); wall time at the site's scale: "
          + (f"{ratio:.2f}x less" if ratio else "?") + f" (target >= {TARGET_RATIO:g}x, 1 restart): "
          + ("met" if met else "NOT met"))
    print(f"restarts by why: restart per trial {per['by_why']}, one restart {one['by_why']}")
    # what the ratio tends to when measuring took no time: the restarts' site gaps alone
    if one["gap_site_s"]:
        print(f"restarts alone at the site's scale (measurement excluded): {human_s(per['gap_site_s'])} vs "
              f"{human_s(one['gap_site_s'])}, {per['gap_site_s'] / one['gap_site_s']:.2f}x; measurement and "
              f"switching: {human_s(per['wall_site_s'] - per['gap_site_s'])} vs "
              f"{human_s(one['wall_site_s'] - one['gap_site_s'])}")
    verdict = ("the same" if set(decisions.values()) <= {"same"} else "the same within the intervals"
               if "different" not in decisions.values() else "DIFFERENT")
    print(f"per-level decisions: {verdict} ({', '.join(f'C={c}: {v}' for c, v in decisions.items())}): "
          f"best {per['best']} vs {one['best']}; "
          f"schedule {per['schedule']} vs {one['schedule']}; recommendation "
          f"{per['recommended_schedule'] or per['recommendation']} vs "
          f"{one['recommended_schedule'] or one['recommendation']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
