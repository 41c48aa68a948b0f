"""The one interface for running things on a host: run / put / get, one Result.

Workflow code talks to `Connection` only; whether the bytes move through
fabric (a direct SSH call), ansible-runner (playbooks, see opsctl/playbook.py)
or a local shell (tests) does not show in it.
"""
from __future__ import annotations

import shlex
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from opsctl.errors import HostError

if TYPE_CHECKING:  # pragma: no cover
    from opsctl.config import HostConfig


@dataclass(frozen=True)
class Result:
    """What one command (or one transfer) did on a host."""

    command: str
    rc: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    host: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def check(self, what: str | None = None, fix: str | None = None) -> "Result":
        if not self.ok:
            tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-1:] or [""]
            raise HostError(f"{what or self.command!r} failed on {self.host or 'host'} "
                            f"(exit {self.rc}): {tail[0][:300]}", fix)
        return self


class Connection(Protocol):
    name: str

    def run(self, command: str, *, check: bool = True, timeout: float | None = None,
            stdin: str | None = None, on_stderr_line: Callable[[str], None] | None = None) -> Result: ...

    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> Result: ...

    def get(self, remote: str, local: str | Path) -> Result: ...

    def close(self) -> None: ...


class _LineWriter:
    """A file-like sink that calls back once per complete line."""

    def __init__(self, callback: Callable[[str], None]):
        self.callback, self.buf = callback, ""

    def write(self, data: str) -> int:
        self.buf += data
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self.callback(line)
        return len(data)

    def flush(self) -> None:
        pass


@dataclass
class LocalConnection:
    """Runs commands on this machine through bash. For tests and the lab's own plumbing."""

    name: str = "localhost"

    def run(self, command: str, *, check: bool = True, timeout: float | None = None,
            stdin: str | None = None, on_stderr_line: Callable[[str], None] | None = None) -> Result:
        start = time.monotonic()
        try:
            proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                                  timeout=timeout, input=stdin)
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
            if on_stderr_line:
                for line in err.splitlines():
                    on_stderr_line(line)
        except subprocess.TimeoutExpired as exc:
            rc, out, err = 124, str(exc.stdout or ""), f"timed out after {timeout}s"
        result = Result(command, rc, out, err, time.monotonic() - start, self.name)
        return result.check() if check else result

    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> Result:
        cmd = f"install -D {'-m %o ' % mode if mode is not None else ''}{shlex.quote(str(local))} {shlex.quote(remote)}"
        return self.run(cmd)

    def get(self, remote: str, local: str | Path) -> Result:
        return self.run(f"cp {shlex.quote(remote)} {shlex.quote(str(local))}")

    def close(self) -> None:
        pass


def _quiet_paramiko() -> None:
    """paramiko's transport thread logs a failed handshake ("Exception (client): Error reading SSH
    protocol banner") with two tracebacks at ERROR; with no handler configured Python's last-resort
    handler prints them on stderr before opsctl's one-line error (issue #49). The exception still
    reaches _connection, which says what happened in one line."""
    import logging

    log = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())
    log.propagate = False


def _ssh_failure(name: str, ssh, exc: Exception, lab_hint: str) -> HostError:
    """One line for an SSH handshake that failed after the TCP connection was made: what failed
    (no SSH server answered, the host key, the login) and the fix for that, not a generic one."""
    import paramiko

    text = str(exc) or type(exc).__name__
    where = f"{name} ({ssh.describe()})"
    if isinstance(exc, paramiko.BadHostKeyException) or "known_hosts" in text or "host key" in text.lower():
        return HostError(f"SSH to {where} failed: {text}",
                         f"check the host key in {ssh.known_hosts_file} (ssh-keyscan -p {ssh.port} {ssh.address})")
    if isinstance(exc, paramiko.AuthenticationException):
        return HostError(f"SSH to {where} failed: {text}",
                         "check the key file and the user in the inventory (ansible_ssh_private_key_file, "
                         "ansible_user) and that the key is in the host's authorized_keys")
    # the banner never came (a port that is not sshd, a host that accepts and stalls or drops the
    # connection), or the session died with it (fabric's "No existing session" afterwards)
    return HostError(f"host {where} is unreachable: something accepted the TCP connection but no SSH "
                     f"server answered within {ssh.connect_timeout:g} s ({text})",
                     "check the address and port in the inventory (ansible_host, ansible_port) and that "
                     "sshd runs there and answers" + lab_hint)


