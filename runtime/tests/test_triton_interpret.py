"""The fused Triton kernels, run by Triton's CPU interpreter (TRITON_INTERPRET=1)
on a few small shapes: same trees as the reference.  (The GPU run of the same
kernels is runtime/bench/bench_build.py.)"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import SRC

CODE = """
import torch
from sglang_ddtree import build_trees
from sglang_ddtree.reference import build_tree, top_log_probs
from sglang_ddtree import triton_kernels as tk
g = torch.Generator().manual_seed(0)
for dt in (torch.float32, torch.bfloat16):
    for (bs, L, V, B) in [(2, 3, 50, 8), (1, 1, 2, 1), (2, 4, 700, 16), (1, 3, 3, 5)]:
        x = torch.randn(bs, L, V, generator=g).to(dt)
        K = min(B, V)
        lp, ids = tk.topk_logsumexp(x, K)
        rlp, rids = top_log_probs(x, K)
        assert (lp - rlp).abs().max() < 1e-5
        if dt == torch.float32:  # bf16 has exact ties, where any tie order is right
            assert torch.equal(ids, rids)
            tr = build_trees(x, B, torch.arange(bs), impl="triton")
            for b in range(bs):
                assert tr.paths(b) == build_tree(x[b], B).paths(), (bs, L, V, B)
            assert tr.tokens[:, 0].tolist() == list(range(bs))
print("OK")
"""


def test_triton_kernels_in_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=SRC)
    env.pop("SGLANG_DDTREE_DISABLE_TRITON", None)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stderr[-4000:]
