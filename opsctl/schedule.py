"""DDTree budget schedules: the node budget by running batch size.

`1:32,8:16,32:8,64:0` reads "batches of 1-7 requests get budget 32, 8-31 get 16,
32-63 get 8, 64 and more get 0" (0: no tree, the drafter is not run, the bonus token
is verified alone). The runtime (runtime/README.md, "Budget schedule") reads the same
bands from a JSON file named by SGLANG_DDTREE_SCHEDULE_FILE and picks the band as
SGLang 0.5.23's adaptive speculation does: the running batch is first padded to the
CUDA-graph batch size it replays at, so each captured batch size lives in exactly one
band and its target-verify graph is captured once, at that band's width.

Pure: parsing and checks only, no I/O. Errors are ConfigError (one line + the fix).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from opsctl.errors import ConfigError
# SGLang's capture list and the padding to it: one copy, shared with the host (opsctl/onhost/capture.py)
from opsctl.onhost.capture import captured_batch_sizes, pad_to_captured
from opsctl.onhost.sglang_rules import route

__all__ = ["SCHEDULE_FILE", "SCHEDULE_ENV", "FUSED_TREE_MAX_BUDGET", "RUNTIME_MAX_BUDGET", "EXAMPLE", "Band",
           "BudgetSchedule", "parse", "captured_batch_sizes", "pad_to_captured", "check_for_server", "check_budget", "budget_limit"]

SCHEDULE_FILE = "ddtree-schedule.json"
SCHEDULE_ENV = "SGLANG_DDTREE_SCHEDULE_FILE"
# The runtime's fused Triton tree kernel handles budgets up to 64 (one program per
# request, on registers); above that it falls back to a torch beam (exact, slower:
# more launches per step). A schedule only gets such a band when the profile opts in.
FUSED_TREE_MAX_BUDGET = 64
RUNTIME_MAX_BUDGET = 1024
_BAND = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
EXAMPLE = "1:32,8:16,32:8,64:0"


@dataclass(frozen=True)
class Band:
    min_bs: int
    budget: int

    @property
    def width(self) -> int:
        """Verify tokens per request: the tree's nodes plus the root (the bonus token)."""
        return self.budget + 1


@dataclass(frozen=True)
class BudgetSchedule:
    bands: tuple[Band, ...]

    @property
    def text(self) -> str:
        return ",".join(f"{b.min_bs}:{b.budget}" for b in self.bands)

    @property
    def max_budget(self) -> int:
        return max(b.budget for b in self.bands)

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(b.width for b in self.bands)

    def band_index(self, batch: int, capture_bs: list[int] | None = None) -> int:
        """The band a running batch of `batch` requests decodes in: padded to the captured
        batch size it replays at (SGLang's AdaptiveSpeculativeParams._route), then the band
        whose lower bound is the largest <= that size."""
        return route([b.min_bs for b in self.bands], batch, capture_bs)

    def band_for(self, batch: int, capture_bs: list[int] | None = None) -> Band:
        return self.bands[self.band_index(batch, capture_bs)]

    def band_range(self, i: int, capture_bs: list[int] | None = None) -> str:
        """The running batch sizes of band i; with the captured sizes, as they really fall
        (a batch of 31 replays at the graph for 32, so `8:16,32:8` gives it budget 8)."""
        lo = self.bands[i].min_bs
        if i + 1 < len(self.bands):
            hi = self.bands[i + 1].min_bs - 1
            if capture_bs:
                below = [b for b in capture_bs if b <= hi]
                hi = max(below) if below and max(below) >= lo else hi
            return f"{lo}" if hi == lo else f"{lo}-{hi}"
        return f"{lo}+"

    def captured_by_band(self, capture_bs: list[int]) -> list[list[int]]:
        """The captured batch sizes of each band (a captured size is its own padding)."""
        out: list[list[int]] = [[] for _ in self.bands]
        for bs in sorted(set(capture_bs)):
            out[self.band_index(bs, capture_bs)].append(bs)
        return out

    def to_json(self) -> str:
        """The file the runtime reads (SGLANG_DDTREE_SCHEDULE_FILE)."""
        doc = {"schedule": self.text,
               "bands": [{"min_bs": b.min_bs, "budget": b.budget} for b in self.bands]}
        return json.dumps(doc, indent=2) + "\n"

    def describe(self, capture_bs: list[int] | None = None) -> list[str]:
        rows = []
        by_band = self.captured_by_band(capture_bs) if capture_bs else None
        for i, b in enumerate(self.bands):
            what = "no tree, drafter off" if b.budget == 0 else f"budget {b.budget}"
            row = f"batch {self.band_range(i, capture_bs)}: {what} (verify width {b.width})"
            if by_band is not None:
                row += f", graphs for bs {_short_list(by_band[i])}" if by_band[i] else ", no graph"
            rows.append(row)
        return rows


