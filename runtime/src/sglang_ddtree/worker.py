"""DDTree worker on top of SGLang 0.5.23's DFlash worker (spec-v2).

Imported lazily by the plugin's worker factory: SGLang's DFlash worker needs
the full CUDA stack (sgl_kernel, flashinfer, transformers, ...), which CI does
not have.  Everything SGLang-specific is imported inside functions, so the
tensor helpers at module level import (and are tested) on a bare CPU torch.

One decode step of ``DDTreeWorkerV2`` (``_ddtree_decode``), per batch of bs
requests, budget B, N = B + 1 verify tokens, drafter block ``block_size``,
L = block_size - 1:

 1. **draft** (DFlash's drafter, unchanged model): one non-causal block forward
    of ``[bonus, mask * L]`` at positions ``seq_len + [0..L]``, KV written into
    the first ``block_size`` slots of this step's window (``N >= block_size``
    slots reserved by ``DFlashDraftInputV2.prepare_for_decode``: 2N per step);
    the drafter's hidden states -> :class:`~sglang_ddtree.head.DraftTreeHead`:
    the target's LM-head GEMM into bf16 logits, the fused Triton top-K +
    logsumexp, under vocab-parallel TP a fixed-shape all-gather of every
    shard's top-K and lse and the exact merge, the tree kernel (budget B,
    root = bonus token).  The head is DFlash's draft-sampler hook, so it is
    captured in the drafter's CUDA graph (one per captured batch size) and
    its trees are read from static buffers; eager drafts call it directly.
 2. **tree verify**: an ``EagleVerifyInput`` (draft_token ``[bs*N]``, positions
    ``seq_len + depth``, FULL_MASK custom mask = committed prefix | ancestors,
    retrieve_index / next_token / next_sibling, spec_steps = L,
    draft_token_num = N) and SGLang's ``eagle_prepare_for_verify`` ->
    ``ForwardBatch`` (TARGET_VERIFY, capture_hidden FULL) -> ONE target forward
    of N tokens per request (CUDA graph captured at N per request: plugin).
 3. **accept**: SGLang's ``eagle_sample`` - greedy: ``verify_tree_greedy`` on
    the retrieve links (the same walk as ``verify.greedy_accept``); temperature
    > 0: ``tree_speculative_sampling_target_only`` with zero draft probs
    (target-only sampling, lossless); penalties / grammar as for EAGLE.
 4. **commit + compaction**: SGLang's ``_finalize_accept_tree_path``: the
    target KV of the accepted nodes moved to window slots ``0..accept_len-1``
    (``move_accept_tokens_to_target_kvcache``), ``predict`` and the target's
    captured hidden states gathered to the front of each request's N-row
    block.  Committed tokens = ``predict[b, :accept_len]`` (accepted drafts +
    bonus); new seq_len = seq_len + accept_len.
 5. **drafter context**: the compacted target hidden states of the accepted
    path are projected into the drafter's KV at committed positions
    ``seq_len + k`` (DFlash's ``_append_target_hidden_to_draft_kv_by_loc``,
    prefix-valid write of ``accept_len`` rows per request).

Prefill, idle and (DP) extend-in-batch steps are DFlash's own code (the
drafter's context after prefill is identical).

Not supported (rejected with a clear error): drafter block_size > B + 1,
draft sliding window (``--speculative-draft-window-size``), selector /
LiLiCorr / Domino drafters, DP attention, mamba/hybrid-linear targets,
rejection sampling, pp > 1; attention backends other than triton and
flashinfer (the ones that consume the EAGLE tree custom mask; fa3/trtllm key
their tree path on ``--speculative-eagle-topk``, which DDTREE pins to 1) unless
``SGLANG_DDTREE_ALLOW_ANY_BACKEND=1``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Optional

import torch

from .config import budget_from_num_draft_tokens, read_block_size
from .head import DraftTreeHead
from .shards import draft_top_log_probs, draft_trees, merge_shard_tops, shard_top_logits  # noqa: F401  (re-exported)
from .schedule import BudgetSchedule, load_schedule
from .trialset import ActiveCandidate, load_trial_set
from .tree import DDTrees, build_trees, build_trees_from_top
from .verify import AcceptResult, build_verify_inputs, fill_custom_mask, greedy_accept, retrieve_links, sample_accept

logger = logging.getLogger(__name__)

_WORKER_CLS = None

# attention backends whose TARGET_VERIFY path reads spec_info.custom_mask (tree mask)
TREE_MASK_BACKENDS = frozenset({"TritonAttnBackend", "FlashInferAttnBackend"})


# ---------------------------------------------------------------------------
# tensor helpers (no SGLang import; CPU-tested)
# ---------------------------------------------------------------------------


def tree_verify_fields(
    trees: DDTrees,
    seq_lens: torch.Tensor,
    spec_steps: int,
    seq_lens_sum: Optional[int] = None,
    mask_buf: Optional[torch.Tensor] = None,
) -> dict:
    """Keyword arguments of SGLang's ``EagleVerifyInput`` for one tree verify.

    ``seq_lens``: committed lengths (the root/bonus is written at ``seq_lens[b]``).
    Mask: into ``mask_buf`` (any dtype; e.g. the attention backend's
    ``VerifyMask.buffer``) when given, else a fresh bool tensor sized from the
    host ``seq_lens_sum``.  No host sync when either ``mask_buf`` or
    ``seq_lens_sum`` is given.
    """
    bs, N = trees.tokens.shape
    if mask_buf is not None:
        vt_mask = fill_custom_mask(trees.visibility, seq_lens, mask_buf, seq_lens_sum)
        ridx, nxt, sib = retrieve_links(trees)
        draft_token = trees.tokens.flatten()
        positions = (seq_lens.to(trees.depths.device, torch.long).view(bs, 1) + trees.depths).flatten()
    else:
        vt = build_verify_inputs(trees, seq_lens, seq_lens_sum)
        vt_mask, ridx, nxt, sib = vt.custom_mask, vt.retrieve_index, vt.retrieve_next_token, vt.retrieve_next_sibling
        draft_token, positions = vt.draft_token, vt.positions
    return dict(
        draft_token=draft_token,
        custom_mask=vt_mask,
        positions=positions,
        retrieve_index=ridx,
        retrieve_next_token=nxt,
        retrieve_next_sibling=sib,
        retrieve_cum_len=None,
        spec_steps=int(spec_steps),
        # > 1 marks a tree (custom mask) for backends that gate on it; the
        # verify kernels take the shape from retrieve_* and draft_token_num.
        topk=max(2, N - 1),
        draft_token_num=N,
        seq_lens_sum=seq_lens_sum,
        seq_lens_cpu=None,
    )


def make_tree_verify_input(trees, seq_lens, spec_steps, seq_lens_sum=None, mask_buf=None, **extra):
    """SGLang ``EagleVerifyInput`` for a batch of trees (needs SGLang's GPU-side imports)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    kw = tree_verify_fields(trees, seq_lens, spec_steps, seq_lens_sum, mask_buf)
    kw["capture_hidden_mode"] = CaptureHiddenMode.FULL
    kw.update(extra)
    return EagleVerifyInput(**kw)


def committed_outputs(predict: torch.Tensor, accept_lens: torch.Tensor, seq_lens: torch.Tensor, num_nodes: int):
    """After front compaction: ``(bonus [bs] int64, new_seq_lens [bs])``;
    committed tokens of request b are ``predict.view(bs, N)[b, :accept_lens[b]]``."""
    bs = int(accept_lens.shape[0])
    p = predict.view(bs, int(num_nodes))
    lens = accept_lens.to(torch.int64)
    bonus = p.gather(1, (lens - 1).clamp(min=0).view(bs, 1)).view(bs).to(torch.int64)
    return bonus, seq_lens + lens.to(seq_lens.dtype)


def root_only_trees(root_tokens: torch.Tensor) -> DDTrees:
    """Trees of a budget-0 band: the root (bonus token) alone, N = 1."""
    bs = int(root_tokens.shape[0])
    dev = root_tokens.device
    return DDTrees(
        tokens=root_tokens.reshape(bs, 1).to(torch.int64),
        parents=torch.full((bs, 1), -1, dtype=torch.int64, device=dev),
        depths=torch.zeros((bs, 1), dtype=torch.int64, device=dev),
        visibility=torch.ones((bs, 1, 1), dtype=torch.bool, device=dev),
        valid=torch.ones((bs, 1), dtype=torch.bool, device=dev),
    )


class BandedDraftHead:
    """The draft graph's capture tail hook under a budget schedule: the call for a
    (padded, captured) batch of ``bs`` requests goes to the head of bs's band
    (each captured bs belongs to exactly one band, so each draft graph folds in
    exactly one head, at its band's budget)."""

    def __init__(self, schedule: BudgetSchedule, heads: dict, block_size: int):
        self.schedule = schedule
        self.heads = heads  # budget -> DraftTreeHead
        self.block = int(block_size)

    def head_for(self, bs: int):
        budget = self.schedule.budget_for(int(bs))
        if budget <= 0:
            raise RuntimeError(f"DDTREE: batch {bs} is in a budget-0 band; the drafter must not run there")
        return self.heads[budget]

    def __call__(self, hidden_states, input_ids=None, *, root_tokens=None):
        H = int(hidden_states.shape[-1])
        bs = int(hidden_states.numel()) // H // self.block
        return self.head_for(bs)(hidden_states, input_ids, root_tokens=root_tokens)


class CaptureBudgetHead:
    """The draft graph's capture tail hook under a trial set: a captured bs may be
    routed to different budgets by different candidates, so the drafter is captured
    once per draft budget (``bands.capture_trial_draft_graphs``), and before each
    budget's capture ``select(budget)`` points this hook at that budget's head: each
    draft graph folds in exactly one head."""

    def __init__(self, heads: dict, block_size: int):
        self.heads = heads  # budget -> DraftTreeHead
        self.block = int(block_size)
        self.capture_budget: Optional[int] = None

    def select(self, budget: int) -> None:
        if int(budget) not in self.heads:
            raise RuntimeError(f"DDTREE: no draft head for budget {budget} (heads: {sorted(self.heads)})")
        self.capture_budget = int(budget)

    def __call__(self, hidden_states, input_ids=None, *, root_tokens=None):
        if self.capture_budget is None:
            raise RuntimeError("DDTREE: a draft graph was captured before a trial budget was selected")
        return self.heads[self.capture_budget](hidden_states, input_ids, root_tokens=root_tokens)


def tp_broadcast_int(group, value: int) -> int:
    """``value`` of the group's first rank, on every rank: one int64 over the group's
    CPU (gloo) group — no device work, no GPU sync (SGLang's ``GroupCoordinator``:
    ``world_size``, ``ranks``, ``cpu_group``)."""
    if group is None or int(getattr(group, "world_size", 1)) == 1:
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64)
    torch.distributed.broadcast(t, src=group.ranks[0], group=group.cpu_group)
    return int(t.item())


