"""The decode step's fast draft head (``sglang_ddtree.head.DraftTreeHead``): LM-head
GEMM into logits, fused Triton top-K + logsumexp, (TP) all-gather of the shards'
top-K and exact merge, tree kernel.

* Triton's CPU interpreter (TRITON_INTERPRET=1, as test_triton_interpret.py):
  the head's trees are IDENTICAL (tokens, parents, depths, visibility, valid) to
  ``build_trees`` on the full logits, for TP 1 and a simulated TP 2-3 merge
  (every rank's shard computed on one device, ``LoopbackGroup`` for the
  all-gather), both launch configurations, the whole-block GEMM read in place
  and the copied rows, logits in several request chunks, shards smaller than
  K, budgets above the tree kernel's limit (torch beam), and logits full of
  exact ties (integer weights: positive and negative ties; the shards' merge
  must order them as one kernel over the whole row does), and every top-K
  configuration returns the first K in that order (ties included).  fp32 continuous
  logits: path sets == the heap reference.  The fused kernels' counters come
  back to zero.  The row gather for the GEMM equals the strided rows it replaces.
* torch (no Triton): the same head on the CPU path == ``build_trees`` on the
  logits (path sets), TP 1 and simulated TP.
The interpreter checks run as four subprocesses (background jobs: conftest.py),
with the interpreter shortcuts of interp_fast.py: the cases of TP 1, 2 and 3,
and the GEMM / shard merges / tie order / row gather checks.
The GPU run (timing, CUDA graph, exactness at V 20480 / 163840) is
runtime/bench/bench_head.py.
"""

import textwrap

import pytest
import torch

from conftest import interp_job, job_result

PRELUDE = r"""
import interp_fast
interp_fast.install()
import torch
from sglang_ddtree import build_trees
from sglang_ddtree import triton_kernels as tk
from sglang_ddtree.head import DraftTreeHead, LoopbackGroup, simulate_tp
from sglang_ddtree.reference import build_tree

g = torch.Generator().manual_seed(1)
F = ("tokens", "parents", "depths", "visibility", "valid")
SMALL = {"impl": "v0", "chunk": 256, "mpack32": True, "fuse": True, "tree": True}
LARGE = {"impl": "v2", "chunk": 256, "S": 16, "epack32": True, "hier": 4, "ecap": 64}
V0_NOFUSE = {"impl": "v0", "chunk": 128, "mpack32": False}
"""

# the head == build_trees on its logits; the cases of one TP degree per part
CASES = r"""
n = n_gemm = 0
# (bs, block, H, V, B, dtype, tp, cfg, full_rows_max, max_logits_bytes, ties)
cases = [
    (2, 4, 16, 700, 8, torch.bfloat16, 1, SMALL, 1000, None, True),
    (3, 4, 16, 700, 8, torch.bfloat16, 1, LARGE, 0, 2 * 3 * 700 * 2, True),  # 2-request chunks
    (2, 5, 8, 300, 16, torch.float32, 1, LARGE, 1000, None, False),
    (2, 3, 8, 500, 6, torch.float32, 1, V0_NOFUSE, 0, None, False),
    (2, 4, 16, 600, 8, torch.bfloat16, 2, SMALL, 1000, None, True),
    (2, 4, 16, 900, 12, torch.bfloat16, 3, LARGE, 0, 3 * 300 * 2, True),  # 1-request chunks
    (2, 3, 8, 30, 16, torch.bfloat16, 3, LARGE, 1000, None, True),  # shards of 10 < K = 16
    (1, 4, 8, 400, 8, torch.float32, 3, V0_NOFUSE, 0, None, False),
    (2, 3, 8, 200, 70, torch.float32, 1, LARGE, 1000, None, False),  # B > 64: torch beam
    (2, 3, 8, 200, 70, torch.bfloat16, 2, SMALL, 0, None, True),
    # the Triton GEMM (up to 64 rows; shard and H divisible by its blocks), TP 1 and 2
    (2, 4, 32, 512, 8, torch.bfloat16, 1, LARGE, 1000, None, False),
    (2, 4, 32, 1024, 12, torch.bfloat16, 2, SMALL, 1000, None, True),
]
for (bs, blk, H, V, B, dt, tp, cfg, frm, mlb, ties) in cases:
    if tp != TP:
        continue
    L = blk - 1
    if ties:  # integer logits in a small range: many exact ties, both signs
        hid = torch.randint(-2, 3, (bs, blk, H), generator=g).to(dt)
        W = torch.randint(-2, 3, (V, H), generator=g).to(dt)
    else:
        hid = torch.randn(bs, blk, H, generator=g).to(dt)
        W = torch.randn(V, H, generator=g).to(dt)
    ids = torch.randint(0, V, (bs, blk), generator=g)
    kw = dict(cfg=cfg, full_rows_max=frm, max_logits_bytes=mlb or (1 << 30))
    gemm = tk.head_gemm_config(bs * blk if frm else bs * L, V // tp, H, dt) is not None and V % tp == 0
    if tp == 1:
        h = DraftTreeHead(W, B, blk, max_bs=4, **kw)
        assert h.use_triton
        tr = h(hid.view(bs * blk, H), ids.view(-1))
        logits = (hid[:, 1:].reshape(-1, H) @ W.T).view(bs, L, V)
        if gemm:  # the head's own logits (the Triton GEMM sums in another order), close to torch's
            hl = h.logits(hid.view(bs * blk, H))
            assert (hl.float() - logits.float()).abs().max() <= 0.02 * logits.float().abs().max(), (bs, V, H)
            logits = hl
        if mlb:
            assert h.chunk_requests(bs)[1] < bs
        assert torch.equal(h.trees(bs).tokens, tr.tokens)
    else:
        tr, b = simulate_tp(W, tp, hid.view(bs * blk, H), ids.view(-1), budget=B, block_size=blk, **kw)
        logits = torch.cat([hid[:, 1:].reshape(-1, H) @ W[b[r]:b[r + 1]].T for r in range(tp)], -1).view(bs, L, V)
        if mlb:  # the request chunks of a rank's shard
            assert DraftTreeHead(W[:V // tp], B, blk, tp_group=LoopbackGroup(tp), vocab_size=V,
                                 **kw).chunk_requests(bs)[1] < bs
    ref = build_trees(logits, B, ids[:, 0], impl="triton")
    for f in F:
        assert torch.equal(getattr(tr, f), getattr(ref, f)), (bs, blk, V, B, dt, tp, cfg, f)
    if not ties and dt == torch.float32:
        for i in range(bs):
            assert tr.paths(i) == build_tree(logits[i], B).paths(), (bs, V, B, tp)
    assert int(tk._counters(W.device, 1).abs().sum()) == 0
    n += 1
    n_gemm += int(gemm)
assert n_gemm == (0 if TP == 3 else 1), n_gemm
print("OK", n)
"""

