"""Start-up phases of one SGLang start, read from its journal, and a start compared with the last.

Each phase carries its seconds from the line SGLang prints for it when there is one, else from
the journal's clock:

| phase                       | from                                                                     |
| --------------------------- | ------------------------------------------------------------------------ |
| `weight_load`               | `Load weight end. elapsed=X s` (the slowest rank)                        |
| `capture <kind> width <W>`  | each `Capture <kind> CUDA graph end. ... elapsed=X s` (0.5.23), or       |
|                             | `Capture cuda graph end. Time elapsed: X s` (up to 0.5.10); per graph,   |
|                             | the slowest rank; DDTree: the band's budget is W - 1                     |
| `draft_capture`             | the draft graph's end line, less the runtime's compile that ran inside it |
| `draft_capture budget <B>`  | a DDTree trial set: the drafter's capture after `DDTree trial draft budget |
|                             | B`, less budget B's compile (which ran inside it)                        |
| `compile budget <B>`        | the DDTree runtime's `DDTREE Triton compile: budget=B, ..., elapsed=X s` |
| `jit`                       | the first forward's JIT builds into a cold cache: FlashInfer's         |
|                             | `flashinfer.jit: Building JIT module NAME` lines (SGLang's own JIT says   |
|                             | nothing at INFO), the clock from the first to the line after the last    |
| `warmup`                    | the clock from `Uvicorn running on` (or the last start-up line) to ready, |
|                             | less the JIT builds                                                      |
| `other`                     | total less the phases above (process start, NCCL init, KV cache, ...)     |
| total                       | the clock from the start's first line to `The server is fired up ...`    |

The lab's SGLang emulator models a start at the site's scale and runs it faster by its time
scale; its `[opsctl-lab] start-up at the site's scale: total=X s, warm-up=Y s (lab Z s, time
scale N)` line gives the clock-measured figures at the site's scale (its other lines already
carry modelled seconds), and `time_scale` says so.

What a switch keeps of its start (`Startup.as_record`, the `startup` of the ledger's `switch`
record), the block a deploy, rollback or tune trial prints after ready (`describe`), the last start
of a release (`last_start`) and the previous start of a profile (`previous_start`) are here too.

Standard library only (no typer, rich or pydantic at import); `SlowerStart.finding()` builds the
project's `Finding`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

# opsctl.journal is imported by parse() and phase_label(), which read or name a journal's lines:
# `opsctl status --json` and `history --json` read the ledger's start records only

SLOWER = 0.30       # a start this much slower than the previous start of the same profile is a finding

_COMPILE = re.compile(r"^DDTREE Triton compile: budget=(?P<budget>\d+), block=(?P<block>\d+), "
                      r"vocab_shard=(?P<vocab>\d+), arch=(?P<arch>\w+), elapsed=(?P<s>[\d.]+) s")
_LAB = re.compile(r"^\[opsctl-lab\] start-up at the site's scale: total=(?P<total>[\d.]+) s, "
                  r"warm-up=(?P<warmup>[\d.]+) s(?:, jit=(?P<jit>[\d.]+) s)? \(lab (?P<lab>[\d.]+) s, time scale (?P<scale>[\d.eE+]+)\)")
_LOAD_END = re.compile(r"^Load weight end\.(?:.*?\belapsed=(?P<s>[\d.]+) s)?")
_UVICORN = re.compile(r"^INFO:\s+Uvicorn running on ")
# FlashInfer 0.7.2's cold build (flashinfer/jit/core.py JitSpec.build, its own logger and format)
JIT_BUILD = re.compile(r"flashinfer\.jit: Building JIT module (?P<name>[^;\s]+)")
_DDTREE_ALGOS = {"DDTREE"}


@dataclass(frozen=True)
class Phase:
    key: str                     # unique within a start: "weight_load", "capture target verify width 17", ...
    seconds: float | None
    source: str                  # "line" (SGLang's own elapsed), "clock" (journal timestamps), "lab", "rest"
    line: int | None = None      # where it was read (1-based), None for derived phases
    kind: str | None = None      # capture kind ("target verify", "target decode", "draft decode", "legacy")
    width: int | None = None     # num_tokens_per_req of a capture
    budget: int | None = None    # DDTree: the band's budget (width - 1) / the compile's specialisation
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out: dict[str, Any] = {"phase": self.key, "seconds": self.seconds, "source": self.source}
        for k in ("line", "kind", "width", "budget"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.detail:
            out.update(self.detail)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Phase":
        known = ("phase", "seconds", "source", "line", "kind", "width", "budget")
        return cls(str(d.get("phase")), d.get("seconds"), str(d.get("source") or "record"), d.get("line"),
                   d.get("kind"), d.get("width"), d.get("budget"), {k: v for k, v in d.items() if k not in known})


@dataclass(frozen=True)
class Startup:
    phases: list[Phase]
    ready: bool
    total_s: float | None
    total_source: str | None     # "clock", "lab" or "sum" (no timestamps: the phases added up)
    time_scale: float | None = None   # the lab emulator's; None for a real server
    lab_s: float | None = None        # the lab's own start-to-ready seconds (emulator only)
    ddtree: bool = False              # a DDTree server: its runtime compiles (or finds cached) Triton kernels

    def phase(self, key: str) -> Phase | None:
        return next((p for p in self.phases if p.key == key), None)

    def seconds(self) -> dict[str, float]:
        return {p.key: p.seconds for p in self.phases if p.seconds is not None}

    def as_dict(self) -> dict:
        return {"ready": self.ready, "total_s": self.total_s, "total_source": self.total_source,
                "time_scale": self.time_scale, "lab_s": self.lab_s, "ddtree": self.ddtree,
                "phases": [p.as_dict() for p in self.phases]}

    def as_record(self, profile: str | None) -> dict:
        """The `startup` of the switch's ledger record: every phase, and the profile (its slug,
        `ddtree-b16`, the release id's prefix) that the next start of it is compared with."""
        return {"profile": profile, **self.as_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "Startup":
        """Back from `as_dict`/`as_record`; also the first switch records' `{"phases": {key: s}}`."""
        raw = d.get("phases") or []
        phases = ([Phase(k, v, "record") for k, v in raw.items()] if isinstance(raw, dict)
                  else [Phase.from_dict(p) for p in raw if isinstance(p, dict)])
        return cls(phases, bool(d.get("ready", True)), d.get("total_s"), d.get("total_source"),
                   time_scale=d.get("time_scale"), lab_s=d.get("lab_s"), ddtree=bool(d.get("ddtree")))


def _slowest(events: Iterable[tuple[float | None, int]]) -> tuple[float | None, int | None]:
    best: tuple[float | None, int | None] = (None, None)
    for s, line in events:
        if s is not None and (best[0] is None or s > best[0]):
            best = (s, line)
    return best


def parse(source: Any) -> Startup:
    """The phases of the last start in `source` (journal text, `journalctl -o json` entries, or a
    `journal.ParsedJournal`); within it, the last server process (a crash and restart inside one
    start counts the process that got ready, or the last one)."""
    from opsctl import journal

    parsed = source if isinstance(source, journal.ParsedJournal) else journal.parse(source)
    start = journal.starts(parsed)[-1]
    proc = start.latest_process
    if start.ready:   # the process that printed the ready line
        proc = start.ready[-1].process
    lines = [ln for ln in start.lines if ln.process == proc]
    algo = None
    for sa in start.server_args:
        if sa.line.process == proc:
            algo = str(sa.args.get("speculative_algorithm") or "") .upper() or None
    ddtree = algo in _DDTREE_ALGOS or any(s.line.process == proc for s in start.schedules)

    phases: list[Phase] = []
    # weight loading (every rank prints it; the start waits for the slowest)
    load_ends = [(ln, _LOAD_END.match(ln.text)) for ln in lines]
    load_ends = [(ln, m) for ln, m in load_ends if m]
    s, at = _slowest((float(m["s"]) if m["s"] else None, ln.line_no) for ln, m in load_ends)
    if load_ends:
        src = "line"
        if s is None:   # 0.4.x prints no elapsed: the clock from the first begin to the last end
            begin = next((ln for ln in lines if ln.text.startswith("Load weight begin") and ln.timestamp), None)
            end = load_ends[-1][0]
            at = end.line_no
            src = "clock" if begin is not None and end.timestamp is not None else "none"
            s = (end.timestamp - begin.timestamp).total_seconds() if src == "clock" else None
        phases.append(Phase("weight_load", s, src, at))

    # the runtime's compile, per specialisation (TP0)
    compiles: dict[int, Phase] = {}
    for ln in lines:
        m = _COMPILE.match(ln.text)
        if m:
            b = int(m["budget"])
            compiles[b] = Phase(f"compile budget {b}", float(m["s"]), "line", ln.line_no, budget=b,
                                detail={"block": int(m["block"]), "vocab_shard": int(m["vocab"]), "arch": m["arch"]})
    compile_total = sum(p.seconds or 0.0 for p in compiles.values())

    # captures: one phase per graph (kind, width; a trial set's drafter per budget), the slowest rank's elapsed
    groups: dict[tuple[str, int | None, int | None], list] = {}
    for cap in start.captures_of(proc):
        trial = cap.trial if cap.kind.startswith("draft") else None
        groups.setdefault((cap.kind, cap.num_tokens_per_req, trial), []).append(cap)
    for (kind, width, trial), caps in groups.items():
        s, at = _slowest((c.elapsed_s, c.begin.line.line_no) for c in caps)
        complete = all(c.complete for c in caps)
        draft = kind.startswith("draft")
        if draft and trial is not None:   # one budget's drafter capture: that budget's compile ran inside it
            key = f"draft_capture budget {trial}"
            if s is not None and trial in compiles:
                s = round(max(s - (compiles[trial].seconds or 0.0), 0.0), 2)
        elif draft:
            key = "draft_capture" if width is None else f"draft_capture width {width}"
            if s is not None and compiles:
                s = round(max(s - compile_total, 0.0), 2)   # the runtime's compile ran inside the draft capture
        else:
            label = "capture" if kind == journal.LEGACY else f"capture {kind}"   # `Capture cuda graph end` (<= 0.5.10)
            key = label + (f" width {width}" if width is not None else "")
        budget = width - 1 if (ddtree and kind == "target verify" and width is not None) else trial
        detail: dict[str, Any] = {}
        if not complete:
            detail["complete"] = False
        bs = next((c.bs for c in caps if c.bs), None)
        if bs:
            detail["bs"] = [min(bs), max(bs)] if len(bs) > 1 else list(bs)
            detail["graphs"] = len(set(bs))   # a capture's cost is its graphs (tune's projection)
        phases.append(Phase(key, s, "line", at, kind=kind, width=width, budget=budget, detail=detail))
    phases.extend(compiles.values())

    # ready, warm-up, total
    ready_lines = [ln for ln in start.ready if ln.process == proc]
    ready = ready_lines[-1] if ready_lines else None
    lab = None
    for ln in lines:
        m = _LAB.match(ln.text)
        if m:
            lab = m
    first = next((ln for ln in lines if ln.timestamp is not None), None)
    total_s = total_src = None
    warm_s = None
    warm_src = "clock"
    if lab is not None:
        total_s, total_src = float(lab["total"]), "lab"
        warm_s, warm_src = float(lab["warmup"]), "lab"
    elif ready is not None and ready.timestamp is not None:
        if first is not None and first.timestamp is not None:
            total_s, total_src = (ready.timestamp - first.timestamp).total_seconds(), "clock"
        before = [ln for ln in lines if ln.line_no < ready.line_no and ln.timestamp is not None]
        uv = [ln for ln in before if _UVICORN.match(ln.text)]
        startup_marks = [ln for ln in before if journal.parse_capture(ln) or _LOAD_END.match(ln.text)
                         or ln.text.startswith(("Memory pool end", "max_total_num_tokens="))]
        mark = uv[-1] if uv else (startup_marks[-1] if startup_marks else None)
        if mark is not None:
            warm_s = (ready.timestamp - mark.timestamp).total_seconds()
    builds = [ln for ln in lines if JIT_BUILD.search(ln.text) and (ready is None or ln.line_no < ready.line_no)]
    if builds:
        jit_s = None
        if lab is not None and lab["jit"] is not None:
            jit_s = float(lab["jit"])
        else:
            after = next((ln for ln in lines if ln.line_no > builds[-1].line_no and ln.timestamp is not None), None)
            if builds[0].timestamp is not None and after is not None:
                jit_s = (after.timestamp - builds[0].timestamp).total_seconds()
        if jit_s is not None and warm_s is not None:
            jit_s = min(jit_s, warm_s)
            warm_s = round(warm_s - jit_s, 2)
        phases.append(Phase("jit", jit_s, "lab" if lab is not None and lab["jit"] is not None else "clock",
                            builds[0].line_no,
                            detail={"flashinfer_modules": sorted({JIT_BUILD.search(ln.text)["name"] for ln in builds})}))
    if ready is not None and warm_s is not None:
        phases.append(Phase("warmup", warm_s, warm_src, ready.line_no))
    known = sum(p.seconds or 0.0 for p in phases)
    if total_s is None and ready is not None and phases:
        total_s, total_src = known, "sum"
    elif total_s is not None and total_s - known > 0.5:
        phases.append(Phase("other", round(total_s - known, 2), "rest"))
    return Startup(phases, ready is not None, total_s, total_src,
                   time_scale=float(lab["scale"]) if lab else None, lab_s=float(lab["lab"]) if lab else None,
                   ddtree=ddtree)


# --------------------------------------------------------------------------- comparison

_FIX = {
    "weight_load": "weights loaded slower: a cold page cache or a slower disk/NFS path, or a loader without "
                   "multithreading (--model-loader-extra-config '{\"enable_multithread_load\": true}')",
    "capture": "more graphs were captured (a new band, a larger --cuda-graph-max-bs-decode, more batch sizes) "
               "or each capture got slower; compare the bs lists of both starts",
    "draft_capture": "the drafter's graphs took longer: more batch sizes with a tree, or a larger block",
    "compile": "the DDTree runtime compiled its Triton kernels at start: pre-fill the release's Triton cache "
               "(TRITON_CACHE_DIR with opsctl-triton-manifest.json) for every specialisation before the switch",
    "warmup": "the warm-up request took longer: a cold JIT cache (FlashInfer, DeepGEMM) or autotuning; keep the "
              "JIT caches on the host between releases",
    "jit": "the first forward built JIT kernels into a cold cache: a new SGLang/FlashInfer/torch (each keys its "
           "cache by version), or SGLANG_CACHE_DIR not the host's shared one (shared/cache/jit)",
    "other": "time outside the phases SGLang reports grew: process start, NCCL init, KV-cache allocation",
}


@dataclass(frozen=True)
class SlowerStart:
    """The comparison of a start with the previous start of the same profile."""

    previous_s: float | None
    current_s: float | None
    ratio: float | None                  # current / previous
    slower: bool                         # at least SLOWER more
    phase: str | None                    # the phase that grew the most (seconds)
    deltas: dict[str, float]             # phase -> seconds more (negative: less), every phase of either start
    threshold: float = SLOWER
    profile: str | None = None           # what both starts were of (`ddtree-b16`)
    phase_label: str | None = None       # `phase` in words ("weight load")
    phase_previous_s: float | None = None   # `phase`'s seconds in the previous start (None: it had none)
    phase_current_s: float | None = None

    def as_dict(self) -> dict:
        return {"previous_s": self.previous_s, "current_s": self.current_s, "ratio": self.ratio,
                "slower": self.slower, "phase": self.phase, "deltas": self.deltas, "threshold": self.threshold,
                "profile": self.profile, "phase_label": self.phase_label,
                "phase_previous_s": self.phase_previous_s, "phase_current_s": self.phase_current_s}

    def diagnosis(self) -> str:
        """`this start took 9 min 40 s, 31 % more than the last start of ddtree-b16 (7 min 22 s);
        weight load grew most (36.0 s -> 2 min 50 s)`."""
        of = self.profile or "this profile"
        if self.ratio is None:
            return f"no earlier start of {of} to compare with (or a start that never got ready)"
        pct = (self.ratio - 1.0) * 100
        head = (f"this start took {human_s(self.current_s)}, {abs(pct):.0f} % {'more' if pct >= 0 else 'less'} "
                f"than the last start of {of} ({human_s(self.previous_s)})")
        if self.phase is None:
            return head
        before = human_s(self.phase_previous_s) if self.phase_previous_s is not None else "none"
        return head + f"; {self.phase_label or self.phase} grew most ({before} -> {human_s(self.phase_current_s)})"

    def finding(self):
        """`startup.slower`, a warning: reported and recorded, it fails no gate by itself."""
        from opsctl.findings import Finding   # pydantic: imported only when asked

        base = self.phase.split(" ")[0] if self.phase else ""
        return Finding(check="startup.slower", ok=not self.slower, severity="warning", diagnosis=self.diagnosis(),
                       fix=_FIX.get(base, "") if self.slower else "", details=self.as_dict())


def compare(previous: Startup | None, current: Startup, *, threshold: float = SLOWER,
            profile: str | None = None) -> SlowerStart:
    """`current` against `previous` (the host's previous start of the same profile): slower when its
    total is at least `threshold` (30 %) above; names the phase whose seconds grew the most."""
    if previous is None or not previous.total_s or current.total_s is None:
        return SlowerStart(previous.total_s if previous else None, current.total_s, None, False, None, {}, threshold,
                           profile)
    a, b = previous.seconds(), current.seconds()
    deltas = {k: round(b.get(k, 0.0) - a.get(k, 0.0), 2) for k in list(a) + [k for k in b if k not in a]}
    ratio = current.total_s / previous.total_s
    grown = {k: d for k, d in deltas.items() if d > 0}
    phase = max(grown, key=lambda k: grown[k]) if grown else None
    grew = current.phase(phase) if phase else None
    return SlowerStart(previous.total_s, current.total_s, round(ratio, 4), ratio >= 1.0 + threshold - 1e-9,
                       phase, deltas, threshold, profile, phase_label(grew) if grew else None,
                       a.get(phase) if phase else None, b.get(phase) if phase else None)


# --------------------------------------------------------------------------- the ledger's starts


def _ready_start(rec: dict) -> dict | None:
    """A switch record's start, when that start got ready and was read (else None)."""
    st = rec.get("startup")
    if rec.get("action") != "switch" or rec.get("result") == "not-ready" or not isinstance(st, dict):
        return None
    return st if st.get("total_s") else None


def previous_start(ledger: list[dict], profile: str) -> dict | None:
    """The newest switch record of `ledger` whose start (ready, with a total) was of `profile`."""
    for rec in reversed(ledger):
        st = _ready_start(rec)
        if st is not None and st.get("profile") == profile:
            return rec
    return None


def last_start(ledger: list[dict], release: str | None) -> dict | None:
    """`release`'s last start that got ready: its phases and total, with when and why it started."""
    if not release:
        return None
    for rec in reversed(ledger):
        st = _ready_start(rec)
        if st is not None and rec.get("to_release") == release:
            return {"release": release, "ts": rec.get("ts"), "why": rec.get("why"), **st}
        if unrecorded_start(rec) and rec.get("to_release") == release:
            # the switch is on the host's record, its start on nobody's (the controller was lost, or
            # is waiting for it now): this start, without phases, never an earlier one (issue #50)
            return {"release": release, "ts": rec.get("ts"), "why": rec.get("why"), "total_s": None,
                    "phases": None, "recorded": False, "switch_id": rec.get("switch_id"), "who": rec.get("who")}
    return None


def unrecorded_start(rec: dict) -> bool:
    """A switch recorded on the host (bin/opsctl-switch) whose start no controller recorded after it."""
    return rec.get("action") == "switch" and rec.get("result") == "switched" and rec.get("by") == "opsctl-switch"


def jit_outlook(cache: dict, ledger: list[dict], cache_dir: str) -> dict:
    """Whether the next start will find the JIT caches warm (issue #51), from what the shared cache
    holds (facts.JitCaches) and the host's last start that got ready (any release: the caches are
    shared, each keyed by the versions that built it): warm when that start's JIT builds (its `jit`
    phase's FlashInfer modules, none when it found them built) are all still in the cache."""
    fi = {m for mods in (cache.get("flashinfer") or {}).values() for m in mods}
    n_fi, n_sg = len(fi), len(cache.get("sglang_jit") or [])
    last = None
    for rec in reversed(ledger):
        st = _ready_start(rec)
        if st is not None:
            last = {"release": rec.get("to_release"), "ts": rec.get("ts"), **st}
            break
    out: dict[str, Any] = {"dir": cache_dir, "flashinfer": cache.get("flashinfer") or {},
                           "sglang_jit": n_sg, "inductor_files": cache.get("inductor_files", 0),
                           "last_start": last["release"] if last else None}
    held = f"{n_fi} FlashInfer module(s), {n_sg} SGLang JIT build(s)"
    if not n_fi and not n_sg:
        return {**out, "warm": False, "why": f"empty ({cache_dir}): the next start builds FlashInfer's and "
                                              "SGLang's JIT kernels in its warm-up (minutes at the site)"}
    if last is None:
        return {**out, "warm": None, "why": f"{held} cached; no ready start on record to say what a start needs"}
    jit = next((p for p in last.get("phases") or [] if isinstance(p, dict) and p.get("phase") == "jit"), None)
    built = set((jit or {}).get("flashinfer_modules") or [])
    missing = sorted(built - fi)
    if missing:
        return {**out, "warm": False, "why": f"{held}; {len(missing)} module(s) the last start built are gone "
                                              f"({', '.join(missing[:3])}): the next start builds them again"}
    how = (f"its {len(built)} FlashInfer build(s) are there" if built else "it found every module built")
    return {**out, "warm": True, "why": f"{held} cached; the last start ({last['release']}) got ready and {how}"}


def compare_with_ledger(current: Startup, profile: str, ledger: list[dict]) -> tuple[SlowerStart, dict | None]:
    """`current` against the previous start of `profile` in `ledger` (the switch record read, or None)."""
    prev = previous_start(ledger, profile)
    return compare(Startup.from_dict(prev["startup"]) if prev else None, current, profile=profile), prev


# --------------------------------------------------------------------------- wording


def human_s(seconds: float | None) -> str:
    """`36.0 s`, `7 min 31 s`, `1 h 5 min`; `?` for None."""
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    return f"{h} h {m} min"


def _lab_s(seconds: float) -> str:
    # the lab runs a start hundreds of times faster: its phases take hundredths of a second
    if seconds < 1:
        return f"{seconds:.3f} s"
    return f"{seconds:.2f} s" if seconds < 60 else human_s(seconds)


def _bs(p: Phase) -> str:
    bs = p.detail.get("bs")
    if not bs:
        return ""
    return f" (bs {bs[0]})" if len(bs) == 1 or bs[0] == bs[-1] else f" (bs {bs[0]}-{bs[-1]})"


def _kind_of_key(key: str) -> str:
    """A capture's kind from its key alone (a record that kept only `{key: seconds}`)."""
    if key.startswith("draft"):
        return "draft"
    m = re.match(r"^capture (?P<kind>.+?)(?: width \d+)?$", key)
    return m["kind"] if m and not m["kind"].startswith("width") else ""


def phase_label(p: Phase) -> str:
    """A phase in words: `weight load`, `target verify graphs b16 (bs 1-64)`, `draft decode graphs
    (bs 1-64)`, `Triton compile b16`, `warm-up`, `other`."""
    from opsctl import journal

    if p.key == "weight_load":
        return "weight load"
    if p.key == "warmup":
        return "warm-up"
    if p.key == "jit":
        n = len(p.detail.get("flashinfer_modules") or [])
        return f"JIT builds (cold cache: {n} FlashInfer module{'s' if n != 1 else ''} and SGLang's)"
    if p.key == "other":
        return "other (process start, NCCL, KV cache)"
    if p.key.startswith("compile"):
        return f"Triton compile b{p.budget}" if p.budget is not None else "Triton compile"
    if p.key.startswith(("capture", "draft_capture")):
        kind = p.kind or _kind_of_key(p.key)
        if kind == journal.LEGACY:
            name = "CUDA graphs"
        elif kind == "draft":    # (a record without the kind)
            name = "draft graphs"
        else:
            name = f"{kind} graphs" if kind else "CUDA graphs"
        width = p.width
        if width is None:   # (a record without the width: the key has it)
            m = re.search(r" width (\d+)$", p.key)
            width = int(m[1]) if m else None
        if p.budget is not None:
            name += f" b{p.budget}"
        elif width is not None and not kind.startswith("draft") and width > 1:
            name += f" width {width}"
        return name + _bs(p) + ("" if p.detail.get("complete", True) else ", not finished")
    return p.key


NO_COMPILE = "no Triton compile (cache complete)"


def _items(st: Startup, seconds) -> list[str]:
    """Each phase, in the journal's order; a DDTree start without a compile line says so where the
    compile runs (inside the draft capture)."""
    items: list[str] = []
    compiled = any(p.key.startswith("compile") for p in st.phases)
    said = not st.ddtree or compiled
    for p in st.phases:
        if not said and p.key in ("warmup", "other"):
            items.append(NO_COMPILE)
            said = True
        items.append(f"{phase_label(p)} {seconds(p.seconds)}")
    if not said:
        items.append(NO_COMPILE)
    return items


def describe(start: dict | None, *, lab_line: bool = True) -> list[str]:
    """The start-up block a deploy, rollback or tune trial prints after ready, from the switch
    record's `startup` (`as_record`): the total and every phase at the site's scale; in the lab a
    second line with the same phases in the lab's seconds; then the comparison with the previous
    start of the profile when there is one (`WARN startup.slower: ...` when slower):

        start-up 7 min 45 s at the site (0.931 s in the lab, time scale 500), ddtree-b16: weight load
        36.8 s · target verify graphs b16 (bs 1-64) 3 min 6 s · ... · warm-up 3 min · other (...) 12.8 s
          in the lab: weight load 0.074 s · ...
    """
    if not start:
        return ["start-up: not read (no journal of this start)"]
    st = Startup.from_dict(start)
    scale = st.time_scale
    head = f"start-up {human_s(st.total_s)}"
    if scale:
        # the server's own start (its first line to its ready line, the journal), every phase scaled:
        # not the switch's start (the controller's clock, stop to ready confirmed), which is longer
        head += (f" at the site (the server's own {_lab_s(st.total_s / scale) if st.total_s else '?'} in the lab "
                 f"x time scale {scale:g}, first line to ready)")
    if start.get("profile"):
        head += f", {start['profile']}"
    lines = [head + ": " + " · ".join(_items(st, human_s))]
    if scale and lab_line:
        lines.append("  in the lab: " + " · ".join(
            i for i in _items(st, lambda v: _lab_s(v / scale) if v is not None else "?") if i != NO_COMPILE))
    slower = start.get("slower")
    if isinstance(slower, dict) and slower.get("finding"):
        f = slower["finding"]
        mark = "ok  " if f.get("ok") else "WARN"
        lines.append(f"{mark} {f.get('check')}: {f.get('diagnosis')}" + (f" (fix: {f['fix']})" if f.get("fix") else ""))
    return lines


def one_line(start: dict | None) -> str:
    """A start in one line (status): the total and every phase at the site's scale."""
    return describe(start, lab_line=False)[0] if start else "no start recorded"
