"""Lifecycle of the lab host: a systemd-nspawn container booted over a throw-away
overlay of `/`, in its own network namespace, reached over real SSH.

Recipe: /work/shared/reference/lab-host.md. Safety rules kept here:
- the boot script moves itself into its own cgroup (`opsctl-lab`) FIRST, then
  unshares a private mount namespace, mounts a tmpfs + overlay, and execs
  `systemd-nspawn --boot` (PID 1 of the guest is systemd, inside nspawn only);
- no systemd manager is ever started outside nspawn;
- only processes this module started are stopped, by PID: the nspawn PID it
  recorded, and the processes inside its own cgroup (which by construction
  are the guest's);
- the guest's namespace has no default route: its only peer is the host side
  of the veth (10.203.9.1/30).
`down` halts the guest (SIGTERM to nspawn = clean poweroff), then removes the
namespace, veth, cgroups and nspawn's runtime dirs; the tmpfs/overlay mounts
lived only in the boot script's private mount namespace, so they die with it.
`leftovers()` lists anything that remains (tests assert it is empty).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from opsctl.errors import LabError
from opsctl.lab import constants as C

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------- preconditions

def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, mounts, systemd-nspawn)",
                       "run it as root, e.g. 'sudo opsctl lab up'")


def missing_packages() -> list[str]:
    return [pkg for pkg, binary in C.DEBIAN_PACKAGES.items() if not Path(binary).exists()]


def ensure_packages(say: Say = print) -> list[str]:
    """Install the Debian packages the lab needs when missing (says so). Returns what it installed."""
    missing = missing_packages()
    if not missing:
        return []
    if not shutil.which("apt-get"):
        raise LabError(f"missing packages {', '.join(missing)} and no apt-get to install them",
                       "install openssh-server systemd-container iproute2 rsync by hand")
    say(f"lab: installing missing Debian packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # policy-rc.d: keep dpkg from trying to start the packages' services on this machine
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = not policy.exists()
    if made_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        for cmd in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0 and cmd[1] == "install":
                raise LabError(f"apt-get install {' '.join(missing)} failed: "
                               f"{(proc.stderr.strip().splitlines() or [''])[-1]}",
                               "install them by hand: scripts/lab-deps")
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)
    still = missing_packages()
    if still:
        raise LabError(f"packages still missing after apt-get: {' '.join(still)}", "run scripts/lab-deps")
    return missing


# ---------------------------------------------------------------- small helpers

def _run(cmd: list[str], check: bool = False, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[:300]}")
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purposes
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _recorded_pid() -> int | None:
    try:
        return int(C.PID_FILE.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_our_nspawn(pid: int) -> bool:
    """nspawn for our machine, or our boot script before it execs nspawn."""
    cmd = _cmdline(pid)
    if not cmd:
        return False
    if "systemd-nspawn" in cmd[0] and f"--machine={C.MACHINE}" in cmd:
        return True
    return str(C.BOOT_SCRIPT) in cmd[:3]


def cgroup_dirs() -> list[Path]:
    """The cgroup directories the lab's boot script puts itself into."""
    root = Path("/sys/fs/cgroup")
    if (root / "unified").is_dir() or (root / "systemd").is_dir():  # hybrid / legacy
        return [root / h / C.CGROUP_NAME for h in C.CGROUP_HIERARCHIES if (root / h).is_dir()]
    return [root / C.CGROUP_NAME]  # pure cgroup v2


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for top in cgroup_dirs():
        if not top.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    pids.update(int(x) for x in Path(dirpath, "cgroup.procs").read_text().split())
                except OSError:
                    pass
    return pids


def _rmdir_tree(top: Path) -> None:
    if not top.is_dir():
        return
    for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -t[0].count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def netns_exists() -> bool:
    return Path(f"/run/netns/{C.NETNS}").exists()


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _our_mounts() -> list[str]:
    needles = (str(C.STATE_DIR), f"/run/netns/{C.NETNS}")
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mnt = line.split()[4]
            if any(mnt.startswith(n) for n in needles):
                out.append(mnt)
    return out


