"""Startup of the emulated `sglang.launch_server` (SGLang 0.5.23's log lines and order).

Sequence: parse flags (real parser's table) -> server_args line -> checks
(model path, draft model path, speculative algorithm / plugins) -> per-rank
weight load, KV cache, CUDA-graph capture lines -> bind the HTTP port ->
warmup -> `The server is fired up and ready to roll!`.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

from sglang.lab import ddtree_runtime
from sglang.lab import faults as faults_mod
from sglang.lab import flags, gpu, perf, startup
from sglang.lab import schedule as schedule_mod
from sglang.lab import sglang_rules
from sglang.lab.log import log, fatal_traceback

BUILTIN_ALGOS = {"DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DSPARK", "UNO", "FROZEN_KV_MTP"}
NEEDS_DRAFT_MODEL = {"DFLASH", "EAGLE", "EAGLE3", "STANDALONE", "DSPARK", "DDTREE"}
TOTAL_GPU_GB = 97887 / 1024          # 95.59 GB, as SGLang prints (GiB)
WEIGHTS_GB = 73.61                   # Kimi K2.6 (int4 experts) per GPU at TP8/EP8
MAX_TOTAL_TOKENS = 1_048_576


def _plugin_names() -> list[str]:
    """Plugins SGLang would load: entry points in `sglang.srt.plugins`, filtered by SGLANG_PLUGINS."""
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    allowed_set = {x.strip() for x in allowed.split(",") if x.strip()} if allowed else None
    names = []
    for ep in entry_points(group="sglang.srt.plugins"):
        if allowed_set is not None and ep.name not in allowed_set:
            log(f"Skipping plugin {ep.name} (not in SGLANG_PLUGINS)")
            continue
        names.append(ep.name)
    return names


def _model_config_error(path: str) -> None:
    fatal_traceback(
        [("sglang/launch_server.py", 43, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
         ("sglang/srt/server_args.py", 5117, "__post_init__", "self._handle_model_specific_adjustments()"),
         ("sglang/srt/utils/hf_transformers_utils.py", 412, "get_config",
          "config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code, revision=revision, **kwargs)")],
        f"OSError: Can't load the configuration of '{path}'. If you were trying to load it from "
        f"'https://huggingface.co/models', make sure you don't have a local directory with the same name. "
        f"Otherwise, make sure '{path}' is the correct path to a directory containing a config.json file")


def _check_dir_with_config(path: str | None) -> dict:
    if not path or not Path(path, "config.json").is_file():
        _model_config_error(path or "None")
    try:
        return json.loads(Path(path, "config.json").read_text())
    except ValueError:
        _model_config_error(path)
        return {}


def _capture_bs(args, speculative: bool) -> list[int]:
    """The decode capture list: --cuda-graph-bs-decode as given, else SGLang's own list
    (sglang_rules, the generated copy of opsctl's one definition) up to the max bs."""
    if args.cuda_graph_bs_decode:
        return sorted(set(args.cuda_graph_bs_decode))
    max_bs = args.cuda_graph_max_bs_decode or (args.max_running_requests and min(args.max_running_requests, 256)) or \
        (64 if speculative else 256)
    return sglang_rules.decode_cuda_graph_batch_sizes(max_bs, speculative=speculative,
                                                      disable_padding=bool(args.disable_cuda_graph_padding))


def _server_args_repr(args) -> str:
    return "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in sorted(vars(args).items())) + ")"


def _compile_lines(st, rank: str, phase, budgets: set[int] | None = None) -> float:
    """The DDTree runtime's Triton compile lines (TP0), one per specialisation it had to compile
    (of `budgets` only, when given: a trial set compiles each budget's head inside its own draft
    capture); returns the modelled seconds."""
    from sglang.lab.runtime_msgs import DDTREE_COMPILE

    done = 0.0
    for spec, secs in st.compiles:
        if budgets is not None and spec.budget not in budgets:
            continue
        phase(secs)
        log(DDTREE_COMPILE.format(**spec.as_dict(), elapsed=secs,
                                  cache=st.compile_cache or "~/.triton/cache"), rank)
        done += secs
    return done


def _compile(st, rank: str, phase, *, capture_bs: list[int], hidden: int, tp: int) -> None:
    """The DDTree runtime's Triton compile, one line per specialisation it had to compile (TP0);
    the kernels are then in the cache, as after a real start (startup.record_compiled)."""
    _compile_lines(st, rank, phase)
    startup.record_compiled(st.compile_cache, [spec for spec, _ in st.compiles], capture_bs=capture_bs,
                            hidden=hidden, tp=tp)


