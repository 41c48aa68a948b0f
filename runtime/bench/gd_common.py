"""gpu_decode.py's shared state and device helpers: the log, the device
(``DEV[0]``: "cuda", or "cpu" in the dry run), CUDA graphs or their CPU
emulation, the SGLang names the harness resolves at import (``SGL``) and the
provenance record."""

from __future__ import annotations

import os
import types

import torch


def log(*a):
    print(*a, flush=True)


TRACE = os.environ.get("DDTREE_HARNESS_TRACE") == "1"
DEV = ["cuda"]  # "cpu" in the CPU dry run (--dry-cpu): Triton's interpreter, emulated graphs


def on_cuda() -> bool:
    return DEV[0] == "cuda"


def sync():
    if on_cuda():
        torch.cuda.synchronize()


def graph_pool():
    return torch.cuda.graph_pool_handle() if on_cuda() else None


class EmulatedGraph:
    """The CPU dry run's stand-in for a ``torch.cuda.CUDAGraph``: replay runs the
    captured calls again on the same static tensors and copies the results into
    the tensors the capture returned (what a replay leaves there)."""

    def __init__(self, fn, outs):
        self.fn, self.outs = fn, outs

    def replay(self):
        new = self.fn()
        olds = self.outs if isinstance(self.outs, (tuple, list)) else (self.outs,)
        news = new if isinstance(new, (tuple, list)) else (new,)
        for o, n in zip(olds, news):
            if isinstance(o, torch.Tensor) and isinstance(n, torch.Tensor) and o is not n:
                o.copy_(n)


def capture_graph(fn, pool=None):
    """``fn()`` captured into a CUDA graph (an ``EmulatedGraph`` in the CPU dry
    run); returns (graph, what ``fn`` returned at capture: the static outputs)."""
    if not on_cuda():
        outs = fn()
        return EmulatedGraph(fn, outs), outs
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        outs = fn()
    return g, outs


SGL = types.SimpleNamespace()  # the SGLang names the harness uses
PROVENANCE = {}  # what -> "real ..." / "stand-in: reason"
