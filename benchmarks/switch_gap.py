"""What a switch costs (issue #35): drain, stop, start (per start-up phase), serving gap and aborted
requests of a deploy, a rollback and a 2-budget tune on the lab host, at the lab's scale and
projected to the site's (the start as the emulator modelled it at the site's scale; the drain and
the stop as measured: the requests run in real time).

Needs the lab (`opsctl lab up`) with the ar-tp8 baseline judged and live (its bench stored): e.g.
`opsctl deploy ar-tp8 --yes --skip-checks -i inventories/lab`. Runs the CLI as a user would, then
reads the switch records (`action: switch`) this run appended to the host's ledger.

While each operation runs, a steady stream of long requests (`--stream WORKERS:TOKENS`, 3:900 by
default, ~5 s a request; `--stream 0` for none) is sent inside the guest by a health-checking
balancer (opsctl.lab.stream): the inventory's drain hooks (`out` / `in`, added to a copy of the
inventory) pause and resume it, so the drain has requests in flight to wait for. Every request
is counted: finished with its full length, or cut.

A DDTree budget-16 release's start, today's against issue #51's (`--starts`, on by default;
`--starts-only` runs just it): first `deploy ddtree --budget 16` as a release rendered today starts
(SGLang's own capture list, JIT caches cold: the shared cache directories emptied first), then, after
a rollback to the baseline whose journal holds the lab's traffic (its bench), `deploy ddtree --budget
16 --capture-from-traffic` (the list chosen from that traffic, JIT caches warm from the first start).
Both starts at the site's scale, phase by phase, with the capture plan's modelled padding cost;
target: the new start <= half of today's (6 min 51 s -> 3 min 25 s) at <= 3 % padding.

    python benchmarks/switch_gap.py [-i inventories/lab] [--budgets 4,8] [--stream 3:900] [--json]
                                    [--starts-only | --no-starts]
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opsctl.drain import human_s  # noqa: E402
from opsctl.lab import guest_run, ssh_argv, stream  # noqa: E402

PAUSE = "/run/opsctl-lab/stream.pause"
STOP = "/run/opsctl-lab/stream.stop"

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


def balanced_inventory(src: str, dest: Path) -> str:
    """A copy of the inventory whose drain hooks pause and resume the stream (the balancer)."""
    shutil.copytree(REPO / src, dest)
    for f in [dest / "group_vars" / "all.yml", *sorted((dest / "host_vars").glob("*.yml"))]:
        if not f.is_file():
            continue
        data = yaml.safe_load(f.read_text()) or {}
        if "opsctl" not in data:
            continue
        drain = data["opsctl"].setdefault("drain", {})
        drain["hooks"] = {"out": {"command": shlex.join(ssh_argv(f"touch {PAUSE}"))},
                          "in": {"command": shlex.join(ssh_argv(f"rm -f {PAUSE}"))}}
        f.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(dest)


def run_step(name: str, args: list[str], inv: str, load: tuple[int, int] | None) -> dict:
    if load:
        guest_run(f"rm -f {PAUSE} {STOP}", check=True)
        stream.start(guest_run, workers=load[0], tokens=load[1], duration_s=1800, stop_file=STOP,
                     pause_file=PAUSE, resume=True)
        time.sleep(1.0)   # the workers' first requests are in flight
    t0 = time.time()
    p = opsctl(*args, inv=inv)
    reqs = []
    if load:
        guest_run(f"touch {STOP}", check=True)
        reqs = stream.stream_result(guest_run, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"{name}: opsctl {' '.join(args)} exited {p.returncode}: "
                         f"{(p.stderr.strip().splitlines() or [''])[-1]}")
    full = sum(1 for r in reqs if r.get("ok") and r.get("got") == r.get("want"))
    return {"name": name, "since": t0, "wall_s": time.time() - t0, "records": switch_records(inv, t0),
            "requests": {"sent": len(reqs), "full_length": full, "cut": len(reqs) - full}}


TARGET_START_S = 205.0                 # issue #51: half of today's 6 min 51 s, 3 min 25 s
MAX_PADDING = 0.03
JIT_DIRS = "/opt/opsctl/shared/cache/sglang /opt/opsctl/shared/cache/sglang-jit"


def _phases(rec: dict) -> dict[str, float]:
    raw = (rec.get("startup") or {}).get("phases") or []
    return raw if isinstance(raw, dict) else {p["phase"]: p.get("seconds") for p in raw if p.get("seconds")}


def _site_start(rec: dict) -> float | None:
    st = rec.get("startup") or {}
    return st.get("total_s") if st.get("time_scale") else (rec.get("site") or {}).get("start_s")


def _deploy_json(args: list[str], inv: str) -> dict:
    p = opsctl("deploy", *args, "--json", inv=inv)
    if p.returncode != 0:
        raise SystemExit(f"opsctl deploy {' '.join(args)} exited {p.returncode}: "
                         f"{(p.stderr.strip().splitlines() or [''])[-1]}")
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    doc = json.loads(lines[-1]) if lines else {}
    return doc if isinstance(doc, dict) else {}


def starts(inv: str) -> dict:
    """Today's budget-16 start against issue #51's, on the lab's traffic (see the docstring)."""
    t0 = time.time()
    _deploy_json(["ar-tp8", "--yes", "--skip-checks"], inv)          # the baseline live, its bench in the journal
    guest_run(f"rm -rf {JIT_DIRS}", check=True)                       # today: every JIT cache cold
    today = _deploy_json(["ddtree", "--budget", "16", *FAST], inv)
    p = opsctl("rollback", inv=inv)
    if p.returncode != 0:
        raise SystemExit(f"rollback failed: {p.stderr.strip()[-300:]}")
    new = _deploy_json(["ddtree", "--budget", "16", "--capture-from-traffic", *FAST], inv)
    recs = [r for r in switch_records(inv, t0) if r.get("why") in ("deploy", None) or r.get("to_release")]
    by_release = {r.get("to_release"): r for r in recs}
    out = {}
    for name, doc in (("today", today), ("issue 51", new)):
        o = (doc.get("outcomes") or [{}])[0]
        rec = by_release.get(o.get("release")) or {}
        plan = o.get("capture_plan") or {}
        out[name] = {"release": o.get("release"), "start_site_s": _site_start(rec), "phases": _phases(rec),
                     "graphs": plan.get("graphs_after"), "graphs_before": plan.get("graphs_before"),
                     "padding": plan.get("padding_after", 0.0), "chosen": plan.get("chosen"),
                     "time_scale": rec.get("time_scale")}
    new_s = out["issue 51"]["start_site_s"]
    out["target"] = {"start_s": TARGET_START_S, "padding": MAX_PADDING,
                     "met": bool(new_s is not None and new_s <= TARGET_START_S
                                 and (out["issue 51"]["padding"] or 0.0) <= MAX_PADDING)}
    return out


