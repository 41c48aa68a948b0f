"""DDTree budget schedule: the node budget by running batch size (issue #18).

Grammar (rendered and validated by opsctl; the same rules here)::

    MIN_BS:BUDGET[,MIN_BS:BUDGET...]      e.g.  1:32,8:16,32:8,64:0

first MIN_BS is 1, MIN_BS strictly increasing, BUDGET an integer 0..1024, at
least one band with BUDGET > 0.  Band i covers batch sizes
[MIN_BS_i, MIN_BS_{i+1} - 1]; the last band is open-ended.  Budget 0 = no tree:
the bonus token is verified alone (verify width 1) and the drafter is not run.

The release ships the schedule as JSON; the plugin reads the file named by
``SGLANG_DDTREE_SCHEDULE_FILE``::

    {"schedule": "1:32,8:16,32:8,64:0",
     "bands": [{"min_bs": 1, "budget": 32}, {"min_bs": 8, "budget": 16}, ...]}

``bands`` is authoritative; ``schedule``, when present, must agree.  Unset
variable = one band, budget = ``--speculative-num-draft-tokens`` - 1 (today's
behaviour).  ``--speculative-num-draft-tokens`` must be the widest band's width
(budget_max + 1): KV over-allocation and buffers are sized for it.

Routing (:meth:`BudgetSchedule.band_index`) is SGLang 0.5.23's
``AdaptiveSpeculativeParams._route`` (srt/speculative/adaptive_spec_params.py):
pad the running batch size to the CUDA-graph batch size it replays at (the
smallest captured bs >= it; above the largest captured bs, itself), then take
the band with the largest MIN_BS <= that padded size.  Every captured bs thus
belongs to exactly one band (:meth:`cuda_graph_bs_for_band`, the analogue of
``cuda_graph_bs_for_step``), and its target-verify graph is captured once, at
that band's width.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence

from .config import MAX_BUDGET
from .sglang_rules import band_of_padded, clamp_to_request_pool, decode_cuda_graph_batch_sizes, pad_to_cuda_graph_bs

ENV_SCHEDULE_FILE = "SGLANG_DDTREE_SCHEDULE_FILE"

_BAND_RE = re.compile(r"^(\d+):(\d+)$")


@dataclass(frozen=True)
class Band:
    min_bs: int
    budget: int

    @property
    def width(self) -> int:
        """Verify tokens per request (root included)."""
        return self.budget + 1


def _validate_bands(bands: Sequence[Band], what: str) -> None:
    if not bands:
        raise ValueError(f"DDTREE budget schedule {what}: no bands")
    if bands[0].min_bs != 1:
        raise ValueError(f"DDTREE budget schedule {what}: the first band must start at batch size 1, "
                         f"got {bands[0].min_bs}")
    for a, b in zip(bands, bands[1:]):
        if b.min_bs <= a.min_bs:
            raise ValueError(f"DDTREE budget schedule {what}: MIN_BS must be strictly increasing "
                             f"({a.min_bs} then {b.min_bs})")
    for band in bands:
        if not 0 <= band.budget <= MAX_BUDGET:
            raise ValueError(f"DDTREE budget schedule {what}: budget {band.budget} (band from bs "
                             f"{band.min_bs}) is outside 0..{MAX_BUDGET}")
    if not any(b.budget > 0 for b in bands):
        raise ValueError(f"DDTREE budget schedule {what}: at least one band needs a budget > 0")


def parse_schedule(text: str) -> List[Band]:
    """``"1:32,8:16,32:8,64:0"`` -> bands; ValueError on any grammar violation."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"DDTREE budget schedule: empty or not a string: {text!r}")
    bands = []
    for part in text.strip().split(","):
        m = _BAND_RE.match(part.strip())
        if m is None:
            raise ValueError(f"DDTREE budget schedule {text!r}: {part!r} is not MIN_BS:BUDGET "
                             f"(non-negative integers)")
        bands.append(Band(int(m.group(1)), int(m.group(2))))
    _validate_bands(bands, repr(text))
    return bands


def format_schedule(bands: Iterable[Band]) -> str:
    return ",".join(f"{b.min_bs}:{b.budget}" for b in bands)


def _int_field(entry: Mapping, key: str, i: int, path: str) -> int:
    v = entry.get(key) if isinstance(entry, Mapping) else None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"DDTREE budget schedule file {path}: bands[{i}].{key} must be an integer, got {v!r}")
    return v


def bands_from_json(obj, path: str = "<json>") -> List[Band]:
    if not isinstance(obj, Mapping):
        raise ValueError(f"DDTREE budget schedule file {path}: expected a JSON object, got {type(obj).__name__}")
    raw = obj.get("bands")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"DDTREE budget schedule file {path}: 'bands' must be a non-empty list")
    bands = [Band(_int_field(e, "min_bs", i, path), _int_field(e, "budget", i, path)) for i, e in enumerate(raw)]
    _validate_bands(bands, f"file {path}")
    if "schedule" in obj:
        text = parse_schedule(obj["schedule"])
        if text != bands:
            raise ValueError(f"DDTREE budget schedule file {path}: 'schedule' {obj['schedule']!r} disagrees "
                             f"with 'bands' ({format_schedule(bands)})")
    return bands


