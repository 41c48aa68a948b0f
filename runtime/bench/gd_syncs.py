"""The harness's ``syncs`` phase (issue 52): per decode step, the host readbacks
(synchronizing calls) the step makes and the GPU's idle time between steps.

* :class:`SyncCounter` -- while active, every call that reads a tensor's
  values on the host (``item``, ``tolist``, ``cpu``, ``numpy``, ``bool`` /
  ``int`` / ``float`` / ``index`` of a tensor, ``.to("cpu")``) and every op
  whose output size depends on values (``nonzero``, ``masked_select``,
  ``unique``, ``repeat_interleave`` with tensor repeats and no
  ``output_size``, indexing by a bool tensor) is counted and attributed to the
  first frame outside torch (file:line function) and the nearest
  ``sglang_ddtree`` frame above it.  On a GPU each of these is a device->host
  round trip (the host waits for the stream); on the CPU dry run the same calls
  are counted, so the count is the step's shape, device or not.  On CUDA,
  ``torch.cuda.set_sync_debug_mode("warn")`` counts what torch itself reports
  as synchronizing beside it.
* :class:`IdleClock` -- a CUDA event at each step's start and end; idle
  between steps = ``elapsed(end_i, start_i+1)``: the time the GPU stream has
  no step work queued (this harness has no overlap scheduler: the driver's
  result copy and next batch are in the gap).  On the CPU: the host clock.

Used by ``gpu_decode.py --phases syncs`` (tests/test_gpu_decode.py runs it on the CPU).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections import Counter

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)

# method name -> how it reads values on the host
_READBACK_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
_SIZE_OPS = ("nonzero", "masked_select", "unique")


def _is_cpu_target(a, k) -> bool:
    dev = k.get("device", a[0] if a else None)
    if isinstance(dev, torch.dtype) or dev is None:
        return False
    try:
        return torch.device(dev).type == "cpu"
    except (TypeError, RuntimeError):
        return False


def _bool_index(idx) -> bool:
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def classify(path: str) -> str:
    p = path.replace("\\", "/")
    if "/sglang_ddtree/" in p:
        return "runtime"
    if "/sglang/" in p:
        return "sglang"
    if "/bench/" in p:
        return "harness"
    return "other"


class SyncCounter:
    """Count host readbacks between :meth:`begin` and :meth:`end` (one step)."""

    def __init__(self):
        self.active = False
        self.rows = []  # per step: Counter of category -> n
        self.sites = Counter()  # (category, site, via) -> n over all steps
        self._cur = None
        self._saved = []
        self._busy = False

    # -- recording -----------------------------------------------------------
    def _hit(self, what: str):
        if not self.active or self._busy:
            return
        self._busy = True
        try:
            f = sys._getframe(2)
            site = via = None
            while f is not None:
                fn = os.path.abspath(f.f_code.co_filename)
                if site is None and not fn.startswith(_TORCH_DIR) and fn != _HERE:
                    site = (fn, f.f_lineno, f.f_code.co_name)
                if site is not None and "/sglang_ddtree/" in fn.replace("\\", "/"):
                    via = f"{os.path.basename(fn)}:{f.f_lineno} {f.f_code.co_name}"
                    break
                f = f.f_back
            if site is None:
                return
            cat = classify(site[0])
            s = f"{_short(site[0])}:{site[1]} {site[2]}"
            self._cur[cat] += 1
            self.sites[(cat, what, s, via or "")] += 1
        finally:
            self._busy = False

    def begin(self):
        self._cur = Counter()
        self.active = True

    def end(self):
        self.active = False
        self.rows.append(dict(self._cur))
        self._cur = None

    # -- patching ------------------------------------------------------------
    def __enter__(self):
        T = torch.Tensor
        me = self

        def wrap_method(name):
            orig = getattr(T, name)

            def f(self_, *a, **k):
                me._hit(name)
                return orig(self_, *a, **k)
            self._saved.append((T, name, orig))
            setattr(T, name, f)

        for n in _READBACK_METHODS:
            wrap_method(n)
        orig_to = T.to

        def to(self_, *a, **k):
            if self_.device.type != "cpu" and (_is_cpu_target(a, k) or (
                    a and isinstance(a[0], torch.Tensor) and a[0].device.type == "cpu")):
                me._hit("to(cpu)")  # device -> host (on the CPU dry run every tensor is a host one: not counted)
            return orig_to(self_, *a, **k)
        self._saved.append((T, "to", orig_to))
        T.to = to
        orig_get = T.__getitem__

        def getitem(self_, idx):
            if _bool_index(idx):
                me._hit("bool-index")
            return orig_get(self_, idx)
        self._saved.append((T, "__getitem__", orig_get))
        T.__getitem__ = getitem
        for n in _SIZE_OPS:
            for owner in (torch, T):
                orig = getattr(owner, n, None)
                if orig is None:
                    continue

                def g(*a, _o=orig, _n=n, **k):
                    me._hit(_n)
                    return _o(*a, **k)
                self._saved.append((owner, n, orig))
                setattr(owner, n, g)
        for owner in (torch, T):
            orig_ri = owner.repeat_interleave

            def ri(*a, _o=orig_ri, **k):
                reps = a[1] if len(a) > 1 else k.get("repeats")
                if isinstance(reps, torch.Tensor) and k.get("output_size") is None:
                    me._hit("repeat_interleave")
                return _o(*a, **k)
            self._saved.append((owner, "repeat_interleave", orig_ri))
            setattr(owner, "repeat_interleave", ri)
        return self

    def __exit__(self, *exc):
        for owner, name, orig in reversed(self._saved):
            setattr(owner, name, orig)
        self._saved = []
        self.active = False

    # -- report --------------------------------------------------------------
    def per_step(self, cats=("runtime", "sglang")) -> list:
        return [sum(r.get(c, 0) for c in cats) for r in self.rows]

    def site_table(self, steps: int) -> str:
        lines = ["| where | call | per step | reached from (runtime frame) | category |", "|---|---|---:|---|---|"]
        for (cat, what, site, via), n in sorted(self.sites.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][2])):
            lines.append(f"| `{site}` | {what} | {n / max(1, steps):.2f} | {('`' + via + '`') if via else ''} | {cat} |")
        return "\n".join(lines)


def _short(path: str) -> str:
    p = path.replace("\\", "/")
    for key in ("/sglang_ddtree/", "/sglang/", "/bench/"):
        if key in p:
            return key.strip("/") + "/" + p.split(key, 1)[1]
    return os.path.basename(p)


class IdleClock:
    """Step start / end marks: CUDA events on a GPU, the host clock otherwise."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks = []  # (start, end) per step

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self):
        self.marks.append([self._mark(), None])

    def end(self):
        self.marks[-1][1] = self._mark()

    def gaps_ms(self) -> list:
        """Idle between consecutive steps and each step's span, ms."""
        if self.cuda:
            torch.cuda.synchronize()
            gap = [a[1].elapsed_time(b[0]) for a, b in zip(self.marks, self.marks[1:])]
            span = [s.elapsed_time(e) for s, e in self.marks]
        else:
            gap = [1e3 * (b[0] - a[1]) for a, b in zip(self.marks, self.marks[1:])]
            span = [1e3 * (e - s) for s, e in self.marks]
        return gap, span


