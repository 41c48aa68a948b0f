"""Issue #32 item 11: the watch's notify URL (a webhook token) is in a 0600 file on the host
and never printed (`watch status --json` shows its scheme and host only)."""
from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import yaml

from opsctl.host.connection import Result
from opsctl.onhost import watch_agent as agent
from opsctl.watch import _agent

REPO = Path(__file__).resolve().parents[2]
URL = "https://ops:hunter2@hooks.example.com/services/T000/B000/SECRETTOKEN?sig=abc"
SECRETS = ("SECRETTOKEN", "hunter2", "sig=abc", "/services/")


def _clean(text: str) -> None:
    for s in SECRETS:
        assert s not in text, text


def test_redact_url_keeps_scheme_and_host_only():
    assert agent.redact_url(URL) == "https://hooks.example.com/<redacted>"
    assert agent.redact_url("http://10.0.0.5:8080/hook") == "http://10.0.0.5:8080/<redacted>"
    assert agent.redact_url(None) is None


def test_agent_status_never_prints_the_url(tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "_run", lambda argv, timeout=30, **kw: subprocess.CompletedProcess(argv, 0, "", ""))
    cfg = {"root": str(tmp_path), "unit": "sglang-k26.service", "service": "sglang-k26", "port": 1,
           "state_dir": str(tmp_path / "state"), "mode": "rollback", "notify": {"url": URL, "timeout_s": 5}}
    rep = agent.status_report(cfg)
    _clean(json.dumps(rep))
    assert rep["config"]["notify"]["url"] == "https://hooks.example.com/<redacted>"
    assert rep["config"]["notify"]["timeout_s"] == 5


def test_the_controller_redacts_an_older_agents_status():
    class Conn:
        def run(self, command, **kw):
            body = json.dumps({"config": {"mode": "rollback", "notify": {"url": URL}}, "last": {}})
            return Result(command, 0, body + "\n", "")

    from opsctl.config import load_inventory

    host = load_inventory(REPO / "inventories/lab").single()
    rep = _agent(Conn(), host, "status")
    _clean(json.dumps(rep))


def test_a_failed_post_is_recorded_without_the_url(tmp_path, monkeypatch):
    def refuse(req, timeout):
        raise ValueError(f"unknown url type: {req.full_url!r}")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(agent.time, "sleep", lambda s: None)
    w = agent.Watch({"root": str(tmp_path), "unit": "u", "service": "s", "port": 1,
                     "state_dir": str(tmp_path / "state"), "notify": {"url": URL}})
    out = w.notify({"event": "alert"})
    assert "error" in out["url"]
    _clean(json.dumps(out))


def test_the_watch_configuration_is_installed_0600_and_not_logged():
    play = yaml.safe_load((REPO / "playbooks/prepare.yml").read_text())
    tasks = []

    def walk(items):
        for t in items or []:
            tasks.append(t)
            walk(t.get("block"))
            walk(t.get("tasks"))

    for p in play:
        walk(p.get("tasks"))
    task = next(t for t in tasks if (t.get("ansible.builtin.copy") or {}).get("dest") == "{{ opsctl_watch_config_path }}")
    assert task["ansible.builtin.copy"]["mode"] == "0600" and task.get("no_log") is True
