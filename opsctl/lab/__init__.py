"""The lab: a real systemd host on this machine, with an SGLang 0.5.23 emulator.

A test double. Production modules never import this package.

API (what `opsctl lab ...` and tests/conftest.py call). The lab runs 1 to 5 hosts ("nodes",
constants.LabNode); node 1 is the single-host lab of old (10.203.9.2, "gpuhost"), node i its own
netns/veth/address/machine (10.203.9.<4(i-1)+2>, "gpuhost-<i>"). `node`/`host`: an index or a
host name ("lab"/"lab1", "lab2".."lab5"); default node 1.
    up(say=print, hosts=1) -> LabStatus   boot nodes 1..hosts (idempotent; cleans a crashed run; installs
                                          Debian deps); returns node 1's status
    down(say=print, nodes=None) -> []     halt + remove netns/veth/cgroups of every node (or of `nodes`);
                                          raises LabError on leftovers
    status(node=1) -> LabStatus           running / netns / ssh / systemd state of one node
    fleet_status() -> list[LabStatus]     every node that is up or has leftovers
    leftovers() -> list[str]              anything the lab (any node) left on this machine ([] when clean)
    ssh_argv(cmd=None, node=1) -> list[str]  `ssh ...` argv reaching a guest as root
    guest_run(cmd, timeout=, stdin=, check=, node=1) -> CompletedProcess
    ssh_answers(node=1) -> bool
    set_fault(name, host=None, **params) / clear_fault(name=None, host=None) / list_faults(host=None)
    ensure_artifacts() -> list[str]       emulator wheel + generated drafter (also done by up)
Constants: opsctl.lab.constants (state dir, addresses, guest paths, LabNode, NODES, resolve_node).
"""
from __future__ import annotations

from opsctl.lab import constants
from opsctl.lab.faults import ALL as FAULTS
from opsctl.lab.faults import EMULATOR_FAULTS, HOST_CONDITIONS, clear_fault, list_faults, set_fault
from opsctl.lab.constants import NODES, LabNode, resolve_node
from opsctl.lab.host import (LabStatus, down, fleet_status, guest_run, leftovers, node_leftovers, require_root,
                             ssh_answers, ssh_argv, status, up)


def ensure_artifacts() -> list[str]:
    from opsctl.lab import artifacts

    return artifacts.ensure(constants.WHEELHOUSE, constants.DRAFTER_DIR)


__all__ = ["constants", "FAULTS", "EMULATOR_FAULTS", "HOST_CONDITIONS", "clear_fault", "list_faults", "set_fault",
           "LabStatus", "down", "guest_run", "leftovers", "require_root", "ssh_argv", "status", "up",
           "ensure_artifacts", "NODES", "LabNode", "resolve_node", "fleet_status", "node_leftovers", "ssh_answers"]
