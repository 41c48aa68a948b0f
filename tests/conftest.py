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
- In parallel (pytest-xdist, `-n N`, N <= 4, as scripts/test runs the lab tier with 4): each worker
  owns one lab host (gw0 -> node 1, gw1 -> node 2, ...), with an inventory that says "lab"
  at that node's address; a fleet module takes its worker's host plus the two spare nodes (5, 6). The
  controller process holds the session lock for the whole run and takes the lab down at the
  end (workers end at different times); the lab's own lock serialises the workers' boots.
  Tests that take the whole lab up or down (tests/lab) are marked `lab_whole` and run alone.
- `baselined` (session scope): the worker's host with ar-tp8 deployed through the gate and its
  baseline benched once (every level a module gates on), saved in the guest; each module that
  starts from "the baseline judged and live" restores it (`restore_baseline`, seconds) instead
  of deploying and benching again.
"""
from __future__ import annotations

import contextlib
import os
import re
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


WHOLE_LAB_DIRS = ("tests/lab/",)   # modules that take the whole lab up or down: never beside other lab tests
# Lab modules, longest first (seconds of one run on four workers, measured 2026-12-04: watch 603,
# fleet 516, workloads 481, the three rollback-truth modules 477/452/381, startup 426, tune 351, deploy
# 335, gates 313, checks 248, interrupts 213, drain 197, twice 185, soak 163, schedule 120, wheelhouse
# 100, jump 55; metrics 132 alone with its lab up and baseline, 2026-12-05): in parallel runs (`--dist loadfile --no-loadscope-reorder`) the long ones start first
# and the short ones fill in at the end (longest-processing-time-first; with LateFileScheduling below
# the workers end within about a minute of each other). Modules not listed run after these, in file order.
LAB_MODULE_ORDER = ("tests/watch/test_watch_lab.py", "tests/deploy/test_fleet_lab.py",
                    "tests/gates/test_workloads_lab.py", "tests/deploy/test_truth_releases_lab.py",
                    "tests/deploy/test_truth_guard_lab.py", "tests/deploy/test_startup_lab.py",
                    "tests/deploy/test_truth_interrupts_lab.py", "tests/tune/test_tune_lab.py",
                    "tests/tune/test_tune_onerestart_lab.py",
                    "tests/deploy/test_deploy_lab.py", "tests/gates/test_gates_lab.py",
                    "tests/checks/test_checks_lab.py", "tests/deploy/test_interrupts_lab.py",
                    "tests/deploy/test_drain_lab.py", "tests/deploy/test_twice_lab.py",
                    "tests/watch/test_watch_soak_lab.py", "tests/deploy/test_schedule_lab.py",
                    "tests/deploy/test_metrics_lab.py",
                    "tests/wheelhouse/test_wheelhouse_lab.py", "tests/deploy/test_jump_host_lab.py")


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, but a worker is given its next module only when it is down to its last
    test (xdist's own rule gives it at two pending tests, so a worker with two long lab tests left
    takes a module that an idle worker could have run at once)."""
    if getattr(config.option, "dist", "no") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LateFileScheduling(LoadFileScheduling):
        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            # 1, not 0: a worker runs a test only once it knows the next one (xdist's nextitem)
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return LateFileScheduling(config, log)


