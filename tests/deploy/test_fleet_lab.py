"""Rollouts across a 3-host lab (inventories/lab-fleet: canary lab1, then lab2 and lab3
in one wave), end to end with the CLI: per-host baselines, waves in order with the
wave's staging overlapping, a fault on a later wave's host stopping the rollout with
rollback_all and with hold, an unreachable host refused before anything changes, and a
controller killed mid-wave (the guard timers) followed by a converging deploy."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from labtools import Ops, reset_host

REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]

pytestmark = pytest.mark.lab


def _ledger(host) -> list[dict]:
    from opsctl.host.facts import fold_switches

    text = host.run("cat /opt/opsctl/ledger.jsonl", check=False).stdout
    return fold_switches([json.loads(line) for line in text.splitlines() if line.strip()])   # as opsctl reads it


def _current(host) -> str:
    return host.run("readlink /opt/opsctl/current; true", check=False).stdout.strip().split("/")[-1]


def _active(host) -> str:
    return host.run("systemctl is-active sglang-k26; true", check=False).stdout.strip()


def _edit_opsctl(inv: Path, edit) -> None:
    """Applies `edit` to every opsctl: mapping of the inventory (group_vars/all.yml and each host's
    host_vars file that sets one): Ansible replaces a mapping set at two levels whole, so a fleet-wide
    change goes into each complete copy, as an operator would write it (docs/inventory.md)."""
    for f in [inv / "group_vars" / "all.yml", *sorted((inv / "host_vars").glob("*.yml"))]:
        data = yaml.safe_load(f.read_text())
        if isinstance(data, dict) and isinstance(data.get("opsctl"), dict):
            edit(data["opsctl"])
            f.write_text(yaml.safe_dump(data, sort_keys=False))


def _set_policy(inv: Path, **rollout) -> None:
    _edit_opsctl(inv, lambda o: o.__setitem__("rollout", {**o.get("rollout", {}), **rollout}))


def _events(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _ts(rec: dict) -> float:
    return datetime.fromisoformat(rec["ts"].replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def fleet(lab_fleet, tmp_path_factory):
    """Three lab hosts serving the ar-tp8 baseline, each with its own stored baseline bench."""
    for h in lab_fleet:
        reset_host(h)
    inv = tmp_path_factory.mktemp("fleet") / "lab-fleet"
    shutil.copytree(lab_fleet[0].inventory_dir, inv)   # lab1..lab3 at the addresses of this run's nodes
    ops = Ops(inv)
    t0 = time.monotonic()
    proc = ops("deploy", "ar-tp8", "--yes", "--skip-checks", timeout=900)
    print(f"baseline rollout on 3 hosts: {time.monotonic() - t0:.1f}s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    baselines = {h.name: _current(h) for h in lab_fleet}
    for h in lab_fleet:  # per-host baselines: every host measured and stored its own
        assert h.run("ls /opt/opsctl/baselines/kimi-k2.6/ar-tp8*.jsonl", check=False).returncode == 0
    yield {"hosts": {h.name: h for h in lab_fleet}, "inv": inv, "ops": ops, "baseline": baselines}
    for h in lab_fleet:
        reset_host(h)


def test_unreachable_host_is_reported_before_any_host_changes(fleet, tmp_path):
    inv = tmp_path / "lab-fleet-4"
    shutil.copytree(fleet["inv"], inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    gpu = hosts["all"]["children"]["gpu_hosts"]["hosts"]
    # lab2's address on a port nothing listens on: refused inside the lab's own network namespace
    gpu["lab4"] = {**gpu["lab3"], "ansible_host": "10.203.9.6", "ansible_port": 2299}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    before = {n: (_current(h), len(_ledger(h))) for n, h in fleet["hosts"].items()}
    proc = fleet["ops"]("deploy", "ddtree", "--budget", "8", "--yes", "--skip-checks", inventory=inv)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "lab4" in proc.stderr and "2299" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
    assert {n: (_current(h), len(_ledger(h))) for n, h in fleet["hosts"].items()} == before


def test_fault_on_a_later_wave_rolls_every_host_back_to_the_baseline(fleet):
    hosts = fleet["hosts"]
    _set_policy(fleet["inv"], on_failure="rollback_all")
    # the readiness gate fails on lab3 (the bench gates are exercised by the good rollout below;
    # --no-gate keeps this case inside CI's time)
    with hosts["lab3"].fault("capture_failure", algorithm="DDTREE"):
        code, last, err = fleet["ops"].json("deploy", "ddtree", "--budget", "8", "--yes", "--skip-checks",
                                            "--no-gate", timeout=900)
    assert code == 5, err
    assert last["ok"] is False
    problem = last["problem"]
    assert "stopped in wave 1" in problem and "lab3: start failed" in problem, problem
    assert "rolled back (on_failure: rollback_all): lab2 -> ar-tp8" in problem and "lab1 -> ar-tp8" in problem
    for name, h in hosts.items():
        assert _current(h) == fleet["baseline"][name] and _active(h) == "active", name
    rollout = last["details"]["rollout"]
    assert last["details"]["hosts"]["lab3"]["result"] == "failed"
    lab1 = [r for r in _ledger(hosts["lab1"]) if r.get("rollout") == rollout]
    assert [(r["action"], r["result"]) for r in lab1 if r["action"] in ("promote", "rollback")] == \
        [("promote", "ok"), ("rollback", "ok")]
    lab3 = [r for r in _ledger(hosts["lab3"]) if r.get("rollout") == rollout]
    assert any(r["action"] == "rollback" and r.get("automatic") for r in lab3)


def test_hold_keeps_the_canary_on_the_new_release(fleet):
    hosts = fleet["hosts"]
    _set_policy(fleet["inv"], on_failure="hold")
    try:
        with hosts["lab2"].fault("capture_failure", algorithm="DDTREE"):
            code, last, err = fleet["ops"].json("deploy", "ddtree", "--budget", "8", "--yes", "--skip-checks",
                                                "--no-gate", timeout=900)
    finally:
        _set_policy(fleet["inv"], on_failure="rollback_all")
    assert code == 5, err
    problem = last["problem"]
    assert "lab2:" in problem and "on_failure: hold: lab1 keeps the new release" in problem, problem
    assert _current(hosts["lab1"]).startswith("ddtree-b8-") and _active(hosts["lab1"]) == "active"
    assert _current(hosts["lab2"]) == fleet["baseline"]["lab2"]
    assert _current(hosts["lab3"]) == fleet["baseline"]["lab3"]   # staged with lab2, never switched


def test_good_rollout_reaches_every_host_in_its_waves(fleet, capsys):
    hosts = fleet["hosts"]
    t0 = time.monotonic()
    proc = fleet["ops"]("deploy", "ddtree", "--budget", "16", "--yes", "--skip-checks", "--json", timeout=1200)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = _events(proc.stdout)
    outcome = events[-1]
    assert {o["host"]: (o["result"], o["wave"]) for o in outcome["outcomes"]} == {
        "lab1": ("promoted", "canary"), "lab2": ("promoted", "wave 1"), "lab3": ("promoted", "wave 1")}
    rollout = outcome["outcomes"][0]["rollout"]
    promoted = {n: next(r for r in _ledger(h) if r.get("rollout") == rollout and r["action"] == "promote")
                for n, h in hosts.items()}
    assert _ts(promoted["lab1"]) < _ts(promoted["lab2"]) < _ts(promoted["lab3"])
    windows = {e["host"]: (e["started_at"], e["ended_at"]) for e in events
               if e.get("event") == "step" and e.get("step") == "prepare" and e.get("status") == "ok"}
    assert windows["lab1"][1] <= min(windows["lab2"][0], windows["lab3"][0])   # the canary staged alone, first
    assert max(windows["lab2"][0], windows["lab3"][0]) < min(windows["lab2"][1], windows["lab3"][1])  # overlap
    started = {n: next(r for r in _ledger(h) if r.get("rollout") == rollout and r.get("result") == "started")
               for n, h in hosts.items()}
    assert _ts(promoted["lab1"]) < _ts(started["lab2"])   # wave 1 switches only after the canary passed
    # per-host renders: lab3's host_vars give it its own sglang.env, so its own release
    releases = {o["host"]: o["release"] for o in outcome["outcomes"]}
    assert releases["lab1"] == releases["lab2"] != releases["lab3"]
    assert "NCCL_P2P_LEVEL=SYS" in hosts["lab3"].run("cat /opt/opsctl/current/sglang.env").stdout
    assert "NCCL_P2P_LEVEL" not in hosts["lab2"].run("cat /opt/opsctl/current/sglang.env").stdout
    code, rows, _ = fleet["ops"].json("status")
    assert {r["host"]: r["rollout"] for r in rows} == {n: rollout for n in hosts}
    assert all(r["release"].startswith("ddtree-b16-") and r["last_verdict"]["status"] == "pass" for r in rows)
    hist = fleet["ops"]("history", "--rollout", rollout)
    assert hist.returncode == 0 and all(f"history: {n}" in hist.stdout for n in hosts)
    with capsys.disabled():
        print(f"\n3-host rollout (canary + 1 wave of 2), gates on: {wall:.1f}s")



def test_controller_killed_mid_wave_leaves_no_unconfirmed_release_and_the_next_deploy_converges(fleet):
    hosts = fleet["hosts"]
    _edit_opsctl(fleet["inv"], lambda o: o.__setitem__("guard_s", 20))
    before = {n: _current(h) for n, h in hosts.items()}      # ddtree budget 16, judged, on every host
    lines: list[str] = []
    proc = subprocess.Popen([*OPSCTL, "deploy", "ddtree", "--budget", "8", "--yes", "--skip-checks", "--no-gate",
                             "-i", str(fleet["inv"])], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip() for line in proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while not any(line.startswith("[lab2] switch") and " ok " in line for line in lines):
        assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines)
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)   # the controller alone, mid-wave: lab2 switched, not confirmed
    proc.wait(10)
    new = _current(hosts["lab2"])
    assert new != before["lab2"]
    deadline = time.monotonic() + 90
    while _current(hosts["lab2"]) != before["lab2"] and time.monotonic() < deadline:
        time.sleep(1)
    assert _current(hosts["lab2"]) == before["lab2"], "lab2's guard did not put back its judged release"
    assert _current(hosts["lab1"]) == new        # the canary was promoted before the kill
    assert _current(hosts["lab3"]) == before["lab3"]
    # the next deploy converges: the canary is unchanged, the others take the release
    again = fleet["ops"]("deploy", "ddtree", "--budget", "8", "--yes", "--skip-checks", "--no-gate", "--json",
                         timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    outcomes = _events(again.stdout)[-1]["outcomes"]
    assert {o["host"]: o["result"] for o in outcomes} == {"lab1": "unchanged", "lab2": "promoted",
                                                          "lab3": "promoted"}
    assert {n: _current(h) for n, h in hosts.items()} == {o["host"]: o["release"] for o in outcomes}
    assert _current(hosts["lab2"]) == new and _current(hosts["lab3"]).startswith("ddtree-b8-")   # lab3: own render

# last in the module: its --no-gate deploy leaves an unjudged release live on every host
def test_max_unavailable_one_never_takes_two_hosts_out_of_the_pool_at_once(fleet):
    """Issue #35: one wave of all three hosts with max_unavailable 1: the ledgers' switch records
    (pool_out_at .. pool_in_at, the controller's clock) never overlap, and every host served again."""
    from opsctl.drain import max_out_of_pool, serving_timeline

    inv = fleet["inv"].parent / "lab-fleet-maxu"
    if not inv.exists():
        shutil.copytree(fleet["inv"], inv)
        _set_policy(inv, waves=["100%"], max_unavailable=1)
    # a budget no earlier test of the module deployed: a switch on every host
    proc = fleet["ops"]("deploy", "ddtree", "--budget", "6", "--yes", "--no-gate", "--skip-checks", "--json",
                        inventory=inv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rollout = _events(proc.stdout)[-1]["outcomes"][0]["rollout"]
    switches = [r for h in fleet["hosts"].values() for r in _ledger(h)
                if r.get("rollout") == rollout and r.get("action") == "switch"]
    assert len(switches) == 3 and all(r["pool_in_at"] for r in switches)
    assert max_out_of_pool(switches) == 1
    line = serving_timeline(switches, 3)
    assert min(n for _, n in line) == 2 and line[-1][1] == 3
