"""SGLang journal parsing: CUDA-graph capture lines, decode lines, readiness, failures, restarts.

Pure functions over journal entries (`journalctl -o json` dicts) or text lines (a saved
`journalctl` print-out with `May 30 00:27:32 host python[113022]: ` prefixes, or raw
SGLang stdout). The only I/O is `load_file`; the host's journal is read by opsctl.host.facts.JournalWindow.

Lines are parsed by fields, not by one regex per line: a capture line is recognised by
its head (`Capture <name> CUDA graph begin|end`) and each field (`num_tokens_per_req=`,
`bs=[...]`, `elapsed=`, `mem usage=`, ...) is looked up on its own, so the version
variants (fields on the begin or the end line, `num_tokens_per_bs=`, the ≤0.5.10
`Capture cuda graph end. Time elapsed: X s. mem usage=Y GB` spelling, 0.4.x end lines
without `mem usage`) all land in the same `CaptureEvent`. Decode lines are split into
`key: value` fields, so extra fields (`cap len`, `block accept len`, `#full token`) are kept
rather than breaking the match. The `server_args=` line is read into a dict (0.5.23 prints
`server_args={...}`, the resolved values; older releases `server_args=ServerArgs(...)`).
Failures remember whether the server had printed its ready line (`READY_LINE`) before them,
and a traceback whose header is outside the window (frames and/or the exception line only)
is still a failure. `recognise` says whether a file is an SGLang log at all (prefixes,
server_args, a traceback through sglang/, an exception SGLang raises, its own messages) and
which line it could not use. See docs/examples/ and tests/validate/data/ (pasted/: excerpts
from public SGLang issues) for real lines.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Literal

from opsctl.errors import ConfigError
from opsctl.onhost import journal_lines

# capture kinds as SGLang names them; LEGACY is the ≤0.5.10 / 0.4.x `Capture cuda graph ...`
# line, which names neither role (target/draft) nor phase (decode/verify)
TARGET_VERIFY = "target verify"
TARGET_DECODE = "target decode"
DRAFT_DECODE = "draft decode"
DRAFT_EXTEND = "draft extend"
DRAFT_VERIFY = "draft verify"
TARGET_PREFILL = "target prefill"
LEGACY = "legacy-unlabelled"
# the drafter's decode capture (what a trial set's `DDTree trial draft budget B` line precedes), either spelling
TRIAL_DRAFT_KINDS = (DRAFT_DECODE, DRAFT_VERIFY)

CapturePhase = Literal["begin", "end", "failed", "info"]
FailureKind = Literal["capture_failed", "cuda_oom", "kv_alloc_failed", "traceback", "fatal"]

# SGLang's ready line (srt/entrypoints/http_server.py), the one definition in opsctl: import it from here
READY_LINE = journal_lines.READY_LINE   # the one classifier's (opsctl/onhost/journal_lines.py)
READY_TEXT = READY_LINE  # the earlier name of the same line


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class LogLine:
    """One message with its journald and SGLang prefixes taken apart."""

    text: str                      # the message after all prefixes
    line_no: int                   # 1-based position in the input (entry index for JSON)
    timestamp: datetime | None = None
    rank: str = ""                 # SGLang's rank label, e.g. "TP3" or "DP0 TP1 EP1"; "" = no label
    tp_rank: int | None = None
    pid: int | None = None
    invocation_id: str | None = None
    identifier: str | None = None  # syslog identifier: "python", "systemd", ...
    process: int = 0               # index of the process start this line belongs to
    bare: bool = False             # no SGLang `[time ranks]` prefix: a continuation line (traceback, hints) or not SGLang's logger

    @property
    def is_systemd(self) -> bool:
        return self.identifier == "systemd"


@dataclass(frozen=True)
class CaptureEvent:
    """One capture log line: begin, end, failed, or a bare `bs [...]` info line (0.4.x)."""

    kind: str
    phase: CapturePhase
    line: LogLine
    backend: str | None = None
    num_tokens_per_req: int | None = None
    num_tokens: int | None = None         # prefill graphs size by tokens, not requests
    bs: tuple[int, ...] | None = None
    elapsed_s: float | None = None
    mem_usage_gb: float | None = None
    avail_mem_gb: float | None = None
    step: int | None = None

    @property
    def rank(self) -> str:
        return self.line.rank

    @property
    def timestamp(self) -> datetime | None:
        return self.line.timestamp


@dataclass
class Capture:
    """A begin paired with its end (or with nothing: a hang or a crash)."""

    kind: str
    rank: str
    tp_rank: int | None
    process: int
    begin: CaptureEvent
    end: CaptureEvent | None = None

    # a DDTree trial set: the `DDTree trial width W` / `DDTree trial draft budget B` line this capture
    # followed on its rank (runtime/README.md, "Trial set and live switch"): the width or the budget
    trial: int | None = None

    @property
    def complete(self) -> bool:
        return self.end is not None

    def _first(self, name: str):
        for ev in (self.begin, self.end):
            if ev is not None and getattr(ev, name) is not None:
                return getattr(ev, name)
        return None

    @property
    def num_tokens_per_req(self) -> int | None:
        return self._first("num_tokens_per_req")

    @property
    def bs(self) -> tuple[int, ...] | None:
        # the end line's list is the runner's final one; some builds print it on begin only
        for ev in (self.end, self.begin):
            if ev is not None and ev.bs is not None:
                return ev.bs
        return None

    @property
    def backend(self) -> str | None:
        return self._first("backend")

    @property
    def elapsed_s(self) -> float | None:
        if self.end is None:
            return None
        if self.end.elapsed_s is not None:
            return self.end.elapsed_s
        b, e = self.begin.line.timestamp, self.end.line.timestamp
        return (e - b).total_seconds() if b and e else None

    @property
    def mem_usage_gb(self) -> float | None:
        if self.end is None:
            return None
        if self.end.mem_usage_gb is not None:
            return self.end.mem_usage_gb
        if self.begin.avail_mem_gb is not None and self.end.avail_mem_gb is not None:
            return round(self.begin.avail_mem_gb - self.end.avail_mem_gb, 2)
        return None

    @property
    def avail_mem_after_gb(self) -> float | None:
        return self.end.avail_mem_gb if self.end is not None else None

    def as_dict(self) -> dict:
        return {"kind": self.kind, "rank": self.rank or "main", "complete": self.complete,
                "backend": self.backend, "num_tokens_per_req": self.num_tokens_per_req,
                "bs": list(self.bs) if self.bs is not None else None, "elapsed_s": self.elapsed_s,
                "mem_usage_gb": self.mem_usage_gb, "avail_mem_after_gb": self.avail_mem_after_gb,
                "line": self.begin.line.line_no}


@dataclass(frozen=True)
class DecodeLine:
    """`Decode batch, #running-req: R, #token: T, ...` with every field kept in `fields`."""

    line: LogLine
    fields: dict[str, str]
    running_reqs: int | None = None
    num_tokens: int | None = None
    token_usage: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    cuda_graph: bool | None = None
    gen_throughput: float | None = None
    queue_reqs: int | None = None

    @property
    def rank(self) -> str:
        return self.line.rank

    @property
    def timestamp(self) -> datetime | None:
        return self.line.timestamp


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    line: LogLine
    summary: str            # the line itself, or for a traceback the exception line after it
    after_ready: bool = False   # this process had printed the ready line before: it failed while serving
    headless: bool = False      # a traceback's tail whose `Traceback (most recent call last):` is outside the window

    def as_dict(self) -> dict:
        return {"kind": self.kind, "rank": self.line.rank or "main", "line": self.line.line_no,
                "timestamp": self.line.timestamp.isoformat() if self.line.timestamp else None,
                "summary": self.summary[:300], "after_ready": self.after_ready, "headless": self.headless}


@dataclass(frozen=True)
class ServerArgsLine:
    """The `server_args=` line SGLang prints at start, read into `args` (what could be read)."""

    line: LogLine
    args: dict[str, Any]
    spelling: Literal["dict", "ServerArgs"]   # 0.5.23: `server_args={...}`; older: `server_args=ServerArgs(...)`


@dataclass(frozen=True)
class ProcessStart:
    """A new server process: the first line of a new PID, or a second `server_args=` line."""

    index: int
    line: LogLine
    pid: int | None
    reason: str


@dataclass(frozen=True)
class UnitEvent:
    """systemd's own lines about the unit."""

    kind: Literal["started", "stopping", "stopped", "exited", "failed", "restart_scheduled"]
    line: LogLine


