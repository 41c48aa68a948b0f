"""The fused Triton kernels, run by Triton's CPU interpreter (TRITON_INTERPRET=1)
on a few small shapes: same trees as the reference.  (The GPU run of the same
kernels is runtime/bench/bench_build.py.)

Four parts, each one subprocess (background jobs: conftest.py), with the
interpreter shortcuts of interp_fast.py:
* topk_v0 / topk_v2: every top-K configuration x every shape edge case, each
  configuration in every dtype and each shape in every dtype (a pairwise
  covering array of configuration x dtype x shape, checked in the code);
* tree: the tree kernel's two paths on every tree shape, and on exact score ties;
* fused_default: the one-launch top-K + tree and the compacted element sort,
  and build_trees end to end in both regimes of the default configuration.
"""

import textwrap

import pytest

from conftest import interp_job, job_result

PRELUDE = """
import interp_fast
interp_fast.install()
import torch
from sglang_ddtree import build_trees
from sglang_ddtree.reference import build_tree, top_log_probs
from sglang_ddtree.tree import build_trees_from_top
from sglang_ddtree import triton_kernels as tk
"""

# both top-K implementations: v0 (per-chunk top-K + merge, fp64 or fp32 merge keys,
# separate or fused merge), v2 (group maxima (1-D or 2-D loads) + select, fp64 or
# fp32 element keys).  Shapes (bs, L, V, B), K = min(B, V): V below one chunk
# (masked), V = 2 with K = 1, several chunks with a partial last one (K 16), V < B
# (K = V = 3, KP 4), many chunks with K 13 (KP 16), V a power of two that every
# chunk divides (EVEN) with K 4.  Case i of a configuration runs in dtype
# DTS[(c + i) % 3] (c: the configuration's index): each configuration in each
# dtype twice, each shape in each dtype (in each part).
TOPK = """
CFGS = [{"impl": "v0", "chunk": 4096}, {"impl": "v0", "chunk": 256, "mpack32": True},
        {"impl": "v0", "chunk": 512, "mpack32": True, "fuse": True}, {"impl": "v0", "chunk": 256, "fuse": True},
        {"impl": "v2", "chunk": 256, "S": 16, "sel_warps": 4},
        {"impl": "v2", "chunk": 256, "S": 16, "sel_warps": 4, "epack32": True, "load2d": True},
        {"impl": "v2", "chunk": 128, "S": 32, "epack32": True},
        {"impl": "v2", "chunk": 256, "S": 16, "epack32": True, "hier": 4},
        {"impl": "v2", "chunk": 64, "S": 8, "hier": 2}]
SHAPES = [(2, 2, 50, 8), (1, 1, 2, 1), (1, 2, 700, 16), (1, 3, 3, 5), (1, 1, 3000, 13), (2, 1, 1024, 4)]
DTS = (torch.float32, torch.bfloat16, torch.float16)
g = torch.Generator().manual_seed(0)
pairs = set()
for c, cfg in enumerate(CFGS):
    if cfg["impl"] != IMPL:
        continue
    for i, (bs, L, V, B) in enumerate(SHAPES):
        dt = DTS[(c + i) % 3]
        pairs |= {("cd", c, dt), ("cs", c, i), ("ds", dt, i)}
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
mine = [c for c, cfg in enumerate(CFGS) if cfg["impl"] == IMPL]
assert len(pairs) == len(mine) * (3 + len(SHAPES)) + 3 * len(SHAPES), "not a pairwise covering"
print("OK", len(mine) * len(SHAPES))
"""

