"""Fixed facts of the lab host (shared with inventories/lab/ and docs/lab.md)."""
from __future__ import annotations

from pathlib import Path

STATE_DIR = Path("/var/lib/opsctl-lab")
KEY_FILE = STATE_DIR / "id_ed25519"
PID_FILE = STATE_DIR / "nspawn.pid"
BOOT_LOG = STATE_DIR / "boot.log"
BOOT_SCRIPT = STATE_DIR / "boot.sh"
WHEELHOUSE = STATE_DIR / "wheelhouse"
DRAFTER_DIR = STATE_DIR / "drafter"
OVERLAY_DIR = STATE_DIR / "cg"          # tmpfs mounted only inside the boot script's mount namespace
LOCK_FILE = Path("/run/opsctl-lab.lock")  # serialises lab up/down
SESSION_LOCK = Path("/run/opsctl-lab.session.lock")  # held by whoever uses the lab (a pytest session, `opsctl lab`)
HOLDER_FILE = STATE_DIR / "holder.json"  # who brought the lab up (opsctl/lab/holder.py)

NETNS = "opsctl-lab"
VETH_HOST = "olab-h"
VETH_GUEST = "olab-g"
HOST_IP = "10.203.9.1"
GUEST_IP = "10.203.9.2"
PREFIX = 30
MACHINE = "opsctl-lab"
HOSTNAME = "gpuhost"
CGROUP_NAME = "opsctl-lab"
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
)

DEBIAN_PACKAGES = {  # package -> a binary it provides
    "openssh-server": "/usr/sbin/sshd",
    "systemd-container": "/usr/bin/systemd-nspawn",
    "iproute2": "/usr/sbin/ip",
    "rsync": "/usr/bin/rsync",
    "openssh-client": "/usr/bin/ssh",
}

SSH_OPTIONS = (
    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=2", "-o", "LogLevel=ERROR",
    "-o", "BatchMode=yes",
)