@dataclass(frozen=True)
class ScheduleLine:
    """`DDTree budget schedule: 1:32,8:16,32:8,64:0 (verify widths 33,17,9,1)`, printed by the
    runtime's plugin on every rank before capture (runtime/README.md, "Budget schedule")."""

    line: LogLine
    text: str
    widths: tuple[int, ...]

    @property
    def rank(self) -> str:
        return self.line.rank


_SCHEDULE = re.compile(r"^DDTree budget schedule: (?P<text>\d+:\d+(?:,\d+:\d+)*) \(verify widths (?P<w>\d+(?:,\d+)*)\)$")


# ---- the runtime's trial set and live switch (runtime/README.md, "Trial set and live switch", issue #37)

@dataclass(frozen=True)
class TrialSetLine:
    """`DDTree trial set: 4, 8, 16, 1:16,3:4,16:0 (active 16; verify widths 17,9,5,1; draft budgets
    16,8,4)`, every rank, before the target's captures. Candidates are the runtime's canonical names
    (a one-band schedule 1:B is `B`), separated by `, ` (a schedule never holds a space)."""

    line: LogLine
    candidates: tuple[str, ...]
    active: str                       # the one the trial-set file configures (a control file overrides it)
    widths: tuple[int, ...]           # widest first
    draft_budgets: tuple[int, ...]    # largest first
    trial_bs: tuple[int, ...] | None = None   # `; trial bs 1,8,32`: the other candidates capture what these reach

    @property
    def rank(self) -> str:
        return self.line.rank


@dataclass(frozen=True)
class TrialUnitLine:
    """`DDTree trial width 17 (budget 16): bs [1, 2, 4] for 16, 1:16,3:4,16:0` (before SGLang's capture
    pair of that width) or `DDTree trial draft budget 16: bs [...] for ...` (before the drafter's
    capture pair with that budget's head); `bs -` (None) when CUDA graphs are disabled."""

    line: LogLine
    kind: Literal["width", "draft"]
    key: int                          # the verify width (width) or the budget (draft)
    bs: tuple[int, ...] | None
    users: tuple[str, ...]

    @property
    def budget(self) -> int:
        return self.key - 1 if self.kind == "width" else self.key

    @property
    def rank(self) -> str:
        return self.line.rank


@dataclass(frozen=True)
class ActiveLine:
    """`DDTree active: 1:16,3:4,16:0 (since step 112)` (TP0): the candidate serving from that decode step
    on (0: from the start; printed once at start and at every switch)."""

    line: LogLine
    candidate: str
    since_step: int


@dataclass(frozen=True)
class RefusalLine:
    """`DDTree control refused: budget 32 was not captured (captured: ...)` (TP0): the control file named
    something that cannot serve; nothing changed. `candidate` is the canonical name when the reason is
    an uncaptured candidate, else None (malformed or unreadable control file)."""

    line: LogLine
    reason: str
    candidate: str | None = None


_NAMES = r"[\d:,]+(?:, [\d:,]+)*"
_TRIAL_SET = re.compile(r"^DDTree trial set: (?P<c>" + _NAMES + r") \(active (?P<a>[\d:,]+); verify widths "
                        r"(?P<w>\d+(?:,\d+)*); draft budgets (?P<d>\d+(?:,\d+)*|-)"
                        r"(?:; trial bs (?P<t>\d+(?:,\d+)*))?\)$")
_TRIAL_WIDTH = re.compile(r"^DDTree trial width (?P<w>\d+) \(budget \d+\): bs (?P<bs>\[[\d, ]*\]|-) "
                          r"for (?P<u>" + _NAMES + r")$")
_TRIAL_DRAFT = re.compile(r"^DDTree trial draft budget (?P<b>\d+): bs (?P<bs>\[[\d, ]*\]|-) for (?P<u>" + _NAMES + r")$")
_ACTIVE = re.compile(r"^DDTree active: (?P<c>[\d:,]+) \(since step (?P<n>\d+)\)$")
_REFUSED = re.compile(r"^DDTree control refused: (?P<reason>.+)$")
_NOT_CAPTURED = re.compile(r"^(?:budget|schedule) (?P<c>[\d:,]+) was not captured \(captured: ")


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(", ") if x.strip())


