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

    python benchmarks/switch_gap.py [-i inventories/lab] [--budgets 4,8] [--stream 3:900] [--json]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-i", "--inventory", default="inventories/lab")
    ap.add_argument("--budgets", default="4,8")
    ap.add_argument("--stream", default="3:900", help="WORKERS:TOKENS of the request stream, 0 for none")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
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
        print(json.dumps({"switches": rows, "operations": requests}, indent=1))
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