class BudgetSchedule:
    """Bands + routing by (CUDA-graph padded) batch size."""

    def __init__(self, bands: Sequence[Band], source: Optional[str] = None):
        bands = list(bands)
        _validate_bands(bands, source or format_schedule(bands))
        self.bands: List[Band] = bands
        self.source = source  # file path, or None for the implicit single band
        self._min_bs = [b.min_bs for b in bands]
        self._cuda_graph_bs: Optional[List[int]] = None

    # -- construction --------------------------------------------------
    @classmethod
    def single(cls, budget: int) -> "BudgetSchedule":
        return cls([Band(1, int(budget))])

    @classmethod
    def from_file(cls, path: str) -> "BudgetSchedule":
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        except OSError as e:
            raise ValueError(f"DDTREE budget schedule file {path} ({ENV_SCHEDULE_FILE}) cannot be read: {e}") from e
        except ValueError as e:
            raise ValueError(f"DDTREE budget schedule file {path} is not valid JSON: {e}") from e
        return cls(bands_from_json(obj, path), source=path)

    # -- properties ----------------------------------------------------
    @property
    def spec(self) -> str:
        return format_schedule(self.bands)

    @property
    def budget_max(self) -> int:
        return max(b.budget for b in self.bands)

    @property
    def widths(self) -> List[int]:
        return [b.width for b in self.bands]

    def log_line(self) -> str:
        return (f"DDTree budget schedule: {self.spec} "
                f"(verify widths {','.join(str(w) for w in self.widths)})")

    def check_num_draft_tokens(self, num_draft_tokens) -> None:
        n = int(num_draft_tokens)
        if self.budget_max + 1 != n:
            raise ValueError(
                f"DDTREE budget schedule {self.spec} ({self.source}): the widest band's width is "
                f"{self.budget_max + 1} (budget {self.budget_max} + 1) but --speculative-num-draft-tokens "
                f"is {n}; they must be equal (KV over-allocation and buffers are sized for the widest band)."
            )

    # -- routing (AdaptiveSpeculativeParams._route) ----------------------
    def set_cuda_graph_bs(self, cuda_graph_bs: Optional[Iterable[int]]) -> None:
        bs = sorted(set(int(b) for b in cuda_graph_bs)) if cuda_graph_bs else None
        self._cuda_graph_bs = bs

    @property
    def cuda_graph_bs(self) -> Optional[List[int]]:
        return self._cuda_graph_bs

    def pad_to_cuda_graph_bs(self, batch_size: int) -> int:
        return pad_to_cuda_graph_bs(batch_size, self._cuda_graph_bs)

    def band_index_of_padded(self, padded_bs: int) -> int:
        return band_of_padded(self._min_bs, padded_bs)

    def band_index(self, batch_size: int) -> int:
        return self.band_index_of_padded(self.pad_to_cuda_graph_bs(batch_size))

    def band(self, batch_size: int) -> Band:
        return self.bands[self.band_index(batch_size)]

    def budget_for(self, batch_size: int) -> int:
        return self.band(batch_size).budget

    def cuda_graph_bs_for_band(self, i: int) -> Optional[List[int]]:
        """Captured batch sizes that replay in band ``i`` (None: graphs disabled)."""
        if self._cuda_graph_bs is None:
            return None
        return [v for v in self._cuda_graph_bs if self.band_index_of_padded(v) == i]

    def tree_cuda_graph_bs(self) -> Optional[List[int]]:
        """Captured batch sizes of bands with a tree (budget > 0): the drafter's graph list."""
        if self._cuda_graph_bs is None:
            return None
        return [v for v in self._cuda_graph_bs if self.bands[self.band_index_of_padded(v)].budget > 0]

    def check_graph_bands(self) -> None:
        """Every band must contain at least one captured batch size (when graphs are on)."""
        if self._cuda_graph_bs is None:
            return
        empty = [self.bands[i] for i in range(len(self.bands)) if not self.cuda_graph_bs_for_band(i)]
        if empty:
            raise ValueError(
                f"DDTREE budget schedule {self.spec}: band(s) "
                f"{', '.join(f'{b.min_bs}:{b.budget}' for b in empty)} contain no captured CUDA-graph batch "
                f"size (captured bs {self._cuda_graph_bs}); a running batch pads to a captured bs first, so "
                f"such a band can never be selected. Adjust the schedule or --cuda-graph-bs-decode."
            )


def load_schedule(num_draft_tokens, environ: Optional[Mapping[str, str]] = None) -> BudgetSchedule:
    """The deployment's schedule: the file in ``SGLANG_DDTREE_SCHEDULE_FILE``,
    else one band with budget = num_draft_tokens - 1.  ValueError when the file
    is malformed or its widest width != ``num_draft_tokens``."""
    from .config import budget_from_num_draft_tokens

    env = os.environ if environ is None else environ
    budget = budget_from_num_draft_tokens(num_draft_tokens)
    path = env.get(ENV_SCHEDULE_FILE)
    if not path:
        return BudgetSchedule.single(budget)
    sched = BudgetSchedule.from_file(path)
    sched.check_num_draft_tokens(num_draft_tokens)
    return sched


def sglang_capture_bs(max_bs: int) -> List[int]:
    """The decode batch sizes SGLang 0.5.23 captures for a speculative server with
    ``--cuda-graph-max-bs-decode max_bs`` (sglang_rules.decode_cuda_graph_batch_sizes, the
    generated copy of opsctl's one definition), sorted and unique."""
    return clamp_to_request_pool(decode_cuda_graph_batch_sizes(max_bs, speculative=True), None)