_VALIDATE_FRAMES = [("sglang_ddtree/plugin.py", 88, "validate_server_args", "raise ValueError(...)")]
_SCHEDULER_INIT = ("sglang/srt/managers/scheduler.py", 3472, "run_scheduler_process",
                   "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)")


def _load_trials(num_draft_tokens: int):
    """The runtime's trial set (SGLANG_DDTREE_TRIAL_SET_FILE), read and checked by the runtime's own
    `load_trial_set` as its plugin's validate_server_args does (after the schedule file); None
    without the variable. A file the plugin rejects fails the start with the plugin's ValueError."""
    if not os.environ.get("SGLANG_DDTREE_TRIAL_SET_FILE"):
        return None
    try:
        trialset = ddtree_runtime.trialset()
    except ModuleNotFoundError as exc:   # the plugin's entry point names a package that is not there
        fatal_traceback([("sglang/srt/plugins/__init__.py", 41, "load_plugins", "fn = ep.load()")],
                        f"ModuleNotFoundError: {exc}")
    try:
        return trialset.load_trial_set(num_draft_tokens)
    except ValueError as exc:
        fatal_traceback(_VALIDATE_FRAMES, f"ValueError: {exc}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = flags.parse(argv)
    if args.model_path is None:
        flags.build_parser().error("the following arguments are required: --model-path/--model")
    active = faults_mod.for_algorithm(faults_mod.load(), args.speculative_algorithm,
                                      args.speculative_num_draft_tokens)
    tp = int(args.tp_size or 1)
    ep = int(args.ep_size or 1)
    ranks = [f"TP{r}" + (f" EP{r % ep}" if ep > 1 else "") if tp > 1 else (f"EP{r}" if ep > 1 else "")
             for r in range(max(tp, 1))]

    log(f"server_args={_server_args_repr(args)}")
    if active:
        log(f"[opsctl-lab] faults active: {', '.join(sorted(active))}")

    # ---- model + speculative configuration checks (as SGLang fails on them)
    model_cfg = _check_dir_with_config(args.model_path)
    algo = args.speculative_algorithm.upper() if args.speculative_algorithm else None
    plugins = _plugin_names()
    if algo and algo not in BUILTIN_ALGOS:
        registered = {"DDTREE"} if "ddtree" in plugins else set()
        if algo not in registered:
            fatal_traceback(
                [("sglang/launch_server.py", 43, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
                 ("sglang/srt/server_args.py", 1266, "_handle_speculative_decoding",
                  "algo = SpeculativeAlgorithm.from_string(self.speculative_algorithm)"),
                 ("sglang/srt/speculative/spec_info.py", 65, "from_string",
                  'raise ValueError(f"Unknown speculative algorithm name: {name}")')],
                f"ValueError: Unknown speculative algorithm name: {args.speculative_algorithm}")
        log(f"Loaded plugin ddtree: registered speculative algorithm {algo}")
    block_size = 8
    if algo in NEEDS_DRAFT_MODEL:
        draft_cfg = _check_dir_with_config(args.speculative_draft_model_path)
        block_size = int(draft_cfg.get("block_size") or draft_cfg.get("dflash_config", {}).get("block_size") or 8)
    width = 1
    if algo:
        width = args.speculative_num_draft_tokens or args.speculative_dflash_block_size or \
            (block_size if algo == "DFLASH" else None)
        if width is None:
            width = (args.speculative_num_steps or 3) + 1
        if algo == "DDTREE" and block_size > 2 * int(width):  # the runtime's worker.check_shapes
            fatal_traceback([("sglang_ddtree/worker.py", 327, "__init__",
                              "check_shapes(self.ddtree_budget, self.ddtree_block_size)")],
                            f"ValueError: DDTREE: the drafter block ({block_size}) must fit the per-step KV "
                            f"reservation (2 x --speculative-num-draft-tokens = 2 x (budget + 1) = {2 * int(width)}). "
                            f"Use a budget of at least {(block_size + 1) // 2 - 1}.")
        if algo == "DDTREE" and args.attention_backend == "torch_native":
            fatal_traceback([("sglang_ddtree/plugin.py", 88, "validate_server_args", "raise ValueError(...)")],
                            "ValueError: DDTREE needs tree verify; attention backend torch_native has none")
    captured_width = width
    wvt = active.get("wrong_verify_tokens")
    if wvt and algo:
        captured_width = int(wvt["num_tokens_per_req"])
    collapse = active.get("accept_collapse")
    host = active.get("host_overhead") if algo else None
    model = perf.Model(parallel="ep" if ep > 1 else "tp", algorithm=algo, width=int(width), block_size=block_size,
                       accept_override=float(collapse["accept_len"]) if collapse and algo else None,
                       cpu_tree_ms_per_req=float(collapse["cpu_tree_ms_per_req"]) if collapse and algo else 0.0,
                       host_ms_per_step=float(host["ms_per_step"]) if host else 0.0,
                       host_ms_per_req=float(host["ms_per_req"]) if host else 0.0)

    mfs = args.mem_fraction_static or 0.88
    graphs_off = args.disable_decode_cuda_graph or args.disable_cuda_graph or args.cuda_graph_backend_decode == "disabled"
    backend = args.cuda_graph_backend_decode or "full"
    capture_bs = [] if graphs_off else _capture_bs(args, bool(algo))
    schedule = None
    trials = None
    if algo == "DDTREE":
        try:
            schedule = schedule_mod.load(int(width), capture_bs)
        except ValueError as exc:
            fatal_traceback(_VALIDATE_FRAMES, f"ValueError: {exc}")
        trials = _load_trials(int(width))
    # a DDTree trial set (runtime/README.md, "Trial set and live switch"): the runtime's capture plan,
    # one target graph set per distinct verify width (widest first) over the captured bs some
    # candidate routes to it, the drafter once per budget > 0 over the bs routed to that budget
    verify_plan: list = []
    draft_plan: list = []
    band_error = None
    if trials is not None:
        trials.set_cuda_graph_bs(None if graphs_off else capture_bs)
        try:
            trials.check_graph_bands()
        except ValueError as exc:   # raised inside the target's capture (a scheduler exception)
            band_error = str(exc)
        if band_error is None:
            verify_plan = trials.verify_plan()
            draft_plan = [(b, bs, users) for b, bs, users in trials.draft_plan() if bs]
    trial_widths = None   # verify width -> the width its graphs were captured at (the fault changes one)
    # (num_tokens_per_req, batch sizes) per target-verify graph: one width per captured bs
    if trials is not None:
        captured_width = int(width)
        groups = [(w, bs or []) for w, bs, _ in verify_plan]
        drafted_bs = sorted({b for _, bs, _ in draft_plan for b in bs})
        trial_widths = {w: w for w, _ in groups}
        if wvt and groups:   # the fault: one width's graphs captured at the wrong width (index `band`)
            gi = int(wvt.get("band", 0)) if int(wvt.get("band", 0)) < len(groups) else 0
            trial_widths[groups[gi][0]] = int(wvt["num_tokens_per_req"])
            groups[gi] = (int(wvt["num_tokens_per_req"]), groups[gi][1])
    elif schedule is None:
        groups = [(captured_width, capture_bs)]
        drafted_bs = capture_bs
    else:
        captured_width = int(width)  # the wrong_verify_tokens fault then hits one band, not the server
        if wvt and int(wvt.get("band", 0)) >= len(schedule.bands):
            wvt = {**wvt, "band": 0}
        groups = [(b + 1, sizes) for (_, b), sizes in zip(schedule.bands, schedule.captured_by_band()) if sizes]
        drafted_bs = [bs for (_, b), sizes in zip(schedule.bands, schedule.captured_by_band()) if b > 0
                      for bs in sizes]
        if wvt:  # the fault: one band's graphs captured at the wrong width (band index `band`, default 0)
            band_i = int(wvt.get("band", 0))
            lo_bs = schedule.captured_by_band()[band_i] if band_i < len(schedule.bands) else []
            groups = [(int(wvt["num_tokens_per_req"]) if sizes == lo_bs else w, sizes) for w, sizes in groups]
    drafts = algo in ("DFLASH", "DDTREE") and bool(drafted_bs) and not graphs_off
    budgets = ((list(trials.draft_budgets) if trials is not None else [b for _, b in schedule.bands]
                if schedule is not None else [int(width) - 1]) if algo == "DDTREE" else [])
    vocab = int(model_cfg.get("vocab_size") or model_cfg.get("text_config", {}).get("vocab_size") or 163840)
    hidden = int(model_cfg.get("hidden_size") or model_cfg.get("text_config", {}).get("hidden_size") or 7168)
    try:
        st = startup.plan(groups=[] if graphs_off else groups, drafted_bs=drafted_bs if drafts else [],
                          budgets=budgets, block=block_size, vocab_shard=vocab // max(tp, 1),
                          skip_warmup=bool(args.skip_server_warmup), dummy_weights=args.load_format == "dummy",
                          draft_groups=[(b, bs) for b, bs, _ in draft_plan] if trials is not None and drafts else None,
                          image_warmup=(model_cfg.get("architectures") or ["KimiK25ForConditionalGeneration"])[0]
                          in startup.IMAGE_WARMUP_ARCHS and not args.skip_tokenizer_init)
    except startup.ScaleError as exc:
        startup.fail(str(exc))
    slow = active.get("slow_start")
    slow_load = float(slow.get("load_s", 0)) if slow else 0.0
    # the fault's real seconds are site seconds x the scale: the lines say what the site would see
    st.weight_load_s += slow_load * st.scale

    gpu.register(os.getpid(), int(TOTAL_GPU_GB * 1024 * mfs) + 500, max(tp, ep))

    def _on_term(signum, frame):
        gpu.unregister(os.getpid())
        os._exit(0)

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    t0 = time.monotonic()

    def phase(modelled_s: float) -> None:
        """Wait out a phase: its modelled seconds divided by the lab's time scale (the slowest rank's)."""
        time.sleep(st.lab(modelled_s * startup.rank_factor(len(ranks) - 1)))

    # ---- per-rank startup lines (0.5.23 prints no line of its own for the init before loading)
    phase(st.init_s)
    for r in ranks:
        log(f"Load weight begin. avail mem={TOTAL_GPU_GB - 0.98:.2f} GB", r)
    phase(st.weight_load_s)
    arch = (model_cfg.get("architectures") or ["KimiK25ForConditionalGeneration"])[0]
    for i, r in enumerate(ranks):
        log(f"Load weight end. elapsed={st.weight_load_s * startup.rank_factor(i):.2f} s, type={arch}, "
            f"avail mem={TOTAL_GPU_GB - 0.98 - WEIGHTS_GB:.2f} GB, mem usage={WEIGHTS_GB:.2f} GB.", r)
    phase(st.memory_pool_s)
    avail = TOTAL_GPU_GB * (1 - mfs) + 1.6
    for r in ranks:
        log(f"KV Cache is allocated. #tokens: {MAX_TOTAL_TOKENS}, KV size: 8.79 GB", r)
        log(f"Memory pool end. avail mem={avail:.2f} GB", r)

    if schedule is not None:
        for r in ranks:
            log(f"DDTree budget schedule: {schedule.text} (verify widths {','.join(map(str, schedule.widths))})", r)
    if trials is not None:   # the plugin's capture hook, every rank: the set, then a line before each width's pair
        for r in ranks:
            log(trials.log_line(), r)
        if band_error is not None:
            time.sleep(0.05)
            fatal_traceback(
                [_SCHEDULER_INIT,
                 ("sglang_ddtree/plugin.py", 218, "_capture_decode_graph_hook",
                  "return capture_trial_verify_graphs(original_fn, mr, trials)"),
                 ("sglang_ddtree/bands.py", 200, "capture_trial_verify_graphs", "trials.check_graph_bands()")],
                f"ValueError: {band_error}", rank=ranks[0], prefix="Scheduler hit an exception: ", sigquit=True)
        if graphs_off:   # `bs -`: no capture pairs, as SGLang prints none
            for w, _, users in verify_plan:
                for r in ranks:
                    log(trials.width_line(w, None, users), r)
    cap = active.get("capture_failure")
    if not graphs_off:
        name = "target verify" if algo else "target decode"
        for gi, (gwidth, gbs) in enumerate(groups):
            if trials is not None:
                w, _, users = verify_plan[gi]
                for r in ranks:
                    log(trials.width_line(w, gbs, users), r)
            for r in ranks:
                log(f"Capture {name} CUDA graph begin. backend={backend}, num_tokens_per_req={gwidth}, "
                    f"avail mem={avail:.2f} GB", r)
            if cap:
                time.sleep(0.05)
                from sglang.lab.runtime_msgs import CAPTURE_FAILED_HINTS

                fatal_traceback(
                    [("sglang/srt/managers/scheduler.py", 3472, "run_scheduler_process",
                      "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)"),
                     ("sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py", 780,
                      "capture_decode_graph", "runner = GraphRunnerCls(model_runner)"),
                     ("sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", 602, "__init__",
                      "raise Exception(")],
                    f"Exception: Capture cuda graph failed: {cap['message']}\n{CAPTURE_FAILED_HINTS}",
                    rank=ranks[0], prefix="Scheduler hit an exception: ", sigquit=True)
            cap_s = st.target_captures[gi][2]
            phase(cap_s)
            mem_use = 0.42 + 0.004 * gwidth * (max(gbs) if gbs else 1) / 8
            for i, r in enumerate(ranks):
                log(f"Capture {name} CUDA graph end. bs={gbs}, elapsed={cap_s * startup.rank_factor(i):.2f} s, "
                    f"mem usage={mem_use:.2f} GB, avail mem={avail - mem_use:.2f} GB.", r)
            avail -= mem_use
        if drafts and trials is not None:
            # the drafter captured once per draft budget, each with that budget's head (whose first
            # call, inside its capture, compiles that budget's kernels)
            for b, dbs, users in draft_plan:
                for r in ranks:
                    log(trials.draft_line(b, dbs, users), r)
                for r in ranks:
                    log(f"Capture draft decode CUDA graph begin. backend={backend}, num_tokens_per_req={block_size}, "
                        f"avail mem={avail:.2f} GB", r)
                compile_s = _compile_lines(st, ranks[0], phase, {b})
                ds = next(s for bb, _, s in st.draft_captures if bb == b)
                phase(ds)
                for i, r in enumerate(ranks):
                    log(f"Capture draft decode CUDA graph end. bs={dbs}, "
                        f"elapsed={ds * startup.rank_factor(i) + compile_s:.2f} s, mem usage=0.12 GB, "
                        f"avail mem={avail - 0.12:.2f} GB.", r)
                avail -= 0.12
            startup.record_compiled(st.compile_cache, [spec for spec, _ in st.compiles], capture_bs=capture_bs,
                                    hidden=hidden, tp=max(tp, 1))
        elif drafts:
            for r in ranks:
                log(f"Capture draft decode CUDA graph begin. backend={backend}, num_tokens_per_req={block_size}, "
                    f"avail mem={avail:.2f} GB", r)
            _compile(st, ranks[0], phase, capture_bs=capture_bs, hidden=hidden, tp=max(tp, 1))
            phase(st.draft_capture_s)
            compile_s = sum(s for _, s in st.compiles)
            for i, r in enumerate(ranks):
                log(f"Capture draft decode CUDA graph end. bs={drafted_bs}, "
                    f"elapsed={st.draft_capture_s * startup.rank_factor(i) + compile_s:.2f} s, mem usage=0.12 GB, "
                    f"avail mem={avail - 0.12:.2f} GB.", r)
            avail -= 0.12
    if st.compiles and not drafts:  # no draft graph to capture: the runtime compiles at its first call
        _compile(st, ranks[0], phase, capture_bs=capture_bs, hidden=hidden, tp=max(tp, 1))
    trial_active = None
    if trials is not None:
        # the worker's live switch: the runtime's ActiveCandidate (control file, meetings, lines), TP0
        # the source; one process here, so no broadcast (every rank would apply the same proposal)
        try:
            trial_active = ddtree_runtime.trialset().ActiveCandidate.from_env(
                trials, is_source=True, broadcast=None, log=lambda line: log(line, ranks[0]))
        except ValueError as exc:
            fatal_traceback(
                [_SCHEDULER_INIT,
                 ("sglang_ddtree/worker.py", 314, "__init__", "self.ddtree_active = ActiveCandidate.from_env(")],
                f"ValueError: {exc}", rank=ranks[0], prefix="Scheduler hit an exception: ", sigquit=True)
        # the end of the worker's init_cuda_graphs: TP0, once
        log(trial_active.active_line(), ranks[0])
    max_running = args.max_running_requests or 256
    log(f"max_total_num_tokens={MAX_TOTAL_TOKENS}, chunked_prefill_size={args.chunked_prefill_size or 8192}, "
        f"max_prefill_tokens={args.max_prefill_tokens or 16384}, max_running_requests={max_running}, "
        f"context_len={args.context_length or model_cfg.get('max_position_embeddings', 262144)}, "
        f"available_gpu_mem={avail - 0.6:.2f} GB", ranks[0])

    from sglang.lab.server import Emulator

    band_widths = None
    if schedule is not None:  # what each band's graphs were captured at (the fault changes one)
        band_widths = [b + 1 for _, b in schedule.bands]
        if wvt:
            band_widths[int(wvt.get("band", 0))] = int(wvt["num_tokens_per_req"])
    emu = Emulator(args=args, model=model, algo=algo, width=int(width), captured_width=captured_width,
                   capture_bs=capture_bs, schedule=schedule, band_captured_widths=band_widths,
                   trial_active=trial_active, trial_captured_widths=trial_widths,
                   trial_width_bs={w: list(bs or []) for w, bs, _ in verify_plan} if trials is not None else None,
                   max_running=max_running, image_warmup=arch in startup.IMAGE_WARMUP_ARCHS,
                   faults=active, tp_prefix=ranks[0],
                   max_total_tokens=MAX_TOTAL_TOKENS, startup=st, t_process=t0, context_len=args.context_length or
                   model_cfg.get("max_position_embeddings", 262144))
    try:
        asyncio.run(emu.serve())
    finally:
        gpu.unregister(os.getpid())
