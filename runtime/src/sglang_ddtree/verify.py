"""Verify inputs in SGLang's EagleVerifyInput layout, and acceptance.

All functions are batched, keep static shapes, and never read back to the host
(given a preallocated ``mask_buf`` / host ``seq_lens_sum``), so they can run
inside a CUDA graph together with :func:`sglang_ddtree.build_trees`.

Layout (N = budget + 1 tokens per request, node 0 = root/bonus token):
  draft_token            int64 [bs * N]      tree tokens, request-major
  positions              int64 [bs * N]      seq_len[b] + depth
  custom_mask            bool  [sum_b N * (seq_len[b] + N)]  row-major per
                         request: row i = [prefix (all True) | visibility[i]]
                         (SGLang's TreeMaskMode.FULL_MASK)
  retrieve_index         int64 [bs, N]       b * N + i for real nodes, -1 padding
  retrieve_next_token    int64 [bs, N]       first (lowest-index) child, -1 none
  retrieve_next_sibling  int64 [bs, N]       next sibling (by index), -1 none
Padding nodes see the committed prefix only (so no attention row is empty),
nobody sees them, and they are never reachable from the root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .ddtrees import DDTrees

__all__ = [
    "VerifyTensors",
    "build_verify_inputs",
    "build_custom_mask",
    "retrieve_links",
    "greedy_accept",
    "sample_accept",
    "accept_walk",
    "AcceptResult",
    "fill_custom_mask",
    "to_eagle_accept",
    "compact_accept_to_front",
    "kv_move_plan",
]


@dataclass
class VerifyTensors:
    draft_token: torch.Tensor
    positions: torch.Tensor
    custom_mask: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    draft_token_num: int


def retrieve_links(trees: DDTrees):
    """``(retrieve_index, retrieve_next_token, retrieve_next_sibling)`` [bs, N]."""
    parents, valid = trees.parents, trees.valid
    bs, N = parents.shape
    dev = parents.device
    idx = torch.arange(N, device=dev)
    # is_child[b, p, c]: c is a child of p
    is_child = (parents.unsqueeze(1) == idx.view(1, N, 1)) & valid.unsqueeze(1)
    big = torch.full((), N, device=dev, dtype=torch.long)
    cand = torch.where(is_child, idx.view(1, 1, N), big)
    first_child = cand.min(dim=2).values
    next_token = torch.where(first_child < N, first_child, torch.full_like(first_child, -1))
    # next sibling of c: smallest c' > c with the same parent
    same_parent = (parents.unsqueeze(2) == parents.unsqueeze(1)) & valid.unsqueeze(1) & valid.unsqueeze(2)
    later = idx.view(1, 1, N) > idx.view(1, N, 1)
    cand2 = torch.where(same_parent & later, idx.view(1, 1, N), big)
    nxt_sib = cand2.min(dim=2).values
    nxt_sib = torch.where((nxt_sib < N) & (parents >= 0), nxt_sib, torch.full_like(nxt_sib, -1))
    ridx = torch.arange(bs, device=dev).view(bs, 1) * N + idx.view(1, N)
    ridx = torch.where(valid, ridx, torch.full_like(ridx, -1))
    return ridx, next_token, nxt_sib


def build_custom_mask(
    visibility: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_sum: int,
    mask_buf: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """FULL_MASK custom mask: per request ``N x (seq_len + N)``, flattened."""
    bs, N, _ = visibility.shape
    dev = visibility.device
    total = int(seq_lens_sum) * N + bs * N * N
    if mask_buf is None:
        mask = torch.ones(total, dtype=torch.bool, device=dev)
    else:
        mask = mask_buf[:total]
        mask.fill_(True)
    seq_lens = seq_lens.to(device=dev, dtype=torch.long)
    row_len = seq_lens + N  # [bs]
    sizes = row_len * N
    offsets = torch.cumsum(sizes, 0) - sizes  # [bs]
    i = torch.arange(N, device=dev).view(1, N, 1)
    j = torch.arange(N, device=dev).view(1, 1, N)
    flat = offsets.view(bs, 1, 1) + i * row_len.view(bs, 1, 1) + seq_lens.view(bs, 1, 1) + j
    mask.scatter_(0, flat.flatten(), visibility.flatten())
    return mask


def build_verify_inputs(
    trees: DDTrees,
    seq_lens: torch.Tensor,
    seq_lens_sum: Optional[int] = None,
    mask_buf: Optional[torch.Tensor] = None,
) -> VerifyTensors:
    """Tensors for SGLang's tree verification (EagleVerifyInput fields).

    ``seq_lens``: [bs] committed lengths *excluding* the root token, i.e. the
    root is written at position ``seq_lens[b]``.  ``seq_lens_sum`` must be the
    host-side sum (as SGLang keeps it) for graph-safe mask sizing.
    """
    bs, N = trees.tokens.shape
    if seq_lens_sum is None:
        seq_lens_sum = int(seq_lens.sum().item())  # host sync: eager use only
    positions = (seq_lens.to(trees.depths.device, torch.long).view(bs, 1) + trees.depths).flatten()
    ridx, nxt, sib = retrieve_links(trees)
    mask = build_custom_mask(trees.visibility, seq_lens, seq_lens_sum, mask_buf)
    return VerifyTensors(
        draft_token=trees.tokens.flatten(),
        positions=positions,
        custom_mask=mask,
        retrieve_index=ridx,
        retrieve_next_token=nxt,
        retrieve_next_sibling=sib,
        draft_token_num=N,
    )


@dataclass
class AcceptResult:
    accept_index: torch.Tensor  # [bs, D+1] accepted node indices, root first, -1 padded
    num_accepted: torch.Tensor  # [bs] accepted draft tokens (root excluded)
    accept_length: torch.Tensor  # [bs] committed tokens this round = num_accepted + 1 (tau)
    bonus_token: torch.Tensor  # [bs] next root: the target's token after the last accepted node
    committed: torch.Tensor  # [bs, D+1] accepted tokens then bonus, -1 padded


def accept_walk(trees: DDTrees, posterior: torch.Tensor, max_depth: Optional[int] = None) -> AcceptResult:
    """Walk from the root: while ``posterior[cur]`` is a child of ``cur``, move there.

    ``posterior``: [bs, N] the target's token at every node (argmax for greedy,
    a sample for temperature > 0).  Static loop of ``max_depth`` steps.
    """
    tokens, parents, valid = trees.tokens, trees.parents, trees.valid
    bs, N = tokens.shape
    dev = tokens.device
    D = int(max_depth) if max_depth is not None else N - 1
    posterior = posterior.to(torch.long)
    cur = torch.zeros(bs, dtype=torch.long, device=dev)
    alive = torch.ones(bs, dtype=torch.bool, device=dev)
    acc = torch.full((bs, D + 1), -1, dtype=torch.long, device=dev)
    acc[:, 0] = 0
    committed = torch.full((bs, D + 1), -1, dtype=torch.long, device=dev)
    for step in range(D):
        want = posterior.gather(1, cur.view(bs, 1))  # [bs, 1]
        match = (parents == cur.view(bs, 1)) & (tokens == want) & valid
        has = match.any(dim=1) & alive
        nxt = match.to(torch.int32).argmax(dim=1)
        acc[:, step + 1] = torch.where(has, nxt, torch.full_like(nxt, -1))
        committed[:, step] = torch.where(has, want.view(bs), torch.full_like(nxt, -1))
        alive = has
        cur = torch.where(has, nxt, cur)
    num = (acc[:, 1:] >= 0).sum(dim=1)
    bonus = posterior.gather(1, cur.view(bs, 1)).view(bs)
    committed.scatter_(1, num.view(bs, 1), bonus.view(bs, 1))
    return AcceptResult(acc, num, num + 1, bonus, committed)


def greedy_accept(trees: DDTrees, target_logits: torch.Tensor, max_depth: Optional[int] = None) -> AcceptResult:
    """Greedy verification. ``target_logits``: [bs, N, V] or [bs * N, V]."""
    bs, N = trees.tokens.shape
    post = target_logits.view(bs, N, -1).argmax(dim=-1)
    return accept_walk(trees, post, max_depth)


def sample_accept(
    trees: DDTrees,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    max_depth: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> AcceptResult:
    """Target-only sampling (lossless for any drafter): sample the target at
    every node (Gumbel-max on ``logits / T``), then the same walk.  ``temperature``:
    [bs] (>0).  Each committed token is a sample from the target given its
    committed context, so the output has exactly the target's distribution.
    """
    bs, N = trees.tokens.shape
    logits = target_logits.view(bs, N, -1).float() / temperature.view(bs, 1, 1).float()
    u = torch.rand(logits.shape, device=logits.device, generator=generator)
    expo = -torch.log(u.clamp(min=1e-20))  # Exp(1)
    gumbel = -torch.log(expo.clamp(min=1e-20))
    post = (logits + gumbel).argmax(dim=-1)
    return accept_walk(trees, post, max_depth)


# ---------------------------------------------------------------------------
# SGLang EAGLE tree-verify conventions (used by the worker; additive helpers)
# ---------------------------------------------------------------------------


def fill_custom_mask(
    visibility: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    seq_lens_sum: Optional[int] = None,
) -> torch.Tensor:
    """Write the FULL_MASK tree mask into a preallocated buffer of any dtype
    (bool, or the uint8 ``VerifyMask.buffer`` of SGLang's Triton backend).

    Same layout as :func:`build_custom_mask`.  With a host ``seq_lens_sum`` only
    the used prefix of ``out`` is reset to True; without it the whole buffer is
    (what SGLang's ``build_tree_kernel_efficient`` does with ``tree_mask_buf``),
    so no device-to-host read is needed.  Returns ``out`` (the used prefix when
    ``seq_lens_sum`` is given, else the whole buffer).
    """
    bs, N, _ = visibility.shape
    dev = out.device
    if seq_lens_sum is not None:
        total = int(seq_lens_sum) * N + bs * N * N
        if total > out.numel():
            raise ValueError(f"mask buffer too small: {out.numel()} < {total}")
        mask = out[:total]
    else:
        mask = out
    mask.fill_(True)
    seq_lens = seq_lens.to(device=dev, dtype=torch.long)
    row_len = seq_lens + N
    sizes = row_len * N
    offsets = torch.cumsum(sizes, 0) - sizes
    i = torch.arange(N, device=dev).view(1, N, 1)
    j = torch.arange(N, device=dev).view(1, 1, N)
    flat = offsets.view(bs, 1, 1) + i * row_len.view(bs, 1, 1) + seq_lens.view(bs, 1, 1) + j
    mask.scatter_(0, flat.flatten(), visibility.to(device=dev, dtype=mask.dtype).flatten())
    return mask


def to_eagle_accept(res: AcceptResult, num_nodes: int):
    """Our walk's result in the layout of SGLang's ``verify_tree_greedy`` /
    ``eagle_sample`` outputs, so SGLang's commit helpers can consume it.

    Returns ``(predict int32 [bs*N], accept_index int32 [bs, D+1], accept_lens int32 [bs])``:
    ``accept_index`` holds *global* node indices ``b*N + i`` (root first, -1 padded);
    ``predict[accept_index[b, k]]`` is the token committed after accepted node k
    (the next accepted node's token, the bonus for the last one), other entries 0;
    ``accept_lens`` = accepted drafts + 1 (the bonus), SGLang's ``accept_lens``.
    """
    acc = res.accept_index
    bs, W = acc.shape
    N = int(num_nodes)
    dev = acc.device
    base = (torch.arange(bs, device=dev) * N).view(bs, 1)
    glob = torch.where(acc >= 0, acc + base, torch.full_like(acc, -1))
    valid = glob >= 0
    # committed[b, k] is the token after accepted node k (bonus at k = num_accepted);
    # padded entries go to a sink slot (index bs*N) that is dropped.
    ext = torch.zeros(bs * N + 1, dtype=torch.int32, device=dev)
    ext.scatter_(0, torch.where(valid, glob, torch.full_like(glob, bs * N)).flatten(),
                 torch.where(valid, res.committed, torch.zeros_like(res.committed)).to(torch.int32).flatten())
    predict = ext[: bs * N].clone()
    return predict, glob.to(torch.int32), res.accept_length.to(torch.int32)


def compact_accept_to_front(x: torch.Tensor, accept_index: torch.Tensor, bs: int, num_nodes: int) -> torch.Tensor:
    """Gather the accepted path to the front of each request's ``N``-row block
    (same contract as SGLang's ``eagle_worker_common._compact_accept_to_front``:
    ``x`` node-indexed ``[bs*N, ...]``, ``accept_index`` global, -1 padded; padded
    entries land past ``accept_lens`` and are never read)."""
    nd = int(num_nodes)
    s1 = accept_index.shape[1]
    safe = accept_index.to(torch.int64).clamp(min=0).reshape(-1)
    out = x.clone()
    out.view(bs, nd, *x.shape[1:])[:, :s1] = x[safe].view(bs, s1, *x.shape[1:])
    return out


def kv_move_plan(accept_index: torch.Tensor, accept_lens: torch.Tensor, out_cache_loc: torch.Tensor):
    """``(tgt_cache_loc, src_cache_loc)`` int64 ``[bs*(D+1)]`` as SGLang's
    ``spec_utils.move_accept_tokens_to_target_kvcache`` builds them: targets are
    the first ``accept_lens[b]`` slots of request b's verify window, sources the
    slots of its accepted nodes (root first), both packed request-major with
    zero padding at the end.  ``move_kv_cache(tgt, src)`` then leaves the KV of
    accepted node k at committed position ``seq_len + k``.  (Reference; the
    worker calls SGLang's own function.)"""
    bs, W = accept_index.shape
    dev = accept_index.device
    size = bs * W
    loc = out_cache_loc.view(bs, -1).to(torch.int64)
    N = loc.shape[1]
    lens = accept_lens.to(torch.int64)
    cols = torch.arange(W, device=dev).view(1, W)
    valid = cols < lens.view(bs, 1)
    dst_rank = (torch.cumsum(valid.flatten().to(torch.int64), 0) - 1).view(bs, W)
    tgt = torch.zeros(size, dtype=torch.int64, device=dev)
    src = torch.zeros(size, dtype=torch.int64, device=dev)
    front = loc.gather(1, cols.clamp(max=N - 1).expand(bs, W))
    idx = torch.where(valid, dst_rank, torch.full_like(dst_rank, size))
    tgt_ext = torch.zeros(size + 1, dtype=torch.int64, device=dev)
    tgt_ext.scatter_(0, idx.flatten(), front.flatten())
    tgt.copy_(tgt_ext[:size])
    acc = accept_index.to(torch.int64)
    avalid = acc >= 0
    a_rank = (torch.cumsum(avalid.flatten().to(torch.int64), 0) - 1).view(bs, W)
    flat_loc = loc.flatten()
    vals = flat_loc[acc.clamp(min=0)]
    src_ext = torch.zeros(size + 1, dtype=torch.int64, device=dev)
    src_ext.scatter_(0, torch.where(avalid, a_rank, torch.full_like(a_rank, size)).flatten(), vals.flatten())
    src.copy_(src_ext[:size])
    return tgt, src
