"""The per-configuration target (and drafter) state of a budget schedule or a
trial set, and their captures: SGLang 0.5.23's ``capture_decode_graph`` run once
per band (schedule), per verify width and per draft budget (trial set).

Below both :mod:`sglang_ddtree.plugin` (whose AROUND hook on
``capture_decode_graph`` calls the capture functions here) and
:mod:`sglang_ddtree.worker` (which switches between the states, and builds eager
ones when no capture ran); imports only :mod:`sglang_ddtree.schedule` and
:mod:`sglang_ddtree.trialset`.  SGLang itself is imported inside the functions.
"""

from __future__ import annotations

import logging

from .schedule import BudgetSchedule
from .trialset import TrialSet

logger = logging.getLogger("sglang_ddtree.plugin")  # the capture's log lines keep the plugin's logger name

__all__ = ["BandState", "GraphState", "capture_banded_verify_graphs", "capture_trial_verify_graphs",
           "capture_trial_draft_graphs"]


class GraphState:
    """Runtime resources of one captured configuration (SGLang's ``SpecRuntimeState``
    for one stage): the attention backend it was built with and the decode graph
    runner of its captured batch sizes (None: cuda graphs disabled)."""

    def __init__(self, width, bs, attn_backend, graph_runner):
        self.width = width
        self.bs = bs
        self.attn_backend = attn_backend
        self.graph_runner = graph_runner

    def __repr__(self):
        return f"{type(self).__name__}(width={self.width}, bs={self.bs})"


class BandState(GraphState):
    """One schedule band on the target: built at the band's width, the runner of the
    band's captured batch sizes."""

    def __init__(self, index, band, bs, attn_backend, graph_runner):
        super().__init__(band.width, bs, attn_backend, graph_runner)
        self.index = index
        self.band = band
        self.budget = band.budget

    def __repr__(self):
        return f"BandState({self.index}, budget={self.budget}, width={self.width}, bs={self.bs})"


class TrialState(GraphState):
    """One verify width (target) or one draft budget (drafter) of a trial set, and the
    candidates that use it."""

    def __init__(self, key, width, bs, attn_backend, graph_runner, users):
        super().__init__(width, bs, attn_backend, graph_runner)
        self.key = key  # the verify width (target) or the budget (drafter)
        self.users = list(users)


def _new_attn_backend(model_runner):
    """A fresh attention backend (as EAGLE's ``build_adaptive_runtime_state``): built
    under the configuration's overrides, its own cuda-graph state (a graph runner
    captured on a shared backend would read buffers the next runner reallocates)."""
    backup = getattr(model_runner, "init_new_workspace", None)
    try:
        return model_runner._get_attention_backend(init_new_workspace=True)
    finally:
        model_runner.init_new_workspace = backup


def _sglang_context(ctx, exec_cfg, spec, with_phase):
    if ctx is None or exec_cfg is None or spec is None or with_phase is None:
        from sglang.srt.model_executor.cuda_graph_config import with_phase as _wp
        from sglang.srt.runtime_context import get_context, get_exec, get_spec

        ctx = ctx or get_context()
        exec_cfg = exec_cfg or get_exec()
        spec = spec or get_spec()
        with_phase = with_phase or _wp
    return ctx, exec_cfg, spec, with_phase


def _graphs_on(graphs_on):
    if graphs_on is None:
        from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

        graphs_on = not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
    return graphs_on


