"""Reference DDTree construction: a plain port of the best-first heap builder.

Used by tests and benchmarks only.  One request at a time, Python ``heapq``,
exactly the algorithm of ``build_ddtree_tree`` in the DDTree reference code
(Ringel & Romano): pop the highest-scoring prefix, emit it as a node, push its
next sibling (same parent, next-ranked token) and its first child (next depth,
best token).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Set, Tuple

import numpy as np
import torch

__all__ = ["RefTree", "build_tree", "top_log_probs", "follow_verified_tree"]


@dataclass
class RefTree:
    """A tree in pop order: node 0 is the root (the bonus token, not stored)."""

    tokens: List[int]  # [n] token ids of nodes 1..n
    depths: List[int]  # [n] depth of nodes 1..n (root depth 0)
    parents: List[int]  # [n + 1], parents[0] == -1
    child_maps: List[Dict[int, int]] = field(default_factory=list)
    visibility: np.ndarray = None  # [n + 1, n + 1] bool, ancestors-or-self

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def paths(self) -> Set[Tuple[int, ...]]:
        """The set of root-to-node token paths (root excluded)."""
        out: Set[Tuple[int, ...]] = set()
        memo: Dict[int, Tuple[int, ...]] = {0: ()}
        for i in range(1, len(self.parents)):
            p = memo[self.parents[i]] + (self.tokens[i - 1],)
            memo[i] = p
            out.add(p)
        return out


def top_log_probs(draft_logits: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probabilities per row, as the reference computes them."""
    logits = draft_logits.float()
    top_logits, top_ids = torch.topk(logits, k=k, dim=-1)
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    return top_logits - log_z, top_ids


def build_tree(
    draft_logits: torch.Tensor,
    budget: int,
    *,
    top: Tuple[np.ndarray, np.ndarray] | None = None,
) -> RefTree:
    """Best-first heap construction for one request.

    ``draft_logits``: ``[L, V]`` (any device/dtype).  ``top``: optionally the
    already computed ``(top_log_probs[L, K], top_ids[L, K])`` as numpy arrays
    (the benchmark's "one batched top-k, one copy" path).
    """
    depth_limit = int(draft_logits.shape[0]) if draft_logits is not None else int(top[0].shape[0])
    if budget <= 0 or depth_limit == 0:
        vis = np.ones((1, 1), dtype=np.bool_)
        return RefTree([], [], [-1], [dict()], vis)
    if top is None:
        k = min(budget, int(draft_logits.shape[-1]))
        lp, ids = top_log_probs(draft_logits, k)
        lp_np = lp.to("cpu", torch.float32).numpy()
        ids_np = ids.to("cpu", torch.long).numpy()
    else:
        lp_np, ids_np = top
    k = int(lp_np.shape[-1])

    first = float(lp_np[0, 0])
    heap: List[tuple] = [(-first, (0,), 0, 1, 0, first)]
    tokens: List[int] = []
    depths: List[int] = []
    parents: List[int] = [-1]
    child_maps: List[Dict[int, int]] = [dict()]
    while heap and len(tokens) < budget:
        _, ranks, parent, depth, rank, logw = heapq.heappop(heap)
        tok = int(ids_np[depth - 1, rank])
        idx = len(tokens) + 1
        tokens.append(tok)
        depths.append(depth)
        parents.append(parent)
        child_maps.append(dict())
        child_maps[parent][tok] = idx
        if rank + 1 < k:
            w = logw - float(lp_np[depth - 1, rank]) + float(lp_np[depth - 1, rank + 1])
            heapq.heappush(heap, (-w, ranks[:-1] + (rank + 1,), parent, depth, rank + 1, w))
        if depth < depth_limit:
            w = logw + float(lp_np[depth, 0])
            heapq.heappush(heap, (-w, ranks + (0,), idx, depth + 1, 0, w))

    n = len(tokens) + 1
    vis = np.zeros((n, n), dtype=np.bool_)
    vis[0, 0] = True
    for i in range(1, n):
        vis[i, :i] = vis[parents[i], :i]
        vis[i, i] = True
    return RefTree(tokens, depths, parents, child_maps, vis)


def follow_verified_tree(child_maps: Sequence[Dict[int, int]], posterior: Sequence[int]) -> Tuple[List[int], int]:
    """Greedy acceptance walk: accepted node indices (root first) and the bonus token."""
    accepted = [0]
    cur = 0
    nxt = int(posterior[0])
    while nxt in child_maps[cur]:
        cur = child_maps[cur][nxt]
        accepted.append(cur)
        nxt = int(posterior[cur])
    return accepted, nxt