GEMM_MERGE_ORDER = r"""
n = 0
# the Triton GEMM alone against fp32 products (16-bit operands; one block of N and K
# halved to divide the shapes; fp32 and shapes no block divides -> cuBLAS / torch)
for (M, N, K, dt) in [(8, 512, 64, torch.bfloat16), (33, 256, 48, torch.float16), (64, 768, 128, torch.bfloat16)]:
    x = torch.randn(M, K, generator=g).to(dt)
    w = torch.randn(N, K, generator=g).to(dt)
    c = tk.head_gemm_config(M, N, K, dt)
    assert c is not None and N % c[1] == 0 and K % c[2] == 0, (M, N, K, c)
    got = tk.head_gemm(x, w, c)
    ref = x.float() @ w.float().T
    assert got.dtype == dt and got.shape == (M, N)
    assert ((got.float() - ref).abs() <= 0.01 * ref.abs() + 0.05).all(), (M, N, K, dt)
    n += 1
assert tk.head_gemm_config(8, 512, 64, torch.float32) is None
assert tk.head_gemm_config(128, 512, 64, torch.bfloat16) is None  # 128 rows and up: cuBLAS
assert tk.head_gemm_config(8, 500, 64, torch.bfloat16) is None
# the TP merge + tree kernel's two shard merges (a request's L rows in one top-K over an
# [L, TP * K] tile, the default, or row by row) build the same trees, ties included
# (L = 3: the tile padded to 4 rows)
for m2d in (False, True):
    tk.CONFIG["merge_rows_2d"] = m2d
    hid = torch.randint(-2, 3, (2, 4, 8), generator=g).to(torch.bfloat16)
    W = torch.randint(-2, 3, (40, 8), generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 40, (2, 4), generator=g)
    tr, b = simulate_tp(W, 3, hid.view(8, 8), ids.view(-1), budget=12, block_size=4, cfg=LARGE, full_rows_max=1000)
    logits = torch.cat([hid[:, 1:].reshape(-1, 8) @ W[b[r]:b[r + 1]].T for r in range(3)], -1).view(2, 3, 40)
    ref = build_trees(logits, 12, ids[:, 0], impl="triton")
    for f in F:
        assert torch.equal(getattr(tr, f), getattr(ref, f)), ("merge_rows_2d", m2d, f)
    n += 1
# every top-K configuration lists the first K by packed-key order: value, then for
# equal values the larger index first (v >= +0) / the smaller first (v < 0) -- the
# order that makes a merge of vocabulary shards agree with one kernel over the row
# (run 1 on the H200 found the two-level group choice ordering equal group maxima by
# super-group rank instead).  Rows of values in 0..3 (or -4..-1): hundreds of
# ties, several chunks (1024 values), more super-groups than K (2048 values with
# "hier").  Each configuration with both signs and both dtypes (pairwise:
# configuration x sign x dtype)
def canonical(x, K):
    out = []
    for r in range(x.shape[0]):
        v, neg = x[r].float().tolist(), torch.signbit(x[r].float()).tolist()
        out.append(sorted(range(x.shape[1]), key=lambda i: (-v[i], i if neg[i] else -i))[:K])
    return torch.tensor(out)
pairs = set()
for c, cfg in enumerate((LARGE, {"impl": "v2", "chunk": 256, "S": 16, "epack32": True}, SMALL, V0_NOFUSE,
                         {"impl": "v2", "chunk": 128, "S": 16, "hier": 2})):
    for j, sgn in enumerate((1, -1)):
        dt = (torch.bfloat16, torch.float32)[(c + j) % 2]
        pairs |= {("cs", c, sgn), ("cd", c, dt), ("sd", sgn, dt)}
        V = 2048 if cfg.get("hier") else 1024
        x = (torch.randint(0, 4, (2, V), generator=g) * sgn - int(sgn < 0)).to(torch.bfloat16).to(dt)
        lp = torch.empty(2, 16)
        ids = torch.empty(2, 16, dtype=torch.int64)
        tk.topk_rows(x, 2, 16, lp, ids, cfg=cfg)
        assert torch.equal(ids, canonical(x, 16)), (cfg, sgn, dt)
        n += 1
assert len(pairs) == 5 * 2 + 5 * 2 + 2 * 2, "not a pairwise covering"
# the GEMM input of batches above full_rows_max: rows 1..L of each block, gathered by
# one Triton launch (tk.gather_rows), equal to the strided view it replaces
for (bs, blk, H, c0, c1) in [(3, 4, 40, 0, 3), (3, 4, 40, 1, 3), (2, 8, 1100, 0, 2), (5, 2, 16, 2, 4)]:
    x = torch.randn(bs * blk, H, generator=g).to(torch.bfloat16)
    got = tk.gather_rows(x, c0, c1, blk)
    assert got.is_contiguous() and torch.equal(got, x.view(-1, blk, H)[c0:c1, 1:].reshape(-1, H)), (bs, blk, H, c0)
    n += 1
print("OK", n)
"""