def check_shapes(budget: int, block_size: int) -> None:
    """The drafter's block and the verify window share each step's KV window: max(N, block)
    slots from the 2 x num-draft-tokens = 2N that DFlash's prepare_for_decode reserves per
    request (N = budget + 1 of the widest band), so the block must fit in 2N."""
    if int(block_size) < 2:
        raise ValueError(f"DDTREE: drafter block_size must be >= 2, got {block_size}")
    if int(block_size) > 2 * (int(budget) + 1):
        raise ValueError(
            f"DDTREE: the drafter block ({block_size}) must fit the per-step KV reservation "
            f"(2 x --speculative-num-draft-tokens = 2 x (budget + 1) = {2 * (int(budget) + 1)}). "
            f"Use a budget of at least {(int(block_size) + 1) // 2 - 1}."
        )


class _SpecView:
    """A view of the runtime spec config with ``speculative_num_draft_tokens``
    replaced by the drafter's block size (what DFlash's constructor expects)."""

    def __init__(self, spec, block_size: int):
        self._spec = spec
        self._block_size = block_size

    def __getattr__(self, name):
        if name == "speculative_num_draft_tokens":
            return self._block_size
        return getattr(self._spec, name)


@contextlib.contextmanager
def _patched_spec(mod, block_size: int):
    orig = mod.get_spec
    mod.get_spec = lambda: _SpecView(orig(), block_size)
    try:
        yield
    finally:
        mod.get_spec = orig


