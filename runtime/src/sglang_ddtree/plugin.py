"""SGLang 0.5.23 plugin: registers the DDTREE speculative algorithm.

Entry point (pyproject): group ``sglang.srt.plugins``, name ``ddtree`` ->
``sglang_ddtree.plugin:register``.  The deploy sets ``SGLANG_PLUGINS=ddtree``;
``sglang.srt.plugins.load_plugins()`` runs ``register()`` in every SGLang
process.  ``register()`` is idempotent.

What it does:
  * ``SpeculativeAlgorithm.register("DDTREE", spec_class=DDTreeSpecAlgo)``
    with a worker factory (``sglang_ddtree.worker``, built on DFlashWorkerV2);
  * ``DDTreeSpecAlgo.get_num_tokens_per_req_for_target_verify`` = budget + 1
    (= ``--speculative-num-draft-tokens``) for the target, the drafter's
    block size for the draft worker;
  * an AROUND hook on ``spec_info.create_dummy_verify_input`` (the dummy
    forward / warm-up path, base_runner.py) and one on
    ``DecodeCudaGraphRunner.get_spec_info`` (the target-verify CUDA-graph
    capture itself): for DDTREE's target they return a tree verify input
    (EagleVerifyInput layout, ``draft_token_num = budget + 1``, the runner's
    custom-mask buffer) instead of DFlash's linear, possibly mask-less one, so
    the captured attention metadata is the tree's;
  * an AROUND hook on ``cuda_graph_setup.capture_decode_graph``: with a budget
    schedule (``SGLANG_DDTREE_SCHEDULE_FILE``) the target-verify capture runs
    once per band; with a trial set (``SGLANG_DDTREE_TRIAL_SET_FILE``) once per
    verify width any candidate needs, and the drafter's once per draft budget
    (``bands``);
  * an AROUND hook on the scheduler's ``_add_speculative`` (``/server_info``):
    ``internal_states[i]["ddtree"]`` = the worker's status (the active
    candidate, since which decode step, what was captured).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Optional

from .config import budget_from_num_draft_tokens, read_block_size
from .bands import (BandState, _new_attn_backend, capture_banded_verify_graphs,  # noqa: F401  (re-exported)
                    capture_trial_draft_graphs, capture_trial_verify_graphs)
from .schedule import ENV_SCHEDULE_FILE, BudgetSchedule, load_schedule  # noqa: F401
from .trialset import ENV_CONTROL_FILE, ENV_TRIAL_SET_FILE, TrialSet, load_trial_set  # noqa: F401

logger = logging.getLogger(__name__)

ALGO_NAME = "DDTREE"
DUMMY_VERIFY_TARGET = "sglang.srt.speculative.spec_info.create_dummy_verify_input"
GRAPH_SPEC_INFO_TARGET = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"
CAPTURE_DECODE_TARGET = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_decode_graph"
INTERNAL_STATE_TARGET = ("sglang.srt.managers.scheduler_components.internal_state."
                         "SchedulerInternalStateController._add_speculative")

_SPEC_CLASS = None


def _cfg(server_args: Any) -> Any:
    try:
        from sglang.srt.arg_groups.overrides import resolving_view

        return resolving_view(server_args)
    except Exception:  # pragma: no cover - older layouts
        return server_args


def validate_server_args(server_args: Any) -> None:
    """Raise ValueError for a DDTREE configuration that cannot work."""
    cfg = _cfg(server_args)
    # one band (budget = num_draft_tokens - 1), or the budget schedule file
    # (SGLANG_DDTREE_SCHEDULE_FILE): malformed / widest width != num_draft_tokens -> ValueError
    load_schedule(getattr(cfg, "speculative_num_draft_tokens", None))
    # the trial set (SGLANG_DDTREE_TRIAL_SET_FILE): malformed / widest width != num_draft_tokens /
    # a schedule file as well -> ValueError
    load_trial_set(getattr(cfg, "speculative_num_draft_tokens", None))
    if not getattr(cfg, "speculative_draft_model_path", None):
        raise ValueError("DDTREE requires --speculative-draft-model-path (the DFlash drafter).")
    if getattr(cfg, "speculative_dflash_block_size", None) is not None:
        raise ValueError(
            "DDTREE takes the drafter block size from the drafter's config.json; "
            "do not pass --speculative-dflash-block-size (--speculative-num-draft-tokens is budget + 1)."
        )
    pp = getattr(cfg, "pp_size", 1)
    if pp not in (None, 1):
        raise ValueError("DDTREE supports pp_size == 1 only.")


def _make_spec_class():
    global _SPEC_CLASS
    if _SPEC_CLASS is not None:
        return _SPEC_CLASS
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class DDTreeSpecAlgo(CustomSpecAlgo):
        """DFlash-family algorithm whose target verify is a tree of budget + 1 tokens."""

        block_size: Optional[int] = None

        # Behave as the DFlash family (drafter conditioned on target hidden
        # states, draft KV, target-verify for draft) but not as plain DFLASH,
        # so DFlash's own argument handling (num_draft_tokens == block size)
        # does not apply.
        def is_dflash_family(self) -> bool:
            return True

        def supports_target_verify_for_draft(self) -> bool:
            return True

        def has_draft_kv(self) -> bool:
            return True

        def handle_server_args(self, server_args) -> None:
            validate_server_args(server_args)
            cfg = _cfg(server_args)
            self.block_size = read_block_size(getattr(cfg, "speculative_draft_model_path", None))
            # SGLang hands a custom algorithm a stand-in whose plain writes
            # are recorded as declared resolutions (speculative_hook.py).
            if getattr(cfg, "speculative_num_steps", None) != 1:
                server_args.speculative_num_steps = 1
            if getattr(cfg, "speculative_eagle_topk", None) != 1:
                server_args.speculative_eagle_topk = 1

        def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
            if is_draft_worker:
                # the drafter's forward is one block: bonus + (block_size - 1) masks
                return int(self.block_size or read_block_size(None))
            if int(num_draft_tokens) == 1:
                return 1  # a budget-0 band of the schedule: the bonus token alone
            budget = budget_from_num_draft_tokens(num_draft_tokens)
            return budget + 1

    _SPEC_CLASS = DDTreeSpecAlgo
    return DDTreeSpecAlgo


def _worker_factory(server_args):
    from .worker import make_worker_class

    return make_worker_class()


def make_dummy_verify_input(custom_mask, num_tokens_per_req: int, block_size: Optional[int] = None):
    """Dummy tree verify input for CUDA-graph capture of the target verify."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    L = int(block_size or read_block_size(None)) - 1
    budget = int(num_tokens_per_req) - 1
    return EagleVerifyInput(
        draft_token=None,
        custom_mask=custom_mask,
        positions=None,
        retrieve_index=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        retrieve_cum_len=None,
        spec_steps=min(L, budget),  # accept_index width = spec_steps + 1 <= budget + 1 (0 for width 1)
        topk=max(2, budget),  # > 1: a tree (custom mask), not a chain
        draft_token_num=int(num_tokens_per_req),
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=None,
        seq_lens_cpu=None,
    )


