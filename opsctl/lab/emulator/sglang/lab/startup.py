"""Start-up time of the emulated server: phases modelled at the site's scale, run at the lab's.

At the site (8 x RTX PRO 6000 Blackwell over PCIe, a 744B-class MoE on SGLang 0.5.23) a start
takes minutes: ~36 s of weight loading (multithreaded), ~208 s of CUDA-graph capture in all,
~3 min of server warm-up (`--skip-server-warmup` saves it), 7-8 min from start to ready
(voipmonitor/rtx6kpro models/glm5.md, inference-engines/sglang.md; ../shared/reference/restarts.md).
The DDTree runtime adds the Triton compile of its draft head, once per specialisation
(budget, block, vocabulary shard, GPU architecture), unless the release's Triton cache holds it.

The emulator prints every phase with its MODELLED (site-scale) seconds in SGLang's own lines
(`Load weight end. elapsed=36.00 s`, `Capture target verify CUDA graph end. ... elapsed=...`),
and sleeps modelled / OPSCTL_LAB_TIME_SCALE real seconds, so a lab start stays about a second.

Environment (all optional):
  OPSCTL_LAB_TIME_SCALE   site seconds per lab second (default 500; 1 = the site's real time).
                          Without it, /etc/opsctl-lab/time_scale (next to the fault file) if present.
  OPSCTL_LAB_STARTUP      JSON overriding the model's constants below (keys of DEFAULTS; compile_s
                          maps budget -> seconds), e.g. '{"weight_load_s": 60, "warmup_s": 0}'.
  TRITON_CACHE_DIR        the release's Triton cache; its opsctl-triton-manifest.json lists the
                          specialisations compiled into it (see docs/lab.md, "Start-up phases").
  SGLANG_CACHE_DIR, SGLANG_JIT_CACHE_DIR, FLASHINFER_WORKSPACE_BASE, TORCHINDUCTOR_CACHE_DIR
                          the JIT caches, resolved as SGLang 0.5.23 resolves them (sglang/__init__.py
                          redirects FlashInfer's and Inductor's under SGLANG_CACHE_DIR); a module whose
                          built file is missing there is built by the first forward (the warm-up
                          request, or the first request with --skip-server-warmup): `jit_s` in all.

The warm-up (http_server._execute_server_warmup, read in the 0.5.23 wheel) is one 8-token request:
for a VLM like Kimi K2.5/K2.6 (KimiK25ForConditionalGeneration) a chat request with a 512x512
image, which also runs MoonViT's `get_rope_shape` under torch.compile. What makes it minutes at the
site is the first forward's one-time work, modelled here: the JIT builds of FlashInfer's and
SGLang's kernels into a cold cache (`jit_s`), and the vision compile (`vision_compile_s` with a
cold Inductor cache, `vision_compile_warm_s` with a warm one: Dynamo still traces). With every cache
warm the warm-up is the request itself (`warmup_s`). docs/startup.md has the evidence and the split.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TIME_SCALE = 500.0
MANIFEST_NAME = "opsctl-triton-manifest.json"
GPU_ARCH = "sm_120"            # RTX PRO 6000 Blackwell: compute capability 12.0 (the lab's nvidia-smi)

# The draft head's first call per budget with a fresh Triton cache (issue 36, H200, draft head
# at vocabulary shard 20480, H 7168, block 8; the bs 1 column): one compile per specialisation.
COMPILE_S = {4: 6.8, 8: 9.6, 16: 22.1, 32: 43.1, 64: 60.9}

DEFAULTS: dict = {
    # before weight loading: process start, NCCL/torch distributed init, tokenizer (no line of its own)
    "init_s": 14.0,
    # `Load weight end. elapsed=` at TP8 with multithreaded loading (GLM-5 on 8 x RTX PRO 6000: ~36 s)
    "weight_load_s": 36.0,
    # KV-cache allocation and memory pool (no elapsed of its own)
    "memory_pool_s": 4.0,
    # one decode graph per captured batch size: per_bs_s + per_token_s x num_tokens_per_req
    # (AR, max bs 256: 35 sizes x 5.95 s = 208 s, the site's ~208 s in all)
    "capture_per_bs_s": 5.9,
    "capture_per_token_s": 0.05,
    # the drafter's graphs (one block-size forward per batch size)
    "draft_capture_per_bs_s": 1.0,
    # the warm-up request itself (one image chat request, 8 tokens) once every cache is warm
    "warmup_s": 6.0,
    # the first forward's JIT builds into cold caches (FlashInfer + SGLang JIT kernels, JIT_MODULES);
    # with the vision compile and the request, the site's ~3 min warm-up (what --skip-server-warmup moves)
    "jit_s": 150.0,
    # MoonViT position interpolation under torch.compile (the 512x512 warm-up image): cold / warm Inductor
    "vision_compile_s": 24.0,
    "vision_compile_warm_s": 6.0,
    "compile_s": dict(COMPILE_S),
}


class ScaleError(ValueError):
    pass


FLASHINFER_VERSION = "0.7.2"      # sglang 0.5.23 pins flashinfer_python 0.7.2
FLASHINFER_ARCH = "120"           # FlashInfer's workspace names the target archs by major+minor (sm_120)
SGLANG_JIT_TARGET = "sm_120"
# What the first forward of Kimi K2.6 at TP8 builds into cold caches: (library, module, share of
# jit_s). FlashInfer's names as its JitSpec names them (jit/attention/modules.py get_batch_mla_uri,
# sampling, norm); SGLang's JIT kernels by module (sglang/kernels/jit: built silently at INFO).
JIT_MODULES = (
    ("flashinfer", "batch_mla_attention_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_ckv_512_"
                   "head_dim_kpe_64_profiler_False_planabi2", 0.40),
    ("flashinfer", "sampling", 0.20),
    ("flashinfer", "norm", 0.10),
    ("sglang", "moe_fused_gate", 0.17),
    ("sglang", "per_token_group_quant_8bit", 0.13),
)
# architectures whose 0.5.23 warm-up sends an image that compiles (http_server._get_vlm_warmup_image_base64)
IMAGE_WARMUP_ARCHS = ("KimiK25ForConditionalGeneration",)
INDUCTOR_MARK = "fxgraph/opsctl-lab-kimi_k25-get_rope_shape"   # the emulator's stand-in for Inductor's entry


def cache_dirs(environ=None) -> dict[str, Path]:
    """The JIT cache directories as SGLang 0.5.23 resolves them (environ.redirect_third_party_caches:
    setdefault under SGLANG_CACHE_DIR; SGLANG_JIT_CACHE_DIR defaults to ~/.cache/sglang/jit)."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    base = Path(os.path.expanduser(env.get("SGLANG_CACHE_DIR") or str(home / ".cache" / "sglang")))
    fi = Path(env.get("FLASHINFER_WORKSPACE_BASE") or base)
    return {"flashinfer": fi / ".cache" / "flashinfer" / FLASHINFER_VERSION / FLASHINFER_ARCH / "cached_ops",
            "sglang": Path(os.path.expanduser(env.get("SGLANG_JIT_CACHE_DIR") or str(home / ".cache/sglang/jit"))),
            "inductor": Path(env.get("TORCHINDUCTOR_CACHE_DIR") or base / "inductor")}


