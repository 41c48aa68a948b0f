"""The draft head's Triton kernels compiled ahead of time (issue 36).

A start captures the drafter's CUDA graph (the head folded in) for every batch
size of every band with a tree; each kernel launch the head makes there is a
*specialisation* (kernel, compile-time constants, Triton's argument
specialisation, launch options) that Triton compiles on first use, seconds to a
minute each.  This module

* enumerates them without a GPU (:func:`head_specs`, :func:`release_specs`):
  the head runs on ``meta`` tensors while its kernels' launches are recorded
  (:func:`recording`), and each launch is bound by Triton's own binder for a
  named target (``GPUTarget("cuda", <compute capability>, 32)``), so the keys are
  the ones the JIT computes when the kernels are launched on that GPU;
* compiles them into ``TRITON_CACHE_DIR`` with ``triton.compile`` for that
  target (:func:`fill_cache`; no driver, no launch: a host whose GPUs still
  serve, or a machine with none) and writes the manifest
  ``opsctl-triton-manifest.json``::

      {"format": 1, "specialisations": [{"budget": 16, "block": 8,
        "vocab_shard": 20480, "arch": "sm_120"}, ...], ...}

  (each listed (budget, block, vocabulary shard, arch) has every kernel of
  every captured batch size in the cache; other top-level keys describe the
  fill: hidden size, TP, dtype, batch sizes, triton version);
* at start, :func:`prepare_head` compiles what the cache lacks before the
  capture and prints, on TP0, per budget that compiled anything::

      DDTREE Triton compile: budget=B, block=K, vocab_shard=V, arch=sm_NNN, elapsed=X s, cache=DIR

  and nothing when every kernel was a cache hit.

CLI (a machine with no GPU is fine)::

    python -m sglang_ddtree.aot --arch sm_120 --budgets 4,16 --block 8 --vocab-shard 20480 \\
        --hidden 7168 --tp 8 --max-bs 128 --out DIR [--schedule 1:16,8:4,32:0] [--jobs N]

The specialisation is the launch Triton sees: kernels are specialised only on
what must be constant for a release (budget, block, vocabulary shard, hidden
size, dtype, TP) plus three launch classes by batch size that are worth their
own code (``triton_kernels``: one request of L 7 = one fused launch; up to
``pdl_rows_max`` rows = programmatic dependent launch; the few-row GEMM's tile
height) -- not on the batch size itself (:func:`count_specs`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from . import triton_kernels as tk
from .head import DraftTreeHead
from .schedule import BudgetSchedule, parse_schedule, sglang_capture_bs

logger = logging.getLogger(__name__)

MANIFEST_NAME = "opsctl-triton-manifest.json"
MANIFEST_FORMAT = 1
# the CUDA allocator's blocks are 512-byte aligned: a meta tensor's address is
# modelled as an aligned base + its storage offset
_BASE = 1 << 20

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "fp32": torch.float32, "float32": torch.float32}


# ---------------------------------------------------------------------------
# launches of the head, recorded on meta tensors
# ---------------------------------------------------------------------------


@dataclass
class Launch:
    fn: object  # the JITFunction
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def recording(module=tk):
    """Within the block, every ``kernel[grid](...)`` of ``module``'s Triton
    kernels appends a :class:`Launch` to the yielded list instead of running."""
    from triton.runtime.jit import JITFunction

    rec: List[Launch] = []
    fns = [v for v in vars(module).values() if isinstance(v, JITFunction)]
    for fn in fns:
        fn.run = (lambda fn: lambda *a, grid=None, warmup=False, **kw: rec.append(Launch(fn, a, kw)))(fn)
    try:
        yield rec
    finally:
        for fn in fns:
            fn.__dict__.pop("run", None)


class _MetaGroup:
    """A TP group that gathers nothing (shapes only)."""

    def __init__(self, world_size: int):
        self.world_size = int(world_size)

    def all_gather_into_tensor(self, out, inp):
        return None


def head_launches(budget: int, block: int, vocab_shard: int, hidden: int, batch_sizes: Iterable[int], *,
                  tp: int = 1, dtype=torch.bfloat16, pdl: bool = True, head_cls=DraftTreeHead,
                  module=tk) -> List[Launch]:
    """Every kernel launch of the heads of one budget (every TP rank's: the
    rank's vocabulary offset is an argument) for ``batch_sizes``, as captured:
    one head sized for the largest batch, called once per batch size with a
    block of hidden states and input ids (the root = position 0 of each block)."""
    bs_list = sorted(set(int(b) for b in batch_sizes))
    out: List[Launch] = []
    if not bs_list or int(budget) <= 0:
        return out
    w = torch.empty((int(vocab_shard), int(hidden)), dtype=dtype, device="meta")
    for rank in range(max(1, int(tp))):
        group = _MetaGroup(tp) if tp > 1 else None
        head = head_cls(w, int(budget), int(block), vocab_start=rank * int(vocab_shard), tp_group=group,
                        vocab_size=int(vocab_shard) * max(1, int(tp)), max_bs=bs_list[-1], impl="triton")
        head._pdl_ok = bool(pdl)
        with recording(module) as rec:
            for bs in bs_list:
                hid = torch.empty((bs * int(block), int(hidden)), dtype=dtype, device="meta")
                ids = torch.empty((bs * int(block),), dtype=torch.int64, device="meta")
                head(hid, ids)
        out.extend(rec)
    return out


# ---------------------------------------------------------------------------
# a launch -> the JIT's specialisation for a target
# ---------------------------------------------------------------------------


def parse_arch(arch) -> int:
    """``"sm_120"`` / ``"sm120"`` / ``"12.0"`` / ``120`` -> 120."""
    s = str(arch).strip().lower()
    if s.startswith("sm_"):
        s = s[3:]
    elif s.startswith("sm"):
        s = s[2:]
    if "." in s:
        major, minor = s.split(".", 1)
        return int(major) * 10 + int(minor)
    return int(s)


def arch_name(cc: int) -> str:
    return f"sm_{int(cc)}"


def target_for(arch):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", parse_arch(arch), 32)


class _Ptr:
    """A pointer argument as Triton's binder sees it: dtype + address."""

    def __init__(self, dtype, addr: int):
        self.dtype = dtype
        self._addr = int(addr)

    def data_ptr(self):
        return self._addr


def _arg(a):
    if isinstance(a, torch.Tensor):
        if a.device.type == "meta":
            return _Ptr(a.dtype, _BASE + a.storage_offset() * a.element_size())
        return a
    return a


_BINDERS: Dict[tuple, tuple] = {}


def _binder(fn, target):
    key = (id(fn), target.backend, target.arch, target.warp_size)
    hit = _BINDERS.get(key)
    if hit is None or hit[0] is not fn:
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        backend = make_backend(target)
        hit = _BINDERS[key] = (fn, backend, create_function_from_signature(fn.signature, fn.params, backend))
    return hit[1], hit[2]


def _freeze(x):
    if isinstance(x, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    return x


@dataclass
class Spec:
    """One compiled kernel: what ``JITFunction.run`` hands ``triton.compile`` on a miss."""

    fn: object
    signature: dict
    constexprs: dict
    attrs: dict
    options: object  # the backend's parsed options

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def key(self) -> tuple:
        return (self.fn.fn.__module__, self.fn.fn.__qualname__, _freeze(self.signature),
                _freeze({str(k): repr(v) for k, v in self.constexprs.items()}), _freeze(self.attrs),
                self.options.hash())

    def source(self):
        from triton.compiler import ASTSource

        return ASTSource(self.fn, self.signature, self.constexprs, self.attrs)


def launch_spec(launch: Launch, target) -> Spec:
    """The specialisation ``JITFunction.run`` computes for this launch on ``target``
    (its binder and ``_pack_args``, with the run's own debug / instrumentation options)."""
    from triton import knobs

    fn = launch.fn
    backend, binder = _binder(fn, target)
    kw = {k: _arg(v) for k, v in launch.kwargs.items()}
    kw["debug"] = kw.get("debug", fn.debug) or knobs.runtime.debug
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    args = [_arg(a) for a in launch.args]
    bound, spec, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
    return Spec(fn, signature, constexprs, attrs, options)


def unique_specs(launches: Iterable[Launch], target) -> List[Spec]:
    seen, out = set(), []
    for ln in launches:
        s = launch_spec(ln, target)
        if s.key not in seen:
            seen.add(s.key)
            out.append(s)
    return out


# ---------------------------------------------------------------------------
# a release: its budgets and captured batch sizes
# ---------------------------------------------------------------------------


def band_batch_sizes(schedule: Optional[str], capture_bs: Sequence[int], budgets: Sequence[int] = ()) -> Dict[int, List[int]]:
    """``{budget: captured batch sizes whose draft graph folds in that budget's head}``:
    each band with a tree gets the captured bs routed to it (SGLang's routing,
    :class:`~sglang_ddtree.schedule.BudgetSchedule`); ``budgets`` without a
    schedule: each budget alone over the whole capture list (a single-budget
    release, or each candidate of a tune)."""
    cap = sorted(set(int(b) for b in capture_bs))
    out: Dict[int, List[int]] = {}
    if schedule:
        sched = BudgetSchedule(parse_schedule(schedule))
        sched.set_cuda_graph_bs(cap)
        for i, band in enumerate(sched.bands):
            bs = sched.cuda_graph_bs_for_band(i) or []
            if band.budget > 0 and bs:
                out.setdefault(band.budget, [])
                out[band.budget] = sorted(set(out[band.budget]) | set(bs))
    for b in budgets:
        if int(b) > 0:
            out[int(b)] = sorted(set(out.get(int(b), [])) | set(cap))
    return out


def head_specs(budget: int, block: int, vocab_shard: int, hidden: int, batch_sizes: Iterable[int], *, arch,
               tp: int = 1, dtype=torch.bfloat16, head_cls=DraftTreeHead, module=tk) -> List[Spec]:
    """The distinct kernels one budget's heads compile for ``batch_sizes`` on ``arch``."""
    cc = parse_arch(arch)
    launches = head_launches(budget, block, vocab_shard, hidden, batch_sizes, tp=tp, dtype=dtype,
                             pdl=cc >= 90, head_cls=head_cls, module=module)
    return unique_specs(launches, target_for(cc))


def release_specs(*, block: int, vocab_shard: int, hidden: int, capture_bs: Sequence[int], arch,
                  schedule: Optional[str] = None, budgets: Sequence[int] = (), tp: int = 1,
                  dtype=torch.bfloat16, head_cls=DraftTreeHead, module=tk) -> Dict[int, List[Spec]]:
    """``{budget: its kernels}`` for every band with a tree (and every listed budget)."""
    return {b: head_specs(b, block, vocab_shard, hidden, bs, arch=arch, tp=tp, dtype=dtype,
                          head_cls=head_cls, module=module)
            for b, bs in sorted(band_batch_sizes(schedule, capture_bs, budgets).items())}


def count_specs(per_budget: Dict[int, List[Spec]]) -> dict:
    """``{"per_budget": {budget: n}, "total": distinct kernels of the release}``
    (a kernel that two budgets share, the head's GEMM, is compiled once)."""
    keys = set()
    for specs in per_budget.values():
        keys.update(s.key for s in specs)
    return {"per_budget": {b: len(s) for b, s in per_budget.items()}, "total": len(keys)}


# ---------------------------------------------------------------------------
# compiling into the cache
# ---------------------------------------------------------------------------


def cache_dir() -> str:
    from triton import knobs

    return os.environ.get("TRITON_CACHE_DIR") or knobs.cache.dir


@contextlib.contextmanager
def _listen(hits: list):
    from triton import knobs

    prev = knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        hits.append(bool(cache_hit))
        if prev is not None:
            prev(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    knobs.compilation.listener = listener
    try:
        yield
    finally:
        knobs.compilation.listener = prev


def compile_spec(spec: Spec, target) -> bool:
    """Compile one specialisation into the cache (``triton.compile`` for ``target``:
    no driver, nothing launched).  Returns True when it was a cache hit."""
    import triton

    hits: list = []
    with _listen(hits):
        triton.compile(spec.source(), target=target, options=dict(spec.options.__dict__))
    return bool(hits and hits[-1])


# ---------------------------------------------------------------------------
# the host-side launch stubs: what a first launch still builds
# ---------------------------------------------------------------------------
#
# ``triton.compile`` writes a kernel's 7 cache files (.ttir .ttgir .llir .ptx
# .cubin .json __grp__) but not the C stub that launches it: Triton's CUDA
# driver builds that at the kernel's first launch (``CudaLauncher``:
# ``make_launcher(constants, signature)`` -> ``compile_module_from_src(...,
# "__triton_launcher")``, gcc, ~0.25 s), keyed by the stub's source -- the
# argument types and constants, not the kernel -- and the driver's own
# ``cuda_utils`` module the same way on the process's first launch.  One
# budget's head needs 6 distinct stubs (budget 4, 16 and 64 share them), so an
# H200 start from a filled cache built 6 stubs + cuda_utils = 7 files at its
# first (budget, bs) pair and nothing after (issue 52).  The fill builds them too.


def launcher_source(spec: "Spec") -> str:
    """The C source of the launch stub ``CudaLauncher`` builds for ``spec``
    (its constants keyed by argument index, as ``CudaLauncher.__init__`` maps them)."""
    from triton.backends.nvidia.driver import make_launcher

    names = spec.fn.arg_names
    constants = {((names.index(k),) if isinstance(k, str) else k): v for k, v in spec.constexprs.items()}
    return make_launcher(constants, dict(spec.signature), None)


def launcher_sources(specs: Iterable["Spec"]) -> List[str]:
    """The distinct launch stubs of ``specs`` (in first-use order)."""
    seen: Dict[str, None] = {}
    for s in specs:
        seen.setdefault(launcher_source(s), None)
    return list(seen)


def _build_module(src: str, name: str) -> None:
    """``compile_module_from_src`` as the CUDA driver calls it (into TRITON_CACHE_DIR;
    a cache hit only loads).  Needs gcc, Python's headers and libcuda.so.1 (the
    stubs link it); the stub's key holds this machine's platform and the .so name
    its Python's EXT_SUFFIX: fill with the Python the server runs."""
    from triton.backends.nvidia import driver as nv
    from triton.runtime.build import compile_module_from_src

    compile_module_from_src(src=src, name=name, library_dirs=nv.library_dirs(), include_dirs=nv.include_dirs,
                            libraries=nv.libraries)


def build_launchers(specs: Iterable["Spec"], builder=None) -> dict:
    """Build the launch stubs of ``specs`` and the driver's ``cuda_utils`` module
    into the cache.  Returns ``{"launchers": n, "built": bool, "skipped": reason}``;
    a host without libcuda.so.1 (or gcc) skips them (the first launch builds them,
    ~2 s at a start)."""
    srcs = launcher_sources(specs)
    build = builder or _build_module
    try:
        from triton.backends.nvidia import driver as nv

        if builder is None:
            nv.library_dirs()  # asserts libcuda.so.1 is found
        with open(os.path.join(nv.dirname, "driver.c")) as f:
            build(f.read(), "cuda_utils")
        for src in srcs:
            build(src, "__triton_launcher")
    except Exception as e:  # noqa: BLE001 -- the kernels are in the cache; the stubs build at first launch
        return {"launchers": len(srcs), "built": False, "skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    return {"launchers": len(srcs), "built": True}


def _compile_one(job):
    # a pool worker: enumerate again (cheap) and compile the job's share
    budget, block, vocab_shard, hidden, bs, arch, tp, dtype_name, idx, cache = job
    if cache:
        os.environ["TRITON_CACHE_DIR"] = cache
    specs = head_specs(budget, block, vocab_shard, hidden, bs, arch=arch, tp=tp, dtype=_DTYPES[dtype_name])
    t0 = time.perf_counter()
    hits = [compile_spec(specs[i], target_for(arch)) for i in idx]
    return budget, len(hits) - sum(hits), time.perf_counter() - t0


def _dtype_name(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


def fill_cache(*, out: str, arch, block: int, vocab_shard: int, hidden: int, capture_bs: Sequence[int],
               budgets: Sequence[int] = (), schedule: Optional[str] = None, tp: int = 1, dtype=torch.bfloat16,
               jobs: int = 1, log=None, kernels: Optional[Sequence[str]] = None, runtime: Optional[str] = None,
               launcher_builder=None) -> dict:
    """Compile every kernel of every (budget, captured batch size) into ``out`` (a
    Triton cache directory) for ``arch`` and merge them into its manifest.
    Returns the manifest (plus ``"fill"``: kernels, compiled, seconds per budget).
    ``kernels`` (names; tests): compile only those, and write no manifest (the
    cache is then incomplete).  The kernels' launch stubs are built as well
    (:func:`build_launchers`; ``launcher_builder``: tests), where this host can
    link them; the manifest's ``fill.launchers`` says which."""
    cc = parse_arch(arch)
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    per_bs = band_batch_sizes(schedule, capture_bs, budgets)
    prev_env = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = out
    fill = {}
    try:
        per_budget = {b: head_specs(b, block, vocab_shard, hidden, bs, arch=cc, tp=tp, dtype=dtype)
                      for b, bs in per_bs.items()}
        work = []
        for b, specs in per_budget.items():
            idx = [i for i, sp in enumerate(specs) if kernels is None or sp.name in kernels]
            fill[b] = {"kernels": len(idx), "compiled": 0, "seconds": 0.0}
            # one job per kernel (the pool balances them); in-process when jobs <= 1
            for i in idx:
                work.append((b, block, vocab_shard, hidden, per_bs[b], cc, tp, _dtype_name(dtype), [i], out))
        t0 = time.perf_counter()
        if jobs <= 1 or len(work) <= 1:
            for w in work:
                b, comp, s = _compile_one(w)
                fill[b]["compiled"] += comp
                fill[b]["seconds"] += s
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=int(jobs), mp_context=mp.get_context("spawn")) as ex:
                for b, comp, s in ex.map(_compile_one, work):
                    fill[b]["compiled"] += comp
                    fill[b]["seconds"] += s
        launchers = build_launchers([sp for specs in per_budget.values() for sp in specs], builder=launcher_builder)
        wall = time.perf_counter() - t0
    finally:
        if prev_env is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = prev_env
    specs_new = [{"budget": int(b), "block": int(block), "vocab_shard": int(vocab_shard), "arch": arch_name(cc)}
                 for b in sorted(per_budget)]
    if kernels is None:
        doc = dict(write_manifest(out, specs_new, extra={
            "hidden": int(hidden), "tp": int(tp), "dtype": _dtype_name(dtype),
            "capture_bs": sorted(set(int(x) for x in capture_bs)), "schedule": schedule or None,
            **({"runtime": str(runtime)} if runtime else {})}))
    else:
        doc = {"format": MANIFEST_FORMAT, "specialisations": []}
    doc["fill"] = {"wall_s": round(wall, 3), "distinct_kernels": count_specs(per_budget)["total"],
                   "per_budget": {str(b): v for b, v in fill.items()}, "launchers": launchers}
    if log:
        log(f"filled {out} for {arch_name(cc)}: {doc['fill']['distinct_kernels']} kernels, "
            f"{sum(v['compiled'] for v in fill.values())} compiled, {launchers['launchers']} launch stubs "
            f"{'built' if launchers['built'] else 'not built (' + launchers['skipped'] + ')'}, {wall:.1f} s")
    return doc


def read_manifest(d: str) -> dict:
    """The manifest of cache directory ``d`` ({} when absent or unreadable)."""
    try:
        with open(os.path.join(d, MANIFEST_NAME)) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def write_manifest(d: str, specialisations: Sequence[dict], extra: Optional[dict] = None) -> dict:
    """Merge ``specialisations`` into ``d``'s manifest (format 1) and write it atomically.
    ``extra["runtime"]`` (the runtime wheel's id, e.g. its sha256): a manifest written
    for another runtime lists nothing of this one (its kernels' source differs), so
    its specialisations are dropped."""
    doc = read_manifest(d)
    if doc.get("format") != MANIFEST_FORMAT:
        doc = {}
    if (extra or {}).get("runtime") and doc.get("runtime") != extra["runtime"]:
        doc = {}
    seen = []
    for s in list(doc.get("specialisations") or []) + list(specialisations):
        s = {"budget": int(s["budget"]), "block": int(s["block"]), "vocab_shard": int(s["vocab_shard"]),
             "arch": str(s["arch"])}
        if s not in seen:
            seen.append(s)
    import triton

    new = {"format": MANIFEST_FORMAT, "specialisations": seen, "triton": triton.__version__}
    for k, v in (extra or {}).items():
        new[k] = v
    tmp = os.path.join(d, f".{MANIFEST_NAME}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(new, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, os.path.join(d, MANIFEST_NAME))
    return new


# ---------------------------------------------------------------------------
# at start: compile what the cache lacks, before the capture
# ---------------------------------------------------------------------------


def compile_line(budget: int, block: int, vocab_shard: int, arch: str, elapsed: float, cache: str) -> str:
    return (f"DDTREE Triton compile: budget={budget}, block={block}, vocab_shard={vocab_shard}, "
            f"arch={arch}, elapsed={elapsed:.2f} s, cache={cache}")


def prepare_head(head: DraftTreeHead, batch_sizes: Iterable[int], *, announce: bool = True, log=None) -> dict:
    """Compile (into the Triton cache) every kernel ``head`` launches for
    ``batch_sizes`` on its device before they are first launched (the draft
    graph's capture): a cache hit is only loaded later.  ``announce`` (TP0):
    the ``DDTREE Triton compile: ...`` line when anything compiled.  Returns
    ``{"kernels", "compiled", "elapsed", "arch", "cache"}``."""
    if not head.use_triton or head.device.type != "cuda":
        return {"kernels": 0, "compiled": 0, "elapsed": 0.0, "arch": None, "cache": None}
    from triton.runtime import driver

    target = driver.active.get_current_target()
    cc = int(target.arch)
    t0 = time.perf_counter()
    w = torch.empty(tuple(head.weight.shape), dtype=head.weight.dtype, device="meta")
    shadow = DraftTreeHead(w, head.budget, head.block, vocab_start=head.vocab_start,
                           tp_group=_MetaGroup(head.tp) if head.merge else None, shard_merge=head.merge,
                           max_bs=max(1, head._cap),
                           max_logits_bytes=head.max_logits_bytes, full_rows_max=head.full_rows_max,
                           cfg=head.cfg, impl="triton")
    shadow.K, shadow.Ks = head.K, head.Ks
    shadow._pdl_ok = head._pdl_ok
    bs_list = sorted(set(int(b) for b in batch_sizes))
    with recording() as rec:
        for bs in bs_list:
            shadow(torch.empty((bs * head.block, head.H), dtype=head.weight.dtype, device="meta"),
                   torch.empty((bs * head.block,), dtype=torch.int64, device="meta"))
    specs = unique_specs(rec, target)
    compiled = sum(0 if compile_spec(s, target) else 1 for s in specs)
    build_launchers(specs)  # the launch stubs too: else the capture's first launches build them
    elapsed = time.perf_counter() - t0
    res = {"kernels": len(specs), "compiled": compiled, "elapsed": elapsed, "arch": arch_name(cc),
           "cache": cache_dir()}
    if compiled and announce:
        (log or logger.info)(compile_line(head.budget, head.block, head.Vs, arch_name(cc), elapsed, res["cache"]))
    return res


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def _ints(text: str) -> List[int]:
    return [int(x) for x in str(text).replace(" ", "").split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_ddtree.aot",
                                description="Fill a Triton cache with the DDTree draft head's kernels for a GPU "
                                            "architecture (no GPU needed) and write its manifest.")
    p.add_argument("--arch", required=True, help="target, e.g. sm_90 (H100/H200), sm_120 (RTX PRO 6000 Blackwell)")
    p.add_argument("--budgets", default="", help="comma-separated budgets, each over the whole capture list")
    p.add_argument("--schedule", default="", help="a budget schedule (MIN_BS:BUDGET,...): each band's captured bs")
    p.add_argument("--block", type=int, default=8, help="the drafter's block size (L = block - 1)")
    p.add_argument("--vocab-shard", type=int, required=True, help="vocabulary rows per TP rank (vocab / tp)")
    p.add_argument("--hidden", type=int, default=7168, help="the target's hidden size (LM-head K)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (TP > 1: shard merge kernels)")
    p.add_argument("--dtype", default="bf16", choices=sorted(_DTYPES))
    p.add_argument("--max-bs", type=int, default=128, help="--cuda-graph-max-bs-decode (SGLang's capture list)")
    p.add_argument("--capture-bs", default="", help="explicit captured batch sizes (instead of --max-bs)")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1)), help="compile processes")
    p.add_argument("--out", required=True, help="the Triton cache directory (TRITON_CACHE_DIR of the unit)")
    p.add_argument("--runtime", default="", help="the runtime wheel's id (its sha256) for the manifest's \"runtime\"")
    p.add_argument("--count-only", action="store_true", help="print the specialisation count, compile nothing")
    a = p.parse_args(argv)
    budgets = _ints(a.budgets)
    if not budgets and not a.schedule:
        p.error("give --budgets or --schedule")
    cap = _ints(a.capture_bs) if a.capture_bs else sglang_capture_bs(a.max_bs)
    kw = dict(block=a.block, vocab_shard=a.vocab_shard, hidden=a.hidden, capture_bs=cap, schedule=a.schedule or None,
              budgets=budgets, tp=a.tp, dtype=_DTYPES[a.dtype])
    if a.count_only:
        print(json.dumps(count_specs(release_specs(arch=a.arch, **kw))))
        return 0
    doc = fill_cache(out=a.out, arch=a.arch, jobs=a.jobs, log=lambda m: print(m, file=sys.stderr),
                     runtime=a.runtime or None, **kw)
    print(json.dumps(doc, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