PARTS = {  # part: (code, printed count, CPU seconds (order of the jobs))
    "tp1": ("TP = 1" + CASES, 6, 18),
    "tp2": ("TP = 2" + CASES, 3, 25),
    "tp3": ("TP = 3" + CASES, 3, 17),
    "gemm_merge_order": (GEMM_MERGE_ORDER, 19, 28),
}


for _part, (_code, _n, _cost) in PARTS.items():
    interp_job(f"head:{_part}", textwrap.dedent(PRELUDE + _code), cost=_cost)


@pytest.mark.parametrize("part", [pytest.param(p, marks=pytest.mark.subprocess_job(f"head:{p}")) for p in PARTS])
def test_head_in_triton_interpreter(part):
    pytest.importorskip("triton")
    p = job_result(f"head:{part}")
    assert p.returncode == 0 and p.stdout.strip().endswith(f"OK {PARTS[part][1]}"), p.stdout[-2000:] + p.stderr[-4000:]


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_head_torch_path(tp):
    from sglang_ddtree import build_trees
    from sglang_ddtree.head import DraftTreeHead, simulate_tp

    g = torch.Generator().manual_seed(tp)
    bs, blk, H, V, B = 3, 5, 16, 90, 12
    hid = torch.randn(bs * blk, H, generator=g)
    W = torch.randn(V, H, generator=g)
    root = torch.randint(0, V, (bs,), generator=g)
    for frm, mlb in ((1000, 1 << 30), (0, 4 * 90 * 4)):  # whole block / copied rows in 1-request chunks
        if tp == 1:
            h = DraftTreeHead(W, B, blk, impl="torch", full_rows_max=frm, max_logits_bytes=mlb)
            assert not h.use_triton
            tr = h(hid, root_tokens=root)
            b = [0, V]
        else:
            tr, b = simulate_tp(W, tp, hid, root_tokens=root, budget=B, block_size=blk, impl="torch",
                                full_rows_max=frm, max_logits_bytes=mlb)
        logits = torch.cat([hid.view(bs, blk, H)[:, 1:] @ W[b[r]:b[r + 1]].T for r in range(len(b) - 1)], -1)
        ref = build_trees(logits, B, root, impl="torch")
        assert torch.equal(tr.tokens[:, 0], root)
        for i in range(bs):
            assert tr.paths(i) == ref.paths(i)
