#!/usr/bin/env python3
"""A healthy DDTree release under steady, noisy load for 10 minutes: the host-side watch
must never switch it. Prints a table per period and the watch's own cost on the host.

    sudo .venv/bin/python benchmarks/watch_soak.py                 # the full 10 minutes
    sudo .venv/bin/python benchmarks/watch_soak.py --duration 45   # what CI runs (tests/watch)

It takes the lab session lock (/run/opsctl-lab.session.lock, as pytest does; OPSCTL_LAB_LOCK_HELD=1
when the caller holds it), boots the
lab if it is down (and halts it again at the end), deploys the ar-tp8 baseline and a
gated DDTree budget 16 with the watch enabled, runs noisy load inside the guest
(concurrency drawn from 1..8 every 5 s, outputs 16..192 tokens) and samples
`opsctl watch status` every period. Exit 0 when the release was never switched and no
event was sent, 1 otherwise.
"""
from __future__ import annotations

import argparse
import http.server
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from opsctl.flow import deploy as core  # noqa: E402
from opsctl import watch  # noqa: E402
from opsctl.config import load_inventory  # noqa: E402
from opsctl.lab import constants as C  # noqa: E402
from opsctl.lab import load  # noqa: E402
from opsctl.lab.host import guest_run  # noqa: E402

SESSION_LOCK = Path("/run/opsctl-lab.session.lock")


class _Receiver(http.server.BaseHTTPRequestHandler):
    events: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).events.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


def _inventory(dest: Path, port: int, interval: int, window: int, min_samples: int, source: Path,
               host_ip: str) -> Path:
    shutil.copytree(source, dest)
    gv = dest / "group_vars/all.yml"
    # the unit's RestartSec must fit the window's restarts rule (window >= RestartSec + 2 x interval, issue #32 item 6)
    gv.write_text(gv.read_text() + f"""  restart_sec: {max(1, min(30, window - 2 * interval))}
  watch:
    enabled: true
    mode: rollback
    interval_s: {interval}
    window_s: {window}
    min_samples: {min_samples}
    notify:
      url: http://{host_ip}:{port}/soak
""")
    return dest


def _proc_cpu(pid: str, node: int = 1) -> tuple[float, float, int]:
    """(self CPU s, waited-for children CPU s, RSS KiB) of a process in the guest."""
    out = guest_run(f"cat /proc/{pid}/stat; grep VmRSS /proc/{pid}/status; getconf CLK_TCK", timeout=10,
                    node=node).stdout.split("\n")
    f = out[0].rsplit(")", 1)[1].split()
    hz = float(out[2].strip() or 100)
    return (int(f[11]) + int(f[12])) / hz, (int(f[13]) + int(f[14])) / hz, int(out[1].split()[1])


def _reset(node: int = 1) -> None:
    guest_run("systemctl disable --now opsctl-watch-sglang-k26 opsctl-lab-load 2>/dev/null; rm -rf "
              "/etc/systemd/system/opsctl-watch-sglang-k26.service /opt/opsctl/watch.json /var/lib/opsctl-watch; "
              "systemctl stop opsctl-guard-sglang-k26.timer sglang-k26 2>/dev/null; systemctl disable sglang-k26 "
              "2>/dev/null; rm -rf /opt/opsctl/releases /opt/opsctl/current /opt/opsctl/ledger.jsonl "
              "/opt/opsctl/baselines /etc/systemd/system/sglang-k26.service /etc/opsctl-lab/faults.json; "
              "systemctl daemon-reload; systemctl reset-failed 2>/dev/null; true", timeout=60, node=node)


