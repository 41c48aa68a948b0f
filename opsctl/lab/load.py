"""Steady, noisy load on the lab host's server, run *inside* the guest (a test double's tool).

The load runs as a transient unit in the guest (`opsctl-lab-load`), so it sends
traffic to the guest's loopback only, needs no process on this machine while it
runs, and is bounded in both time (`RuntimeMaxSec=`) and requests. Noise: the
concurrency changes at random between `cmin` and `cmax` every `change_s` seconds
and each request's output length is drawn from `out_min..out_max`. Prompts are chat
text (the site's traffic; the emulator's acceptance depends on the prompt's domain).
Production code never imports this module.
"""
from __future__ import annotations

import json
import shlex

from opsctl.lab import constants as C
from opsctl.lab.host import guest_run

UNIT = "opsctl-lab-load"
SCRIPT = f"{C.GUEST_RUN_DIR}/load.py"
RESULT = f"{C.GUEST_RUN_DIR}/load.json"

LOAD_PY = r'''
import json, random, sys, threading, time, urllib.error, urllib.request
a = json.loads(sys.argv[1])
rng = random.Random(a["seed"])
deadline = time.monotonic() + a["duration_s"]
lock = threading.Lock()
stats = {"ok": 0, "errors": 0, "tokens": 0, "started": time.time()}
target = [a["cmin"]]
budget = [a["max_requests"]]
WORDS = ("the", "weather", "travel", "story", "friend", "city", "music", "history", "garden", "recipe", "letter",
         "movie", "holiday", "river", "book", "morning", "advice", "kitchen", "team", "summer")

def worker(i):
    r = random.Random(a["seed"] * 1000 + i)
    while time.monotonic() < deadline:
        if i >= target[0]:
            time.sleep(0.2)
            continue
        with lock:
            if budget[0] <= 0:
                return
            budget[0] -= 1
        n = r.randint(a["out_min"], a["out_max"])
        words = [r.choice(WORDS) for _ in range(a["input_len"])]
        body = json.dumps({"text": "please explain " + " ".join(words),
                           "sampling_params": {"max_new_tokens": n, "temperature": 0.7}}).encode()
        try:
            req = urllib.request.Request(a["url"] + "/generate", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                resp.read()
            with lock:
                stats["ok"] += 1
                stats["tokens"] += n
        except (urllib.error.URLError, OSError, ValueError):
            with lock:
                stats["errors"] += 1
            time.sleep(0.5)

threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a["cmax"])]
for t in threads:
    t.start()
while time.monotonic() < deadline and any(t.is_alive() for t in threads):
    time.sleep(min(a["change_s"], max(deadline - time.monotonic(), 0.05)))
    target[0] = rng.randint(a["cmin"], a["cmax"])
stats["finished"] = time.time()
open(a["result"], "w").write(json.dumps(stats))
'''


def start(duration_s: float, *, cmin: int = 2, cmax: int = 6, out_min: int = 32, out_max: int = 160,
          input_len: int = 48, change_s: float = 5.0, max_requests: int = 100000, seed: int = 1,
          port: int = C.SERVICE_PORT, node: int = 1) -> None:
    """Start the load in lab host NODE's guest (replacing one that runs); returns at once."""
    args = {"url": f"http://127.0.0.1:{port}", "duration_s": float(duration_s), "cmin": int(cmin), "cmax": int(cmax),
            "out_min": int(out_min), "out_max": int(out_max), "input_len": int(input_len), "change_s": float(change_s),
            "max_requests": int(max_requests), "seed": int(seed), "result": RESULT}
    guest_run(f"mkdir -p {C.GUEST_RUN_DIR} && cat > {SCRIPT}", stdin=LOAD_PY, timeout=15, check=True, node=node)
    guest_run(f"systemctl stop {UNIT} 2>/dev/null; systemctl reset-failed {UNIT} 2>/dev/null; rm -f {RESULT}; "
              f"systemd-run --quiet --unit {UNIT} -p RuntimeMaxSec={int(duration_s) + 30} "
              f"/usr/bin/python3 {SCRIPT} {shlex.quote(json.dumps(args))}", timeout=20, check=True, node=node)


def stop(node: int = 1) -> dict | None:
    """Stop the load (if it runs) and return its counts when it finished on its own."""
    guest_run(f"systemctl stop {UNIT} 2>/dev/null; systemctl reset-failed {UNIT} 2>/dev/null; true", timeout=30,
              node=node)
    out = guest_run(f"cat {RESULT} 2>/dev/null", timeout=10, node=node).stdout.strip()
    try:
        return json.loads(out) if out else None
    except ValueError:
        return None


def result(node: int = 1) -> dict | None:
    out = guest_run(f"cat {RESULT} 2>/dev/null", timeout=10, node=node).stdout.strip()
    try:
        return json.loads(out) if out else None
    except ValueError:
        return None
