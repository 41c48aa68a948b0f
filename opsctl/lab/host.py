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


def _node(node: "int | str | C.LabNode | None" = None) -> C.LabNode:
    return C.resolve_node(node)


def _recorded_pid(node: "int | C.LabNode" = 1) -> int | None:
    try:
        return int(_node(node).pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_our_nspawn(pid: int, node: "int | C.LabNode" = 1) -> bool:
    """nspawn for this node's machine (its own --machine= argv), or its boot script before it execs nspawn."""
    n = _node(node)
    cmd = _cmdline(pid)
    if not cmd:
        return False
    if "systemd-nspawn" in cmd[0] and f"--machine={n.machine}" in cmd:
        return True
    return str(n.boot_script) in cmd[:3]


def cgroup_dirs(node: "int | C.LabNode" = 1) -> list[Path]:
    """The cgroup directories a node's boot script puts itself into."""
    n = _node(node)
    root = Path("/sys/fs/cgroup")
    if (root / "unified").is_dir() or (root / "systemd").is_dir():  # hybrid / legacy
        return [root / h / n.cgroup_name for h in C.CGROUP_HIERARCHIES if (root / h).is_dir()]
    return [root / n.cgroup_name]  # pure cgroup v2


def _cgroup_pids(node: "int | C.LabNode" = 1) -> set[int]:
    pids: set[int] = set()
    for top in cgroup_dirs(node):
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


def netns_exists(node: "int | C.LabNode" = 1) -> bool:
    return Path(f"/run/netns/{_node(node).netns}").exists()


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _our_mounts(node: "int | C.LabNode | None" = None) -> list[str]:
    """Mounts of this machine's mount namespace that belong to the lab: under the state dir or a
    node's netns (node None); a node's own: its netns and its overlay dir only."""
    if node is None:
        exact = {f"/run/netns/{n.netns}" for n in C.NODES}
        prefixes = (str(C.STATE_DIR),)
    else:
        n = _node(node)
        exact = {f"/run/netns/{n.netns}", str(n.overlay_dir)}
        prefixes = (f"{n.overlay_dir}/",)
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mnt = line.split()[4]
            if mnt in exact or any(mnt.startswith(p) for p in prefixes):
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

def control_path(node: "int | str | C.LabNode" = 1) -> Path:
    """The socket of the guest's shared SSH connection (C.SSH_MUX_OPTIONS)."""
    return C.SSH_CONTROL_DIR / _node(node).name


def ssh_argv(command: str | None = None, *, tty: bool = False, node: "int | str | C.LabNode" = 1) -> list[str]:
    n = _node(node)
    with contextlib.suppress(OSError):   # a caller that only prints the command may not be root
        C.SSH_CONTROL_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    argv = ["ssh", "-i", str(C.KEY_FILE), *C.SSH_OPTIONS, *C.SSH_MUX_OPTIONS, "-o", f"ControlPath={control_path(n)}",
            "-p", str(C.SSH_PORT)]
    if tty:
        argv.append("-t")
    argv.append(f"{C.SSH_USER}@{n.guest_ip}")
    if command is not None:
        argv += ["--", command]
    return argv


def guest_run(command: str, *, timeout: float = 60, stdin: str | None = None,
              check: bool = False, node: "int | str | C.LabNode" = 1) -> subprocess.CompletedProcess:
    """Run a shell command in a guest (node 1 unless told) over SSH (the lab's own plumbing)."""
    n = _node(node)
    where = "the lab host" if n.index == 1 else f"lab host {n.name}"
    try:
        proc = subprocess.run(ssh_argv(command, node=n), capture_output=True, text=True, timeout=timeout,
                              input=stdin if stdin is not None else "")
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"command on {where} timed out after {timeout}s: {command[:80]!r}") from exc
    if check and proc.returncode != 0:
        raise LabError(f"command on {where} failed (exit {proc.returncode}): {command[:80]!r}: "
                       f"{(proc.stderr.strip() or proc.stdout.strip())[-300:]}",
                       "is the lab up? 'opsctl lab status'" if n.index == 1 else
                       f"is {n.name} up? 'opsctl lab status'; 'opsctl lab up --hosts {n.index}' boots it")
    return proc


