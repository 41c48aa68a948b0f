"""DDTree trial set (issue #37): candidate budgets and schedules captured together
at start, the one that serves switched live by a control file (no restart).

Trial-set file, named by ``SGLANG_DDTREE_TRIAL_SET_FILE``::

    {"candidates": ["4", "8", "16", "1:16,3:4,16:0"], "active": "16"}

A candidate is a budget (``"16"``, or the integer 16: one band from batch size 1,
i.e. the schedule ``1:16``) or a budget schedule in the grammar of
:mod:`sglang_ddtree.schedule` (``"1:16,3:4,16:0"``).  Names are canonical: a
one-band schedule is written as its budget (``"1:16"`` is ``"16"``); two
candidates with the same canonical name are an error.  ``active`` (optional,
default the first candidate) is the one served from the start.  Unknown keys are
an error.  The widest width any candidate needs (budget_max + 1) must equal
``--speculative-num-draft-tokens`` (KV over-allocation, 2 x that per step, and
every buffer are sized for it), and the variable excludes
``SGLANG_DDTREE_SCHEDULE_FILE`` (a schedule is a candidate here).

What is captured (``verify_plan`` / ``draft_plan``): for every distinct verify
width w any candidate's band has, ONE target-verify CUDA-graph runner over the
union of the captured batch sizes that some candidate routes to a band of width
w (each captured bs once per width); for every distinct budget b > 0, ONE draft
head (static buffers for the largest bs routed to b) and one draft graph runner
(drafter + head folded in) over the bs routed to b.

Optional ``"trial_bs": [1, 8, 32]`` (the batch sizes a tune's levels reach): a candidate other
than ``active`` then captures, per band, only the captured batch sizes those reach (each trial bs
rounded up to the band's next captured size) and the band's largest (so every batch of the band
still has a graph to pad to); ``active`` captures every captured size.  A width or budget shared
with ``active`` keeps the active candidate's sizes.  Without it every candidate captures all.

Control file, named by ``SGLANG_DDTREE_CONTROL_FILE``::

    {"active": "1:16,3:4,16:0"}

(write it atomically: a temporary file, then rename).  :class:`ActiveCandidate`
checks it at step boundaries: every ``SGLANG_DDTREE_CONTROL_EVERY_STEPS`` decode
steps (default 16) all TP ranks meet; TP0 stats the file (at most once per
``SGLANG_DDTREE_CONTROL_INTERVAL_MS``, default 100; only a changed
(inode, mtime, size) is read and parsed) and proposes a candidate; the proposal
is broadcast over the TP group's CPU group, so every rank switches at the same
step.  A present control file overrides ``active`` from the first check on.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable, List, Mapping, Optional, Sequence, Tuple

from .config import MAX_BUDGET
from .schedule import ENV_SCHEDULE_FILE, Band, BudgetSchedule, format_schedule, parse_schedule

ENV_TRIAL_SET_FILE = "SGLANG_DDTREE_TRIAL_SET_FILE"
ENV_CONTROL_FILE = "SGLANG_DDTREE_CONTROL_FILE"
ENV_CONTROL_EVERY_STEPS = "SGLANG_DDTREE_CONTROL_EVERY_STEPS"
ENV_CONTROL_INTERVAL_MS = "SGLANG_DDTREE_CONTROL_INTERVAL_MS"
DEFAULT_CONTROL_EVERY_STEPS = 16
DEFAULT_CONTROL_INTERVAL_MS = 100.0

# the value broadcast at a meeting when nothing changes
NO_CHANGE = -1

_BUDGET_RE = re.compile(r"^\d+$")


# ---------------------------------------------------------------------------
# candidates and the trial set
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One candidate: its canonical name and bands (a budget is one band from bs 1)."""

    name: str
    bands: Tuple[Band, ...]

    @property
    def is_budget(self) -> bool:
        return len(self.bands) == 1

    def describe(self) -> str:
        """``budget 16`` / ``schedule 1:16,3:4,16:0`` (the refusal line's wording)."""
        return f"budget {self.name}" if self.is_budget else f"schedule {self.name}"

    def schedule(self) -> BudgetSchedule:
        """A fresh routing object for this candidate (its own captured-bs list)."""
        return BudgetSchedule(self.bands, source=f"trial candidate {self.name}")


