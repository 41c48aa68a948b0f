"""The CUDA-graph capture list of a profile, and what a DDTree budget schedule does at each
running batch, for the controller (opsctl/schedule.py: render-time checks, the gate's undrafted
levels) and the host (the watch agent: batches whose accept length is 1 by design). SGLang's
rules themselves (the list, the clamp, the routing) are sglang_rules.py's, the one definition
the runtime and the emulator carry generated copies of.

Standard library only (Python >= 3.8): this module runs on the host.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

from .sglang_rules import clamp_to_request_pool, decode_cuda_graph_batch_sizes, pad_to_cuda_graph_bs, route

Band = Tuple[int, int]                 # (smallest running batch, node budget)
BatchRange = List[Optional[int]]       # [lo, hi]; hi None: every larger batch


def speculative_decode_batch_sizes(max_bs: int) -> List[int]:
    """SGLang 0.5.23's generate_decode_cuda_graph_batch_sizes, speculative case
    (srt/arg_groups/cuda_graph_hook.py) for --cuda-graph-max-bs-decode `max_bs`."""
    return decode_cuda_graph_batch_sizes(max_bs, speculative=True)


def autoregressive_decode_batch_sizes(max_bs: int) -> List[int]:
    """SGLang 0.5.23's generate_decode_cuda_graph_batch_sizes, non-speculative case."""
    return decode_cuda_graph_batch_sizes(max_bs, speculative=False)


def captured_batch_sizes(max_bs: int, max_running_requests: Optional[int] = None,
                         explicit: Optional[Sequence[int]] = None) -> List[int]:
    """The decode batch sizes a speculative server captures: the list above (or `explicit`,
    --cuda-graph-bs-decode, which SGLang 0.5.23 takes as it is: memory_hook then sets max_bs to
    its largest), clamped to --max-running-requests as get_batch_sizes_to_capture does (that
    size is added when the list goes past it)."""
    bs = sorted(set(int(b) for b in explicit)) if explicit else speculative_decode_batch_sizes(max_bs)
    return clamp_to_request_pool(bs, max_running_requests)


def profile_captured_batch_sizes(profile: "Mapping[str, Any]", default_max_bs: int = 32) -> List[int]:
    """The capture list of a profile's fields (config.Profile's dump or a manifest's `profile`):
    its explicit `cuda_graph_bs` when set, else SGLang's list up to `cuda_graph_max_bs`."""
    return captured_batch_sizes(int(profile.get("cuda_graph_max_bs") or default_max_bs),
                                profile.get("max_running_requests"), explicit=profile.get("cuda_graph_bs") or None)


def pad_to_captured(batch: int, capture_bs: Optional[Sequence[int]]) -> int:
    """The captured batch size a running batch replays at (itself past the largest)."""
    return pad_to_cuda_graph_bs(batch, capture_bs)


def parse_bands(schedule: str) -> List[Band]:
    """`1:32,8:16,64:0` -> [(1, 32), (8, 16), (64, 0)] (a schedule the controller already checked)."""
    return [(int(lo), int(budget)) for lo, budget in (part.split(":") for part in schedule.split(","))]


def band_index(bands: Sequence[Band], batch: int, capture_bs: Optional[Sequence[int]] = None) -> int:
    """The band a running batch decodes in: SGLang's AdaptiveSpeculativeParams._route
    (sglang_rules.route)."""
    return route([lo for lo, _ in bands], batch, capture_bs)


def undrafted_batches(bands: Sequence[Band], capture_bs: Sequence[int]) -> List[BatchRange]:
    """Running-batch ranges [lo, hi] (hi None: open) the schedule serves in a budget-0 band:
    no drafter, accept length 1 by design."""
    out: List[BatchRange] = []
    top = max(max(capture_bs), bands[-1][0]) + 1
    for batch in range(1, top + 1):
        if bands[band_index(bands, batch, capture_bs)][1] == 0:
            if out and out[-1][1] == batch - 1:
                out[-1][1] = batch
            else:
                out.append([batch, batch])
    if out and out[-1][1] == top:
        out[-1][1] = None  # every larger batch is past the last graph: the last band's budget
    return out


def in_ranges(batch: float, ranges: Optional[Sequence[Sequence[Optional[int]]]]) -> bool:
    return any(batch >= lo and (hi is None or batch <= hi) for lo, hi in ranges or ())
