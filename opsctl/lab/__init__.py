"""The lab: a real systemd host on this machine, with an SGLang 0.5.23 emulator.

A test double. Production modules never import this package.

API (what `opsctl lab ...` and tests/conftest.py call):
    up(say=print) -> LabStatus            boot (idempotent; cleans a crashed run; installs Debian deps)
    down(say=print) -> []                 halt + remove netns/veth/cgroups; raises LabError on leftovers
    status() -> LabStatus                 running / netns / ssh / systemd state
    leftovers() -> list[str]              anything the lab left on this machine ([] when clean)
    ssh_argv(cmd=None) -> list[str]       `ssh ...` argv reaching the guest as root
    guest_run(cmd, timeout=, stdin=, check=) -> CompletedProcess
    set_fault(name, **params) / clear_fault(name=None) / list_faults()
    ensure_artifacts() -> list[str]       emulator wheel + generated drafter (also done by up)
Constants: opsctl.lab.constants (state dir, addresses, guest paths).
"""
from __future__ import annotations

from opsctl.lab import constants
from opsctl.lab.faults import ALL as FAULTS
from opsctl.lab.faults import EMULATOR_FAULTS, HOST_CONDITIONS, clear_fault, list_faults, set_fault
from opsctl.lab.host import LabStatus, down, guest_run, leftovers, require_root, ssh_argv, status, up


def ensure_artifacts() -> list[str]:
    from opsctl.lab import artifacts

    return artifacts.ensure(constants.WHEELHOUSE, constants.DRAFTER_DIR)


__all__ = ["constants", "FAULTS", "EMULATOR_FAULTS", "HOST_CONDITIONS", "clear_fault", "list_faults", "set_fault",
           "LabStatus", "down", "guest_run", "leftovers", "require_root", "ssh_argv", "status", "up",
           "ensure_artifacts"]