@contextlib.contextmanager
def _locked(path: Path = C.LOCK_FILE, wait_s: float = 300) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LabError(f"another 'opsctl lab' command holds {path}", "wait for it to finish")
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------- SSH to the guest

def ssh_argv(command: str | None = None, *, tty: bool = False) -> list[str]:
    argv = ["ssh", "-i", str(C.KEY_FILE), *C.SSH_OPTIONS, "-p", str(C.SSH_PORT)]
    if tty:
        argv.append("-t")
    argv.append(f"{C.SSH_USER}@{C.GUEST_IP}")
    if command is not None:
        argv += ["--", command]
    return argv


def guest_run(command: str, *, timeout: float = 60, stdin: str | None = None,
              check: bool = False) -> subprocess.CompletedProcess:
    """Run a shell command in the guest over SSH (the lab's own plumbing)."""
    try:
        proc = subprocess.run(ssh_argv(command), capture_output=True, text=True, timeout=timeout,
                              input=stdin if stdin is not None else "")
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"command on the lab host timed out after {timeout}s: {command[:80]!r}") from exc
    if check and proc.returncode != 0:
        raise LabError(f"command on the lab host failed (exit {proc.returncode}): {command[:80]!r}: "
                       f"{(proc.stderr.strip() or proc.stdout.strip())[-300:]}",
                       "is the lab up? 'opsctl lab status'")
    return proc


def ssh_answers(timeout: float = 4) -> bool:
    try:
        return guest_run("true", timeout=timeout).returncode == 0
    except LabError:
        return False


# ---------------------------------------------------------------- status

@dataclass
class LabStatus:
    running: bool
    pid: int | None
    netns: bool
    ssh: bool
    system_state: str
    address: str = C.GUEST_IP
    key_file: str = str(C.KEY_FILE)
    ssh_command: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def status(probe_ssh: bool = True) -> LabStatus:
    pid = _recorded_pid()
    running = bool(pid and _pid_alive(pid) and _is_our_nspawn(pid))
    ssh_ok = running and probe_ssh and ssh_answers()
    state = ""
    if ssh_ok:
        state = guest_run("systemctl is-system-running", timeout=10).stdout.strip()
    return LabStatus(running=running, pid=pid if running else None, netns=netns_exists(), ssh=ssh_ok,
                     system_state=state, ssh_command=shlex.join(ssh_argv()))


def leftovers() -> list[str]:
    """Everything the lab may leave on this machine; [] after a clean `down`."""
    out: list[str] = []
    pid = _recorded_pid()
    if pid and _pid_alive(pid) and _is_our_nspawn(pid):
        out.append(f"process: nspawn pid {pid}")
    if C.PID_FILE.exists():
        out.append(f"file: {C.PID_FILE}")
    for p in sorted(_cgroup_pids()):
        out.append(f"process: pid {p} in the lab cgroup")
    for d in cgroup_dirs():
        if d.exists():
            out.append(f"cgroup: {d}")
    if netns_exists():
        out.append(f"netns: {C.NETNS}")
    for link in (C.VETH_HOST, C.VETH_GUEST):
        if _link_exists(link):
            out.append(f"link: {link}")
    for m in _our_mounts():
        out.append(f"mount: {m}")
    for d in _nspawn_runtime_dirs():
        if d.exists():
            out.append(f"dir: {d}")
    for pid_ in _stray_nspawns():
        out.append(f"process: nspawn pid {pid_} for machine {C.MACHINE}")
    return out


def _nspawn_runtime_dirs() -> list[Path]:
    base = Path("/run/systemd/nspawn")
    return [base / "propagate" / C.MACHINE, base / "unix-export" / C.MACHINE]


def _reap(pid: int) -> None:
    """Collect our own child's exit status (the fixture boots from the test process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _stray_nspawns() -> list[int]:
    """nspawn processes for our machine name (e.g. from a lost PID file)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if _is_our_nspawn(pid) and _pid_alive(pid):
                found.append(pid)
    return found


