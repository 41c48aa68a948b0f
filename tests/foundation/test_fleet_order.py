"""A deploy across an inventory goes in the rollout's waves (canary first, then Ansible's
serial batches), stages each wave together, stops at the first failed wave and then
rolls back (rollback_all) or keeps (hold) the hosts that took the release; bad input and
unreachable hosts are reported before any host changes.

The host steps are replaced by recorders here; tests/deploy/test_fleet_lab.py runs the
same rollouts against a 3-host lab."""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from opsctl.config import RolloutPolicy, load_inventory
from opsctl.errors import ConfigError, DeployFailed, HostError
from opsctl.flow import deploy, rollout

REPO = Path(__file__).resolve().parents[2]


def _fleet(tmp_path: Path, n: int = 3, rollout_policy: dict | None = None) -> Path:
    inv = tmp_path / "fleet"
    shutil.copytree(REPO / "inventories/blackwell", inv)
    hosts = "".join(f"        gpu{i}: {{ansible_host: gpu{i}.internal}}\n" for i in range(1, n + 1))
    (inv / "hosts.yml").write_text("all:\n  children:\n    gpu_hosts:\n      hosts:\n" + hosts)
    if rollout_policy is not None:
        gv = inv / "group_vars" / "all.yml"
        data = yaml.safe_load(gv.read_text())
        data["opsctl"]["rollout"] = rollout_policy
        gv.write_text(yaml.safe_dump(data))
    return inv


@pytest.fixture
def fleet(tmp_path: Path):
    return load_inventory(_fleet(tmp_path))


@dataclass
class _State:
    current: str | None = "base"
    releases: dict = field(default_factory=dict)

    def last_good(self, exclude=None):
        return "base" if exclude != "base" else None

    def baseline(self, _profile):
        return "base"

    def judged(self, _r):
        return True


@dataclass
class _Plan:
    host: object
    release: str = "new"
    state: _State = field(default_factory=_State)

    def as_dict(self):
        return {"release": self.release}

    @property
    def previous(self):
        return self.state.current


class _Conn:
    def close(self):
        pass


@pytest.fixture
def recorder(monkeypatch):
    """Every host step replaced by a recorder: calls[] in order; fail_on[host] raises at _apply."""
    calls: list[tuple] = []
    fail_on: dict[str, Exception] = {}
    unreachable: set[str] = set()

    def fake_connect(host):
        if host.name in unreachable:
            raise HostError(f"host {host.name} is unreachable over SSH", "check the address")
        calls.append(("connect", host.name))
        return _Conn()

    class FakeLock:
        def __init__(self, conn, host, action):
            self.host = host

        def __enter__(self):
            calls.append(("lock", self.host.name))
            return self

        def __exit__(self, *exc):
            calls.append(("unlock", self.host.name))

    def fake_stage_wave(inv, items):
        calls.append(("stage", tuple(plan.host.name for _, plan, _ in items)))
        return {plan.host.name: (None, None, None) for _, plan, _ in items}

    def fake_apply(conn, inv, host, profile, plan, steps, gates, *, staged, checks=True, trial=None):
        calls.append(("apply", host.name))
        if host.name in fail_on:
            raise fail_on[host.name]
        return deploy.DeployOutcome(host.name, plan.release, "promoted", plan.as_dict(), {})

    def fake_rollback_one(host, to, reason, progress):
        calls.append(("rollback", host.name, to))
        return []

    monkeypatch.setattr(deploy, "connect", fake_connect)
    monkeypatch.setattr(deploy, "make_plan", lambda conn, host, profile, verify_weights=False: _Plan(host))
    monkeypatch.setattr(deploy, "require_baseline", lambda conn, host: None)
    monkeypatch.setattr(deploy, "HostLock", FakeLock)
    monkeypatch.setattr(deploy, "stage_wave", fake_stage_wave)
    monkeypatch.setattr(deploy, "_out_of_pool", lambda failed: [])  # the fake hosts answer no health probe
    monkeypatch.setattr(deploy, "_apply", fake_apply)
    monkeypatch.setattr(deploy, "rollback_host", fake_rollback_one)
    monkeypatch.setattr(deploy, "ledger_rollout", lambda rid: _nullcontext())
    return calls, fail_on, unreachable


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _run(inv, profile="ar-tp8", **kw):
    return deploy.deploy(inv, profile, pre_checks=False, gates=False, **kw)


