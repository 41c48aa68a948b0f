"""deploy/grafana/opsctl-host.json without Grafana (not packaged by Debian): a dashboard Grafana
can import (ids, layout, data source, queries), every query valid PromQL (promtool parses each as a
recording rule), and every metric it names documented (opsctl's, docs/metrics.md) or read by the
watch from SGLang 0.5.23 (onhost/watch_agent.py's names). That every one of them is scraped from a
real host is the lab test's part (tests/deploy/test_metrics_lab.py)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from labtools import dashboard_metric_names
from opsctl.onhost import watch_agent

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "opsctl-host.json"


def _dash() -> dict:
    return json.loads(DASHBOARD.read_text())


def _queries(dash: dict) -> list[str]:
    return ([t["expr"] for p in dash["panels"] for t in p["targets"]]
            + [a["expr"] for a in dash["annotations"]["list"]])


def test_the_dashboard_is_one_grafana_can_import():
    dash = _dash()
    assert dash["uid"] == "opsctl-host" and dash["title"] and isinstance(dash["schemaVersion"], int)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]          # Grafana's grid is 24 wide
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        assert all(t["refId"] and t["expr"] for t in p["targets"])
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "host"}
    assert all('host="$host"' in q for q in _queries(dash))     # every query is the chosen host's


def test_every_query_is_valid_promql(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (Debian package prometheus): run scripts/bootstrap as root"
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": q.replace("$host", "gpu1")} for i, q in enumerate(_queries(_dash()))]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_metric_it_names_is_documented_or_sglangs():
    names = dashboard_metric_names(_dash())
    doc = (REPO / "docs" / "metrics.md").read_text()
    sglang = {v for k, v in vars(watch_agent).items() if k.startswith("M_")}
    for name in names:
        if name.startswith("sglang:"):
            assert name in sglang, f"{name} is not a metric SGLang 0.5.23 exports as the watch reads it"
        else:
            assert f"`{name}`" in doc or f"`{name}_total`" in doc or f"`{name.removesuffix('_total')}" in doc, name
    assert {"opsctl_release_info", "opsctl_verdict_info", "opsctl_last_switch_gap_seconds",
            "opsctl_last_start_phase_seconds", "sglang:spec_accept_length", "sglang:gen_throughput",
            "opsctl_rollbacks_total"} <= names
