"""What every step shares: progress events (the CLI prints them), a gate's outcome, and
the inventory argument every flow entry point takes (a path or a loaded Inventory)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from opsctl.config import Inventory, load_inventory
from opsctl.playbook import PlayStep

Progress = Callable[[dict], None]


def noop(_: dict) -> None:
    pass


class Steps:
    """Emits one progress event per step with elapsed time (the CLI prints them)."""

    def __init__(self, progress: Progress | None, host: str):
        self.progress = progress or noop
        self.host = host
        self.current = "plan"  # the step in progress, for an interrupt's report

    def start(self, step: str, detail: str = "") -> float:
        self.current = step
        self.progress({"event": "step", "host": self.host, "step": step, "status": "start", "detail": detail})
        return time.monotonic()

    def done(self, step: str, t0: float, detail: str = "", status: str = "ok", **extra: Any) -> None:
        self.progress({"event": "step", "host": self.host, "step": step, "status": status,
                       "elapsed_s": round(time.monotonic() - t0, 2), "detail": detail, **extra})

    def task(self, step: PlayStep) -> None:
        self.progress({"event": "task", "host": self.host, **step.as_dict()})

    def note(self, message: str) -> None:
        self.progress({"event": "note", "host": self.host, "message": message})


@dataclass
class GateOutcome:
    ok: bool
    reason: str
    record: dict = field(default_factory=dict)



def as_inventory(inventory: "str | Path | Inventory") -> Inventory:
    return inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
