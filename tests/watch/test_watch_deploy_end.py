"""Issue #32 item 4: the watch leaves `deploying` on every ledger record that ends a
deploy-like operation (a tune's restore, a guard that finds nothing to do, a deploy that
failed before its switch), not only on promote / rollback / unchanged."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from opsctl.onhost import watch_agent as agent
from watchspecs import spec_dict

REPO = Path(__file__).resolve().parents[2]
STARTED = {"action": "deploy", "result": "started", "to_release": "ddtree-b8-t1"}
TRIAL = {"action": "deploy", "result": "trial", "to_release": "ddtree-b8-t1", "trial": True}


@pytest.mark.parametrize("end", [
    {"action": "tune", "result": "ok", "restored": "ddtree-b16-a", "to_release": None},
    {"action": "tune", "result": "interrupted", "restored": "ddtree-b16-a", "to_release": None},
    {"action": "guard", "result": "unchanged", "release": "ddtree-b8-t1", "live": "ddtree-b16-a"},
    {"action": "rollback", "result": "ok", "reason": "guard-timeout", "to_release": "ddtree-b16-a"},
    {"action": "rollback", "result": "failed", "to_release": "ddtree-b16-a"},
    {"action": "promote", "result": "ok", "to_release": "ddtree-b8-t1"},
    {"action": "deploy", "result": "unchanged", "to_release": "ddtree-b16-a"},
    {"action": "deploy", "result": "failed", "switched": False, "to_release": "ddtree-b8-t1"},
    {"action": "deploy", "result": "interrupted", "switched": False, "to_release": "ddtree-b8-t1"},
], ids=lambda r: f"{r['action']}-{r['result']}")
def test_each_end_of_a_deploy_like_operation_leaves_deploying(end):
    assert agent.ledger_view([STARTED])["deploying"] is True
    assert agent.ledger_view([STARTED, end])["deploying"] is False
    assert agent.ledger_view([end], deploying=True)["deploying"] is False


def test_a_tune_is_deploying_through_its_trials_until_its_restore():
    trials = [STARTED, TRIAL, {**STARTED, "to_release": "ddtree-b4-t2"}, {**TRIAL, "to_release": "ddtree-b4-t2"}]
    assert agent.ledger_view(trials)["deploying"] is True     # the tune goes on: its guard is still armed
    assert agent.ledger_view(trials + [{"action": "tune", "result": "ok", "to_release": None}])["deploying"] is False


@pytest.mark.parametrize("mid", [
    {"action": "verdict", "result": "failed", "release": "ddtree-b8-t1"},
    {"action": "validation", "result": "ok"},
    {"action": "deploy", "result": "interrupted", "switched": True, "to_release": "ddtree-b8-t1"},
])
def test_records_inside_a_deploy_keep_it_deploying(mid):
    assert agent.ledger_view([STARTED, mid])["deploying"] is True


def _host_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for rel, prof in (("ddtree-b16-a", {"name": "ddtree", "kind": "ddtree", "budget": 16}),
                      ("ddtree-b8-t1", {"name": "ddtree", "kind": "ddtree", "budget": 8})):
        (root / "releases" / rel).mkdir(parents=True)
        (root / "releases" / rel / "manifest.json").write_text(json.dumps({"profile": prof, "created_at": rel}))
    os.symlink("releases/ddtree-b16-a", root / "current")
    return root


def _append(root: Path, *recs: dict) -> None:
    with open(root / "ledger.jsonl", "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def test_the_watch_state_machine_after_a_tune(tmp_path, monkeypatch):
    root = _host_root(tmp_path)
    cfg = {"root": str(root), "unit": "sglang-k26.service", "service": "sglang-k26", "port": 1,
           "state_dir": str(tmp_path / "state"), "host": "h", "mode": "rollback", "window_s": 60, "interval_s": 15,
           "min_samples": 4, "baseline_profile": "ar-tp8", "notify": {}, "analysis": {},
           "default_analysis": spec_dict({})}
    monkeypatch.setattr(agent, "http_get", lambda url, timeout: (0, ""))
    monkeypatch.setattr(agent.Watch, "read_journal", lambda self: None)
    w = agent.Watch(cfg)
    _append(root, STARTED, TRIAL)
    assert w.tick()["state"] == "deploying"
    _append(root, {"action": "tune", "result": "ok", "restored": "ddtree-b16-a", "to_release": None})
    assert w.tick()["state"] != "deploying"
    _append(root, STARTED)
    assert w.tick()["state"] == "deploying"
    _append(root, {"action": "guard", "result": "unchanged", "release": "ddtree-b8-t1", "live": "ddtree-b16-a"})
    assert w.tick()["state"] != "deploying"


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("python3") is None, reason="needs bash and python3")
def test_a_guard_with_nothing_to_do_writes_its_record(tmp_path):
    root = _host_root(tmp_path)
    (root / "bin").mkdir()
    for f in ("opsctl-switch", "opsctl-ledger-append"):
        shutil.copy(REPO / "playbooks/files" / f, root / "bin" / f)
        (root / "bin" / f).chmod(0o755)
    res = subprocess.run([str(root / "bin/opsctl-switch"), str(root), "sglang-k26", "ddtree-b16-a", "guard-timeout",
                          "lab", "ddtree-b8-t1"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "nothing to do" in res.stdout, res.stderr
    recs = [json.loads(line) for line in (root / "ledger.jsonl").read_text().splitlines()]
    assert recs[-1]["action"] == "guard" and recs[-1]["release"] == "ddtree-b8-t1" and recs[-1]["live"] == "ddtree-b16-a"
    assert agent.ledger_view(recs, deploying=True)["deploying"] is False
    assert os.readlink(root / "current") == "releases/ddtree-b16-a"   # nothing switched


def test_a_deploy_that_fails_before_its_switch_records_its_end(monkeypatch):
    from types import SimpleNamespace

    from opsctl.errors import HostError
    from opsctl.flow import deploy
    from opsctl.flow.steps import Steps

    ledger: list[dict] = []
    monkeypatch.setattr(deploy, "append_ledger", lambda conn, host, rec: ledger.append(rec) or rec)
    monkeypatch.setattr(deploy, "fallback_releases", lambda state, host, exclude: ["ddtree-b16-a"])
    monkeypatch.setattr(deploy, "require_room", lambda *a, **k: None)

    def guard_fails(*a, **k):
        raise HostError("systemd-run failed")

    monkeypatch.setattr(deploy, "arm_guard", guard_fails)
    plan = SimpleNamespace(release="ddtree-b8-t1", previous="ddtree-b16-a", is_live=False,
                           state=SimpleNamespace(judged=lambda r: False), repairs=[], triton_outcome=None)
    profile = SimpleNamespace(name="ddtree", budget=8, readiness_timeout_s=60)
    plan.profile = profile
    host = SimpleNamespace(name="h", settings=SimpleNamespace(guard_s=None))
    with pytest.raises(HostError):
        deploy._apply(object(), None, host, profile, plan, Steps(None, "h"), True,
                      staged=(SimpleNamespace(changed=False), None))
    assert [r["result"] for r in ledger] == ["started", "failed"] and ledger[1]["switched"] is False
    assert agent.ledger_view(ledger)["deploying"] is False
