"""opsctl's host-side metrics end to end (issue #54): node_exporter (Debian's
prometheus-node-exporter, its unit enabled in the lab guest) reads the textfile the host keeps
current, a Prometheus on this side (started here by PID, listening on loopback) scrapes it and the
emulated SGLang's /metrics at the guest's address, and its HTTP API answers for what a deploy (its
guard armed while it judged), the watch's rollback and an operator's rollback did. The alert rules
(deploy/prometheus/opsctl-rules.yml) run in that Prometheus, and every query of the Grafana
dashboard names a metric it saw.

One module on the shared baseline (`baselined`): a gated DDTree deploy with the watch on, then the
release decays under load and the watch switches back with no controller.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from opsctl.lab import load

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "opsctl-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "opsctl-host.json"
TEXTFILE = "/var/lib/prometheus/node-exporter/opsctl.prom"
ONSET_FILE = "/run/opsctl-lab/metrics-decay.onset"
INTERVAL, WINDOW, MIN_SAMPLES = 2, 10, 3
SCRAPE_S = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prom:
    """A Prometheus server of this test's own (by PID, loopback only)."""

    def __init__(self, workdir: Path, guest_ip: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        shutil.copy(RULES, workdir / RULES.name)
        cfg = workdir / "prometheus.yml"
        cfg.write_text(f"""global:
  scrape_interval: {SCRAPE_S}s
  evaluation_interval: 1s
rule_files: [{RULES.name}]
scrape_configs:
  - job_name: node
    params: {{"collect[]": [textfile]}}    # node_exporter's textfile collector alone (the lab's 2 cores)
    static_configs: [{{targets: ["{guest_ip}:9100"], labels: {{host: lab}}}}]
  - job_name: sglang
    static_configs: [{{targets: ["{guest_ip}:30000"], labels: {{host: lab}}}}]
""")
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir)

    def get(self, path: str, **params) -> dict:
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query", query=expr)["result"]

    def value(self, expr: str) -> float | None:
        res = self.query(expr)
        assert len(res) <= 1, (expr, res)
        return float(res[0]["value"][1]) if res else None

    def wait(self, expr: str, pred=lambda res: bool(res), timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            res = self.query(expr)
            if pred(res) or time.monotonic() > deadline:
                return res
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def mlab(baselined, lab_host, tmp_path_factory):
    lab = lab_host
    baselined.restore(lab)
    # the guest runs Debian's node_exporter as the package enabled it (the guest boots this machine's /)
    assert lab.run("systemctl is-enabled prometheus-node-exporter").stdout.strip() == "enabled"
    if lab.run("systemctl is-active prometheus-node-exporter").stdout.strip() != "active":
        # a guest booted before the package was installed on this machine (a developer's long-lived lab)
        lab.run("systemctl start prometheus-node-exporter", check=True)
    inv = tmp_path_factory.mktemp("metrics-inv") / "lab"
    shutil.copytree(baselined.inventory_dir, inv)
    gv = inv / "group_vars" / "all.yml"
    text = gv.read_text()
    text = re.sub(r"concurrency: \[[^\]]*\]", "concurrency: [4]", text, count=1)   # one level: a fast gate
    gv.write_text(text + f"""  watch:
    enabled: true
    interval_s: {INTERVAL}
    window_s: {WINDOW}
    min_samples: {MIN_SAMPLES}
    defaults: {{max_restarts: 0}}
""")
    prom = Prom(tmp_path_factory.mktemp("prometheus"), lab.address)
    try:
        ready = None
        for _ in range(60):
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as r:
                    ready = r.status
                break
            except OSError:
                assert prom.proc.poll() is None, "prometheus exited: see its log"
                time.sleep(0.5)
        assert ready == 200
        yield type("MLab", (), {"lab": lab, "inv": inv, "prom": prom, "base": baselined.release})()
    finally:
        if os.environ.get("OPSCTL_METRICS_SAVE_LEDGER"):   # refresh tests/watch/data/ledger-metrics-lab.jsonl
            Path(os.environ["OPSCTL_METRICS_SAVE_LEDGER"]).write_text(lab.run("cat /opt/opsctl/ledger.jsonl").stdout)
        load.stop(node=lab.node)
        lab.clear_faults()
        prom.stop()
        lab.run(f"systemctl disable --now opsctl-watch-sglang-k26 2>/dev/null; rm -f {ONSET_FILE}", check=False)


def _labels(res: list[dict]) -> list[dict]:
    return [r["metric"] for r in res]


def current(lab) -> str:
    return lab.run("readlink /opt/opsctl/current").stdout.strip().split("/")[-1]


def test_deploy_watch_rollback_and_guard_reach_prometheus(mlab, ops):
    lab, prom, inv = mlab.lab, mlab.prom, mlab.inv
    # both targets up: node_exporter's textfile collector and SGLang's own /metrics
    up = prom.wait("up == 1", lambda r: len(r) == 2, timeout=30)
    assert sorted(m["metric"]["job"] for m in up) == ["node", "sglang"], up
    lab.run(f"rm -f {ONSET_FILE}")
    with lab.fault("accept_decay", onset_file=ONSET_FILE, over_s=2.0, accept_len=1.5, algorithm="DDTREE"):
        rc, out, err = ops.json("deploy", "ddtree", "--budget", "16", "--yes", "--skip-checks", inventory=inv)
        assert rc == 0 and out["outcomes"][0]["result"] == "promoted", err
        ddt = out["outcomes"][0]["release"]
        # the file on the host: written atomically (no temporary left beside it), parsed by Prometheus
        ls = lab.run(f"ls -a {Path(TEXTFILE).parent}").stdout.split()
        assert "opsctl.prom" in ls and not [n for n in ls if n.endswith(".tmp")], ls
        info = prom.wait(f'opsctl_release_info{{release="{ddt}"}}', timeout=3 * SCRAPE_S + 5)
        assert _labels(info) and _labels(info)[0]["profile"] == "ddtree" and _labels(info)[0]["budget"] == "16"
        m = _labels(info)[0]
        assert m["kind"] == "ddtree" and len(m["runtime"]) == 12 and m["opsctl_version"] and "schedule" not in m   # empty: no label
        # the verdict the gate recorded: pass, at C=4, with its interval (the file as the promote's record
        # left it: the switch's record, seconds before, named the release already)
        assert prom.wait(f'opsctl_verdict_info{{release="{ddt}"}}', timeout=3 * SCRAPE_S + 5)
        v = _labels(prom.query("opsctl_verdict_info"))
        assert v == [dict(v[0], release=ddt, status="pass")], v
        assert prom.value("opsctl_release_judged") == 1 and prom.value("opsctl_release_verdict_pass") == 1
        rec = [r for r in _ledger(lab) if r.get("action") == "verdict" and r.get("release") == ddt][-1]
        row = next(r for r in rec["rows"] if r["concurrency"] == 4)
        assert prom.value('opsctl_verdict_speedup_ratio{concurrency="4"}') == pytest.approx(row["delta_pct"] / 100)
        assert prom.value('opsctl_verdict_speedup_low_ratio{concurrency="4"}') == pytest.approx(row["low_pct"] / 100)
        # the switch: its gap as the ledger has it; the start's phases
        sw = [r for r in _ledger(lab) if r.get("action") == "switch"][-1]
        assert sw["to_release"] == ddt and sw["why"] == "deploy"
        assert prom.value("opsctl_last_switch_gap_seconds") == pytest.approx(sw["gap_s"])
        assert prom.value("opsctl_last_switch_start_seconds") == pytest.approx(sw["start_s"])
        assert prom.value("opsctl_last_start_seconds") == pytest.approx(sw["startup"]["total_s"])
        phases = {r["metric"]["phase"] for r in prom.query("opsctl_last_start_phase_seconds")}
        assert "weight_load" in phases and any(p.startswith("capture target verify") for p in phases), phases
        switches_before = prom.value('opsctl_switches_total{cause="deploy"}')
        assert switches_before >= 1
        # while the deploy judged its release the guard was armed and the watch stood aside: the file
        # said so from the switch's record to the promote's (seconds; scraped every SCRAPE_S)
        assert prom.value('max_over_time(opsctl_guard_state{state="armed"}[10m])') == 1
        assert prom.value('max_over_time(opsctl_watch_state{state="deploying"}[10m])') == 1
        guard = prom.wait('opsctl_guard_state == 1', lambda r: [g["metric"]["state"] for g in r] == ["idle"],
                          timeout=3 * SCRAPE_S + 2 * INTERVAL)
        assert [g["metric"]["state"] for g in guard] == ["idle"], (   # disarmed at promotion
            guard, lab.run("systemctl show opsctl-guard-sglang-k26.timer opsctl-guard-sglang-k26.service "
                           "-p Id -p ActiveState").stdout)
        assert prom.wait("time() - opsctl_watch_last_tick_timestamp_seconds < 10", timeout=3 * SCRAPE_S + 2 * INTERVAL)
        assert prom.value("opsctl_watch_interval_seconds") == INTERVAL
        assert prom.value("opsctl_accept_length_floor") == 2.0
        # the release decays under load: the watch (no controller) switches back to the baseline
        load.start(120, cmin=2, cmax=6, out_min=32, out_max=128, node=lab.node)
        lab.run(f"touch {ONSET_FILE}", check=True)
        t0 = time.monotonic()
        # SGLang's own accept length under the floor the host exports, as the alert rule joins them
        below = prom.wait("max by (host) (sglang:spec_accept_length) < on(host) max by (host) "
                          "(opsctl_accept_length_floor)", timeout=WINDOW + 30)
        assert below and float(below[0]["value"][1]) < 2.0, below
        info = prom.wait(f'opsctl_release_info{{release="{mlab.base}"}}', timeout=WINDOW + 60)
        assert info, f"the watch never switched back: {_ledger(lab)[-2:]}"
        print(f"\nmetrics: decay -> the baseline's release_info in Prometheus {time.monotonic() - t0:.1f}s")
    load.stop(node=lab.node)
    rb = prom.wait('opsctl_rollbacks_total{cause="watch",result="ok"} == 1', timeout=3 * SCRAPE_S + 5)
    assert rb, prom.query("opsctl_rollbacks_total")
    assert prom.value('opsctl_switches_total{cause="watch"}') == 1
    assert prom.wait('opsctl_watch_state{state="tripped"} == 1', timeout=3 * SCRAPE_S + 2 * INTERVAL)
    # the rules Prometheus evaluates: the watch tripped, a rollback in the last hour
    firing = {}

    def alerts():
        firing.clear()
        for a in prom.get("/api/v1/alerts")["alerts"]:
            if a["state"] == "firing":
                firing.setdefault(a["labels"]["alertname"], []).append(a["labels"])
        return {"OpsctlWatchTripped", "OpsctlRollbackRecent"} <= set(firing)

    deadline = time.monotonic() + 20
    while not alerts() and time.monotonic() < deadline:
        time.sleep(1)
    assert {"OpsctlWatchTripped", "OpsctlRollbackRecent"} <= set(firing), firing
    assert firing["OpsctlRollbackRecent"][0]["cause"] == "watch"
    assert "OpsctlReleaseUnjudged" not in firing and "OpsctlWatchSilent" not in firing

    # an operator's rollback back to the DDTree release (healthy again, the fault cleared): its start
    # is compared with the deploy's start of the same profile
    rc, out, err = ops.json("rollback", "--to", ddt, "--reason", "metrics test", inventory=inv)
    assert rc == 0, err
    assert prom.wait('opsctl_rollbacks_total{cause="operator",result="ok"} == 1', timeout=3 * SCRAPE_S + 5)
    assert prom.wait(f'opsctl_release_info{{release="{ddt}"}}', timeout=3 * SCRAPE_S + 5)
    assert prom.value('opsctl_switches_total{cause="rollback"}') >= 1
    prev = [r for r in _ledger(lab) if r.get("action") == "switch" and r.get("to_release") == ddt and r.get("startup")]
    assert len(prev) >= 2
    assert prom.value("opsctl_previous_start_seconds") == pytest.approx(prev[-2]["startup"]["total_s"])
    assert prom.value("opsctl_last_start_seconds") == pytest.approx(prev[-1]["startup"]["total_s"])

    # the dashboard: every metric its queries name is one this Prometheus saw
    seen = set(prom.get("/api/v1/label/__name__/values"))
    names = dashboard_metric_names(json.loads(DASHBOARD.read_text()))
    assert names and names <= seen, f"the dashboard names metrics never scraped: {sorted(names - seen)}"


def dashboard_metric_names(dash: dict) -> set[str]:
    from labtools import dashboard_metric_names as names

    return names(dash)


def _ledger(lab) -> list[dict]:
    from labtools import ledger

    return ledger(lab)
