"""Fused Triton kernels for DDTree construction (GPU path).

1. ``topk_logsumexp(x[bs, L, V], K)``: top-K log-probabilities and token ids
   per row, reading the logits once.  Two implementations, picked by the number
   of rows (``CONFIG``):
   * v0 (few rows, latency): grid (rows, V/CHUNK chunks); each program reads its
     chunk once: max and sum(exp) for the logsumexp, group maxima, the top-K
     groups, then a bitonic ``tl.topk`` over only those groups' elements.  The
     per-row merge of the chunks' top-K runs in the last chunk program of the
     row to finish (``fuse``: an atomic per-row counter, reset to zero by that
     program) or in a second kernel; for 16-bit inputs its keys are fp32.
   * v2 (many rows, throughput): ``_groupmax_kernel`` streams the logits with
     no sorting at all (per chunk: max, sum(exp), maxima of contiguous groups
     of S = 64); ``_group_select_kernel`` (one program per row) combines the
     logsumexp, takes the top-K groups by group maximum in two levels (top-K
     super-groups of ``hier`` groups, then the top-K of their groups; the
     row's top-K elements lie in them) and the top-K of those K*S re-read
     logits (fp32 keys for 16-bit inputs).
   Values carry their index (or a position in a small candidate list) in the
   low mantissa bits of a float (bf16/fp16 -> fp32, fp32 -> fp64), which keeps
   the order of distinct values, so one ``tl.topk`` carries values and indices.
2. ``build_trees_from_top_triton``: one program per request does the beam over
   depths (float64 scores), the global top-B with a shallower-first tie-break,
   the depth-major ordering, parent / token / depth assembly and the ancestor
   mask.  The beam only looks at candidates (i, j) with (i+1)(j+1) <= B (the
   others are beaten by B candidates: ~B ln B instead of B*K), and with
   ``tree_gather`` it loads every depth's top-K once, up front, and works in
   registers (``tl.gather``; parents by counting the selected entries before
   them) instead of round trips through memory.  Supported for
   B <= 64 and L <= 16; larger budgets use the torch beam
   (``tree.build_trees_from_top``) after the same Triton top-K.

No host synchronisation, static shapes: safe inside CUDA-graph capture.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from .ddtrees import DEPTH_EPS, DDTrees



def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@triton.jit
def _pdl_start(PDL: tl.constexpr, EARLY):
    # programmatic dependent launch (PDL): (EARLY != 0) let the next kernel of
    # the stream launch now (its programs wait in turn), then wait until the
    # previous kernel has completed and its writes are visible -- the launch
    # and the start of each kernel overlap the one before instead of following
    # it.  EARLY is a runtime value (one compiled kernel for both): with
    # EARLY = 0 the next kernel launches only as this one's programs exit (the
    # implicit trigger), so its programs never wait on SMs this kernel wants
    if PDL:
        if EARLY != 0:
            tl_cuda.gdc_launch_dependents()
        tl_cuda.gdc_wait()


def _pdl_args(pdl: bool, early=None) -> dict:
    """Launch keywords of a kernel with ``PDL`` / ``EARLY`` parameters: launched
    with PDL (``pdl``), dependents triggered at its start (``early``, default
    ``pdl``)."""
    if not pdl:
        return {"PDL": False, "EARLY": 0}
    return {"PDL": True, "launch_pdl": True, "EARLY": int(bool(pdl if early is None else early))}


# Arguments the kernels are NOT specialised on (Triton specialises an integer
# on == 1 and on divisibility by 16, a pointer on 16-byte alignment): values
# that change with the batch size, the request chunk, the TP rank or the call
# site (the row map, a chunk's first row, the vocabulary offset, the rows of
# the gathered TP buffer, the root's stride, the PDL trigger) and pointers into
# the static outputs at a chunk's first request.  One compiled kernel then
# serves every batch size of a launch class (aot.py counts them).
_NOSPEC_ROWS = ["RL", "RB", "RO", "id_off", "EARLY"]
_NOSPEC_TREE = ["RS", "EARLY"]
_NOALIGN_TREE = ["root_ptr", "tok_ptr", "par_ptr", "dep_ptr", "val_ptr", "tval_ptr", "vis_ptr", "lse_ptr"]


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
def _xrow(row, RL, RB, RO):
    # output row -> logits row: request row // RL, its row RO + row % RL of RB
    # (RL = RB = 1, RO = 0: the identity; the head maps block rows 1..L of
    # [bs * block, V] logits without copying them)
    return (row // RL) * RB + RO + row % RL


@triton.jit(do_not_specialize=_NOSPEC_ROWS + _NOSPEC_TREE,
            do_not_specialize_on_alignment=[n for n in _NOALIGN_TREE if n != "val_ptr"])
def _topk_chunk_kernel(
    x_ptr, stride_row, V, NCHUNK, RL, RB, RO,
    val_ptr, idx_ptr, m_ptr, s_ptr,
    cnt_ptr, lp_ptr, id_ptr, K, lse_ptr, id_off,
    rcnt_ptr, root_ptr, sc_ptr, ps_ptr, rk_ptr, pos_ptr, tok_ptr, par_ptr, dep_ptr, tval_ptr, vis_ptr,
    CHUNK: tl.constexpr, G: tl.constexpr, S: tl.constexpr, KP: tl.constexpr,
    PACK64: tl.constexpr, BITS: tl.constexpr,
    FUSE: tl.constexpr, NCP: tl.constexpr, MPACK32: tl.constexpr, MBITS: tl.constexpr,
    TREE: tl.constexpr, HAS_ROOT: tl.constexpr, TL: tl.constexpr, TK: tl.constexpr, TB: tl.constexpr,
    LP: tl.constexpr, BP: tl.constexpr, TKP: tl.constexpr, NP: tl.constexpr, CP: tl.constexpr,
    EPS: tl.constexpr, GATHER: tl.constexpr, RS, RAW: tl.constexpr, PDL: tl.constexpr, EARLY,
):
    _pdl_start(PDL, EARLY)
    row = tl.program_id(0)
    c = tl.program_id(1)
    base = x_ptr + _xrow(row, RL, RB, RO).to(tl.int64) * stride_row
    start = c * CHUNK
    offs = start + tl.arange(0, CHUNK)
    msk = offs < V
    x = tl.load(base + offs, mask=msk, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp(x - m_safe), 0)
    out = row * NCHUNK + c
    tl.store(m_ptr + out, m)
    tl.store(s_ptr + out, s)

    xk = tl.where(msk, tl.maximum(x, -3.0e38), -3.3e38)
    g = tl.max(tl.reshape(xk, [G, S]), 1)  # [G] group maxima
    gi = tl.arange(0, G)
    if PACK64:
        tg = tl.topk(_pack64(g, gi, BITS), KP)
        _, gid = _unpack64(tg, BITS)
    else:
        tg = tl.topk(_pack32(g, gi, BITS), KP)
        _, gid = _unpack32(tg, BITS)
    coffs = gid[:, None] * S + tl.arange(0, S)[None, :]  # [KP, S] chunk-local
    cm = (start + coffs) < V
    y = tl.load(base + start + coffs, mask=cm, other=float("-inf")).to(tl.float32)
    yk = tl.where(cm, tl.maximum(y, -3.0e38), -3.3e38)
    if PACK64:
        t = tl.topk(tl.reshape(_pack64(yk, coffs, BITS), [KP * S]), KP)
        val, li = _unpack64(t, BITS)
    else:
        t = tl.topk(tl.reshape(_pack32(yk, coffs, BITS), [KP * S]), KP)
        val, li = _unpack32(t, BITS)
    k = tl.arange(0, KP)
    tl.store(val_ptr + out * KP + k, val.to(tl.float32))
    tl.store(idx_ptr + out * KP + k, start + li)
    if FUSE:
        # the last program of the row to finish merges the row's chunks (one
        # launch less); the counter is left at 0 for the next call
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel")
        if done == NCHUNK - 1:
            _merge_row(val_ptr, idx_ptr, m_ptr, s_ptr, lp_ptr, id_ptr, row, NCHUNK, K, lse_ptr, id_off,
                       NCP, KP, MPACK32, MBITS, True, RAW)
            tl.atomic_xchg(cnt_ptr + row, 0, sem="relaxed")
            if TREE:
                # ... and the last row of the request to be merged builds its tree
                _tree_after_rows(row // TL, rcnt_ptr, lp_ptr, id_ptr, root_ptr, sc_ptr, ps_ptr, rk_ptr,
                                 pos_ptr, tok_ptr, par_ptr, dep_ptr, tval_ptr, vis_ptr,
                                 HAS_ROOT, TL, TK, TB, LP, BP, TKP, NP, CP, EPS, GATHER, RS)


@triton.jit
def _tree_after_rows(req, rcnt_ptr, lp_ptr, id_ptr, root_ptr, sc_ptr, ps_ptr, rk_ptr,
                     pos_ptr, tok_ptr, par_ptr, dep_ptr, tval_ptr, vis_ptr,
                     HAS_ROOT: tl.constexpr, TL: tl.constexpr, TK: tl.constexpr, TB: tl.constexpr,
                     LP: tl.constexpr, BP: tl.constexpr, TKP: tl.constexpr, NP: tl.constexpr,
                     CP: tl.constexpr, EPS: tl.constexpr, GATHER: tl.constexpr, RS):
    # called by the program that finished one row of request ``req``: the
    # last of the request's TL rows builds the tree (per-request counter,
    # reset to zero by that program)
    tl.debug_barrier()
    rdone = tl.atomic_add(rcnt_ptr + req, 1, sem="acq_rel")
    if rdone == TL - 1:
        _tree_body(req, lp_ptr, id_ptr, root_ptr, sc_ptr, ps_ptr, rk_ptr, pos_ptr,
                   tok_ptr, par_ptr, dep_ptr, tval_ptr, vis_ptr,
                   HAS_ROOT, TL, TK, TB, LP, BP, TKP, NP, CP, EPS, GATHER, RS)
        tl.atomic_xchg(rcnt_ptr + req, 0, sem="relaxed")


@triton.jit
def _merge_row(val_ptr, idx_ptr, m_ptr, s_ptr, lp_ptr, id_ptr, row, NCHUNK, K, lse_ptr, id_off,
               NCP: tl.constexpr, KP: tl.constexpr, MPACK32: tl.constexpr, MBITS: tl.constexpr,
               CG: tl.constexpr, RAW: tl.constexpr):
    c = tl.arange(0, NCP)
    cm = c < NCHUNK
    if CG:
        m = tl.load(m_ptr + row * NCHUNK + c, mask=cm, other=float("-inf"), cache_modifier=".cg")
        s = tl.load(s_ptr + row * NCHUNK + c, mask=cm, other=0.0, cache_modifier=".cg")
    else:
        m = tl.load(m_ptr + row * NCHUNK + c, mask=cm, other=float("-inf"))
        s = tl.load(s_ptr + row * NCHUNK + c, mask=cm, other=0.0)
    M = tl.max(m, 0)
    M_safe = tl.where(M == float("-inf"), 0.0, M)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    tot = tl.sum(tl.where(cm, s * tl.exp(m_safe - M_safe), 0.0), 0)
    lse = M_safe + tl.log(tot)
    p = tl.arange(0, NCP * KP)
    pm = p < NCHUNK * KP
    if CG:
        v = tl.load(val_ptr + row * NCHUNK * KP + p, mask=pm, other=-3.3e38, cache_modifier=".cg")
    else:
        v = tl.load(val_ptr + row * NCHUNK * KP + p, mask=pm, other=-3.3e38)
    # Key position: chunk-major; within a chunk's list reversed for
    # non-negative values (sign bit clear).  Packed keys order equal values by
    # index, larger index first for v >= +0 and smaller first below (the low
    # mantissa bits grow the magnitude); a chunk's list is in that order, and
    # so is the merged row: the same top-K and order as v2 and as a merge of
    # vocabulary shards (head.py), ties included.
    kq = p % KP
    negv = v.to(tl.int32, bitcast=True) < 0
    rq = tl.where(negv, p, p - kq + (KP - 1 - kq))
    if MPACK32:  # 16-bit inputs: the chunk values are exact in fp32's high bits
        val, q = _unpack32(tl.topk(_pack32(v, rq, MBITS), KP), MBITS)
    else:
        val, q = _unpack64(tl.topk(_pack64(v, rq, 29), KP), 29)
    kq2 = q % KP
    pos = tl.where(val.to(tl.float32).to(tl.int32, bitcast=True) < 0, q, q - kq2 + (KP - 1 - kq2))
    if CG:
        ids = tl.load(idx_ptr + row * NCHUNK * KP + pos, cache_modifier=".cg")
    else:
        ids = tl.load(idx_ptr + row * NCHUNK * KP + pos)
    k = tl.arange(0, KP)
    _store_top(lp_ptr, id_ptr, lse_ptr, row, K, k, val, ids, lse, id_off, RAW)


@triton.jit
def _store_top(lp_ptr, id_ptr, lse_ptr, row, K, k, val, ids, lse, id_off, RAW: tl.constexpr):
    # log-probabilities (value - lse), or (RAW, one vocab shard of the head)
    # the raw values, the ids + id_off and the row's lse
    km = k < K
    if RAW:
        tl.store(lp_ptr + row * K + k, val.to(tl.float32), mask=km)
        tl.store(id_ptr + row * K + k, ids + id_off, mask=km)
        tl.store(lse_ptr + row, lse)
    else:
        tl.store(lp_ptr + row * K + k, val.to(tl.float32) - lse, mask=km)
        tl.store(id_ptr + row * K + k, ids.to(tl.int64), mask=km)


@triton.jit(do_not_specialize=_NOSPEC_ROWS, do_not_specialize_on_alignment=["lse_ptr"])
def _topk_merge_kernel(
    val_ptr, idx_ptr, m_ptr, s_ptr, lp_ptr, id_ptr, NCHUNK, K, lse_ptr, id_off,
    NCP: tl.constexpr, KP: tl.constexpr, MPACK32: tl.constexpr, MBITS: tl.constexpr, RAW: tl.constexpr,
    PDL: tl.constexpr, EARLY,
):
    _pdl_start(PDL, EARLY)
    _merge_row(val_ptr, idx_ptr, m_ptr, s_ptr, lp_ptr, id_ptr, tl.program_id(0), NCHUNK, K, lse_ptr, id_off,
               NCP, KP, MPACK32, MBITS, False, RAW)


@triton.jit(do_not_specialize=_NOSPEC_ROWS)
def _groupmax_kernel(
    x_ptr, stride_row, V, NCHUNK, NGP, RL, RB, RO,
    gm_ptr, m_ptr, s_ptr,
    CHUNK: tl.constexpr, S: tl.constexpr, EVEN: tl.constexpr, LOAD2D: tl.constexpr, PDL: tl.constexpr, EARLY,
):
    # v2 stage 1 (streaming, no sorting): each program reads CHUNK logits once
    # and writes the maxima of its CHUNK // S contiguous groups of S, its max
    # and its sum(exp(x - max)).  -inf is clamped on the group maxima only
    # (one operation per group, not per element); groups wholly past V get
    # -3.3e38, below any real group.
    _pdl_start(PDL, EARLY)
    row = tl.program_id(0)
    c = tl.program_id(1)
    base = x_ptr + _xrow(row, RL, RB, RO).to(tl.int64) * stride_row
    gi = tl.arange(0, CHUNK // S)
    if LOAD2D:
        offs = c * CHUNK + gi[:, None] * S + tl.arange(0, S)[None, :]
        if EVEN:
            x = tl.load(base + offs).to(tl.float32)
        else:
            x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        g = tl.max(x, 1)
    else:
        offs = c * CHUNK + tl.arange(0, CHUNK)
        if EVEN:
            x = tl.load(base + offs).to(tl.float32)
        else:
            x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        g = tl.max(tl.reshape(x, [CHUNK // S, S]), 1)
    g = tl.maximum(g, -3.0e38)
    m = tl.max(g, 0)
    if LOAD2D:
        s = tl.sum(tl.sum(tl.exp(x - m), 1), 0)
    else:
        s = tl.sum(tl.exp(x - m), 0)
    if not EVEN:
        g = tl.where(c * CHUNK + gi * S < V, g, -3.3e38)
    out = row * NCHUNK + c
    tl.store(m_ptr + out, m)
    tl.store(s_ptr + out, s)
    tl.store(gm_ptr + row.to(tl.int64) * NGP + c * (CHUNK // S) + gi, g)


@triton.jit(do_not_specialize=_NOSPEC_ROWS, do_not_specialize_on_alignment=["lse_ptr"])
def _group_select_kernel(
    x_ptr, stride_row, V, NCHUNK, NG, RL, RB, RO,
    gm_ptr, m_ptr, s_ptr, lp_ptr, id_ptr, K, scr_ptr, lse_ptr, id_off,
    NCP: tl.constexpr, NGP: tl.constexpr, S: tl.constexpr, KP: tl.constexpr,
    GPACK64: tl.constexpr, GBITS: tl.constexpr, EPACK32: tl.constexpr, EBITS: tl.constexpr,
    R: tl.constexpr, ECAP: tl.constexpr, RAW: tl.constexpr, PDL: tl.constexpr, EARLY,
):
    _pdl_start(PDL, EARLY)
    row = tl.program_id(0)
    _group_select_row(row, _xrow(row, RL, RB, RO), x_ptr, stride_row, V, NCHUNK, NG, gm_ptr, m_ptr, s_ptr,
                      lp_ptr, id_ptr, K, scr_ptr, lse_ptr, id_off,
                      NCP, NGP, S, KP, GPACK64, GBITS, EPACK32, EBITS, R, ECAP, RAW)


@triton.jit
def _group_select_row(
    row, xrow, x_ptr, stride_row, V, NCHUNK, NG,
    gm_ptr, m_ptr, s_ptr, lp_ptr, id_ptr, K, scr_ptr, lse_ptr, id_off,
    NCP: tl.constexpr, NGP: tl.constexpr, S: tl.constexpr, KP: tl.constexpr,
    GPACK64: tl.constexpr, GBITS: tl.constexpr, EPACK32: tl.constexpr, EBITS: tl.constexpr,
    R: tl.constexpr, ECAP: tl.constexpr, RAW: tl.constexpr,
):
    # v2 stage 2, one row: logsumexp from the chunks' (max, sum); the row's
    # top-K elements lie in its top-K groups by group maximum, so top-KP of the
    # NG group maxima, then top-KP of those groups' KP * S logits (re-read:
    # KP * S elements, not the row).  Stage 1's outputs are read with .cg (L2:
    # the stream kernel wrote them; nothing in L1 to reuse).
    c = tl.arange(0, NCP)
    cm = c < NCHUNK
    m = tl.load(m_ptr + row * NCHUNK + c, mask=cm, other=float("-inf"), cache_modifier=".cg")
    s = tl.load(s_ptr + row * NCHUNK + c, mask=cm, other=0.0, cache_modifier=".cg")
    M = tl.max(m, 0)
    M_safe = tl.where(M == float("-inf"), 0.0, M)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    tot = tl.sum(tl.where(cm, s * tl.exp(m_safe - M_safe), 0.0), 0)
    lse = M_safe + tl.log(tot)

    gbase = gm_ptr + row.to(tl.int64) * NGP
    k = tl.arange(0, KP)
    if R > 1:
        # two levels: the top-KP groups lie in the top-KP super-groups (R
        # consecutive groups) by maximum (same argument as groups / elements),
        # so sort NGP / R super-group maxima, then those KP * R group maxima
        sg = tl.arange(0, NGP // R)
        r = tl.arange(0, R)
        p2 = sg[:, None] * R + r[None, :]
        sgv = tl.max(tl.load(gbase + p2, mask=p2 < NG, other=-3.4e38, cache_modifier=".cg"), 1)
        if GPACK64:
            _, sgid = _unpack64(tl.topk(_pack64(sgv, sg, GBITS), KP), GBITS)
        else:
            _, sgid = _unpack32(tl.topk(_pack32(sgv, sg, GBITS), KP), GBITS)
        # slots in index order, so a group's position (slot * R + r) grows with
        # its index and equal maxima are chosen as by index (the order one
        # kernel over a whole row and a merge of vocabulary shards agree on)
        sgid = tl.sort(sgid)
        q2 = sgid[:, None] * R + r[None, :]
        gv2 = tl.load(gbase + q2, mask=q2 < NG, other=-3.4e38, cache_modifier=".cg")
        l2 = k[:, None] * R + r[None, :]
        if GPACK64:
            gval, qq = _unpack64(tl.topk(tl.reshape(_pack64(gv2, l2, GBITS), [KP * R]), KP), GBITS)
        else:
            gval, qq = _unpack32(tl.topk(tl.reshape(_pack32(gv2, l2, GBITS), [KP * R]), KP), GBITS)
        gid = tl.sum(tl.where((qq // R)[:, None] == k[None, :], sgid[None, :], 0), 1) * R + qq % R
    else:
        p = tl.arange(0, NGP)
        gv = tl.load(gbase + p, mask=p < NG, other=-3.4e38, cache_modifier=".cg")
        if GPACK64:
            gval, gid = _unpack64(tl.topk(_pack64(gv, p, GBITS), KP), GBITS)
        else:
            gval, gid = _unpack32(tl.topk(_pack32(gv, p, GBITS), KP), GBITS)
    base = x_ptr + xrow.to(tl.int64) * stride_row
    if EPACK32:
        # 16-bit inputs: the value is exact in fp32's high bits, the position
        # (slot * S + j, slots in increasing group order, so ties still go to
        # the higher offset) in the low EBITS bits: an fp32 top-K.
        gid = tl.sort(gid)
        coffs = gid[:, None] * S + tl.arange(0, S)[None, :]
        cmask = coffs < V
        y = tl.load(base + coffs, mask=cmask, other=float("-inf")).to(tl.float32)
        yk = tl.where(cmask, tl.maximum(y, -3.0e38), -3.3e38)
        lpos = k[:, None] * S + tl.arange(0, S)[None, :]
        keys = tl.reshape(_pack32(yk, lpos, EBITS), [KP * S])
        if ECAP > 0:
            # The KP selected group maxima are KP logits >= thr, so the row's
            # top-K are >= thr: only those candidates (typically ~K of the
            # KP * S) go through the sort, compacted into ECAP slots of a
            # per-row scratch; more than ECAP (ties) -> the full sort.
            thr = tl.min(gval.to(tl.float32), 0)
            flag = tl.reshape(yk >= thr, [KP * S])
            ncand = tl.sum(flag.to(tl.int32), 0)
            if ncand <= ECAP:
                dst = tl.cumsum(flag.to(tl.int32), 0) - 1
                sp = scr_ptr + row.to(tl.int64) * ECAP
                tl.store(sp + dst, keys, mask=flag)
                tl.debug_barrier()
                e = tl.arange(0, ECAP)
                t = tl.topk(tl.load(sp + e, mask=e < ncand, other=-3.4e38), KP)
            else:
                t = tl.topk(keys, KP)
        else:
            t = tl.topk(keys, KP)
        val, q = _unpack32(t, EBITS)
        slot = q // S
        gsel = tl.sum(tl.where(slot[:, None] == k[None, :], gid[None, :], 0), 1)
        idx = gsel * S + (q % S)
    else:
        coffs = gid[:, None] * S + tl.arange(0, S)[None, :]  # [KP, S] offsets in the row
        cmask = coffs < V
        y = tl.load(base + coffs, mask=cmask, other=float("-inf")).to(tl.float32)
        yk = tl.where(cmask, tl.maximum(y, -3.0e38), -3.3e38)
        t = tl.topk(tl.reshape(_pack64(yk, coffs, 29), [KP * S]), KP)
        val, idx = _unpack64(t, 29)
    _store_top(lp_ptr, id_ptr, lse_ptr, row, K, k, val, idx, lse, id_off, RAW)


# Launch configuration.  "small" is used for bs * L <= small_rows rows, "large"
# above.  impl "v0": per-chunk top-K + merge (latency-friendly: many programs
# per row); "v2": streaming group maxima + per-row group selection
# (throughput-friendly: no sorting in the pass over the logits).  Options:
#   load2d   v2 stage 1 loads the chunk as [groups, S] (no reshape)
#   epack32  v2 stage 2: fp32 (value | position) keys for 16-bit inputs
#   hier     v2 stage 2: R > 1 selects the groups in two levels (super-groups of
#            R groups first: sorts NGP / R + KP * R keys instead of NGP)
#   mpack32  v0 merge: fp32 (value | position) keys for 16-bit inputs
#   fuse     v0: the last chunk program of a row merges it (no merge launch;
#            per-row counters in a persistent per-device buffer, left at zero)
#   tree     v0 with fuse: the last row of a request to be merged also builds
#            the request's tree (per-request counters): build_trees is one
#            launch; budgets up to tree_max_b (default 32)
#   ecap     v2 select: sort only the logits >= the K-th selected group
#            maximum, compacted into ecap (at least 2K) slots, full sort if more
# bench/bench_build.py --tune times the candidates on the device and uses the
# fastest correct ones; the defaults below are its choice on the H200
# (bench/results-h200.txt).
# 2026-11-29 run 6 (bench/results-h200.txt): small = one launch (top-K +
# merge + tree), 23.4 us at bs 1 L 7 B 32 (two launches: 24.9); large = v2
# with the compacted element sort, 127.7 us at bs 128 L 7 B 32 (137.4
# without); the small configuration only pays at one request of L 7 (bs 2:
# 27.9 us vs 24.9 us with the large one), hence small_rows = 7.
CONFIG = {
    "small": {"impl": "v0", "chunk": 8192, "warps": 8, "sel_warps": None, "mpack32": True, "fuse": True,
              "tree": True},
    "large": {"impl": "v2", "chunk": 8192, "S": 64, "warps": 8, "sel_warps": 4, "load2d": False,
              "epack32": True, "hier": 4, "ecap": 64},
    "small_rows": 7,
    # ... or up to this many logits (rows * V), 0 = off.  bench_head.py run 1
    # (results-head-h200.txt): the one launch at batch 8 of a TP-8 shard (56
    # rows x 20480) took 106.3 us with the GEMM vs 100.3 us for "large": off
    "small_elems": 0,
    # tree kernel: warps (None: 4 up to 256 candidates and 64 nodes, else 8)
    # and the register path (tree_gather).  The tree kernel alone at batch 8
    # (profile_head.py runs c and e, results-head-h200.txt): 9.9 us, against
    # 12.7 us for the previous register path (a load per depth, the global
    # top-B at the end, an [N, N] ancestor mask, 8 warps) and 12.9 us
    # through memory
    "tree_warps": None,
    "tree_gather": True,
    # TP merge + tree kernel: a request's L rows merged by one top-K over an
    # [L, TP * K] tile (True) or one row after another (False).  TP-8 flow at
    # batch 8 of the 20480 shard (bench_head.py runs 6 and 7): 100-106 us vs
    # 112-117 us, the same trees
    "merge_rows_2d": True,
    # the head's rows 1..L for its GEMM (batches above full_rows_max):
    # "triton" (gather_rows) or "torch" (a strided copy); bench_head.py run 3,
    # shard 20480 batch 32: 155.8 us vs 158.6 us for the whole head
    "row_copy": "triton",
    # the head's LM-head GEMM at up to 64 rows (batches of up to 8 requests of
    # block 8): a Triton GEMM, {BM: (BN, BK, stages, warps)}, instead of
    # cuBLAS (torch.mm) -- bench/explore_gemm.py on the H200, shard 20480 x H
    # 7168 bf16: M 8 73.2 us vs 78.8 (cuBLAS), M 16 73.0 vs 77.1, M 32 75.5 vs
    # 76.6, M 64 75.7-76.6 vs 76.2-80.3; M 128 and up slower (92.8 vs 77.8),
    # left to cuBLAS.  {} = cuBLAS everywhere
    "head_gemm": {16: (256, 128, 3, 4), 32: (256, 128, 3, 4), 64: (256, 64, 4, 8)},
    # the head's kernels launched with programmatic dependent launch (sm_90+)
    # up to this many rows (bs * L); 0 = never.  bench_head.py stop 28, shard
    # 20480, with the Triton GEMM: batch 8 96.5 vs 98.9 us, batch 1 91.2 vs
    # 92.0; batch 32 (cuBLAS GEMM) 139.1 vs 131.7 (early-launched programs
    # hold SMs the GEMM wants; stop 26: +2.7 us at 32, +9.8 at 128)
    "pdl_rows_max": 64,
    # above pdl_rows_max: the top-K's later kernels (select, merge, tree) still
    # launched with PDL, without the early trigger (issue 36: one compiled
    # kernel per budget instead of two; the kernel before them never triggers
    # early, so they start as it ends).  H200 (bench/results-startup-h200.txt):
    # head graph at bs 128 within -0.2..+0.4 % at budgets 4 / 8 / 16 / 64,
    # +1.4 % (463 -> 470 us) at budget 32.  False = plain launches there (the
    # previous code; two more kernels per budget to compile)
    "pdl_late": True,
}

_COUNTERS = {}
_OLD_COUNTERS = []


def _counters(dev, n):
    """Persistent zeroed int32 counters (the fused kernels leave them at zero).

    A buffer that is outgrown stays alive: CUDA graphs captured with it keep
    using it."""
    key = (dev.type, dev.index)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _OLD_COUNTERS.append(buf)
        buf = torch.zeros(max(n, 8192), dtype=torch.int32, device=dev)
        _COUNTERS[key] = buf
    return buf


def _chunk_params(V: int, KP: int, chunk: int = 4096):
    CHUNK = min(chunk, _next_pow2(V))
    CHUNK = max(CHUNK, KP)
    G = max(KP, min(512, CHUNK))
    S = CHUNK // G
    return CHUNK, G, S


def _buf(bufs, name, shape, dtype, dev):
    if bufs is None:
        return torch.empty(shape, dtype=dtype, device=dev)
    t = bufs.get(name)
    if t is None or tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        t = bufs[name] = torch.empty(shape, dtype=dtype, device=dev)
    return t


def regime_config(rows: int, V=None):
    """The "small" (latency) configuration for at most ``small_rows`` rows, or
    (``V`` given) at most ``small_elems`` logits in all; else "large"."""
    if rows <= CONFIG["small_rows"]:
        return CONFIG["small"]
    if V is not None and rows * int(V) <= int(CONFIG.get("small_elems") or 0):
        return CONFIG["small"]
    return CONFIG["large"]


class _TreeLaunch:
    """Outputs, scratch and compile-time constants of one batch's tree kernel."""

    def __init__(self, bs, L, K, budget, root_tokens, dev, gather=None, out=None):
        B = int(budget)
        N = B + 1
        self.B, self.N = B, N
        self.BP = max(2, _next_pow2(B))
        self.KP = max(2, _next_pow2(K))
        self.LP = max(2, _next_pow2(L))
        self.NP = _next_pow2(N)
        self.CP = max(self.BP, _next_pow2(_num_candidates(B, K)))
        W = self.LP * self.BP
        # out: preallocated outputs (the head's static buffers), dict of
        # tokens / parents / depths (int64 [bs, N]), valid (int8 [bs, N]),
        # vis (int8 [bs, N, N]); contiguous
        o = out or {}
        self.sc = torch.empty((bs, W), dtype=torch.float64, device=dev)
        self.ps = torch.empty((bs, W), dtype=torch.int32, device=dev)
        self.rk = torch.empty((bs, W), dtype=torch.int32, device=dev)
        self.pos = torch.empty((bs, W), dtype=torch.int32, device=dev)
        self.tokens = o.get("tokens", None)
        if self.tokens is None:
            self.tokens = torch.empty((bs, N), dtype=torch.int64, device=dev)
        self.parents = o["parents"] if "parents" in o else torch.empty((bs, N), dtype=torch.int64, device=dev)
        self.depths = o["depths"] if "depths" in o else torch.empty((bs, N), dtype=torch.int64, device=dev)
        self.valid = o["valid"] if "valid" in o else torch.empty((bs, N), dtype=torch.int8, device=dev)
        self.vis = o["vis"] if "vis" in o else torch.empty((bs, N, N), dtype=torch.int8, device=dev)
        self.has_root = root_tokens is not None
        # a strided root vector is read in place (the head: input_ids[:, 0])
        self.root = root_tokens.to(device=dev, dtype=torch.int64) if self.has_root else self.tokens
        if self.root.dim() != 1:
            self.root = self.root.reshape(-1)
        self.rstride = int(self.root.stride(0)) if self.has_root else 1
        self.gather = bool(CONFIG["tree_gather"] if gather is None else gather)
        self.L, self.K = L, K

    def ptrs(self):
        return (self.root, self.sc, self.ps, self.rk, self.pos, self.tokens, self.parents,
                self.depths, self.valid, self.vis)

    def consts(self):
        return dict(HAS_ROOT=self.has_root, TL=self.L, TK=self.K, TB=self.B, LP=self.LP, BP=self.BP,
                    TKP=self.KP, NP=self.NP, CP=self.CP, EPS=DEPTH_EPS, GATHER=self.gather, RS=self.rstride)

    def trees(self) -> DDTrees:
        return DDTrees(self.tokens, self.parents, self.depths, self.vis.view(torch.bool), self.valid.view(torch.bool))


