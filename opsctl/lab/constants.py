"""Fixed facts of the lab host (shared with inventories/lab/ and docs/lab.md)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STATE_DIR = Path("/var/lib/opsctl-lab")
KEY_FILE = STATE_DIR / "id_ed25519"
PID_FILE = STATE_DIR / "nspawn.pid"      # node 1's (LabNode.pid_file)
BOOT_LOG = STATE_DIR / "boot.log"        # node 1's (LabNode.boot_log)
BOOT_SCRIPT = STATE_DIR / "boot.sh"      # node 1's (LabNode.boot_script)
WHEELHOUSE = STATE_DIR / "wheelhouse"
DRAFTER_DIR = STATE_DIR / "drafter"
OVERLAY_DIR = STATE_DIR / "cg"          # node 1's; tmpfs mounted only inside the boot script's mount namespace
LOCK_FILE = Path("/run/opsctl-lab.lock")  # serialises lab up/down
SESSION_LOCK = Path("/run/opsctl-lab.session.lock")  # held by whoever uses the lab (a pytest session, `opsctl lab`)
HOLDER_FILE = STATE_DIR / "holder.json"  # who brought the lab up (opsctl/lab/holder.py)

PREFIX = 30
MAX_NODES = 6   # the lab runs at most this many hosts on this machine (2 cores, 24 GiB; ~150 MiB each): 4 test workers + 2 for a fleet


@dataclass(frozen=True)
class LabNode:
    """One lab host ("node"). Node 1 keeps the single-host lab's names; node i >= 2 gets its own
    netns, veth pair, /30, machine, hostname, cgroup and state files (suffix "-i" / "i")."""

    index: int

    def __post_init__(self) -> None:
        if not 1 <= self.index <= MAX_NODES:
            raise ValueError(f"lab node index {self.index} is not in 1..{MAX_NODES}")

    @property
    def _dash(self) -> str:
        return "" if self.index == 1 else f"-{self.index}"

    @property
    def _digit(self) -> str:
        return "" if self.index == 1 else str(self.index)

    @property
    def name(self) -> str:
        """The host's name in inventories/lab-fleet (node 1 is also "lab" in inventories/lab)."""
        return f"lab{self.index}"

    @property
    def netns(self) -> str:
        return f"opsctl-lab{self._dash}"

    @property
    def veth_host(self) -> str:
        return f"olab-h{self._digit}"

    @property
    def veth_guest(self) -> str:
        return f"olab-g{self._digit}"

    @property
    def host_ip(self) -> str:
        return f"10.203.9.{4 * (self.index - 1) + 1}"

    @property
    def guest_ip(self) -> str:
        return f"10.203.9.{4 * (self.index - 1) + 2}"

    @property
    def machine(self) -> str:
        return f"opsctl-lab{self._dash}"

    @property
    def hostname(self) -> str:
        return f"gpuhost{self._dash}"

    @property
    def cgroup_name(self) -> str:
        return f"opsctl-lab{self._dash}"

    @property
    def pid_file(self) -> Path:
        return STATE_DIR / f"nspawn{self._dash}.pid"

    @property
    def boot_script(self) -> Path:
        return STATE_DIR / f"boot{self._dash}.sh"

    @property
    def boot_log(self) -> Path:
        return STATE_DIR / f"boot{self._dash}.log"

    @property
    def overlay_dir(self) -> Path:
        return STATE_DIR / f"cg{self._dash}"   # tmpfs mounted only inside its boot script's mount namespace


NODES = tuple(LabNode(i) for i in range(1, MAX_NODES + 1))
HOST_NAMES = {"lab": 1, **{n.name: n.index for n in NODES}}   # "lab" / "lab1" = node 1, "lab2".. = nodes 2..


def resolve_node(host: "int | str | LabNode | None" = None) -> LabNode:
    """None -> node 1; an index 1..5; or a host name: "lab" / "lab1" = node 1, "lab2".."lab5"."""
    if host is None:
        return NODES[0]
    if isinstance(host, LabNode):
        return host
    if isinstance(host, int) and not isinstance(host, bool):
        if 1 <= host <= MAX_NODES:
            return NODES[host - 1]
    elif isinstance(host, str):
        key = host.strip().lower()
        if key in HOST_NAMES:
            return NODES[HOST_NAMES[key] - 1]
        if key.isdigit() and 1 <= int(key) <= MAX_NODES:
            return NODES[int(key) - 1]
    from opsctl.errors import ConfigError

    raise ConfigError(f"unknown lab host {host!r}",
                      f"one of: {', '.join(HOST_NAMES)} (or a node index 1..{MAX_NODES})")