def _worker_index() -> int | None:
    """0, 1, ... under pytest-xdist (PYTEST_XDIST_WORKER=gw0, gw1, ...); None in a plain run."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def _is_xdist_controller(config) -> bool:
    return (not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))
            and getattr(config.option, "dist", "no") != "no")


def _lab_deselected(config) -> bool:
    return re.search(r"\bnot\s+lab\b(?!_)", config.getoption("markexpr", "") or "") is not None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    reason = _lab_unavailable()
    for item in items:
        if "lab_host" in getattr(item, "fixturenames", ()) and item.get_closest_marker("lab") is None:
            item.add_marker(pytest.mark.lab)
        if item.get_closest_marker("lab") is not None:
            if any(d in item.nodeid for d in WHOLE_LAB_DIRS):
                item.add_marker(pytest.mark.lab_whole)
        if reason and item.get_closest_marker("lab") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))

    def rank(item) -> int:
        module = item.nodeid.split("::")[0]
        return LAB_MODULE_ORDER.index(module) if module in LAB_MODULE_ORDER else len(LAB_MODULE_ORDER)

    if _worker_index() is not None:
        items.sort(key=rank)   # stable: a module's tests keep their file order


def pytest_configure(config):
    """Under xdist the controller holds the lab for the whole run (see the module docstring)."""
    if not _is_xdist_controller(config) or _lab_unavailable() or _lab_deselected(config):
        return
    from opsctl.lab import constants as C

    if int(config.option.numprocesses) > C.MAX_NODES - 2:
        raise pytest.UsageError(f"the lab runs {C.MAX_NODES} hosts: at most {C.MAX_NODES - 2} lab workers "
                                f"(-n {C.MAX_NODES - 2}), leaving 2 for a fleet module")
    if os.environ.get("OPSCTL_LAB_LOCK_HELD") != "1":
        stack = contextlib.ExitStack()
        stack.enter_context(_session_lock())
        config._opsctl_lab_lock = stack
    from opsctl.lab import holder

    holder.write_holder("pytest session")
    os.environ["OPSCTL_LAB_LOCK_HELD"] = "1"       # the workers inherit it: they never take the lock
    os.environ["OPSCTL_LAB_SHARED_RUN"] = "1"      # ... nor take the lab down
    config._opsctl_lab_held = True


def pytest_unconfigure(config):
    if not getattr(config, "_opsctl_lab_held", False):
        return
    try:
        if os.environ.get("OPSCTL_LAB_KEEP") != "1":
            from opsctl import lab
            from opsctl.lab import holder

            lab.down(say=lambda m: print(m, flush=True))
            holder.clear_holder()
            left = lab.leftovers()
            assert left == [], f"lab teardown left: {left}"
    finally:
        stack = getattr(config, "_opsctl_lab_lock", None)
        if stack is not None:
            stack.close()


@dataclass
class LabHost:
    """A booted lab host: root@<its address> over SSH with the lab's key."""

    address: str
    port: int
    user: str
    key_file: Path
    inventory_dir: Path
    node: int = 1          # which lab host (opsctl.lab.constants.LabNode index)
    name: str = "lab"      # its name in inventory_dir ("lab" in inventories/lab, "lab1".. in lab-fleet)

    @property
    def host_ip(self) -> str:
        """This machine's address on the host's veth (what the guest reaches this machine at)."""
        from opsctl.lab import constants as C

        return C.NODES[self.node - 1].host_ip

    @property
    def hostname(self) -> str:
        from opsctl.lab import constants as C

        return C.NODES[self.node - 1].hostname

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


def _inventory_at(src: Path, dest: Path, addresses: dict[str, str]) -> Path:
    """A copy of the inventory SRC with each `ansible_host: OLD` replaced by NEW (a node's address)."""
    if dest.exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    hosts = tmp / "hosts.yml"
    text = hosts.read_text()
    for old in addresses:
        assert f"ansible_host: {old}\n" in text, (src, old)
    # one pass: a chain of replacements would move lab1 to lab2's new address too
    text = re.sub(r"ansible_host: (\S+)\n", lambda m: f"ansible_host: {addresses.get(m[1], m[1])}\n", text)
    hosts.write_text(text)
    tmp.rename(dest)
    return dest


@pytest.fixture(scope="session")
def lab_host(tmp_path_factory):
    reason = _lab_unavailable()
    if reason:
        pytest.skip(reason)
    from opsctl import lab
    from opsctl.lab import constants as C

    from opsctl.lab import holder

    assert C.SESSION_LOCK == SESSION_LOCK
    worker = _worker_index()
    node = C.NODES[(worker or 0)]
    inventory = REPO / "inventories" / "lab"
    if node.index != 1:
        inventory = _inventory_at(inventory, tmp_path_factory.getbasetemp() / f"inventory-lab-node{node.index}",
                                  {C.GUEST_IP: node.guest_ip})
    shared = os.environ.get("OPSCTL_LAB_SHARED_RUN") == "1"
    with _session_lock():
        try:
            lab.up(say=lambda m: print(m, flush=True), hosts=node.index)
            if not shared:
                holder.write_holder("pytest session")
            yield LabHost(address=node.guest_ip, port=C.SSH_PORT, user=C.SSH_USER, key_file=C.KEY_FILE,
                          inventory_dir=inventory, node=node.index)
        finally:
            if not shared and os.environ.get("OPSCTL_LAB_KEEP") != "1":
                lab.down(say=lambda m: print(m, flush=True))   # raises LabError on leftovers
                holder.clear_holder()
                left = lab.leftovers()
                assert left == [], f"lab teardown left: {left}"


