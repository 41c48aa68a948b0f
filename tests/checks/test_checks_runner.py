"""The runner, the plugin's ssh_config and plain-pytest use, without a host: an
inventory whose host is a closed port on loopback (every check fails fast)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.checks import catalog
from opsctl.checks.plugin import ssh_config_text
from opsctl.checks.runner import run_checks
from opsctl.config import load_inventory
from opsctl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dead_inventory(tmp_path):
    """inventories/lab with its host moved to 127.0.0.1:9 (nothing listens: connection refused)."""
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories" / "lab", inv)
    text = (inv / "hosts.yml").read_text().replace("10.203.9.2", "127.0.0.1").replace("ansible_port: 22",
                                                                                      "ansible_port: 9")
    (inv / "hosts.yml").write_text(text)
    return inv


def test_ssh_config_from_inventory(dead_inventory):
    lab = load_inventory(REPO / "inventories" / "lab").hosts["lab"]
    text = ssh_config_text([lab], Path("/tmp/x"))
    assert "Host lab 10.203.9.2\n" in text and "HostName 10.203.9.2" in text
    assert "StrictHostKeyChecking no" in text and "UserKnownHostsFile /dev/null" in text  # lab only
    assert "IdentityFile /var/lib/opsctl-lab/id_ed25519" in text and "ControlPath /tmp/x/cm-%C" in text
    strict = lab.model_copy(update={"ssh": lab.ssh.model_copy(update={"strict_host_keys": True,
                                                                       "known_hosts": Path("/etc/kh")})})
    text = ssh_config_text([strict])
    assert "StrictHostKeyChecking yes" in text and "UserKnownHostsFile /etc/kh" in text
    assert "ControlPath" not in text


def test_unreachable_host_fails_every_check_with_one_message(dead_inventory):
    report = run_checks(load_inventory(dead_inventory), "all")
    assert not report.ok
    assert {r.check for r in report.results} == set(catalog.names("all"))
    assert all(r.host == "lab" and not r.ok for r in report.results)
    first = report.result("ssh_reachable")
    assert first.outcome == "failed" and "127.0.0.1:9" in first.message and "refused" in first.message.lower()
    others = [r for r in report.results if r.check != "ssh_reachable"]
    assert all(r.message.startswith("host unreachable:") for r in others), [r.message for r in others]
    assert all(r.fix == catalog.fix_for("ssh_reachable") for r in others)
    d = report.as_dict()
    assert d["counts"]["passed"] == 0 and len(d["results"]) == len(catalog.names("all"))
    json.dumps(d)
    f = report.findings()
    assert f[0].check == "pre.ssh_reachable" and not f[0].ok and f[0].details["host"] == "lab"


def test_bad_group_and_limit_are_config_errors(dead_inventory):
    inv = load_inventory(dead_inventory)
    with pytest.raises(ConfigError):
        run_checks(inv, "later")
    with pytest.raises(ConfigError):
        run_checks(inv, "pre", limit="nosuchhost")


def test_plain_pytest_pyargs_collects_per_host_items(dead_inventory, tmp_path):
    """Documented plain use: pytest -p opsctl.checks.plugin --pyargs opsctl.checks --inventory DIR."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "opsctl.checks.plugin",
                           "--pyargs", "opsctl.checks", "--inventory", str(dead_inventory), "--co", "-q"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_pre.py::test_gpu_count[ssh://lab]" in proc.stdout
    assert "test_post.py::test_unit_file_matches_render[ssh://lab]" in proc.stdout


def test_plain_pytest_with_env_inventory(dead_inventory, tmp_path):
    """OPSCTL_INVENTORY instead of --inventory; the conftest loads the plugin by itself."""
    import os

    env = {**os.environ, "OPSCTL_INVENTORY": str(dead_inventory)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs",
                           "opsctl.checks.test_pre", "-q", "-k", "ssh_reachable"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed" in proc.stdout and "cannot run commands on lab over SSH" in proc.stdout


def test_cli_check_exits_6_with_json(dead_inventory):
    proc = subprocess.run([sys.executable, "-m", "opsctl", "check", "pre", "-i", str(dead_inventory), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 6, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is False and data["group"] == "pre" and data["results"][0]["check"] == "ssh_reachable"