def soak(duration_s: float, *, interval: int = 10, window: int = 60, min_samples: int = 4, periods: int = 10,
         say=print, node: int = 1, inventory: Path = REPO / "inventories/lab") -> dict:
    """Run on a booted lab (the caller holds the session lock), on lab host NODE whose inventory is
    INVENTORY (node 1: inventories/lab). Returns the numbers and table rows."""
    host_ip = C.NODES[node - 1].host_ip
    srv = http.server.ThreadingHTTPServer((host_ip, 0), _Receiver)
    _Receiver.events = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    tmp = Path(tempfile.mkdtemp(prefix="watch-soak-"))
    try:
        inv = load_inventory(_inventory(tmp / "inv", srv.server_port, interval, window, min_samples, inventory,
                                        host_ip))
        _reset(node)
        say("soak: deploying the ar-tp8 baseline (gated: stores the bench curve) ...")
        core.deploy(inv, "ar-tp8", pre_checks=False)
        say("soak: deploying ddtree --budget 16 (gated) ...")
        out = core.deploy(inv, "ddtree", 16, pre_checks=False)
        release = out[0].release
        ledger_before = guest_run("wc -l < /opt/opsctl/ledger.jsonl", timeout=10, node=node).stdout.strip()
        time.sleep(interval)
        st0 = watch.status(inv)[0]
        pid = st0["unit"]["MainPID"]
        cpu0, ch0, _ = _proc_cpu(pid, node)
        ticks0 = st0["ticks"]
        load.start(duration_s, cmin=1, cmax=8, out_min=16, out_max=192, change_s=5, seed=7, node=node)
        t_start = time.monotonic()
        rows, states = [], []
        period = duration_s / periods
        for i in range(1, periods + 1):
            time.sleep(max(0.0, t_start + i * period - time.monotonic()))
            st = watch.status(inv)[0]
            last = st.get("last") or {}
            f = {x["rule"]: x for x in last.get("findings", [])}
            live = guest_run("readlink /opt/opsctl/current", timeout=10, node=node).stdout.strip().split("/")[-1]
            states.append(last.get("verdict"))
            rows.append({"t_s": round(time.monotonic() - t_start), "live": "ddtree" if live == release else live,
                         "state": st["summary"]["state"], "verdict": last.get("verdict"),
                         "accept_med": f.get("accept_length", {}).get("observed"),
                         "accept_min": f.get("accept_length", {}).get("min"),
                         "tput_ratio": f.get("throughput", {}).get("observed"),
                         "conc_med": f.get("throughput", {}).get("concurrency"),
                         "err_rate": f.get("errors", {}).get("observed"),
                         "decode_samples": f.get("accept_length", {}).get("samples"),
                         "cpu_ms_avg": (st.get("cost") or {}).get("avg_cpu_ms"),
                         "rss_kib": (st.get("cost") or {}).get("rss_kib")})
            say("soak: " + "  ".join(f"{k}={v}" for k, v in rows[-1].items()))
        deadline = time.monotonic() + 30   # the load ends on its own at duration_s and writes its counts
        while time.monotonic() < deadline and load.result(node) is None:
            time.sleep(1)
        loadres = load.result(node)
        load.stop(node)
        st1 = watch.status(inv)[0]
        cpu1, ch1, rss = _proc_cpu(pid, node) if st1["unit"]["MainPID"] == pid else (cpu0, ch0, 0)
        ticks = st1["ticks"] - ticks0
        live = guest_run("readlink /opt/opsctl/current", timeout=10, node=node).stdout.strip().split("/")[-1]
        new = guest_run(f"tail -n +{int(ledger_before or 0) + 1} /opt/opsctl/ledger.jsonl", timeout=10, node=node).stdout
        watch_recs = [json.loads(x) for x in new.splitlines() if x.strip()]
        acted = [r for r in watch_recs if r.get("who", "").startswith("opsctl-watch@")]
        return {"release": release, "live": live, "switched": live != release, "watch_records": acted,
                "events": list(_Receiver.events), "rows": rows, "ticks": ticks, "duration_s": duration_s,
                "interval_s": interval, "window_s": window, "load": loadres,
                "cpu_ms_per_interval": round(1000 * (cpu1 - cpu0) / max(ticks, 1), 2),
                "children_cpu_ms_per_interval": round(1000 * (ch1 - ch0) / max(ticks, 1), 2),
                "rss_kib": rss, "watch_cost": st1.get("cost"),
                "breach_periods": sum(1 for s in states if s == "breach")}
    finally:
        srv.shutdown()
        srv.server_close()
        shutil.rmtree(tmp, ignore_errors=True)


def print_report(res: dict) -> None:
    cols = ["t_s", "live", "state", "verdict", "decode_samples", "accept_med", "accept_min", "tput_ratio", "conc_med",
            "err_rate", "cpu_ms_avg", "rss_kib"]
    print("\n" + " | ".join(f"{c:>12}" for c in cols))
    for r in res["rows"]:
        print(" | ".join(f"{'-' if r.get(c) is None else r.get(c)!s:>12}" for c in cols))
    ld = res.get("load") or {}
    print(f"\nrelease {res['release']} for {res['duration_s']:.0f} s under noisy load "
          f"({ld.get('ok', '?')} requests, {ld.get('errors', '?')} errors, {ld.get('tokens', '?')} tokens); "
          f"switched: {res['switched']}; watch records: {len(res['watch_records'])}; events: {len(res['events'])}")
    print(f"watch cost per {res['interval_s']} s interval over {res['ticks']} intervals: "
          f"{res['cpu_ms_per_interval']} ms CPU itself + {res['children_cpu_ms_per_interval']} ms in journalctl "
          f"(children), RSS {res['rss_kib']} KiB (its own per-tick record: {res['watch_cost']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--window", type=int, default=60)
    ap.add_argument("--min-samples", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line at the end")
    a = ap.parse_args()
    from opsctl import lab
    from opsctl.lab.host import _locked

    import contextlib
    import os

    held = os.environ.get("OPSCTL_LAB_LOCK_HELD") == "1"   # the caller holds it (flock(1) around this script)
    with contextlib.nullcontext() if held else _locked(SESSION_LOCK, 3600):
        was_up = lab.status().ssh
        lab.up(say=lambda m: print(m, flush=True))
        try:
            res = soak(a.duration, interval=a.interval, window=a.window, min_samples=a.min_samples,
                       say=lambda m: print(m, flush=True))
        finally:
            _reset()
            if not was_up:
                lab.down(say=lambda m: print(m, flush=True))
    print_report(res)
    if a.json:
        print(json.dumps(res, default=str))
    return 1 if res["switched"] or res["watch_records"] or res["events"] else 0


if __name__ == "__main__":
    sys.exit(main())
