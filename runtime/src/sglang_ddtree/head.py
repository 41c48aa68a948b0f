"""The decode step's draft head on the fast path: drafter hidden states -> DDTrees.

``DraftTreeHead(weight, budget, block_size, vocab_start=, tp_group=, max_bs=)``
is called like SGLang's DFlash draft samplers, ``head(hidden_states [bs * block, H],
input_ids [bs * block])`` (position 0 of each block = the bonus token = the
root), and returns the batch's :class:`~sglang_ddtree.tree.DDTrees`.  Per call,
on this rank's vocabulary shard ``weight [V_shard, H]``:

1. **LM-head GEMM into logits of the weight's dtype** (bf16): up to 64 rows a
   Triton GEMM (``triton_kernels.head_gemm``: faster than cuBLAS there, bound by
   reading the weight), else ``torch.mm``.  Small
   batches (``bs * block <= full_rows_max``, where the GEMM is bound by
   reading the weight) multiply the whole block, root rows included, and the
   top-K reads rows 1..L in place; larger ones copy rows 1..L first (no
   wasted GEMM rows).  Logits are bounded by ``max_logits_bytes``: larger
   batches run in request chunks (a static loop: unrolled in a CUDA graph).
2. **TP 1**: the fused Triton top-K + logsumexp and the tree kernel
   (``triton_kernels.topk_rows``; one launch with the tree for the "small"
   configuration) -- the same kernels and configuration as
   ``build_trees`` on the logits.
   **TP > 1**: per shard the same top-K kernels storing the raw top-K values,
   global ids and the row's logsumexp into one float32 send buffer
   (``bs * L * (2K + 1)`` values, ids as int32 bits), ONE fixed-shape
   ``tp_group.all_gather_into_tensor``, then one kernel per request that
   merges the shards (exact: the global top-K lies in the union of the
   shards' top-K, global lse = logsumexp of the shards' lse; ties ordered by
   global id as within one shard) and builds the tree.
   ``tp_group``: an SGLang ``GroupCoordinator`` (``world_size``,
   ``all_gather_into_tensor(out, inp)``: what the worker passes) or a
   ``torch.distributed`` process group (wrapped in :class:`DistGroup`; the
   multi-GPU benchmark ``bench/tp_head.py``).  ``shard_merge=True`` takes the
   TP > 1 flow (send buffer, the group's all-gather, merge) at world size 1
   too: that benchmark's one-GPU proof of the collective inside the graph.
3. Outputs go to static buffers of ``max_bs`` requests; :meth:`trees` returns
   views of them (what a CUDA-graph replay of the call wrote).

No host synchronisation, no data-dependent shapes: the call is captured as is
(the worker folds it into DFlash's draft CUDA graph, one per captured batch
size).  Without Triton (CPU, no ``TRITON_INTERPRET``) the same steps run in
torch (``impl="torch"``).
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch

from .tree import DDTrees, _use_triton, build_trees_from_top, top_log_probs

# logits of one GEMM chunk at most (bytes); SGLANG_DDTREE_HEAD_MAX_LOGITS_MB overrides
DEFAULT_MAX_LOGITS_BYTES = 256 << 20
# up to this many GEMM rows (bs * block) the whole block is multiplied (root rows too)
DEFAULT_FULL_ROWS_MAX = 128
NEG = -3.3e38


def _row_copy() -> str:
    from .triton_kernels import CONFIG

    return CONFIG.get("row_copy", "torch")


class DraftTreeHead:
    def __init__(
        self,
        weight: torch.Tensor,
        budget: int,
        block_size: int,
        *,
        vocab_start: int = 0,
        tp_group=None,
        vocab_size: Optional[int] = None,
        max_bs: int = 0,
        max_logits_bytes: Optional[int] = None,
        full_rows_max: int = DEFAULT_FULL_ROWS_MAX,
        cfg: Optional[dict] = None,
        impl: str = "auto",
        shard_merge: bool = False,
    ):
        if weight.dim() != 2:
            raise ValueError(f"weight must be [V_shard, H], got {tuple(weight.shape)}")
        if int(block_size) < 2:
            raise ValueError("block_size must be >= 2")
        self.weight = weight if weight.is_contiguous() else weight.contiguous()
        self.budget = int(budget)
        self.block = int(block_size)
        self.L = self.block - 1
        self.N = self.budget + 1
        self.vocab_start = int(vocab_start)
        if _is_process_group(tp_group):
            tp_group = DistGroup(tp_group)
        ws = 1 if tp_group is None else int(tp_group.world_size)
        if shard_merge and tp_group is None:
            raise ValueError("shard_merge needs a tp_group")
        # the shard flow: send buffer, all-gather, merge (TP > 1; at TP 1 only when asked)
        self.merge = ws > 1 or bool(shard_merge)
        self.tp_group = tp_group if self.merge else None
        self.tp = ws
        self.Vs = int(self.weight.shape[0])
        self.H = int(self.weight.shape[1])
        V = int(vocab_size) if vocab_size is not None else self.Vs * self.tp
        self.K = min(self.budget, V)  # global top-K
        self.Ks = min(self.K, self.Vs)  # entries one shard contributes
        if self.merge and self.vocab_start + self.Vs >= (1 << 29):
            raise ValueError("DDTREE head: vocabulary ids must be < 2**29")
        if max_logits_bytes is None:
            env = os.environ.get("SGLANG_DDTREE_HEAD_MAX_LOGITS_MB")
            max_logits_bytes = int(float(env) * (1 << 20)) if env else DEFAULT_MAX_LOGITS_BYTES
        self.max_logits_bytes = int(max_logits_bytes)
        self.full_rows_max = int(full_rows_max)
        self.cfg = cfg
        self.impl = impl
        self.use_triton = impl == "triton" or (impl == "auto" and _use_triton(self.weight))
        self.device = self.weight.device
        self._pdl_ok = False  # programmatic dependent launch possible on this device
        if self.use_triton:
            from .triton_kernels import pdl_supported

            self._pdl_ok = pdl_supported(self.device)
        self._cap = 0
        self._out = None
        # called once, at the first call (the worker: compile every kernel the
        # captured batch sizes need, from the Triton cache or anew, inside the
        # draft graph's capture; aot.prepare_head)
        self.before_first_call = None
        if max_bs:
            self._alloc(int(max_bs))

    # ------------------------------------------------------------------ sizes
    def chunk_requests(self, bs: int):
        """``(full, requests per GEMM chunk)`` for a batch of ``bs``."""
        full = bs * self.block <= self.full_rows_max
        per_req = (self.block if full else self.L) * self.Vs * self.weight.element_size()
        n = max(1, math.ceil(bs * per_req / max(1, self.max_logits_bytes)))
        return full, math.ceil(bs / n)

    def logits_bytes(self, bs: int) -> int:
        """Bytes of the logits one call holds at once (one GEMM chunk)."""
        full, cr = self.chunk_requests(bs)
        return cr * (self.block if full else self.L) * self.Vs * self.weight.element_size()

    # ------------------------------------------------------------------ outputs
    def _alloc(self, cap: int):
        dev, N = self.device, self.N
        self._out = dict(
            tokens=torch.zeros((cap, N), dtype=torch.int64, device=dev),
            parents=torch.full((cap, N), -1, dtype=torch.int64, device=dev),
            depths=torch.zeros((cap, N), dtype=torch.int64, device=dev),
            valid=torch.zeros((cap, N), dtype=torch.int8, device=dev),
            vis=torch.zeros((cap, N, N), dtype=torch.int8, device=dev),
        )
        self._cap = cap

    def _outputs(self, bs: int) -> dict:
        if self._cap == 0:
            self._alloc(bs)
        if bs <= self._cap:
            return {k: v[:bs] for k, v in self._out.items()}
        # more requests than the static buffers hold (eager only: graphs are
        # captured for at most max_bs): buffers of this call
        dev, N = self.device, self.N
        return dict(tokens=torch.empty((bs, N), dtype=torch.int64, device=dev),
                    parents=torch.empty((bs, N), dtype=torch.int64, device=dev),
                    depths=torch.empty((bs, N), dtype=torch.int64, device=dev),
                    valid=torch.empty((bs, N), dtype=torch.int8, device=dev),
                    vis=torch.empty((bs, N, N), dtype=torch.int8, device=dev))

    @staticmethod
    def _trees(o: dict) -> DDTrees:
        return DDTrees(o["tokens"], o["parents"], o["depths"], o["vis"].view(torch.bool), o["valid"].view(torch.bool))

    def trees(self, bs: int) -> DDTrees:
        """The first ``bs`` requests' trees in the static buffers (what the last
        call or CUDA-graph replay of a batch >= bs wrote)."""
        if bs > self._cap:
            raise RuntimeError(f"DDTREE head: batch {bs} > static capacity {self._cap}")
        return self._trees({k: v[:bs] for k, v in self._out.items()})

    # ------------------------------------------------------------------ the call
    def __call__(self, hidden_states: torch.Tensor, input_ids: Optional[torch.Tensor] = None, *,
                 root_tokens: Optional[torch.Tensor] = None) -> DDTrees:
        hook, self.before_first_call = self.before_first_call, None
        if hook is not None:
            hook()
        hid = hidden_states.reshape(-1, self.H)
        bs = int(hid.shape[0]) // self.block
        if root_tokens is None and input_ids is not None:
            root_tokens = input_ids.reshape(bs, self.block)[:, 0]
        out = self._outputs(bs)
        if self.use_triton:
            self._triton(hid, bs, root_tokens, out)
        else:
            self._torch(hid, bs, root_tokens, out)
        return self._trees(out)

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[bs, L, V_shard]``: the logits the call computes, by the same GEMM
        calls (checks / benchmark: ``build_trees`` on them is the reference)."""
        hid = hidden_states.reshape(-1, self.H)
        bs = int(hid.shape[0]) // self.block
        full, cr = self.chunk_requests(bs)
        parts = []
        for c0 in range(0, bs, cr):
            c1 = min(bs, c0 + cr)
            lg, _ = self._gemm_rows(hid, c0, c1, full)
            if full:
                lg = lg.view(c1 - c0, self.block, self.Vs)[:, 1:]
            parts.append(lg.reshape(c1 - c0, self.L, self.Vs))
        return torch.cat(parts)

    def _gemm_rows(self, hid, c0, c1, full, pdl=False):
        """Logits of requests c0..c1: ``(logits [rows, V_shard], rowmap)``."""
        W = self.weight
        if full:
            x = hid[c0 * self.block:c1 * self.block]
            rowmap = (self.L, self.block, 1)
        else:
            rowmap = (1, 1, 0)
            if self.use_triton and hid.is_contiguous() and _row_copy() == "triton":
                from .triton_kernels import gather_rows

                x = gather_rows(hid, c0, c1, self.block)
            else:
                x = hid.view(-1, self.block, self.H)[c0:c1, 1:].reshape((c1 - c0) * self.L, self.H)
        if x.dtype != W.dtype:
            x = x.to(W.dtype)
        if self.use_triton:
            from . import triton_kernels as tk

            gcfg = tk.head_gemm_config(int(x.shape[0]), self.Vs, self.H, W.dtype)
            if gcfg is not None:
                return tk.head_gemm(x, W, gcfg, pdl=pdl), rowmap
        return torch.mm(x, W.t()), rowmap

    def _pdl(self, n: int) -> bool:
        """Programmatic dependent launch with early triggers for a chunk of ``n``
        requests (few rows: the launches overlap the kernel before;
        ``CONFIG["pdl_rows_max"]``).  Above it the top-K's first kernel is
        launched plainly and the later ones with PDL but no early trigger: the
        same compiled kernels for every batch size (issue 36)."""
        from .triton_kernels import CONFIG

        return self._pdl_ok and n * self.L <= int(CONFIG.get("pdl_rows_max") or 0)

    def _send_views(self, send, rows):
        K = self.K
        vals = send[: rows * K].view(rows, K)
        ids = send[rows * K: 2 * rows * K].view(torch.int32).view(rows, K)
        lse = send[2 * rows * K:]
        return vals, ids, lse

    def _gather(self, send):
        g = torch.empty((self.tp * send.numel(),), dtype=send.dtype, device=send.device)
        self.tp_group.all_gather_into_tensor(g, send)
        return g

    def _triton(self, hid, bs, root, out):
        from . import triton_kernels as tk

        L, K, B, dev = self.L, self.K, self.budget, self.device
        rows = bs * L
        full, cr = self.chunk_requests(bs)
        tree_ok = tk.tree_kernel_supported(L, B, K)
        lp = torch.empty((bs, L, K), dtype=torch.float32, device=dev)
        ids = torch.empty((bs, L, K), dtype=torch.int64, device=dev)
        if self.merge:
            send = torch.empty((rows * (2 * K + 1),), dtype=torch.float32, device=dev)
            s_val, s_id, s_lse = self._send_views(send, rows)
            if self.Ks < K:  # a shard smaller than K: the rest of its list never wins
                s_val[:, self.Ks:].fill_(NEG)
                s_id[:, self.Ks:].zero_()
        for c0 in range(0, bs, cr):
            c1 = min(bs, c0 + cr)
            n = c1 - c0
            early = self._pdl(n)
            pdl = self._pdl_ok and (early or bool(tk.CONFIG.get("pdl_late", True)))
            logits, rowmap = self._gemm_rows(hid, c0, c1, full, early)
            cfg = self.cfg or tk.regime_config(n * L, self.Vs)
            r0, r1 = c0 * L, c1 * L
            if self.merge:
                if self.Ks == K:
                    tk.topk_rows(logits, n * L, K, s_val[r0:r1], s_id[r0:r1], cfg=cfg, rowmap=rowmap,
                                 raw=(s_lse[r0:r1], self.vocab_start), pdl=pdl, early=early)
                else:
                    tv = torch.empty((n * L, self.Ks), dtype=torch.float32, device=dev)
                    ti = torch.empty((n * L, self.Ks), dtype=torch.int32, device=dev)
                    tk.topk_rows(logits, n * L, self.Ks, tv, ti, cfg=cfg, rowmap=rowmap,
                                 raw=(s_lse[r0:r1], self.vocab_start))
                    s_val[r0:r1, : self.Ks].copy_(tv)
                    s_id[r0:r1, : self.Ks].copy_(ti)
                continue
            lp_c, id_c = lp[c0:c1].view(n * L, K), ids[c0:c1].view(n * L, K)
            if not tree_ok:
                tk.topk_rows(logits, n * L, K, lp_c, id_c, cfg=cfg, rowmap=rowmap, pdl=pdl, early=early)
                continue
            r = None if root is None else root[c0:c1]
            tr = tk._TreeLaunch(n, L, K, B, r, dev, out={k: v[c0:c1] for k, v in out.items()})
            if tk.fused_tree(cfg, B):
                tk.topk_rows(logits, n * L, K, lp_c, id_c, cfg=cfg, rowmap=rowmap, nreq=n, pdl=pdl, early=early,
                             _tree=tr)
            else:
                tk.topk_rows(logits, n * L, K, lp_c, id_c, cfg=cfg, rowmap=rowmap, pdl=pdl, early=early)
                tk._launch_tree(lp_c.view(n, L, K), id_c.view(n, L, K), tr, pdl=pdl, early=early)
        if self.merge:
            g = self._gather(send)
            if tree_ok:
                tr = tk._TreeLaunch(bs, L, K, B, root, dev, out=out)
                tk.merge_shards(g, self.tp, rows, K, lp.view(rows, K), ids.view(rows, K), tree=tr)
                return
            tk.merge_shards(g, self.tp, rows, K, lp.view(rows, K), ids.view(rows, K))
        if not tree_ok:  # B > 64 or L > 16: the torch beam on the same top-K
            self._copy_out(build_trees_from_top(lp, ids, B, root), out)

    @staticmethod
    def _copy_out(t: DDTrees, out: dict):
        out["tokens"].copy_(t.tokens)
        out["parents"].copy_(t.parents)
        out["depths"].copy_(t.depths)
        out["valid"].copy_(t.valid.to(torch.int8))
        out["vis"].copy_(t.visibility.to(torch.int8))

    def _torch(self, hid, bs, root, out):
        """The same steps in torch (CPU; no fused kernels)."""
        from .shards import merge_shard_tops

        L, K, B, dev = self.L, self.K, self.budget, self.device
        rows = bs * L
        full, cr = self.chunk_requests(bs)
        lp = torch.empty((rows, K), dtype=torch.float32, device=dev)
        ids = torch.empty((rows, K), dtype=torch.int64, device=dev)
        if self.merge:
            send = torch.empty((rows * (2 * K + 1),), dtype=torch.float32, device=dev)
            s_val, s_id, s_lse = self._send_views(send, rows)
            s_val.fill_(NEG)
            s_id.zero_()
        for c0 in range(0, bs, cr):
            c1 = min(bs, c0 + cr)
            r0, r1 = c0 * L, c1 * L
            logits, rowmap = self._gemm_rows(hid, c0, c1, full)
            if full:
                logits = logits.view(c1 - c0, self.block, self.Vs)[:, 1:].reshape(r1 - r0, self.Vs)
            x = logits.float()
            if not self.merge:
                a, b = top_log_probs(x.view(1, r1 - r0, self.Vs), K)
                lp[r0:r1], ids[r0:r1] = a[0], b[0]
            else:
                v, i = torch.topk(x, self.Ks, dim=-1)
                s_val[r0:r1, : self.Ks] = v
                s_id[r0:r1, : self.Ks] = (i + self.vocab_start).to(torch.int32)
                s_lse[r0:r1] = torch.logsumexp(x, dim=-1)
        if self.merge:
            g = self._gather(send).view(self.tp, -1)
            gv = g[:, : rows * K].reshape(self.tp, rows, K)
            gi = g[:, rows * K: 2 * rows * K].contiguous().view(torch.int32).view(self.tp, rows, K).long()
            gl = g[:, 2 * rows * K:]
            lp, ids = merge_shard_tops(gv, gi, gl, K)
        self._copy_out(build_trees_from_top(lp.view(bs, L, K), ids.view(bs, L, K), B, root), out)