@pytest.fixture(scope="module")
def lab_fleet(lab_host, tmp_path_factory):
    """Three lab hosts for the module, named lab1..lab3 as in inventories/lab-fleet: [lab1, lab2,
    lab3] (LabHost handles, `inventory_dir` an inventory with their addresses). In a plain run they
    are nodes 1..3; under xdist, this worker's own node and the spare nodes 4 and 5 (never a worker's). The two
    others are halted after the module, and lab1 must still answer."""
    from opsctl import lab
    from opsctl.lab import constants as C

    say = lambda m: print(m, flush=True)  # noqa: E731
    if _worker_index() is None:
        nodes = list(C.NODES[:3])
    else:
        nodes = [C.NODES[lab_host.node - 1], C.NODES[-2], C.NODES[-1]]
    names = [n.name for n in C.NODES[:3]]
    inventory = REPO / "inventories" / "lab-fleet"
    if [n.index for n in nodes] != [1, 2, 3]:
        inventory = _inventory_at(inventory, tmp_path_factory.mktemp("fleet-inventory") / "lab-fleet",
                                  {C.NODES[i].guest_ip: n.guest_ip for i, n in enumerate(nodes)})
    lab.up(say=say, hosts=max(n.index for n in nodes))
    try:
        yield [LabHost(address=n.guest_ip, port=C.SSH_PORT, user=C.SSH_USER, key_file=C.KEY_FILE,
                       inventory_dir=inventory, node=n.index, name=name)
               for n, name in zip(nodes, names)]
    finally:
        lab.down(say=say, nodes=[n.index for n in nodes[1:]])   # raises LabError on leftovers of the other two
        assert lab.ssh_answers(node=nodes[0].index), f"{names[0]} stopped answering after the others went down"


# --- end-to-end tests that deploy to the lab (tests/deploy, tests/gates); helpers in labtools.py


@pytest.fixture(scope="module")
def clean_lab(lab_host):
    """The lab host with no releases, ledger, baselines or faults, before and after the module."""
    from labtools import reset_host

    reset_host(lab_host)
    yield lab_host
    reset_host(lab_host)


# Every gate level a module of the suite judges at (tests/tune: 1, 32; tests/deploy schedule: 1, 8, 32;
# the lab inventory: 1, 4, 8): the gate compares the levels it measures and ignores the others.
BASELINED_LEVELS = "[1, 4, 8, 32]"


@dataclass
class Baselined:
    """The ar-tp8 baseline judged, live and benched on the lab host, saved once per run."""

    release: str
    inventory_dir: Path

    def restore(self, lab) -> None:
        from labtools import restore_state

        restore_state(lab)


@pytest.fixture(scope="session")
def baselined(lab_host, tmp_path_factory):
    """The worker's lab host with `opsctl deploy ar-tp8` run through the gate once (its bench stored
    as the baseline at BASELINED_LEVELS on the lab's workload mix) and that state saved in the guest;
    `baselined.restore(lab)` puts it back in seconds (labtools.restore_state)."""
    from labtools import Ops, reset_host, save_state

    inv = tmp_path_factory.getbasetemp() / f"inventory-baselined-node{lab_host.node}"
    shutil.copytree(lab_host.inventory_dir, inv)
    gv = inv / "group_vars" / "all.yml"
    text = gv.read_text()
    assert "concurrency: [1, 4, 8]" in text
    gv.write_text(text.replace("concurrency: [1, 4, 8]", f"concurrency: {BASELINED_LEVELS}"))
    lab_host.clear_faults()
    reset_host(lab_host)
    rc, out, err = Ops(inv).json("deploy", "ar-tp8", "--yes", "--skip-checks")
    assert rc == 0 and out["outcomes"][0]["result"] == "promoted", err
    save_state(lab_host)
    return Baselined(release=out["outcomes"][0]["release"], inventory_dir=inv)


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
