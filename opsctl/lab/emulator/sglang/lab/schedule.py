"""The DDTree plugin's budget schedule, as the lab emulator models it.

The runtime (runtime/README.md, "Budget schedule") reads bands of running batch size and
their node budget from the JSON file named by SGLANG_DDTREE_SCHEDULE_FILE; a step's band
comes from the CUDA-graph batch size the running batch pads to (SGLang 0.5.23's
AdaptiveSpeculativeParams._route), so every captured batch size has one verify width.
The emulator runs on the lab host without opsctl: the routing is sglang_rules.route, the
generated copy of opsctl's one definition (opsctl/onhost/sglang_rules.py).
"""
from __future__ import annotations

import json
import os

from sglang.lab import sglang_rules

ENV = "SGLANG_DDTREE_SCHEDULE_FILE"


class Schedule:
    def __init__(self, bands: list[tuple[int, int]], capture_bs: list[int]):
        self.bands = bands
        self.capture_bs = sorted(capture_bs)
        self._lows = [lo for lo, _ in bands]

    @property
    def text(self) -> str:
        return ",".join(f"{lo}:{b}" for lo, b in self.bands)

    @property
    def widths(self) -> list[int]:
        return [b + 1 for _, b in self.bands]

    def index(self, batch: int) -> int:
        return sglang_rules.route(self._lows, batch, self.capture_bs)

    def budget(self, batch: int) -> int:
        return self.bands[self.index(batch)][1]

    def captured_by_band(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.bands]
        for bs in self.capture_bs:
            out[self.index(bs)].append(bs)
        return out


def load(num_draft_tokens: int, capture_bs: list[int]) -> Schedule | None:
    """The schedule the plugin would load, or None (one band: budget = num_draft_tokens - 1).
    Raises ValueError with the plugin's message on a file the plugin rejects."""
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        bands = [(int(b["min_bs"]), int(b["budget"])) for b in doc["bands"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"DDTREE budget schedule {path}: unreadable ({exc})") from None
    if not bands or bands[0][0] != 1 or any(b[0] <= a[0] for a, b in zip(bands, bands[1:])):
        raise ValueError(f"DDTREE budget schedule {path}: bands must start at batch size 1 and increase")
    if any(b < 0 for _, b in bands) or max(b for _, b in bands) < 1:
        raise ValueError(f"DDTREE budget schedule {path}: budgets must be >= 0 with at least one > 0")
    top = max(b for _, b in bands)
    if top + 1 != num_draft_tokens:
        raise ValueError(f"DDTREE budget schedule {path}: the widest band needs --speculative-num-draft-tokens "
                         f"{top + 1} (budget {top} + 1), got {num_draft_tokens}")
    sched = Schedule(bands, capture_bs)
    if capture_bs:
        for (lo, b), sizes in zip(bands, sched.captured_by_band()):
            if not sizes and lo <= max(capture_bs):
                raise ValueError(f"DDTREE budget schedule {path}: band {lo}:{b} holds no captured batch size")
    return sched