def record_built_inductor(environ=None) -> None:
    """The vision compile's Inductor entry (the emulator's stand-in): a later start's compile is warm."""
    record_built([cache_dirs(environ)["inductor"] / INDUCTOR_MARK])


def module_path(lib: str, name: str, dirs: dict[str, Path]) -> Path:
    if lib == "flashinfer":
        return dirs["flashinfer"] / name / f"{name}.so"
    import hashlib

    key = hashlib.sha256(f"{name}\0sglang-0.5.23\0{SGLANG_JIT_TARGET}".encode()).hexdigest()[:16]
    return dirs["sglang"] / SGLANG_JIT_TARGET / name / f"build-{key}" / f"deps-{key}" / f"{name}.so"


def cold_modules(jit_s: float, dirs: dict[str, Path]) -> list[tuple[str, str, float, Path]]:
    """(library, module, site seconds, its built file) for each module the cache lacks."""
    out = []
    for lib, name, share in JIT_MODULES:
        path = module_path(lib, name, dirs)
        if not path.is_file():
            out.append((lib, name, jit_s * share, path))
    return out


def record_built(paths: list[Path]) -> None:
    """A build leaves its module's file (the emulator has no kernels: a stand-in, written atomically
    as ninja's output is published); best effort, a read-only cache stays cold."""
    for path in paths:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text("opsctl-lab emulated JIT module (no code)\n")
            os.replace(tmp, path)
        except OSError:
            pass


