"""The deploy lock: a `flock` on `<root>/.lock` held by a live SSH channel for as long as a
deploy or rollback runs, so it dies with the controller (a crashed deploy never leaves a stale
lock); the holder is written beside it (`.lock.holder`) and named in a refusal. The host-side
watch takes the same lock before it switches (opsctl/onhost/watch_agent.py, HostLock)."""
from __future__ import annotations

import json
import os
import shlex
import time

from opsctl.config import HostConfig
from opsctl.errors import HostError, LockHeldError
from opsctl.host.connection import Connection, SSHConnection
from opsctl.ledger import now_iso, who


def lock_command(root: str, holder: str) -> str:
    """The host command that holds the deploy lock while its stdin (the SSH channel) is open.
    The holder record (`holder`, a JSON object) gets the host-side pid of the shell that holds
    the flock (`host_pid`): a refusal checks it, so a record left by a holder that is gone is
    never reported as the holder; the record is removed when the lock is let go."""
    hf = shlex.quote(f"{root}/.lock.holder")
    inner = (f"trap 'rm -f {hf}' EXIT; trap 'exit 1' HUP INT TERM; "
             f"printf '%s, \"host_pid\": %s}}' {shlex.quote(holder[:-1])} $$ > {hf}; echo LOCKED; cat >/dev/null")
    return f"mkdir -p {shlex.quote(root)} && exec flock -n -E 75 {shlex.quote(f'{root}/.lock')} sh -c {shlex.quote(inner)}"


class HostLock:
    """flock on `<root>/.lock`, held by a long-running SSH command for as long as the
    deploy runs; it is released when the controller exits or dies (the channel closes)."""

    def __init__(self, conn: Connection, host: HostConfig, action: str):
        self.conn, self.host, self.action = conn, host, action
        self._channel = None

    def __enter__(self) -> "HostLock":
        if not isinstance(self.conn, SSHConnection):  # local connections: tests only
            return self
        root = self.host.install_root
        holder = json.dumps({"who": who(), "pid": os.getpid(), "action": self.action, "since": now_iso()})
        fab = self.conn._connection()
        transport = fab.client.get_transport()
        chan = transport.open_session()
        chan.exec_command(lock_command(str(root), holder))
        buf = b""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if chan.recv_ready():
                buf += chan.recv(1024)
                if b"LOCKED" in buf:
                    self._channel = chan
                    return self
            if chan.exit_status_ready():
                break
            time.sleep(0.02)
        rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
        chan.close()
        if rc == 75:
            desc = describe_holder(self.conn, self.host)
            raise LockHeldError(f"host {self.host.name} is locked by {desc}",
                                "wait for that run to finish ('opsctl status' shows progress), then try again")
        raise HostError(f"could not take the deploy lock on {self.host.name} (exit {rc})",
                        "check that flock (util-linux) is installed on the host")

    def __exit__(self, *exc) -> None:
        if self._channel is not None:
            try:
                self._channel.shutdown_write()
                self._channel.close()
            except Exception:  # noqa: BLE001 - the lock dies with the channel anyway
                pass
            self._channel = None


def describe_holder(conn: Connection, host: HostConfig) -> str:
    """Who holds the deploy lock, from `<root>/.lock.holder`, for a refusal. The record names
    the host-side process holding the flock (`host_pid`: the controller's shell, or the watch
    itself); a record whose process is gone is stale (its holder exited without clearing it,
    e.g. killed) and is never named as the holder (issue #32 item 12)."""
    hf = shlex.quote(str(host.install_root / ".lock.holder"))
    held = conn.run(f"cat {hf} 2>/dev/null", check=False).stdout.strip()
    try:
        info = json.loads(held)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        return "another opsctl run"
    pid = info.get("host_pid")
    if isinstance(pid, int) and pid > 0 and not conn.run(f"kill -0 {pid} 2>/dev/null", check=False).ok:
        return f"another opsctl run (the holder record names {info.get('who')}, whose process has exited: stale)"
    return f"{info.get('who')} (pid {info.get('pid')}, {info.get('action')} since {info.get('since')})"