def close_ssh_master(node: "int | str | C.LabNode" = 1) -> None:
    """End the guest's shared SSH connection, if one is open (the master exits on request; its
    socket goes with it)."""
    n = _node(node)
    sock = control_path(n)
    if not sock.exists():
        return
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", f"{C.SSH_USER}@{n.guest_ip}"],
                       capture_output=True, timeout=5)
    with contextlib.suppress(OSError):
        sock.unlink()


def ssh_answers(timeout: float = 4, node: "int | str | C.LabNode" = 1) -> bool:
    try:
        return guest_run("true", timeout=timeout, node=node).returncode == 0
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
    node: int = 1
    host: str = "lab1"          # its name in inventories/lab-fleet
    hostname: str = C.HOSTNAME
    machine: str = C.MACHINE

    def as_dict(self) -> dict:
        return asdict(self)


def _running(node: "int | C.LabNode" = 1) -> tuple[bool, int | None]:
    pid = _recorded_pid(node)
    return bool(pid and _pid_alive(pid) and _is_our_nspawn(pid, node)), pid


def status(probe_ssh: bool = True, node: "int | str | C.LabNode" = 1) -> LabStatus:
    """One node's status (node 1 unless told: what single-host callers always got)."""
    n = _node(node)
    running, pid = _running(n)
    ssh_ok = running and probe_ssh and ssh_answers(node=n)
    state = ""
    if ssh_ok:
        state = guest_run("systemctl is-system-running", timeout=10, node=n).stdout.strip()
    return LabStatus(running=running, pid=pid if running else None, netns=netns_exists(n), ssh=ssh_ok,
                     system_state=state, address=n.guest_ip, ssh_command=shlex.join(ssh_argv(node=n)),
                     node=n.index, host=n.name, hostname=n.hostname, machine=n.machine)


def fleet_status(probe_ssh: bool = True) -> list[LabStatus]:
    """Per-node status of every node that is up or has leftovers (index order)."""
    out = []
    for n in C.NODES:
        if _running(n)[0] or node_leftovers(n):
            out.append(status(probe_ssh=probe_ssh, node=n))
    return out


def node_leftovers(node: "int | C.LabNode" = 1) -> list[str]:
    """What one node may leave on this machine; [] when that node is down and clean."""
    n = _node(node)
    out: list[str] = []
    pid = _recorded_pid(n)
    if pid and _pid_alive(pid) and _is_our_nspawn(pid, n):
        out.append(f"process: nspawn pid {pid}")
    if n.pid_file.exists():
        out.append(f"file: {n.pid_file}")
    if control_path(n).exists():
        out.append(f"socket: {control_path(n)} (the lab's SSH connection to {n.name})")
    for p in sorted(_cgroup_pids(n)):
        out.append(f"process: pid {p} in the lab cgroup {n.cgroup_name}")
    for d in cgroup_dirs(n):
        if d.exists():
            out.append(f"cgroup: {d}")
    if netns_exists(n):
        out.append(f"netns: {n.netns}")
    for link in (n.veth_host, n.veth_guest):
        if _link_exists(link):
            out.append(f"link: {link}")
    for m in _our_mounts(n):
        out.append(f"mount: {m}")
    for d in _nspawn_runtime_dirs(n):
        if d.exists():
            out.append(f"dir: {d}")
    for pid_ in _stray_nspawns(n):
        if pid_ != pid:
            out.append(f"process: nspawn pid {pid_} for machine {n.machine}")
    return out


def leftovers() -> list[str]:
    """Everything the lab (every node) may leave on this machine; [] after a clean full `down`."""
    out: list[str] = []
    for n in C.NODES:
        out += [x for x in node_leftovers(n) if not x.startswith("mount: ")]
    for m in _our_mounts(None):
        out.append(f"mount: {m}")
    return out