TREE = """
g = torch.Generator().manual_seed(0)
F = ("tokens", "parents", "depths", "visibility", "valid")
# the tree kernel (pruned beam; memory round trips or registers) == the torch beam:
# L 15 with B 64 (the kernel's limits), several requests at B 32, V < K (5 < 33, 3 < 64), B 1
n = 0
for gat in (False, True):
    for (bs, L, V, B) in [(1, 15, 300, 64), (2, 7, 1000, 32), (1, 9, 5, 33), (2, 4, 100, 1), (1, 6, 3, 64)]:
        x = torch.randn(bs, L, V, generator=g) * 3
        K = min(B, V)
        lp, ids = top_log_probs(x, K)
        tr = tk.build_trees_from_top_triton(lp, ids, B, torch.arange(bs), gather=gat)
        ref = build_trees_from_top(lp, ids, B, torch.arange(bs))
        for f in F:
            assert torch.equal(getattr(tr, f), getattr(ref, f)), (gat, bs, L, V, B, f)
        n += 1
# exact score ties (integer logits: equal sums along different paths): the
# register path (running global top-B, ancestor mask by stores) == the memory path
for (bs, L, V, B) in [(2, 7, 40, 32), (2, 5, 20, 16)]:
    x = (torch.randn(bs, L, V, generator=g) * 3).round()
    lp, ids = top_log_probs(x, min(B, V))
    mem = tk.build_trees_from_top_triton(lp, ids, B, torch.arange(bs), gather=False)
    reg = tk.build_trees_from_top_triton(lp, ids, B, torch.arange(bs), gather=True)
    for f in F:
        assert torch.equal(getattr(reg, f), getattr(mem, f)), ("ties", bs, L, V, B, f)
    n += 1
print("OK", n)
"""

FUSED_DEFAULT = """
g = torch.Generator().manual_seed(0)
# v0 top-K + merge + tree in one launch (the last program of a row / of a
# request doing the next step), v2 with the compacted element sort (ecap; tiny
# V falls back to the full sort); == the same top-K followed by the tree
# kernel, counters back at 0
fused = [({"impl": "v0", "chunk": 256, "mpack32": True, "fuse": True, "tree": True}, torch.float32, (2, 2, 700, 16)),
         ({"impl": "v0", "chunk": 256, "mpack32": True, "fuse": True, "tree": True}, torch.bfloat16, (2, 2, 1000, 33)),
         ({"impl": "v2", "chunk": 256, "S": 16, "epack32": True, "hier": 4, "ecap": 64},
          torch.bfloat16, (2, 2, 700, 16)),
         ({"impl": "v2", "chunk": 256, "S": 16, "epack32": True, "ecap": 16}, torch.float16, (1, 2, 5, 8)),
         ({"impl": "v2", "chunk": 256, "S": 16, "epack32": True, "hier": 4, "ecap": 64},
          torch.bfloat16, (1, 2, 3000, 8))]
n = 0
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
    n += 1
# end to end, default configuration: the "small" one up to CONFIG["small_rows"]
# rows, the "large" one just above
regimes = set()
for (bs, L, V, B) in [(2, 3, 50, 8), (1, 1, 2, 1), (2, 2, 700, 16), (1, 3, 3, 5),
                      (tk.CONFIG["small_rows"] // 2 + 1, 2, 300, 8)]:
    regimes.add("large" if tk.regime_config(bs * L, V) is tk.CONFIG["large"] else "small")
    x = torch.randn(bs, L, V, generator=g)
    tr = build_trees(x, B, torch.arange(bs), impl="triton")
    for b in range(bs):
        assert tr.paths(b) == build_tree(x[b], B).paths(), (bs, L, V, B)
    assert tr.tokens[:, 0].tolist() == list(range(bs))
    n += 1
assert regimes == {"small", "large"}, regimes
print("OK", n)
"""

PARTS = {  # part: (code, printed count, CPU seconds (order of the jobs))
    "topk_v0": ("IMPL = 'v0'" + TOPK, 24, 11),
    "topk_v2": ("IMPL = 'v2'" + TOPK, 30, 9),
    "tree": (TREE, 12, 20),
    "fused_default": (FUSED_DEFAULT, 10, 22),
}


for _part, (_code, _n, _cost) in PARTS.items():
    interp_job(f"interp:{_part}", textwrap.dedent(PRELUDE + _code), cost=_cost)


@pytest.mark.parametrize("part", [pytest.param(p, marks=pytest.mark.subprocess_job(f"interp:{p}")) for p in PARTS])
def test_triton_kernels_in_interpreter(part):
    pytest.importorskip("triton")
    p = job_result(f"interp:{part}")
    assert p.returncode == 0 and p.stdout.strip().endswith(f"OK {PARTS[part][1]}"), p.stdout[-2000:] + p.stderr[-4000:]