# node 1: the names the single-host lab has always had (inventories/lab, docs/lab.md, tests)
NODE1 = NODES[0]
NETNS = NODE1.netns                  # "opsctl-lab"
VETH_HOST = NODE1.veth_host          # "olab-h"
VETH_GUEST = NODE1.veth_guest        # "olab-g"
HOST_IP = NODE1.host_ip              # "10.203.9.1"
GUEST_IP = NODE1.guest_ip            # "10.203.9.2"
MACHINE = NODE1.machine              # "opsctl-lab"
HOSTNAME = NODE1.hostname            # "gpuhost"
CGROUP_NAME = NODE1.cgroup_name      # "opsctl-lab"
CGROUP_HIERARCHIES = ("systemd", "unified")  # hybrid v1 (name=systemd) + v2 (unified), as on this machine
OVERLAY_SIZE = "4g"

SSH_USER = "root"
SSH_PORT = 22

# What the guest gets in its overlay (upper dir) only; never on the machine itself.
GUEST_MODEL_PATH = "/srv/models/kimi-k2.6"
GUEST_FAULTS_FILE = "/etc/opsctl-lab/faults.json"
GUEST_RUN_DIR = "/run/opsctl-lab"          # emulated GPU process registry (nvidia-smi reads it)
GUEST_NVIDIA_SMI = "/usr/local/bin/nvidia-smi"
GUEST_NVCC = "/usr/local/cuda/bin/nvcc"
SERVICE_PORT = 30000

# the guest is an overlay of this machine's / (Debian 12: CPython 3.11, glibc 2.36); inventories/lab says the same
LAB_PYTHON = "3.11"
LAB_PLATFORM = "manylinux_2_36_x86_64"

EMULATOR_DIST = "sglang"
EMULATOR_VERSION = "0.5.23+lab"

# Units of the machine that must not start in the guest (the guest boots the machine's own /).
MASKED_UNITS = (
    "postgresql.service", "systemd-timesyncd.service", "apt-daily.timer", "apt-daily-upgrade.timer",
    "e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer", "man-db.timer",
    "dpkg-db-backup.timer", "getty@tty1.service", "systemd-pstore.service", "remote-fs.target",
    # Debian's prometheus package enables its server: the guest runs node_exporter only (the lab
    # test's Prometheus runs on this side, by PID)
    "prometheus.service",
)

DEBIAN_PACKAGES = {  # package -> a binary it provides
    "openssh-server": "/usr/sbin/sshd",
    "systemd-container": "/usr/bin/systemd-nspawn",
    "iproute2": "/usr/sbin/ip",
    "rsync": "/usr/bin/rsync",
    "openssh-client": "/usr/bin/ssh",
    # node_exporter in the guest (its unit enabled by the package), reading opsctl's textfile
    # (docs/metrics.md); prometheus: the lab test's server on this side and promtool
    "prometheus-node-exporter": "/usr/bin/prometheus-node-exporter",
    "prometheus": "/usr/bin/prometheus",
}

SSH_OPTIONS = (
    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=2", "-o", "LogLevel=ERROR",
    "-o", "BatchMode=yes",
)

# The lab's own commands in a guest (guest_run: the tests' checks, faults, `opsctl lab ssh`) share
# one SSH connection per guest: a new connection costs both sides a key exchange and the guest's
# sshd a fork and re-exec, ~0.1 s of CPU on a 2-core machine that also runs the tests. The master
# lives until `lab down` closes it (`ssh -O exit`) or 10 minutes after its last session; server
# alive probes end it within ~6 s of its guest going away. opsctl's own connections (fabric,
# ansible, rsync) are not multiplexed by this: they are what is under test.
SSH_CONTROL_DIR = Path("/run/opsctl-lab-ssh")
SSH_MUX_OPTIONS = (
    "-o", "ControlMaster=auto", "-o", "ControlPersist=600",
    "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3",
)
