"""The operator's brake: SIGINT and SIGTERM during a deploy, rollback or tune are
handled here, by opsctl, and never forwarded to the host.

While a brake is engaged (`with BRAKE.engaged(): ...`), a signal raises
`Interrupted` in the main thread at once, except inside

- `BRAKE.held(...)`: a short step that must not be cut in two (the switch itself,
  a ledger append, arming the guard). The signal is remembered and raised as soon
  as the step is done;
- `BRAKE.shielded(...)`: the rollback that answers an interrupt or a failure. Further
  signals are counted and announced ("still rolling back ...") but never abandon it.

Remote commands are run on SSH channels the controller owns (opsctl/host/connection.py), so
an exception here closes the channel and nothing sends ^C to the remote side.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable, Iterator

from opsctl.errors import OpsctlError


class Interrupted(OpsctlError):
    """The operator interrupted (SIGINT/SIGTERM). Exit 130, as shells report ^C."""

    exit_code = 130

    def __init__(self, problem: str, fix: str | None = None, *, signal_name: str = "SIGINT",
                 details: dict | None = None):
        super().__init__(problem, fix, details=details)
        self.signal_name = signal_name


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Brake:
    def __init__(self) -> None:
        self.count = 0
        self.signal_name: str | None = None
        self._holds = 0
        self._shield: str | None = None
        self._depth = 0
        self._previous: dict[int, object] = {}
        self.on_note: Callable[[str], None] | None = None

    # -- state
    @property
    def requested(self) -> bool:
        return self.count > 0

    def reset(self) -> None:
        self.count, self.signal_name = 0, None

    def check(self) -> None:
        """Raise Interrupted if a signal arrived and nothing holds or shields it."""
        if self.requested and self._holds == 0 and self._shield is None:
            raise self._interrupted()

    def _interrupted(self) -> Interrupted:
        return Interrupted(f"interrupted ({self.signal_name or 'signal'})", signal_name=self.signal_name or "SIGINT")

    # -- signal handling
    def _handler(self, signum: int, _frame) -> None:
        self.count += 1
        self.signal_name = signal.Signals(signum).name
        if self._shield is not None:
            self._note(f"{self.signal_name} received: {self._shield}; it finishes first "
                       f"(the host's guard timer covers a kill -9)")
            return
        if self._holds:
            self._note(f"{self.signal_name} received: stopping once this step is done")
            return
        raise self._interrupted()

    def _note(self, message: str) -> None:
        if self.on_note is not None:
            try:
                self.on_note(message)
            except Exception:  # noqa: BLE001 - a broken printer must not break the brake
                pass

    @contextlib.contextmanager
    def engaged(self, on_note: Callable[[str], None] | None = None) -> Iterator["Brake"]:
        """Install the handlers (main thread only; nested use is fine)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        if self._depth == 0:
            self.reset()
            self._previous = {s: signal.signal(s, self._handler) for s in _SIGNALS}
        self._depth += 1
        saved_note = self.on_note
        if on_note is not None:
            self.on_note = on_note
        try:
            yield self
        finally:
            self.on_note = saved_note
            self._depth -= 1
            if self._depth == 0:
                for s, h in self._previous.items():
                    signal.signal(s, h)  # type: ignore[arg-type]
                self._previous = {}

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A step that must finish once started; a signal during it is raised after it."""
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1
        self.check()

    @contextlib.contextmanager
    def shielded(self, what: str) -> Iterator[None]:
        """The rollback: signals are announced and counted, never raised."""
        saved = self._shield
        self._shield = what
        try:
            yield
        finally:
            self._shield = saved


BRAKE = Brake()


def die_with_parent() -> None:
    """preexec_fn for the controller's children (rsync, ssh, ansible): they get SIGTERM
    when opsctl dies, also on kill -9, instead of running on without the lock."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl
            os._exit(1)
    except OSError:
        pass
