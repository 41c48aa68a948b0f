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
from sglang_ddtree.tree import build_trees_from_top
from sglang_ddtree import triton_kernels as tk
g = torch.Generator().manual_seed(0)
# both top-K implementations: v0 (per-chunk top-K + merge, fp64 or fp32 merge keys,
# separate or fused merge), v2 (group maxima (1-D or 2-D loads) + select, fp64 or
# fp32 element keys)
cfgs = [{"impl": "v0", "chunk": 4096}, {"impl": "v0", "chunk": 256, "mpack32": True},
        {"impl": "v0", "chunk": 512, "mpack32": True, "fuse": True}, {"impl": "v0", "chunk": 256, "fuse": True},
        {"impl": "v2", "chunk": 256, "S": 16, "sel_warps": 4},
        {"impl": "v2", "chunk": 256, "S": 16, "sel_warps": 4, "epack32": True, "load2d": True},
        {"impl": "v2", "chunk": 128, "S": 32, "epack32": True},
        {"impl": "v2", "chunk": 256, "S": 16, "epack32": True, "hier": 4},
        {"impl": "v2", "chunk": 64, "S": 8, "hier": 2}]
for cfg in cfgs:
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for (bs, L, V, B) in [(2, 3, 50, 8), (1, 1, 2, 1), (2, 4, 700, 16), (1, 3, 3, 5), (1, 2, 3000, 13), (2, 2, 1024, 4)]:
            x = torch.randn(bs, L, V, generator=g).to(dt)
            K = min(B, V)
            lp, ids = tk.topk_logsumexp(x, K, cfg=cfg)
            rlp, rids = top_log_probs(x, K)
            assert (lp - rlp).abs().max() < 1e-4, (cfg, dt, bs, L, V, B)
            if dt == torch.float32:  # 16-bit floats have exact ties, where any tie order is right
                assert torch.equal(ids, rids), (cfg, bs, L, V, B)
            else:
                got = x.float().gather(-1, ids).sort(-1).values
                assert torch.equal(got, x.float().topk(K, -1).values.sort(-1).values), (cfg, dt, bs, L, V, B)
# the tree kernel (pruned beam; memory round trips or registers) == the torch beam
for gat in (False, True):
    for (bs, L, V, B) in [(2, 15, 300, 64), (3, 7, 1000, 32), (2, 9, 5, 33), (4, 4, 100, 1), (2, 6, 3, 64)]:
        x = torch.randn(bs, L, V, generator=g) * 3
        K = min(B, V)
        lp, ids = top_log_probs(x, K)
        tr = tk.build_trees_from_top_triton(lp, ids, B, torch.arange(bs), gather=gat)
        ref = build_trees_from_top(lp, ids, B, torch.arange(bs))
        for f in ("tokens", "parents", "depths", "visibility", "valid"):
            assert torch.equal(getattr(tr, f), getattr(ref, f)), (gat, bs, L, V, B, f)
# exact score ties (integer logits: equal sums along different paths): the
# register path (running global top-B, ancestor mask by stores) == the memory path
for (bs, L, V, B) in [(2, 7, 40, 32), (3, 5, 20, 16)]:
    x = (torch.randn(bs, L, V, generator=g) * 3).round()
    lp, ids = top_log_probs(x, min(B, V))
    mem = tk.build_trees_from_top_triton(lp, ids, B, torch.arange(bs), gather=False)
    reg = tk.build_trees_from_top_triton(lp, ids, B, torch.arange(bs), gather=True)
    for f in ("tokens", "parents", "depths", "visibility", "valid"):
        assert torch.equal(getattr(reg, f), getattr(mem, f)), ("ties", bs, L, V, B, f)
# v0 top-K + merge + tree in one launch (the last program of a row / of a
# request doing the next step), v2 with the compacted element sort (ecap; tiny
# V falls back to the full sort); == the same top-K followed by the tree
# kernel, counters back at 0
fused = [({"impl": "v0", "chunk": 256, "mpack32": True, "fuse": True, "tree": True}, torch.float32, (2, 3, 700, 16)),
         ({"impl": "v0", "chunk": 256, "mpack32": True, "fuse": True, "tree": True}, torch.bfloat16, (3, 2, 1000, 33)),
         ({"impl": "v2", "chunk": 256, "S": 16, "epack32": True, "hier": 4, "ecap": 64},
          torch.bfloat16, (2, 3, 700, 16)),
         ({"impl": "v2", "chunk": 256, "S": 16, "epack32": True, "ecap": 16}, torch.float16, (1, 2, 5, 8)),
         ({"impl": "v2", "chunk": 256, "S": 16, "epack32": True, "hier": 4, "ecap": 64},
          torch.bfloat16, (2, 2, 3000, 8))]
for cfg, dt, (bs, L, V, B) in fused:
    x = torch.randn(bs, L, V, generator=g).to(dt) * 3
    root = torch.arange(bs) + 7
    K = min(B, V)
    tr, _ = tk.build_trees_triton(x, B, root, cfg=cfg)
    assert tk.fused_tree(cfg, B) == (cfg["impl"] == "v0" and B <= 32)
    lp, ids = tk.topk_logsumexp(x, K, cfg=dict(cfg, tree=False))
    assert torch.equal(x.float().gather(-1, ids).sort(-1).values, x.float().topk(K, -1).values.sort(-1).values), cfg
    ref = tk.build_trees_from_top_triton(lp, ids, B, root)
    for f in ("tokens", "parents", "depths", "visibility", "valid"):
        assert torch.equal(getattr(tr, f), getattr(ref, f)), (cfg, dt, bs, L, V, B, f)
    if dt == torch.float32:
        for b in range(bs):
            assert tr.paths(b) == build_tree(x[b], B).paths(), (cfg, bs, L, V, B)
    assert int(tk._counters(x.device, 1).abs().sum()) == 0, cfg
# end to end, default configuration (bs * L > 64 rows: the "large" configuration)
for (bs, L, V, B) in [(2, 3, 50, 8), (1, 1, 2, 1), (2, 4, 700, 16), (1, 3, 3, 5), (33, 2, 300, 8)]:
    x = torch.randn(bs, L, V, generator=g)
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
                       env=env, timeout=1500)  # ~630 s on this 2-core machine under load
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stderr[-4000:]