_NO_TREE_CONSTS = dict(HAS_ROOT=False, TL=1, TK=1, TB=1, LP=2, BP=2, TKP=2, NP=2, CP=2, EPS=DEPTH_EPS, GATHER=True,
                       RS=1)


def topk_logsumexp(x: torch.Tensor, K: int, cfg=None, _stages=3, _bufs=None, _tree=None):
    """``(top_lp[bs, L, K] float32, top_id[bs, L, K] int64)`` in one pass over ``x``.

    ``_tree`` (a :class:`_TreeLaunch`; v0 with ``fuse`` only): the same launch
    also builds the trees.  ``_stages`` / ``_bufs`` are for the benchmark only
    (launch only stage 1 (bit 1) or stage 2 (bit 2), on buffers kept in the
    dict ``_bufs``)."""
    bs, L, V = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    x2 = x.reshape(bs * L, V)
    if cfg is None:
        cfg = regime_config(bs * L, V)
    top_lp = _buf(_bufs, "lp", (bs, L, K), torch.float32, x.device)
    top_id = _buf(_bufs, "id", (bs, L, K), torch.int64, x.device)
    topk_rows(x2, bs * L, K, top_lp, top_id, cfg=cfg, nreq=bs, _stages=_stages, _bufs=_bufs, _tree=_tree)
    return top_lp, top_id


