#!/usr/bin/env python3
"""Cost of opsctl's node_exporter textfile on the host (opsctl/onhost/metrics.py, issue #54).

The file is written after every ledger record (the appender: a new process, the whole ledger
read) and after every watch tick (a long-lived process: the ledger's summary is kept while the
ledger's inode, size and mtime stay the same). For ledgers of N records, made by repeating the
records the lab test left (tests/watch/data/ledger-metrics-lab.jsonl: a gated deploy, the watch's
rollback, an operator's rollback; about 1.4 KB a record), it prints the CPU per write as the
appender pays it (ledger read) and as a watch tick pays it (ledger unchanged), and the file's size.

    .venv/bin/python benchmarks/metrics_textfile.py [--records 100,1000,10000] [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opsctl.onhost import metrics  # noqa: E402

SOURCE = REPO / "tests" / "watch" / "data" / "ledger-metrics-lab.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", default="100,1000,10000")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    recs = [json.loads(line) for line in SOURCE.read_text().splitlines() if line.strip()]
    live = [r for r in recs if r.get("action") == "switch"][-1]["to_release"]
    print(f"{'records':>8} {'ledger MB':>9} {'append (ms CPU)':>16} {'watch tick (ms CPU)':>20} {'file bytes':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "releases" / live).mkdir(parents=True)
        (root / "releases" / live / "manifest.json").write_text(json.dumps(
            {"profile": {"name": "ddtree", "kind": "ddtree", "budget": 16}, "opsctl_version": "0.1.0"}))
        (root / "current").symlink_to(f"releases/{live}")
        out = root / "opsctl.prom"
        for n in (int(x) for x in a.records.split(",")):
            with open(root / "ledger.jsonl", "w") as f:
                for i in range(n):
                    f.write(json.dumps(recs[i % len(recs)]) + "\n")
            cold, warm = [], []
            for _ in range(a.runs):
                metrics._SUMMARY_CACHE.clear()
                for bucket in (cold, warm):
                    c0 = time.process_time()
                    metrics.write_atomic(str(out), metrics.exposition(metrics.collect(str(root), {}, now=1.0)))
                    bucket.append((time.process_time() - c0) * 1000)
            mb = os.path.getsize(root / "ledger.jsonl") / 1e6
            print(f"{n:>8} {mb:>9.2f} {statistics.median(cold):>16.1f} {statistics.median(warm):>20.2f} "
                  f"{out.stat().st_size:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
