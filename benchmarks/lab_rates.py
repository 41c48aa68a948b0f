#!/usr/bin/env python3
"""Per-request decode rates of the lab's emulator, for benchmarks/verdict_stats.py.

Runs the SGLang 0.5.23 emulator (opsctl/lab/emulator) as a local process - no lab, no root -
and measures it the way the lab's gate does: the lab inventory's workload mix and lengths
(humaneval 0.3 / chat 0.5 / math 0.2, input 64, output 32), rounds of 8 requests chosen from
the seed, the level and the round (a baseline and a candidate see the same requests), at
C = 1, 4 and 8. Three servers: the ar-tp8 baseline, a healthy DDTree budget 16 (the lab's clear
win at C=1 and its close call at C=8) and DDTree budget 32 with the `accept_collapse` fault
(the site's collapse). Each request's rate is output tokens / end-to-end seconds, as the gate's.

The emulator runs in real time (about 3 minutes in all; it sleeps more than it computes).
Writes benchmarks/data/lab_rates.json:

    .venv/bin/python benchmarks/lab_rates.py [--rounds 8] [--out benchmarks/data/lab_rates.json]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EMULATOR_SRC = ROOT / "opsctl" / "lab" / "emulator"

# server name: (lab profile, budget, faults)
SERVERS = {
    "ar-tp8": ("ar-tp8", None, None),
    "ddtree-b16": ("ddtree", 16, None),
    "ddtree-b32-collapse": ("ddtree", 32, {"accept_collapse": {}}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp: Path, rendered: list[str], faults: dict | None) -> tuple[subprocess.Popen, str]:
    """The emulator with the lab's rendered command line (paths and port made local)."""
    model, drafter, site = tmp / "model", tmp / "drafter", tmp / "site"
    for d in (model, drafter, tmp / "run"):
        d.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                   "max_position_embeddings": 262144}))
    (drafter / "config.json").write_text(json.dumps({"block_size": 8}))
    di = site / "sglang_ddtree-0.1.0.dist-info"
    di.mkdir(parents=True, exist_ok=True)
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-ddtree\nVersion: 0.1.0\n")
    (di / "entry_points.txt").write_text("[sglang.srt.plugins]\nddtree = sglang_ddtree.plugin:register\n")
    (tmp / "faults.json").write_text(json.dumps({"faults": faults or {}}))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EMULATOR_SRC), str(site)]),
           "OPSCTL_LAB_FAULTS": str(tmp / "faults.json"), "OPSCTL_LAB_RUN_DIR": str(tmp / "run"),
           "SGLANG_PLUGINS": "ddtree"}
    local = {"--model-path": str(model), "--host": "127.0.0.1", "--port": str(port),
             "--speculative-draft-model-path": str(drafter)}
    argv = [sys.executable]
    for i, arg in enumerate(rendered[1:], start=1):
        argv.append(local.get(rendered[i - 1], arg))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(tmp))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health_generate", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the emulator exited ({proc.returncode}): {' '.join(argv)}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the emulator did not get ready in 60 s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="rounds of 8 requests per level (default 8: 64 requests)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / "lab_rates.json")
    a = ap.parse_args(argv)
    from opsctl.gate import interval as cf
    from opsctl.onhost import loadgen
    from opsctl.gate.workloads import WorkloadSet
    from opsctl.config import load_inventory

    policy = load_inventory(ROOT / "inventories" / "lab").hosts["lab"].gate_policy()
    ws = WorkloadSet.load(policy.workloads, input_len=policy.input_len)
    out: dict = {"source": "benchmarks/lab_rates.py: the lab emulator run locally, the lab inventory's gate "
                           f"(mix {policy.workloads}, input {policy.input_len}, output {policy.output_len}, "
                           f"rounds of {policy.requests_per_level})", "levels": list(policy.concurrency),
                 "servers": {}}
    from opsctl.render import render

    host = load_inventory(ROOT / "inventories" / "lab").hosts["lab"]
    for name, (profile, budget, faults) in SERVERS.items():
        with tempfile.TemporaryDirectory(prefix="lab-rates-") as tmp:
            proc, url = _start(Path(tmp), render(host, host.profile(profile, budget=budget)).argv, faults)
            try:
                per_level: dict[str, list] = {}
                for level in policy.concurrency:
                    per_round = max(level, policy.requests_per_level)
                    rows: list = []
                    for rnd in range(a.rounds):
                        reqs = ws.select(per_round, seed=policy.seed, level=level, repeat=rnd)
                        path = Path(tmp) / f"req-{level}-{rnd}.jsonl"
                        path.write_text("".join(json.dumps({"level": level, "repeat": 0, **r.payload(policy.output_len)})
                                                + "\n" for r in reqs))
                        spec = loadgen.LoadSpec(url=url, concurrency=[level], input_len=policy.input_len,
                                                output_len=policy.output_len, requests_per_level=per_round, repeats=1,
                                                warmup=policy.warmup if (level, rnd) == (policy.concurrency[0], 0) else 0,
                                                seed=policy.seed, requests_file=str(path))
                        recs = [r for r in loadgen.run(spec) if r.get("record") == "level"]
                        for s in cf.samples_of(recs):
                            rows.append([s.workload, round(s.rate, 3)])
                    per_level[str(level)] = rows
                    print(f"{name} C={level}: {len(rows)} requests, mean {sum(r[1] for r in rows) / len(rows):.1f} tok/s",
                          flush=True)
                out["servers"][name] = per_level
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