def _dummy_verify_hook(original_fn, *args, **kwargs):
    try:
        bound = inspect.signature(original_fn).bind(*args, **kwargs)
        algo = bound.arguments.get("spec_algorithm")
        is_draft = bound.arguments.get("is_draft_worker", False)
    except TypeError:
        return original_fn(*args, **kwargs)
    if getattr(algo, "name", None) == ALGO_NAME and not is_draft:
        return make_dummy_verify_input(
            bound.arguments["custom_mask"],
            bound.arguments["num_tokens_per_req"],
            getattr(algo, "block_size", None),
        )
    return original_fn(*args, **kwargs)


def _graph_spec_info_hook(original_fn, runner, *args, **kwargs):
    """AROUND ``DecodeCudaGraphRunner.get_spec_info(self, num_tokens)``: the
    target-verify capture of DDTREE gets a tree ``EagleVerifyInput`` of
    ``captured_req_width`` (= budget + 1) tokens per request with the runner's
    custom-mask buffer; the drafter's runner and other algorithms are untouched."""
    mr = getattr(runner, "model_runner", None)
    algo = getattr(mr, "spec_algorithm", None)
    if getattr(algo, "name", None) != ALGO_NAME or getattr(mr, "is_draft_worker", False):
        return original_fn(runner, *args, **kwargs)
    width = int(getattr(runner, "captured_req_width", 0) or 0)
    if width <= 0:
        width = int(mr.decode_num_tokens_per_req())  # = budget + 1 via DDTreeSpecAlgo
    buffers = getattr(runner, "buffers", None)
    return make_dummy_verify_input(getattr(buffers, "custom_mask", None), width, getattr(algo, "block_size", None))


