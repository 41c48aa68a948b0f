"""HTTP server + scheduler of the emulator (asyncio, stdlib only).

Endpoints (SGLang 0.5.23 names): GET /health, /health_generate, /ready,
/server_info (+ /get_server_info), /model_info (+ /get_model_info),
/v1/models, /metrics (with --enable-metrics); POST /generate (text or
input_ids, stream or not), /v1/completions (stream or not),
/v1/chat/completions; /flush_cache.

The scheduler runs prefill and decode steps whose durations come from
perf.Model; every --decode-log-interval decode steps TP0 logs SGLang's
`Decode batch, ...` line.
"""
from __future__ import annotations

import asyncio
import collections
import datetime
import json
import os
import random
import sys
import signal
import socket
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sglang.lab import gpu, perf, runtime_msgs, sglang_rules, startup as startup_mod, textgen
from sglang.lab.faults import crash_loop_delay
from sglang.lab.log import fatal_traceback, log

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable",
           500: "Internal Server Error"}
WATCHDOG_S = 5.0   # sigterm_watchdog's period (managers/tokenizer_manager.py), divided by the lab's time scale
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    max_new: int
    gen: textgen.Generator
    internal: bool = False
    out: list[int] = field(default_factory=list)
    t_arrival: float = field(default_factory=time.monotonic)
    t_first: float | None = None
    t_last: float | None = None
    rounds: int = 0
    accepted: int = 0
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False
    acc: float | None = None
    domain: str = "chat"  # what the prompt is (code, math, chat, ids): acceptance depends on it
    stream: bool = False
    aborted: str | None = None   # the abort message (error_burst fault)
    ignore_eos: bool = False
    min_new: int = 0
    eos_at: int | None = None    # the output length at which the model emits EOS (its last token)
    stopped: bool = False        # finished on EOS (finish_reason stop), not on max_new_tokens


class Histogram:
    def __init__(self):
        self.counts = [0] * len(BUCKETS)
        self.sum = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.n += 1
        for i, b in enumerate(BUCKETS):
            if v <= b:
                self.counts[i] += 1


