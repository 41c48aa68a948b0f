"""Lab node naming, addresses and host-name resolution (no root, no lab needed)."""
from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.errors import ConfigError, LabError
from opsctl.lab import constants as C
from opsctl.lab import host

REPO = Path(__file__).resolve().parents[2]


def test_node1_keeps_the_single_host_names():
    n = C.NODES[0]
    assert (n.netns, n.veth_host, n.veth_guest, n.host_ip, n.guest_ip, n.machine, n.hostname, n.cgroup_name) == (
        "opsctl-lab", "olab-h", "olab-g", "10.203.9.1", "10.203.9.2", "opsctl-lab", "gpuhost", "opsctl-lab")
    assert (n.pid_file, n.boot_script, n.boot_log, n.overlay_dir) == (
        C.STATE_DIR / "nspawn.pid", C.STATE_DIR / "boot.sh", C.STATE_DIR / "boot.log", C.STATE_DIR / "cg")
    # the old module constants are node 1's
    assert (C.NETNS, C.VETH_HOST, C.VETH_GUEST, C.HOST_IP, C.GUEST_IP, C.MACHINE, C.HOSTNAME, C.CGROUP_NAME) == (
        n.netns, n.veth_host, n.veth_guest, n.host_ip, n.guest_ip, n.machine, n.hostname, n.cgroup_name)
    assert (C.PID_FILE, C.BOOT_SCRIPT, C.BOOT_LOG, C.OVERLAY_DIR) == (n.pid_file, n.boot_script, n.boot_log,
                                                                      n.overlay_dir)


@pytest.mark.parametrize("i,host_ip,guest_ip", [(2, "10.203.9.5", "10.203.9.6"), (3, "10.203.9.9", "10.203.9.10"),
                                                (4, "10.203.9.13", "10.203.9.14"), (5, "10.203.9.17", "10.203.9.18"),
                                                (6, "10.203.9.21", "10.203.9.22")])
def test_node_i_gets_its_own_names_and_slash30(i, host_ip, guest_ip):
    n = C.LabNode(i)
    assert (n.name, n.netns, n.veth_host, n.veth_guest, n.machine, n.hostname, n.cgroup_name) == (
        f"lab{i}", f"opsctl-lab-{i}", f"olab-h{i}", f"olab-g{i}", f"opsctl-lab-{i}", f"gpuhost-{i}", f"opsctl-lab-{i}")
    assert (n.host_ip, n.guest_ip) == (host_ip, guest_ip)
    assert (n.pid_file.name, n.boot_script.name, n.boot_log.name, n.overlay_dir.name) == (
        f"nspawn-{i}.pid", f"boot-{i}.sh", f"boot-{i}.log", f"cg-{i}")
    assert len(max(n.veth_host, n.veth_guest)) <= 15   # IFNAMSIZ


def test_nodes_are_distinct_and_bounded():
    assert [n.index for n in C.NODES] == [1, 2, 3, 4, 5, 6]
    for attr in ("netns", "veth_host", "veth_guest", "host_ip", "guest_ip", "machine", "hostname", "cgroup_name",
                 "pid_file", "boot_script", "boot_log", "overlay_dir"):
        assert len({getattr(n, attr) for n in C.NODES}) == 6, attr
    with pytest.raises(ValueError):
        C.LabNode(7)
    with pytest.raises(ValueError):
        C.LabNode(0)


@pytest.mark.parametrize("given,index", [(None, 1), (1, 1), ("lab", 1), ("lab1", 1), ("LAB2", 2), ("lab3", 3),
                                         (" lab4 ", 4), ("lab5", 5), ("2", 2), (3, 3), (C.LabNode(4), 4)])
def test_resolve_node(given, index):
    assert C.resolve_node(given).index == index


@pytest.mark.parametrize("bad", ["lab7", "lab0", "gpuhost", "", 0, 7, "7", True])
def test_unknown_host_is_a_config_error_naming_the_valid_names(bad):
    with pytest.raises(ConfigError) as e:
        C.resolve_node(bad)
    assert e.value.exit_code == 2 and "lab, lab1, lab2, lab3, lab4" in e.value.one_line()


def test_hosts_count_is_checked_before_root():
    assert host.check_hosts(1) == 1 and host.check_hosts(4) == 4
    with pytest.raises(LabError, match="the lab runs at most 6 hosts on this machine"):
        host.up(hosts=7)
    with pytest.raises(LabError):
        host.check_hosts(0)


def test_boot_script_of_each_node_names_only_its_own_things():
    one = host._boot_script([Path("/sys/fs/cgroup/unified/opsctl-lab")], 1)
    assert "--network-namespace-path=/run/netns/opsctl-lab --machine=opsctl-lab --hostname=gpuhost " in one
    assert "M=/var/lib/opsctl-lab/cg/m" in one and "echo gpuhost > $M/etc/hostname" in one
    two = host._boot_script([Path("/sys/fs/cgroup/unified/opsctl-lab-2")], 2)
    assert "--network-namespace-path=/run/netns/opsctl-lab-2 --machine=opsctl-lab-2 --hostname=gpuhost-2 " in two
    assert "M=/var/lib/opsctl-lab/cg-2/m" in two and "echo gpuhost-2 > $M/etc/hostname" in two
    assert "/var/lib/opsctl-lab/cg/" not in two and "opsctl-lab/cgroup.procs" not in two
    # own cgroup first, then the private mount namespace, then nspawn
    assert two.index("cgroup.procs") < two.index("mount --make-rprivate") < two.index("exec systemd-nspawn")
    # the guest files staged once are the same for every node
    assert "cp -a /var/lib/opsctl-lab/guest/. $M/" in one and "cp -a /var/lib/opsctl-lab/guest/. $M/" in two


def test_ssh_argv_reaches_the_nodes_address():
    assert host.ssh_argv("true")[-3:] == ["root@10.203.9.2", "--", "true"]
    assert host.ssh_argv("true", node=3)[-3] == "root@10.203.9.10"
    assert host.ssh_argv(node="lab2")[-1] == "root@10.203.9.6"


def test_fleet_inventory_matches_the_nodes():
    from opsctl.config import load_inventory

    fleet = load_inventory(REPO / "inventories" / "lab-fleet")
    single = load_inventory(REPO / "inventories" / "lab")
    assert sorted(fleet.hosts) == ["lab1", "lab2", "lab3"]
    for name, h in fleet.hosts.items():
        node = C.resolve_node(name)
        assert h.ssh.address == node.guest_ip
        assert (h.ssh.user, h.ssh.port, h.ssh.key_file) == (single.hosts["lab"].ssh.user, single.hosts["lab"].ssh.port,
                                                            single.hosts["lab"].ssh.key_file)
        # the same host facts as the single-host lab; the fleet adds its rollout, a lighter gate
        # (three hosts in a row) and lab3's own extra_env (a per-host render)
        differ = {"rollout", "gate", "extra_env"}
        assert h.settings.model_dump(exclude=differ) == single.hosts["lab"].settings.model_dump(exclude=differ)
        assert h.settings.rollout.canary == ["lab1"] and h.settings.rollout.on_failure == "rollback_all"
        assert h.settings.extra_env == ({"NCCL_P2P_LEVEL": "SYS"} if name == "lab3" else {})
        # the gate is the lab's but for its levels
        lab_gate = single.hosts["lab"].settings.gate
        assert h.settings.gate.model_dump(exclude={"concurrency"}) == lab_gate.model_dump(exclude={"concurrency"})
        assert h.settings.gate.concurrency == [1, 8]