# ---------------------------------------------------------------- teardown

def _stop_pid(pid: int, wait_s: float, say: Say) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.1)
    if _pid_alive(pid):
        say(f"lab: nspawn pid {pid} did not halt within {wait_s:.0f}s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for _ in range(20):
        _reap(pid)
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.05)


def _cleanup(say: Say, halt_wait_s: float = 30) -> None:
    """Remove everything a (running or crashed) lab left behind."""
    for pid in {p for p in [_recorded_pid()] if p} | set(_stray_nspawns()):
        if _pid_alive(pid) and _is_our_nspawn(pid):
            say(f"lab: halting the guest (nspawn pid {pid})")
            _stop_pid(pid, halt_wait_s, say)
    # whatever is left in our cgroup was started by our boot script (the guest's processes)
    for _ in range(50):
        pids = _cgroup_pids()
        if not pids:
            break
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.1)
    for d in cgroup_dirs():
        _rmdir_tree(d)
    if netns_exists():
        _run(["ip", "netns", "del", C.NETNS])
    if _link_exists(C.VETH_HOST):
        _run(["ip", "link", "del", C.VETH_HOST])
    for d in _nspawn_runtime_dirs():
        shutil.rmtree(d, ignore_errors=True)
    for d in (Path("/run/systemd/nspawn/propagate"), Path("/run/systemd/nspawn/unix-export"),
              Path("/run/systemd/nspawn/locks"), Path("/run/systemd/nspawn")):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty: nothing of anyone else's is touched
    C.PID_FILE.unlink(missing_ok=True)


def down(say: Say = print) -> list[str]:
    """Halt the guest and remove everything; returns leftovers (empty when clean)."""
    require_root()
    with _locked():
        _cleanup(say)
    left = leftovers()
    if left:
        raise LabError("lab teardown left: " + "; ".join(left), "run 'opsctl lab down' again; see docs/lab.md")
    return left


# ---------------------------------------------------------------- boot

def _boot_script(cg_dirs: list[Path]) -> str:
    W = str(C.STATE_DIR)
    masks = " ".join(C.MASKED_UNITS)
    cg_lines = "\n".join(f"mkdir -p {d}; echo $$ > {d}/cgroup.procs" for d in cg_dirs)
    return f"""#!/bin/bash
# Generated by opsctl.lab (do not edit). Started as: setsid unshare -m {C.BOOT_SCRIPT}
set -e
# 1. own cgroup FIRST: systemd inside nspawn must never see the machine's root cgroup
{cg_lines}
# 2. private mounts: tmpfs + overlay of / exist only in this mount namespace
mount --make-rprivate /
mkdir -p {W}/cg
mount -t tmpfs -o size={C.OVERLAY_SIZE},mode=755 opsctl-lab {W}/cg
mkdir -p {W}/cg/u {W}/cg/w {W}/cg/m
mount -t overlay opsctl-lab -o lowerdir=/,upperdir={W}/cg/u,workdir={W}/cg/w {W}/cg/m
M={W}/cg/m
# 3. guest-only files (nvidia-smi, nvcc, model dir, authorized key) into the overlay
cp -a {W}/guest/. $M/
chmod 700 $M/root/.ssh; chmod 600 $M/root/.ssh/authorized_keys
for u in {masks}; do ln -sf /dev/null $M/etc/systemd/system/$u; done
rm -f $M/etc/systemd/system/multi-user.target.wants/postgresql.service
echo {C.HOSTNAME} > $M/etc/hostname; : > $M/etc/machine-id
rm -f $M/usr/sbin/policy-rc.d
exec systemd-nspawn -q -D $M --boot --register=no --keep-unit \\
  --network-namespace-path=/run/netns/{C.NETNS} --machine={C.MACHINE} --hostname={C.HOSTNAME} \\
  --resolv-conf=off --timezone=off
"""