def _nspawn_runtime_dirs(node: "int | C.LabNode" = 1) -> list[Path]:
    base = Path("/run/systemd/nspawn")
    m = _node(node).machine
    return [base / "propagate" / m, base / "unix-export" / m]


def _reap(pid: int) -> None:
    """Collect our own child's exit status (the fixture boots from the test process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _stray_nspawns(node: "int | C.LabNode" = 1) -> list[int]:
    """nspawn processes for a node's machine name (e.g. from a lost PID file)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if _is_our_nspawn(pid, node) and _pid_alive(pid):
                found.append(pid)
    return found


# ---------------------------------------------------------------- teardown

def _stop_pid(pid: int, wait_s: float, say: Say, term: bool = True) -> None:
    """SIGTERM (unless already sent: term False), wait up to wait_s, then SIGKILL; reap."""
    if term:
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


def _halt(node: "int | C.LabNode", say: Say, halt_wait_s: float = 30) -> list[int]:
    """SIGTERM a node's nspawn (a clean poweroff); returns the PIDs signalled (not waited for)."""
    n = _node(node)
    pids = []
    for pid in {p for p in [_recorded_pid(n)] if p} | set(_stray_nspawns(n)):
        if _pid_alive(pid) and _is_our_nspawn(pid, n):
            say(f"lab: halting {n.name if n.index > 1 else 'the guest'} (nspawn pid {pid})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    return pids


def _cleanup(say: Say, halt_wait_s: float = 30, node: "int | C.LabNode" = 1) -> None:
    """Remove everything a node's (running or crashed) lab left behind."""
    n = _node(node)
    close_ssh_master(n)
    for pid in _halt(n, say):
        _stop_pid(pid, halt_wait_s, say)
    # whatever is left in the node's cgroup was started by its boot script (the guest's processes)
    for _ in range(50):
        pids = _cgroup_pids(n)
        if not pids:
            break
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.1)
    for d in cgroup_dirs(n):
        _rmdir_tree(d)
    if netns_exists(n):
        _run(["ip", "netns", "del", n.netns])
    if _link_exists(n.veth_host):
        _run(["ip", "link", "del", n.veth_host])
    for d in _nspawn_runtime_dirs(n):
        shutil.rmtree(d, ignore_errors=True)
    for d in (Path("/run/systemd/nspawn/propagate"), Path("/run/systemd/nspawn/unix-export"),
              Path("/run/systemd/nspawn/locks"), Path("/run/systemd/nspawn")):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty: nothing of anyone else's (or another node's) is touched
    n.pid_file.unlink(missing_ok=True)


def down(say: Say = print, nodes: "list[int | str] | None" = None) -> list[str]:
    """Halt guests and remove everything they left; returns leftovers (empty when clean).

    nodes None: every node (the whole lab; checks leftovers() of all of them). A list of
    indexes (or host names): only those nodes; the others keep running."""
    require_root()
    targets = list(C.NODES) if nodes is None else [_node(x) for x in nodes]
    with _locked():
        # signal every guest first so they power off side by side, then clean up each
        signalled = [pid for n in targets for pid in _halt(n, say)]
        for pid in signalled:
            _stop_pid(pid, 30, say, term=False)
        for n in targets:
            _cleanup(say, node=n)
        # the kernel finishes some of it after the last process exits (a cgroup with a dying task
        # is EBUSY, a netns's veth goes in a workqueue): look again for a few seconds before calling
        # anything a leftover (CI, stop 55: one node's teardown failed once under load)
        for _ in range(10):
            left = leftovers() if nodes is None else [x for n in targets for x in node_leftovers(n)]
            if not left:
                break
            time.sleep(0.5)
            for n in targets:
                _cleanup(say, node=n)
    if left:
        raise LabError("lab teardown left: " + "; ".join(left), "run 'opsctl lab down' again; see docs/lab.md")
    return left


# ---------------------------------------------------------------- boot

