"""Who holds the lab. The lab is one per machine: a pytest session holds
SESSION_LOCK for as long as it uses the lab (tests/conftest.py), and `opsctl lab up`
records its caller's login session in HOLDER_FILE. `opsctl lab down` by anyone else
is refused, naming the holder; `--force` overrides a holder record only (never a
test session that holds the lock)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from typing import Iterator

from opsctl.errors import LabError
from opsctl.lab import constants as C


def _who() -> str:
    from opsctl.ledger import who

    return who()


def read_holder() -> dict | None:
    try:
        data = json.loads(C.HOLDER_FILE.read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def describe(holder: dict | None) -> str:
    if not holder:
        return "another process"
    return f"{holder.get('who')} ({holder.get('via')}, pid {holder.get('pid')}, since {holder.get('since')})"


def write_holder(via: str) -> dict:
    """Record the caller as the lab's holder: its login session (shell) owns the lab."""
    rec = {"who": _who(), "via": via, "pid": os.getpid(), "sid": os.getsid(0),
           "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    C.STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = C.HOLDER_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec) + "\n")
    tmp.replace(C.HOLDER_FILE)
    return rec


def clear_holder() -> None:
    with contextlib.suppress(FileNotFoundError):
        C.HOLDER_FILE.unlink()


def _alive(pid: object) -> bool:
    try:
        os.kill(int(pid), 0)  # type: ignore[arg-type]
        return True
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True


def held_by_other(holder: dict | None) -> bool:
    """A holder other than the caller's login session, whose session still exists."""
    if not holder:
        return False
    if holder.get("sid") == os.getsid(0):
        return False
    return _alive(holder.get("sid")) or _alive(holder.get("pid"))


@contextlib.contextmanager
def session_lock(what: str) -> Iterator[None]:
    """The lab's session lock, taken without waiting: a test session holding it means the
    lab is in use, and this command refuses (exit 7) naming the holder."""
    C.SESSION_LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(C.SESSION_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LabError(f"cannot {what}: the lab is in use by {describe(read_holder())}",
                           "wait for that session to end ('opsctl lab status' shows the holder)") from None
        yield
    finally:
        os.close(fd)


def check_may_take_down(force: bool) -> None:
    holder = read_holder()
    if held_by_other(holder) and not force:
        raise LabError(f"the lab is held by {describe(holder)}, not by this session",
                       "ask them, or take it down anyway with 'opsctl lab down --force'")
