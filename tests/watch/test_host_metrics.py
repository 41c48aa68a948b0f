"""opsctl's node_exporter textfile (opsctl/onhost/metrics.py, issue #54): written by hand on the
host (standard library), read here by prometheus_client's own parser; what each ledger record
counts as; the atomic write; the ledger appender keeping it current; docs/metrics.md naming every
metric and label value."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from opsctl.onhost import archive
from opsctl.onhost import metrics as m

REPO = Path(__file__).resolve().parents[2]
APPENDER = REPO / "playbooks" / "files" / "opsctl-ledger-append"
LEDGER = Path(__file__).parent / "data" / "ledger-metrics-lab.jsonl"   # saved from the lab (test_metrics_lab.py's run)
DOC = REPO / "docs" / "metrics.md"


def _records() -> list[dict]:
    return [json.loads(line) for line in LEDGER.read_text().splitlines() if line.strip()]


def _root(tmp_path: Path, records: list[dict], live: str, manifest: dict) -> Path:
    root = tmp_path / "opt"
    (root / "releases" / live).mkdir(parents=True)
    (root / "releases" / live / "manifest.json").write_text(json.dumps(manifest))
    (root / "current").symlink_to(f"releases/{live}")
    (root / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(fams: dict, family: str, name: str | None = None, **labels) -> float | None:
    for s in fams[family].samples:
        if (name is None or s.name == name) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


@pytest.fixture
def lab_text(tmp_path):
    """The file for the ledger the lab test left (a gated DDTree deploy, the watch's rollback, an
    operator's rollback), with the DDTree release live and a watch state beside it."""
    recs = _records()
    live = [r for r in recs if r.get("action") == "switch"][-1]["to_release"]
    man = {"profile": {"name": "ddtree", "kind": "ddtree", "budget": 16, "accept_len_floor": None},
           "runtime_wheel": {"name": "sglang_ddtree-0.3.0-py3-none-any.whl", "sha256": "ab" * 32},
           "opsctl_version": "0.1.0"}
    root = _root(tmp_path, recs, live, man)
    state_dir = tmp_path / "watch-state"
    state_dir.mkdir()
    (state_dir / "sglang-k26.json").write_text(json.dumps({"ticks": 41, "last": {"ts": 1796461500.25,
                                                                                  "state": "tripped"}}))
    (root / "watch.json").write_text(json.dumps({"service": "sglang-k26", "state_dir": str(state_dir),
                                                 "interval_s": 2}))

    def systemctl(argv, **kw):
        out = "Id=opsctl-guard-sglang-k26.timer\nActiveState=active\n\nId=opsctl-guard-sglang-k26.service\n" \
              "ActiveState=inactive\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    snap = m.collect(str(root), {"guard_unit": "opsctl-guard-sglang-k26"}, now=1796461600.0, run=systemctl)
    return m.exposition(snap), recs, live


def test_the_file_parses_with_prometheus_client_and_says_what_the_ledger_says(lab_text):
    text, recs, live = lab_text
    fams = _families(text)
    info = fams["opsctl_release_info"].samples[0].labels
    assert info == {"release": live, "profile": "ddtree", "kind": "ddtree", "budget": "16", "schedule": "",
                    "runtime": "ab" * 6, "opsctl_version": "0.1.0"}
    verdict = [r for r in recs if r.get("action") == "verdict"][-1]
    assert fams["opsctl_verdict_info"].samples[0].labels["status"] == verdict["status"]
    row = verdict["rows"][0]
    lab = {"concurrency": str(row["concurrency"])}
    assert _sample(fams, "opsctl_verdict_speedup_ratio", **lab) == pytest.approx(row["delta_pct"] / 100)
    assert _sample(fams, "opsctl_verdict_speedup_low_ratio", **lab) == pytest.approx(row["low_pct"] / 100)
    # counters: the ledger's switch records by why, the guard's and the watch's rollbacks as switches too
    switches = [r for r in recs if r.get("action") == "switch"]
    for cause in ("deploy", "rollback"):
        assert _sample(fams, "opsctl_switches", cause=cause) == len([r for r in switches if r["why"] == cause])
    assert _sample(fams, "opsctl_switches", cause="watch") == 1
    assert _sample(fams, "opsctl_rollbacks", cause="watch", result="ok") == 1
    assert _sample(fams, "opsctl_rollbacks", cause="operator", result="ok") == 1
    assert _sample(fams, "opsctl_rollbacks", cause="guard", result="ok") == 0
    last = switches[-1]
    for part in ("drain", "stop", "start", "gap"):
        assert _sample(fams, f"opsctl_last_switch_{part}_seconds") == pytest.approx(last[f"{part}_s"] or 0) \
            or last[f"{part}_s"] is None
    assert _sample(fams, "opsctl_last_start_seconds") == pytest.approx(last["startup"]["total_s"])
    phases = {s.labels["phase"]: s.value for s in fams["opsctl_last_start_phase_seconds"].samples}
    assert phases == {p["phase"]: p["seconds"] for p in last["startup"]["phases"] if p.get("seconds") is not None}
    prev = [r for r in switches[:-1] if (r.get("startup") or {}).get("profile") == last["startup"]["profile"]
            and r["startup"].get("total_s")][-1]
    assert _sample(fams, "opsctl_previous_start_seconds") == pytest.approx(prev["startup"]["total_s"])
    assert _sample(fams, "opsctl_watch_state", state="tripped") == 1
    assert sum(s.value for s in fams["opsctl_watch_state"].samples) == 1
    assert _sample(fams, "opsctl_watch_last_tick_timestamp_seconds") == 1796461500.25
    assert _sample(fams, "opsctl_guard_state", state="armed") == 1
    assert _sample(fams, "opsctl_release_judged") == 1


def test_names_units_and_label_values_follow_prometheus_conventions(lab_text):
    text = lab_text[0]
    for fam in text_string_to_metric_families(text):
        assert re.fullmatch(r"opsctl_[a-z_]+", fam.name), fam.name
        if fam.type == "counter":
            assert all(s.name == fam.name + "_total" for s in fam.samples)
        for s in fam.samples:
            assert not re.search(r"_(ms|minutes|hours|percent|pct)\b", s.name), s.name
            if "seconds" in s.name:
                assert s.name.endswith("_seconds"), s.name


def test_label_values_are_escaped_and_an_unknown_figure_is_left_out(tmp_path):
    odd = 'ddtree "b16"\\x\nnext'
    recs = [{"ts": "2026-12-05T09:00:00Z", "action": "verdict", "status": "fail", "release": odd, "profile": "p",
             "rows": [{"concurrency": 8, "delta_pct": None, "low_pct": -4.0, "high_pct": None}]},
            {"action": "switch", "why": "deploy", "result": "not-ready", "to_release": odd, "gap_s": None,
             "drain_s": 0.0}]
    root = _root(tmp_path, recs, "r1", {"profile": {"name": "ar-tp8", "kind": "autoregressive"}})
    fams = _families(m.exposition(m.collect(str(root), {}, now=1.0)))
    assert fams["opsctl_verdict_info"].samples[0].labels["release"] == odd
    assert "opsctl_verdict_speedup_ratio" not in fams                        # delta unknown: no sample, not 0
    assert _sample(fams, "opsctl_verdict_speedup_high_ratio") == float("inf")  # one-sided interval
    assert "opsctl_last_switch_gap_seconds" not in fams and _sample(fams, "opsctl_last_switch_drain_seconds") == 0
    assert "opsctl_last_start_seconds" not in fams                           # a start that never got ready
    assert _sample(fams, "opsctl_release_judged") == 0                       # r1 has no verdict
    assert "opsctl_accept_length_floor" not in fams                          # autoregressive: no floor


def test_the_write_is_atomic_and_leaves_nothing_beside_the_file(tmp_path):
    path = tmp_path / "node-exporter" / "opsctl.prom"
    m.write_atomic(str(path), "a 1\n")
    ino = path.stat().st_ino
    m.write_atomic(str(path), "a 2\n")
    assert path.read_text() == "a 2\n" and path.stat().st_ino != ino            # a new file renamed over it
    assert sorted(p.name for p in path.parent.iterdir()) == ["opsctl.prom"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"                          # node_exporter's user reads it


def _host(tmp_path: Path, textfile: Path, config: dict | None = None) -> Path:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "opsctl-onhost.pyz").write_bytes(archive())
    (root / "metrics.json").write_text(json.dumps(config if config is not None else {"textfile": str(textfile)}))
    return root


def _append(root: Path, rec: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", str(APPENDER), str(root / "ledger.jsonl")],
                          input=json.dumps(rec) + "\n", capture_output=True, text=True, timeout=60)


def test_every_ledger_append_rewrites_the_file(tmp_path):
    textfile = tmp_path / "ne" / "opsctl.prom"
    root = _host(tmp_path, textfile)
    res = _append(root, {"ts": "2026-12-05T10:00:00Z", "action": "rollback", "result": "ok", "who": "ops@laptop",
                         "from_release": "a", "to_release": "b"})
    assert res.returncode == 0 and res.stderr == ""
    fams = _families(textfile.read_text())
    assert _sample(fams, "opsctl_rollbacks", cause="operator", result="ok") == 1
    _append(root, {"ts": "2026-12-05T10:01:00Z", "action": "rollback", "result": "ok", "who": "opsctl-guard@lab",
                   "guard": True, "automatic": True})
    fams = _families(textfile.read_text())
    assert _sample(fams, "opsctl_rollbacks", cause="guard", result="ok") == 1
    assert _sample(fams, "opsctl_switches", cause="guard") == 1


def test_a_metrics_failure_never_fails_the_append(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    root = _host(tmp_path, blocker / "opsctl.prom")           # its directory is a file: the write fails
    res = _append(root, {"action": "note"})
    assert res.returncode == 0 and "metrics file was not written" in res.stderr
    assert json.loads((root / "ledger.jsonl").read_text())["action"] == "note"
    off = _host(tmp_path / "off", tmp_path / "never.prom", {"textfile": None})   # opsctl.metrics.textfile: null
    assert _append(off, {"action": "note"}).returncode == 0 and not (tmp_path / "never.prom").exists()


def test_docs_name_every_metric_and_label_value(lab_text):
    doc = DOC.read_text()
    fams = _families(lab_text[0])
    for name, fam in fams.items():
        shown = name + "_total" if fam.type == "counter" else name
        assert f"`{shown}`" in doc, f"docs/metrics.md does not document {shown}"
    for values in (m.SWITCH_CAUSES, m.ROLLBACK_CAUSES, m.WATCH_STATES, m.GUARD_STATES, m.RESULTS):
        for v in values:
            assert f"`{v}`" in doc, f"docs/metrics.md does not name the label value {v}"


def test_the_controller_names_the_guard_unit_the_switch_arms():
    from opsctl.config import load_inventory
    from opsctl.flow.switch import guard_unit
    from opsctl.hostmetrics import host_config

    host = load_inventory(REPO / "inventories" / "lab").hosts["lab"]
    cfg = host_config(host)
    assert cfg["guard_unit"] == guard_unit(host)
    assert cfg["textfile"] == "/var/lib/prometheus/node-exporter/opsctl.prom"
    assert cfg["analysis"]["ddtree"]["schema"]


def test_a_switch_the_host_recorded_counts_once_with_its_starts_figures(tmp_path):
    """Since issue #50 the host's switch program writes the `switch` record and the controller adds
    a `start` record (same switch_id) with the gap and the start's phases: the file (saved from the
    lab's run of test_metrics_lab.py) counts each switch once and takes its figures from its start,
    as `opsctl status` reads them (facts.fold_switches)."""
    from opsctl.host.facts import fold_switches

    recs = [json.loads(line) for line in (LEDGER.parent / "ledger-metrics-lab-host-switch.jsonl").read_text()
            .splitlines() if line.strip()]
    raw_switches = [r for r in recs if r.get("action") == "switch"]
    assert raw_switches and all(r["by"] == "opsctl-switch" and "gap_s" not in r for r in raw_switches)
    live = raw_switches[-1]["to_release"]
    root = _root(tmp_path, recs, live, {"profile": {"name": "ar-tp8", "kind": "autoregressive"}})
    fams = _families(m.exposition(m.collect(str(root), {}, now=1796461600.0,
                                            run=lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", ""))))
    assert _sample(fams, "opsctl_switches", cause="deploy") == 2 and _sample(fams, "opsctl_switches",
                                                                            cause="rollback") == 1
    last = [r for r in fold_switches(recs) if r.get("action") == "switch"][-1]
    assert last["switch_id"] == raw_switches[-1]["switch_id"] and last["gap_s"] is not None
    for part in ("drain", "stop", "start", "gap"):
        assert _sample(fams, f"opsctl_last_switch_{part}_seconds") == pytest.approx(last[f"{part}_s"]), part
    assert _sample(fams, "opsctl_last_start_seconds") == pytest.approx(last["startup"]["total_s"])
    phases = {s.labels["phase"]: s.value for s in fams["opsctl_last_start_phase_seconds"].samples}
    assert phases and phases == {p["phase"]: p["seconds"] for p in last["startup"]["phases"]
                                 if p.get("seconds") is not None}