def parse_candidate(value) -> Candidate:
    """``16`` / ``"16"`` / ``"1:16"`` -> budget 16; ``"1:16,3:4,16:0"`` -> that schedule.
    ValueError on anything else (the schedule grammar's errors included)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"DDTREE trial candidate {value!r}: expected a budget or a schedule string")
    text = str(value).strip()
    if _BUDGET_RE.match(text):
        budget = int(text)
        if not 1 <= budget <= MAX_BUDGET:
            raise ValueError(f"DDTREE trial candidate {value!r}: a budget must be in 1..{MAX_BUDGET} "
                             f"(budget 0 alone drafts nothing; use it as a band of a schedule)")
        bands = [Band(1, budget)]
    else:
        bands = parse_schedule(text)
    name = str(bands[0].budget) if len(bands) == 1 else format_schedule(bands)
    return Candidate(name, tuple(bands))


def join_names(names: Iterable[str]) -> str:
    # ", " separates candidates: a schedule's own commas are never followed by a space
    return ", ".join(names)


class TrialSet:
    """The candidates, which one is configured active at start, and what they
    need captured (verify widths x batch sizes, draft budgets x batch sizes)."""

    def __init__(self, candidates: Sequence[Candidate], active: int = 0, source: Optional[str] = None,
                 trial_bs: Optional[Iterable[int]] = None):
        candidates = list(candidates)
        if not candidates:
            raise ValueError(f"DDTREE trial set {source}: no candidates")
        names = [c.name for c in candidates]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"DDTREE trial set {source}: candidate(s) {join_names(dup)} listed twice "
                             f"(after normalisation: a one-band schedule 1:B is budget B)")
        if not 0 <= int(active) < len(candidates):
            raise ValueError(f"DDTREE trial set {source}: active index {active} out of range")
        self.candidates: List[Candidate] = candidates
        self.active = int(active)
        self.source = source
        # one routing object per candidate (each gets the captured bs list)
        self.schedules: List[BudgetSchedule] = [c.schedule() for c in candidates]
        self._cuda_graph_bs: Optional[List[int]] = None
        # the batch sizes a candidate other than `active` captures for (None: every captured size)
        self.trial_bs: Optional[List[int]] = sorted(set(int(b) for b in trial_bs)) if trial_bs else None
        if self.trial_bs is not None and self.trial_bs[0] < 1:
            raise ValueError(f"DDTREE trial set {source}: trial_bs must be batch sizes >= 1, got {self.trial_bs}")

    # -- construction --------------------------------------------------
    @classmethod
    def from_json(cls, obj, path: str = "<json>") -> "TrialSet":
        if not isinstance(obj, Mapping):
            raise ValueError(f"DDTREE trial set file {path}: expected a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - {"candidates", "active", "trial_bs"})
        if unknown:
            raise ValueError(f"DDTREE trial set file {path}: unknown key(s) {', '.join(unknown)} "
                             f"(expected 'candidates' and optionally 'active' and 'trial_bs')")
        trial_bs = obj.get("trial_bs")
        if trial_bs is not None and (not isinstance(trial_bs, list) or not trial_bs
                                     or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                                                for b in trial_bs)):
            raise ValueError(f"DDTREE trial set file {path}: 'trial_bs' must be a non-empty list of batch "
                             f"sizes >= 1 (the tune's levels), got {trial_bs!r}")
        raw = obj.get("candidates")
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"DDTREE trial set file {path}: 'candidates' must be a non-empty list")
        cands = []
        for i, v in enumerate(raw):
            try:
                cands.append(parse_candidate(v))
            except ValueError as e:
                raise ValueError(f"DDTREE trial set file {path}: candidates[{i}]: {e}") from e
        active = 0
        if "active" in obj:
            try:
                want = parse_candidate(obj["active"]).name
            except ValueError as e:
                raise ValueError(f"DDTREE trial set file {path}: 'active': {e}") from e
            names = [c.name for c in cands]
            if want not in names:
                raise ValueError(f"DDTREE trial set file {path}: 'active' {want} is not a candidate "
                                 f"({join_names(names)})")
            active = names.index(want)
        return cls(cands, active, source=path, trial_bs=trial_bs)

    @classmethod
    def from_file(cls, path: str) -> "TrialSet":
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        except OSError as e:
            raise ValueError(f"DDTREE trial set file {path} ({ENV_TRIAL_SET_FILE}) cannot be read: {e}") from e
        except ValueError as e:
            raise ValueError(f"DDTREE trial set file {path} is not valid JSON: {e}") from e
        return cls.from_json(obj, path)

    # -- what the candidates are ----------------------------------------
    @property
    def names(self) -> List[str]:
        return [c.name for c in self.candidates]

    def index_of(self, name: str) -> Optional[int]:
        names = self.names
        return names.index(name) if name in names else None

    @property
    def budget_max(self) -> int:
        return max(b.budget for c in self.candidates for b in c.bands)

    @property
    def widths(self) -> List[int]:
        """Distinct verify widths any candidate needs, widest first."""
        return sorted({b.width for c in self.candidates for b in c.bands}, reverse=True)

    @property
    def draft_budgets(self) -> List[int]:
        """Distinct budgets > 0 (one draft head each), largest first."""
        return sorted({b.budget for c in self.candidates for b in c.bands if b.budget > 0}, reverse=True)

    def check_num_draft_tokens(self, num_draft_tokens) -> None:
        n = int(num_draft_tokens)
        if self.budget_max + 1 != n:
            raise ValueError(
                f"DDTREE trial set {self.source}: the widest width any candidate needs is {self.budget_max + 1} "
                f"(budget {self.budget_max} + 1) but --speculative-num-draft-tokens is {n}; they must be equal "
                f"(KV over-allocation and buffers are sized for the widest width).")

    # -- routing / capture plan ------------------------------------------
    def set_cuda_graph_bs(self, cuda_graph_bs: Optional[Iterable[int]]) -> None:
        for s in self.schedules:
            s.set_cuda_graph_bs(cuda_graph_bs)
        self._cuda_graph_bs = self.schedules[0].cuda_graph_bs

    @property
    def cuda_graph_bs(self) -> Optional[List[int]]:
        return self._cuda_graph_bs

    def check_graph_bands(self) -> None:
        for s in self.schedules:
            s.check_graph_bands()

    def band_bs(self, ci: int, i: int) -> Optional[List[int]]:
        """The captured bs candidate ``ci`` needs a graph for in its band ``i``: all of the band's, or
        for a candidate other than ``active`` with ``trial_bs``, those the trial sizes reach (each
        rounded up to the band's next captured size) and the band's largest."""
        s = self.schedules[ci]
        full = s.cuda_graph_bs_for_band(i)
        if full is None or not full or self.trial_bs is None or ci == self.active:
            return full
        keep = {full[-1]}
        for t in self.trial_bs:
            padded = s.pad_to_cuda_graph_bs(t)   # the graph a batch of t replays at (routing pads first)
            if padded in full:
                keep.add(padded)
        return sorted(keep)

    def _routed(self, keep) -> Tuple[Optional[List[int]], List[str]]:
        """Captured bs that some candidate routes to a band passing ``keep``, and those candidates."""
        users, bs = [], set()
        for ci, (c, s) in enumerate(zip(self.candidates, self.schedules)):
            hit = False
            for i, band in enumerate(s.bands):
                if keep(band):
                    hit = True
                    bs.update(self.band_bs(ci, i) or [])
            if hit:
                users.append(c.name)
        return (None if self._cuda_graph_bs is None else sorted(bs)), users

    def verify_plan(self) -> List[Tuple[int, Optional[List[int]], List[str]]]:
        """``[(width, bs to capture at it (None: graphs off), candidates using it)]``, widest first."""
        return [(w, *self._routed(lambda band, w=w: band.width == w)) for w in self.widths]

    def draft_plan(self) -> List[Tuple[int, Optional[List[int]], List[str]]]:
        """``[(budget, bs whose draft graph folds in that budget's head, candidates)]``, largest first."""
        return [(b, *self._routed(lambda band, b=b: band.budget == b)) for b in self.draft_budgets]

    # -- lines ------------------------------------------------------------
    def log_line(self) -> str:
        return (f"DDTree trial set: {join_names(self.names)} (active {self.names[self.active]}; "
                f"verify widths {','.join(map(str, self.widths))}; "
                f"draft budgets {','.join(map(str, self.draft_budgets)) or '-'}"
                + (f"; trial bs {','.join(map(str, self.trial_bs))}" if self.trial_bs else "") + ")")

    @staticmethod
    def width_line(width: int, bs: Optional[List[int]], users: Sequence[str]) -> str:
        return (f"DDTree trial width {width} (budget {width - 1}): bs {'-' if bs is None else list(bs)} "
                f"for {join_names(users)}")

    @staticmethod
    def draft_line(budget: int, bs: Optional[List[int]], users: Sequence[str]) -> str:
        return f"DDTree trial draft budget {budget}: bs {'-' if bs is None else list(bs)} for {join_names(users)}"


def load_trial_set(num_draft_tokens, environ: Optional[Mapping[str, str]] = None) -> Optional[TrialSet]:
    """The deployment's trial set (``SGLANG_DDTREE_TRIAL_SET_FILE``), else None.
    ValueError when the file is malformed, its widest width != ``num_draft_tokens``,
    or a budget schedule file is configured as well."""
    env = os.environ if environ is None else environ
    path = env.get(ENV_TRIAL_SET_FILE)
    if not path:
        return None
    if env.get(ENV_SCHEDULE_FILE):
        raise ValueError(f"DDTREE: {ENV_TRIAL_SET_FILE} and {ENV_SCHEDULE_FILE} are both set; a trial set "
                         f"carries its schedules as candidates: set only {ENV_TRIAL_SET_FILE}.")
    ts = TrialSet.from_file(path)
    ts.check_num_draft_tokens(num_draft_tokens)
    return ts


# ---------------------------------------------------------------------------
# the control file and the live switch
# ---------------------------------------------------------------------------


def parse_control(text: str, path: str = "<control>") -> Candidate:
    """The candidate a control file names: ``{"active": "<budget or schedule>"}``.
    ValueError (the refusal's reason) on anything else."""
    if not text.strip():
        raise ValueError(f"{path}: empty")
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - {"active"})
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)} (expected only 'active')")
    if "active" not in obj:
        raise ValueError(f"{path}: no 'active' key")
    try:
        return parse_candidate(obj["active"])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


