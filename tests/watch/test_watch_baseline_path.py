"""Issue #32 item 3: the watch reads the baseline bench from the file the gate stores it in,
named by one function (opsctl.gate.baseline.baseline_paths)."""
from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from opsctl.config import load_inventory
from opsctl.gate.baseline import baseline_paths
from opsctl.flow import bench as gate_bench
from opsctl.onhost import watch_agent as agent
from opsctl.watch import host_config

REPO = Path(__file__).resolve().parents[2]


def _host(root: Path):
    host = load_inventory(REPO / "inventories/lab").single()
    watch = host.settings.watch.model_copy(update={"enabled": True})
    return host.model_copy(update={"settings": host.settings.model_copy(
        update={"install_root": PurePosixPath(root), "watch": watch})})


def _bench_lines() -> str:
    lines = [json.dumps({"record": "meta", "release": "ar-tp8-x"})]
    lines += [json.dumps({"record": "level", "max_concurrency": c, "output_throughput": v, "repeat": 0})
              for c, v in ((1, 90.0), (4, 300.0), (8, 500.0))]
    return "\n".join(lines) + "\n"


def test_the_watch_is_told_the_gates_baseline_file(tmp_path):
    host = _host(tmp_path)
    cfg = host_config(host)
    gate_path, _ = baseline_paths(host, host.baseline_profile)
    assert cfg["baseline_bench"] == gate_path
    assert Path(gate_path).name.startswith(f"{host.baseline_profile}.") and Path(gate_path).name != "ar-tp8.jsonl"


def test_the_watch_reads_the_curve_where_the_gate_stored_it(tmp_path):
    host = _host(tmp_path / "root")
    cfg = {**host_config(host), "state_dir": str(tmp_path / "state")}
    gate_path = Path(baseline_paths(host, host.baseline_profile)[0])
    gate_path.parent.mkdir(parents=True)
    gate_path.write_text(_bench_lines())
    # the old name the watch used to read, with other numbers: never read
    (gate_path.parent / f"{host.baseline_profile}.jsonl").write_text(_bench_lines().replace("500.0", "1.0"))
    assert agent.Watch(cfg).curve() == [(1, 90.0), (4, 300.0), (8, 500.0)]


def test_no_stored_baseline_is_an_empty_curve(tmp_path):
    host = _host(tmp_path / "root")
    cfg = {**host_config(host), "state_dir": str(tmp_path / "state")}
    assert agent.Watch(cfg).curve() == []
    assert agent.Watch({k: v for k, v in cfg.items() if k != "baseline_bench"}).curve() == []


def test_the_gate_and_the_watch_share_the_one_function():
    assert gate_bench.baseline_paths is baseline_paths