def _boot_script(cg_dirs: list[Path], node: "int | C.LabNode" = 1) -> str:
    n = _node(node)
    W = str(C.STATE_DIR)
    cg = str(n.overlay_dir)
    masks = " ".join(C.MASKED_UNITS)
    cg_lines = "\n".join(f"mkdir -p {d}; echo $$ > {d}/cgroup.procs" for d in cg_dirs)
    return f"""#!/bin/bash
# Generated by opsctl.lab (do not edit). Started as: setsid unshare -m {n.boot_script}
set -e
# 1. own cgroup FIRST: systemd inside nspawn must never see the machine's root cgroup
{cg_lines}
# 2. private mounts: tmpfs + overlay of / exist only in this mount namespace
mount --make-rprivate /
mkdir -p {cg}
mount -t tmpfs -o size={C.OVERLAY_SIZE},mode=755 {n.machine} {cg}
mkdir -p {cg}/u {cg}/w {cg}/m
mount -t overlay {n.machine} -o lowerdir=/,upperdir={cg}/u,workdir={cg}/w {cg}/m
M={cg}/m
# 3. guest-only files (nvidia-smi, nvcc, model dir, authorized key) into the overlay
cp -a {W}/guest/. $M/
chmod 700 $M/root/.ssh; chmod 600 $M/root/.ssh/authorized_keys
for u in {masks}; do ln -sf /dev/null $M/etc/systemd/system/$u; done
rm -f $M/etc/systemd/system/multi-user.target.wants/postgresql.service
echo {n.hostname} > $M/etc/hostname; : > $M/etc/machine-id
rm -f $M/usr/sbin/policy-rc.d
exec systemd-nspawn -q -D $M --boot --register=no --keep-unit \\
  --network-namespace-path=/run/netns/{n.netns} --machine={n.machine} --hostname={n.hostname} \\
  --resolv-conf=off --timezone=off
"""


def _stage_guest_files() -> None:
    """The tree copied into each guest's overlay at boot (guest only; the same for every node)."""
    from opsctl.lab import guestfiles

    staging = C.STATE_DIR / "guest"
    shutil.rmtree(staging, ignore_errors=True)
    guestfiles.write_tree(staging, C.KEY_FILE.with_suffix(".pub").read_text())


def _setup_network(node: "int | C.LabNode" = 1) -> None:
    n = _node(node)
    _run(["ip", "netns", "add", n.netns], check=True)
    _run(["ip", "link", "add", n.veth_host, "type", "veth", "peer", "name", n.veth_guest], check=True)
    _run(["ip", "link", "set", n.veth_guest, "netns", n.netns], check=True)
    _run(["ip", "addr", "add", f"{n.host_ip}/{C.PREFIX}", "dev", n.veth_host], check=True)
    _run(["ip", "link", "set", n.veth_host, "up"], check=True)
    _run(["ip", "-n", n.netns, "addr", "add", f"{n.guest_ip}/{C.PREFIX}", "dev", n.veth_guest], check=True)
    _run(["ip", "-n", n.netns, "link", "set", n.veth_guest, "up"], check=True)
    _run(["ip", "-n", n.netns, "link", "set", "lo", "up"], check=True)


