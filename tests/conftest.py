"""Shared pytest wiring.

- `lab` marker: tests that need the booted lab host (root, systemd-nspawn).
  `pytest -m "not lab"` runs the unit tests alone; a test that uses the
  `lab_host` fixture is marked `lab` automatically. Without root or
  systemd-nspawn, lab tests are skipped with the reason.
- `lab_host` (session scope): boots the lab once (`opsctl.lab.up`), yields a
  LabHost handle, and ALWAYS tears it down (`opsctl.lab.down`) at the end of
  the session, failing loudly if anything is left behind. Concurrent pytest
  sessions on one machine are serialised on /run/opsctl-lab.session.lock.
  OPSCTL_LAB_KEEP=1 leaves the lab up after the session (debugging only);
  OPSCTL_LAB_LOCK_HELD=1 says the caller already holds the lock
  (`flock /run/opsctl-lab.session.lock pytest ...`).
- `lab_fleet` (module scope, on top of `lab_host`): three lab hosts (`lab.up(hosts=3)`),
  a list of LabHost handles for lab1..lab3 (inventory inventories/lab-fleet); after the
  module it halts lab2 and lab3 (`lab.down(nodes=[2, 3])`) and checks lab1 still answers.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SESSION_LOCK = Path("/run/opsctl-lab.session.lock")  # = opsctl.lab.constants.SESSION_LOCK, which `opsctl lab` takes


def _lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    if not shutil.which("systemd-nspawn") and not shutil.which("apt-get"):
        return "systemd-nspawn is not installed (scripts/lab-deps)"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    reason = _lab_unavailable()
    for item in items:
        if "lab_host" in getattr(item, "fixturenames", ()) and item.get_closest_marker("lab") is None:
            item.add_marker(pytest.mark.lab)
        if reason and item.get_closest_marker("lab") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class LabHost:
    """A booted lab host: root@10.203.9.2 over SSH with the lab's key."""

    address: str
    port: int
    user: str
    key_file: Path
    inventory_dir: Path
    node: int = 1          # which lab host (opsctl.lab.constants.LabNode index)
    name: str = "lab"      # its name in inventory_dir ("lab" in inventories/lab, "lab1".. in lab-fleet)

    def run(self, command: str, *, check: bool = False, timeout: float = 60,
            stdin: str | None = None) -> subprocess.CompletedProcess:
        from opsctl.lab import guest_run

        return guest_run(command, timeout=timeout, stdin=stdin, check=check, node=self.node)

    def ssh_argv(self, command: str | None = None) -> list[str]:
        from opsctl.lab import ssh_argv

        return ssh_argv(command, node=self.node)

    @property
    def host_config(self):
        """The inventory's HostConfig for the lab (opsctl.config)."""
        from opsctl.config import load_inventory

        return load_inventory(self.inventory_dir).hosts[self.name]

    def connection(self):
        from opsctl.host.connection import SSHConnection

        return SSHConnection(self.host_config)

    def set_fault(self, name: str, **params) -> dict:
        from opsctl.lab import set_fault

        return set_fault(name, host=self.node, **params)

    def clear_faults(self) -> list[str]:
        from opsctl.lab import clear_fault

        return clear_fault(None, host=self.node)

    @contextlib.contextmanager
    def fault(self, name: str, **params):
        """The fault set for the ``with`` body (as what ``set_fault`` returns),
        every fault cleared after it."""
        info = self.set_fault(name, **params)
        try:
            yield info
        finally:
            self.clear_faults()


@contextlib.contextmanager
def _session_lock(wait_s: float = 1800):
    if os.environ.get("OPSCTL_LAB_LOCK_HELD") == "1":   # the caller holds it (flock(1) around pytest)
        yield
        return
    from opsctl.lab.host import _locked  # the same flock loop `opsctl lab` uses for its own lock

    with _locked(SESSION_LOCK, wait_s):
        yield


@pytest.fixture(scope="session")
def lab_host():
    reason = _lab_unavailable()
    if reason:
        pytest.skip(reason)
    from opsctl import lab
    from opsctl.lab import constants as C

    from opsctl.lab import holder

    assert C.SESSION_LOCK == SESSION_LOCK
    with _session_lock():
        try:
            lab.up(say=lambda m: print(m, flush=True))
            holder.write_holder("pytest session")
            yield LabHost(address=C.GUEST_IP, port=C.SSH_PORT, user=C.SSH_USER, key_file=C.KEY_FILE,
                          inventory_dir=REPO / "inventories" / "lab")
        finally:
            if os.environ.get("OPSCTL_LAB_KEEP") != "1":
                lab.down(say=lambda m: print(m, flush=True))   # raises LabError on leftovers
                holder.clear_holder()
                left = lab.leftovers()
                assert left == [], f"lab teardown left: {left}"


@pytest.fixture(scope="module")
def lab_fleet(lab_host):
    """Three lab hosts for the module: [lab1, lab2, lab3] (LabHost handles, inventory
    inventories/lab-fleet). lab1 is lab_host's node; lab2 and lab3 are halted after the module."""
    from opsctl import lab
    from opsctl.lab import constants as C

    say = lambda m: print(m, flush=True)  # noqa: E731
    lab.up(say=say, hosts=3)
    try:
        yield [LabHost(address=n.guest_ip, port=C.SSH_PORT, user=C.SSH_USER, key_file=C.KEY_FILE,
                       inventory_dir=REPO / "inventories" / "lab-fleet", node=n.index, name=n.name)
               for n in C.NODES[:3]]
    finally:
        lab.down(say=say, nodes=[2, 3])   # raises LabError on leftovers of lab2/lab3
        assert lab.ssh_answers(node=1), "lab1 stopped answering after lab2/lab3 went down"


# --- end-to-end tests that deploy to the lab (tests/deploy, tests/gates); helpers in labtools.py


@pytest.fixture(scope="module")
def clean_lab(lab_host):
    """The lab host with no releases, ledger, baselines or faults, before and after the module."""
    from labtools import reset_host

    reset_host(lab_host)
    yield lab_host
    reset_host(lab_host)


@pytest.fixture
def ops(lab_host):
    """Runs the opsctl CLI as a user would, against the lab inventory."""
    from labtools import Ops

    return Ops(lab_host.inventory_dir)


@pytest.fixture
def snapshot():
    """host_snapshot(lab) -> text of everything a deploy may change on the host."""
    from labtools import host_snapshot

    return host_snapshot
