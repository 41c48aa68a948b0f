"""Batched, static-shape DDTree construction.

``build_trees(draft_logits[bs, L, V], budget)`` returns :class:`DDTrees` in a
``[bs, budget + 1]`` layout (node 0 = the root / bonus token).  For every
request the set of root-to-node token paths equals the best-first heap
construction (:mod:`sglang_ddtree.reference`): the ``budget`` highest-scoring
prefixes, where a prefix's score is the sum of its tokens' draft
log-probabilities.

Algorithm (heap-free): scores are additive, so every parent of a depth-d
top-B prefix is in the depth-(d-1) top-B.  Keep a beam of width B per depth
(``beam_d = topk(beam_{d-1} (+) top_lp[d], B)``), then take one global top-B
over all depths' beams and order the winners depth-major (parents first).
Every shape is static and nothing reads back to the host, so the whole thing
can be captured in a CUDA graph.

Two implementations:
  * pure torch (any device; CPU in tests/CI),
  * on CUDA with Triton: a fused one-pass top-K + logsumexp kernel over the
    logits and a fused one-program-per-request beam/selection/assembly kernel
    (see :mod:`sglang_ddtree.triton_kernels`).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from .ddtrees import DEPTH_EPS, DDTrees  # the container lives below the builders (re-exported)

__all__ = ["DDTrees", "build_trees", "build_trees_from_top", "top_log_probs"]


def top_log_probs(draft_logits: torch.Tensor, k: int):
    """``(top_lp[bs, L, k] float32, top_id[bs, L, k] int64)`` (pure torch)."""
    logits = draft_logits.float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    top, ids = torch.topk(logits, k, dim=-1)
    return top - lse, ids


def _use_triton(x: torch.Tensor) -> bool:
    if os.environ.get("SGLANG_DDTREE_DISABLE_TRITON", "0") == "1":
        return False
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return False
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def build_trees(
    draft_logits: torch.Tensor,
    budget: int,
    root_tokens: Optional[torch.Tensor] = None,
    *,
    impl: str = "auto",
) -> DDTrees:
    """Build one DDTree per request.

    draft_logits: ``[bs, L, V]`` drafter logits for block positions 1..L.
    budget: number of non-root nodes B (verify length is B + 1).
    root_tokens: optional ``[bs]`` bonus tokens written to node 0.
    impl: "auto" (Triton on CUDA when available), "torch", or "triton".
    """
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must be [bs, L, V], got {tuple(draft_logits.shape)}")
    if budget < 1:
        raise ValueError("budget must be >= 1")
    bs, L, V = draft_logits.shape
    if L < 1:
        raise ValueError("need at least one draft position (L >= 1)")
    K = min(budget, V)
    global LAST_IMPL
    use_triton = impl == "triton" or (impl == "auto" and _use_triton(draft_logits))
    top = None
    if use_triton and not (impl == "auto" and (_BROKEN["topk"] or _BROKEN["tree"])):
        from . import triton_kernels as tk

        try:
            trees, top = tk.build_trees_triton(draft_logits, budget, root_tokens)
            if trees is not None:
                cfg = tk.regime_config(bs * L, V)
                LAST_IMPL = "triton-fused" if tk.fused_tree(cfg, budget) else "triton-topk+triton-tree"
                return trees
            LAST_IMPL = "triton-topk+torch-tree"
        except Exception as e:  # pragma: no cover - GPU only
            if impl == "triton":
                raise
            _mark_broken("tree", e)
            top = None
    if top is None and use_triton and not (impl == "auto" and _BROKEN["topk"]):
        from . import triton_kernels as tk

        try:
            top = tk.topk_logsumexp(draft_logits, K)
            LAST_IMPL = "triton-topk+torch-tree"
        except Exception as e:  # pragma: no cover - GPU only
            if impl == "triton":
                raise
            _mark_broken("topk", e)
    if top is None:
        top = top_log_probs(draft_logits, K)
        LAST_IMPL = "torch"
    return build_trees_from_top(top[0], top[1], budget, root_tokens)


LAST_IMPL = ""
_BROKEN = {"topk": False, "tree": False}


def _mark_broken(what: str, e: Exception) -> None:
    import traceback
    import warnings

    _BROKEN[what] = True
    warnings.warn(f"sglang_ddtree: Triton {what} kernel failed, using the torch path: {e!r}")
    traceback.print_exc()


def build_trees_from_top(
    top_lp: torch.Tensor,
    top_id: torch.Tensor,
    budget: int,
    root_tokens: Optional[torch.Tensor] = None,
) -> DDTrees:
    """Pure-torch beam + global selection + assembly from ``[bs, L, K]`` top-K."""
    bs, L, K = top_lp.shape
    B = int(budget)
    N = B + 1
    dev = top_lp.device
    lp = top_lp.double()
    ninf = float("-inf")

    # ---- beam over depths: scores / parent slot / token rank per depth ----
    scores = torch.full((bs, L, B), ninf, dtype=torch.float64, device=dev)
    pslot = torch.zeros((bs, L, B), dtype=torch.long, device=dev)
    rank = torch.zeros((bs, L, B), dtype=torch.long, device=dev)
    scores[:, 0, :K] = lp[:, 0]
    rank[:, 0, :K] = torch.arange(K, device=dev)
    beam = scores[:, 0]
    for d in range(1, L):
        cand = (beam.unsqueeze(2) + lp[:, d].unsqueeze(1)).flatten(1)  # [bs, B*K]
        s, j = cand.topk(B, dim=1)
        scores[:, d] = s
        pslot[:, d] = torch.div(j, K, rounding_mode="floor")
        rank[:, d] = j % K
        beam = s

    # ---- global top-B over all depths, ordered depth-major ----
    depth_of = torch.arange(L, device=dev, dtype=torch.float64).view(1, L, 1)
    key = (scores - DEPTH_EPS * depth_of).flatten(1)  # [bs, L*B]
    sel_s, sel = key.topk(B, dim=1)
    valid_sel = torch.isfinite(sel_s)
    LB = L * B
    order_key = torch.where(valid_sel, sel, torch.full_like(sel, LB))
    flat, _ = order_key.sort(dim=1)  # depth-major, invalid last (== LB)
    nvalid = flat < LB
    flat_c = torch.where(nvalid, flat, torch.zeros_like(flat))
    d_idx = torch.div(flat_c, B, rounding_mode="floor")

    node_ids = torch.arange(1, N, device=dev).expand(bs, B)
    posmap = torch.zeros((bs, LB + 1), dtype=torch.long, device=dev)
    posmap.scatter_(1, torch.where(nvalid, flat, torch.full_like(flat, LB)), node_ids)

    ps = pslot.flatten(1).gather(1, flat_c)
    parent_flat = ((d_idx - 1).clamp(min=0) * B + ps)
    parent_node = torch.where(d_idx == 0, torch.zeros_like(ps), posmap.gather(1, parent_flat))
    rk = rank.flatten(1).gather(1, flat_c)
    tok = top_id.long().view(bs, L * K).gather(1, d_idx * K + rk)

    tokens = torch.zeros((bs, N), dtype=torch.long, device=dev)
    parents = torch.full((bs, N), -1, dtype=torch.long, device=dev)
    depths = torch.zeros((bs, N), dtype=torch.long, device=dev)
    valid = torch.ones((bs, N), dtype=torch.bool, device=dev)
    if root_tokens is not None:
        tokens[:, 0] = root_tokens.to(device=dev, dtype=torch.long)
    tokens[:, 1:] = torch.where(nvalid, tok, torch.zeros_like(tok))
    parents[:, 1:] = torch.where(nvalid, parent_node, torch.full_like(parent_node, -1))
    depths[:, 1:] = torch.where(nvalid, d_idx + 1, torch.zeros_like(d_idx))
    valid[:, 1:] = nvalid
    visibility = visibility_from_parents(parents, valid, max_depth=L)
    return DDTrees(tokens, parents, depths, visibility, valid)


def visibility_from_parents(parents: torch.Tensor, valid: torch.Tensor, max_depth: int) -> torch.Tensor:
    """``vis[b, i, j]`` = j is i or an ancestor of i (static loop over depth)."""
    bs, N = parents.shape
    dev = parents.device
    vis = torch.zeros((bs, N, N + 1), dtype=torch.bool, device=dev)  # column N = sink
    cur = torch.arange(N, device=dev).expand(bs, N).clone()
    alive = valid.clone()
    for _ in range(max_depth + 1):
        col = torch.where(alive, cur, torch.full_like(cur, N))
        vis.scatter_(2, col.unsqueeze(-1), True)
        nxt = parents.gather(1, cur.clamp(min=0))
        alive = alive & (nxt >= 0)
        cur = nxt.clamp(min=0)
    return vis[:, :, :N].contiguous()
