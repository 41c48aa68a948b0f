"""DDTree worker on top of SGLang's DFlash worker (GPU server only).

Imported lazily by the plugin's worker factory: importing SGLang's DFlash
worker needs the full CUDA stack (sgl_kernel, flashinfer, ...), which CI does
not have.  What this module provides:

  * ``DDTreeWorkerV2(DFlashWorkerV2)``: constructs the DFlash drafter with the
    drafter's own block size (config.json ``block_size``), while the target
    verify width is ``--speculative-num-draft-tokens`` = budget + 1;
  * ``build_verify`` : drafter logits [bs, L, V] + bonus tokens -> DDTrees +
    an ``EagleVerifyInput`` (tree tokens, positions, FULL custom mask,
    retrieve_index / next_token / next_sibling), all on the GPU, no host sync;
  * ``accept``       : target logits -> accepted node indices, accept length,
    next bonus token (greedy walk, or target-only sampling for T > 0).

NOT done yet (see runtime/README.md): wiring ``build_verify`` / ``accept``
into ``DFlashWorkerV2.forward_batch_generation`` in place of DFlash's linear
block verify (draft-logits capture from the DFlash head, KV-cache and
target-hidden compaction to the accepted indices).  Until then the class
behaves as the DFlash worker for drafting.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from .config import budget_from_num_draft_tokens, read_block_size
from .tree import DDTrees, build_trees
from .verify import AcceptResult, build_verify_inputs, greedy_accept, sample_accept

_WORKER_CLS = None


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


def make_worker_class():
    global _WORKER_CLS
    if _WORKER_CLS is not None:
        return _WORKER_CLS
    from sglang.srt.speculative import dflash_worker_v2 as dfw
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    class DDTreeWorkerV2(DFlashWorkerV2):
        def __init__(self, server_args, *args, **kwargs):
            spec = dfw.get_spec()
            self.ddtree_budget = budget_from_num_draft_tokens(spec.speculative_num_draft_tokens)
            self.ddtree_block_size = read_block_size(spec.speculative_draft_model_path)
            with _patched_spec(dfw, self.ddtree_block_size):
                super().__init__(server_args, *args, **kwargs)
            # DFlash reads this as its drafter width; the tree verify width is:
            self.ddtree_num_verify_tokens = self.ddtree_budget + 1
            self._ddtree_mask_buf: Optional[torch.Tensor] = None

        def build_verify(self, draft_logits, bonus_tokens, seq_lens, seq_lens_sum: int):
            return build_verify(draft_logits, bonus_tokens, seq_lens, seq_lens_sum, self.ddtree_budget)

        def accept(self, trees: DDTrees, target_logits, temperature=None) -> AcceptResult:
            return accept(trees, target_logits, self.ddtree_block_size - 1, temperature)

    _WORKER_CLS = DDTreeWorkerV2
    return DDTreeWorkerV2


@contextlib.contextmanager
def _patched_spec(mod, block_size: int):
    orig = mod.get_spec
    mod.get_spec = lambda: _SpecView(orig(), block_size)
    try:
        yield
    finally:
        mod.get_spec = orig


def build_verify(draft_logits, bonus_tokens, seq_lens, seq_lens_sum: int, budget: int, mask_buf=None):
    """Trees + SGLang ``EagleVerifyInput`` for one decode step (GPU, graph-safe)."""
    trees = build_trees(draft_logits, budget, bonus_tokens)
    vt = build_verify_inputs(trees, seq_lens, seq_lens_sum, mask_buf)
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    L = int(draft_logits.shape[1])
    vi = EagleVerifyInput(
        draft_token=vt.draft_token,
        custom_mask=vt.custom_mask,
        positions=vt.positions,
        retrieve_index=vt.retrieve_index,
        retrieve_next_token=vt.retrieve_next_token,
        retrieve_next_sibling=vt.retrieve_next_sibling,
        retrieve_cum_len=None,
        spec_steps=L,
        topk=max(2, budget),
        draft_token_num=budget + 1,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=seq_lens_sum,
        seq_lens_cpu=None,
    )
    return trees, vi


def accept(trees: DDTrees, target_logits, max_depth: int, temperature=None) -> AcceptResult:
    if temperature is None:
        return greedy_accept(trees, target_logits, max_depth)
    return sample_accept(trees, target_logits, temperature, max_depth)