def _stage_guest_files() -> None:
    """The tree copied into the guest's overlay at boot (guest only)."""
    from opsctl.lab import guestfiles

    staging = C.STATE_DIR / "guest"
    shutil.rmtree(staging, ignore_errors=True)
    guestfiles.write_tree(staging, C.KEY_FILE.with_suffix(".pub").read_text())


def _setup_network() -> None:
    _run(["ip", "netns", "add", C.NETNS], check=True)
    _run(["ip", "link", "add", C.VETH_HOST, "type", "veth", "peer", "name", C.VETH_GUEST], check=True)
    _run(["ip", "link", "set", C.VETH_GUEST, "netns", C.NETNS], check=True)
    _run(["ip", "addr", "add", f"{C.HOST_IP}/{C.PREFIX}", "dev", C.VETH_HOST], check=True)
    _run(["ip", "link", "set", C.VETH_HOST, "up"], check=True)
    _run(["ip", "-n", C.NETNS, "addr", "add", f"{C.GUEST_IP}/{C.PREFIX}", "dev", C.VETH_GUEST], check=True)
    _run(["ip", "-n", C.NETNS, "link", "set", C.VETH_GUEST, "up"], check=True)
    _run(["ip", "-n", C.NETNS, "link", "set", "lo", "up"], check=True)


def _boot_log_tail(n: int = 15) -> str:
    try:
        return "\n".join(C.BOOT_LOG.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def up(say: Say = print, *, timeout_s: float = 90, install: bool = True) -> LabStatus:
    """Boot the lab (idempotent). Cleans up a crashed earlier run first."""
    require_root()
    if install:
        ensure_packages(say)
    with _locked():
        st = status()
        if st.running and st.ssh:
            say(f"lab: already up (nspawn pid {st.pid}); reach it with: {st.ssh_command}")
            _ensure_artifacts(say)
            return st
        if st.running or leftovers():
            say("lab: cleaning up an earlier run")
            _cleanup(say)
            left = leftovers()
            if left:
                raise LabError("could not clean up an earlier lab run: " + "; ".join(left),
                               "see docs/lab.md (manual cleanup)")
        t0 = time.monotonic()
        C.STATE_DIR.mkdir(parents=True, exist_ok=True)
        os.chmod(C.STATE_DIR, 0o755)
        if not C.KEY_FILE.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "opsctl-lab", "-f", str(C.KEY_FILE)],
                 check=True)
        _ensure_artifacts(say)
        _stage_guest_files()
        dirs = cgroup_dirs()
        C.BOOT_SCRIPT.write_text(_boot_script(dirs))
        C.BOOT_SCRIPT.chmod(0o755)
        _setup_network()
        log = open(C.BOOT_LOG, "wb")
        proc = subprocess.Popen(["unshare", "-m", str(C.BOOT_SCRIPT)], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        log.close()
        C.PID_FILE.write_text(f"{proc.pid}\n")
        say(f"lab: booting (nspawn pid {proc.pid}, log {C.BOOT_LOG})")
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                tail = _boot_log_tail()
                _cleanup(_quiet)
                raise LabError(f"the lab container exited during boot (rc {proc.returncode}): {tail[-600:]}",
                               f"see {C.BOOT_LOG}")
            if ssh_answers(timeout=3):
                break
            if time.monotonic() > deadline:
                _cleanup(_quiet)
                raise LabError(f"the lab host did not answer SSH within {timeout_s:.0f}s", f"see {C.BOOT_LOG}")
            time.sleep(0.2)
        state = guest_run("systemctl is-system-running --wait", timeout=max(5.0, deadline - time.monotonic())).stdout.strip()
        say(f"lab: up in {time.monotonic() - t0:.1f}s (system {state or 'unknown'}); "
            f"reach it with: {shlex.join(ssh_argv())}")
        return status()


def _ensure_artifacts(say: Say) -> None:
    """Emulator wheel in the wheelhouse + generated drafter (deterministic; rebuilt when stale)."""
    from opsctl.lab import artifacts

    built = artifacts.ensure(C.WHEELHOUSE, C.DRAFTER_DIR)
    for what in built:
        say(f"lab: built {what}")
