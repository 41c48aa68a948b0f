"""The budget schedule's per-band target state and the banded target-verify
capture (SGLang 0.5.23's ``capture_decode_graph`` once per band).

Below both :mod:`sglang_ddtree.plugin` (whose AROUND hook on
``capture_decode_graph`` calls :func:`capture_banded_verify_graphs`) and
:mod:`sglang_ddtree.worker` (which switches between the :class:`BandState` objects,
and builds eager ones when no capture ran); imports only
:mod:`sglang_ddtree.schedule`.  SGLang itself is imported inside the functions.
"""

from __future__ import annotations

import logging

from .schedule import BudgetSchedule

logger = logging.getLogger("sglang_ddtree.plugin")  # the capture's log lines keep the plugin's logger name

__all__ = ["BandState", "capture_banded_verify_graphs"]


class BandState:
    """Runtime resources of one schedule band on the target (SGLang's
    ``SpecRuntimeState`` for the verify stage): the attention backend built at
    the band's width and the target-verify graph runner of the band's captured
    batch sizes (None: cuda graphs disabled / no captured bs)."""

    def __init__(self, index, band, bs, attn_backend, graph_runner):
        self.index = index
        self.band = band
        self.width = band.width
        self.budget = band.budget
        self.bs = bs
        self.attn_backend = attn_backend
        self.graph_runner = graph_runner

    def __repr__(self):
        return f"BandState({self.index}, budget={self.budget}, width={self.width}, bs={self.bs})"


def _new_attn_backend(model_runner):
    """A fresh target attention backend (as EAGLE's ``build_adaptive_runtime_state``):
    built under the band's width override, its own cuda-graph state."""
    backup = getattr(model_runner, "init_new_workspace", None)
    try:
        return model_runner._get_attention_backend(init_new_workspace=True)
    finally:
        model_runner.init_new_workspace = backup


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
    if ctx is None or exec_cfg is None or spec is None or with_phase is None:
        from sglang.srt.model_executor.cuda_graph_config import with_phase as _wp
        from sglang.srt.runtime_context import get_context, get_exec, get_spec

        ctx = ctx or get_context()
        exec_cfg = exec_cfg or get_exec()
        spec = spec or get_spec()
        with_phase = with_phase or _wp
    if graphs_on is None:
        from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

        graphs_on = not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
    if graphs_on and all_bs is None:
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

        all_bs, _ = get_batch_sizes_to_capture(model_runner, sched.budget_max + 1)
    new_backend = new_backend or _new_attn_backend
    logger.info(sched.log_line())
    sched.set_cuda_graph_bs(all_bs if graphs_on else None)
    sched.check_graph_bands()

    gcfg = exec_cfg.graph.cuda_graph_config
    n_max = int(spec.speculative_num_draft_tokens)
    orig_backend = model_runner.attn_backend
    states, caps = [], []
    home = None  # the band that keeps the startup backend (the first one at the global width)
    try:
        for i, band in enumerate(sched.bands):
            bs_i = sched.cuda_graph_bs_for_band(i)
            fields = dict(speculative_num_draft_tokens=band.width)
            if bs_i is not None:
                fields["cuda_graph_config"] = with_phase(gcfg, "decode", bs=list(bs_i))
            ctx.override("ddtree.band_capture", **fields)
            try:
                if home is None and band.width == n_max:
                    home, backend = i, orig_backend
                else:
                    backend = new_backend(model_runner)
                model_runner.attn_backend = backend
                cap = original_fn(model_runner=model_runner)
            finally:
                ctx.override("ddtree.band_capture_restore", speculative_num_draft_tokens=n_max, cuda_graph_config=gcfg)
            caps.append(cap)
            states.append(BandState(i, band, bs_i, backend, getattr(cap, "runner", None)))
    finally:
        model_runner.attn_backend = orig_backend
    model_runner._ddtree_schedule = sched
    model_runner._ddtree_band_states = states
    first = caps[home if home is not None else 0]
    if first is None:  # eager-only states (the worker's fallback)
        return None
    try:
        return type(first)(
            runner=states[home if home is not None else 0].graph_runner,
            memory_phase=first.memory_phase,
            memory_usage_gb=sum(float(c.memory_usage_gb) for c in caps),
            capture_time=sum(float(c.capture_time) for c in caps),
        )
    except TypeError:  # pragma: no cover - a stand-in capture type
        return first