@contextlib.contextmanager
def cuda_sync_warnings(enabled: bool):
    """torch's own count of synchronizing CUDA calls (``set_sync_debug_mode("warn")``)."""
    rec = []
    if not enabled:
        yield rec
        return
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield w
        finally:
            torch.cuda.set_sync_debug_mode(prev)


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def phase_syncs(gd, args, res):
    """``args.sy_steps`` decode steps (budget 16, one band) at each of
    ``args.sy_bs``, twice: host readbacks per step (runtime + SGLang code; the
    harness's stand-ins apart) and torch's sync warnings (CUDA), then -- nothing
    patched -- the GPU's idle between steps."""
    out = []
    for bs in args.sy_bs:
        n = int(args.sy_steps)
        n_ref = (2 * n + 2) * 8 + 16  # two passes of n steps (+ warm-up), <= 8 tokens a step
        env = gd.Env(args, V=args.vocab, max_reqs=bs + 1, max_ctx=32 + n_ref + 2 * 33 + 16, block=8,
                     configs={"b16": ("1:16", [bs])}, seed=41)
        import random

        g = random.Random(23)
        rows = list(range(1, bs + 1))
        prompts = [[g.randrange(args.vocab) for _ in range(32)] for _ in rows]
        refs, _, _ = env.ar_greedy(rows, prompts, n_ref)
        for r, s in zip(rows, refs):
            env.drafter.set_reference(r, s)
        w = env.worker("b16")
        reqs = [gd.new_request(r, p, 10 ** 6) for r, p in zip(rows, prompts)]
        gd.admit(env, reqs, 0.0, None)
        cnt, clock = SyncCounter(), IdleClock(cuda=gd.on_cuda())
        warm = 2
        cuda_warn = []

        def step(counting: bool, timing: bool):
            batch = gd.make_batch(env, reqs, w._h_nmax, 0.0)
            with cuda_sync_warnings(counting and gd.on_cuda()) as wl:
                if timing:
                    clock.start()
                if counting:
                    cnt.begin()
                r_ = w.forward_batch_generation(batch)
                if counting:
                    cnt.end()
                if timing:
                    clock.end()
            if counting:
                cuda_warn.append(sum(1 for x in wl if "synchroniz" in str(x.message)))
            # the scheduler's copy: outside the step
            N = int(r_.speculative_num_draft_tokens)
            lens = r_.accept_lens.tolist()
            toks = r_.next_token_ids.view(bs, N).tolist()
            for b, rq in enumerate(reqs):
                com = toks[b][: lens[b]]
                rq["tokens"].append(rq["bonus"])
                rq["tokens"] += com[:-1]
                rq["bonus"] = com[-1]
                rq["seq_len"] += lens[b]

        for _ in range(warm):
            step(False, False)
        with cnt:  # pass 1: the readback count (patched tensor methods: their overhead stays out of pass 2)
            for _ in range(n):
                step(True, False)
        for _ in range(n):  # pass 2: GPU idle between steps, nothing patched
            step(False, True)
        mism = sum(1 for i, rq in enumerate(reqs)
                   if gd.generated(rq) != refs[i][len(rq["prompt"]): len(rq["prompt"]) + len(gd.generated(rq))])
        gap, span = clock.gaps_ms()
        per = cnt.per_step()
        row = dict(bs=bs, steps=n, readbacks_per_step=per, readbacks_max=max(per), readbacks_min=min(per),
                   harness_readbacks_per_step=cnt.per_step(("harness",)), cuda_sync_warnings_per_step=cuda_warn,
                   idle_ms_median=_median(gap), idle_ms_total=sum(gap), idle_ms_per_step=sum(gap) / max(1, len(gap)),
                   step_ms_median=_median(span), clock="cuda events" if clock.cuda else "host clock (CPU)",
                   mismatches=mism, sites=cnt.site_table(n))
        out.append(row)
        gd.log(f"[syncs] bs {bs}: {n} steps, host readbacks per step (runtime + SGLang) {min(per)}..{max(per)} "
               f"(harness stand-ins {max(row['harness_readbacks_per_step'])}), torch sync warnings per step "
               f"{max(cuda_warn) if gd.on_cuda() else 'n/a (CPU)'}, idle between steps {row['idle_ms_per_step']:.3f} ms "
               f"mean / {row['idle_ms_median']:.3f} median ({row['clock']}), step {row['step_ms_median']:.3f} ms, "
               f"mismatches {mism}")
        gd.log(row["sites"])
    res["syncs"] = out
    res["syncs_ok"] = all(r["mismatches"] == 0 for r in out)
