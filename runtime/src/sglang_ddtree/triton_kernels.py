"""Fused Triton kernels for DDTree construction (GPU path).

1. ``topk_logsumexp(x[bs, L, V], K)``: one pass over the logits.
   Stage 1, grid (rows, chunks): each program loads a CHUNK of one row once,
   computes the chunk's max and sum(exp(x - max)) (for the logsumexp), and the
   chunk's exact top-KP: the top-KP groups by group maximum contain every
   top-KP element, so only KP*S candidates (re-read from L1/L2) go through a
   bitonic top-k.  Values are packed with their index into the low mantissa
   bits of a wider float (bf16/fp16 -> fp32, fp32 -> fp64), which keeps the
   order of distinct values, so one ``tl.topk`` carries values and indices.
   Stage 2, one program per row: merge the chunks' (max, sum) into the row's
   logsumexp and the chunks' candidates into the row's top-K, and write
   ``top_lp = top_logit - logsumexp`` (float32) and the token ids.
2. ``build_trees_from_top_triton``: one program per request does the beam over
   depths (float64 scores, top-B of the B x K candidate rectangle per depth),
   the global top-B with a shallower-first tie-break, the depth-major ordering,
   parent / token / depth assembly and the ancestor mask.  Supported for
   B <= 64 and L <= 16 (the rectangle must fit one program); larger budgets use
   the torch beam (``tree.build_trees_from_top``) after the same stage-1/2 top-K.

No host synchronisation, static shapes: safe inside CUDA-graph capture.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .tree import DEPTH_EPS, DDTrees



def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@triton.jit
def _pack32(v, idx, BITS: tl.constexpr):
    b = v.to(tl.int32, bitcast=True)
    b = (b & (-(1 << BITS))) | idx.to(tl.int32)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _unpack32(k, BITS: tl.constexpr):
    b = k.to(tl.int32, bitcast=True)
    return (b & (-(1 << BITS))).to(tl.float32, bitcast=True), b & ((1 << BITS) - 1)


@triton.jit
def _pack64(v, idx, BITS: tl.constexpr):
    b = v.to(tl.float64).to(tl.int64, bitcast=True)
    b = (b & (-(1 << BITS))) | idx.to(tl.int64)
    return b.to(tl.float64, bitcast=True)


@triton.jit
def _unpack64(k, BITS: tl.constexpr):
    b = k.to(tl.int64, bitcast=True)
    return (b & (-(1 << BITS))).to(tl.float64, bitcast=True), (b & ((1 << BITS) - 1)).to(tl.int32)


@triton.jit
def _topk_chunk_kernel(
    x_ptr, stride_row, V, NCHUNK,
    val_ptr, idx_ptr, m_ptr, s_ptr, scr_ptr,
    CHUNK: tl.constexpr, G: tl.constexpr, S: tl.constexpr, KP: tl.constexpr,
    TG: tl.constexpr, CAP: tl.constexpr,
    PACK64: tl.constexpr, BITS: tl.constexpr, EVEN: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    base = x_ptr + row.to(tl.int64) * stride_row
    start = c * CHUNK
    loc = tl.arange(0, CHUNK)
    offs = start + loc
    if EVEN:
        x = tl.load(base + offs).to(tl.float32)
        xk = tl.maximum(x, -3.0e38)
    else:
        msk = offs < V
        x = tl.load(base + offs, mask=msk, other=float("-inf")).to(tl.float32)
        xk = tl.where(msk, tl.maximum(x, -3.0e38), -3.3e38)
    # TG strided groups (element e -> group e % TG): their maxima give both the
    # chunk max and a lower bound t on the chunk's KP-th largest value (the
    # KP-th largest group maximum: KP distinct elements are >= it).
    gm = tl.max(tl.reshape(xk, [CHUNK // TG, TG]), 0)
    m = tl.max(gm, 0)
    s = tl.sum(tl.exp(xk - m), 0)
    out = row * NCHUNK + c
    tl.store(m_ptr + out, m)
    tl.store(s_ptr + out, s)
    t = tl.min(tl.topk(gm, KP), 0)
    sel = xk >= t
    seli = sel.to(tl.int32)
    cnt = tl.sum(seli, 0)
    k = tl.arange(0, KP)
    if cnt <= CAP:
        # usual case: compact the few candidates (>= t) and top-KP them
        pos = tl.cumsum(seli, 0) - 1
        scr = scr_ptr + out.to(tl.int64) * CAP
        if PACK64:
            tl.store(scr + pos, _pack64(xk, loc, BITS), mask=sel)
        else:
            tl.store(scr + pos, _pack32(xk, loc, BITS), mask=sel)
        tl.debug_barrier()
        p = tl.arange(0, CAP)
        if PACK64:
            y = tl.load(scr + p, mask=p < cnt, other=-1.0e300)
            val, li = _unpack64(tl.topk(y, KP), BITS)
        else:
            y = tl.load(scr + p, mask=p < cnt, other=-3.4e38)
            val, li = _unpack32(tl.topk(y, KP), BITS)
        tl.store(val_ptr + out * KP + k, val.to(tl.float32))
        tl.store(idx_ptr + out * KP + k, start + li)
    else:
        # rare (adversarial / many ties): exact group-maxima selection
        g = tl.max(tl.reshape(xk, [G, S]), 1)  # [G] contiguous-group maxima
        gi = tl.arange(0, G)
        if PACK64:
            tg = tl.topk(_pack64(g, gi, BITS), KP)
            _, gid = _unpack64(tg, BITS)
        else:
            tg = tl.topk(_pack32(g, gi, BITS), KP)
            _, gid = _unpack32(tg, BITS)
        coffs = gid[:, None] * S + tl.arange(0, S)[None, :]  # [KP, S] chunk-local
        cm = (start + coffs) < V
        y2 = tl.load(base + start + coffs, mask=cm, other=float("-inf")).to(tl.float32)
        yk = tl.where(cm, tl.maximum(y2, -3.0e38), -3.3e38)
        if PACK64:
            t2 = tl.topk(tl.reshape(_pack64(yk, coffs, BITS), [KP * S]), KP)
            val2, li2 = _unpack64(t2, BITS)
        else:
            t2 = tl.topk(tl.reshape(_pack32(yk, coffs, BITS), [KP * S]), KP)
            val2, li2 = _unpack32(t2, BITS)
        tl.store(val_ptr + out * KP + k, val2.to(tl.float32))
        tl.store(idx_ptr + out * KP + k, start + li2)


@triton.jit
def _topk_merge_kernel(
    val_ptr, idx_ptr, m_ptr, s_ptr, lp_ptr, id_ptr, NCHUNK, K,
    NCP: tl.constexpr, KP: tl.constexpr, BITS: tl.constexpr, PACK64: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.arange(0, NCP)
    cm = c < NCHUNK
    m = tl.load(m_ptr + row * NCHUNK + c, mask=cm, other=float("-inf"))
    s = tl.load(s_ptr + row * NCHUNK + c, mask=cm, other=0.0)
    M = tl.max(m, 0)
    M_safe = tl.where(M == float("-inf"), 0.0, M)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    tot = tl.sum(tl.where(cm, s * tl.exp(m_safe - M_safe), 0.0), 0)
    lse = M_safe + tl.log(tot)
    p = tl.arange(0, NCP * KP)
    pm = p < NCHUNK * KP
    if PACK64:
        v = tl.load(val_ptr + row * NCHUNK * KP + p, mask=pm, other=-3.3e38)
        val, pos = _unpack64(tl.topk(_pack64(v, p, BITS), KP), BITS)
    else:
        # values are exact 16-bit floats in float32: the low bits carry the position
        v = tl.load(val_ptr + row * NCHUNK * KP + p, mask=pm, other=-3.3e38)
        val, pos = _unpack32(tl.topk(_pack32(v, p, BITS), KP), BITS)
    ids = tl.load(idx_ptr + row * NCHUNK * KP + pos)
    k = tl.arange(0, KP)
    km = k < K
    tl.store(lp_ptr + row * K + k, val.to(tl.float32) - lse, mask=km)
    tl.store(id_ptr + row * K + k, ids.to(tl.int64), mask=km)


# Launch configuration; bench/ may override entries (sweeps).
CONFIG = {
    "chunk": 8192,        # logits per stage-1 program (power of 2)
    "chunk_warps": 8,
    "merge_warps": None,  # None: by size
    "tree_warps": None,   # None: by size
}


def _chunk_params(V: int, KP: int, chunk: int):
    CHUNK = min(chunk, _next_pow2(V))
    TG = 4 * KP
    CHUNK = max(CHUNK, TG)
    G = max(KP, min(512, CHUNK))
    S = CHUNK // G
    CAP = 2 * KP
    return CHUNK, G, S, TG, CAP


def topk_logsumexp(x: torch.Tensor, K: int, chunk=None, chunk_warps=None, merge_warps=None):
    """``(top_lp[bs, L, K] float32, top_id[bs, L, K] int64)`` in one pass over ``x``."""
    bs, L, V = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    x2 = x.reshape(bs * L, V)
    rows = bs * L
    KP = max(2, _next_pow2(K))
    chunk = int(chunk or CONFIG["chunk"])
    if x.dtype == torch.float16:
        chunk = min(chunk, 8192)
    CHUNK, G, S, TG, CAP = _chunk_params(V, KP, chunk)
    NCHUNK = triton.cdiv(V, CHUNK)
    if x.dtype == torch.bfloat16:
        pack64, bits = False, 16
    elif x.dtype == torch.float16:
        pack64, bits = False, 13
    else:
        pack64, bits = True, 29
        if x.dtype != torch.float32:
            x2 = x2.float()
    assert CHUNK <= (1 << bits)
    NCP = _next_pow2(NCHUNK)
    # merge: 16-bit inputs pack the candidate position into float32's 16 low bits
    m_pack64 = pack64 or NCP * KP > (1 << 16)
    m_bits = 29 if m_pack64 else 16
    assert NCP * KP <= (1 << m_bits)
    dev = x.device
    vals = torch.empty((rows, NCHUNK, KP), dtype=torch.float32, device=dev)
    idxs = torch.empty((rows, NCHUNK, KP), dtype=torch.int32, device=dev)
    ms = torch.empty((rows, NCHUNK), dtype=torch.float32, device=dev)
    ss = torch.empty((rows, NCHUNK), dtype=torch.float32, device=dev)
    scr = torch.empty((rows * NCHUNK * CAP,), dtype=torch.float64 if pack64 else torch.float32, device=dev)
    nw1 = chunk_warps or CONFIG["chunk_warps"]
    nw1 = max(1, min(nw1, CHUNK // 256))
    _topk_chunk_kernel[(rows, NCHUNK)](
        x2, x2.stride(0), V, NCHUNK, vals, idxs, ms, ss, scr,
        CHUNK=CHUNK, G=G, S=S, KP=KP, TG=TG, CAP=CAP, PACK64=pack64, BITS=bits,
        EVEN=(V % CHUNK == 0), num_warps=nw1,
    )
    top_lp = torch.empty((bs, L, K), dtype=torch.float32, device=dev)
    top_id = torch.empty((bs, L, K), dtype=torch.int64, device=dev)
    n2 = NCP * KP
    nw2 = merge_warps or CONFIG["merge_warps"] or (4 if n2 <= 2048 else (8 if n2 <= 8192 else 16))
    _topk_merge_kernel[(rows,)](
        vals, idxs, ms, ss, top_lp, top_id, NCHUNK, K,
        NCP=NCP, KP=KP, BITS=m_bits, PACK64=m_pack64, num_warps=nw2,
    )
    return top_lp, top_id


@triton.jit
def _tree_kernel(
    lp_ptr, id_ptr, root_ptr,
    sc_ptr, ps_ptr, rk_ptr, pos_ptr,
    tok_ptr, par_ptr, dep_ptr, val_ptr, vis_ptr,
    HAS_ROOT: tl.constexpr, L: tl.constexpr, K: tl.constexpr, B: tl.constexpr,
    LP: tl.constexpr, BP: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr,
    EPS: tl.constexpr,
):
    b = tl.program_id(0)
    lpb = lp_ptr + b * (L * K)
    sc = sc_ptr + b * (LP * BP)
    ps = ps_ptr + b * (LP * BP)
    rk = rk_ptr + b * (LP * BP)
    pos = pos_ptr + b * (LP * BP)
    bb = tl.arange(0, BP)
    kk = tl.arange(0, KP)

    # depth 1 (index 0): the top-K tokens themselves
    negb = tl.full([BP], -1.0e30, tl.float64)
    negk = tl.full([KP], -1.0e30, tl.float64)
    beam = tl.load(lpb + bb, mask=bb < K, other=0.0).to(tl.float64)
    beam = tl.where(bb < K, beam, negb)
    tl.store(sc + bb, beam)
    tl.store(ps + bb, tl.zeros([BP], dtype=tl.int32))
    tl.store(rk + bb, bb)
    for d in range(1, L):
        lpd = tl.load(lpb + d * K + kk, mask=kk < K, other=0.0).to(tl.float64)
        lpd = tl.where(kk < K, lpd, negk)
        cand = beam[:, None] + lpd[None, :]
        flat = bb[:, None] * KP + kk[None, :]
        t = tl.topk(tl.reshape(_pack64(cand, flat, 12), [BP * KP]), BP)
        s, j = _unpack64(t, 12)
        s = tl.where(bb < B, s, negb)
        tl.store(sc + d * BP + bb, s)
        tl.store(ps + d * BP + bb, j // KP)
        tl.store(rk + d * BP + bb, j % KP)
        beam = s
    tl.debug_barrier()

    # global top-B over all depths (shallower first on ties), depth-major order
    ll = tl.arange(0, LP)
    fl = ll[:, None] * BP + bb[None, :]
    lm = (ll[:, None] < L) & (bb[None, :] < BP)
    sall = tl.load(sc + fl, mask=lm, other=0.0)
    sall = tl.where(lm, sall, tl.full([LP, BP], -1.0e30, tl.float64))
    key = sall - EPS * ll[:, None].to(tl.float64)
    t = tl.topk(tl.reshape(_pack64(key, fl, 12), [LP * BP]), BP)
    sv, f = _unpack64(t, 12)
    ok = (bb < B) & (sv > -1.0e29)
    fs = tl.sort(tl.where(ok, f, 1048576))
    nv = fs < 1048576
    fc = tl.where(nv, fs, 0)
    di = fc // BP
    tl.store(pos + fc, bb + 1, mask=nv)
    tl.debug_barrier()
    psl = tl.load(ps + fc, mask=nv, other=0)
    rkl = tl.load(rk + fc, mask=nv, other=0)
    pnode = tl.load(pos + (di - 1) * BP + psl, mask=nv & (di > 0), other=0)
    pnode = tl.where(di == 0, 0, pnode)
    tok = tl.load(id_ptr + b * (L * K) + di * K + rkl, mask=nv, other=0)

    ob = b * (B + 1)
    om = bb < B
    tl.store(tok_ptr + ob + 1 + bb, tl.where(nv, tok, 0).to(tl.int64), mask=om)
    tl.store(par_ptr + ob + 1 + bb, tl.where(nv, pnode, -1).to(tl.int64), mask=om)
    tl.store(dep_ptr + ob + 1 + bb, tl.where(nv, di + 1, 0).to(tl.int64), mask=om)
    tl.store(val_ptr + ob + 1 + bb, nv.to(tl.int8), mask=om)
    if HAS_ROOT:
        root = tl.load(root_ptr + b).to(tl.int64)
    else:
        root = tl.zeros([], dtype=tl.int64)
    tl.store(tok_ptr + ob, root)
    tl.store(par_ptr + ob, tl.full([], -1, tl.int64))
    tl.store(dep_ptr + ob, tl.zeros([], dtype=tl.int64))
    tl.store(val_ptr + ob, tl.full([], 1, tl.int8))
    tl.debug_barrier()

    # ancestor mask: walk up at most L steps from every node
    ii = tl.arange(0, NP)
    im = ii < (B + 1)
    alive = im & (tl.load(val_ptr + ob + ii, mask=im, other=0) != 0)
    cur = ii
    vis = tl.zeros([NP, NP], dtype=tl.int1)
    for _ in range(L + 1):
        vis = vis | ((ii[None, :] == cur[:, None]) & alive[:, None])
        nxt = tl.load(par_ptr + ob + cur, mask=alive, other=-1).to(tl.int32)
        alive = alive & (nxt >= 0)
        cur = tl.where(alive, nxt, 0)
    vm = im[:, None] & im[None, :]
    tl.store(vis_ptr + b * ((B + 1) * (B + 1)) + ii[:, None] * (B + 1) + ii[None, :], vis.to(tl.int8), mask=vm)


def tree_kernel_supported(L: int, B: int, K: int) -> bool:
    BP = _next_pow2(B)
    KP = max(2, _next_pow2(K))
    LP = _next_pow2(L)
    return L <= 16 and B <= 64 and BP * KP <= 4096 and LP * BP <= 4096


def build_trees_from_top_triton(top_lp, top_id, budget, root_tokens=None) -> DDTrees:
    bs, L, K = top_lp.shape
    B = int(budget)
    N = B + 1
    BP = max(2, _next_pow2(B))
    KP = max(2, _next_pow2(K))
    LP = max(2, _next_pow2(L))
    NP = _next_pow2(N)
    dev = top_lp.device
    top_lp = top_lp.contiguous()
    top_id = top_id.contiguous()
    sc = torch.empty((bs, LP * BP), dtype=torch.float64, device=dev)
    ps = torch.empty((bs, LP * BP), dtype=torch.int32, device=dev)
    rk = torch.empty((bs, LP * BP), dtype=torch.int32, device=dev)
    pos = torch.empty((bs, LP * BP), dtype=torch.int32, device=dev)
    tokens = torch.empty((bs, N), dtype=torch.int64, device=dev)
    parents = torch.empty((bs, N), dtype=torch.int64, device=dev)
    depths = torch.empty((bs, N), dtype=torch.int64, device=dev)
    valid = torch.empty((bs, N), dtype=torch.int8, device=dev)
    vis = torch.empty((bs, N, N), dtype=torch.int8, device=dev)
    has_root = root_tokens is not None
    root = root_tokens.to(device=dev, dtype=torch.int64).contiguous() if has_root else tokens
    nw = 4 if BP * KP <= 1024 and NP <= 64 else 8
    _tree_kernel[(bs,)](
        top_lp, top_id, root, sc, ps, rk, pos, tokens, parents, depths, valid, vis,
        HAS_ROOT=has_root, L=L, K=K, B=B, LP=LP, BP=BP, KP=KP, NP=NP, EPS=DEPTH_EPS,
        num_warps=nw,
    )
    return DDTrees(tokens, parents, depths, vis.view(torch.bool), valid.view(torch.bool))