def _short_list(xs: list[int]) -> str:
    return "[" + ", ".join(map(str, xs)) + "]" if len(xs) <= 6 else f"[{xs[0]}, {xs[1]}, ..., {xs[-1]}] ({len(xs)})"


def parse(text: str, *, what: str = "--budget-schedule", allow_torch_beam: bool = True) -> BudgetSchedule:
    """`MIN_BS:BUDGET[,MIN_BS:BUDGET...]`, first band at 1, bounds strictly increasing; each band's
    budget (0 aside) within check_budget's limit: the runtime's 1024, or the fused tree kernel's
    64 for a profile without the torch beam (`allow_torch_beam=False`)."""
    fix = f"write bands as MIN_BATCH:BUDGET in increasing batch order, from 1, e.g. {what} {EXAMPLE}"
    if not text or not text.strip():
        raise ConfigError(f"{what} is empty", fix)
    bands: list[Band] = []
    for part in text.split(","):
        m = _BAND.match(part)
        if not m:
            raise ConfigError(f"{what} {text!r}: band {part.strip()!r} is not MIN_BATCH:BUDGET", fix)
        lo, budget = int(m.group(1)), int(m.group(2))
        if lo < 1:
            raise ConfigError(f"{what} {text!r}: batch size {lo} is below 1", fix)
        if budget > 0:  # 0 is a band with no tree; any other budget has every limit --budget N has
            check_budget(budget, allow_torch_beam=allow_torch_beam, what=f"{what} {text}")
        if bands and lo == bands[-1].min_bs:
            raise ConfigError(f"{what} {text!r}: two bands start at batch {lo} (bands overlap)", fix)
        if bands and lo < bands[-1].min_bs:
            raise ConfigError(f"{what} {text!r}: band {lo}:{budget} comes after {bands[-1].min_bs}:"
                              f"{bands[-1].budget} (bands must be sorted by batch size)", fix)
        bands.append(Band(lo, budget))
    if bands[0].min_bs != 1:
        raise ConfigError(f"{what} {text!r}: the first band starts at batch {bands[0].min_bs}, "
                          "so a batch of 1 has no budget", f"start with 1:BUDGET, e.g. {what} 1:32,{text}")
    if all(b.budget == 0 for b in bands):
        raise ConfigError(f"{what} {text!r}: every band has budget 0 (no speculation at all)",
                          "deploy the autoregressive baseline (ar-tp8) instead, or give a band a budget")
    return BudgetSchedule(tuple(bands))


def check_for_server(schedule: BudgetSchedule, *, capture_bs: list[int],
                     allow_torch_beam: bool, what: str = "--budget-schedule") -> None:
    """Refuse a schedule the server would reject or serve badly, before anything is staged."""
    by_band = schedule.captured_by_band(capture_bs)
    for i, (band, sizes) in enumerate(zip(schedule.bands, by_band)):
        if not sizes and (i + 1 < len(schedule.bands) or band.min_bs <= max(capture_bs)):
            nxt = pad_to_captured(band.min_bs, capture_bs)
            raise ConfigError(
                f"{what} {schedule.text}: band {band.min_bs}:{band.budget} (batch {schedule.band_range(i)}) "
                f"holds no captured batch size (a batch of {band.min_bs} replays at the graph for {nxt})",
                f"start bands at captured sizes ({_short_list(capture_bs)}), or drop the band")
        if band.budget:  # 0: the band drafts nothing
            check_budget(band.budget, allow_torch_beam=allow_torch_beam, what=f"{what} {schedule.text}")


