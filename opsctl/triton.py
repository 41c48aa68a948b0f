"""The DDTree draft head's Triton kernels, compiled before the switch (issue #36).

A ddtree server compiles its draft head's Triton kernels at start, once per *specialisation*
(budget, drafter block, vocabulary shard, GPU architecture), seconds to a minute each, unless
its Triton cache already holds them; that time adds to the outage of every switch. The
runtime's AOT filler (`python -m sglang_ddtree.aot`, runtime/src/sglang_ddtree/aot.py)
compiles them with no GPU and lists what it compiled in the cache's manifest,
`opsctl-triton-manifest.json`:

    {"format": 1, "specialisations": [{"budget": 16, "block": 8, "vocab_shard": 20480, "arch": "sm_120"}],
     "capture_bs": [1, 2, ...], "hidden": 7168, "tp": 8, "dtype": "bf16", "runtime": "<wheel sha256>",
     "triton": "3.6.0", ...}

(each listed specialisation has every kernel of every listed batch size). This module says

- what a release needs (`needs_for`, `needs_from`): the budgets it draws a tree with (its
  budget, or each band of its schedule with a tree and a captured batch size, as the runtime
  pre-compiles them), the block, the vocabulary shard (vocab_size // tp), hidden size, TP,
  SGLang's capture list and the GPU architecture;
- whether a manifest covers it (`coverage`): every needed specialisation listed, its batch
  sizes a superset of the release's, hidden size, TP and runtime wheel the same (and the
  Triton version, where the host's is known: Triton's cache keys include it);
- where caches live: on the host one per runtime wheel, `<root>/shared/cache/triton/<sha12>`,
  shared by the releases of that wheel, owned by the service user (a cold start writes
  there), linked from each release as `triton` (TRITON_CACHE_DIR=<root>/current/triton); on
  the controller `<opsctl cache>/triton/<arch>-<sha12>` (`opsctl runtime build --triton-arch`);
- what the stage step does with them (`decide`, `ship_cache`, `compile_on_host`) and how the
  controller fills one (`build_cache`).

Nothing here compiles in this process: the filler runs as a subprocess of a Python that has
torch and triton (the host's SGLang environment, or `--python`).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable

from opsctl import schedule as schedule_mod
from opsctl.artifacts import CACHE_DIR
from opsctl.config import BUILTIN_PROFILES, HostConfig, Inventory, Profile, profile_names
from opsctl.errors import ConfigError, HostError, OpsctlError
from opsctl.host import facts
from opsctl.host.connection import Connection
from opsctl.render import env_python

MANIFEST_NAME = "opsctl-triton-manifest.json"   # sglang_ddtree.aot.MANIFEST_NAME
MANIFEST_FORMAT = 1                             # sglang_ddtree.aot.MANIFEST_FORMAT
AOT_MODULE = "sglang_ddtree.aot"
DTYPE = "bf16"              # the head's weights: the target's LM head, bf16 (the filler's default)
# On the host the filler runs beside a serving server: niced, no GPU, a bounded number of
# compile processes (each imports torch: a few hundred MiB).
HOST_AOT_JOBS = 8
HOST_AOT_TIMEOUT_S = 3600
CPU_S_PER_SPECIALISATION = 30   # measured: one budget = 9 kernels, ~30 s of CPU
_ARCH = re.compile(r"^(?:sm_?)?(\d+)(?:\.(\d+))?$")

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------- what a release needs


def arch_name(text: str) -> str | None:
    """A GPU architecture as the filler names it: "12.0" (nvidia-smi's compute_cap), "sm_120",
    "sm120" or "120" -> "sm_120"; None when it is none of these."""
    m = _ARCH.match(str(text).strip().lower())
    if not m:
        return None
    if m.group(2) is not None:
        return f"sm_{int(m.group(1)) * 10 + int(m.group(2))}"
    return f"sm_{int(m.group(1))}" if int(m.group(1)) >= 10 else None


def require_arch(text: str) -> str:
    arch = arch_name(text)
    if arch is None:
        raise ConfigError(f"--triton-arch {text!r} is not a GPU architecture",
                          "write sm_<compute capability>, e.g. sm_120 (RTX PRO 6000 Blackwell) or sm_90 (H100/H200)")
    return arch


@dataclass(frozen=True, order=True)
class Specialisation:
    """What one compile at start is keyed on (the manifest's entries)."""

    budget: int
    block: int
    vocab_shard: int
    arch: str

    def as_dict(self) -> dict:
        return {"budget": self.budget, "block": self.block, "vocab_shard": self.vocab_shard, "arch": self.arch}

    def describe(self) -> str:
        return f"budget {self.budget} (block {self.block}, vocab shard {self.vocab_shard}, {self.arch})"


@dataclass(frozen=True)
class ModelShape:
    """The target model's sizes the draft head is built from (its LM head: vocab x hidden)."""

    vocab_size: int
    hidden_size: int

    @classmethod
    def from_config(cls, doc: dict | None) -> "ModelShape | None":
        """From a Hugging Face config.json: top level, or its `text_config` (Kimi K2.x, VL models)."""
        if not isinstance(doc, dict):
            return None
        for part in (doc, doc.get("text_config")):
            if isinstance(part, dict):
                vocab, hidden = part.get("vocab_size"), part.get("hidden_size")
                if isinstance(vocab, int) and isinstance(hidden, int) and vocab > 0 and hidden > 0:
                    return cls(vocab, hidden)
        return None


@dataclass(frozen=True)
class Needs:
    """What one release (or one `runtime build`) needs compiled. `budgets`: each over the whole
    capture list (a single-budget release); `schedule`: each band with a tree over the batch
    sizes routed to it (the filler takes both at once, as `--budgets` and `--schedule`)."""

    arch: str
    runtime: str                    # the runtime wheel's sha256
    block: int
    vocab_shard: int
    hidden: int
    tp: int
    capture_bs: tuple[int, ...]
    budgets: tuple[int, ...] = ()
    schedule: str | None = None

    @property
    def tree_budgets(self) -> tuple[int, ...]:
        """Every budget the runtime pre-compiles at start: each listed budget, and each band of the
        schedule with a tree that holds a captured batch size (worker._maybe_build_draft_sampler:
        a band no graph falls in has no head in the capture)."""
        out = set(self.budgets)
        if self.schedule:
            sched = schedule_mod.parse(self.schedule)
            for band, sizes in zip(sched.bands, sched.captured_by_band(list(self.capture_bs))):
                if band.budget > 0 and sizes:
                    out.add(band.budget)
        return tuple(sorted(out))

    @property
    def specialisations(self) -> tuple[Specialisation, ...]:
        return tuple(Specialisation(b, self.block, self.vocab_shard, self.arch) for b in self.tree_budgets)

    def aot_args(self) -> list[str]:
        """The filler's arguments for these needs (without --out and --jobs)."""
        args = ["--arch", self.arch, "--block", str(self.block), "--vocab-shard", str(self.vocab_shard),
                "--hidden", str(self.hidden), "--tp", str(self.tp), "--dtype", DTYPE,
                # the capture list as opsctl computes it (max-running-requests clamps it too)
                "--capture-bs", ",".join(map(str, self.capture_bs)), "--runtime", self.runtime]
        if self.budgets:
            args += ["--budgets", ",".join(map(str, self.budgets))]
        if self.schedule:
            args += ["--schedule", self.schedule]
        return args

    def meta(self, triton_version: str | None = None) -> dict:
        """The manifest's top-level keys a fill for these needs writes."""
        out = {"format": MANIFEST_FORMAT, "runtime": self.runtime, "hidden": self.hidden, "tp": self.tp,
               "dtype": DTYPE, "capture_bs": list(self.capture_bs)}
        if triton_version:
            out["triton"] = triton_version
        return out

    def as_dict(self) -> dict:
        return {"arch": self.arch, "runtime": self.runtime, "block": self.block, "vocab_shard": self.vocab_shard,
                "hidden": self.hidden, "tp": self.tp, "capture_bs": list(self.capture_bs),
                "budgets": list(self.budgets), "schedule": self.schedule,
                "specialisations": [s.as_dict() for s in self.specialisations]}


def needs_for(profile: Profile, shape: ModelShape, *, arch: str, runtime: str) -> Needs | None:
    """What a release of `profile` needs; None for a profile that runs no draft head."""
    if profile.kind != "ddtree":
        return None
    assert profile.block_size is not None and profile.budget is not None
    tp = profile.tp_size
    sched = profile.schedule
    if profile.trial_set:  # a trial release: every draft budget of its candidates (each over every captured size)
        from opsctl.trialset import draft_budgets

        budgets: tuple[int, ...] = tuple(draft_budgets(profile.trial_set))
    else:
        budgets = () if sched else (profile.budget,)
    return Needs(arch=arch, runtime=runtime, block=profile.block_size, vocab_shard=shape.vocab_size // tp,
                 hidden=shape.hidden_size, tp=tp, capture_bs=tuple(profile.captured_batch_sizes),
                 budgets=budgets, schedule=sched.text if sched else None)


def needs_from(*, arch: str, runtime: str, budgets: Iterable[int] = (), schedule: str | None = None,
               block: int, vocab_shard: int, hidden: int, tp: int, max_bs: int) -> Needs:
    """Needs named on the command line (no inventory)."""
    budgets = tuple(sorted({int(b) for b in budgets}))
    if not budgets and not schedule:
        raise ConfigError("nothing to compile: no budget named",
                          "name them with --budgets 8,16 or --schedule 1:16,8:4,32:0 (or take them from an "
                          "inventory with -i)")
    for what, value, low in (("--block", block, 2), ("--vocab-shard", vocab_shard, 1), ("--hidden", hidden, 1),
                             ("--tp", tp, 1), ("--max-bs", max_bs, 1)):
        if value < low:
            raise ConfigError(f"{what} {value} is below {low}", f"give {what} >= {low}")
    for b in budgets:
        if not 1 <= b <= schedule_mod.RUNTIME_MAX_BUDGET:
            raise ConfigError(f"--budgets: budget {b} is out of range (1..{schedule_mod.RUNTIME_MAX_BUDGET})",
                              "use budgets like --budgets 8,16")
    capture = tuple(schedule_mod.captured_batch_sizes(max_bs))
    text = None
    if schedule:
        sched = schedule_mod.parse(schedule, what="--schedule")
        schedule_mod.check_for_server(sched, capture_bs=list(capture), allow_torch_beam=True, what="--schedule")
        text = sched.text
    return Needs(arch=arch, runtime=runtime, block=block, vocab_shard=vocab_shard, hidden=hidden, tp=tp,
                 capture_bs=capture, budgets=budgets, schedule=text)


# --------------------------------------------------------------------------- coverage


@dataclass(frozen=True)
class Coverage:
    covered: bool
    missing: tuple[Specialisation, ...]   # what the first start would compile
    reason: str = ""                      # why not covered, in words

    def as_dict(self) -> dict:
        return {"covered": self.covered, "missing": [s.as_dict() for s in self.missing], "reason": self.reason}


def listed(doc: dict) -> set[Specialisation]:
    out = set()
    for s in doc.get("specialisations") or []:
        try:
            out.add(Specialisation(int(s["budget"]), int(s["block"]), int(s["vocab_shard"]), str(s["arch"])))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _short_bs(xs: Iterable[int]) -> str:
    xs = sorted(xs)
    return ", ".join(map(str, xs)) if len(xs) <= 5 else f"{', '.join(map(str, xs[:4]))}, ... ({len(xs)})"


def _meta_mismatch(doc: dict, meta: dict) -> str:
    """Why `doc`'s kernels are not those a fill described by `meta` needs ('' when they are)."""
    if not doc:
        return "no manifest"
    if doc.get("format") != MANIFEST_FORMAT:
        return f"manifest format {doc.get('format')!r}, not {MANIFEST_FORMAT}"
    if doc.get("runtime") != meta["runtime"]:
        other = str(doc.get("runtime") or "none")[:12]
        return f"written for runtime {other}, not {meta['runtime'][:12]}"
    for key in ("hidden", "tp"):
        if doc.get(key) != meta[key]:
            return f"{key} {doc.get(key)}, the release's is {meta[key]}"
    if doc.get("dtype", DTYPE) != meta["dtype"]:
        return f"dtype {doc.get('dtype')}, the release's is {meta['dtype']}"
    if meta.get("triton") and doc.get("triton") and doc["triton"] != meta["triton"]:
        return f"compiled by Triton {doc['triton']}, the host's is {meta['triton']}"
    try:
        have = {int(b) for b in doc.get("capture_bs") or []}
    except (TypeError, ValueError):
        have = set()
    lack = set(meta["capture_bs"]) - have
    if lack:
        return f"its batch sizes lack {_short_bs(lack)}"
    return ""


def coverage(doc: dict, needs: Needs, *, triton_version: str | None = None) -> Coverage:
    """Whether the cache described by manifest `doc` holds every kernel `needs` compiles at start.
    `triton_version`: the Triton the server runs with, when known (a cache made by another
    Triton is not read by it)."""
    want = needs.specialisations
    why = _meta_mismatch(doc, needs.meta(triton_version))
    if why:
        return Coverage(False, want, why)
    have = listed(doc)
    missing = tuple(s for s in want if s not in have)
    if missing:
        return Coverage(False, missing, "lacks " + ", ".join(s.describe() for s in missing))
    return Coverage(True, ())


def compatible(base: dict, new: dict) -> bool:
    """Whether `base`'s specialisations stay true under `new`'s top-level keys: the same runtime,
    hidden size, TP, dtype and Triton, and every batch size `new` lists compiled for in `base`."""
    meta = {"runtime": new.get("runtime"), "hidden": new.get("hidden"), "tp": new.get("tp"),
            "dtype": new.get("dtype", DTYPE), "triton": new.get("triton"), "capture_bs": new.get("capture_bs") or []}
    return bool(base) and not _meta_mismatch(base, meta)


def merge_manifests(base: dict, new: dict) -> dict:
    """`new` with `base`'s specialisations added where they stay true (`compatible`); else `new`."""
    out = {k: v for k, v in new.items() if k != "fill"}
    if compatible(base, new):
        specs = sorted(listed(base) | listed(new))
    else:
        specs = sorted(listed(new))
    out["specialisations"] = [s.as_dict() for s in specs]
    return out


# --------------------------------------------------------------------------- where caches live


def cache_id(runtime_sha: str) -> str:
    return runtime_sha[:12]


def host_cache_dir(host: HostConfig, runtime_sha: str) -> PurePosixPath:
    return host.install_root / "shared" / "cache" / "triton" / cache_id(runtime_sha)


def release_link_target(runtime_sha: str) -> str:
    """The release's `triton` link, relative like its `drafter` link (prepare.yml)."""
    return f"../../shared/cache/triton/{cache_id(runtime_sha)}"


def controller_cache_dir(runtime_sha: str, arch: str) -> Path:
    """Where `opsctl runtime build --triton-arch` leaves a cache for the deploy to ship."""
    return CACHE_DIR / "triton" / f"{arch}-{cache_id(runtime_sha)}"


def read_local_manifest(directory: Path) -> dict:
    try:
        doc = json.loads((directory / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


# --------------------------------------------------------------------------- the host


@dataclass(frozen=True)
class HostView:
    """What the host says, read in one round trip."""

    arch: str
    shape: ModelShape
    manifest: dict                    # the shared cache's manifest ({}: none)
    packages: dict                    # torch/triton versions in the SGLang environment (None: not installed)

    @property
    def triton_version(self) -> str | None:
        return self.packages.get("triton")

    @property
    def can_compile(self) -> bool:
        return bool(self.packages.get("torch") and self.packages.get("triton"))


def read_host(conn: Connection, host: HostConfig, runtime_sha: str) -> HostView:
    """The GPU architecture, the model's sizes, the shared cache's manifest and the SGLang
    environment's torch/triton, in one round trip. No GPU architecture or no readable model
    config.json: HostError (a ddtree release cannot be sized without them)."""
    model_cfg = f"{host.model.path}/config.json"
    arch, cfg, manifest, packages = facts.gather(
        conn, facts.GpuArch(), facts.JsonFile(model_cfg),
        facts.JsonFile(str(host_cache_dir(host, runtime_sha) / MANIFEST_NAME)),
        facts.PythonPackages(str(env_python(host)), ("torch", "triton")))
    if arch is None:
        raise HostError(f"{host.name}: nvidia-smi reports no GPU compute capability ('{facts.GpuArch().command()}' "
                        "printed nothing): the ddtree runtime's Triton kernels are compiled for the GPU architecture",
                        "check the NVIDIA driver on the host (nvidia-smi lists the GPUs and their compute_cap)")
    manifest = _as_written_for(manifest or {}, runtime_sha)
    shape = ModelShape.from_config(cfg)
    if shape is None:
        raise HostError(f"{host.name}: {model_cfg} is missing or has no vocab_size/hidden_size (top level or "
                        "text_config): the draft head is sized from them",
                        "check opsctl.model.path in the inventory points at the model's directory on the host")
    return HostView(arch, shape, manifest, packages)


def _as_written_for(manifest: dict, runtime_sha: str) -> dict:
    """A manifest a server start wrote (`filled_by: start`: the start compiled its kernels into the
    release's cache and recorded them) names no runtime; the directory it lies in is that
    runtime's own (shared/cache/triton/<runtime sha12>, the release's `triton` link), so it was
    written for `runtime_sha`. Without this a re-deploy of a release whose previous start compiled
    its kernels warned "the first start compiles" and started with no compile (issue #49)."""
    if manifest and manifest.get("filled_by") == "start" and not manifest.get("runtime"):
        return {**manifest, "runtime": runtime_sha}
    return manifest


@dataclass
class Decision:
    """What the stage step does for one release on one host: `complete` (nothing), `ship` (the
    controller's cache), `compile` (on the host, before the switch) or `missing` (the first
    start compiles)."""

    action: str
    needs: Needs
    host_name: str
    host_dir: PurePosixPath
    coverage: Coverage                  # of the host's own cache
    controller_dir: Path | None = None  # ship: the cache shipped
    manifest: dict | None = None        # ship: the merged manifest, written last
    why_not_shipped: str = ""           # a controller cache that exists but does not fit
    env_pending: bool = False           # plan of a host whose SGLang environment this deploy creates

    @property
    def count(self) -> int:
        return len(self.needs.specialisations)

    def missing_line(self) -> str:
        n, arch = len(self.coverage.missing), self.needs.arch
        line = (f"no Triton cache for {arch} on {self.host_name}: the first start compiles {n} specialisation(s); "
                f"build one with 'opsctl runtime build --triton-arch {arch}' to ship it")
        if self.why_not_shipped:
            line += f" (the controller's cache does not fit: {self.why_not_shipped})"
        return line

    def describe(self) -> str:
        """One line for the plan (what the step would do)."""
        arch, n = self.needs.arch, self.count
        if self.action == "complete":
            return f"Triton cache for {arch}: complete ({n} specialisations), no compile at start"
        if self.action == "ship":
            return (f"Triton cache for {arch}: ship the controller's ({self.controller_dir}) into {self.host_dir}: "
                    f"{len(self.coverage.missing)} missing specialisation(s), no compile at start")
        if self.action == "compile":
            when = ("after this deploy creates its SGLang environment, if that has torch and triton (else the "
                    "first start compiles them)") if self.env_pending else "before the switch"
            return (f"Triton cache for {arch}: compile {len(self.coverage.missing)} specialisation(s) on the host "
                    f"{when}; CPU only, niced, about {CPU_S_PER_SPECIALISATION} s of CPU each")
        return self.missing_line()

    def as_dict(self) -> dict:
        return {"action": self.action, "arch": self.needs.arch, "cache": str(self.host_dir),
                "specialisations": [s.as_dict() for s in self.needs.specialisations],
                "missing": [s.as_dict() for s in self.coverage.missing], "reason": self.coverage.reason,
                **({"controller_cache": str(self.controller_dir)} if self.controller_dir else {}),
                **({"env_pending": True} if self.env_pending else {})}

    def outcome(self, state: str, seconds: float, **extra) -> dict:
        """The step's record (plan/outcome details, ledger): state complete|shipped|compiled|missing."""
        return {"state": state, "specialisations": self.count, "arch": self.needs.arch,
                "seconds": round(seconds, 2), "cache": str(self.host_dir), **extra}


def decide(needs: Needs, view: HostView, host: HostConfig, *, env_ready: bool = True) -> Decision:
    """The step's choice: covered -> complete; else a controller cache for (runtime, arch) that
    covers what is missing -> ship; else the host's SGLang environment has torch and triton ->
    compile there; else missing."""
    d = Decision("complete", needs, host.name, host_cache_dir(host, needs.runtime),
                 coverage(view.manifest, needs, triton_version=view.triton_version))
    if d.coverage.covered:
        return d
    ctrl = controller_cache_dir(needs.runtime, needs.arch)
    ctrl_doc = read_local_manifest(ctrl)
    if ctrl_doc:
        merged = merge_manifests(view.manifest, ctrl_doc)
        after = coverage(merged, needs, triton_version=view.triton_version)
        if after.covered:
            d.action, d.controller_dir, d.manifest = "ship", ctrl, merged
            return d
        d.why_not_shipped = after.reason
    if not env_ready:
        d.action, d.env_pending = "compile", True
    elif view.can_compile:
        d.action = "compile"
    else:
        d.action = "missing"
    return d


def plan_release(conn: Connection, host: HostConfig, profile: Profile, runtime_sha: str, *,
                 env_ready: bool = True) -> Decision | None:
    """What the stage step would do for a release of `profile` (None: not a ddtree profile).
    Reads the host, changes nothing."""
    if profile.kind != "ddtree":
        return None
    view = read_host(conn, host, runtime_sha)
    needs = needs_for(profile, view.shape, arch=view.arch, runtime=runtime_sha)
    assert needs is not None
    return decide(needs, view, host, env_ready=env_ready)


def _owner(host: HostConfig) -> str:
    user = host.settings.service_user
    return f"chown -R {shlex.quote(user)}: {{d}} && " if user else ""


def _write_manifest(conn: Connection, host: HostConfig, directory: PurePosixPath, doc: dict) -> None:
    """The manifest, whole or not at all (a start reads it while this runs), owned by the service user."""
    d = shlex.quote(str(directory))
    tmp = shlex.quote(f"{directory}/.{MANIFEST_NAME}.opsctl-new")
    user = host.settings.service_user
    chown = f"chown {shlex.quote(user)}: {tmp} && " if user else ""
    conn.run(f"mkdir -p {d} && cat > {tmp} && {chown}mv -f {tmp} {d}/{MANIFEST_NAME}",
             stdin=json.dumps(doc, indent=1, sort_keys=True) + "\n")


def ship_cache(conn: Connection, host: HostConfig, decision: Decision) -> dict:
    """Send the controller's cache to the host's shared cache directory: one tar stream (put),
    extracted (run), owned by the service user, the merged manifest written last, so a start
    in between never reads a manifest that lists kernels not yet there."""
    assert decision.controller_dir is not None and decision.manifest is not None
    src, dest = decision.controller_dir, decision.host_dir
    files = sorted(p for p in src.rglob("*") if p.is_file() and p.name != MANIFEST_NAME and not p.name.startswith("."))

    def plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tempfile.TemporaryDirectory(prefix="opsctl-triton-") as tmp:
        tar_path = Path(tmp) / "cache.tar.gz"
        with tarfile.open(tar_path, "w:gz") as tar:
            for p in files:
                tar.add(p, arcname=str(p.relative_to(src)), recursive=False, filter=plain)
        size = tar_path.stat().st_size
        remote = f"{dest.parent}/.{dest.name}.opsctl-incoming.tar.gz"
        q, qd = shlex.quote(remote), shlex.quote(str(dest))
        conn.run(f"mkdir -p {qd}")
        conn.put(tar_path, remote, mode=0o600)
        chown = _owner(host).format(d=qd)
        res = conn.run(f"tar -xzf {q} -C {qd} --no-same-owner; rc=$?; rm -f {q}; [ $rc -eq 0 ] && {chown}true",
                       check=False, timeout=600)
        res.check(f"extracting the Triton cache into {dest}", f"check the free space and permissions under {dest}")
    _write_manifest(conn, host, dest, decision.manifest)
    return {"files": len(files), "bytes_sent": size}


def compile_on_host(conn: Connection, host: HostConfig, decision: Decision, release: str, view: HostView, *,
                    on_line: Say = _quiet) -> dict:
    """Run the filler on the host with the release's runtime (PYTHONPATH=<release>/site) and its
    SGLang environment's Python: no GPU (CUDA_VISIBLE_DEVICES=, the serving server keeps its
    GPUs), niced, into the shared cache directory. Returns {"ok", "kernels", "wall_s"} or
    {"ok": False, "error"}: a failed fill costs the start its compile, not the deploy."""
    needs, dest = decision.needs, decision.host_dir
    qd = shlex.quote(str(dest))
    prep = f"mkdir -p {qd}"
    if view.manifest and not compatible(view.manifest, needs.meta(view.triton_version)):
        # the filler merges into the manifest it finds: one for another model, TP, Triton or a
        # shorter capture list would be kept and describe kernels this fill does not make
        prep += f" && rm -f {qd}/{MANIFEST_NAME}"
    site = host.install_root / "releases" / release / "site"
    args = " ".join(shlex.quote(a) for a in [*needs.aot_args(), "--jobs", str(HOST_AOT_JOBS), "--out", str(dest)])
    # cd /: no package in the login directory shadows the release's runtime
    cmd = (f"{prep} && cd / && PYTHONPATH={shlex.quote(str(site))} CUDA_VISIBLE_DEVICES= "
           f"timeout {HOST_AOT_TIMEOUT_S} nice -n 19 {shlex.quote(str(env_python(host)))} -m {AOT_MODULE} {args}")
    res = conn.run(cmd, check=False, timeout=HOST_AOT_TIMEOUT_S + 60, on_stderr_line=on_line)
    chown = _owner(host).format(d=qd)
    if chown:  # kernels written so far belong to the service user either way (its cold start writes there)
        conn.run(chown + "true", check=False)
    if not res.ok:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [f"exit {res.rc}"]
        return {"ok": False, "error": f"exit {res.rc}: {tail[0][:300]}"}
    doc = _last_json(res.stdout)
    fill = doc.get("fill") or {}
    return {"ok": True, "kernels": fill.get("distinct_kernels"), "wall_s": fill.get("wall_s")}


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return {}


# --------------------------------------------------------------------------- the controller's cache


def check_python(python: str | None) -> tuple[str, str]:
    """(the Python the filler runs with, its Triton version). Default: this interpreter, when it
    has torch and triton."""
    explicit = python is not None
    python = python or sys.executable
    try:
        proc = subprocess.run([python, "-c", "import torch, triton; print(triton.__version__)"],
                              capture_output=True, text=True, timeout=300)
    except OSError as exc:
        raise ConfigError(f"--python {python}: {exc.strerror or exc}",
                          "name a Python with torch and triton, e.g. --python .venv-sglang/bin/python") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["exit " + str(proc.returncode)])[-1]
        what = f"--python {python}" if explicit else f"this Python ({python})"
        raise ConfigError(f"{what} cannot import torch and triton to compile the Triton cache: {tail[:200]}",
                          "name a Python that has both with --python, e.g. --python .venv-sglang/bin/python")
    return python, proc.stdout.strip().splitlines()[-1]


def needs_for_inventory(inv: Inventory, limit: str | None, *, arch: str, runtime: str,
                        budgets: Iterable[int] = (), schedule: str | None = None,
                        vocab_size: int | None = None, hidden: int | None = None,
                        connect: Callable | None = None) -> tuple[list[Needs], list[str]]:
    """Every ddtree profile's needs on the selected hosts: each profile as the inventory sets it,
    or with each of `budgets` / with `schedule` (as 'deploy PROFILE --budget N' would). The model's
    sizes: `vocab_size` and `hidden` when both are given, else the model's config.json read on
    each host. Returns (needs, what was skipped and why)."""
    budgets = sorted({int(b) for b in budgets})
    needs: list[Needs] = []
    skipped: list[str] = []
    shapes: dict[str, ModelShape] = {}
    for host in inv.select(limit):
        names = [n for n in profile_names(host.settings.profiles) if _kind(host, n) == "ddtree"]
        profiles: list[Profile] = []
        for name in names:
            variants = ([{"budget": b} for b in budgets] + ([{"budget_schedule": schedule}] if schedule else [])
                        or [{}])
            for v in variants:
                try:
                    profiles.append(host.profile(name, **v))
                except ConfigError as exc:
                    if v:
                        raise
                    skipped.append(f"{host.name}: {name}: {exc.problem} (name budgets with --budgets or --schedule)")
        if not profiles:
            continue
        if vocab_size and hidden:
            shape = ModelShape(vocab_size, hidden)
        else:
            key = f"{host.name}:{host.model.path}"
            if key not in shapes:
                shapes[key] = _read_shape(host, connect)
            shape = shapes[key]
        for prof in profiles:
            n = needs_for(prof, shape, arch=arch, runtime=runtime)
            if n is not None and n not in needs:
                needs.append(n)
    return needs, skipped


def _kind(host: HostConfig, name: str) -> str | None:
    return {**BUILTIN_PROFILES.get(name, {}), **host.settings.profiles.get(name, {})}.get("kind")


def _read_shape(host: HostConfig, connect: Callable | None) -> ModelShape:
    from opsctl.host.connection import connect as ssh_connect

    conn = (connect or ssh_connect)(host)
    try:
        path = f"{host.model.path}/config.json"
        shape = ModelShape.from_config(facts.get(conn, facts.JsonFile(path)))
    finally:
        conn.close()
    if shape is None:
        raise HostError(f"{host.name}: {path} is missing or has no vocab_size/hidden_size",
                        "check opsctl.model.path, or give the model's sizes with --vocab-size and --hidden")
    return shape


def fill_groups(needs: list[Needs]) -> list[Needs]:
    """The filler runs for `needs`: one manifest describes one hidden size, TP and capture list
    (refused otherwise); per block, one run with every single budget and the first schedule,
    then one per further schedule (the filler takes one schedule at a time)."""
    if not needs:
        raise ConfigError("nothing to compile: no ddtree profile with a budget",
                          "name budgets with --budgets 8,16 or --schedule 1:16,8:4,32:0")
    keys = {(n.hidden, n.tp, n.capture_bs, n.runtime, n.arch) for n in needs}
    if len(keys) > 1:
        shown = "; ".join(f"hidden {h}, tp {tp}, max bs {max(cap)}" for h, tp, cap, _, _ in sorted(keys))
        raise ConfigError(f"these profiles need Triton caches of different shapes ({shown}); one cache "
                          "describes one hidden size, TP and capture list",
                          "build them one at a time (--limit HOST, or name the budgets and --tp/--max-bs without -i)")
    runs: list[Needs] = []
    for block in sorted({n.block for n in needs}):
        of_block = [n for n in needs if n.block == block]
        single = tuple(sorted({b for n in of_block for b in n.budgets}))
        schedules = list(dict.fromkeys(n.schedule for n in of_block if n.schedule))
        base = of_block[0]
        first = schedules[0] if schedules else None
        runs.append(Needs(base.arch, base.runtime, block, base.vocab_shard, base.hidden, base.tp, base.capture_bs,
                          single, first))
        runs += [Needs(base.arch, base.runtime, block, base.vocab_shard, base.hidden, base.tp, base.capture_bs,
                       (), s) for s in schedules[1:]]
    return runs


@dataclass
class CacheBuild:
    arch: str
    runtime: str
    python: str
    triton_version: str
    directory: Path              # DIR/triton-<arch>-<sha12>
    controller_dir: Path         # what the deploy ships
    runs: list[Needs]
    manifest: dict
    seconds: float
    kernels: int
    skipped: list[str] = field(default_factory=list)

    @property
    def specialisations(self) -> list[Specialisation]:
        return sorted(listed(self.manifest))

    def as_dict(self) -> dict:
        return {"arch": self.arch, "runtime": self.runtime, "python": self.python,
                "triton_version": self.triton_version, "directory": str(self.directory),
                "controller_cache": str(self.controller_dir),
                "specialisations": [s.as_dict() for s in self.specialisations],
                "capture_bs": self.manifest.get("capture_bs"), "hidden": self.manifest.get("hidden"),
                "tp": self.manifest.get("tp"), "kernels": self.kernels, "seconds": round(self.seconds, 2),
                "runs": [r.as_dict() for r in self.runs], "skipped": self.skipped}


def build_cache(wheel: Path, runtime_sha: str, needs: list[Needs], out: Path, *,
                compiler: tuple[str, str] | None = None, say: Say = _quiet,
                skipped: list[str] | None = None) -> CacheBuild:
    """Compile `needs` with the runtime from `wheel` into the controller's cache for (runtime,
    arch), which the deploy ships, and copy that cache to `out/triton-<arch>-<sha12>/`.
    `compiler`: (python, its Triton version) from `check_python` (default: this Python)."""
    runs = fill_groups(needs)
    python, version = compiler or check_python(None)
    arch = runs[0].arch
    ctrl = controller_cache_dir(runtime_sha, arch)
    ctrl.mkdir(parents=True, exist_ok=True)
    existing = read_local_manifest(ctrl)
    if existing and not compatible(existing, runs[0].meta(version)):
        # the filler merges into the manifest it finds; one for another shape would stay listed
        (ctrl / MANIFEST_NAME).unlink()
    t0 = time.monotonic()
    kernels = 0
    with tempfile.TemporaryDirectory(prefix="opsctl-triton-site-") as tmp:
        site = Path(tmp) / "site"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
        env = {**os.environ, "PYTHONPATH": str(site), "CUDA_VISIBLE_DEVICES": ""}
        for run in runs:
            n = len(run.specialisations)
            say(f"compiling {n} Triton specialisation(s) for {arch} "
                f"({', '.join(s.describe() for s in run.specialisations)}); about {CPU_S_PER_SPECIALISATION} s of "
                "CPU each")
            cmd = [python, "-m", AOT_MODULE, *run.aot_args(), "--out", str(ctrl)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
            if proc.returncode != 0:
                tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [f"exit {proc.returncode}"]
                raise OpsctlError(f"the Triton cache fill failed ({' '.join(cmd[:3])} ...): {tail[0][:300]}",
                                  f"run the command with PYTHONPATH={site} to see its whole output")
            kernels += int((_last_json(proc.stdout).get("fill") or {}).get("distinct_kernels") or 0)
    manifest = read_local_manifest(ctrl)
    target = out / f"triton-{arch}-{cache_id(runtime_sha)}"
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".{target.name}.opsctl-new"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(ctrl, staging)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return CacheBuild(arch, runtime_sha, python, version, target, ctrl, runs, manifest, time.monotonic() - t0,
                      kernels, list(skipped or []))