class Emulator:
    def __init__(self, *, args, model, algo, width, captured_width, capture_bs, max_running, faults, tp_prefix,
                 max_total_tokens, context_len, schedule=None, band_captured_widths=None, trial_active=None,
                 trial_captured_widths=None, startup=None, t_process=None, trial_width_bs=None,
                 image_warmup=False):
        self.args = args
        self.model = model
        self.algo = algo
        self.width = width
        self.captured_width = captured_width
        self.capture_bs = sorted(capture_bs) if capture_bs else capture_bs
        # decode steps a batch without its own graph replayed the next captured one (SGLang 0.5.23's
        # BaseCudaGraphRunner._pad_to_bucket: silent, the forward runs at the padded batch), by
        # (running batch, graph batch): the lab's own counter (SGLang exports none)
        self.padded_steps: dict[tuple[int, int], int] = {}
        # DDTree budget schedule: the step's verify width follows the running batch's band
        self.schedule = schedule
        self.band_captured_widths = band_captured_widths
        # DDTree trial set: the runtime's ActiveCandidate (sglang_ddtree.trialset), counted and switched at
        # the start of every decode step; the step's band is the active candidate's for the running batch
        self.trial_active = trial_active
        self.trial_captured_widths = trial_captured_widths or {}
        self.image_warmup = image_warmup  # the model has image understanding: 0.5.23 warms up with an image
        self._jit_done = False          # the first forward's JIT builds (startup.Plan.jit) are behind us
        # a trial set's graphs per verify width (a candidate other than the active one may have fewer:
        # trial_bs); each width's runner pads to its own list, as SGLang's graph runner does
        self.trial_width_bs = {w: sorted(bs) for w, bs in (trial_width_bs or {}).items()}
        self.step_budget = width - 1 if algo else 0
        self.max_running = max_running
        self.faults = faults
        self.rank = tp_prefix
        self.max_total_tokens = max_total_tokens
        self.context_len = context_len
        self.model_name = args.served_model_name or args.model_path
        self.interval = max(int(args.decode_log_interval or 40), 1)
        # the DDTree runtime's step line (runtime_msgs.DDTREE_STEP_PARTS): every step is "sampled" here,
        # its parts are the performance model's
        try:
            self.step_parts_every = int(os.environ.get(runtime_msgs.STEP_PARTS_EVERY_ENV,
                                                       runtime_msgs.STEP_PARTS_EVERY_DEFAULT))
        except ValueError:
            self.step_parts_every = runtime_msgs.STEP_PARTS_EVERY_DEFAULT
        self.step_parts_window: dict[tuple[int, int], list[dict[str, float]]] = {}
        self.step_parts_steps = 0
        self.ready = False
        self.startup = startup          # startup.Plan: the modelled phases (warm-up is this module's)
        self.t_process = t_process if t_process is not None else time.monotonic()
        self.scale = startup.scale if startup is not None else startup_mod.DEFAULT_TIME_SCALE
        self.gracefully_exit = False    # SIGTERM: drain (TokenizerManager.gracefully_exit)
        self.waiting: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.dispatching = 0   # HTTP requests between their first line and their response
        self.wakeup: asyncio.Event | None = None
        self.rng = random.Random(args.random_seed if args.random_seed is not None else 1234)
        self.accept_len = model.accept_len()
        wo = faults.get("wrong_output")
        self.wrong_after = int(wo["after_tokens"]) if wo else None
        ca = faults.get("crash_after")
        self.crash_after = int(ca["requests"]) if ca else None
        self.crash_exit = int(ca.get("exit_code", 1)) if ca else 1
        wvt = faults.get("wrong_verify_tokens")
        self.crash_on_verify = bool(wvt and wvt.get("crash") and algo)
        # faults that start healthy and degrade after a delay (seconds since the process started)
        self.t_start = time.monotonic()
        self.decay = faults.get("accept_decay") if algo else None
        self.burst = faults.get("error_burst")
        cl = faults.get("crash_loop")
        self.crash_at = self.t_start + crash_loop_delay(cl) if cl else None
        self.crash_loop_exit = int(cl.get("exit_code", 1)) if cl else 1
        self.metrics_off = "metrics_off" in faults
        # counters
        self.decode_ct = 0
        self.finished_external = 0
        self.iv_gen_tokens = 0
        self.iv_accept_tokens = 0
        self.iv_correct = 0
        self.iv_rounds = 0
        self.iv_tic = time.monotonic()
        self.total_accept_tokens = 0
        self.total_rounds = 0
        self.last_gen_throughput = 0.0
        self.last_accept_len = 0.0
        self.last_accept_rate = 0.0
        self.last_cuda_graph = True
        # SGLang 0.5.23 counts these when a request finishes, labelled is_streaming (TokenizerMetricsCollector)
        self.gen_tokens_total = {"false": 0, "true": 0}
        self.prompt_tokens_total = {"false": 0, "true": 0}
        self.requests_total = {"false": 0, "true": 0}
        self.aborted_total = 0
        # scheduler gauges hold the last decode report; zeroed when the scheduler goes idle
        self.g_running = 0
        self.g_queue = 0
        self.g_gen_throughput = 0.0
        self.h_ttft, self.h_itl, self.h_e2e = Histogram(), Histogram(), Histogram()

    # ------------------------------------------------------------------ lifecycle
    async def serve(self) -> None:
        host = self.args.host or "127.0.0.1"
        port = int(self.args.port)
        self.wakeup = asyncio.Event()
        try:
            if "port_in_use" in self.faults:
                raise OSError(98, "address already in use")
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn does
            sock.bind((host, port))
            sock.listen(512)
        except OSError as exc:
            log(f"INFO:     Started server process [{os.getpid()}]")
            log("INFO:     Waiting for application startup.")
            log("INFO:     Application startup complete.")
            log(f"ERROR:    [Errno {exc.errno or 98}] error while attempting to bind on address "
                f"('{host}', {port}): {(exc.strerror or 'address already in use').lower()}")
            log("INFO:     Waiting for application shutdown.")
            log("INFO:     Application shutdown complete.")
            gpu.unregister(os.getpid())
            os._exit(1)
        server = await asyncio.start_server(self.handle, sock=sock, limit=2 ** 22)
        log(f"INFO:     Started server process [{os.getpid()}]")
        log("INFO:     Waiting for application startup.")
        log("INFO:     Application startup complete.")
        log(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
        loop = asyncio.get_running_loop()
        loop.create_task(self.scheduler_loop())
        # the tokenizer manager's handle loop: SIGTERM drains from here on (SignalHandler.sigterm_handler)
        loop.add_signal_handler(signal.SIGTERM, self._sigterm)
        self.server = server
        loop.create_task(self.sigterm_watchdog())
        slow = self.faults.get("slow_start")
        st = self.startup
        client = f"127.0.0.1:{40000 + os.getpid() % 20000}"
        if not self.args.skip_server_warmup:
            # _execute_server_warmup: GET /model_info, then one 8-token request: for Kimi K2.5/K2.6 (a VLM)
            # a chat request with a 512x512 image (MoonViT's torch.compile), else /generate with text; its
            # first forward builds what the JIT caches lack (_first_forward_jit)
            await asyncio.sleep(1.0 / self.scale)
            log(f'INFO:     {client} - "GET /model_info HTTP/1.1" 200 OK')
            image = self.image_warmup and not self.args.skip_tokenizer_init
            if image:
                log("Using a 512x512 image for Kimi VLM startup warmup to compile MoonViT position interpolation.")
            await self._first_forward_jit()
            rest = (st.warmup_s - st.jit_s) if st is not None else 6.0
            if st is not None and st.vision_s and image:
                startup_mod.record_built_inductor()
            await asyncio.sleep(max(rest - 1.0, 0.0) / self.scale + (float(slow.get("warmup_s", 0)) if slow else 0.0))
            warm = self.submit(textgen.encode("The capital city of France is"), 8, 0.0, internal=True)
            await self.wait_done(warm)
            log(f'INFO:     {client} - "POST {"/v1/chat/completions" if image else "/generate"} HTTP/1.1" 200 OK')
        elif slow and float(slow.get("warmup_s", 0)) > 0:
            await asyncio.sleep(float(slow.get("warmup_s", 0)))
        log(f'INFO:     {client} - "POST /freeze_gc HTTP/1.1" 200 OK')
        self.ready = True
        if self.startup is not None:
            st = self.startup
            lab_s = time.monotonic() - self.t_process
            log(f"[opsctl-lab] start-up at the site's scale: total={st.total_s:.2f} s, "
                f"warm-up={0.0 if self.args.skip_server_warmup else st.warmup_s:.2f} s, "
                f"jit={0.0 if self.args.skip_server_warmup else st.jit_s:.2f} s "
                f"(lab {lab_s:.2f} s, time scale {self.scale:g})")
        log("The server is fired up and ready to roll!")
        async with server:
            try:
                await server.serve_forever()
            except asyncio.CancelledError:
                pass

    # ------------------------------------------------------------------ SIGTERM: drain (0.5.23)
    def _sigterm(self) -> None:
        # SignalHandler.sigterm_handler, registered with loop.add_signal_handler (no signum, no frame)
        log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        self.gracefully_exit = True

    def remaining(self) -> list[Req]:
        """The tokenizer manager's rid_to_state: every request not finished yet (health checks excluded)."""
        return [r for r in list(self.waiting) + self.running if not r.internal and not r.finished]

    async def sigterm_watchdog(self) -> None:
        """TokenizerManager.sigterm_watchdog: look for the flag every 5 s; then log the remaining
        requests every 5 s until none is left (no deadline: systemd's TimeoutStopSec kills it
        otherwise; new requests are still admitted meanwhile); SGL_FORCE_SHUTDOWN exits at once."""
        period = WATCHDOG_S / self.scale
        while not self.gracefully_exit:
            await asyncio.sleep(period)
        forced = False
        while True:
            if os.environ.get("SGL_FORCE_SHUTDOWN", "").lower() in ("1", "true", "yes", "y", "on"):
                log("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                forced = True
                break
            left = self.remaining()
            log(f"Gracefully exiting... Remaining number of requests {len(left)}. "
                f"Remaining requests remaining_rids={[r.rid for r in left]!r}.")
            if left:
                await asyncio.sleep(period)
            else:
                break
        # the schedulers are asked to exit, then uvicorn stops (server_stop_hook sets should_exit):
        # its shutdown waits for connections still sending a response. A request leaves
        # rid_to_state as it finishes, a moment before its handler writes the response.
        log("INFO:     Shutting down")
        await asyncio.sleep(0.1 / self.scale)
        if self.dispatching and not forced:   # forced: the killed schedulers answer nobody
            log("INFO:     Waiting for connections to close. (CTRL+C to force quit)")
            deadline = time.monotonic() + 30.0   # uvicorn has none; systemd's TimeoutStopSec ends it
            while self.dispatching and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        log("INFO:     Waiting for application shutdown.")
        log("INFO:     Application shutdown complete.")
        log(f"INFO:     Finished server process [{os.getpid()}]")
        gpu.unregister(os.getpid())
        sys.stdout.flush()
        os._exit(0)

    # ------------------------------------------------------------------ scheduler
    def submit(self, input_ids: list[int], max_new: int | None, temperature: float, *, internal: bool = False,
               rid: str | None = None, seed: int | None = None, text: str | None = None,
               stream: bool = False, ignore_eos: bool = False, min_new: int = 0) -> Req:
        # the scheduler's bound (Scheduler._clip_max_new_tokens): None = up to the context length
        bound = max(self.context_len - len(input_ids) - 1, 0)
        max_new = bound if max_new is None else min(max(int(max_new), 0), bound)
        gen = textgen.Generator(input_ids, temperature, None if internal else self.wrong_after, seed)
        req = Req(rid or uuid.uuid4().hex, list(input_ids), max_new, gen,
                  internal=internal, domain=perf.domain_of(text), stream=stream, ignore_eos=bool(ignore_eos),
                  min_new=max(int(min_new or 0), 0), eos_at=gen.eos_position())
        self.waiting.append(req)
        self.wakeup.set()
        return req

    async def wait_done(self, req: Req) -> None:
        while not req.finished:
            await req.updates.get()

    def _emit(self, req: Req, n: int, now: float, decode: bool = True) -> None:
        pos = len(req.out)
        for i in range(n):
            if self._eos_here(req, pos + i):   # _check_token_based_finish: EOS ends it, unless ignore_eos
                req.out.append(textgen.EOS_ID)
                req.stopped = True
                n = i + 1
                break
            req.out.append(req.gen.token(pos + i))
        if n:
            if req.t_first is None:
                req.t_first = now
                if not req.internal:
                    self.h_ttft.observe(now - req.t_arrival)
            elif not req.internal and req.t_last is not None:
                self.h_itl.observe((now - req.t_last) / n)
            req.t_last = now
            if decode:  # SGLang's gen throughput counts decode tokens (not prefill's first token)
                self.iv_gen_tokens += n
        if req.stopped or len(req.out) >= req.max_new:
            req.finished = True
            if not req.internal:
                self._finish(req, now)
        req.updates.put_nowait(n)

    @staticmethod
    def _eos_here(req: Req, position: int) -> bool:
        """Whether the model's token at `position` is its EOS: the request's natural length, never
        with ignore_eos, nor before min_new_tokens (SGLang masks EOS until then)."""
        return (not req.ignore_eos and req.eos_at is not None and position == max(req.eos_at, req.min_new) - 1
                and not req.internal)

    def _finish(self, req: Req, now: float) -> None:
        if self.burst and self._in_burst(now) and self.rng.random() < float(self.burst.get("rate", 0.5)):
            # aborted by the server: the client gets HTTP 500 with the message (non-stream) or an abort
            # finish_reason (stream); counted in num_aborted_requests_total, not as a finished request
            req.aborted = "Internal server error: request aborted (opsctl-lab error_burst)"
            self.aborted_total += 1
            return
        key = "true" if req.stream else "false"
        self.requests_total[key] += 1
        self.prompt_tokens_total[key] += len(req.input_ids)
        self.gen_tokens_total[key] += len(req.out)
        self.h_e2e.observe(now - req.t_arrival)

    def _in_burst(self, now: float) -> bool:
        start = self.t_start + float(self.burst.get("after_s", 60.0))
        return start <= now < start + float(self.burst.get("duration_s", 30.0))

    def _decay_frac(self, now: float) -> float:
        """How far the accept_decay fault has gone: 0 until after_s, 1 from after_s + over_s
        (or, with onset_file, from that file's modification time on)."""
        after, over = float(self.decay.get("after_s", 60.0)), max(float(self.decay.get("over_s", 30.0)), 1e-9)
        if self.decay.get("onset_file"):
            onset = self._decay_onset(now)
            return 0.0 if onset is None else min(max((now - onset) / over, 0.0), 1.0)
        return min(max((now - self.t_start - after) / over, 0.0), 1.0)

    def _decay_onset(self, now: float) -> float | None:
        """The onset file's mtime on the monotonic clock, once it exists (looked up at most twice a second)."""
        if getattr(self, "_onset", None) is not None:
            return self._onset
        if now < getattr(self, "_onset_checked", 0.0) + 0.5:
            return None
        self._onset_checked = now
        try:
            mtime = os.stat(str(self.decay["onset_file"])).st_mtime
        except OSError:
            return None
        self._onset = now - max(time.time() - mtime, 0.0)
        return self._onset

    def _reap(self) -> None:
        done = [r for r in self.running if r.finished]
        if not done:
            return
        self.running = [r for r in self.running if not r.finished]
        for r in done:
            if not r.internal:
                self.finished_external += 1
        if self.crash_after is not None and self.finished_external >= self.crash_after:
            fatal_traceback(
                [("sglang/srt/managers/scheduler.py", 3480, "run_scheduler_process", "scheduler.event_loop_overlap()"),
                 ("sglang/srt/managers/scheduler.py", 1204, "event_loop_overlap",
                  "self.process_batch_result(tmp_batch, tmp_result)"),
                 ("sglang/srt/managers/scheduler_output_processor_mixin.py", 311, "process_batch_result_decode",
                  "next_token_ids = next_token_ids.tolist()")],
                "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                "below might be incorrect.",
                rank=self.rank, prefix="Scheduler hit an exception: ", sigquit=True, exit_code=self.crash_exit)

    async def scheduler_loop(self) -> None:
        loop = asyncio.get_running_loop()
        t_next = loop.time()

        def after(dt: float) -> float:
            # catch-up scheduling: sleep overshoot (~1 ms per asyncio sleep) must not accumulate
            now = loop.time()
            return (t_next if now - t_next < 0.05 else now) + dt

        async def until(t: float) -> None:
            d = t - loop.time()
            if d > 0:
                await asyncio.sleep(d)

        while True:
            if not self.waiting and not self.running:
                # idle: SGLang publishes the idle gauges (no running requests, no decode throughput)
                self.g_running = self.g_queue = 0
                self.g_gen_throughput = 0.0
                self.wakeup.clear()
                if self.crash_at is None:
                    await self.wakeup.wait()
                else:   # the crash_loop fault fires with or without traffic
                    try:
                        await asyncio.wait_for(self.wakeup.wait(), max(self.crash_at - time.monotonic(), 0.01))
                    except asyncio.TimeoutError:
                        self._crash_loop()
                t_next = loop.time()
                # the next decode line measures the busy period only (SGLang's would include the idle gap)
                self.iv_tic = time.monotonic()
                self.iv_gen_tokens = 0
                continue
            if self.crash_at is not None and time.monotonic() >= self.crash_at:
                self._crash_loop()
            admitted = []
            while self.waiting and len(self.running) + len(admitted) < self.max_running:
                admitted.append(self.waiting.popleft())
            if admitted:
                ntok = sum(len(r.input_ids) for r in admitted)
                if not self._jit_done:   # the first forward builds what the JIT caches lack
                    await self._first_forward_jit()
                    t_next = loop.time()
                t_next = after(self.model.prefill_ms(ntok) / 1000.0)
                await until(t_next)
                now = time.monotonic()
                for r in admitted:
                    self._emit(r, min(1, r.max_new), now, decode=False)
                self.running.extend(admitted)
                used = sum(len(r.input_ids) + len(r.out) for r in self.running)
                log(f"Prefill batch, #new-seq: {len(admitted)}, #new-token: {ntok}, #cached-token: 0, "
                    f"#token: {used}, token usage: {used / self.max_total_tokens:.2f}, "
                    f"#running-req: {len(self.running) - len(admitted)}, #queue-req: {len(self.waiting)}, "
                    f"#pending-token: 0, cuda graph: False, input throughput (token/s): "
                    f"{ntok / max(self.model.prefill_ms(ntok) / 1000.0, 1e-6):.2f}", self.rank)
                self._reap()
                continue
            if not self.running:
                continue
            batch = len(self.running)
            if self.trial_active is not None:
                # the control's meeting step (every SGLANG_DDTREE_CONTROL_EVERY_STEPS decode steps): a new
                # candidate routes this step already; requests in flight carry on (nothing restarts)
                self.trial_active.begin_step()
                self.step_budget = self.trial_active.schedule.budget_for(batch)
                step_width = self.step_budget + 1
                graph_width = self.trial_captured_widths.get(step_width, step_width)
                band_mismatch = graph_width != step_width and batch <= max(self.capture_bs or [0])
            elif self.schedule is not None:
                bi = self.schedule.index(batch)
                self.step_budget = self.schedule.bands[bi][1]
                step_width = self.step_budget + 1
                graph_width = self.band_captured_widths[bi]
                band_mismatch = graph_width != step_width and batch <= max(self.capture_bs or [0])
            else:
                step_width, band_mismatch, graph_width = self.width, True, self.captured_width
            if self.crash_on_verify and band_mismatch:
                b = len(self.running)
                fatal_traceback(
                    [("sglang/srt/managers/scheduler.py", 3480, "run_scheduler_process", "scheduler.event_loop_overlap()"),
                     ("sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", 1311, "replay",
                      "self.replay_prepare(forward_batch, pp_proxy_tensors)"),
                     ("sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", 1187, "replay_prepare",
                      "self.buffers.input_ids[: self.raw_num_token].copy_(forward_batch.input_ids)")],
                    f"RuntimeError: The size of tensor a ({b * graph_width}) must match the size of "
                    f"tensor b ({b * step_width}) at non-singleton dimension 0",
                    rank=self.rank, prefix="Scheduler hit an exception: ", sigquit=True)
            banded = self.schedule is not None or self.trial_active is not None
            graph_bs = self._graph_bs(batch, step_width if self.trial_active is not None else None)
            if graph_bs != batch:
                self.padded_steps[(batch, graph_bs)] = self.padded_steps.get((batch, graph_bs), 0) + 1
            t_next = after(self.model.step_ms(graph_bs, width=step_width,
                                              drafting=self.step_budget > 0 if banded else None) / 1000.0)
            await until(t_next)
            now = time.monotonic()
            for r in self.running:
                k = 0
                m = self._drafts_per_round(r, now)
                if self.algo:
                    # accepted drafts per round: mean exactly m, low variance (error diffusion from a random phase)
                    if r.acc is None:
                        r.acc = self.rng.random()
                    k = int(r.acc + m) - int(r.acc)
                    r.acc += m
                tokens = k + 1
                self.iv_accept_tokens += tokens
                self.iv_correct += k
                self.iv_rounds += 1
                r.rounds += 1
                r.accepted += tokens
                self._emit(r, min(tokens, r.max_new - len(r.out)), now)
            self.decode_ct += 1
            step_line = self.algo == "DDTREE" and self.step_parts_every > 0
            if step_line:
                self._step_parts(batch, step_width, self.step_budget > 0 if banded else None)
            if self.decode_ct % self.interval == 0:
                self._log_decode(batch)
            if step_line and self.step_parts_steps >= self.step_parts_every:
                self._log_step_parts()
            self._reap()

    async def _first_forward_jit(self) -> None:
        """The first forward's JIT builds (once per process): FlashInfer logs each cold build through
        its own logger (flashinfer/jit/core.py JitSpec.build, format `%(asctime)s - %(levelname)s -
        %(filename)s:%(lineno)d - flashinfer.jit: %(message)s`, once: the build holds a file lock and
        the other ranks then find the module built); SGLang's JIT builds say nothing at INFO. Each
        module's file is in the cache afterwards, so the next start finds it warm."""
        self._jit_done = True
        st = self.startup
        if st is None or not st.jit:
            return
        for lib, name, secs, path in st.jit:
            if lib == "flashinfer":
                now = datetime.datetime.now()
                sys.stdout.write(f"{now:%Y-%m-%d %H:%M:%S},{now.microsecond // 1000:03d} - INFO - core.py:594 - "
                                 f"flashinfer.jit: Building JIT module {name}; this can take several minutes "
                                 f"on first use.\n")
                sys.stdout.flush()
            await asyncio.sleep(secs / self.scale)
            startup_mod.record_built([path])

    def _graph_bs(self, batch: int, width: int | None = None) -> int:
        """The batch a decode step's forward runs at: the smallest captured size >= the running batch
        (padded, as DecodeCudaGraphRunner replays it); itself past the largest graph or without graphs.
        A trial set's width pads within that width's own graphs."""
        graphs = self.trial_width_bs.get(width, self.capture_bs) if width is not None else self.capture_bs
        return sglang_rules.pad_to_cuda_graph_bs(batch, graphs)

    def _drafts_per_round(self, r: Req, now: float | None = None) -> float:
        """Mean accepted drafts per round for this request: the model's acceptance scaled by
        what the prompt is (code > math > chat > random ids), or a fault's skew; never more
        drafts than the verify width offers. The accept_decay fault moves it to its target."""
        if not self.algo:
            return 0.0
        healthy = self._healthy_drafts_per_round(r)
        if not self.decay or now is None:
            return healthy
        target = float(self.decay.get("accept_len", 1.5)) - 1.0
        return healthy + (target - healthy) * self._decay_frac(now)

    def _healthy_drafts_per_round(self, r: Req) -> float:
        base = self.accept_len - 1.0
        cap = float(self.width - 1)
        if self.schedule is not None or self.trial_active is not None:
            # this step's band (of the schedule, or of the trial set's active candidate): its budget's
            # acceptance, at most its tree
            cap = float(self.step_budget)
            base = perf.ddtree_accept_len(self.step_budget, self.model.block_size) - 1.0 if self.step_budget else 0.0
        if self.model.accept_override is not None:  # the site's collapse: measured, not domain-scaled
            return min(self.model.accept_override - 1.0, cap)
        factor = perf.DOMAIN_FACTOR.get(r.domain, 1.0)
        loop = self.faults.get("random_loop")
        if loop:
            factor = float(loop["ids_factor"]) if r.domain == "ids" else float(loop["text_factor"])
        skew = self.faults.get("code_wins_chat_loses")
        if skew and r.domain in skew:
            factor = float(skew[r.domain])
        return max(0.0, min(base * factor, cap))

    def _step_parts(self, batch: int, width: int, drafting: bool | None) -> None:
        parts = self.model.step_parts(batch, width=width, drafting=drafting)
        self.step_parts_window.setdefault((batch, width - 1), []).append(parts)
        self.step_parts_steps += 1

    def _log_step_parts(self) -> None:
        """One line per (bs, budget) of the window, as the runtime's TP0 prints it."""
        of = self.step_parts_steps
        for (bs, budget), steps in sorted(self.step_parts_window.items()):
            med = {k: sorted(p[k] for p in steps)[len(steps) // 2] for k in steps[0]}
            log(runtime_msgs.DDTREE_STEP_PARTS.format(bs=bs, budget=budget, sampled=len(steps), of=of,
                                                      step_ms=sum(med.values()), **med), self.rank)
        self.step_parts_window = {}
        self.step_parts_steps = 0

    def _log_decode(self, batch: int) -> None:
        now = time.monotonic()
        gap = max(now - self.iv_tic, 1e-9)
        self.iv_tic = now
        self.last_gen_throughput = self.iv_gen_tokens / gap
        self.iv_gen_tokens = 0
        used = sum(len(r.input_ids) + len(r.out) for r in self.running)
        msg = f"Decode batch, #running-req: {batch}, #token: {used}, token usage: {used / self.max_total_tokens:.2f}, "
        if self.algo:
            self.last_accept_len = self.iv_accept_tokens / max(self.iv_rounds, 1)
            per_round = self.captured_width - 1
            self.last_accept_rate = self.iv_correct / (self.iv_rounds * per_round) if per_round > 0 and self.iv_rounds else 0.0
            self.total_accept_tokens += self.iv_accept_tokens
            self.total_rounds += self.iv_rounds
            msg += f"accept len: {self.last_accept_len:.2f}, accept rate: {self.last_accept_rate:.2f}, "
        self.iv_accept_tokens = self.iv_correct = self.iv_rounds = 0
        self.last_cuda_graph = bool(self.capture_bs) and batch <= max(self.capture_bs)
        msg += (f"cuda graph: {self.last_cuda_graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                f"#queue-req: {len(self.waiting)}")
        log(msg, self.rank)
        self.g_running, self.g_queue, self.g_gen_throughput = batch, len(self.waiting), self.last_gen_throughput

    def _crash_loop(self) -> None:
        fatal_traceback(
            [("sglang/srt/managers/scheduler.py", 3480, "run_scheduler_process", "scheduler.event_loop_overlap()"),
             ("sglang/srt/managers/scheduler.py", 1198, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
             ("sglang/srt/model_executor/model_runner.py", 2871, "forward", "output = self._forward_raw(")],
            "RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
            "below might be incorrect.",
            rank=self.rank, prefix="Scheduler hit an exception: ", sigquit=True, exit_code=self.crash_loop_exit)

    # ------------------------------------------------------------------ HTTP
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                parts = line.decode("latin-1").split()
                if len(parts) != 3:
                    break
                method, target, version = parts
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif headers.get("transfer-encoding", "").lower() == "chunked":
                    while True:
                        size = int((await reader.readline()).strip() or b"0", 16)
                        if size == 0:
                            await reader.readline()
                            break
                        body += await reader.readexactly(size)
                        await reader.readline()
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                url = urlsplit(target)
                self.dispatching += 1
                try:
                    status = await self.dispatch(method, url.path, body, writer, keep, query=url.query)
                finally:
                    self.dispatching -= 1
                log(f'INFO:     {peer[0]}:{peer[1]} - "{method} {target} {version}" {status} {REASONS.get(status, "")}')
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def _send(self, writer, status: int, body: bytes | str | dict | list = b"", ctype: str = "application/json",
                    keep: bool = True) -> int:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        head = (f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\ncontent-type: {ctype}\r\n"
                f"content-length: {len(body)}\r\nserver: uvicorn\r\n"
                f"connection: {'keep-alive' if keep else 'close'}\r\n\r\n")
        writer.write(head.encode() + body)
        await writer.drain()
        return status

    async def _stream_start(self, writer, keep: bool) -> None:
        writer.write(("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                      "transfer-encoding: chunked\r\nserver: uvicorn\r\ncache-control: no-cache\r\n"
                      f"connection: {'keep-alive' if keep else 'close'}\r\n\r\n").encode())
        await writer.drain()

    async def _stream_event(self, writer, data: str) -> None:
        payload = f"data: {data}\n\n".encode()
        writer.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        await writer.drain()

    async def _stream_end(self, writer) -> None:
        await self._stream_event(writer, "[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def dispatch(self, method: str, path: str, body: bytes, writer, keep: bool, query: str = "") -> int:
        get = method in ("GET", "HEAD")
        try:
            payload = json.loads(body) if body else {}
        except ValueError:
            return await self._send(writer, 400, {"error": {"message": "invalid JSON body"}}, keep=keep)
        if path in ("/health", "/health_generate"):
            if self.gracefully_exit:
                log("Health check request received during shutdown. Returning 503.")
                return await self._send(writer, 503, b"", keep=keep)
            if not self.ready:
                return await self._send(writer, 503, b"", keep=keep)
            if path == "/health_generate":
                req = self.submit([1], 1, 0.0, internal=True)
                try:
                    await asyncio.wait_for(self.wait_done(req), 20)
                except asyncio.TimeoutError:
                    return await self._send(writer, 503, b"", keep=keep)
            return await self._send(writer, 200, b"", keep=keep)
        if path == "/ready":   # is_ready(): up, not paused, not shutting down
            ok = self.ready and not self.gracefully_exit
            return await self._send(writer, 200 if ok else 503,
                                    {"status": "ready" if ok else ("shutting down" if self.ready else "starting")},
                                    keep=keep)
        if path == "/v1/loads" and get:
            return await self.loads(writer, keep, query)
        if path in ("/server_info", "/get_server_info") and get:
            return await self._send(writer, 200, self.server_info(), keep=keep)
        if path in ("/model_info", "/get_model_info") and get:
            return await self._send(writer, 200, {"model_path": self.args.model_path,
                                                  "tokenizer_path": self.args.tokenizer_path or self.args.model_path,
                                                  "is_generation": True, "preferred_sampling_params": None,
                                                  "weight_version": "default", "has_image_understanding": False,
                                                  "has_audio_understanding": False, "model_type": "kimi_k25",
                                                  "architectures": ["KimiK25ForConditionalGeneration"]}, keep=keep)
        if path == "/v1/models" and get:
            return await self._send(writer, 200, {"object": "list", "data": [{
                "id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": self.model_name, "parent": None, "max_model_len": self.context_len}]}, keep=keep)
        if path == "/metrics" and get:
            if not self.args.enable_metrics or self.metrics_off:
                return await self._send(writer, 404, {"detail": "Not Found"}, keep=keep)
            return await self._send(writer, 200, self.metrics(), ctype="text/plain; version=0.0.4; charset=utf-8",
                                    keep=keep)
        if path == "/flush_cache":
            return await self._send(writer, 200, "Cache flushed.\nPlease check backend logs for more details. "
                                    "(When there are running or waiting requests, the operation will not be performed.)\n",
                                    ctype="text/plain", keep=keep)
        if path == "/generate" and method == "POST":
            return await self.generate(payload, writer, keep)
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            return await self.openai(path, payload, writer, keep)
        if path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            return await self._send(writer, 405, {"detail": "Method Not Allowed"}, keep=keep)
        return await self._send(writer, 404, {"detail": "Not Found"}, keep=keep)

    def _not_ready(self):
        return {"error": {"message": "The server is not ready yet", "code": 503}}

    def _spec_details(self, req: Req) -> dict:
        per_round = max(self.captured_width - 1, 1)
        correct = req.accepted - req.rounds
        return {"spec_accept_rate": correct / (req.rounds * per_round) if req.rounds else 0.0,
                "spec_accept_length": req.accepted / req.rounds if req.rounds else 0.0,
                "spec_cap_length": 0.0, "spec_block_accept_length": 0.0,
                "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": req.rounds * per_round,
                "spec_verify_ct": req.rounds, "spec_correct_drafts_histogram": [], "spec_cap_lens_histogram": []}

    @staticmethod
    def _finish_reason(req: Req) -> dict | None:
        if not req.finished:
            return None
        if req.stopped:   # FINISH_MATCHED_TOKEN
            return {"type": "stop", "matched": textgen.EOS_ID}
        return {"type": "length", "length": req.max_new}   # FINISH_LENGTH

    def _meta(self, req: Req) -> dict:
        now = time.monotonic()
        meta = {"id": req.rid, "finish_reason": self._finish_reason(req),
                "prompt_tokens": len(req.input_ids), "weight_version": "default",
                "completion_tokens": len(req.out), "cached_tokens": 0, "e2e_latency": now - req.t_arrival}
        if self.algo:
            meta["spec_verify_ct"] = req.rounds
            meta["spec_accept_length"] = req.accepted / req.rounds if req.rounds else 0.0
        return meta

    async def generate(self, p: dict, writer, keep: bool) -> int:
        if not self.ready:
            return await self._send(writer, 503, self._not_ready(), keep=keep)
        text, ids = p.get("text"), p.get("input_ids")
        if text is None and ids is None:
            return await self._send(writer, 400, {"error": {"message": "Either text or input_ids should be provided."}},
                                    keep=keep)
        sp = p.get("sampling_params") or {}
        if isinstance(sp, list):
            sp = sp[0] if sp else {}
        # SamplingParams: max_new_tokens 128 by default (explicit null: up to the context length),
        # ignore_eos False, min_new_tokens 0
        max_new = int(sp["max_new_tokens"]) if sp.get("max_new_tokens") is not None else (
            None if "max_new_tokens" in sp else 128)
        temp = float(sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0)
        seed = sp.get("sampling_seed")
        ignore_eos = bool(sp.get("ignore_eos") or False)
        min_new = int(sp.get("min_new_tokens") or 0)
        batch = (isinstance(text, list)) or (isinstance(ids, list) and ids and isinstance(ids[0], list))
        prompts = (text if isinstance(text, list) else [text]) if text is not None else (ids if batch else [ids])
        prompt_ids = [textgen.encode(x) if isinstance(x, str) else [int(t) for t in x] for x in prompts]
        stream = bool(p.get("stream")) and not batch
        reqs = [self.submit(pi, max_new, temp, rid=(p.get("rid") if not batch else None), seed=seed,
                            text=x if isinstance(x, str) else None, stream=stream, ignore_eos=ignore_eos,
                            min_new=min_new)
                for pi, x in zip(prompt_ids, prompts)]
        if p.get("stream") and not batch:
            req = reqs[0]
            await self._stream_start(writer, keep)
            while True:
                await req.updates.get()
                meta = self._meta(req)
                if req.aborted:
                    meta["finish_reason"] = {"type": "abort", "message": req.aborted, "status_code": 500}
                await self._stream_event(writer, json.dumps({"text": textgen.decode(req.out), "output_ids": list(req.out),
                                                             "meta_info": meta}))
                if req.finished:
                    break
            await self._stream_end(writer)
            return 200
        for r in reqs:
            await self.wait_done(r)
        aborted = next((r.aborted for r in reqs if r.aborted), None)
        if aborted:   # SGLang raises HTTPException(500, detail=message) for a non-stream abort
            return await self._send(writer, 500, {"detail": aborted}, keep=keep)
        outs = [{"text": textgen.decode(r.out), "output_ids": list(r.out), "meta_info": self._meta(r)} for r in reqs]
        return await self._send(writer, 200, outs if batch else outs[0], keep=keep)

    async def openai(self, path: str, p: dict, writer, keep: bool) -> int:
        if not self.ready:
            return await self._send(writer, 503, self._not_ready(), keep=keep)
        chat = path.endswith("chat/completions")
        if chat:
            msgs = p.get("messages") or []
            prompt = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
            ids = textgen.encode(prompt)
            # ChatCompletionRequest: max_completion_tokens or max_tokens; neither: up to the context length
            max_new = p.get("max_completion_tokens") or p.get("max_tokens")
        else:
            prompt = p.get("prompt", "")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                prompt = prompt[0]
            ids = [int(t) for t in prompt] if isinstance(prompt, list) else textgen.encode(str(prompt))
            max_new = p.get("max_tokens") or 16   # CompletionRequest.max_tokens = 16
        temp = float(p.get("temperature", 1.0) if p.get("temperature") is not None else 1.0)
        req = self.submit(ids, None if max_new is None else int(max_new), temp, seed=p.get("seed"),
                          text=None if (not chat and isinstance(prompt, list)) else str(prompt),
                          stream=bool(p.get("stream")), ignore_eos=bool(p.get("ignore_eos") or False),
                          min_new=int(p.get("min_tokens") or 0))
        cid = ("chatcmpl-" if chat else "cmpl-") + req.rid
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def usage():
            return {"prompt_tokens": len(req.input_ids), "completion_tokens": len(req.out),
                    "total_tokens": len(req.input_ids) + len(req.out)}

        if p.get("stream"):
            await self._stream_start(writer, keep)
            sent = 0
            first = True
            while True:
                await req.updates.get()
                delta = textgen.decode(req.out[sent:])
                sent = len(req.out)
                fin = ("stop" if req.stopped else "length") if req.finished else None
                if chat:
                    d = {"content": delta}
                    if first:
                        d["role"] = "assistant"
                    choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": fin}
                else:
                    choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": fin}
                first = False
                await self._stream_event(writer, json.dumps({"id": cid, "object": obj + (".chunk" if chat else ""),
                                                             "created": created, "model": self.model_name,
                                                             "choices": [choice], "usage": None}))
                if req.finished:
                    break
            if p.get("return_spec_tokens_details") and self.algo:
                # SGLang 0.5.23: a chunk with no choices and the request's speculative details
                await self._stream_event(writer, json.dumps({
                    "id": cid, "object": obj + (".chunk" if chat else ""), "created": created,
                    "model": self.model_name, "choices": [], "sglext": {"spec_tokens_details": self._spec_details(req)}}))
            if (p.get("stream_options") or {}).get("include_usage"):
                await self._stream_event(writer, json.dumps({"id": cid, "object": obj + (".chunk" if chat else ""),
                                                             "created": created, "model": self.model_name,
                                                             "choices": [], "usage": usage()}))
            await self._stream_end(writer)
            return 200
        await self.wait_done(req)
        if req.aborted:
            return await self._send(writer, 500, {"detail": req.aborted}, keep=keep)
        text = textgen.decode(req.out)
        fin = "stop" if req.stopped else "length"
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": fin} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": fin})
        return await self._send(writer, 200, {"id": cid, "object": obj, "created": created, "model": self.model_name,
                                              "choices": [choice], "usage": usage()}, keep=keep)

    # ------------------------------------------------------------------ introspection
    async def loads(self, writer, keep: bool, query: str) -> int:
        """GET /v1/loads (entrypoints/v1_loads.py; LoadSnapshot.to_dict). 0.5.23 has no /get_load."""
        from urllib.parse import parse_qs

        q = {k: v[-1] for k, v in parse_qs(query).items()}
        include = {x.strip() for x in q["include"].split(",")} if q.get("include") else None
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        if include is not None and not include <= valid:
            return await self._send(writer, 400, {"detail": f"Invalid include sections: {include - valid}. "
                                                            f"Valid options: {sorted(valid)}"}, keep=keep)
        try:
            dp = int(q["dp_rank"]) if q.get("dp_rank") not in (None, "") else None
        except ValueError:
            dp = -1
        used = sum(len(r.input_ids) + len(r.out) for r in self.running)
        waiting_tokens = sum(len(r.input_ids) for r in self.waiting)
        load = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": len(self.running),
                "num_waiting_reqs": len(self.waiting), "num_waiting_uncached_tokens": waiting_tokens,
                "num_used_tokens": used, "num_total_tokens": used + waiting_tokens,
                "num_active_tokens": used + waiting_tokens, "num_prealloc_ready_tokens": 0,
                "max_total_num_tokens": self.max_total_tokens, "max_running_requests": self.max_running,
                "token_usage": round(used / self.max_total_tokens, 4), "gen_throughput": round(self.g_gen_throughput, 2),
                "cache_hit_rate": 0.0, "utilization": round(len(self.running) / max(self.max_running, 1), 4),
                "total_prefill_uncached_tokens": 0, "total_prefill_busy_us": 0, "decode_moments": None}
        if include != {"core"}:
            sections = {"memory": ("memory", {"weight_gb": 73.61, "kv_cache_gb": 8.79, "graph_gb": 0.5,
                                              "token_capacity": self.max_total_tokens})}
            if self.algo and self.total_rounds + self.iv_rounds > 0:
                sections["spec"] = ("speculative", {"accept_length": self.avg_accept_length(),
                                                    "accept_rate": self.last_accept_rate})
            sections["disagg"] = ("disaggregation", {
                "mode": "null", "prefill_bootstrap_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
                "decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0})
            sections["queues"] = ("queues", {"waiting": len(self.waiting), "grammar": 0, "paused": 0,
                                             "retracted": 0, "prealloc_ready": 0})
            for name, (key, value) in sections.items():
                if include is None or "all" in include or name in include:
                    load[key] = value
        tp = int(self.args.tp_size or 1) * int(self.args.pp_size or 1)
        return await self._send(writer, 200, {
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(), "version": "0.5.23",
            "accelerator": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "num_accelerators": tp,
            "loads": [load] if dp in (None, 0) else []}, keep=keep)

    def avg_accept_length(self) -> float:
        tokens = self.total_accept_tokens + self.iv_accept_tokens
        rounds = self.total_rounds + self.iv_rounds
        return tokens / rounds if (self.algo and rounds) else (0.0 if self.algo else 1.0)

    def ddtree_status(self) -> dict:
        """The DDTree plugin's `internal_states[i]["ddtree"]` (its AROUND hook on the scheduler's
        `_add_speculative`: the worker's `ddtree_status`)."""
        if self.trial_active is not None:
            return dict(self.trial_active.status(), trial_set=True)
        if self.schedule is not None:   # a one-band schedule is named by its budget, as the worker does
            bands = self.schedule.bands
            return {"active": str(bands[0][1]) if len(bands) == 1 else self.schedule.text, "trial_set": False}
        return {"active": str(self.width - 1), "trial_set": False}

    def server_info(self) -> dict:
        info = {k: v for k, v in vars(self.args).items()}
        state = {
            "avg_spec_accept_length": self.avg_accept_length(),
            "last_gen_throughput": self.last_gen_throughput,
            "memory_usage": {"weight": 73.61, "kvcache": 8.79, "cuda_graph": 0.5, "token_capacity": self.max_total_tokens},
            "load": len(self.running) + len(self.waiting),
        }
        if self.algo == "DDTREE":
            state["ddtree"] = self.ddtree_status()
        info.update({
            "version": "0.5.23",
            "internal_states": [state],
            "max_total_num_tokens": self.max_total_tokens,
            "speculative_num_draft_tokens": self.width if self.algo else None,
            "opsctl_lab_emulator": True,
        })
        return info

    def metrics(self) -> str:
        # SchedulerMetricsCollector's labels, and TokenizerMetricsCollector's (model_name; is_streaming on
        # the per-request counters), as SGLang 0.5.23 exports them (srt/observability/metrics_collector.py)
        lbl = f'model_name="{self.model_name}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        tok = f'model_name="{self.model_name}"'
        out = []

        def gauge(name, value, help_):
            out.extend([f"# HELP sglang:{name} {help_}", f"# TYPE sglang:{name} gauge", f"sglang:{name}{{{lbl}}} {value}"])

        def counter(name, value, help_):
            out.extend([f"# HELP sglang:{name} {help_}", f"# TYPE sglang:{name} counter"])
            if isinstance(value, dict):   # by is_streaming
                out.extend(f'sglang:{name}{{{tok},is_streaming="{k}"}} {float(v)}' for k, v in sorted(value.items()))
            else:
                out.append(f"sglang:{name}{{{tok}}} {float(value)}")

        def hist(name, h: Histogram, help_):
            out.extend([f"# HELP sglang:{name} {help_}", f"# TYPE sglang:{name} histogram"])
            for b, c in zip(BUCKETS, h.counts):
                le = "+Inf" if b == float("inf") else str(b)
                out.append(f'sglang:{name}_bucket{{{lbl},le="{le}"}} {float(c)}')
            out.append(f"sglang:{name}_sum{{{lbl}}} {h.sum}")
            out.append(f"sglang:{name}_count{{{lbl}}} {float(h.n)}")

        gauge("num_running_reqs", self.g_running, "The number of running requests.")
        gauge("num_queue_reqs", self.g_queue, "The number of requests in the waiting queue.")
        gauge("gen_throughput", self.g_gen_throughput, "The generation throughput (token/s).")
        gauge("spec_accept_length", self.last_accept_len if self.algo else 0.0, "The average acceptance length of speculative decoding.")
        gauge("spec_accept_rate", self.last_accept_rate if self.algo else 0.0, "The average acceptance rate of speculative decoding.")
        gauge("is_cuda_graph", 1.0 if (self.capture_bs and self.last_cuda_graph) else 0.0, "Whether the batch is using CUDA graph.")
        gauge("token_usage", sum(len(r.input_ids) + len(r.out) for r in self.running) / self.max_total_tokens, "The token usage.")
        counter("prompt_tokens_total", self.prompt_tokens_total, "Number of prefill tokens processed.")
        counter("generation_tokens_total", self.gen_tokens_total, "Number of generation tokens processed.")
        counter("num_requests_total", self.requests_total, "Number of requests processed.")
        counter("num_aborted_requests_total", self.aborted_total, "Number of requests aborted.")
        hist("time_to_first_token_seconds", self.h_ttft, "Histogram of time to first token in seconds.")
        hist("inter_token_latency_seconds", self.h_itl, "Histogram of inter-token latency in seconds.")
        hist("e2e_request_latency_seconds", self.h_e2e, "Histogram of End-to-end request latency in seconds")
        # the lab's own (not SGLang's: it pads silently): decode steps padded to a larger graph
        name = "opsctl_lab:cuda_graph_padded_steps_total"
        out.extend([f"# HELP {name} Decode steps whose running batch had no graph of its own and replayed the next "
                    "captured batch size (lab emulator only).", f"# TYPE {name} counter"])
        out.extend(f'{name}{{{tok},running_bs="{b}",graph_bs="{g}"}} {float(n)}'
                   for (b, g), n in sorted(self.padded_steps.items()))
        return "\n".join(out) + "\n"