def budget_limit(allow_torch_beam: bool) -> tuple[int, str]:
    """The largest DDTree budget a profile can serve and what sets it: the fused tree kernel's 64,
    or the runtime's 1024 for a profile that accepts the torch beam (tree_torch_fallback)."""
    if allow_torch_beam:
        return RUNTIME_MAX_BUDGET, f"the runtime's {RUNTIME_MAX_BUDGET}"
    return FUSED_TREE_MAX_BUDGET, f"the fused tree kernel's {FUSED_TREE_MAX_BUDGET}"


def check_budget(budget: int, *, allow_torch_beam: bool, what: str) -> None:
    """The limits every DDTree budget has, a schedule's band or `--budget N` (the one-band
    schedule 1:N) alike: one check and one limit, so 100 and 100000 are refused with the same
    line (issue #49): the limit that applies to this profile, never two different ones."""
    limit, by = budget_limit(allow_torch_beam)
    fix = (f"use budgets 1..{limit}" + ("" if allow_torch_beam else ", or set tree_torch_fallback: true in the "
           f"profile (opsctl.profiles.ddtree) to accept the slower torch beam (up to {RUNTIME_MAX_BUDGET})"))
    if budget < 1:
        raise ConfigError(f"{what}: budget {budget} is below 1 (a DDTree budget counts tree nodes, the root "
                          "excluded)", fix)
    if budget > limit:
        raise ConfigError(f"{what}: budget {budget} is above {by}", fix)


# --------------------------------------------------------------------------- trial sets (issue #37)

# The runtime's trial set (runtime/README.md, "Trial set and live switch"): candidate budgets and
# schedules captured at one start, the one that serves switched live by the control file.
TRIAL_SET_ENV = "SGLANG_DDTREE_TRIAL_SET_FILE"
CONTROL_ENV = "SGLANG_DDTREE_CONTROL_FILE"
CONTROL_EVERY_STEPS_ENV = "SGLANG_DDTREE_CONTROL_EVERY_STEPS"
CONTROL_INTERVAL_MS_ENV = "SGLANG_DDTREE_CONTROL_INTERVAL_MS"
_BUDGET_ONLY = re.compile(r"^\s*(\d+)\s*$")


