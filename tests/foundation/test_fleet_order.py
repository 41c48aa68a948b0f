"""A deploy across an inventory group goes host by host and stops at the first failure;
bad input is rejected before any host is contacted."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opsctl.flow import deploy
from opsctl.config import load_inventory
from opsctl.errors import ConfigError, DeployFailed

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fleet(tmp_path: Path):
    inv = tmp_path / "fleet"
    shutil.copytree(REPO / "inventories/blackwell", inv)
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_hosts:\n      hosts:\n"
        "        gpu1: {ansible_host: gpu1.internal}\n"
        "        gpu2: {ansible_host: gpu2.internal}\n"
        "        gpu3: {ansible_host: gpu3.internal}\n")
    return load_inventory(inv)


def test_hosts_go_one_by_one_and_the_first_failure_stops_the_run(fleet, monkeypatch):
    visited = []

    def fake_deploy_one(inv, host, profile, **kw):
        visited.append(host.name)
        if host.name == "gpu2":
            raise DeployFailed("gpu2: gate failed: slower than the baseline; rolled back", "see the verdict")
        return deploy.DeployOutcome(host.name, "r", "promoted", {})

    monkeypatch.setattr(deploy, "deploy_one", fake_deploy_one)
    with pytest.raises(DeployFailed):
        deploy.deploy(fleet, "ddtree", 16)
    assert visited == ["gpu1", "gpu2"]


def test_limit_selects_a_group_or_hosts_in_inventory_order(fleet):
    assert [h.name for h in fleet.select("gpu_hosts")] == ["gpu1", "gpu2", "gpu3"]
    assert [h.name for h in fleet.select("gpu3,gpu1")] == ["gpu3", "gpu1"]


def test_bad_budget_is_rejected_before_any_host_is_contacted(fleet, monkeypatch):
    def must_not_run(*a, **kw):
        raise AssertionError("a host was contacted")

    monkeypatch.setattr(deploy, "deploy_one", must_not_run)
    monkeypatch.setattr(deploy, "connect", must_not_run)
    with pytest.raises(ConfigError):
        deploy.deploy(fleet, "ddtree", 0)
    with pytest.raises(ConfigError):
        deploy.deploy(fleet, "ar-tp8", 8)