def topk_rows(x2: torch.Tensor, rows: int, K: int, lp: torch.Tensor, ids: torch.Tensor, *, cfg=None,
              rowmap=(1, 1, 0), raw=None, nreq=None, pdl=False, early=None, _stages=3, _bufs=None, _tree=None):
    """Top-K (+ logsumexp) of ``rows`` logits rows into ``lp`` / ``ids`` (``[rows, K]``,
    contiguous; float32 / int64, or int32 ids with ``raw``).

    ``x2``: 2-D logits (unit column stride); output row r reads row
    ``(r // RL) * RB + RO + r % RL`` of ``x2`` (``rowmap = (RL, RB, RO)``; the
    head passes ``(L, block, 1)`` to read block rows 1..L of ``[bs * block, V]``
    logits in place).  ``raw = (lse [rows] float32, id_off)``: store the raw
    top values (not log-probabilities), ``ids + id_off`` and each row's
    logsumexp (one vocabulary shard of a tensor-parallel head).  ``nreq``:
    requests (rows // L) for the fused tree's counters.  ``pdl``: launch with
    programmatic dependent launch (:func:`_pdl_start`; CUDA, sm_90+); ``early``
    (default ``pdl``): each kernel lets the next launch at its start, and the
    first kernel is launched with PDL at all (after a cuBLAS GEMM, which
    triggers its dependents early, an early-launched kernel would hold SMs the
    GEMM wants); without it the later kernels are still launched with PDL
    (the same compiled kernels) but start only as the kernel before ends."""
    V = int(x2.shape[1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if cfg is None:
        cfg = regime_config(rows, V)
    RL, RB, RO = (int(v) for v in rowmap)
    early = bool(pdl if early is None else early) and bool(pdl)
    first = _pdl_args(early)  # the first kernel: PDL only when triggered early
    rest = _pdl_args(pdl, early)
    KP = max(2, _next_pow2(K))
    if x2.dtype == torch.bfloat16:
        pack64, bits = False, 16
    elif x2.dtype == torch.float16:
        pack64, bits = False, 13
    else:
        pack64, bits = True, 29
        if x2.dtype != torch.float32:
            x2 = x2.float()  # same rows: the row map still applies
    dev = x2.device
    if raw is None:
        lse_out, id_off, RAW = lp, 0, False
    else:
        lse_out, id_off, RAW = raw[0], int(raw[1]), True
    S = max(1, min(int(cfg.get("S") or 64), _next_pow2(V)))
    if cfg.get("impl", "v0") == "v2" and KP * S <= 4096:  # v0 for large K
        CHUNK = max(S, min(int(cfg.get("chunk", 4096)), _next_pow2(V)))
        NCHUNK = triton.cdiv(V, CHUNK)
        NG = NCHUNK * (CHUNK // S)
        NGP = _next_pow2(max(NG, KP))
        NCP = _next_pow2(NCHUNK)
        gpack64 = pack64 or NGP > (1 << bits)
        gbits = 29 if gpack64 else bits
        epack32 = bool(cfg.get("epack32")) and not pack64 and KP * S <= (1 << bits)
        R = int(cfg.get("hier") or 1)
        if R > 1 and (NGP // R < KP or KP * R > (1 << gbits) or (CHUNK // S) % R):
            R = 1
        gms = _buf(_bufs, "gm", (rows, NGP), torch.float32, dev)
        ms = _buf(_bufs, "m", (rows, NCHUNK), torch.float32, dev)
        ss = _buf(_bufs, "s", (rows, NCHUNK), torch.float32, dev)
        nw1 = max(1, min(int(cfg.get("warps") or 4), CHUNK // 256))
        # at least 2K slots: the K group maxima alone are K candidates
        ecap = _next_pow2(max(int(cfg.get("ecap") or 0), 2 * KP)) if cfg.get("ecap") else 0
        ecap = ecap if (epack32 and ecap < KP * S) else 0
        scr = _buf(_bufs, "scr", (rows, max(ecap, 1)), torch.float32, dev)
        if _stages & 1:
            _groupmax_kernel[(rows, NCHUNK)](
                x2, x2.stride(0), V, NCHUNK, NGP, RL, RB, RO, gms, ms, ss,
                CHUNK=CHUNK, S=S, EVEN=(V % CHUNK == 0), LOAD2D=bool(cfg.get("load2d")), **first,
                num_warps=nw1,
            )
        n2 = max(NGP, KP * S)
        nw2 = cfg.get("sel_warps") or (4 if n2 <= 1024 else 8)
        if _stages & 2:
            _group_select_kernel[(rows,)](
                x2, x2.stride(0), V, NCHUNK, NG, RL, RB, RO, gms, ms, ss, lp, ids, K, scr, lse_out, id_off,
                NCP=NCP, NGP=NGP, S=S, KP=KP, GPACK64=gpack64, GBITS=gbits,
                EPACK32=epack32, EBITS=bits, R=R, ECAP=ecap, RAW=RAW, **rest, num_warps=nw2,
            )
        return lp, ids
    fuse = bool(cfg.get("fuse"))
    if _tree is not None:
        assert fuse and _stages == 3 and not RAW
        tree_ptrs, tree_consts = _tree.ptrs(), dict(_tree.consts(), TREE=True)
        nreq = int(_tree.tokens.shape[0]) if nreq is None else nreq
    else:
        tree_ptrs, tree_consts = (lp,) * 10, dict(_NO_TREE_CONSTS, TREE=False)
    nreq = rows if nreq is None else int(nreq)
    # request counters start 16-byte aligned (the kernel is specialised on
    # pointer alignment: one compiled kernel for every batch size)
    CHUNK, G, S = _chunk_params(V, KP, int(cfg.get("chunk", 4096)))
    NCHUNK = triton.cdiv(V, CHUNK)
    assert CHUNK <= (1 << bits)
    NCP = _next_pow2(NCHUNK)
    assert NCP * KP <= (1 << 29)
    mpack32 = bool(cfg.get("mpack32")) and not pack64 and NCP * KP <= (1 << bits)
    mbits = bits if mpack32 else 29
    vals = _buf(_bufs, "vals", (rows, NCHUNK, KP), torch.float32, dev)
    idxs = _buf(_bufs, "idxs", (rows, NCHUNK, KP), torch.int32, dev)
    ms = _buf(_bufs, "m", (rows, NCHUNK), torch.float32, dev)
    ss = _buf(_bufs, "s", (rows, NCHUNK), torch.float32, dev)
    roff = (rows + 3) // 4 * 4
    cnt = _counters(dev, roff + nreq) if fuse else ms
    rcnt = cnt[roff:] if fuse else ms
    nw1 = cfg.get("warps") or (4 if KP * S <= 1024 else 8)
    if _stages & 1:
        _topk_chunk_kernel[(rows, NCHUNK)](
            x2, x2.stride(0), V, NCHUNK, RL, RB, RO, vals, idxs, ms, ss,
            cnt, lp, ids, K, lse_out, id_off, rcnt, *tree_ptrs,
            CHUNK=CHUNK, G=G, S=S, KP=KP, PACK64=pack64, BITS=bits,
            FUSE=fuse, NCP=NCP, MPACK32=mpack32, MBITS=mbits, **tree_consts, RAW=RAW, **first,
            num_warps=nw1,
        )
    if fuse:
        return lp, ids
    n2 = NCP * KP
    nw2 = cfg.get("sel_warps") or (4 if n2 <= 2048 else (8 if n2 <= 8192 else 16))
    if _stages & 2:
        _topk_merge_kernel[(rows,)](
            vals, idxs, ms, ss, lp, ids, NCHUNK, K, lse_out, id_off,
            NCP=NCP, KP=KP, MPACK32=mpack32, MBITS=mbits, RAW=RAW, **rest, num_warps=nw2,
        )
    return lp, ids


def fused_tree(cfg, budget: int) -> bool:
    """Whether the top-K launch also builds the trees (v0 with ``fuse`` and
    ``tree``; up to budget ``tree_max_b``: larger trees need so many registers
    that the fused kernel would spill).  (v2's select kernel building them,
    the last row of a request doing it, measured slower at every batch:
    results-head-h200.txt, stop 28.)"""
    return bool(cfg.get("impl", "v0") == "v0" and cfg.get("fuse") and cfg.get("tree")
                and budget <= int(cfg.get("tree_max_b") or 32))


def build_trees_triton(x: torch.Tensor, budget: int, root_tokens=None, cfg=None):
    """Top-K + trees on the GPU: ``(trees, None)``, one launch when
    :func:`fused_tree` says so, else the top-K launch(es) then the tree
    kernel; ``(None, (top_lp, top_id))`` for shapes the tree kernel does not
    support (the caller runs the torch beam)."""
    bs, L, V = x.shape
    K = min(int(budget), V)
    if cfg is None:
        cfg = regime_config(bs * L, V)
    if not tree_kernel_supported(L, budget, K):
        return None, topk_logsumexp(x, K, cfg=cfg)
    tr = _TreeLaunch(bs, L, K, budget, root_tokens, x.device)
    if fused_tree(cfg, budget):
        topk_logsumexp(x, K, cfg=cfg, _tree=tr)
        return tr.trees(), None
    top_lp, top_id = topk_logsumexp(x, K, cfg=cfg)
    return _launch_tree(top_lp, top_id, tr), None


@triton.jit(do_not_specialize=_NOSPEC_TREE, do_not_specialize_on_alignment=_NOALIGN_TREE)
def _tree_kernel(
    lp_ptr, id_ptr, root_ptr,
    sc_ptr, ps_ptr, rk_ptr, pos_ptr,
    tok_ptr, par_ptr, dep_ptr, val_ptr, vis_ptr,
    HAS_ROOT: tl.constexpr, L: tl.constexpr, K: tl.constexpr, B: tl.constexpr,
    LP: tl.constexpr, BP: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr,
    CP: tl.constexpr, EPS: tl.constexpr, GATHER: tl.constexpr, RS, PDL: tl.constexpr, EARLY,
):
    _pdl_start(PDL, EARLY)
    _tree_body(tl.program_id(0), lp_ptr, id_ptr, root_ptr, sc_ptr, ps_ptr, rk_ptr, pos_ptr,
               tok_ptr, par_ptr, dep_ptr, val_ptr, vis_ptr,
               HAS_ROOT, L, K, B, LP, BP, KP, NP, CP, EPS, GATHER, RS)


@triton.jit
def _tree_body(
    b, lp_ptr, id_ptr, root_ptr,
    sc_ptr, ps_ptr, rk_ptr, pos_ptr,
    tok_ptr, par_ptr, dep_ptr, val_ptr, vis_ptr,
    HAS_ROOT: tl.constexpr, L: tl.constexpr, K: tl.constexpr, B: tl.constexpr,
    LP: tl.constexpr, BP: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr,
    CP: tl.constexpr, EPS: tl.constexpr, GATHER: tl.constexpr, RS,
):
    # One request's tree (root token at root_ptr + b * RS).  lp / id are read
    # with .cg (L2, not L1): in the fused
    # kernels other programs wrote them moments ago.
    lpb = lp_ptr + b * (L * K)
    sc = sc_ptr + b * (LP * BP)
    ps = ps_ptr + b * (LP * BP)
    rk = rk_ptr + b * (LP * BP)
    pos = pos_ptr + b * (LP * BP)
    bb = tl.arange(0, BP)

    # Pruned candidate list.  Beam and top-K are sorted descending, so candidate
    # (i, j) (beam rank i, token rank j) is beaten by the (i+1)(j+1)-1 candidates
    # (i' <= i, j' <= j): only those with (i+1)(j+1) <= B can be in the top B
    # (~B ln B of them instead of B*K).  Row i holds min(K, B // (i+1)) of them;
    # candidate c -> (row, col) through the rows' exclusive prefix sums.
    cnt_i = tl.where(bb < B, tl.minimum(B // (bb + 1), K), 0)
    pre = tl.cumsum(cnt_i, 0) - cnt_i
    total = tl.sum(cnt_i, 0)
    cc = tl.arange(0, CP)
    le = (pre[None, :] <= cc[:, None]) & (cnt_i[None, :] > 0)  # [CP, BP]
    crow = tl.sum(le.to(tl.int32), 1) - 1
    ccol = cc - tl.max(tl.where(le, pre[None, :], 0), 1)
    cvalid = cc < total
    crow = tl.where(cvalid, crow, 0)
    ccol = tl.where(cvalid, ccol, 0)
    cflat = crow * KP + ccol

    # depth 1 (index 0): the top-K tokens themselves
    negb = tl.full([BP], -1.0e30, tl.float64)
    beam = tl.load(lpb + bb, mask=bb < K, other=0.0, cache_modifier=".cg").to(tl.float64)
    beam = tl.where(bb < K, beam, negb)
    kk = tl.arange(0, KP)
    ll = tl.arange(0, LP)
    if GATHER:
        # Registers: every depth's log-probs and ids loaded up front, in the
        # beam's round trip; ps holds each beam entry's flat (parent rank * KP
        # + token rank).  The global top-B (keys: score - EPS * depth, packed
        # with depth * BP + rank) grows depth by depth, ascending: the top BP
        # of an ascending and a descending list is their elementwise maximum,
        # bitonic, sorted by one bitonic merge.  Unrolled, so that depth d's
        # merge can overlap depth d + 1's beam.
        lkm = (ll[:, None] < L) & (kk[None, :] < K)
        lko = ll[:, None] * K + kk[None, :]
        lpall = tl.reshape(tl.load(lpb + lko, mask=lkm, other=0.0, cache_modifier=".cg").to(tl.float64),
                           [LP * KP])
        idall = tl.reshape(tl.load(id_ptr + b * (L * K) + lko, mask=lkm, other=0, cache_modifier=".cg"),
                           [LP * KP])
        tl.store(ps + bb, bb)
        gk = tl.flip(_pack64(beam, bb, 12), 0)
        for d in tl.static_range(1, L):
            bi = tl.gather(beam, crow, 0)
            lj = tl.gather(lpall, d * KP + ccol, 0)
            cand = tl.where(cvalid, bi + lj, -3.0e30)
            s, j = _unpack64(tl.topk(_pack64(cand, cflat, 12), BP), 12)
            s = tl.where(bb < B, s, negb)
            tl.store(ps + d * BP + bb, j)
            kd = _pack64(s - EPS * tl.full([BP], d, tl.int32).to(tl.float64), d * BP + bb, 12)
            gk = tl.bitonic_merge(tl.maximum(gk, kd), descending=False)
            beam = s
    else:
        # through memory: scores / parent ranks / token ranks per depth
        tl.store(sc + bb, beam)
        tl.store(ps + bb, tl.zeros([BP], dtype=tl.int32))
        tl.store(rk + bb, bb)
        tl.debug_barrier()
        for d in range(1, L):
            bi = tl.load(sc + (d - 1) * BP + crow)
            lj = tl.load(lpb + d * K + ccol, cache_modifier=".cg").to(tl.float64)
            cand = tl.where(cvalid, bi + lj, -3.0e30)
            s, j = _unpack64(tl.topk(_pack64(cand, cflat, 12), BP), 12)
            s = tl.where(bb < B, s, negb)
            tl.store(sc + d * BP + bb, s)
            tl.store(ps + d * BP + bb, j // KP)
            tl.store(rk + d * BP + bb, j % KP)
            tl.debug_barrier()
    tl.debug_barrier()

    # global top-B over all depths (shallower first on ties), depth-major order
    fl = ll[:, None] * BP + bb[None, :]
    lm = (ll[:, None] < L) & (bb[None, :] < BP)
    if GATHER:
        jall = tl.reshape(tl.load(ps + fl, mask=lm, other=0), [LP * BP])
        t = tl.flip(gk, 0)
    else:
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
    if GATHER:
        # a node's parent is the selected entry f_par = (depth - 1) * BP +
        # parent rank, at position 1 + #{selected f < f_par} of the sorted
        # list (the tree is prefix-closed: f_par is selected)
        jsel = tl.gather(jall, fc, 0)
        fpar = (di - 1) * BP + jsel // KP
        pnode = 1 + tl.sum((fs[None, :] < fpar[:, None]).to(tl.int32), 1)
        pnode = tl.where(di == 0, 0, pnode)
        tok = tl.gather(idall, di * KP + jsel % KP, 0)
    else:
        tl.store(pos + fc, bb + 1, mask=nv)
        tl.debug_barrier()
        psl = tl.load(ps + fc, mask=nv, other=0)
        rkl = tl.load(rk + fc, mask=nv, other=0)
        pnode = tl.load(pos + (di - 1) * BP + psl, mask=nv & (di > 0), other=0)
        pnode = tl.where(di == 0, 0, pnode)
        tok = tl.load(id_ptr + b * (L * K) + di * K + rkl, mask=nv, other=0, cache_modifier=".cg")

    ob = b * (B + 1)
    om = bb < B
    tl.store(tok_ptr + ob + 1 + bb, tl.where(nv, tok, 0).to(tl.int64), mask=om)
    tl.store(par_ptr + ob + 1 + bb, tl.where(nv, pnode, -1).to(tl.int64), mask=om)
    tl.store(dep_ptr + ob + 1 + bb, tl.where(nv, di + 1, 0).to(tl.int64), mask=om)
    tl.store(val_ptr + ob + 1 + bb, nv.to(tl.int8), mask=om)
    if HAS_ROOT:
        root = tl.load(root_ptr + b * RS).to(tl.int64)
    else:
        root = tl.zeros([], dtype=tl.int64)
    tl.store(tok_ptr + ob, root)
    tl.store(par_ptr + ob, tl.full([], -1, tl.int64))
    tl.store(dep_ptr + ob, tl.zeros([], dtype=tl.int64))
    tl.store(val_ptr + ob, tl.full([], 1, tl.int8))

    # ancestor mask: walk up at most L steps from every node
    ii = tl.arange(0, NP)
    im = ii < (B + 1)
    cur = ii
    vb = vis_ptr + b * ((B + 1) * (B + 1))
    if GATHER:
        # the request's mask zeroed, then one store per (node, ancestor)
        zz = tl.arange(0, NP * NP)
        tl.store(vb + zz, tl.zeros([NP * NP], dtype=tl.int8), mask=zz < (B + 1) * (B + 1))
        gi = tl.minimum(tl.maximum(ii - 1, 0), BP - 1)
        inb = (ii >= 1) & (ii <= B)
        parv = tl.where(inb, tl.gather(tl.where(nv, pnode, -1), gi, 0), -1)
        alive = (ii == 0) | (inb & (tl.gather(nv.to(tl.int32), gi, 0) != 0))
        tl.debug_barrier()
        for _ in range(L + 1):
            tl.store(vb + ii * (B + 1) + cur, tl.full([NP], 1, tl.int8), mask=alive)
            nxt = tl.gather(parv, cur, 0)
            alive = alive & (nxt >= 0)
            cur = tl.where(alive, nxt, 0)
    else:
        vis = tl.zeros([NP, NP], dtype=tl.int1)
        tl.debug_barrier()
        alive = im & (tl.load(val_ptr + ob + ii, mask=im, other=0) != 0)
        for _ in range(L + 1):
            vis = vis | ((ii[None, :] == cur[:, None]) & alive[:, None])
            nxt = tl.load(par_ptr + ob + cur, mask=alive, other=-1).to(tl.int32)
            alive = alive & (nxt >= 0)
            cur = tl.where(alive, nxt, 0)
        vm = im[:, None] & im[None, :]
        tl.store(vb + ii[:, None] * (B + 1) + ii[None, :], vis.to(tl.int8), mask=vm)


def tree_kernel_supported(L: int, B: int, K: int) -> bool:
    BP = _next_pow2(B)
    KP = max(2, _next_pow2(K))
    LP = _next_pow2(L)
    return L <= 16 and B <= 64 and BP * KP <= 4096 and LP * BP <= 4096


def _num_candidates(B: int, K: int) -> int:
    return sum(min(K, B // (i + 1)) for i in range(B))


def _launch_tree(top_lp, top_id, tr: "_TreeLaunch", num_warps=None, pdl=False, early=None) -> DDTrees:
    bs = top_lp.shape[0]
    nw = num_warps or CONFIG["tree_warps"] or (4 if tr.CP <= 256 and tr.NP <= 64 else 8)
    _tree_kernel[(bs,)](
        top_lp.contiguous(), top_id.contiguous(), *tr.ptrs(),
        HAS_ROOT=tr.has_root, L=tr.L, K=tr.K, B=tr.B, LP=tr.LP, BP=tr.BP, KP=tr.KP, NP=tr.NP, CP=tr.CP,
        EPS=DEPTH_EPS, GATHER=tr.gather, RS=tr.rstride, **_pdl_args(pdl, early), num_warps=nw,
    )
    return tr.trees()


def build_trees_from_top_triton(top_lp, top_id, budget, root_tokens=None, num_warps=None, gather=None) -> DDTrees:
    """The tree kernel alone, from ``[bs, L, K]`` top-K log-probs / ids."""
    bs, L, K = top_lp.shape
    tr = _TreeLaunch(bs, L, K, budget, root_tokens, top_lp.device, gather=gather)
    return _launch_tree(top_lp, top_id, tr, num_warps)


# ---------------------------------------------------------------------------
# the head's GEMM input: rows 1..L of every request's block, made contiguous
# ---------------------------------------------------------------------------


@triton.jit(do_not_specialize=["R0"])
def _gather_rows_kernel(src_ptr, dst_ptr, H, R0, L: tl.constexpr, BLK: tl.constexpr, BH: tl.constexpr):
    r = tl.program_id(0)
    offs = tl.program_id(1) * BH + tl.arange(0, BH)
    m = offs < H
    srow = R0 + (r // L) * BLK + 1 + r % L
    x = tl.load(src_ptr + srow.to(tl.int64) * H + offs, mask=m)
    tl.store(dst_ptr + r.to(tl.int64) * H + offs, x, mask=m)


def gather_rows(hid: torch.Tensor, c0: int, c1: int, block: int) -> torch.Tensor:
    """``hid.view(-1, block, H)[c0:c1, 1:]`` (``hid`` contiguous ``[bs * block, H]``) as
    a contiguous ``[(c1 - c0) * (block - 1), H]`` tensor, in one launch of rows x
    1024-element pieces.  On the H200 (bench/profile_head.py, H 7168 bf16):
    2.8 us for 224 rows (batch 32) and 8.4 us for 896 (batch 128), against
    6.3 us and 18.7 us for torch's strided copy of the same rows."""
    H = int(hid.shape[1])
    L = block - 1
    rows = (c1 - c0) * L
    out = torch.empty((rows, H), dtype=hid.dtype, device=hid.device)
    BH = min(1024, _next_pow2(H))
    _gather_rows_kernel[(rows, triton.cdiv(H, BH))](hid, out, H, c0 * block, L=L, BLK=block, BH=BH, num_warps=4)
    return out


# ---------------------------------------------------------------------------
# the head's LM-head GEMM at few rows
# ---------------------------------------------------------------------------


@triton.jit(do_not_specialize=["M", "EARLY"])
def _head_gemm_kernel(x_ptr, w_ptr, o_ptr, M, sxm, swn, som,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NKI: tl.constexpr,
                      STAGES: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr, EARLY):
    # logits[:M, tile] = x[:M] @ W[tile].T: the whole of M in one tile, one
    # pass over K with fp32 accumulation (no split: bound by reading W, and
    # deterministic).  UPCAST: fp32 operands (the CPU interpreter, whose
    # 16-bit dot is wrong; bf16 products are exact in fp32).
    _pdl_start(PDL, EARLY)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    xm = rm < M
    rk = tl.arange(0, BK)
    xp = x_ptr + rm[:, None] * sxm + rk[None, :]
    wp = w_ptr + rn[:, None].to(tl.int64) * swn + rk[None, :]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for _ in tl.range(0, NKI, num_stages=STAGES):
        a = tl.load(xp, mask=xm[:, None], other=0.0)
        b = tl.load(wp)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc)
        xp += BK
        wp += BK
    tl.store(o_ptr + rm[:, None] * som + rn[None, :], acc.to(o_ptr.dtype.element_ty), mask=xm[:, None])


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def pdl_supported(dev) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9.0 and up
    (not the CPU interpreter)."""
    return (not _interpreted() and dev.type == "cuda" and torch.cuda.is_available()
            and torch.cuda.get_device_capability(dev)[0] >= 9)


def head_gemm_config(M: int, N: int, K: int, dtype):
    """``(BM, BN, BK, stages, warps)`` of the Triton GEMM for ``M`` rows of a
    ``[N, K]`` weight, or None where cuBLAS runs (``CONFIG["head_gemm"]``;
    16-bit weights, block sizes that divide N and K)."""
    table = CONFIG.get("head_gemm") or {}
    if dtype not in (torch.bfloat16, torch.float16) or M < 1:
        return None
    BM = max(16, _next_pow2(M))
    if BM not in table:
        return None
    BN, BK, stages, warps = table[BM]
    while BN > 16 and N % BN:
        BN //= 2
    while BK > 16 and K % BK:
        BK //= 2
    if N % BN or K % BK:
        return None
    return BM, BN, BK, stages, warps


def head_gemm(x: torch.Tensor, w: torch.Tensor, cfg, pdl=False) -> torch.Tensor:
    """``x [M, K] @ w [N, K].T`` in ``x``'s dtype by ``_head_gemm_kernel``
    (``cfg`` from :func:`head_gemm_config`)."""
    BM, BN, BK, stages, warps = cfg
    M, K = int(x.shape[0]), int(x.shape[1])
    N = int(w.shape[0])
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _head_gemm_kernel[(N // BN,)](x, w, out, M, x.stride(0), w.stride(0), out.stride(0),
                                  BM=BM, BN=BN, BK=BK, NKI=K // BK, STAGES=stages,
                                  UPCAST=_interpreted(), **_pdl_args(pdl), num_warps=warps)
    return out


# ---------------------------------------------------------------------------
# tensor-parallel head: merge of the vocabulary shards' top-K (+ the tree)
# ---------------------------------------------------------------------------


@triton.jit
def _merge_shards_rows(g_ptr, gi_ptr, row0, NROW: tl.constexpr, ROWS, TP, K, lp_ptr, id_ptr,
                       KP: tl.constexpr, TPP: tl.constexpr, RP: tl.constexpr):
    # Rows row0 .. row0 + NROW - 1 (RP >= NROW, a power of 2) in one top-K
    # over an [RP, TP * K] tile: the L rows of a request cost one sorting
    # network's latency instead of L in a row.
    # Gathered send buffers, rank r's at r * SEG (SEG = ROWS * (2K + 1)):
    # raw top values f32 [ROWS, K], global ids int32 [ROWS, K] (the same
    # bytes, read through gi_ptr), logsumexp f32 [ROWS].  A row's top-K of
    # the whole vocabulary lies in the union of the shards' top-K; keys carry
    # the global id (fp64, 29 low bits), so ties are ordered as within one
    # shard.  Global logsumexp = logsumexp of the shards' ones.
    SEG = ROWS * (2 * K + 1)
    d = tl.arange(0, RP)
    dm = d < NROW
    row = row0 + d
    r = tl.arange(0, TPP)
    rm = r < TP
    rbase = r.to(tl.int64) * SEG
    lse = tl.load(g_ptr + rbase[None, :] + 2 * ROWS * K + row[:, None], mask=dm[:, None] & rm[None, :],
                  other=float("-inf"))
    M = tl.max(lse, 1)
    M_safe = tl.where(M == float("-inf"), 0.0, M)
    glse = M_safe + tl.log(tl.sum(tl.where(rm[None, :], tl.exp(lse - M_safe[:, None]), 0.0), 1))
    kk = tl.arange(0, KP)
    off = rbase[None, :, None] + (row * K)[:, None, None] + kk[None, None, :]
    m3 = dm[:, None, None] & rm[None, :, None] & (kk[None, None, :] < K)
    v = tl.load(g_ptr + off, mask=m3, other=-3.3e38)
    ids = tl.load(gi_ptr + off + ROWS * K, mask=m3, other=0)
    t = tl.topk(tl.reshape(_pack64(v, ids, 29), [RP, TPP * KP]), KP)
    val, tid = _unpack64(t, 29)
    km = dm[:, None] & (kk[None, :] < K)
    o = (row * K)[:, None] + kk[None, :]
    tl.store(lp_ptr + o, val.to(tl.float32) - glse[:, None], mask=km)
    tl.store(id_ptr + o, tid.to(tl.int64), mask=km)


@triton.jit(do_not_specialize=["ROWS"])
def _merge_shards_kernel(g_ptr, gi_ptr, ROWS, TP, K, lp_ptr, id_ptr, KP: tl.constexpr, TPP: tl.constexpr):
    _merge_shards_rows(g_ptr, gi_ptr, tl.program_id(0), 1, ROWS, TP, K, lp_ptr, id_ptr, KP, TPP, 1)


@triton.jit(do_not_specialize=["ROWS", "RS"], do_not_specialize_on_alignment=_NOALIGN_TREE)
def _merge_shards_tree_kernel(
    g_ptr, gi_ptr, ROWS, TP, lp_ptr, id_ptr, root_ptr,
    sc_ptr, ps_ptr, rk_ptr, pos_ptr, tok_ptr, par_ptr, dep_ptr, val_ptr, vis_ptr,
    MKP: tl.constexpr, TPP: tl.constexpr, MERGE2D: tl.constexpr, MRP: tl.constexpr,
    HAS_ROOT: tl.constexpr, L: tl.constexpr, K: tl.constexpr, B: tl.constexpr,
    LP: tl.constexpr, BP: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr,
    CP: tl.constexpr, EPS: tl.constexpr, GATHER: tl.constexpr, RS,
):
    # one program per request: merge its L rows, then build its tree (what
    # the program wrote is visible to it after the barrier; read with .cg)
    b = tl.program_id(0)
    if MERGE2D:
        _merge_shards_rows(g_ptr, gi_ptr, b * L, L, ROWS, TP, K, lp_ptr, id_ptr, MKP, TPP, MRP)
    else:
        for d in tl.static_range(L):
            _merge_shards_rows(g_ptr, gi_ptr, b * L + d, 1, ROWS, TP, K, lp_ptr, id_ptr, MKP, TPP, 1)
    tl.debug_barrier()
    _tree_body(b, lp_ptr, id_ptr, root_ptr, sc_ptr, ps_ptr, rk_ptr, pos_ptr,
               tok_ptr, par_ptr, dep_ptr, val_ptr, vis_ptr,
               HAS_ROOT, L, K, B, LP, BP, KP, NP, CP, EPS, GATHER, RS)


def merge_shards(gathered: torch.Tensor, tp: int, rows: int, K: int, lp: torch.Tensor, ids: torch.Tensor,
                 tree: "_TreeLaunch" = None):
    """Exact merge of ``tp`` gathered shard buffers (float32 ``[tp * rows * (2K + 1)]``,
    layout in :func:`_merge_shards_rows`) into top-K log-probabilities ``lp``
    (float32 ``[rows, K]``) and ids (int64); with ``tree`` (rows = bs * L) the
    same launch builds the trees."""
    gi = gathered.view(torch.int32)
    KP = max(2, _next_pow2(K))
    TPP = max(2, _next_pow2(tp))
    if tree is None:
        _merge_shards_kernel[(rows,)](gathered, gi, rows, tp, K, lp, ids, KP=KP, TPP=TPP,
                                      num_warps=4 if TPP * KP <= 1024 else 8)
        return None
    bs = int(tree.tokens.shape[0])
    nw = 8  # the shard merge's [TP * K] rows want the warps
    _merge_shards_tree_kernel[(bs,)](
        gathered, gi, rows, tp, lp, ids, *tree.ptrs(),
        MKP=KP, TPP=TPP, MERGE2D=bool(CONFIG["merge_rows_2d"]), MRP=max(2, _next_pow2(tree.L)),
        HAS_ROOT=tree.has_root, L=tree.L, K=tree.K, B=tree.B, LP=tree.LP, BP=tree.BP,
        KP=tree.KP, NP=tree.NP, CP=tree.CP, EPS=DEPTH_EPS, GATHER=tree.gather, RS=tree.rstride, num_warps=nw,
    )
    return tree.trees()