def _capture_decode_graph_hook(original_fn, *args, **kwargs):
    """AROUND ``cuda_graph_setup.capture_decode_graph(*, model_runner)``: with a
    budget schedule file, DDTREE's target-verify capture runs once per band
    (:func:`capture_banded_verify_graphs`); with a trial set once per verify width
    (:func:`capture_trial_verify_graphs`), and the drafter's capture once per draft
    budget (:func:`capture_trial_draft_graphs`: the worker leaves the plan on its
    draft model runner as ``_ddtree_draft_capture`` before DFlash captures);
    everything else is untouched."""
    mr = kwargs.get("model_runner", args[0] if args else None)
    if getattr(mr, "is_draft_worker", False):
        draft_capture = getattr(mr, "_ddtree_draft_capture", None)
        if draft_capture is None:
            return original_fn(*args, **kwargs)
        plan, select_head = draft_capture
        return capture_trial_draft_graphs(original_fn, mr, plan, select_head)
    algo = getattr(mr, "spec_algorithm", None)
    if getattr(algo, "name", None) != ALGO_NAME:
        return original_fn(*args, **kwargs)
    from sglang.srt.runtime_context import get_spec

    n = get_spec().speculative_num_draft_tokens
    trials = load_trial_set(n)
    if trials is not None:
        return capture_trial_verify_graphs(original_fn, mr, trials)
    sched = load_schedule(n)
    if sched.source is None:  # no schedule file: today's single capture
        return original_fn(*args, **kwargs)
    return capture_banded_verify_graphs(original_fn, mr, sched)


def _internal_state_hook(original_fn, controller, state, *args, **kwargs):
    """AROUND ``SchedulerInternalStateController._add_speculative(self, state)``
    (``/server_info``'s ``internal_states``): adds ``state["ddtree"]``, the DDTree
    worker's status (``DDTreeWorkerV2.ddtree_status``: active candidate, since
    which decode step, captured widths / budgets)."""
    out = original_fn(controller, state, *args, **kwargs)
    worker = getattr(getattr(controller, "scheduler", None), "draft_worker", None)
    status = getattr(worker, "ddtree_status", None)
    if callable(status) and isinstance(state, dict):
        state["ddtree"] = status()
    return out


def _register_hook(target: str, fn) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not any(h[1] is fn for h in HookRegistry._hooks.get(target, [])):
        HookRegistry.register(target, fn, HookType.AROUND)


def register() -> None:
    """Entry point ``ddtree`` in group ``sglang.srt.plugins``."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    if get_spec(ALGO_NAME) is None:
        SpeculativeAlgorithm.register(
            ALGO_NAME,
            supports_overlap=True,
            validate_server_args=validate_server_args,
            spec_class=_make_spec_class(),
        )(_worker_factory)
        logger.info("sglang_ddtree: registered speculative algorithm %s", ALGO_NAME)
    for target, fn in ((DUMMY_VERIFY_TARGET, _dummy_verify_hook), (GRAPH_SPEC_INFO_TARGET, _graph_spec_info_hook),
                       (CAPTURE_DECODE_TARGET, _capture_decode_graph_hook),
                       (INTERNAL_STATE_TARGET, _internal_state_hook)):
        try:
            _register_hook(target, fn)
        except Exception:  # pragma: no cover
            logger.exception("sglang_ddtree: could not register the hook on %s", target)