@dataclass
class SSHConnection:
    """fabric/paramiko connection rendered from the host's SSHSettings (`HostConfig.ssh`,
    opsctl/host/ssh.py), through its jump host where the inventory names one.

    Host keys are verified against the inventory's known_hosts (or the user's)
    unless the inventory explicitly disables it (the lab only).
    """

    host: "HostConfig"
    connect_timeout: float | None = None  # default: the settings' connect timeout
    _conn: object | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.connect_timeout is None:
            self.connect_timeout = self.host.ssh.connect_timeout

    @property
    def name(self) -> str:
        return self.host.name

    def _connection(self):
        if self._conn is not None:
            return self._conn
        import paramiko

        ssh = self.host.ssh
        if self.connect_timeout != ssh.connect_timeout:
            ssh = ssh.model_copy(update={"connect_timeout": self.connect_timeout})
        hop = ssh.first_hop
        lab_hint = "; for the lab run 'opsctl lab up'" if not ssh.strict_host_keys else ""
        try:  # fail fast with a clear message before paramiko's long stack traces
            socket.create_connection(hop, timeout=self.connect_timeout).close()
        except OSError as exc:
            what = f"jump host {ssh.jump_host.spec}" if ssh.jump_host else f"{hop[0]}:{hop[1]}"
            raise HostError(f"host {self.host.name} ({what}) is unreachable: {exc}",
                            "check the address in the inventory and that sshd runs there" + lab_hint) from exc
        conn = ssh.fabric_connection(self.host.name)
        _quiet_paramiko()
        try:
            conn.open()
            conn.client.get_transport().set_keepalive(ssh.server_alive_interval)
        except paramiko.ChannelException as exc:  # the jump host could not open the tunnel
            self._close_gateway(conn)
            raise HostError(f"SSH to {self.host.name} ({ssh.describe()}) failed: the jump host could not "
                            f"connect to {ssh.address}:{ssh.port}: {exc}",
                            "check the target address as the jump host sees it, and that the jump host's "
                            "sshd allows TCP forwarding") from exc
        except paramiko.SSHException as exc:
            self._close_gateway(conn)
            raise _ssh_failure(self.host.name, ssh, exc, lab_hint) from exc
        except OSError as exc:
            self._close_gateway(conn)
            raise HostError(f"host {self.host.name} ({ssh.describe()}) is unreachable: {exc}",
                            "check the address in the inventory" + lab_hint) from exc
        self._conn = conn
        return conn

    @staticmethod
    def _close_gateway(conn) -> None:
        gateway = getattr(conn, "gateway", None)
        if gateway is not None and hasattr(gateway, "close"):
            gateway.close()  # fabric does not close a gateway Connection with its user

    def run(self, command: str, *, check: bool = True, timeout: float | None = None,
            stdin: str | None = None, on_stderr_line: Callable[[str], None] | None = None) -> Result:
        """Run `command` on a channel of our own: no pty, nothing forwards ^C to the host.
        A signal on the controller (opsctl/brake.py) closes the channel and propagates."""
        from opsctl.errors import OpsctlError

        transport = self._connection().client.get_transport()
        start = time.monotonic()
        chan = None
        try:
            chan = transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(command)
            if stdin is not None:
                # (invoke fed in_stream a byte per 10 ms; the bytes go on the channel directly)
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            err_lines = _LineWriter(on_stderr_line) if on_stderr_line else None
            while True:
                busy = False
                if chan.recv_ready():
                    out += chan.recv(65536)
                    busy = True
                if chan.recv_stderr_ready():
                    chunk = chan.recv_stderr(65536)
                    err += chunk
                    if err_lines:
                        err_lines.write(chunk.decode(errors="replace"))
                    busy = True
                if busy:
                    continue
                if chan.exit_status_ready():
                    # sshd may send the exit status before the last output: read both streams to EOF
                    chan.settimeout(30)
                    try:
                        while True:
                            data = chan.recv(65536)
                            if not data:
                                break
                            out += data
                        while True:
                            chunk = chan.recv_stderr(65536)
                            if not chunk:
                                break
                            err += chunk
                            if err_lines:
                                err_lines.write(chunk.decode(errors="replace"))
                    except socket.timeout:
                        pass  # a child that keeps the channel open (a daemon): what came is what we have
                    break
                if timeout and time.monotonic() - start > timeout:
                    chan.close()
                    result = Result(command, 124, out.decode(errors="replace"), f"timed out after {timeout}s",
                                    time.monotonic() - start, self.name)
                    return result.check() if check else result
                if not transport.is_active():
                    raise EOFError("the SSH transport closed")
                time.sleep(0.005)
            rc = chan.recv_exit_status()
            if err_lines and err_lines.buf:
                err_lines.write("\n")
            chan.close()
        except OpsctlError:
            if chan is not None:
                chan.close()
            raise
        except Exception as exc:  # noqa: BLE001 - transport errors become one HostError
            if chan is not None:
                chan.close()
            raise HostError(f"host {self.name} became unreachable: lost the SSH connection while running "
                            f"{command[:80]!r}: {type(exc).__name__}{f': {exc}' if str(exc) else ''}",
                            "check the host is up, then run the command again") from exc
        result = Result(command, rc, out.decode(errors="replace"), err.decode(errors="replace"),
                        time.monotonic() - start, self.name)
        return result.check() if check else result

    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> Result:
        conn = self._connection()
        start = time.monotonic()
        conn.put(str(local), remote)
        if mode is not None:
            conn.sftp().chmod(remote, mode)
        return Result(f"put {local} {remote}", 0, "", "", time.monotonic() - start, self.name)

    def get(self, remote: str, local: str | Path) -> Result:
        conn = self._connection()
        start = time.monotonic()
        conn.get(remote, str(local))
        return Result(f"get {remote} {local}", 0, "", "", time.monotonic() - start, self.name)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._close_gateway(self._conn)
            self._conn = None


def connect(host: "HostConfig") -> Connection:
    return SSHConnection(host)