class ControlFile:
    """Cheap change detection: at most one ``stat`` per ``min_interval_s``; the file
    is read only when its (device, inode, mtime, size) changed since the last look
    (a rename over it changes the inode)."""

    def __init__(self, path: str, min_interval_s: float = DEFAULT_CONTROL_INTERVAL_MS / 1e3, *,
                 clock: Callable[[], float] = time.monotonic, stat=os.stat):
        self.path = path
        self.min_interval_s = float(min_interval_s)
        self._clock = clock
        self._stat = stat
        self._last_look: Optional[float] = None
        self._seen = None  # fingerprint of the content last read (None: absent / never read)
        self.stats = 0  # stat calls made (the measurement of what a check costs)
        self.reads = 0

    def poll(self) -> Optional[str]:
        """The file's text if it changed since the last read, else None; ValueError
        when it changed but cannot be read."""
        now = self._clock()
        if self._last_look is not None and now - self._last_look < self.min_interval_s:
            return None
        self._last_look = now
        self.stats += 1
        try:
            st = self._stat(self.path)
        except FileNotFoundError:
            self._seen = None  # written again later: read again
            return None
        except OSError as e:  # e.g. a directory without permission: say so once, not every look
            fp = ("error", type(e).__name__, e.errno)
            if fp == self._seen:
                return None
            self._seen = fp
            raise ValueError(f"{self.path}: cannot be stat'ed ({e})") from e
        fp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if fp == self._seen:
            return None
        self._seen = fp
        self.reads += 1
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{self.path}: cannot be read ({e})") from e