def _bs_field(text: str) -> tuple[int, ...] | None:
    return None if text == "-" else tuple(int(x) for x in re.findall(r"\d+", text))


def parse_trial_line(line: LogLine) -> "TrialSetLine | TrialUnitLine | ActiveLine | RefusalLine | None":
    """One of the runtime's trial-set / live-switch lines, or None."""
    text = line.text.strip()
    if not text.startswith("DDTree "):
        return None
    m = _TRIAL_SET.match(text)
    if m:
        return TrialSetLine(line, _names(m["c"]), m["a"], tuple(int(w) for w in m["w"].split(",")),
                            () if m["d"] == "-" else tuple(int(b) for b in m["d"].split(",")),
                            tuple(int(b) for b in m["t"].split(",")) if m["t"] else None)
    m = _TRIAL_WIDTH.match(text)
    if m:
        return TrialUnitLine(line, "width", int(m["w"]), _bs_field(m["bs"]), _names(m["u"]))
    m = _TRIAL_DRAFT.match(text)
    if m:
        return TrialUnitLine(line, "draft", int(m["b"]), _bs_field(m["bs"]), _names(m["u"]))
    m = _ACTIVE.match(text)
    if m:
        return ActiveLine(line, m["c"], int(m["n"]))
    m = _REFUSED.match(text)
    if m:
        nc = _NOT_CAPTURED.match(m["reason"])
        return RefusalLine(line, m["reason"], nc["c"] if nc else None)
    return None


@dataclass
class ParsedJournal:
    lines: list[LogLine] = field(default_factory=list)
    capture_events: list[CaptureEvent] = field(default_factory=list)
    captures: list[Capture] = field(default_factory=list)
    decodes: list[DecodeLine] = field(default_factory=list)
    ready: list[LogLine] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    retractions: list[LogLine] = field(default_factory=list)   # KV retraction under load: not a failure
    process_starts: list[ProcessStart] = field(default_factory=list)
    unit_events: list[UnitEvent] = field(default_factory=list)
    server_args: list[ServerArgsLine] = field(default_factory=list)
    schedules: list[ScheduleLine] = field(default_factory=list)  # the DDTree plugin's budget schedule, per rank
    # the DDTree runtime's trial set (every rank), its per-width / per-budget capture lines, and TP0's
    # live-switch lines (issue #37)
    trial_sets: list[TrialSetLine] = field(default_factory=list)
    trial_units: list[TrialUnitLine] = field(default_factory=list)
    actives: list[ActiveLine] = field(default_factory=list)
    refusals: list[RefusalLine] = field(default_factory=list)

    @property
    def latest_process(self) -> int:
        return self.process_starts[-1].index if self.process_starts else 0

    @property
    def log_format(self) -> Literal["0.5.23", "legacy", "unknown"]:
        """Which capture-line spelling the log uses (the 0.5.23 one names role and phase)."""
        kinds = {c.kind for c in self.captures}
        if kinds - {LEGACY}:
            return "0.5.23"
        return "legacy" if LEGACY in kinds else "unknown"

    def captures_of(self, process: int | None = None) -> list[Capture]:
        process = self.latest_process if process is None else process
        return [c for c in self.captures if c.process == process]

    def decodes_of(self, process: int | None = None) -> list[DecodeLine]:
        process = self.latest_process if process is None else process
        return [d for d in self.decodes if d.line.process == process]

    @property
    def latest_server_args(self) -> ServerArgsLine | None:
        """The last `server_args=` line in the window (the current process's, after a restart)."""
        return self.server_args[-1] if self.server_args else None

    @property
    def restarts(self) -> int:
        return max(0, len(self.process_starts) - 1)


# --------------------------------------------------------------------------- prefixes

_MONTHS = {m: i for i, m in enumerate(
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1)}

# `journalctl` default output (short / short-precise) and short-iso
_SYSLOG_PREFIX = re.compile(
    r"^(?:(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d(?:\.\d+)?)"
    r"|(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?))"
    r" (?P<host>\S+) (?P<ident>[^\s\[:]+)(?:\[(?P<pid>\d+)\])?: ?(?P<msg>.*)$")
# SGLang's logger: `[2026-05-30 00:27:32 TP0] ` or `[2026-05-30 00:27:32.123 DP0 TP1 EP1] `,
# optionally behind Ray's `(SchedulerActor pid=123) `
_SGLANG_PREFIX = re.compile(
    r"^(?:\(\w+ pid=\d+(?:,\s*ip=[\d.]+)?\)\s*)?"
    r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)(?P<ranks>(?: [A-Z][A-Z_]*\d+)*)\] ?(?P<msg>.*)$")
_RANK_TOKEN = re.compile(r"([A-Z][A-Z_]*?)(\d+)$")


# Ray's `(SGLangEngine pid=952, ip=10.1.2.3) ` in front of every line an actor prints, traceback frames included
_RAY_PREFIX = re.compile(r"^\(\w+ pid=\d+(?:,\s*ip=[\d.]+)?\) ?")


def _strip_ray_prefix(msg: str) -> str:
    m = _RAY_PREFIX.match(msg)
    return msg[m.end():] if m else msg


def _sglang_prefix(msg: str) -> tuple[str, datetime | None, str, int | None]:
    m = _SGLANG_PREFIX.match(msg)
    if not m:
        return msg, None, "", None
    ts = datetime.strptime(m["ts"].replace(",", ".")[:19], "%Y-%m-%d %H:%M:%S")
    ranks = m["ranks"].split()
    tp = None
    for tok in ranks:
        rm = _RANK_TOKEN.match(tok)
        if rm and rm.group(1) == "TP":
            tp = int(rm.group(2))
    return m["msg"], ts, " ".join(ranks), tp