def _capture_in_turn(original_fn, model_runner, units, *, ctx, exec_cfg, spec, with_phase, new_backend, home):
    """Per unit ``(width or None, bs or None, line or None)``, in order: the line, then
    SGLang's ``capture_decode_graph`` under an override of the verify width
    (``speculative_num_draft_tokens``; None: not overridden, the drafter) and the
    captured batch sizes (``cuda_graph_config.decode.bs``), with a fresh attention
    backend — unit ``home`` keeps the startup one.  Overrides are restored after
    each unit, the startup backend at the end.  Returns ``[(backend, capture)]``."""
    gcfg = exec_cfg.graph.cuda_graph_config
    n_orig = int(spec.speculative_num_draft_tokens)
    orig_backend = model_runner.attn_backend
    out = []
    try:
        for i, (width, bs, line) in enumerate(units):
            fields, restore = {}, {}
            if width is not None:
                fields["speculative_num_draft_tokens"] = int(width)
                restore["speculative_num_draft_tokens"] = n_orig
            if bs is not None:
                fields["cuda_graph_config"] = with_phase(gcfg, "decode", bs=list(bs))
                restore["cuda_graph_config"] = gcfg
            if line:
                logger.info(line)
            if fields:
                ctx.override("ddtree.capture", **fields)
            try:
                backend = orig_backend if i == home else new_backend(model_runner)
                model_runner.attn_backend = backend
                cap = original_fn(model_runner=model_runner)
            finally:
                if restore:
                    ctx.override("ddtree.capture_restore", **restore)
            out.append((backend, cap))
    finally:
        model_runner.attn_backend = orig_backend
    return out


def _combined_capture(caps, home):
    """One ``GraphCapture`` for SGLang: the home unit's runner, memory and time summed."""
    first = caps[home]
    if first is None:  # eager-only states (the worker's fallback)
        return None
    try:
        return type(first)(
            runner=getattr(first, "runner", None),
            memory_phase=first.memory_phase,
            memory_usage_gb=sum(float(c.memory_usage_gb) for c in caps),
            capture_time=sum(float(c.capture_time) for c in caps),
        )
    except TypeError:  # pragma: no cover - a stand-in capture type
        return first


def capture_banded_verify_graphs(original_fn, model_runner, sched: BudgetSchedule, *, ctx=None, exec_cfg=None,
                                 spec=None, graphs_on=None, all_bs=None, new_backend=None, with_phase=None):
    """The target-verify capture for a budget schedule: per band, in order, SGLang's
    own ``capture_decode_graph`` under an override of the band's width
    (``speculative_num_draft_tokens``) and captured batch sizes
    (``cuda_graph_config.decode.bs``), with the band's own attention backend;
    each captured bs once, at its band's width.  Returns one ``GraphCapture``
    (the widest band's runner; memory and time summed) and leaves the band
    states on ``model_runner._ddtree_band_states`` for the worker to switch
    between.  The keyword arguments replace SGLang's accessors (tests)."""
    ctx, exec_cfg, spec, with_phase = _sglang_context(ctx, exec_cfg, spec, with_phase)
    graphs_on = _graphs_on(graphs_on)
    if graphs_on and all_bs is None:
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

        all_bs, _ = get_batch_sizes_to_capture(model_runner, sched.budget_max + 1)
    logger.info(sched.log_line())
    sched.set_cuda_graph_bs(all_bs if graphs_on else None)
    sched.check_graph_bands()

    n_max = int(spec.speculative_num_draft_tokens)
    bands_bs = [sched.cuda_graph_bs_for_band(i) for i in range(len(sched.bands))]
    # the band that keeps the startup backend: the first one at the global width
    home = next((i for i, b in enumerate(sched.bands) if b.width == n_max), None)
    done = _capture_in_turn(original_fn, model_runner,
                            [(band.width, bs, None) for band, bs in zip(sched.bands, bands_bs)],
                            ctx=ctx, exec_cfg=exec_cfg, spec=spec, with_phase=with_phase,
                            new_backend=new_backend or _new_attn_backend, home=home)
    states = [BandState(i, band, bs, backend, getattr(cap, "runner", None))
              for i, (band, bs, (backend, cap)) in enumerate(zip(sched.bands, bands_bs, done))]
    attach_bands(model_runner, sched, states)
    return _combined_capture([cap for _, cap in done], home if home is not None else 0)