def _of(calls, kind):
    return [c[1] for c in calls if c[0] == kind]


def test_default_rollout_goes_host_by_host_each_staged_alone(fleet, recorder):
    calls, _, _ = recorder
    outcomes = _run(fleet)
    assert [o.result for o in outcomes] == ["promoted"] * 3
    assert _of(calls, "stage") == [("gpu1",), ("gpu2",), ("gpu3",)]
    assert _of(calls, "apply") == ["gpu1", "gpu2", "gpu3"]
    assert [o.details["wave"] for o in outcomes] == ["wave 1", "wave 2", "wave 3"]
    assert len({o.details["rollout"] for o in outcomes}) == 1


def test_canary_then_serial_waves_stage_each_wave_in_one_run(tmp_path, recorder):
    calls, _, _ = recorder
    inv = load_inventory(_fleet(tmp_path, 5, {"canary": ["gpu3"], "waves": [1, "100%"]}))
    outcomes = _run(inv)
    assert _of(calls, "stage") == [("gpu3",), ("gpu1",), ("gpu2", "gpu4", "gpu5")]
    assert _of(calls, "apply") == ["gpu3", "gpu1", "gpu2", "gpu4", "gpu5"]
    assert {o.host: o.details["wave"] for o in outcomes} == {"gpu3": "canary", "gpu1": "wave 1", "gpu2": "wave 2",
                                                             "gpu4": "wave 2", "gpu5": "wave 2"}
    # every host of a wave is locked before its staging starts
    i_stage = calls.index(("stage", ("gpu2", "gpu4", "gpu5")))
    assert {c[1] for c in calls[:i_stage] if c[0] == "lock"} >= {"gpu2", "gpu4", "gpu5"}


def test_failed_gate_in_a_later_wave_rolls_back_every_host_that_took_the_release(tmp_path, recorder):
    calls, fail_on, _ = recorder
    inv = load_inventory(_fleet(tmp_path, 4, {"canary": 1, "waves": [1, "100%"]}))
    fail_on["gpu3"] = DeployFailed("gpu3: gate failed: -12.0 % at C=8, past the -10 % limit; rolled back to base",
                                   "see the verdict")
    with pytest.raises(DeployFailed) as exc:
        _run(inv)
    assert _of(calls, "apply") == ["gpu1", "gpu2", "gpu3"]          # gpu4 never switched
    assert [c for c in calls if c[0] == "rollback"] == [("rollback", "gpu2", "base"), ("rollback", "gpu1", "base")]
    msg = exc.value.problem
    assert "stopped in wave 2" in msg and "gpu3: gate failed: -12.0 % at C=8" in msg and "not reached" not in msg
    assert "rolled back (on_failure: rollback_all): gpu2 -> base, gpu1 -> base" in msg
    hosts = exc.value.details["hosts"]
    assert hosts["gpu4"]["result"] == "not-reached" and hosts["gpu3"]["result"] == "failed"
    assert hosts["gpu1"]["rolled_back_to"] == "base"


def test_hold_keeps_the_earlier_waves_and_names_what_was_not_reached(tmp_path, recorder):
    calls, fail_on, _ = recorder
    inv = load_inventory(_fleet(tmp_path, 3, {"canary": 1, "waves": [1], "on_failure": "hold"}))
    fail_on["gpu2"] = DeployFailed("gpu2: validation failed: capture.verify_width", "see the findings")
    with pytest.raises(DeployFailed) as exc:
        _run(inv)
    assert _of(calls, "rollback") == []
    assert _of(calls, "apply") == ["gpu1", "gpu2"]
    assert "on_failure: hold: gpu1 keeps the new release" in exc.value.problem
    assert "not reached: gpu3" in exc.value.problem


