"""SGLang 0.5.23's own rules that opsctl, the DDTree runtime and the lab's emulator all need: the
decode CUDA-graph capture list, its clamp to the request pool, and the routing of a running batch
to a band (pad to the captured size it replays at, then the band whose lower bound is the largest
<= that). One definition (issue #53).

This file is the source. The runtime (a separate wheel) and the emulator (runs on the lab host
without opsctl) each carry a generated copy, written by `python -m opsctl.onhost.sglang_rules`:
runtime/src/sglang_ddtree/sglang_rules.py and opsctl/lab/emulator/sglang/lab/sglang_rules.py.
tests/foundation/test_sglang_rules_copies.py fails when a copy differs from this file, and
tests/foundation/test_capture_list_vs_sglang.py (marked sglang) holds each function to the real
SGLang 0.5.23 source in .venv-sglang.

Standard library only (Python >= 3.8), no imports of anything else: this module runs on the host,
inside the runtime and inside the emulator.
"""
from __future__ import annotations

import bisect
from typing import Iterable, List, Optional, Sequence


def decode_cuda_graph_batch_sizes(max_bs: int, speculative: bool = True,
                                  disable_padding: bool = False) -> List[int]:
    """generate_decode_cuda_graph_batch_sizes (srt/arg_groups/cuda_graph_hook.py) for
    --cuda-graph-max-bs-decode `max_bs`: the speculative list (less padding at small batches),
    the autoregressive one, or every size with --disable-cuda-graph-padding."""
    max_bs = int(max_bs)
    if disable_padding:
        bs = list(range(1, max_bs + 1))
    elif not speculative:
        bs = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    else:
        bs = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
              + list(range(272, max_bs + 1, 16)))
    bs = [b for b in bs if b <= max_bs]
    if max_bs not in bs:
        bs.append(max_bs)
    return bs


def clamp_to_request_pool(capture_bs: Iterable[int], num_max_requests: Optional[int]) -> List[int]:
    """get_batch_sizes_to_capture's clamp (srt/model_executor/runner/base_cuda_graph_runner.py),
    attention-TP alignment 1: past the pool the pool's own size is added, and the list is cut there.
    No pool size (None or 0): the list sorted, as it is."""
    bs = [int(b) for b in capture_bs]
    if num_max_requests:
        n = int(num_max_requests)
        if max(bs) > n:
            bs.append(n)
        bs = [b for b in bs if b <= n]
    return sorted(set(bs))


def pad_to_cuda_graph_bs(batch: int, cuda_graph_bs: Optional[Sequence[int]]) -> int:
    """AdaptiveSpeculativeParams._pad_to_cuda_graph_bs (srt/speculative/adaptive_spec_params.py):
    the smallest captured size >= batch; past the largest (or with no graphs), the batch itself."""
    if not cuda_graph_bs:
        return int(batch)
    cs = sorted(cuda_graph_bs)
    i = bisect.bisect_left(cs, int(batch))
    return cs[i] if i < len(cs) else int(batch)


def band_of_padded(lows: Sequence[int], padded: int) -> int:
    """AdaptiveSpeculativeParams._find_closest_bs, as an index: the band whose lower bound is the
    largest <= `padded` (the first band below every bound)."""
    return max(bisect.bisect_right(list(lows), int(padded)) - 1, 0)


def route(lows: Sequence[int], batch: int, cuda_graph_bs: Optional[Sequence[int]] = None) -> int:
    """AdaptiveSpeculativeParams._route, as an index into the bands whose lower bounds are `lows`
    (increasing): a running batch is padded to its captured size, then given that size's band."""
    return band_of_padded(lows, pad_to_cuda_graph_bs(batch, cuda_graph_bs))


# -- the generated copies (run on the controller only: `python -m opsctl.onhost.sglang_rules`) ----------

COPIES = ("runtime/src/sglang_ddtree/sglang_rules.py", "opsctl/lab/emulator/sglang/lab/sglang_rules.py")
_MARK = "# -- the generated copies"


def copy_text(source: str) -> str:
    """A copy's text: this file's rules (everything above the mark), under a header saying so."""
    body = source.split(_MARK, 1)[0].rstrip() + "\n"
    return ("# GENERATED from opsctl/onhost/sglang_rules.py by `python -m opsctl.onhost.sglang_rules`:\n"
            "# do not edit here (tests/foundation/test_sglang_rules_copies.py fails on a difference).\n" + body)


if __name__ == "__main__":
    import pathlib
    import sys

    here = pathlib.Path(__file__).resolve()
    repo = here.parents[2]
    text = copy_text(here.read_text(encoding="utf-8"))
    check = "--check" in sys.argv[1:]
    stale = []
    for rel in COPIES:
        path = repo / rel
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(rel)
            if not check:
                path.write_text(text, encoding="utf-8")
    verb = "differs" if check else "written"
    print("\n".join(f"{rel}: {verb}" for rel in stale) or "copies up to date")
    sys.exit(1 if check and stale else 0)
