"""deploy/prometheus/opsctl-rules.yml: `promtool check rules` and its unit tests on synthetic
series (`promtool test rules`). promtool is Debian's `prometheus` package (scripts/bootstrap
installs it)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "opsctl-rules.yml"
RULE_TESTS = RULES_DIR / "opsctl-rules.test.yml"
ISSUE_ALERTS = {"OpsctlWatchSilent", "OpsctlWatchNeverTicked", "OpsctlWatchTripped", "OpsctlRollbackRecent",
                "OpsctlReleaseUnjudged", "OpsctlStartSlower", "OpsctlAcceptLengthBelowFloor"}


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing (Debian package prometheus): run scripts/bootstrap as root"
    return path


def test_promtool_check_rules():
    res = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(ISSUE_ALERTS)} rules found" in res.stdout


def test_promtool_rule_unit_tests():
    res = subprocess.run([_promtool(), "test", "rules", RULE_TESTS.name], cwd=RULES_DIR, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alert_has_a_firing_and_a_quiet_case():
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert rules == ISSUE_ALERTS
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    firing = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert firing == ISSUE_ALERTS, f"no firing case for {ISSUE_ALERTS - firing}"
    assert quiet == ISSUE_ALERTS, f"no quiet case for {ISSUE_ALERTS - quiet}"
