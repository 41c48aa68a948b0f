"""The host's ledger (`<root>/ledger.jsonl`): append-only history that lives on the host, so
every controller sees the same; records are appended by the host-side appender
(playbooks/files/opsctl-ledger-append), the one write path every writer of the ledger uses
(the controller, the guard, the watch). Reading it is `opsctl.host.facts.LedgerRecords`;
what it says about releases is `opsctl.releases.HostState`."""
from __future__ import annotations

import contextlib
import contextvars
import getpass
import json
import os
import shlex
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from opsctl import __version__
from opsctl.config import HostConfig
from opsctl.errors import HostError
from opsctl.host.connection import Connection


def who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


LEDGER_APPEND = Path(__file__).resolve().parent.parent / "playbooks" / "files" / "opsctl-ledger-append"


def _ledger_append_source() -> str:
    return LEDGER_APPEND.read_text()


_ROLLOUT: contextvars.ContextVar[str | None] = contextvars.ContextVar("opsctl_rollout", default=None)


@contextlib.contextmanager
def ledger_rollout(rollout_id: str | None) -> Iterator[None]:
    """Every ledger record written inside names the rollout it belongs to."""
    token = _ROLLOUT.set(rollout_id)
    try:
        yield
    finally:
        _ROLLOUT.reset(token)


def signed(host: HostConfig, record: dict[str, Any]) -> dict:
    """`record` as this controller signs it (host, who, the rollout), without its time: what
    append_ledger writes, and what bin/opsctl-switch stamps with the host's time (issue #50)."""
    rollout = _ROLLOUT.get()
    # every record the controller writes names the opsctl that wrote it (the host's own programs,
    # the guard and the watch, write theirs without it)
    return {"host": host.name, "who": who(), "opsctl_version": __version__,
            **({"rollout": rollout} if rollout else {}), **record}


def append_ledger(conn: Connection, host: HostConfig, record: dict[str, Any]) -> dict:
    """One record, appended by the host-side appender (playbooks/files/opsctl-ledger-append,
    sent inline so it works before the first playbook ran): one write under an flock,
    fsynced, a torn last line moved aside first."""
    rec = {"ts": now_iso(), **signed(host, record)}
    line = json.dumps(rec, sort_keys=False, default=str)
    res = conn.run(f"{host.host_python} -c {shlex.quote(_ledger_append_source())} "
                   f"{shlex.quote(str(host.install_root / 'ledger.jsonl'))}", stdin=line + "\n", check=False)
    if not res.ok:
        raise HostError(f"could not append to the ledger on {host.name}: "
                        f"{(res.stderr.strip().splitlines() or ['exit %d' % res.rc])[-1]}",
                        f"free space under {host.install_root} on the host, then run 'opsctl status'")
    return rec