def test_max_fail_percentage_lets_a_wave_lose_its_share_then_reports_it(tmp_path, recorder):
    calls, fail_on, _ = recorder
    inv = load_inventory(_fleet(tmp_path, 4, {"waves": [2], "max_fail_percentage": 50}))
    fail_on["gpu1"] = DeployFailed("gpu1: gate failed: slower", "see the verdict")
    with pytest.raises(DeployFailed) as exc:
        _run(inv)
    # 1 of 2 is not more than 50 %: the wave and the next ran; nothing was rolled back
    assert _of(calls, "apply") == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert _of(calls, "rollback") == []
    assert "reached every wave, but 1 host(s) failed" in exc.value.problem


def test_an_unreachable_host_stops_the_rollout_before_any_host_is_locked(fleet, recorder):
    calls, _, unreachable = recorder
    unreachable.add("gpu3")
    with pytest.raises(HostError) as exc:
        _run(fleet)
    assert exc.value.exit_code == 3 and "gpu3" in exc.value.problem
    assert [c[0] for c in calls] == ["connect", "connect"]


def test_one_host_raises_its_own_error_unchanged(fleet, recorder):
    _, fail_on, _ = recorder
    err = DeployFailed("gpu2: gate failed: slower; rolled back to base", "see the verdict table above")
    fail_on["gpu2"] = err
    with pytest.raises(DeployFailed) as exc:
        _run(fleet, limit="gpu2")
    assert exc.value is err


def test_waves_are_ansible_serial_batches():
    names = [f"h{i}" for i in range(1, 9)]
    assert rollout.serial_batches(names, [1, "25%", "100%"]) == [["h1"], ["h2", "h3"], ["h4", "h5", "h6", "h7", "h8"]]
    assert rollout.serial_batches(names, [3]) == [["h1", "h2", "h3"], ["h4", "h5", "h6"], ["h7", "h8"]]
    assert rollout.serial_batches(names[:3], ["10%"]) == [["h1"], ["h2"], ["h3"]]   # Ansible's floor of 1


def test_rollout_policy_is_checked_at_load(tmp_path):
    for bad, word in (({"waves": [0]}, "at least 1 host"), ({"waves": ["12.5%"]}, "percentage"),
                      ({"on_failure": "pray"}, "on_failure"), ({"wave": [1]}, "wave")):
        with pytest.raises(ConfigError) as exc:
            load_inventory(_fleet(tmp_path / str(len(str(bad))) / word.replace(" ", "_"), 2, bad))
        assert word in str(exc.value)
    hosts = list(load_inventory(_fleet(tmp_path / "ok", 3)).hosts.values())
    with pytest.raises(ConfigError, match="gpu9, not a host of the inventory"):
        rollout.plan_waves(hosts, RolloutPolicy(canary=["gpu9"]), [h.name for h in hosts])
    # a --limit that leaves the canary out: this run has no canary wave
    waves = rollout.plan_waves(hosts[1:], RolloutPolicy(canary=["gpu1"], waves=["100%"]), [h.name for h in hosts])
    assert [(w.name, w.hosts) for w in waves] == [("wave 1", ("gpu2", "gpu3"))]


def test_wave_failure_rule_is_ansibles():
    p = RolloutPolicy(max_fail_percentage=50)
    assert not rollout.wave_failed(1, 2, p) and rollout.wave_failed(2, 3, p)
    assert rollout.wave_failed(1, 10, RolloutPolicy())


def test_limit_selects_a_group_or_hosts_in_inventory_order(fleet):
    assert [h.name for h in fleet.select("gpu_hosts")] == ["gpu1", "gpu2", "gpu3"]
    assert [h.name for h in fleet.select("gpu3,gpu1")] == ["gpu3", "gpu1"]


def test_bad_budget_is_rejected_before_any_host_is_contacted(fleet, monkeypatch):
    def must_not_run(*a, **kw):
        raise AssertionError("a host was contacted")

    monkeypatch.setattr(deploy, "connect", must_not_run)
    with pytest.raises(ConfigError):
        deploy.deploy(fleet, "ddtree", 0)
    with pytest.raises(ConfigError):
        deploy.deploy(fleet, "ar-tp8", 8)