def capture_trial_verify_graphs(original_fn, model_runner, trials: TrialSet, *, ctx=None, exec_cfg=None,
                                spec=None, graphs_on=None, all_bs=None, new_backend=None, with_phase=None):
    """The target-verify capture for a trial set: per distinct verify width, widest
    first, one line ``DDTree trial width W (budget W-1): bs [...] for <candidates>``
    and SGLang's ``capture_decode_graph`` at that width over the captured bs some
    candidate routes to it (each bs once per width), each width with its own
    attention backend (the widest keeps the startup one).  Leaves
    ``model_runner._ddtree_trials`` and ``model_runner._ddtree_trial_states``
    (verify width -> :class:`TrialState`) for the worker."""
    ctx, exec_cfg, spec, with_phase = _sglang_context(ctx, exec_cfg, spec, with_phase)
    graphs_on = _graphs_on(graphs_on)
    if graphs_on and all_bs is None:
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

        all_bs, _ = get_batch_sizes_to_capture(model_runner, trials.budget_max + 1)
    logger.info(trials.log_line())
    trials.set_cuda_graph_bs(all_bs if graphs_on else None)
    trials.check_graph_bands()
    plan = trials.verify_plan()  # widest first: the first unit is at --speculative-num-draft-tokens
    done = _capture_in_turn(original_fn, model_runner,
                            [(w, bs, TrialSet.width_line(w, bs, users)) for w, bs, users in plan],
                            ctx=ctx, exec_cfg=exec_cfg, spec=spec, with_phase=with_phase,
                            new_backend=new_backend or _new_attn_backend, home=0)
    model_runner._ddtree_trials = trials
    model_runner._ddtree_trial_states = {
        w: TrialState(w, w, bs, backend, getattr(cap, "runner", None), users)
        for (w, bs, users), (backend, cap) in zip(plan, done)}
    return _combined_capture([cap for _, cap in done], 0)


def capture_trial_draft_graphs(original_fn, draft_runner, plan, select_head, *, ctx=None, exec_cfg=None, spec=None,
                               new_backend=None, with_phase=None):
    """The drafter's decode capture for a trial set: per draft budget (``plan``:
    ``[(budget, bs, candidates)]``, largest first) one line ``DDTree trial draft
    budget B: bs [...] for <candidates>`` and SGLang's ``capture_decode_graph`` over
    those bs with ``select_head(B)`` called first, so the capture tail hook (the
    worker's :class:`~sglang_ddtree.worker.CaptureBudgetHead`) folds budget B's
    head into these graphs; each budget with its own draft attention backend (the
    first keeps the startup one).  Leaves ``draft_runner._ddtree_draft_states``
    (budget -> :class:`TrialState`)."""
    plan = [(b, bs, users) for b, bs, users in plan if bs]
    if not plan:  # nothing routed to a tree: DFlash's own capture
        return original_fn(model_runner=draft_runner)
    ctx, exec_cfg, spec, with_phase = _sglang_context(ctx, exec_cfg, spec, with_phase)

    def capture_budget(budget):
        def run(*, model_runner):
            select_head(budget)
            return original_fn(model_runner=model_runner)
        return run

    done, caps = [], []
    for i, (budget, bs, users) in enumerate(plan):
        # one unit at a time: each has its own capture function (its head)
        (backend, cap), = _capture_in_turn(
            capture_budget(budget), draft_runner, [(None, bs, TrialSet.draft_line(budget, bs, users))],
            ctx=ctx, exec_cfg=exec_cfg, spec=spec, with_phase=with_phase,
            new_backend=new_backend or _new_attn_backend, home=0 if i == 0 else None)
        done.append((budget, bs, users, backend, cap))
        caps.append(cap)
    draft_runner._ddtree_draft_states = {
        budget: TrialState(budget, None, bs, backend, getattr(cap, "runner", None), users)
        for budget, bs, users, backend, cap in done}
    return _combined_capture(caps, 0)


def attach_bands(model_runner, sched, states) -> None:
    """The model runner's band states (what the worker's band switch reads):
    set by the capture above, or by a harness that captures its own graphs."""
    model_runner._ddtree_schedule = sched
    model_runner._ddtree_band_states = states
