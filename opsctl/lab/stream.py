"""A steady stream of long requests inside a lab guest, as a health-checking load balancer sends
them (issue #35's drain tests and benchmarks/switch_gap.py): a fixed number of workers, each
sends one long greedy request after another (`ignore_eos`: exactly `tokens` tokens) and stops
sending once /health answers other than 200 (or not at all, three times in a row) or the
balancer's stop file exists (SGLang 0.5.23 keeps admitting
while it drains; a balancer is what stops the traffic). Every request is recorded: its status,
the tokens it got, its start and end. Runs as a transient unit in the guest (stdlib python3).

    start(run, workers=3, tokens=900)      run: guest_run-like (command, *, stdin, check, timeout)
    stream_result(run) -> [{"worker", "start", "end", "want", "ok", "got", "finish" | "error"}]
"""
from __future__ import annotations

import json
import time
from typing import Callable

UNIT = "opsctl-lab-stream"
RESULT = "/run/opsctl-lab/stream.json"
SERVER_URL = "http://127.0.0.1:30000"

# long requests, a fixed number of workers; a worker stops sending once /health is not 200 (the
# balancer took the host out) and records every request: its status and the tokens it got
STREAM_PY = r'''
import json, os, sys, threading, time, urllib.error, urllib.request
a = json.loads(sys.argv[1])
lock = threading.Lock()
reqs = []
stop = [False]

def healthy():
    """False once /health answers anything but 200 (SGLang's 503 while it drains), or gives no
    answer 3 times in a row, 0.2 s apart: a balancer's unhealthy threshold, so one health check
    that timed out on a busy machine does not take the host out (it did once in CI, and the
    drain test then found nothing in flight)."""
    for attempt in range(3):
        try:
            with urllib.request.urlopen(a["url"] + "/health", timeout=5) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    return False

def worker(i):
    end = time.monotonic() + a["duration_s"]
    while time.monotonic() < end and not stop[0]:
        if a.get("pause_file") and os.path.exists(a["pause_file"]):
            time.sleep(0.2)         # the balancer's out hook took the host out; its in hook puts it back
            continue
        if a.get("stop_file") and os.path.exists(a["stop_file"]):
            stop[0] = True          # the balancer's out hook took the host out: no new request
            return
        if not healthy():
            if a.get("resume"):     # the balancer puts the host back once it is healthy again
                time.sleep(0.2)
                continue
            stop[0] = True          # the balancer takes the host out: no new request
            return
        t0 = time.time()
        rec = {"worker": i, "start": t0, "want": a["tokens"]}
        body = json.dumps({"text": "please explain the history of the river city",
                           "sampling_params": {"max_new_tokens": a["tokens"], "temperature": 0,
                                               "ignore_eos": True}}).encode()
        try:
            req = urllib.request.Request(a["url"] + "/generate", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as resp:
                meta = json.loads(resp.read())["meta_info"]
            rec.update(ok=True, got=meta.get("completion_tokens"),
                       finish=(meta.get("finish_reason") or {}).get("type"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            rec.update(ok=False, got=None, error=str(exc)[:200])
        rec["end"] = time.time()
        with lock:
            reqs.append(rec)
            open(a["result"], "w").write(json.dumps(reqs))

ts = [threading.Thread(target=worker, args=(i,)) for i in range(a["workers"])]
for t in ts:
    t.start()
for t in ts:
    t.join()
open(a["result"], "w").write(json.dumps(reqs))
'''


def start(run: Callable, *, workers: int = 3, tokens: int = 900, duration_s: float = 45, stop_file: str = "",
          pause_file: str = "", resume: bool = False) -> None:
    """`stop_file`: once it exists, no worker sends again. `pause_file`: while it exists, workers
    wait (a balancer's out / in hooks). `resume`: a worker waits out a 503 and sends again once
    /health is 200, instead of stopping for good."""
    args = {"url": SERVER_URL, "workers": workers, "tokens": tokens, "duration_s": duration_s,
            "result": RESULT, "stop_file": stop_file, "pause_file": pause_file, "resume": resume}
    run("mkdir -p /run/opsctl-lab && cat > /run/opsctl-lab/stream.py", stdin=STREAM_PY, check=True, timeout=15)
    run(f"systemctl stop {UNIT} 2>/dev/null; systemctl reset-failed {UNIT} 2>/dev/null; rm -f {RESULT}; "
        f"systemd-run --quiet --unit {UNIT} -p RuntimeMaxSec={int(duration_s) + 120} /usr/bin/python3 "
        f"/run/opsctl-lab/stream.py '{json.dumps(args)}'", check=True, timeout=20)


def stream_result(run: Callable, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run(f"systemctl is-active {UNIT}", check=False).stdout.strip() != "active":
            break
        time.sleep(0.5)
    out = run(f"cat {RESULT} 2>/dev/null", check=False).stdout.strip()
    run(f"systemctl stop {UNIT} 2>/dev/null; systemctl reset-failed {UNIT} 2>/dev/null; true", check=False)
    return json.loads(out) if out else []