def _is_process_group(g) -> bool:
    if g is None or not torch.distributed.is_available():
        return False
    return isinstance(g, torch.distributed.ProcessGroup)


class DistGroup:
    """A ``torch.distributed`` process group behind the two members the head
    uses of SGLang's ``GroupCoordinator``: ``world_size`` and
    ``all_gather_into_tensor(out, inp)`` (the ``torch.distributed`` all-gather into
    one tensor on that group: NCCL captures it in a CUDA graph, gloo runs it eagerly)."""

    def __init__(self, pg):
        self.pg = pg
        self.world_size = int(torch.distributed.get_world_size(pg))
        self.rank = int(torch.distributed.get_rank(pg))

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor):
        all_gather_single(out, inp, self.pg)


def all_gather_single(out: torch.Tensor, inp: torch.Tensor, group=None):
    """``torch.distributed.all_gather_single`` (where torch has it; the same collective as
    the ``all_gather_into_tensor`` it deprecates), else ``all_gather_into_tensor``."""
    fn = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor
    fn(out, inp, group=group)


class LoopbackGroup:
    """A stand-in for a TP group on one device (tests, the benchmark's simulated
    TP): ``all_gather_into_tensor`` returns ``others`` (the other ranks' send
    buffers, a list with ``None`` at this rank) with this rank's buffer in its
    place; with ``others=None`` it records the buffer (``self.sent``) and
    returns zeros."""

    def __init__(self, world_size: int, rank: int = 0, others=None):
        self.world_size = int(world_size)
        self.rank = int(rank)
        self.others = others
        self.sent = None
        self._stacked = None

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor):
        if self.others is None:
            self.sent = inp.clone()
            out.zero_()
            return
        if self._stacked is None:  # the other ranks' buffers, stacked once: two copies per call
            self._stacked = torch.stack([torch.zeros_like(inp) if o is None else o.view(-1) for o in self.others])
        parts = out.view(self.world_size, -1)
        parts.copy_(self._stacked)
        parts[self.rank].copy_(inp)


def simulate_tp(weight: torch.Tensor, tp: int, hidden: torch.Tensor, input_ids=None, *, root_tokens=None,
                budget: int, block_size: int, **kw):
    """Rank 0's trees of a TP-``tp`` head over equal vocabulary shards of
    ``weight`` (every rank's shard computed here, on one device).  Returns
    ``(trees, shard bounds)``."""
    V = int(weight.shape[0])
    b = [r * V // tp for r in range(tp + 1)]
    sent = []
    for r in range(tp):
        rec = LoopbackGroup(tp, r)
        h = DraftTreeHead(weight[b[r]:b[r + 1]], budget, block_size, vocab_start=b[r], tp_group=rec, vocab_size=V, **kw)
        h(hidden, input_ids, root_tokens=root_tokens)
        sent.append(rec.sent)
    h0 = DraftTreeHead(weight[b[0]:b[1]], budget, block_size, vocab_start=0,
                       tp_group=LoopbackGroup(tp, 0, [None] + sent[1:]), vocab_size=V, **kw)
    return h0(hidden, input_ids, root_tokens=root_tokens), b
