"""A multi-host lab: three systemd-nspawn hosts (lab1..lab3), each its own netns, address,
hostname, systemd and sshd; faults per host; halting some hosts leaves nothing of them.

Marked `lab` (root + systemd-nspawn). Uses the module fixture `lab_fleet` (tests/conftest.py),
which boots lab2/lab3 next to the session's lab1 and halts them after the module.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl import lab
from opsctl.lab import constants as C

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


def test_three_hosts_each_a_systemd_host_with_its_own_address(lab_fleet):
    assert [h.name for h in lab_fleet] == ["lab1", "lab2", "lab3"]
    addresses = [n.guest_ip for n in C.NODES[:3]]
    assert addresses == ["10.203.9.2", "10.203.9.6", "10.203.9.10"]
    for h, node in zip(lab_fleet, C.NODES):
        r = h.run("cat /proc/1/comm; hostname; systemctl is-system-running; ip -4 -o addr", check=True)
        comm, hostname, state = r.stdout.split("\n")[:3]
        assert comm == "systemd" and hostname == node.hostname, r.stdout
        assert state in ("running", "degraded"), r.stdout
        assert f"{node.guest_ip}/30" in r.stdout and f" {node.veth_guest} " in f" {r.stdout} ".replace(":", " ")
        for other in addresses:
            if other != node.guest_ip:
                assert f"{other}/" not in r.stdout, (node.name, r.stdout)
        # no default route: each guest reaches only the host side of its own veth
        assert h.run("ip route show default").stdout.strip() == ""
        # sshd is the guest's own (its PID 1's child), reached at the node's address
        assert h.run("systemctl is-active ssh").stdout.strip() == "active"
    # three distinct nspawn processes, one per machine name
    fleet = lab.fleet_status()
    assert [(s.host, s.address, s.running, s.ssh) for s in fleet[:3]] == [
        ("lab1", "10.203.9.2", True, True), ("lab2", "10.203.9.6", True, True), ("lab3", "10.203.9.10", True, True)]
    assert len({s.pid for s in fleet[:3]}) == 3
    assert lab.status().address == C.GUEST_IP and lab.status().node == 1   # status() is still lab1's


def test_a_fault_on_lab2_is_written_to_lab2_only(lab_fleet):
    lab1, lab2, lab3 = lab_fleet
    try:
        info = lab.set_fault("crash-after", host="lab2", requests=3)
        assert info["requests"] == 3
        files = {h.name: h.run(f"cat {C.GUEST_FAULTS_FILE} 2>/dev/null").stdout for h in lab_fleet}
        assert json.loads(files["lab2"])["faults"]["crash_after"]["requests"] == 3
        assert files["lab1"] == "" and files["lab3"] == "", files
        assert "crash_after" in lab.list_faults(host=2)["active"]
        assert lab.list_faults()["active"] == {} and lab.list_faults(host="lab3")["active"] == {}
        # the CLI takes --host
        r = subprocess.run([sys.executable, "-m", "opsctl", "lab", "fault", "list", "--host", "lab2", "--json"],
                           capture_output=True, text=True, cwd=REPO, timeout=60)
        assert r.returncode == 0 and json.loads(r.stdout)["host"] == "lab2", r.stderr
        assert "crash_after" in json.loads(r.stdout)["active"]
        assert lab.clear_fault(host="lab2") == ["crash_after"]
        assert lab2.run(f"test -e {C.GUEST_FAULTS_FILE}").returncode != 0
    finally:
        lab2.clear_faults()


def test_status_json_lists_every_host_and_the_fleet_inventory_reaches_them(lab_fleet):
    r = subprocess.run([sys.executable, "-m", "opsctl", "lab", "status", "--json"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["address"] == "10.203.9.2" and data["running"] and data["ssh"]   # lab1's keys at the top level
    assert [(h["host"], h["address"], h["running"]) for h in data["hosts"]][:3] == [
        ("lab1", "10.203.9.2", True), ("lab2", "10.203.9.6", True), ("lab3", "10.203.9.10", True)]
    r = subprocess.run([sys.executable, "-m", "opsctl", "status", "-i", "inventories/lab-fleet", "--json"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("lab1", "lab2", "lab3"):
        assert name in r.stdout
    for h in lab_fleet:
        assert h.host_config.ssh.address == h.address


def _machine_procs(machine: str) -> list[str]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"--machine={machine}".encode() in cmd:
                found.append(p.name)
    return found


def test_zz_down_lab2_lab3_leaves_nothing_of_them_and_lab1_stays_up(lab_fleet):
    pid1 = lab.status(probe_ssh=False).pid
    assert pid1
    t0 = time.monotonic()
    assert lab.down(say=print, nodes=[2, 3]) == []
    down_s = time.monotonic() - t0
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for node in C.NODES[1:3]:
        assert lab.node_leftovers(node.index) == [], node
        assert node.netns not in netns
        assert not Path(f"/sys/class/net/{node.veth_host}").exists()
        assert not node.pid_file.exists()
        for d in lab.host.cgroup_dirs(node.index):
            assert not d.exists(), d
        assert _machine_procs(node.machine) == [], node
    # lab1 untouched: same nspawn, answers, its names intact
    st = lab.status()
    assert st.running and st.ssh and st.pid == pid1 and st.system_state in ("running", "degraded"), st
    assert C.NETNS in netns and Path(f"/sys/class/net/{C.VETH_HOST}").exists()
    assert [s.host for s in lab.fleet_status(probe_ssh=False)] == ["lab1"]
    # up again: lab1 kept, lab2/lab3 booted side by side; a smaller --hosts leaves lab3 alone
    t0 = time.monotonic()
    lab.up(say=print, hosts=3)
    up_s = time.monotonic() - t0
    fleet = lab.fleet_status()
    assert [(s.host, s.ssh) for s in fleet] == [("lab1", True), ("lab2", True), ("lab3", True)], fleet
    assert fleet[0].pid == pid1
    pids = [s.pid for s in fleet]
    lab.up(say=print, hosts=2)
    assert [s.pid for s in lab.fleet_status(probe_ssh=False)] == pids
    print(f"lab2+lab3 down {down_s:.1f}s, up again {up_s:.1f}s")
