"""Vocab-parallel top-K in plain torch: one shard's top-K + logsumexp, the exact
merge of the shards' top-K, and the eager torch draft head built on them.

Below :mod:`sglang_ddtree.head` (whose torch path merges shards with
:func:`merge_shard_tops`) and :mod:`sglang_ddtree.worker` (which re-exports
these names); imports only :mod:`sglang_ddtree.tree`.
"""

from __future__ import annotations

import torch

from .tree import DDTrees, build_trees_from_top

__all__ = ["shard_top_logits", "merge_shard_tops", "draft_top_log_probs", "draft_trees"]


def shard_top_logits(hidden: torch.Tensor, weight: torch.Tensor, k: int, vocab_start: int = 0, chunk_rows: int = 256):
    """One vocab shard of the LM head: ``(top_logits f32 [n, k'], ids int64 [n, k'], lse f32 [n])``
    with ``k' = min(k, shard vocab)`` and ids global (``+ vocab_start``).  Rows in
    chunks so the ``[n, V]`` logits never exist at once."""
    n = int(hidden.shape[0])
    Vs = int(weight.shape[0])
    kk = min(int(k), Vs)
    dev = hidden.device
    vals = torch.empty((n, kk), dtype=torch.float32, device=dev)
    ids = torch.empty((n, kk), dtype=torch.int64, device=dev)
    lse = torch.empty((n,), dtype=torch.float32, device=dev)
    for s in range(0, n, int(chunk_rows)):
        e = min(n, s + int(chunk_rows))
        hs = hidden[s:e]
        if hs.dtype != weight.dtype:
            hs = hs.to(weight.dtype)
        logits = torch.matmul(hs, weight.T).float()
        lse[s:e] = torch.logsumexp(logits, dim=-1)
        v, i = torch.topk(logits, kk, dim=-1)
        vals[s:e] = v
        ids[s:e] = i + int(vocab_start)
    return vals, ids, lse


def merge_shard_tops(vals: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor, k: int):
    """Merge per-shard top-K: ``vals/ids [tp, n, k']``, ``lse [tp, n]`` ->
    ``(top_lp f32 [n, k], top_id int64 [n, k])`` = the exact top-k log-softmax of
    the full vocabulary (global lse = logsumexp of the shards' lse; the global
    top-k is within the union of the shards' top-k)."""
    tp, n, kk = vals.shape
    k = min(int(k), tp * kk)
    glse = torch.logsumexp(lse.float(), dim=0)  # [n]
    cat_v = vals.permute(1, 0, 2).reshape(n, tp * kk).float()
    cat_i = ids.permute(1, 0, 2).reshape(n, tp * kk)
    v, j = torch.topk(cat_v, k, dim=-1)
    return v - glse.view(n, 1), cat_i.gather(1, j)


def draft_top_log_probs(
    draft_hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    vocab_start: int = 0,
    tp_group=None,
):
    """Drafter block hidden states ``[bs, block, H]`` (position 0 = the bonus/root)
    -> ``(top_lp [bs, L, k], top_id [bs, L, k])`` over the target vocabulary.
    ``weight``: this rank's ``[V_shard, H]`` (padding rows excluded);
    ``tp_group``: SGLang group with ``world_size`` and ``all_gather_into_tensor``
    (None / world_size 1 = unsharded)."""
    bs, blk, H = draft_hidden.shape
    L = blk - 1
    hs = draft_hidden[:, 1:, :].reshape(bs * L, H)
    vals, ids, lse = shard_top_logits(hs, weight, k, vocab_start)
    tp = 1 if tp_group is None else int(tp_group.world_size)
    if tp == 1:
        top_lp, top_id = vals - lse.view(-1, 1), ids
    else:
        n, kk = vals.shape
        g_v = torch.empty((tp * n * kk,), dtype=vals.dtype, device=vals.device)
        g_i = torch.empty((tp * n * kk,), dtype=ids.dtype, device=ids.device)
        g_l = torch.empty((tp * n,), dtype=lse.dtype, device=lse.device)
        tp_group.all_gather_into_tensor(g_v, vals.contiguous().view(-1))
        tp_group.all_gather_into_tensor(g_i, ids.contiguous().view(-1))
        tp_group.all_gather_into_tensor(g_l, lse.contiguous())
        top_lp, top_id = merge_shard_tops(g_v.view(tp, n, kk), g_i.view(tp, n, kk), g_l.view(tp, n), k)
    K = top_lp.shape[-1]
    return top_lp.view(bs, L, K), top_id.view(bs, L, K)


def draft_trees(draft_hidden, weight, budget: int, root_tokens, *, vocab_start: int = 0, tp_group=None) -> DDTrees:
    """Drafter hidden states -> DDTrees (root = bonus token): the eager torch
    head the worker ran before :class:`~sglang_ddtree.head.DraftTreeHead` (row
    chunks, fp32 logits, ``torch.topk``, torch beam); kept as the benchmark's
    baseline and a plain reference."""
    top_lp, top_id = draft_top_log_probs(
        draft_hidden, weight, min(int(budget), int(weight.shape[0])), vocab_start=vocab_start, tp_group=tp_group
    )
    return build_trees_from_top(top_lp, top_id, int(budget), root_tokens)