def time_scale() -> float:
    raw = os.environ.get("OPSCTL_LAB_TIME_SCALE")
    source = "OPSCTL_LAB_TIME_SCALE"
    if raw is None:
        faults = Path(os.environ.get("OPSCTL_LAB_FAULTS", "/etc/opsctl-lab/faults.json"))
        try:
            raw = (faults.parent / "time_scale").read_text().strip()
            source = str(faults.parent / "time_scale")
        except OSError:
            return DEFAULT_TIME_SCALE
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise ScaleError(f"{source}={raw!r} is not a positive number (site seconds per lab second; "
                         f"default {DEFAULT_TIME_SCALE:g})")
    return value


def constants() -> dict:
    out = {**DEFAULTS, "compile_s": dict(DEFAULTS["compile_s"])}
    raw = os.environ.get("OPSCTL_LAB_STARTUP")
    if raw:
        try:
            over = json.loads(raw)
        except ValueError:
            over = {}
        for k, v in (over if isinstance(over, dict) else {}).items():
            if k == "compile_s" and isinstance(v, dict):
                out["compile_s"].update({int(b): float(s) for b, s in v.items()})
            elif k in DEFAULTS:
                out[k] = float(v)
    return out


def compile_seconds(budget: int, table: dict[int, float]) -> float:
    """One specialisation's compile: the table's value, log-linear between its budgets,
    proportional below the smallest and flat above the largest."""
    pts = sorted(table.items())
    if budget in table:
        return float(table[budget])
    if budget < pts[0][0]:
        return pts[0][1] * budget / pts[0][0]
    if budget > pts[-1][0]:
        return float(pts[-1][1])
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if b0 < budget < b1:
            f = (math.log(budget) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return s0 + (s1 - s0) * f
    return float(pts[-1][1])


@dataclass(frozen=True)
class Specialisation:
    budget: int
    block: int
    vocab_shard: int
    arch: str = GPU_ARCH

    def as_dict(self) -> dict:
        return {"budget": self.budget, "block": self.block, "vocab_shard": self.vocab_shard, "arch": self.arch}


def cached_specialisations() -> tuple[str | None, set[Specialisation]]:
    """(TRITON_CACHE_DIR, what its manifest lists); an unreadable manifest lists nothing."""
    d = os.environ.get("TRITON_CACHE_DIR")
    if not d:
        return None, set()
    try:
        doc = json.loads(Path(d, MANIFEST_NAME).read_text())
        out = set()
        for s in doc.get("specialisations", []):
            out.add(Specialisation(int(s["budget"]), int(s["block"]), int(s["vocab_shard"]), str(s["arch"])))
        return d, out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return d, set()


def record_compiled(cache: str | None, compiled: list[Specialisation], *, capture_bs: list[int], hidden: int,
                    tp: int) -> None:
    """After a start compiled `compiled`, the real Triton cache holds those kernels and a later start
    of the same runtime hits them (no compile line). The emulator has no kernels: the manifest is
    where it remembers them, so they go in only when the manifest was made for the same shapes and
    a capture list that covers this start's. (The real runtime does not write the manifest at
    start; opsctl's stage then runs the AOT fill, which finds every kernel a cache hit.)
    Best effort: a read-only cache stays cold."""
    if not cache or not compiled:
        return
    path = Path(cache, MANIFEST_NAME)
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("format") != 1:
            doc = {}
    except (OSError, ValueError):
        doc = {}
    bs = sorted(set(int(b) for b in capture_bs))
    if doc:
        if (doc.get("hidden"), doc.get("tp")) != (hidden, tp) or not set(bs) <= set(doc.get("capture_bs") or []):
            return
    else:
        doc = {"format": 1, "specialisations": [], "capture_bs": bs, "hidden": hidden, "tp": tp, "dtype": "bf16",
               "filled_by": "start"}
    listed = list(doc.get("specialisations") or [])
    for spec in compiled:
        if spec.as_dict() not in listed:
            listed.append(spec.as_dict())
    doc["specialisations"] = listed
    tmp = path.with_name(f".{MANIFEST_NAME}.{os.getpid()}.tmp")
    try:
        Path(cache).mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass


@dataclass
class Plan:
    """What this start costs, phase by phase, in modelled (site) seconds."""

    scale: float
    init_s: float
    weight_load_s: float
    memory_pool_s: float
    target_captures: list[tuple[int, list[int], float]] = field(default_factory=list)   # (width, bs, s)
    draft_capture_s: float = 0.0
    # a DDTree trial set: the drafter captured once per budget, (budget, bs, s) (draft_capture_s is their sum)
    draft_captures: list[tuple[int, list[int], float]] = field(default_factory=list)
    compiles: list[tuple[Specialisation, float]] = field(default_factory=list)
    compile_cache: str | None = None
    warmup_s: float = 0.0            # the warm-up in all (request + jit_s + vision_s): 0 when skipped
    jit: list = field(default_factory=list)   # cold_modules(): built by the first forward
    jit_s: float = 0.0
    vision_s: float = 0.0            # the warm-up image's MoonViT compile (0 without an image warm-up)
    skip_warmup: bool = False

    @property
    def total_s(self) -> float:
        """Process start to ready (with --skip-server-warmup the JIT builds come after ready, at the
        first request, and are not in it)."""
        return (self.init_s + self.weight_load_s + self.memory_pool_s + sum(s for _, _, s in self.target_captures)
                + self.draft_capture_s + sum(s for _, s in self.compiles) + self.warmup_s)

    def lab(self, modelled_s: float) -> float:
        return modelled_s / self.scale


def plan(*, groups: list[tuple[int, list[int]]], drafted_bs: list[int], budgets: list[int], block: int,
         vocab_shard: int, skip_warmup: bool, dummy_weights: bool,
         draft_groups: list[tuple[int, list[int]]] | None = None, image_warmup: bool = False) -> Plan:
    """`groups`: (num_tokens_per_req, bs) per target graph capture; `drafted_bs`: the drafter's one
    capture, or `draft_groups`: (budget, bs) per drafter capture (a DDTree trial set: once per budget)."""
    c = constants()
    p = Plan(scale=time_scale(), init_s=c["init_s"],
             weight_load_s=c["weight_load_s"] * (0.1 if dummy_weights else 1.0), memory_pool_s=c["memory_pool_s"],
             skip_warmup=skip_warmup)
    dirs = cache_dirs()
    p.jit = cold_modules(c["jit_s"], dirs)
    p.jit_s = sum(m[2] for m in p.jit)
    if image_warmup and not skip_warmup:
        p.vision_s = c["vision_compile_warm_s"] if (dirs["inductor"] / INDUCTOR_MARK).is_file() else \
            c["vision_compile_s"]
    p.warmup_s = 0.0 if skip_warmup else c["warmup_s"] + p.jit_s + p.vision_s
    for width, bs in groups:
        p.target_captures.append((width, bs, len(bs) * (c["capture_per_bs_s"] + c["capture_per_token_s"] * width)))
    if draft_groups is not None:
        p.draft_captures = [(b, bs, len(bs) * c["draft_capture_per_bs_s"]) for b, bs in draft_groups]
        p.draft_capture_s = sum(s for _, _, s in p.draft_captures)
    else:
        p.draft_capture_s = len(drafted_bs) * c["draft_capture_per_bs_s"]
    cache, cached = cached_specialisations()
    p.compile_cache = cache
    for b in sorted(set(x for x in budgets if x > 0)):
        spec = Specialisation(b, block, vocab_shard)
        if spec not in cached:
            p.compiles.append((spec, compile_seconds(b, c["compile_s"])))
    return p


def rank_factor(i: int) -> float:
    """Ranks finish a phase a little apart (deterministic): rank i takes (1 + 0.003 i) of the phase."""
    return 1.0 + 0.003 * i


def fail(msg: str) -> None:
    sys.stdout.write(f"[opsctl-lab] {msg}\n")
    sys.stdout.flush()
    os._exit(2)