def _parse_iso(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def lines_from_text(text: str) -> list[LogLine]:
    """Split a saved journal print-out or raw SGLang output into LogLines."""
    out: list[LogLine] = []
    year = None
    for no, raw in enumerate(text.splitlines(), 1):
        raw = raw.rstrip("\r")
        # tqdm progress bars rewrite one line with \r: the last frame is what was printed
        if "\r" in raw:
            raw = raw.rsplit("\r", 1)[-1]
        if not raw.strip() or raw.startswith("-- "):  # journalctl's `-- Boot ... --`, `-- No entries --`
            continue
        m = _SYSLOG_PREFIX.match(raw)
        ident = pid = None
        jts: datetime | None = None
        msg = raw
        syslog_parts = None
        if m:
            msg, ident = m["msg"], m["ident"]
            pid = int(m["pid"]) if m["pid"] else None
            if pid == 1:  # `-o with-unit` names PID 1 `init.scope`
                ident = "systemd"
            if m["iso"]:
                jts = _parse_iso(m["iso"])
            else:
                syslog_parts = (_MONTHS.get(m["mon"], 1), int(m["day"]), m["hms"])
        msg, sts, rank, tp = _sglang_prefix(msg)
        if sts is None:
            msg = _strip_ray_prefix(msg)
        if sts is not None:
            year = sts.year
        if syslog_parts is not None:  # the short format has no year: borrow SGLang's, else this year
            mon, day, hms = syslog_parts
            try:
                jts = datetime.strptime(f"{year or datetime.now(timezone.utc).year}-{mon:02d}-{day:02d} {hms[:8]}",
                                        "%Y-%m-%d %H:%M:%S")
            except ValueError:
                jts = None
        out.append(LogLine(msg, no, jts or sts, rank, tp, pid, None, ident, bare=sts is None))
    return out


_message_text = journal_lines.message_text


def lines_from_entries(entries: Iterable[dict]) -> list[LogLine]:
    """Turn `journalctl -o json` entries into LogLines (a MESSAGE with newlines gives several)."""
    out: list[LogLine] = []
    for no, entry in enumerate(entries, 1):
        text = _message_text(entry.get("MESSAGE"))
        ts = None
        if entry.get("__REALTIME_TIMESTAMP"):
            try:
                ts = datetime.fromtimestamp(int(entry["__REALTIME_TIMESTAMP"]) / 1e6, tz=timezone.utc).replace(tzinfo=None)
            except (TypeError, ValueError):
                ts = None
        pid = journal_lines.entry_pid(entry)
        ident = journal_lines.identifier(entry)
        for part in text.splitlines() or [""]:
            msg, sts, rank, tp = _sglang_prefix(part.rstrip("\r").rsplit("\r", 1)[-1])
            if not msg.strip():
                continue
            out.append(LogLine(msg, no, ts or sts, rank, tp, pid, entry.get("_SYSTEMD_INVOCATION_ID"), ident,
                               bare=sts is None))
    return out


# --------------------------------------------------------------------------- fields

_CAPTURE_HEAD = re.compile(
    r"^Capture (?P<name>[\w ]*?)\s*(?:(?:CUDA|cuda|CPU|NPU|XPU|MUSA|\w+) graph)\s*(?P<phase>begin|end|failed)\b",
    re.IGNORECASE)
_CAPTURE_BS_INFO = re.compile(r"^Capture (?:cuda )?graph bs\b", re.IGNORECASE)  # 0.4.x: `Capture cuda graph bs [1, 2, 4]`
_INT = r"(\d+)"
_FLOAT = r"(-?\d+(?:\.\d+)?)"
_FIELDS = {  # field -> pattern; each looked up on its own so order and presence may vary
    "backend": re.compile(r"\bbackend=([\w.-]+)"),
    "num_tokens_per_req": re.compile(r"\bnum_tokens_per_(?:req|bs)=" + _INT),
    "num_tokens": re.compile(r"\bnum_tokens=" + _INT),
    "bs": re.compile(r"\bbs(?:=|\s+)\[([\d,\s]*)\]"),
    "elapsed_s": re.compile(r"(?:\belapsed=|Time elapsed:\s*)" + _FLOAT),
    "mem_usage_gb": re.compile(r"\bmem usage=\s*" + _FLOAT),
    "avail_mem_gb": re.compile(r"\bavail(?: |_)mem=\s*" + _FLOAT),
    "step": re.compile(r"\bstep=" + _INT),
}


def _capture_fields(text: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, pat in _FIELDS.items():
        m = pat.search(text)
        if not m:
            continue
        raw = m.group(1)
        if name == "bs":
            values[name] = tuple(int(x) for x in re.findall(r"\d+", raw))
        elif name == "backend":
            values[name] = raw.rstrip(".,")
        elif name in ("num_tokens_per_req", "num_tokens", "step"):
            values[name] = int(raw)
        else:
            values[name] = float(raw)
    return values


def _capture_kind(name: str) -> str:
    name = " ".join(name.lower().split())
    if not name:
        return LEGACY
    if name == "draft":  # some old builds: `Capture draft cuda graph begin`
        return DRAFT_DECODE
    return name


def parse_capture(line: LogLine) -> CaptureEvent | None:
    text = line.text.strip()
    if not text.startswith("Capture"):
        return None
    m = _CAPTURE_HEAD.match(text)
    if m:
        kind = _capture_kind(m["name"])
        phase = m["phase"].lower()
        # the failure line carries the exception text: keep it off the fields
        fields = _capture_fields(text) if phase != "failed" else {}
        return CaptureEvent(kind, phase, line, **fields)  # type: ignore[arg-type]
    if _CAPTURE_BS_INFO.match(text):
        return CaptureEvent(LEGACY, "info", line, **_capture_fields(text))
    return None


_DECODE_HEAD = re.compile(r"^Decode batch(?: \[\d+\])?[,.]\s*")  # older releases: `Decode batch. #running-req: ...`


def _num(value: str | None, cast):
    if value is None:
        return None
    try:
        return cast(value.strip().rstrip(","))
    except ValueError:
        return None


def parse_decode(line: LogLine) -> DecodeLine | None:
    m = _DECODE_HEAD.match(line.text)
    if not m:
        return None
    fields: dict[str, str] = {}
    for part in line.text[m.end():].split(", "):
        key, sep, value = part.partition(": ")
        if sep:
            fields[key.strip()] = value.strip()
    graph = fields.get("cuda graph")
    return DecodeLine(
        line=line,
        fields=fields,
        running_reqs=_num(fields.get("#running-req"), int),
        # hybrid models print `#full token` / `full token usage` instead of `#token` / `token usage`
        num_tokens=_num(fields.get("#token", fields.get("#full token")), int),
        token_usage=_num(fields.get("token usage", fields.get("full token usage")), float),
        accept_len=_num(fields.get("accept len"), float),
        accept_rate=_num(fields.get("accept rate"), float),
        cuda_graph=None if graph is None else graph.strip() == "True",
        gen_throughput=_num(fields.get("gen throughput (token/s)"), float),
        queue_reqs=_num(fields.get("#queue-req"), int),
    )


# --------------------------------------------------------------------------- server_args

_OPEN, _CLOSE = "([{", ")]}"


def _split_top_level(body: str) -> list[str]:
    """Split `a=1, b=[1, 2], c='x, y'` at the commas outside brackets and quotes."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(body):
        ch = body[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
        i += 1
    parts.append(body[start:])
    return [p.strip() for p in parts if p.strip()]


def _literal(raw: str) -> Any:
    """A Python literal when the repr is one (numbers, strings, None, lists, dicts), else the text."""
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


_ARG_KEY = re.compile(r"^(\w+)=(.*)$", re.S)
_DICT_KEY = re.compile(r"""^(['"])(\w+)\1\s*:\s*(.*)$""", re.S)


def parse_server_args(text: str) -> tuple[dict[str, Any], Literal["dict", "ServerArgs"]] | None:
    """Read the `server_args=` line: `server_args={'tp_size': 8, ...}` (0.5.23, the resolved values)
    or `server_args=ServerArgs(tp_size=8, ...)` (older releases, and the lab emulator). Values that
    are not Python literals (enum or object reprs) are kept as their text; a line cut short keeps
    what came before the cut. None when the line is neither spelling."""
    text = text.strip()
    if not text.startswith("server_args="):
        return None
    body = text[len("server_args="):].strip()
    if body.startswith("ServerArgs("):
        body, spelling, key_re = body[len("ServerArgs("):], "ServerArgs", _ARG_KEY
    elif body.startswith("{"):
        body, spelling, key_re = body[1:], "dict", _DICT_KEY
    else:
        return None
    body = body.rstrip()
    if body.endswith(")" if spelling == "ServerArgs" else "}"):
        body = body[:-1]
    args: dict[str, Any] = {}
    for part in _split_top_level(body):
        m = key_re.match(part)
        if not m:
            continue  # `...` in a shortened line, or a cut-off last item
        key, raw = (m.group(1), m.group(2)) if spelling == "ServerArgs" else (m.group(2), m.group(3))
        args[key] = _literal(raw.strip())
    return args, spelling  # type: ignore[return-value]


# --------------------------------------------------------------------------- failures

_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation")
# a KV-pool allocation that raised (the scheduler dies), unlike the retraction lines below
_KV_ALLOC_FAILED = re.compile(r"^(?:RuntimeError: )?(?:Decode|Prefill) out of memory\. Try to lower")
_RETRACTION = re.compile(r"Decode out of memory happened|KV cache pool is full\. Retract requests")
_FATAL = re.compile(r"Received sigquit from a child process|Child process unexpectedly failed|"
                    r"Scheduler hit an exception|Exception in run_scheduler_process")
_TB_NOISE = re.compile(r"^(?:Traceback \(most recent|File \"|During handling of|The above exception)")
# a traceback's frame (`  File "/x.py", line 3, in f`) and its last line (`torch.OutOfMemoryError: ...`,
# `AssertionError`): what is left of a traceback when the window starts after its header
_TB_FRAME = re.compile(r'^\s+File "[^"]+", line \d+')
_TB_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::\s.*)?$")


# --------------------------------------------------------------------------- parse


def parse(source: Iterable[dict] | Iterable[str] | str) -> ParsedJournal:
    """Parse journal entries (dicts), text lines, or one text blob."""
    if isinstance(source, str):
        lines = lines_from_text(source)
    else:
        items = list(source)
        if items and isinstance(items[0], dict):
            lines = lines_from_entries(items)  # type: ignore[arg-type]
        else:
            lines = lines_from_text("\n".join(str(i) for i in items))
    return parse_lines(lines)


def parse_lines(lines: list[LogLine]) -> ParsedJournal:
    result = ParsedJournal()
    process = 0
    current_pid: int | None = None
    seen_server_args = False
    open_tracebacks: dict[int | None, Failure] = {}  # pid -> traceback awaiting its exception line
    last_traceback: dict[int | None, Failure] = {}
    open_captures: dict[tuple, list[Capture]] = {}
    pending_bs: dict[tuple, tuple[int, ...]] = {}
    pending_trial: dict[tuple, TrialUnitLine] = {}  # (pid, rank, process) -> the trial unit line awaiting its capture
    ready_processes: set[int] = set()  # processes that printed the ready line so far

    def failure(kind: FailureKind, at: LogLine, summary: str, *, headless: bool = False) -> Failure:
        f = Failure(kind, at, summary, after_ready=at.process in ready_processes, headless=headless)
        result.failures.append(f)
        return f

    for line in lines:
        if line.is_systemd:
            kind = journal_lines.unit_event(line.text)
            if kind is not None:
                result.unit_events.append(UnitEvent(kind, line))  # type: ignore[arg-type]
            result.lines.append(line)
            continue

        # process boundaries: a new PID of the service, or the launcher's `server_args=` line again
        new_reason = None
        if line.pid is not None and line.pid != current_pid:
            new_reason = f"pid {line.pid}" if current_pid is None else f"pid {current_pid} -> {line.pid}"
            current_pid, seen_server_args = line.pid, False
        server_args = parse_server_args(line.text) if line.text.startswith("server_args=") else None
        if line.text.startswith("server_args=") and not line.rank:
            if seen_server_args and new_reason is None:
                new_reason = "server_args printed again (same pid: a restart without PID information)"
            seen_server_args = True
        if new_reason is not None and result.process_starts:
            process += 1
        line = _with_process(line, process)
        if new_reason is not None or not result.process_starts:
            result.process_starts.append(ProcessStart(process, line, line.pid, new_reason or "first line"))
        result.lines.append(line)
        if server_args is not None:
            result.server_args.append(ServerArgsLine(line, *server_args))
        text = line.text.strip()
        # a traceback's continuation lines carry no rank prefix: follow it by process
        key = line.pid
        tb = open_tracebacks.get(key)
        if tb is None and line.bare and text.startswith(("During handling of", "The above exception")):
            tb = last_traceback.get(key)  # a chained exception continues the same failure
            if tb is None:  # the window starts inside a chained traceback
                tb = failure("traceback", line, text, headless=True)
            open_tracebacks[key] = tb
        if tb is None and line.bare and line.text.startswith((" ", "\t")) and _TB_FRAME.match(line.text):
            # a frame with no traceback open: the window starts after the `Traceback ...` header
            tb = open_tracebacks[key] = failure("traceback", line, text, headless=True)
        elif tb is None and line.bare and not line.text.startswith((" ", "\t")) and _TB_EXCEPTION.match(text):
            # the exception line alone (its frames and header are before the window)
            last_traceback[key] = failure("traceback", line, text, headless=True)
        if tb is not None and line.bare and tb.line.rank:  # attribute the frames and exception to the rank
            line = replace(line, rank=tb.line.rank, tp_rank=tb.line.tp_rank)
            result.lines[-1] = line
        if (tb is not None and line.bare and text and not line.text.startswith((" ", "\t"))
                and not _TB_NOISE.match(text)):
            # the first unindented line after the frames names the exception (the last one, when chained)
            closed = replace(tb, summary=text)
            result.failures[result.failures.index(tb)] = closed
            last_traceback[key] = closed
            del open_tracebacks[key]
        tb_start = "Traceback (most recent call last)" in text
        if tb_start and key not in open_tracebacks:
            open_tracebacks[key] = failure("traceback", line, text)

        ev = parse_capture(line)
        if ev is not None:
            result.capture_events.append(ev)
            ckey = (line.pid, line.rank, process)
            if ev.phase == "begin":
                if ev.bs is None and ckey in pending_bs:
                    ev = replace(ev, bs=pending_bs.pop(ckey))
                cap = Capture(ev.kind, line.rank, line.tp_rank, process, ev)
                unit = pending_trial.get(ckey)
                if unit is not None and (ev.kind == TARGET_VERIFY if unit.kind == "width" else ev.kind in TRIAL_DRAFT_KINDS):
                    cap.trial = unit.key
                    del pending_trial[ckey]
                result.captures.append(cap)
                open_captures.setdefault((*ckey, ev.kind), []).append(cap)
            elif ev.phase == "end":
                stack = open_captures.get((*ckey, ev.kind))
                if stack:
                    stack.pop().end = ev
                else:  # an end whose begin is outside the window: keep it as a complete capture
                    result.captures.append(Capture(ev.kind, line.rank, line.tp_rank, process, ev, ev))
            elif ev.phase == "failed":
                failure("capture_failed", line, text)
            elif ev.phase == "info" and ev.bs is not None:
                stack = open_captures.get((*ckey, LEGACY))
                if stack:
                    stack[-1].begin = replace(stack[-1].begin, bs=ev.bs)
                else:
                    pending_bs[ckey] = ev.bs
        elif "graph failed" in text and "Capture" in text:  # `Exception: Capture cuda graph failed: ...`
            failure("capture_failed", line, text)

        if _CUDA_OOM.search(text):
            failure("cuda_oom", line, text)
        elif _KV_ALLOC_FAILED.search(text):
            failure("kv_alloc_failed", line, text)
        elif _RETRACTION.search(text):
            result.retractions.append(line)
        if _FATAL.search(text) and not tb_start:
            failure("fatal", line, text)

        sm = _SCHEDULE.match(text)
        if sm:
            result.schedules.append(ScheduleLine(line, sm["text"], tuple(int(w) for w in sm["w"].split(","))))
        trial = parse_trial_line(line) if text.startswith("DDTree ") else None
        if isinstance(trial, TrialSetLine):
            result.trial_sets.append(trial)
        elif isinstance(trial, TrialUnitLine):
            result.trial_units.append(trial)
            pending_trial[(line.pid, line.rank, process)] = trial
        elif isinstance(trial, ActiveLine):
            result.actives.append(trial)
        elif isinstance(trial, RefusalLine):
            result.refusals.append(trial)
        dec = parse_decode(line)
        if dec is not None:
            result.decodes.append(dec)
        elif READY_LINE in text:
            result.ready.append(line)
            ready_processes.add(process)
    return result


def _with_process(line: LogLine, process: int) -> LogLine:
    return line if line.process == process else replace(line, process=process)


def since_start(parsed: ParsedJournal) -> ParsedJournal:
    """The part of the window from the unit's first `Started` on (the release's own start).

    A `--since` window taken just before the switch may still show the previous process
    stopping; that is not a restart of this release.
    """
    started = [e for e in parsed.unit_events if e.kind == "started"]
    if not started:
        return parsed
    first = started[0].line
    cut = next(i for i, ln in enumerate(parsed.lines) if ln is first)
    return parse_lines([_with_process(ln, 0) for ln in parsed.lines[cut:]])


def starts(parsed: ParsedJournal) -> list[ParsedJournal]:
    """A journal cut into the service's deliberate starts (a file spanning several deploys and
    rollbacks: `journalctl -u UNIT > FILE`), each parsed on its own, oldest first.

    A `Started` line after a requested stop (`Stopping ...`, as `systemctl stop/restart` print, or
    `Sent signal SIGTERM to main process N (...) on client request`, as `systemctl kill` in a
    deploy's switch, a rollback and a tune print) with no `Scheduled restart job` between begins
    a new start: a clean
    stop followed by a start is not a restart. systemd's own restart after a crash (`Main process
    exited` ... `Scheduled restart job` ... `Started`) stays inside its start and counts as one.
    A log without systemd lines is one start."""
    cuts = [0]
    index = {id(ln): i for i, ln in enumerate(parsed.lines)}
    stopping = scheduled = False
    for ev in parsed.unit_events:
        if ev.kind == "started":
            i = index[id(ev.line)]
            if stopping and not scheduled and i > cuts[-1]:
                cuts.append(i)
            stopping = scheduled = False
        elif ev.kind == "stopping":
            stopping = True
        elif ev.kind == "restart_scheduled":
            scheduled = True
    if len(cuts) == 1:
        return [parsed]
    bounds = cuts + [len(parsed.lines)]
    return [parse_lines([_with_process(ln, 0) for ln in parsed.lines[lo:hi]]) for lo, hi in zip(bounds, bounds[1:])]


def trial_state(source: "ParsedJournal | Iterable[dict] | Iterable[str] | str") -> dict | None:
    """The DDTree trial set of the last start (its last server process) and which candidate serves,
    read back from the runtime's lines (runtime/README.md, "Trial set and live switch"); None when
    that start loaded no trial set. `source`: a ParsedJournal, `journalctl -o json` entries, or text.

        {"candidates": ["4", "8", "16", "1:16,3:4,16:0"],   # canonical names, as the runtime prints them
         "configured_active": "16",                        # the trial-set file's `active`
         "active": "1:16,3:4,16:0", "since_step": 112,     # the last `DDTree active:` line (TP0)
         "announced": True,                                # False: no active line yet (configured_active)
         "widths": [17, 9, 5, 1], "draft_budgets": [16, 8, 4], "ranks": ["TP0", "TP1"],
         "switches": [{"active", "since_step", "line", "timestamp"}, ...],   # every active line, in order
         "refusals": [{"reason", "candidate", "line", "timestamp", "after_last_switch"}, ...],
         "decodes": [{"line", "rank", "timestamp", "active", "mixed", "running_reqs", "accept_len",
                      "accept_rate", "gen_throughput", "cuda_graph"}, ...]}

    A decode line's `active` is the candidate serving when it was printed; `mixed` is True when a
    switch came after that rank's previous decode line (SGLang averages accept len and gen
    throughput over the interval since then, so the line mixes two candidates: drop it)."""
    parsed = source if isinstance(source, ParsedJournal) else parse(source)  # type: ignore[arg-type]
    start = starts(parsed)[-1]
    proc = start.latest_process
    sets = [x for x in start.trial_sets if x.line.process == proc]
    if not sets:
        return None
    head = next((x for x in sets if x.line.tp_rank == 0), sets[0])
    actives = [a for a in start.actives if a.line.process == proc]
    refusals = [r for r in start.refusals if r.line.process == proc]

    def when(ln: LogLine) -> str | None:
        return ln.timestamp.isoformat() if ln.timestamp else None

    pos = {id(ln): i for i, ln in enumerate(start.lines)}
    last_switch_pos = pos.get(id(actives[-1].line), -1) if actives else -1
    # walk the process's lines in order: the candidate in force at each decode line, and whether a
    # switch fell inside that line's interval (since the rank's previous decode line)
    events = sorted([(pos.get(id(a.line), 0), "active", a) for a in actives]
                    + [(pos.get(id(d.line), 0), "decode", d) for d in start.decodes_of(proc)], key=lambda e: e[0])
    current = head.active
    switches = 0                      # switches so far (the start's `since step 0` line is none)
    seen: dict[str, int] = {}         # rank -> switches at its previous decode line
    decodes = []
    for _, kind, ev in events:
        if kind == "active":
            if ev.candidate != current or ev.since_step > 0:
                switches += 1
            current = ev.candidate
            continue
        rank = ev.rank
        mixed = seen.get(rank, 0) != switches
        seen[rank] = switches
        decodes.append({"line": ev.line.line_no, "rank": rank or "main", "timestamp": when(ev.line), "active": current,
                        "mixed": mixed, "running_reqs": ev.running_reqs, "accept_len": ev.accept_len,
                        "accept_rate": ev.accept_rate, "gen_throughput": ev.gen_throughput, "cuda_graph": ev.cuda_graph})
    last = actives[-1] if actives else None
    return {
        "candidates": list(head.candidates),
        "configured_active": head.active,
        "active": last.candidate if last else head.active,
        "since_step": last.since_step if last else 0,
        "announced": last is not None,
        "widths": list(head.widths),
        "draft_budgets": list(head.draft_budgets),
        "ranks": sorted({x.rank or "main" for x in sets}),
        "switches": [{"active": a.candidate, "since_step": a.since_step, "line": a.line.line_no,
                      "timestamp": when(a.line)} for a in actives],
        "refusals": [{"reason": r.reason, "candidate": r.candidate, "line": r.line.line_no, "timestamp": when(r.line),
                      "after_last_switch": pos.get(id(r.line), 0) > last_switch_pos} for r in refusals],
        "decodes": decodes,
    }


# --------------------------------------------------------------------------- I/O


def load_entries_json(text: str) -> list[dict]:
    """`journalctl -o json` (one object per line) or `-o json-pretty`/a JSON array."""
    stripped = text.strip()
    if not stripped:
        return []
    if stripped.startswith("["):
        data = json.loads(stripped)
        if not isinstance(data, list):
            raise ValueError("a JSON array of journal entries was expected")
        return [d for d in data if isinstance(d, dict)]
    entries: list[dict] = []
    decoder = json.JSONDecoder()
    pos = 0
    while pos < len(stripped):  # handles one-per-line and json-pretty (objects back to back)
        while pos < len(stripped) and stripped[pos].isspace():
            pos += 1
        if pos >= len(stripped):
            break
        obj, pos = decoder.raw_decode(stripped, pos)
        if isinstance(obj, dict):
            entries.append(obj)
    return entries


def looks_like_json_export(text: str) -> bool:
    head = text.lstrip()[:1]
    return head in ("{", "[") and '"MESSAGE"' in text[:20000]


# What made a server die, most specific first: the line an operator must read.
_CAUSES = [
    ("port in use", re.compile(r"address already in use", re.I)),
    ("CUDA-graph capture failed", re.compile(r"Capture cuda graph failed", re.I)),
    ("CUDA out of memory", re.compile(r"CUDA (error: )?out of memory|OutOfMemoryError", re.I)),
    ("CUDA error", re.compile(r"CUDA error: .+|illegal memory access", re.I)),
    ("exception", re.compile(r"^(\w+\.)*\w*(Error|Exception): .+")),
    ("error", re.compile(r"\bERROR\b|\berror:")),
]


def first_cause(text_lines: list[str]) -> tuple[str, str] | None:
    """(kind, line) of the most specific failure cause among a unit's log lines: the first
    `address already in use`, then a capture failure, OOM, CUDA error (the crash line),
    an exception line, a generic error line. None when nothing looks like a failure."""
    for kind, pat in _CAUSES:
        for line in text_lines:
            msg = line.strip()
            if pat.search(msg):
                return kind, msg[:300]
    return None


# The final exception of a traceback that SGLang raises (or surfaces) at start-up or while serving:
# capture failures, CUDA errors, OOM, NCCL errors, size mismatches in (piecewise) graph replay
SGLANG_EXCEPTION = re.compile(
    r"Capture (?:cuda|CUDA) graph failed|Piecewise CUDA Graph failed|CUDA error|CUDA out of memory|"
    r"OutOfMemoryError|cudaError\w*|NCCL error|nccl\w*Error|illegal memory access|"
    r"must match the size of tensor|[Ss]ize mismatch|Not enough memory\. Please try to increase|"
    r"(?:Prefill|Decode) out of memory")
# SGLang's own log messages, as they read without the `[time rank]` prefix (a paste that lost it)
_SGLANG_MESSAGE = re.compile(
    r"^(?:Capture (?:[\w ]*?)(?:cuda|CUDA|CPU|NPU) graph (?:begin|end|bs|failed)|Capturing batches \(bs=|"
    r"Decode batch|Prefill batch|Load weight (?:begin|end)|Memory pool end|KV Cache is allocated|"
    r"Init torch distributed (?:begin|ends)|Registering \d+ cuda graph addresses|server_args=|"
    r"Received sigquit from a child process|Scheduler hit an exception|sglang is using nccl==|"
    r"Piecewise CUDA Graph failed|" + re.escape(READY_LINE) + r")")
_TB_LINE = re.compile(r"^(?:Traceback \(most recent call last\)|During handling of the above exception|"
                      r"The above exception was the direct cause|Current thread 0x[0-9a-f]+ \(most recent call first\))")
# an excerpt whose lines are mostly something else (a README quoting a log line) is not a log
EXCERPT_MIN_SHARE = 0.25


@dataclass(frozen=True)
class Recognition:
    """Why a file counts as an SGLang log (`how` is None when it does not), and where the first
    line is that none of the rules could use (reported when the file is refused)."""

    how: str | None
    first_unusable: LogLine | None = None

    def __bool__(self) -> bool:
        return self.how is not None


def _is_sglang_frame(text: str) -> bool:
    m = _TB_FRAME.match(text)
    return bool(m) and ("/sglang/" in m.group(0) or '"sglang/' in m.group(0))


def recognise(parsed: ParsedJournal) -> Recognition:
    """Is a parsed file an SGLang log, and by which rule: its prefixes (a timestamp, a rank, a
    journald pid), its server_args line, a traceback with frames in `sglang/`, a final exception
    SGLang raises (capture failure, CUDA error, OOM, NCCL error, size mismatch), or SGLang's own
    messages without their prefix. The last three must make up EXCERPT_MIN_SHARE of the file's
    lines, so a README that quotes a log line is still refused."""
    lines = parsed.lines[:20000]
    if any(ln.timestamp is not None or ln.rank or ln.pid is not None for ln in lines):
        return Recognition("SGLang log prefixes")
    if any(ln.text.startswith(("server_args=ServerArgs(", "server_args={")) for ln in lines):
        return Recognition("its server_args line")
    frames = exceptions = messages = 0
    used: set[int] = set()
    in_tb = False
    for i, ln in enumerate(lines):
        text = ln.text
        stripped = text.strip()
        if _TB_FRAME.match(text) or _TB_LINE.match(stripped):
            in_tb = True
            used.add(i)
            frames += _is_sglang_frame(text)
        elif in_tb and text.startswith((" ", "\t")):
            used.add(i)  # a frame's source line, `^^^^` markers
        elif _TB_EXCEPTION.match(stripped) or stripped.startswith("Exception: "):
            in_tb = False
            used.add(i)
            exceptions += bool(SGLANG_EXCEPTION.search(stripped))
        elif _SGLANG_MESSAGE.match(stripped) or parse_capture(ln) is not None:
            in_tb = False
            used.add(i)
            messages += 1
        else:
            in_tb = False
    share = len(used) / max(1, len(lines))
    first = next((ln for i, ln in enumerate(lines) if i not in used), None)
    if share >= EXCERPT_MIN_SHARE:
        if frames:
            return Recognition("a traceback with frames in sglang/", first)
        if messages >= 2:
            return Recognition("SGLang's own log messages", first)
        if exceptions:
            return Recognition("an exception SGLang raises", first)
    return Recognition(None, first)


def looks_like_sglang(parsed: ParsedJournal) -> bool:
    """Does a parsed file hold a server log (see `recognise`)? A README that quotes the ready
    line does not."""
    return bool(recognise(parsed))


def load_file(path: str | Path) -> ParsedJournal:
    """Parse a saved journal: JSON export (`journalctl -o json`) or text, detected from the content."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", "check the path of --from-file") from None
    if b"\0" in raw[:65536]:
        line = raw[:raw.index(b"\0")].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: {path} is not a text file (it holds NUL bytes)",
                          "pass a saved journal: journalctl -u UNIT > FILE (text) or -o json")
    text = raw.decode("utf-8", "replace")
    if looks_like_json_export(text):
        try:
            entries = load_entries_json(text)
        except ValueError as exc:
            raise ConfigError(f"{path} looks like a journalctl JSON export but does not parse: {exc}",
                              "export it again with 'journalctl -u UNIT -o json --all > FILE', or save it as "
                              "text") from None
        nulls = [i for i, e in enumerate(entries, 1) if "MESSAGE" in e and e["MESSAGE"] is None]
        if nulls:
            # journalctl -o json writes a field longer than 4096 bytes as null unless --all: SGLang's
            # server_args line (the launch args) and long tracebacks are among them (issue #49)
            raise ConfigError(f"{path}:{nulls[0]}: {len(nulls)} of {len(entries)} journal entries have MESSAGE "
                              "null: journalctl -o json writes fields longer than 4096 bytes as null without --all "
                              "(SGLang's server_args line is one), so the file lacks what the server printed",
                              "save it again with --all: journalctl -u UNIT -o json --all > FILE (or as text: "
                              "journalctl -u UNIT > FILE)")
        return parse(entries)
    return parse(text)