def parse_candidate(value: str | int, *, what: str = "trial candidate") -> BudgetSchedule:
    """A trial-set candidate: a budget (`16` or `"16"`: the one-band schedule 1:16) or a schedule
    (`"1:16,3:4,16:0"`), as the runtime reads it; a lone budget 0 is not a candidate."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{what} {value!r}: expected a budget or a schedule",
                          f"write a budget (16) or a schedule ({EXAMPLE})")
    m = _BUDGET_ONLY.match(str(value))
    if m:
        budget = int(m.group(1))
        if not 1 <= budget <= RUNTIME_MAX_BUDGET:
            raise ConfigError(f"{what} {value!r}: a budget must be in 1..{RUNTIME_MAX_BUDGET}",
                              "budget 0 alone drafts nothing: use it as a band of a schedule (e.g. 1:16,16:0)")
        return BudgetSchedule((Band(1, budget),))
    return parse(str(value), what=what)


def candidate_name(value: "str | int | BudgetSchedule") -> str:
    """The canonical name the runtime prints (`DDTree trial set:`, `DDTree active:`): a one-band
    schedule 1:B is the budget `B`, any other schedule its text (`1:16,3:4,16:0`)."""
    sched = value if isinstance(value, BudgetSchedule) else parse_candidate(value)
    if len(sched.bands) == 1:
        return str(sched.bands[0].budget)
    return sched.text


@dataclass(frozen=True)
class TrialUnit:
    """One capture of a trial set: a verify width (target) or a draft budget (drafter), the
    captured batch sizes some candidate routes to it, and those candidates."""

    key: int                 # the verify width (target) or the budget (drafter)
    bs: tuple[int, ...]
    users: tuple[str, ...]

    @property
    def budget(self) -> int:
        return self.key


@dataclass(frozen=True)
class TrialPlan:
    """What a trial set captures (the runtime's `TrialSet.verify_plan` / `draft_plan`)."""

    candidates: tuple[str, ...]
    widths: tuple[TrialUnit, ...]    # widest first
    drafts: tuple[TrialUnit, ...]    # largest budget first; only budgets some captured bs is routed to

    def width_bs(self, width: int) -> tuple[int, ...] | None:
        return next((u.bs for u in self.widths if u.key == width), None)

    def draft_bs(self, budget: int) -> tuple[int, ...] | None:
        return next((u.bs for u in self.drafts if u.key == budget), None)


def trial_widths(candidates) -> list[int]:
    """The distinct verify widths any candidate needs, widest first (the trial-set line's)."""
    return sorted({b.width for c in candidates for b in parse_candidate(c).bands}, reverse=True)


def trial_draft_budgets(candidates) -> list[int]:
    """The distinct budgets > 0 (one draft head each), largest first."""
    return sorted({b.budget for c in candidates for b in parse_candidate(c).bands if b.budget > 0}, reverse=True)


def trial_band_bs(sizes: list[int], capture_bs: list[int], trial_bs) -> list[int]:
    """A band's graphs for a candidate other than the active one when the trial set has `trial_bs`
    (the runtime's `TrialSet.band_bs`): the size each trial batch pads to, when it is this band's,
    and the band's largest."""
    if not sizes or not trial_bs:
        return list(sizes)
    keep = {sizes[-1]}
    for t in trial_bs:
        padded = pad_to_captured(int(t), capture_bs)   # past the largest graph: itself, in no band's sizes
        if padded in sizes:
            keep.add(padded)
    return sorted(keep)


def trial_plan(candidates, capture_bs: list[int], *, active: str | None = None, trial_bs=None) -> TrialPlan:
    """Per verify width the captured bs that some candidate routes to a band of that width, per
    draft budget those routed to a band of that budget (each candidate routes a running batch as
    its schedule does: padded to the captured bs, then the band). With `trial_bs`, a candidate other
    than `active` (default the first) routes only what those batch sizes reach (trial_band_bs)."""
    scheds = [parse_candidate(c) for c in candidates]
    names = tuple(candidate_name(s) for s in scheds)
    cs = sorted(set(int(b) for b in capture_bs))
    active_name = candidate_name(active) if active is not None else (names[0] if names else None)

    def routed(keep) -> tuple[tuple[int, ...], tuple[str, ...]]:
        bs: set[int] = set()
        users = []
        for name, s in zip(names, scheds):
            hit = False
            for i, sizes in enumerate(s.captured_by_band(cs)):
                if keep(s.bands[i]):
                    hit = True
                    bs.update(sizes if not trial_bs or name == active_name else trial_band_bs(sizes, cs, trial_bs))
            if hit:
                users.append(name)
        return tuple(sorted(bs)), tuple(users)

    widths = tuple(TrialUnit(w, *routed(lambda band, w=w: band.width == w)) for w in trial_widths(candidates))
    drafts = tuple(u for u in (TrialUnit(b, *routed(lambda band, b=b: band.budget == b))
                               for b in trial_draft_budgets(candidates)) if u.bs)
    return TrialPlan(names, widths, drafts)


def schedule_from_best(best: dict[int, int], capture_bs: list[int] | None = None) -> str:
    """Bands of running batch size and their budget, `1:16,3:4,16:0` (the runtime's budget
    schedule) from the best budget per level. A load of C concurrent requests decodes in running
    batches a little under C (requests finish and are admitted between steps), so a level's band
    starts at the geometric middle between it and the level below, not at C itself; the first
    starts at 1. A start is moved up to a captured CUDA-graph batch size when those are given
    (a band must hold one). Neighbouring bands with the same budget merge."""
    import math

    bands: list[tuple[int, int]] = []
    levels = sorted(best)
    for i, c in enumerate(levels):
        if bands and bands[-1][1] == best[c]:
            continue
        start = 1 if i == 0 else math.ceil(math.sqrt(levels[i - 1] * c) - 1e-9)
        if capture_bs and i > 0:
            start = pad_to_captured(start, capture_bs)
        if bands and start <= bands[-1][0]:
            continue  # two levels too close to split: the lower level's band keeps them
        bands.append((start, best[c]))
    return ",".join(f"{s}:{b}" for s, b in bands)