# ---------------------------------------------------------------------------
# the worker
# ---------------------------------------------------------------------------


def make_worker_class(base=None):
    """The worker class (built once, on SGLang's ``DFlashWorkerV2``).  ``base``: a
    fresh class on that DFlash worker instead (the GPU harness's drafter stand-in:
    its constructor seam; not cached)."""
    global _WORKER_CLS
    if base is None and _WORKER_CLS is not None:
        return _WORKER_CLS
    from sglang.srt.speculative import dflash_worker_v2 as dfw

    DFlashWorkerV2 = dfw.DFlashWorkerV2 if base is None else base

    class DDTreeWorkerV2(DFlashWorkerV2):
        """DFlash drafter + DDTree tree verify (see module docstring)."""

        def __init__(self, server_args, *args, **kwargs):
            spec = dfw.get_spec()
            self.ddtree_budget = budget_from_num_draft_tokens(spec.speculative_num_draft_tokens)
            # a trial set (SGLANG_DDTREE_TRIAL_SET_FILE): the active candidate's schedule serves,
            # switched by the control file (ddtree_active, below); else the budget schedule
            # (SGLANG_DDTREE_SCHEDULE_FILE), else one band at ddtree_budget.
            # ddtree_budget = the widest width's budget (num_draft_tokens - 1)
            self.ddtree_trials = load_trial_set(spec.speculative_num_draft_tokens)
            if self.ddtree_trials is not None:
                self.ddtree_schedule = self.ddtree_trials.schedules[self.ddtree_trials.active]
            else:
                self.ddtree_schedule = load_schedule(spec.speculative_num_draft_tokens)
            self.ddtree_active = None
            self._ddtree_heads = {}
            self._ddtree_active_state = None  # the target state (band / verify width) applied last
            self._ddtree_active_draft = None  # the drafter state (trial budget) applied last
            self.ddtree_band_log = []  # (bs, band index, budget) per decode step (tests / debugging)
            self.ddtree_block_size = read_block_size(spec.speculative_draft_model_path)
            check_shapes(self.ddtree_budget, self.ddtree_block_size)
            if getattr(spec, "speculative_use_rejection_sampling", False):
                raise ValueError("DDTREE uses target-only sampling; --speculative-use-rejection-sampling is not supported.")
            with _patched_spec(dfw, self.ddtree_block_size):
                super().__init__(server_args, *args, **kwargs)
            # DFlash's own width (self.block_size / speculative_num_draft_tokens)
            # is the drafter block; the tree verify width is:
            self.ddtree_num_verify_tokens = self.ddtree_budget + 1
            self.ddtree_L = int(self.ddtree_block_size) - 1
            # accept_index width = spec_steps + 1 must fit the N-row block that
            # SGLang's front compaction writes into (depth <= min(L, B))
            self.ddtree_spec_steps = min(self.ddtree_L, self.ddtree_budget)
            self._ddtree_checked = False
            for attr, what in (("selector", "selector"), ("lilicorr", "LiLiCorr")):
                if getattr(self, attr, None) is not None:
                    raise ValueError(f"DDTREE needs a plain DFlash drafter; {what} heads are not supported.")
            if getattr(self, "_is_domino", False):
                raise ValueError("DDTREE needs a plain DFlash drafter; Domino is not supported.")
            if getattr(self, "use_compact_draft_cache", False):
                raise ValueError("DDTREE does not support --speculative-draft-window-size.")
            if self.ddtree_trials is not None:
                # the live switch: TP0 reads the control file, every rank applies its proposal
                self.ddtree_active = ActiveCandidate.from_env(
                    self.ddtree_trials, is_source=self._ddtree_tp_rank0(), broadcast=self._ddtree_tp_broadcast,
                    log=logger.info)
            self._ddtree_active_announced = False

        # -- DFlash hooks: the draft head; the verify gather ----------------
        def _maybe_build_draft_sampler(self):
            # DFlash folds its greedy argmax head into the draft CUDA graph (a
            # capture tail hook calls the sampler on the block's hidden states
            # and input ids); DDTree folds its own head there instead: LM head,
            # top-K + lse, TP all-gather + merge, tree, into static buffers.
            # Called only when the draft graph is captured.
            from sglang.srt.runtime_context import get_exec

            graph_bs = [int(b) for b in get_exec().graph.cuda_graph_config.decode.bs]
            max_bs = max(graph_bs)
            if self.ddtree_trials is not None:
                # a trial set: one head per draft budget, sized for the bs some candidate routes
                # to it; the drafter is captured once per budget with that budget's head
                self._ddtree_sync_schedule_graph_bs()
                if self.ddtree_trials.cuda_graph_bs is None:
                    self.ddtree_trials.set_cuda_graph_bs(graph_bs)
                for budget, bs_b, _ in self.ddtree_trials.draft_plan():
                    bs_b = [b for b in (bs_b or []) if b in graph_bs]
                    if bs_b:
                        self._ddtree_precompile(self._ddtree_get_head(max(bs_b), budget=budget), bs_b)
                self._ddtree_head_in_graph = True
                self._ddtree_capture_head = CaptureBudgetHead(self._ddtree_heads, self.ddtree_block_size)
                if self._ddtree_tp_rank0():
                    logger.info(
                        "DDTREE draft heads folded into the draft cuda graphs per trial budget: %s (draft graph bs %s).",
                        ", ".join(f"budget {b}: max_bs {h._cap}" for b, h in sorted(self._ddtree_heads.items())),
                        graph_bs,
                    )
                return self._ddtree_capture_head
            sched = self.ddtree_schedule
            if sched.source is not None:
                # a schedule: one head per tree band, each sized for its band's
                # captured batch sizes; the graph of bs folds in bs's band's head
                self._ddtree_sync_schedule_graph_bs()
                if sched.cuda_graph_bs is None:
                    sched.set_cuda_graph_bs(graph_bs)
                for i, band in enumerate(sched.bands):
                    bs_i = [b for b in (sched.cuda_graph_bs_for_band(i) or []) if b in graph_bs]
                    if band.budget > 0 and bs_i:
                        self._ddtree_precompile(self._ddtree_get_head(max(bs_i), budget=band.budget), bs_i)
                self._ddtree_head_in_graph = True
                self._ddtree_banded_head = BandedDraftHead(sched, self._ddtree_heads, self.ddtree_block_size)
                if self._ddtree_tp_rank0():
                    logger.info(
                        "DDTREE draft heads folded into the draft cuda graph per band: %s (draft graph bs %s).",
                        ", ".join(f"budget {b}: max_bs {h._cap}" for b, h in sorted(self._ddtree_heads.items())),
                        graph_bs,
                    )
                return self._ddtree_banded_head
            head = self._ddtree_get_head(max_bs)
            self._ddtree_precompile(head, graph_bs)
            self._ddtree_head_in_graph = True
            if self._ddtree_tp_rank0():
                logger.info(
                    "DDTREE draft head (LM head + top-K + tree) folded into the draft cuda graph "
                    "(tp=%d, vocab shard %d, budget %d, L %d, max_bs %d, logits <= %.1f MiB).",
                    head.tp, head.Vs, head.budget, head.L, max_bs, head.logits_bytes(max_bs) / 2**20,
                )
            return head

        # -- the budget schedule: bands, their graphs, switching -----------
        def _ddtree_band_states(self):
            mr = getattr(self.target_worker, "model_runner", None)
            return getattr(mr, "_ddtree_band_states", None)

        def _ddtree_sync_schedule_graph_bs(self):
            """The captured target-verify batch sizes (what the plugin's capture
            hook found) drive the routing, as ``set_cuda_graph_bs`` in SGLang's
            adaptive controller."""
            mr = getattr(self.target_worker, "model_runner", None)
            if self.ddtree_trials is not None:
                cap_trials = getattr(mr, "_ddtree_trials", None)
                if cap_trials is not None and cap_trials is not self.ddtree_trials:
                    if [c.bands for c in cap_trials.candidates] != [c.bands for c in self.ddtree_trials.candidates]:
                        raise RuntimeError("DDTREE: the target captured a different trial set than the worker read.")
                    self.ddtree_trials.set_cuda_graph_bs(cap_trials.cuda_graph_bs)
                return
            cap_sched = getattr(mr, "_ddtree_schedule", None)
            if cap_sched is not None and cap_sched is not self.ddtree_schedule:
                if cap_sched.bands != self.ddtree_schedule.bands:
                    raise RuntimeError("DDTREE: the target captured a different budget schedule than the worker read.")
                self.ddtree_schedule.set_cuda_graph_bs(cap_sched.cuda_graph_bs)

        def _ddtree_ensure_band_states(self):
            """Band states exist when the plugin's capture hook ran (the target's
            startup capture).  If it did not (a platform without graph capture),
            build eager ones here: one attention backend per band width."""
            mr = self.target_worker.model_runner
            if self.ddtree_trials is not None:
                if getattr(mr, "_ddtree_trial_states", None) is None:
                    from .bands import capture_trial_verify_graphs

                    capture_trial_verify_graphs(lambda model_runner: None, mr, self.ddtree_trials, graphs_on=False)
                return
            sched = self.ddtree_schedule
            if sched.source is None or self._ddtree_band_states() is not None:
                return
            from .bands import capture_banded_verify_graphs

            capture_banded_verify_graphs(lambda model_runner: None, self.target_worker.model_runner, sched,
                                         graphs_on=False)

        def init_cuda_graphs(self):
            """DFlash's draft graphs, captured only for the batch sizes of bands with
            a tree (budget > 0); budget-0 bands never run the drafter.  A trial set:
            once per draft budget (the plugin's capture hook reads the plan left on
            the draft model runner)."""
            if self.ddtree_trials is not None:
                try:
                    return self._ddtree_init_trial_draft_graphs()
                finally:
                    self._ddtree_announce_active()
            sched = self.ddtree_schedule
            if sched.source is None:
                return super().init_cuda_graphs()
            self._ddtree_sync_schedule_graph_bs()
            tree_bs = sched.tree_cuda_graph_bs()
            if tree_bs is None or tree_bs == sched.cuda_graph_bs:
                return super().init_cuda_graphs()
            from sglang.srt.model_executor.cuda_graph_config import Backend, with_phase
            from sglang.srt.runtime_context import get_context, get_exec

            gcfg = get_exec().graph.cuda_graph_config
            if self._ddtree_tp_rank0():
                logger.info("DDTREE draft cuda graph: bs %s (bands with a tree); budget-0 bs %s run no drafter.",
                            tree_bs, [b for b in sched.cuda_graph_bs if b not in tree_bs])
            new = (with_phase(gcfg, "decode", bs=tree_bs) if tree_bs
                   else with_phase(gcfg, "decode", backend=Backend.DISABLED))
            get_context().override("ddtree.draft_capture", cuda_graph_config=new)
            try:
                return super().init_cuda_graphs()
            finally:
                get_context().override("ddtree.draft_capture_restore", cuda_graph_config=gcfg)

        def _ddtree_init_trial_draft_graphs(self):
            from sglang.srt.model_executor.cuda_graph_config import with_phase
            from sglang.srt.runtime_context import get_context, get_exec

            self._ddtree_sync_schedule_graph_bs()
            trials = self.ddtree_trials
            plan = [(b, bs, users) for b, bs, users in trials.draft_plan() if bs]
            if trials.cuda_graph_bs is None or not plan:  # graphs off (DFlash then captures nothing)
                return super().init_cuda_graphs()
            tree_bs = sorted({b for _, bs, _ in plan for b in bs})
            gcfg = get_exec().graph.cuda_graph_config
            dmr = self.draft_model_runner
            # consumed by the plugin's capture hook on capture_decode_graph (the drafter's)
            dmr._ddtree_draft_capture = (plan, lambda budget: self._ddtree_capture_head.select(budget))
            get_context().override("ddtree.draft_capture", cuda_graph_config=with_phase(gcfg, "decode", bs=tree_bs))
            try:
                return super().init_cuda_graphs()
            finally:
                get_context().override("ddtree.draft_capture_restore", cuda_graph_config=gcfg)
                dmr._ddtree_draft_capture = None

        def _ddtree_announce_active(self):
            """``DDTree active: <candidate> (since step 0)`` once, on TP0, when the
            start-up captures are done (SGLang captures after building the workers)."""
            if self.ddtree_active is not None and not self._ddtree_active_announced:
                self._ddtree_active_announced = True
                if self._ddtree_tp_rank0():
                    logger.info(self.ddtree_active.active_line())

        def _ddtree_begin_step(self):
            """A trial set: count the decode step; at a meeting step, switch to what
            TP0's control file proposes (same step on every rank).  The new candidate
            routes this step already."""
            if self.ddtree_active is None:
                return
            self._ddtree_announce_active()
            self.ddtree_active.begin_step()
            self.ddtree_schedule = self.ddtree_active.schedule

        def _ddtree_tp_broadcast(self, value: int) -> int:
            """TP0's proposal to every rank of the target's TP group (only at meeting steps)."""
            from sglang.srt.runtime_context import get_parallel

            return tp_broadcast_int(get_parallel().tp_group, value)

        def ddtree_status(self) -> dict:
            """The serving configuration (``/server_info`` -> ``internal_states[i]["ddtree"]``)."""
            if self.ddtree_active is not None:
                return dict(self.ddtree_active.status(), trial_set=True)
            sched = self.ddtree_schedule
            name = str(sched.bands[0].budget) if len(sched.bands) == 1 else sched.spec
            return dict(active=name, trial_set=False)

        def _ddtree_state_for(self, i: int, band):
            """The target state serving band ``i`` of the active schedule: the band's
            own (schedule), the state of its verify width (trial set)."""
            mr = getattr(self.target_worker, "model_runner", None)
            if self.ddtree_trials is not None:
                states = getattr(mr, "_ddtree_trial_states", None)
                return None if states is None else states[band.width]
            states = self._ddtree_band_states()
            return None if states is None else states[i]

        def _ddtree_activate_band(self, bs: int):
            """Route the batch to its band (AdaptiveSpeculativeParams._route) and
            apply the band's target state (as EAGLE's ``apply_runtime_state``:
            attention backend + target-verify graph runner); under a trial set also
            the drafter's state of the band's budget (draft attention backend + the
            draft graph runner whose graphs fold in that budget's head).  Returns the band."""
            sched = self.ddtree_schedule
            i = sched.band_index(bs)
            band = sched.bands[i]
            st = self._ddtree_state_for(i, band)
            if st is not None and st is not self._ddtree_active_state:
                mr = self.target_worker.model_runner
                mr.attn_backend = st.attn_backend
                if st.graph_runner is not None:
                    mr.decode_cuda_graph_runner = st.graph_runner
                self._ddtree_active_state = st
            if self.ddtree_trials is not None and band.budget > 0:
                dst = (getattr(self.draft_model_runner, "_ddtree_draft_states", None) or {}).get(band.budget)
                if dst is not None and dst is not self._ddtree_active_draft:
                    self.draft_model_runner.attn_backend = dst.attn_backend
                    if dst.graph_runner is not None:
                        self.draft_model_runner.decode_cuda_graph_runner = dst.graph_runner
                    self._ddtree_active_draft = dst
            self.ddtree_band_log.append((int(bs), i, band.budget))
            del self.ddtree_band_log[:-1024]
            return band

        def _defer_target_verify_gather(self):
            # Keep full (gathered) verify logits: eagle_sample consumes them.
            return None

        # -- convenience (tests / debugging) -------------------------------
        def build_verify(self, draft_logits, bonus_tokens, seq_lens, seq_lens_sum: int):
            return build_verify(draft_logits, bonus_tokens, seq_lens, seq_lens_sum, self.ddtree_budget)

        def accept(self, trees: DDTrees, target_logits, temperature=None) -> AcceptResult:
            return accept(trees, target_logits, self.ddtree_L, temperature)

        # -- the decode step ---------------------------------------------
        def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
                return super().forward_batch_generation(
                    batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
                )
            return self._ddtree_decode(batch, on_publish=on_publish, grammar_barrier=grammar_barrier,
                                       pp_proxy_tensors=pp_proxy_tensors)

        def _ddtree_runtime_checks(self):
            if self._ddtree_checked:
                return
            from sglang.srt.runtime_context import get_parallel
            from sglang.srt.speculative.dflash_utils import resolve_dflash_verify_mask_policy

            if get_parallel().attn_dp_enabled:
                raise NotImplementedError("DDTREE does not support DP attention yet.")
            self._ddtree_sync_schedule_graph_bs()
            self._ddtree_ensure_band_states()
            if getattr(self, "_need_mamba_verify_commit", False):
                raise NotImplementedError("DDTREE does not support mamba / hybrid-linear targets yet.")
            name, _ = resolve_dflash_verify_mask_policy(self.model_runner.attn_backend)
            if name not in TREE_MASK_BACKENDS and os.environ.get("SGLANG_DDTREE_ALLOW_ANY_BACKEND", "0") != "1":
                raise NotImplementedError(
                    f"DDTREE tree verify needs an attention backend that reads the EAGLE custom mask "
                    f"({sorted(TREE_MASK_BACKENDS)}); got {name}. Use --attention-backend triton or flashinfer "
                    f"(or set SGLANG_DDTREE_ALLOW_ANY_BACKEND=1 at your own risk)."
                )
            self._ddtree_checked = True

        def _ddtree_draft(self, batch, draft_input, window_2d):
            """DFlash's draft block forward (eager-fallback path of
            DFlashWorkerV2.forward_batch_generation, block = first block_size
            slots of the N-slot window).  Returns the block hidden states [bs, block, H]."""
            from sglang.srt.lora.layers import unwrap_lora_layer
            from sglang.srt.model_executor.forward_batch_info import (
                CaptureHiddenMode,
                ForwardBatch,
                ForwardMode,
                enable_num_token_non_padded,
            )
            from sglang.srt.speculative.dflash_worker_v2 import _resolve_dflash_embedding_module
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
            from sglang.srt.speculative.spec_utils import draft_tp_context

            bs = int(batch.seq_lens.shape[0])
            blk = int(self.block_size)
            device = self.device
            prefix_lens = batch.seq_lens
            target_model = self.target_worker.model_runner.model
            embed_module = unwrap_lora_layer(_resolve_dflash_embedding_module(self.draft_model, target_model))

            block_ids = torch.full((bs, blk), int(self._mask_token_id), dtype=torch.long, device=device)
            block_ids[:, 0].copy_(draft_input.bonus_tokens.view(-1))
            positions = (prefix_lens.to(torch.int64).unsqueeze(1) + self._block_pos_offsets).reshape(-1)
            block_loc = window_2d[:, :blk].contiguous().reshape(-1)

            if self._full_embed_gpu is not None:
                noise = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
            else:
                noise = embed_module(block_ids)
            if self._noise_embed_scale != 1.0:
                noise = noise * self._noise_embed_scale
            input_embeds = noise.view(-1, noise.shape[-1])

            seq_lens_cpu = self._draft_seq_lens_cpu_buf[:bs]
            if batch.seq_lens_cpu is not None:
                seq_lens_cpu.copy_(batch.seq_lens_cpu)
                seq_lens_cpu.add_(blk)
                draft_seq_lens_sum = int(seq_lens_cpu.sum())
            elif draft_input.nxt_kv_lens_cpu is not None:
                seq_lens_cpu.copy_(draft_input.nxt_kv_lens_cpu)
                draft_seq_lens_sum = int(draft_input.nxt_kv_lens_sum)
            else:
                for i, req in enumerate(batch.reqs):
                    seq_lens_cpu[i] = req.kv.kv_allocated_len
                draft_seq_lens_sum = int(seq_lens_cpu.sum())

            plan = self.target_worker.model_runner.kv_index_translator.plan(
                req_pool_indices=batch.req_pool_indices,
                seq_lens=prefix_lens,
                seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu,
                write_virtual=block_loc,
                read_extent=blk,
            )
            fb = ForwardBatch(
                forward_mode=ForwardMode.TARGET_VERIFY,
                batch_size=bs,
                input_ids=block_ids.flatten(),
                req_pool_indices=batch.req_pool_indices,
                seq_lens=prefix_lens,
                out_cache_loc=block_loc,
                seq_lens_sum=draft_seq_lens_sum,
                seq_lens_cpu=seq_lens_cpu,
                positions=positions,
                input_embeds=input_embeds,
                spec_algorithm=SpeculativeAlgorithm.DFLASH,
                spec_info=self._draft_block_spec_info,
                capture_hidden_mode=CaptureHiddenMode.NULL,
                num_token_non_padded=(
                    torch.full((), bs * blk, dtype=torch.int32, device=device) if enable_num_token_non_padded() else None
                ),
                global_num_token_non_padded_cpu=bs * blk,
                can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
            )
            plan.bind(fb, self.draft_model_runner.kv_index_translator)
            with torch.inference_mode(), draft_tp_context(self.draft_parallel_layout):
                out = self.draft_model_runner.forward(fb)
            hidden = out.logits_output.hidden_states
            if hidden is None:
                raise RuntimeError("DDTREE: the DFlash draft forward returned no hidden states.")
            return hidden[: bs * blk].view(bs, blk, -1), bool(getattr(out, "can_run_graph", False))

        def _ddtree_precompile(self, head, batch_sizes):
            """At the head's first call (inside the draft graph's capture): every
            kernel the captured ``batch_sizes`` need, from the Triton cache
            (TRITON_CACHE_DIR, filled ahead by ``python -m sglang_ddtree.aot``)
            or compiled then; TP0 prints ``DDTREE Triton compile: ...`` per budget
            that compiled anything (aot.prepare_head).  A failure only logs: the
            kernels then compile at their first launch, as before.
            SGLANG_DDTREE_PRECOMPILE=0 turns it off."""
            if os.environ.get("SGLANG_DDTREE_PRECOMPILE", "1") == "0" or not getattr(head, "use_triton", False):
                return
            bs = sorted(set(int(b) for b in batch_sizes))
            announce = self._ddtree_tp_rank0()

            def hook():
                from .aot import prepare_head

                try:
                    prepare_head(head, bs, announce=announce, log=logger.info)
                except Exception as e:  # noqa: BLE001 -- the start goes on; the JIT compiles at launch
                    logger.warning("DDTREE Triton pre-compile of budget %d failed (%s: %s); the kernels compile "
                                   "at their first launch.", head.budget, type(e).__name__, e)

            head.before_first_call = hook

        def _ddtree_tp_rank0(self) -> bool:
            return int(getattr(self, "_target_tp_rank", 0) or 0) == 0

        def _ddtree_step_parts(self):
            """The step-parts sampler (``stepparts.StepParts``, built at the first
            decode step): CUDA events on a CUDA device, else the host clock; it
            records and logs on TP rank 0 only."""
            parts = getattr(self, "_ddtree_parts", None)
            if parts is None:
                from .stepparts import CudaClock, PerfClock, StepParts

                try:
                    cuda = torch.device(self.device).type == "cuda"
                except (TypeError, RuntimeError):
                    cuda = torch.cuda.is_available()
                parts = self._ddtree_parts = StepParts.from_env(
                    clock=CudaClock() if cuda else PerfClock(), log=logger.info, enabled=self._ddtree_tp_rank0())
            return parts

        def _ddtree_get_head(self, max_bs: int = 0, budget: Optional[int] = None):
            """The draft head (``head.DraftTreeHead``) of ``budget`` (default: the
            widest band's) on the target's LM-head shard, built once per budget.
            TP group as DFlash's own draft sampler: the target's (whose ranks own
            the LM-head shards)."""
            budget = self.ddtree_budget if budget is None else int(budget)
            head = self._ddtree_heads.get(budget)
            if head is not None:
                return head
            from sglang.srt.lora.layers import unwrap_lora_layer
            from sglang.srt.runtime_context import get_parallel
            from sglang.srt.speculative.dflash_utils import is_dense_head_weight

            tw = getattr(self, "_target_worker", None) or self.target_worker
            lm_head = unwrap_lora_layer(getattr(tw.model_runner.model, "lm_head", None))
            weight = getattr(lm_head, "weight", None)
            if weight is None or not is_dense_head_weight(weight):
                raise NotImplementedError("DDTREE needs a dense target lm_head weight (quantized heads: not yet).")
            shard = getattr(lm_head, "shard_indices", None)
            group = get_parallel().tp_group
            if shard is None:
                if int(group.world_size) != 1:
                    raise NotImplementedError("DDTREE: tp > 1 needs the LM head's shard_indices.")
                w, start, group = weight, 0, None
            else:
                if int(shard.num_added_elements) > 0:
                    raise NotImplementedError("DDTREE: added (LoRA) vocabulary in the LM head is not supported.")
                w = weight[: int(shard.num_org_elements)]
                start = int(shard.org_vocab_start_index)
                if int(group.world_size) == 1:
                    group = None
            vocab = None
            mc = getattr(getattr(tw, "model_runner", None), "model_config", None)
            if mc is not None and getattr(mc, "vocab_size", None):
                vocab = int(mc.vocab_size)
            head = DraftTreeHead(w, budget, self.ddtree_block_size, vocab_start=start,
                                 tp_group=group, vocab_size=vocab, max_bs=max_bs)
            self._ddtree_heads[budget] = head
            if budget == self.ddtree_budget:
                self._ddtree_head = head
            return head

        def _ddtree_trees(self, draft_hidden, bonus_tokens, draft_in_graph: bool = False, budget=None):
            """Trees of this step: what the draft graph's replay wrote (the head is
            captured in it), else the same head called eagerly."""
            head = self._ddtree_get_head(budget=budget)
            bs = int(bonus_tokens.shape[0])
            if draft_in_graph and getattr(self, "_ddtree_head_in_graph", False):
                return head.trees(bs)
            return head(draft_hidden.reshape(bs * int(self.block_size), -1), root_tokens=bonus_tokens)

        def _ddtree_decode(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
            from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
            from sglang.srt.layers.logprob_processor import compute_spec_logprobs
            from sglang.srt.managers.utils import GenerationBatchResult
            from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
            from sglang.srt.speculative.eagle_utils import TreeMaskMode, eagle_prepare_for_verify, eagle_sample
            from sglang.srt.speculative.eagle_worker_common import _finalize_accept_tree_path
            from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

            parts = self._ddtree_step_parts()
            sp = parts.begin()  # a sampled step records clock marks at the part boundaries (stepparts.py)
            self._ddtree_runtime_checks()
            draft_input = batch.spec_info
            if not isinstance(draft_input, DFlashDraftInputV2):
                raise RuntimeError("DDTREE expected DFlashDraftInputV2 state on the running batch.")
            if batch.seq_lens.is_cuda:  # carried over from the previous overlap iteration
                batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())
            bs = int(batch.seq_lens.shape[0])
            # a trial set: the control's meeting step may switch the candidate (all ranks alike)
            self._ddtree_begin_step()
            # this step's band of the (active) budget schedule (target backend / graph switched to it)
            B = int(self._ddtree_activate_band(bs).budget)
            N = B + 1
            blk = int(self.block_size)
            device = self.device
            prefix_lens = batch.seq_lens
            req_to_token = self.model_runner.req_to_token_pool.req_to_token
            self._ensure_draft_block_buffers(bs)

            # this step's window: max(N, block) slots per request from the
            # over-allocated row (2 x the widest width reserved per step); the
            # drafter block uses the first `block`, the verify the first N
            W = max(N, blk) if B > 0 else N
            sp.mark("win0")
            window_full = assign_extend_cache_locs_func(
                req_pool_indices=batch.req_pool_indices,
                req_to_token=req_to_token,
                start_offset=prefix_lens,
                end_offset=prefix_lens + W,
                batch_size=bs,
                draft_token_num=W,
                device=device,
            )
            sp.mark("win1")
            window_2d = window_full.view(bs, W)
            window = window_full if W == N else window_2d[:, :N].contiguous().view(-1)

            # 1) draft block -> trees (budget 0: no drafter, the bonus token alone)
            if B > 0:
                sp.mark("draft0")
                draft_hidden, draft_in_graph = self._ddtree_draft(batch, draft_input, window_2d)
                sp.mark("draft1")
                trees = self._ddtree_trees(draft_hidden, draft_input.bonus_tokens.view(-1), draft_in_graph, budget=B)
                sp.mark("tree1")
            else:
                trees = root_only_trees(draft_input.bonus_tokens.view(-1))
            spec_steps = min(self.ddtree_L, B)

            # 2) tree verify input (EAGLE layout), mask into the backend's buffer when it fits
            attn = self.model_runner.attn_backend
            vm = getattr(attn, "verify_mask", None)
            mask_buf, seq_lens_sum = None, None
            if vm is not None and vm.mode == TreeMaskMode.FULL_MASK and vm.fits(bs):
                # as EAGLE: write into the backend's (graph-captured) buffer, reset whole
                mask_buf = vm.buffer
            elif draft_input.nxt_kv_lens_sum is not None:
                # host upper bound of the committed lengths (reserved lengths); the
                # layout itself follows the device seq_lens, over-size is safe
                seq_lens_sum = int(draft_input.nxt_kv_lens_sum)
            elif batch.seq_lens_cpu is not None:
                seq_lens_sum = int(batch.seq_lens_cpu.sum())
            else:
                seq_lens_sum = bs * int(attn.max_context_len)
            verify_plan = self.model_runner.kv_index_translator.plan(
                req_pool_indices=batch.req_pool_indices,
                seq_lens=prefix_lens,
                seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu,
                write_virtual=window,
                read_extent=N,
            )
            sp.mark("prep0")
            verify_input = make_tree_verify_input(
                trees, prefix_lens, spec_steps, seq_lens_sum=seq_lens_sum, mask_buf=mask_buf,
                prepared_out_cache_loc=window, kv_loc_plan=verify_plan,
            )
            grammar_tree = (
                GrammarTree.from_device(
                    verify_input.retrieve_next_token,
                    verify_input.retrieve_next_sibling,
                    verify_input.draft_token.view(verify_input.retrieve_next_token.shape),
                )
                if batch.has_grammar
                else None
            )
            batch.spec_info = verify_input
            verify_fb, can_run_cuda_graph = eagle_prepare_for_verify(
                verify_input, self.model_runner.req_to_token_pool, batch, self.target_worker
            )
            sp.mark("prep1")
            target_out = self.target_worker.forward_batch_generation(
                batch=None, forward_batch=verify_fb, is_verify=True, pp_proxy_tensors=pp_proxy_tensors
            )
            logits_output = target_out.logits_output
            sp.mark("target1")

            # 3) accept (greedy tree walk / target-only sampling), SGLang's own kernels
            grammar_mask = None
            if batch.has_grammar:
                grammar_mask = build_grammar_vocab_mask(
                    reqs=batch.reqs, tree=grammar_tree, sampling_info=batch.sampling_info,
                    device=verify_input.retrieve_next_token.device, barrier=grammar_barrier,
                )
            sp.mark("commit0")
            predict, accept_lens, accept_index = eagle_sample(verify_input, batch, logits_output, grammar_mask)
            if batch.return_logprob:
                compute_spec_logprobs(batch, logits_output, predict, accept_index=accept_index)

            # 4) commit + target KV / hidden compaction to the accepted path
            predict = _finalize_accept_tree_path(
                batch, accept_index, accept_lens, predict, logits_output, bs,
                token_to_kv_pool_allocator=self.model_runner.token_to_kv_pool_allocator,
                num_draft_tokens=N,
            )
            bonus, new_seq_lens = committed_outputs(predict, accept_lens, prefix_lens, N)
            sp.mark("commit1")
            if on_publish is not None:
                on_publish(new_seq_lens)

            # 5) drafter context: projected target hidden of the accepted path at seq_len + k
            hidden = logits_output.hidden_states
            if hidden is None:
                raise RuntimeError("DDTREE verify requires target hidden states (capture FULL), got None.")
            hidden = hidden[: bs * N]
            front_pos = (prefix_lens.to(torch.int64).unsqueeze(1) + torch.arange(N, device=device)).reshape(-1)
            cache_loc = self._draft_write_ids(verify_plan)
            commit_lens = accept_lens.to(torch.int32)
            sp.mark("commit2")
            self._append_target_hidden_to_draft_kv_by_loc(
                target_hidden=hidden.reshape(bs * N, -1),
                cache_loc=cache_loc,
                cache_loc_2d=cache_loc.view(bs, N),
                positions=front_pos,
                commit_lens=commit_lens,
            )
            logits_output.hidden_states = None

            next_draft_input = self._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens)
            sp.mark("commit3")
            sp.done(bs, B)
            out = GenerationBatchResult(
                logits_output=logits_output,
                next_token_ids=predict,
                accept_lens=accept_lens,
                can_run_cuda_graph=can_run_cuda_graph,
                next_draft_input=next_draft_input,
                speculative_num_draft_tokens=N,
                new_seq_lens=new_seq_lens,
                routed_experts_output=target_out.routed_experts_output,
                indexer_topk_output=target_out.indexer_topk_output,
                extra_keep_alive_refs=[verify_fb],
            )
            parts.end()  # the step's last mark; every SGLANG_DDTREE_STEP_PARTS_EVERY steps TP0 logs the line
            return out

    if base is None:
        _WORKER_CLS = DDTreeWorkerV2
    return DDTreeWorkerV2


# ---------------------------------------------------------------------------
# standalone entry points (kept from the first version; used by tests/bench)
# ---------------------------------------------------------------------------


def build_verify(draft_logits, bonus_tokens, seq_lens, seq_lens_sum: int, budget: int, mask_buf=None):
    """Trees + SGLang ``EagleVerifyInput`` for one decode step from drafter logits (GPU, graph-safe)."""
    trees = build_trees(draft_logits, budget, bonus_tokens)
    steps = min(int(draft_logits.shape[1]), int(budget))
    return trees, make_tree_verify_input(trees, seq_lens, steps, seq_lens_sum=seq_lens_sum, mask_buf=mask_buf)


def accept(trees: DDTrees, target_logits, max_depth: int, temperature=None) -> AcceptResult:
    if temperature is None:
        return greedy_accept(trees, target_logits, max_depth)
    return sample_accept(trees, target_logits, temperature, max_depth)