def _boot_log_tail(n: int = 15, node: "int | C.LabNode" = 1) -> str:
    try:
        return "\n".join(_node(node).boot_log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def check_hosts(hosts: int) -> int:
    if not isinstance(hosts, int) or isinstance(hosts, bool) or hosts < 1:
        raise LabError(f"the lab runs 1 to {C.MAX_NODES} hosts, not {hosts!r}", "e.g. 'opsctl lab up --hosts 3'")
    if hosts > C.MAX_NODES:
        raise LabError(f"the lab runs at most {C.MAX_NODES} hosts on this machine")
    return hosts


def _start_node(n: C.LabNode, say: Say) -> subprocess.Popen:
    dirs = cgroup_dirs(n)
    n.boot_script.write_text(_boot_script(dirs, n))
    n.boot_script.chmod(0o755)
    _setup_network(n)
    log = open(n.boot_log, "wb")
    proc = subprocess.Popen(["unshare", "-m", str(n.boot_script)], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    log.close()
    n.pid_file.write_text(f"{proc.pid}\n")
    what = "" if n.index == 1 else f" {n.name} ({n.guest_ip})"
    say(f"lab: booting{what} (nspawn pid {proc.pid}, log {n.boot_log})")
    return proc


def up(say: Say = print, *, timeout_s: float = 90, install: bool = True, hosts: int = 1) -> LabStatus:
    """Boot the lab's nodes 1..hosts (idempotent: nodes up are kept, missing ones booted side by side;
    nodes above `hosts` are left as they are). Cleans up a node's crashed earlier run first.
    Returns node 1's status (fleet_status() has every node's)."""
    check_hosts(hosts)
    require_root()
    if install:
        ensure_packages(say)
    with _locked():
        wanted = list(C.NODES[:hosts])
        todo: list[C.LabNode] = []
        for n in wanted:
            st = status(node=n)
            if st.running and st.ssh:
                continue
            if st.running or node_leftovers(n):
                say("lab: cleaning up an earlier run" + ("" if n.index == 1 else f" of {n.name}"))
                _cleanup(say, node=n)
                left = node_leftovers(n)
                if left:
                    raise LabError("could not clean up an earlier lab run: " + "; ".join(left),
                                   "see docs/lab.md (manual cleanup)")
            todo.append(n)
        if not todo:
            st = status()
            more = f" ({hosts} hosts)" if hosts > 1 else ""
            say(f"lab: already up{more} (nspawn pid {st.pid}); reach it with: {st.ssh_command}")
            _ensure_artifacts(say)
            return st
        t0 = time.monotonic()
        C.STATE_DIR.mkdir(parents=True, exist_ok=True)
        os.chmod(C.STATE_DIR, 0o755)
        if not C.KEY_FILE.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "opsctl-lab", "-f", str(C.KEY_FILE)],
                 check=True)
        _ensure_artifacts(say)
        _stage_guest_files()
        procs: dict[C.LabNode, subprocess.Popen] = {}

        def fail(problem: str, n: C.LabNode) -> LabError:
            for m in procs:
                _cleanup(_quiet, node=m)
            return LabError(problem, f"see {n.boot_log}")

        for n in todo:   # start every nspawn, then wait for SSH on each: the nodes boot side by side
            procs[n] = _start_node(n, say)
        deadline = time.monotonic() + timeout_s
        pending = list(todo)
        while pending:
            for n in list(pending):
                proc = procs[n]
                if proc.poll() is not None:
                    tail = _boot_log_tail(node=n)
                    raise fail(f"the lab container{'' if n.index == 1 else ' ' + n.name} exited during boot "
                               f"(rc {proc.returncode}): {tail[-600:]}", n)
                if ssh_answers(timeout=3, node=n):
                    pending.remove(n)
            if not pending:
                break
            if time.monotonic() > deadline:
                names = ", ".join(n.name for n in pending)
                raise fail(f"the lab host{'s' if len(pending) > 1 else ''} {names} did not answer SSH "
                           f"within {timeout_s:.0f}s", pending[0])
            time.sleep(0.2)
        states = []
        for n in todo:
            state = guest_run("systemctl is-system-running --wait", node=n,
                              timeout=max(5.0, deadline - time.monotonic())).stdout.strip()
            states.append(state or "unknown")
        if len(todo) == 1 and todo[0].index == 1:
            say(f"lab: up in {time.monotonic() - t0:.1f}s (system {states[0]}); "
                f"reach it with: {shlex.join(ssh_argv())}")
        else:
            say(f"lab: {len(todo)} host(s) up in {time.monotonic() - t0:.1f}s ("
                + ", ".join(f"{n.name} {n.guest_ip} {s}" for n, s in zip(todo, states))
                + f"); reach one with: opsctl lab ssh --host {todo[-1].name}")
        return status()


def _ensure_artifacts(say: Say) -> None:
    """Emulator wheel in the wheelhouse + generated drafter (deterministic; rebuilt when stale)."""
    from opsctl.lab import artifacts

    built = artifacts.ensure(C.WHEELHOUSE, C.DRAFTER_DIR)
    for what in built:
        say(f"lab: built {what}")