def print_starts(res: dict) -> None:
    a, b = res["today"], res["issue 51"]
    print("DDTree budget 16: a release's start at the site's scale (modelled by the lab's emulator)")
    print(f"| | today | issue #51 |")
    print("|---|---:|---:|")
    print(f"| start | {human_s(a['start_site_s'])} | {human_s(b['start_site_s'])} |")
    keys = list(dict.fromkeys([*a["phases"], *b["phases"]]))
    for k in keys:
        print(f"| {k} | {human_s(a['phases'].get(k)) if k in a['phases'] else '-'} | "
              f"{human_s(b['phases'].get(k)) if k in b['phases'] else '-'} |")
    print(f"| target-verify graphs | {b.get('graphs_before') or '?'} | {b.get('graphs') or '?'} "
          f"({b.get('chosen')}) |")
    print(f"| modelled padding cost | 0.00 % | {100 * (b['padding'] or 0.0):.2f} % |")
    t = res["target"]
    print(f"target: start <= {human_s(t['start_s'])} with padding <= {t['padding']:.0%}: "
          + ("met" if t["met"] else "NOT met"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-i", "--inventory", default="inventories/lab")
    ap.add_argument("--budgets", default="4,8")
    ap.add_argument("--stream", default="3:900", help="WORKERS:TOKENS of the request stream, 0 for none")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--starts-only", action="store_true", help="only today's budget-16 start against issue #51's")
    ap.add_argument("--no-starts", action="store_true", help="skip the budget-16 start comparison")
    a = ap.parse_args()
    start_res = None
    if not a.no_starts:
        from opsctl.lab import constants as C
        from opsctl.lab.host import _locked

        from opsctl import lab

        from opsctl.lab import holder

        with _locked(C.SESSION_LOCK, 3600):   # other sessions use the lab: one at a time
            was_up = lab.status(probe_ssh=False).running
            if not was_up:
                lab.up(say=lambda m: None)
                holder.write_holder("benchmarks/switch_gap.py")
            else:
                lab.ensure_artifacts()           # this checkout's emulator and runtime in the lab's wheelhouse
            try:
                start_res = starts(a.inventory)
            finally:
                if not was_up and a.starts_only:
                    lab.down(say=lambda m: None)
                    holder.clear_holder()
        if a.starts_only:
            if a.json:
                print(json.dumps({"starts": start_res}, indent=1))
            else:
                print_starts(start_res)
            return 0
    load = None if a.stream in ("0", "") else tuple(int(x) for x in a.stream.split(":"))
    tmp = Path(tempfile.mkdtemp(prefix="switch-gap-"))
    inv = balanced_inventory(a.inventory, tmp / "inv") if load else a.inventory
    try:
        steps = [run_step("deploy", ["deploy", "ddtree", "--budget", "8", *FAST], inv, load),
                 run_step("rollback", ["rollback"], inv, load),
                 run_step(f"tune {a.budgets}", ["tune", "ddtree", "--budgets", a.budgets, "--no-schedule-trial",
                                                "--yes", "--out", str(tmp / "tune")], inv, load)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for st in steps:
        for rec in st["records"]:
            scale = rec.get("time_scale") or 1.0
            raw = (rec.get("startup") or {}).get("phases") or []
            # {phase: site seconds} (older records kept a mapping, newer ones a list of phases)
            phases = raw if isinstance(raw, dict) else {p["phase"]: p.get("seconds") for p in raw if p.get("seconds")}
            rows.append({"operation": st["name"], "switch": rec.get("why"), "to": rec.get("to_release"),
                         "time_scale": rec.get("time_scale"),
                         **{k: rec.get(k) for k in ("drain_s", "stop_s", "start_s", "gap_s", "inflight_at_start",
                                                    "aborted")},
                         # the start modelled at the site's scale, drain and stop as measured (opsctl.drain.site_figures)
                         "site": rec.get("site") or {k: (rec.get(k) * scale if k == "start_s" and rec.get(k) is not None
                                                         else rec.get(k)) for k in ("drain_s", "stop_s", "start_s", "gap_s")},
                         "start_phases_site_s": phases})
    requests = {st["name"]: {**st["requests"], "wall_s": round(st["wall_s"], 1)} for st in steps}
    if a.json:
        print(json.dumps({"switches": rows, "operations": requests, "starts": start_res}, indent=1))
        return 0
    if start_res:
        print_starts(start_res)
        print()
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
    if load:
        print(f"requests ({load[0]} workers x {load[1]} tokens, paused by the drain's out hook):")
        for name, q in requests.items():
            print(f"  {name:<12} wall {human_s(q['wall_s'])}: {q['sent']} sent, {q['full_length']} finished with "
                  f"their full length, {q['cut']} cut")
    scales = {r["time_scale"] for r in rows if r["time_scale"]}
    print(f"time scale: {', '.join(f'{x:g}' for x in scales) or 'none (a real host: figures are the site)'}; "
          f"total gap {human_s(sum(r['gap_s'] or 0 for r in rows))} in the lab = "
          f"{human_s(sum(r['site']['gap_s'] or 0 for r in rows))} at the site")
    return 0


if __name__ == "__main__":
    sys.exit(main())
