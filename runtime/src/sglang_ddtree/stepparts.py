"""The decode step's parts, sampled: one log line every N decode steps (issue #48).

Every ``SGLANG_DDTREE_STEP_PARTS_EVERY`` decode steps (default 200; 0 turns it
off) TP rank 0 logs, per (batch size, budget) seen among the window's sampled
steps, one line (the controller parses it byte for byte)::

    DDTree step parts: bs=8 budget=16 sampled=10 of=200 drafter_ms=0.334 tree_ms=0.041 prep_ms=1.162 target_ms=18.520 commit_ms=0.111 step_ms=21.004

Values are medians (ms, 3 decimals) over the window's sampled steps of that
(bs, budget); ``of`` = the window's decode steps.  One step in every
``SGLANG_DDTREE_STEP_PARTS_SAMPLE`` (default 10) is timed: clock marks (CUDA
events on the GPU) are taken at the part boundaries in ``_ddtree_decode``,
outside every captured region; nothing ever synchronizes the device.  A
sampled step's marks are read once the clock says they are complete
(``event.query()``), at the next sampled step or at the window's end; marks
still incomplete at the window's end are dropped (counted in ``dropped``).

Parts (pairs of marks; a part missing from a step counts 0, as the drafter parts
of a budget-0 step):
  drafter  ``draft0 .. draft1``            the drafter's block forward
  tree     ``draft1 .. tree1``             draft head + tree build
  prep     ``win0 .. win1`` + ``prep0 .. prep1``  the step's KV window, tree verify
                                           input + mask, ``eagle_prepare_for_verify``
  target   ``prep1 .. target1``            the target's verify forward
  commit   ``commit0 .. commit1`` + ``commit2 .. commit3``  eagle_sample, finalize,
                                           committed outputs; drafter hidden append,
                                           next draft input
  step     ``start .. end``                the whole ``_ddtree_decode``

The clock is pluggable (``PerfClock`` for the CPU, ``CudaClock`` for the GPU, a
fake one in the tests).  This module imports nothing of the package.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

PARTS = ("drafter", "tree", "prep", "target", "commit", "step")
# part -> the (from, to) mark pairs summed into it
SPANS = {
    "drafter": (("draft0", "draft1"),),
    "tree": (("draft1", "tree1"),),
    "prep": (("win0", "win1"), ("prep0", "prep1")),
    "target": (("prep1", "target1"),),
    "commit": (("commit0", "commit1"), ("commit2", "commit3")),
    "step": (("start", "end"),),
}
PREFIX = "DDTree step parts:"
MAX_PENDING = 64  # sampled steps whose marks are not complete yet (bounded: the oldest are dropped)


def format_line(bs: int, budget: int, sampled: int, of: int, ms: dict) -> str:
    """The line, exactly (keys fixed, ms with 3 decimals)."""
    return (f"{PREFIX} bs={int(bs)} budget={int(budget)} sampled={int(sampled)} of={int(of)} "
            + " ".join(f"{p}_ms={float(ms.get(p, 0.0)):.3f}" for p in PARTS))


def median(values):
    v = sorted(values)
    n = len(v)
    if n == 0:
        return 0.0
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


class PerfClock:
    """Host clock: marks are ``perf_counter`` readings, always complete."""

    def mark(self):
        return time.perf_counter()

    def ready(self, m) -> bool:
        return True

    def elapsed_ms(self, a, b) -> float:
        return (b - a) * 1e3


class CudaClock:
    """CUDA events on the current stream: ``mark`` records one (no sync),
    ``ready`` asks ``query()``, ``elapsed_ms`` is ``elapsed_time`` (only called
    once both are complete).  Events are reused once read (``release``): a
    sampled step records without creating events."""

    def __init__(self):
        import torch

        self._torch = torch
        self._free = []

    def mark(self):
        e = self._free.pop() if self._free else self._torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def release(self, m) -> None:
        self._free.append(m)

    def ready(self, m) -> bool:
        return bool(m.query())

    def elapsed_ms(self, a, b) -> float:
        return float(a.elapsed_time(b))

    def capturing(self) -> bool:
        return bool(self._torch.cuda.is_current_stream_capturing())


class _NoStep:
    """An unsampled step: marks cost one method call."""

    __slots__ = ()

    def mark(self, name: str) -> None:
        pass

    def done(self, bs: int, budget: int) -> None:
        pass


NO_STEP = _NoStep()


class _Step:
    __slots__ = ("clock", "marks", "key")

    def __init__(self, clock):
        self.clock = clock
        self.marks = {}
        self.key = None

    def mark(self, name: str) -> None:
        self.marks[name] = self.clock.mark()

    def done(self, bs: int, budget: int) -> None:
        self.key = (int(bs), int(budget))


class StepParts:
    """The sampler.  Per decode step: ``s = parts.begin()``; ``s.mark(name)`` at
    the boundaries; ``s.done(bs, budget)``; ``parts.end()`` (counts the step,
    logs at the window's end)."""

    def __init__(self, *, every: int = 200, sample: int = 10, clock=None, log: Optional[Callable[[str], None]] = None,
                 enabled: bool = True):
        self.every = max(0, int(every))
        self.sample = max(1, int(sample))
        self.enabled = bool(enabled) and self.every > 0
        self.clock = clock if clock is not None else PerfClock()
        self.log = log
        self.steps = 0  # decode steps in the current window
        self.total_steps = 0
        self.pending = []  # sampled steps not read yet
        self.done_rows = {}  # (bs, budget) -> [ {part: ms} ]
        self.dropped = 0
        self.lines = []  # every line logged (tests / the harness)
        self._cur = NO_STEP

    @classmethod
    def from_env(cls, *, clock=None, log=None, enabled=True, env=None):
        env = os.environ if env is None else env
        return cls(every=int(env.get("SGLANG_DDTREE_STEP_PARTS_EVERY", "200") or 0),
                   sample=int(env.get("SGLANG_DDTREE_STEP_PARTS_SAMPLE", "10") or 10),
                   clock=clock, log=log, enabled=enabled)

    # -- per step ---------------------------------------------------------
    def begin(self):
        """This step's recorder: a sampled one every ``sample`` steps (the first
        step of a window is sampled), else a no-op."""
        if not self.enabled or self.steps % self.sample:
            self._cur = NO_STEP
            return NO_STEP
        cap = getattr(self.clock, "capturing", None)
        if cap is not None and cap():  # never record into a graph being captured
            self._cur = NO_STEP
            return NO_STEP
        self._harvest()
        self._cur = _Step(self.clock)
        self._cur.mark("start")
        return self._cur

    def end(self) -> None:
        if not self.enabled:
            return
        cur, self._cur = self._cur, NO_STEP
        if cur is not NO_STEP:
            cur.mark("end")
            if cur.key is not None:
                self.pending.append(cur)
                if len(self.pending) > MAX_PENDING:
                    self.pending.pop(0)
                    self.dropped += 1
        self.steps += 1
        self.total_steps += 1
        if self.steps >= self.every:
            self.flush()

    # -- reading marks, the line -----------------------------------------
    def _parts(self, st: _Step) -> dict:
        c, m = self.clock, st.marks
        out = {}
        for part, spans in SPANS.items():
            out[part] = sum(c.elapsed_ms(m[a], m[b]) for a, b in spans if a in m and b in m)
        return out

    def _harvest(self) -> None:
        keep = []
        release = getattr(self.clock, "release", None)
        for st in self.pending:
            if all(self.clock.ready(x) for x in st.marks.values()):
                self.done_rows.setdefault(st.key, []).append(self._parts(st))
                if release is not None:  # read: the marks can be recorded again
                    for x in st.marks.values():
                        release(x)
            else:
                keep.append(st)
        self.pending = keep

    def window_lines(self):
        """The window's lines (read what is complete; drop the rest)."""
        self._harvest()
        self.dropped += len(self.pending)
        self.pending = []
        lines = []
        for (bs, budget), rows in sorted(self.done_rows.items()):
            lines.append(format_line(bs, budget, len(rows), self.steps,
                                     {p: median([r[p] for r in rows]) for p in PARTS}))
        return lines

    def flush(self) -> None:
        lines = self.window_lines()
        self.done_rows = {}
        self.steps = 0
        for ln in lines:
            self.lines.append(ln)
            if self.log is not None:
                self.log(ln)


def parse_line(line: str) -> Optional[dict]:
    """The fields of a step-parts line (anywhere in ``line``, e.g. after SGLang's
    log prefix), or None."""
    i = line.find(PREFIX)
    if i < 0:
        return None
    out = {}
    for tok in line[i + len(PREFIX):].split():
        k, _, v = tok.partition("=")
        out[k] = float(v) if k.endswith("_ms") else int(v)
    return out