def test_a_host_unhealthy_after_the_soak_stops_the_rollout_before_the_next_wave(tmp_path, recorder, monkeypatch):
    calls, _, _ = recorder
    inv = load_inventory(_fleet(tmp_path, 3, {"canary": 1, "waves": ["100%"], "soak_s": 1}))
    soaked = []
    monkeypatch.setattr(deploy, "sleep_soak", lambda s, note: soaked.append(s))

    def gather(conn, *facts, timeout=60):
        calls.append(("probe",))
        return {"ActiveState": "failed"}, 0

    monkeypatch.setattr(deploy.facts, "gather", gather)
    with pytest.raises(DeployFailed) as exc:
        _run(inv)
    assert soaked == [1]
    assert _of(calls, "apply") == ["gpu1"]                        # wave 1 never switched
    assert ("rollback", "gpu1", "base") in calls
    assert "gpu1: unhealthy after the 1s soak: service failed, /health answered nothing" in exc.value.problem
    assert "stopped in the soak after canary" in exc.value.problem and "(rolled back: gpu1 -> base)" in exc.value.problem
    assert "not reached: gpu2, gpu3" in exc.value.problem


def test_a_healthy_soak_lets_the_next_wave_go(tmp_path, recorder, monkeypatch):
    calls, _, _ = recorder
    inv = load_inventory(_fleet(tmp_path, 3, {"canary": 1, "waves": ["100%"], "soak_s": 1}))
    monkeypatch.setattr(deploy, "sleep_soak", lambda s, note: None)
    monkeypatch.setattr(deploy.facts, "gather", lambda conn, *f, timeout=60: ({"ActiveState": "active"}, 200))
    assert [o.result for o in _run(inv)] == ["promoted"] * 3
    assert _of(calls, "stage") == [("gpu1",), ("gpu2", "gpu3")]


def test_an_interrupt_mid_rollout_puts_back_the_hosts_that_took_the_release(tmp_path, recorder):
    from opsctl.brake import Interrupted

    calls, fail_on, _ = recorder
    inv = load_inventory(_fleet(tmp_path, 3, {"canary": 1, "waves": ["100%"]}))
    fail_on["gpu2"] = Interrupted("interrupted (SIGINT) during bench, after the switch: rolled back to base, which "
                                  "serves again", signal_name="SIGINT", details={"step": "bench", "switched": True})
    with pytest.raises(Interrupted) as exc:
        _run(inv)
    assert exc.value.exit_code == 130
    assert _of(calls, "apply") == ["gpu1", "gpu2"]
    assert [c for c in calls if c[0] == "rollback"] == [("rollback", "gpu1", "base")]
    assert "rolled back (on_failure: rollback_all): gpu1 -> base" in exc.value.problem
    assert exc.value.details["hosts"]["gpu3"]["result"] == "not-reached"


def test_a_host_with_fewer_gpus_than_the_profile_needs_is_refused_before_any_host_io(tmp_path, monkeypatch):
    inv_dir = _fleet(tmp_path, 3)
    (inv_dir / "host_vars").mkdir(exist_ok=True)
    # a host's opsctl: is its whole mapping, as Ansible reads it (a mapping set twice is replaced)
    full = yaml.safe_load((inv_dir / "group_vars" / "all.yml").read_text())["opsctl"]
    full["gpu"]["count"] = 4
    (inv_dir / "host_vars" / "gpu3.yml").write_text(yaml.safe_dump({"opsctl": full}))
    inv = load_inventory(inv_dir)

    def must_not_run(*a, **kw):
        raise AssertionError("a host was contacted")

    monkeypatch.setattr(deploy, "connect", must_not_run)
    with pytest.raises(ConfigError) as exc:
        deploy.deploy(inv, "ar-tp8")
    assert "host gpu3 has opsctl.gpu.count 4" in exc.value.problem and "8 GPUs" in exc.value.problem
    assert "host_vars/gpu3.yml" in exc.value.fix
    # per-host profile overrides from host_vars make it fit: the other hosts keep tp 8
    full["profiles"]["ar-tp8"] = {"tp_size": 4}
    (inv_dir / "host_vars" / "gpu3.yml").write_text(yaml.safe_dump({"opsctl": full}))
    inv = load_inventory(inv_dir)
    assert [h.profile("ar-tp8").tp_size for h in inv.hosts.values()] == [8, 8, 4]