class ActiveCandidate:
    """Which candidate serves, and the switch.  ``begin_step()`` at the start of
    every decode step (all TP ranks run the same decode steps, in lockstep):
    every ``every_steps`` steps the ranks meet — TP0 (``is_source``) polls the
    control file and proposes a candidate index or ``NO_CHANGE``; ``broadcast``
    (TP > 1: the TP group's CPU group) hands TP0's proposal to every rank, so all
    switch at the same step.  Without a control file no rank ever meets.  Lines
    (``log``) on TP0 only."""

    def __init__(self, trials: TrialSet, *, control: Optional[ControlFile] = None, is_source: bool = True,
                 broadcast: Optional[Callable[[int], int]] = None, every_steps: int = DEFAULT_CONTROL_EVERY_STEPS,
                 log: Optional[Callable[[str], None]] = None):
        if int(every_steps) < 1:
            raise ValueError(f"DDTREE: {ENV_CONTROL_EVERY_STEPS} must be >= 1, got {every_steps}")
        self.trials = trials
        self.control = control
        self.is_source = bool(is_source)
        self.broadcast = broadcast
        self.every_steps = int(every_steps)
        self._log = log if (log is not None and self.is_source) else (lambda line: None)
        self.active = trials.active
        self.step = 0  # decode steps begun
        self.since_step = 0
        self.switches: List[Tuple[int, str]] = []  # (first step, candidate) per switch
        self.last_refusal: Optional[str] = None
        self.meetings = 0

    @classmethod
    def from_env(cls, trials: TrialSet, *, is_source: bool, broadcast=None, log=None,
                 environ: Optional[Mapping[str, str]] = None) -> "ActiveCandidate":
        env = os.environ if environ is None else environ
        path = env.get(ENV_CONTROL_FILE) or None
        try:
            every = int(env.get(ENV_CONTROL_EVERY_STEPS) or DEFAULT_CONTROL_EVERY_STEPS)
            interval_ms = float(env.get(ENV_CONTROL_INTERVAL_MS) or DEFAULT_CONTROL_INTERVAL_MS)
        except ValueError as e:
            raise ValueError(f"DDTREE: {ENV_CONTROL_EVERY_STEPS} / {ENV_CONTROL_INTERVAL_MS} must be numbers: {e}") \
                from e
        control = ControlFile(path, interval_ms / 1e3) if path else None
        return cls(trials, control=control, is_source=is_source, broadcast=broadcast, every_steps=every, log=log)

    @property
    def name(self) -> str:
        return self.trials.names[self.active]

    @property
    def schedule(self) -> BudgetSchedule:
        return self.trials.schedules[self.active]

    def active_line(self) -> str:
        return f"DDTree active: {self.name} (since step {self.since_step})"

    def begin_step(self) -> int:
        """Count a decode step; at a meeting, apply what TP0 proposes. Returns the active index."""
        self.step += 1
        if self.control is not None and self.step % self.every_steps == 0:
            self.meetings += 1
            proposal = self._propose() if self.is_source else NO_CHANGE
            if self.broadcast is not None:
                proposal = int(self.broadcast(proposal))
            if proposal != NO_CHANGE and proposal != self.active:
                self.active = proposal
                self.since_step = self.step
                self.switches.append((self.step, self.name))
                self._log(self.active_line())
        return self.active

    def _propose(self) -> int:
        try:
            text = self.control.poll()
            if text is None:
                return NO_CHANGE
            cand = parse_control(text, self.control.path)
        except ValueError as e:
            return self._refuse(str(e))
        i = self.trials.index_of(cand.name)
        if i is None:
            return self._refuse(f"{cand.describe()} was not captured (captured: {join_names(self.trials.names)})")
        return i

    def _refuse(self, reason: str) -> int:
        self.last_refusal = reason
        self._log(f"DDTree control refused: {reason}")
        return NO_CHANGE

    def status(self) -> dict:
        """What ``/server_info`` shows under ``internal_states[i]["ddtree"]``."""
        return dict(
            active=self.name,
            since_step=self.since_step,
            decode_steps=self.step,
            candidates=self.trials.names,
            verify_widths=self.trials.widths,
            draft_budgets=self.trials.draft_budgets,
            control_file=None if self.control is None else self.control.path,
            control_every_steps=self.every_steps,
            last_refusal=self.last_refusal,
        )
