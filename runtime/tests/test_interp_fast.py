"""The interpreter shortcuts of ``interp_fast`` (used by every TRITON_INTERPRET
test here) give exactly what Triton's own interpreter code gives: xor_sum,
sort and top-K of a kernel (integers and floats, many exact ties, every axis,
keep_dims) and this project's top-K, fused top-K + tree, tree and shard-merge
kernels, with and without them (bit for bit: this also covers the skipped
re-patching of shortcut 3), and against torch; and the shortcut
``_patch_builtin`` patches the same names as the original, before and after
kernels have run.  (A Triton whose interpreter lacks what the shortcuts replace
fails here, once, instead of every interpreter test silently getting slower.)"""

import os
import textwrap

import pytest

from conftest import interp_job, job_result

CODE = r"""
import numpy as np
import torch
import triton
import triton.language as tl
import triton.runtime.interpreter as interp
import interp_fast


@triton.jit
def _k(x_ptr, xs0_ptr, xs1_ptr, xk_ptr, sort_ptr, top_ptr, N: tl.constexpr, M: tl.constexpr, INT: tl.constexpr):
    n = tl.arange(0, N)
    m = tl.arange(0, M)
    x = tl.load(x_ptr + n[:, None] * M + m[None, :])
    if INT:
        tl.store(xs0_ptr + m, tl.xor_sum(x, 0))
        tl.store(xs1_ptr + n, tl.xor_sum(x, 1))
        tl.store(xk_ptr + n[:, None] * M + m[None, :], tl.xor_sum(x, 1, keep_dims=True) + m[None, :] * 0)
    tl.store(sort_ptr + n[:, None] * M + m[None, :], tl.sort(x))
    tl.store(top_ptr + n[:, None] * 4 + tl.arange(0, 4)[None, :], tl.topk(x, 4))


def run(x):
    N, M = x.shape
    outs = [torch.zeros(M, dtype=x.dtype), torch.zeros(N, dtype=x.dtype), torch.zeros(N, M, dtype=x.dtype),
            torch.zeros(N, M, dtype=x.dtype), torch.zeros(N, 4, dtype=x.dtype)]
    _k[(1,)](x, *outs, N=N, M=M, INT=not x.dtype.is_floating_point)
    return outs


g = torch.Generator().manual_seed(0)
cases = []
for dt in (torch.int32, torch.int64, torch.int16):
    cases.append(torch.randint(-(1 << 14), 1 << 14, (2, 16), generator=g).to(dt))
cases.append(torch.randint(-2, 3, (4, 16), generator=g).to(torch.int32))  # exact ties
for dt in (torch.float32, torch.bfloat16, torch.float16):
    cases.append((torch.randn(2, 32, generator=g) * 3).round().to(dt))  # exact ties, both signs
cases.append(torch.randn(1, 64, generator=g))

# and this project's kernels: both top-K implementations, the fused top-K + tree
# launch, the tree kernel's register path, the shard merge + tree kernel
from sglang_ddtree import triton_kernels as tk
from sglang_ddtree.head import simulate_tp

xk = (torch.randn(1, 2, 64, generator=g) * 2).round().to(torch.bfloat16)  # ties; 2 chunks a row
W = torch.randint(-2, 3, (16, 8), generator=g).to(torch.bfloat16)
hid = torch.randint(-2, 3, (4, 8), generator=g).to(torch.bfloat16)


def ours():
    out = []
    for cfg in ({"impl": "v0", "chunk": 32, "mpack32": True, "fuse": True, "tree": True},
                {"impl": "v2", "chunk": 32, "S": 8, "epack32": True, "hier": 2, "ecap": 8}):
        tr, _ = tk.build_trees_triton(xk, 4, torch.arange(1), cfg=cfg)
        out += [tr.tokens, tr.parents, tr.visibility, *tk.topk_logsumexp(xk.float(), 4, cfg=cfg)]
    tr, _ = simulate_tp(W, 2, hid, torch.arange(4), budget=3, block_size=2, full_rows_max=1000)
    return out + [tr.tokens, tr.parents, tr.visibility]


assert interp_fast.install()
fast = [run(x) for x in cases]
fast_ours = ours()
interp_fast.uninstall()
assert not getattr(interp.ReduceOps.apply_impl, "_ddtree_fast", False)
ref = [run(x) for x in cases]
for a, b in zip(fast_ours, ours()):
    assert a.dtype == b.dtype and torch.equal(a, b)
for x, a, b in zip(cases, fast, ref):
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and torch.equal(u, v), (x.dtype, x.shape)
    if x.dtype != torch.bfloat16:  # (the interpreter compares bf16 by its raw bits: not torch's order)
        assert torch.equal(a[3], x.sort(-1).values), x.dtype
        assert torch.equal(a[4], x.sort(-1, descending=True).values[:, :4]), x.dtype
    if not x.dtype.is_floating_point:
        xn = x.numpy()
        assert (a[0].numpy() == np.bitwise_xor.reduce(xn, 0)).all()
        assert (a[1].numpy() == np.bitwise_xor.reduce(xn, 1)).all()
        assert torch.equal(a[2], a[1][:, None].expand_as(x))


# _patch_builtin: the same patched names as the original, on a fresh state and
# with the interpreter's leftovers of earlier kernels (builtins already patched)
def patched(fn):
    scope = interp._LangPatchScope()
    got = []
    for pkg in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        fn(pkg, interp.interpreter_builder, scope)
        got.append(sorted(n for o, n, _ in scope._changes if o is pkg))
    scope.restore()
    return got


orig = interp._patch_builtin
want = patched(orig)
assert sum(map(len, want)) > 100
interp_fast.install()
assert interp._patch_builtin is not orig
assert patched(interp._patch_builtin) == want
run(cases[0])  # leaves tl.core patched (the interpreter does)
want2 = patched(orig)
assert patched(interp._patch_builtin) == want2
print("OK", len(cases))
"""


OFF = os.environ.get("DDTREE_TEST_INTERP_FASTPATH") == "0"
if not OFF:
    interp_job("interp_fast", textwrap.dedent(CODE), timeout=600, cost=8)


@pytest.mark.subprocess_job("interp_fast")
def test_interp_fast_paths_are_exact():
    pytest.importorskip("triton")
    if OFF:
        pytest.skip("interpreter shortcuts switched off (DDTREE_TEST_INTERP_FASTPATH=0)")
    p = job_result("interp_fast")
    assert p.returncode == 0 and p.stdout.strip().endswith("OK 8"), p.stdout[-2000:] + p.stderr[-4000:]
