"""The short version of benchmarks/watch_soak.py: a healthy, gated DDTree release under noisy
load with the watch on is never switched and never alerted on (the full run is 10 minutes)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from watch_soak import print_report, soak  # noqa: E402

pytestmark = pytest.mark.lab


def test_healthy_release_under_noisy_load_is_never_switched(clean_lab):
    res = soak(45, interval=3, window=15, min_samples=3, periods=5, node=clean_lab.node,
               inventory=clean_lab.inventory_dir)
    print_report(res)
    assert not res["switched"] and res["watch_records"] == [] and res["events"] == []
    assert res["breach_periods"] == 0
    verdicts = [r["verdict"] for r in res["rows"]]
    assert "healthy" in verdicts and set(verdicts) <= {"healthy", "idle"}, verdicts
    assert res["load"] and res["load"]["ok"] > 20 and res["load"]["errors"] == 0
