"""Startup validation: findings from a parsed SGLang journal and the release's profile.

Pure: `opsctl.journal` parses, this module judges, the caller (CLI or deploy) prints or
records. A check that cannot be proven from the log fails: a release whose graphs we
cannot show to be right is refused, not waved through. The exception is a field that an
older SGLang's log format does not print (no num_tokens_per_req or bs list on pre-0.5.11
capture lines, no accept len / accept rate / cuda graph on old decode lines, no capture
memory or time): that finding is ok with `details["status"] == "unknown"` and says the log
does not show it.

Entry points:
    validate_startup(parsed, profile) -> list[Finding]   capture, failures (start-up / serving), restarts, memory/time
    validate_decode(parsed, profile)  -> list[Finding]   decode lines under the probe load
    validate(parsed, profile, *, require_decode)         both
    expectations_from_log(parsed)     -> LogProfile | None   the expectations the log's server_args line states
    validate_trialset_start(parsed, candidates, *, active, verify_width) -> list[Finding]
                                      a DDTree trial-set start (issue #37): the set loaded on every rank, each
                                      verify width and draft budget captured, the active candidate

A DDTree trial set (the profile's `trial_set`, or the runtime's `DDTree trial set:` line in the log)
captures one target graph set per verify width any candidate needs: `validate_startup` then checks
`capture.trial_widths` (and `trialset.loaded`, `capture.trial_drafts`, `trialset.active`) instead of
one verify width or a schedule's bands, and `validate_decode` reads acceptance per active candidate.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

from opsctl import journal as journal_mod
from opsctl import schedule as schedule_mod
from opsctl.errors import ConfigError
from opsctl.findings import Finding
from opsctl.journal import (LEGACY, TARGET_DECODE, TARGET_VERIFY, TRIAL_DRAFT_KINDS, Capture, DecodeLine, Failure,
                            ParsedJournal, since_start)

# half a unit in the last printed place: SGLang prints accept len/rate with two decimals
PRINT_HALF_ULP = 0.005
FORMULA_NOTE = ("read back with 1 + (accept_len - 1) / accept_rate, SGLang 0.5.23's accept-rate "
                "definition (correct drafts / (rounds x (num_draft_tokens - 1)))")


class ProfileLike(Protocol):
    """What validation reads from `opsctl.config.Profile` (or a `LogProfile`)."""

    name: str
    kind: str  # "autoregressive" | "dflash" | "ddtree" (| "speculative": another algorithm, LogProfile only)
    budget: int | None
    block_size: int | None
    tp_size: int
    cuda_graph_max_bs: int

    @property
    def verify_width(self) -> int: ...

    @property
    def effective_max_concurrency(self) -> int: ...


# --------------------------------------------------------------------------- expectations from the log


@dataclass(frozen=True)
class LogProfile:
    """What the log's own `server_args=` line says the server was launched with, shaped like
    `config.Profile` for the checks (`opsctl validate --from-file` without --profile). Fields the
    line does not show are None and the checks that need them report "unknown"."""

    kind: str                         # autoregressive | ddtree | dflash | speculative (another algorithm)
    algorithm: str | None             # speculative_algorithm as printed, upper-case
    num_draft_tokens: int | None
    tp_size: int | None
    cuda_graph_max_bs: int | None
    cuda_graph_max_bs_from: str | None = None   # the server_args field it came from
    decode_graphs_disabled: bool = False
    max_concurrency: int | None = None          # --max-concurrency, when given
    line_no: int = 0
    spelling: str = "ServerArgs"
    name: str = "server_args"
    budget_schedule: str | None = None          # the runtime's `DDTree budget schedule:` line
    trial_set: tuple[str, ...] | None = None    # the runtime's `DDTree trial set:` line (its candidates)
    cuda_graph_bs: tuple[int, ...] | None = None  # --cuda-graph-bs-decode, when the line shows it: a chosen list

    @property
    def captured_batch_sizes(self) -> list[int]:
        return sorted(set(self.cuda_graph_bs or ()))

    @property
    def schedule(self) -> "schedule_mod.BudgetSchedule | None":
        if self.kind != "ddtree" or not self.budget_schedule:
            return None
        try:
            return schedule_mod.parse(self.budget_schedule)
        except Exception:  # noqa: BLE001 - a line the checks report on; not an expectation
            return None

    @property
    def budget(self) -> int | None:  # the project renders DDTree's budget B as --speculative-num-draft-tokens B+1
        return self.num_draft_tokens - 1 if self.kind == "ddtree" and self.num_draft_tokens else None

    @property
    def block_size(self) -> int | None:
        return self.num_draft_tokens if self.kind == "dflash" else None

    @property
    def verify_width(self) -> int | None:  # type: ignore[override]
        return 1 if self.kind == "autoregressive" else self.num_draft_tokens

    @property
    def effective_max_concurrency(self) -> int | None:  # type: ignore[override]
        return self.max_concurrency or self.cuda_graph_max_bs

    @property
    def label(self) -> str:
        algo = self.algorithm or "no speculation"
        return f"server_args ({algo}" + (f", {self.num_draft_tokens} draft tokens" if self.num_draft_tokens else "") + ")"

    @property
    def described_as(self) -> str:
        return f"the log's server_args (speculative_algorithm {self.algorithm or 'None'})"

    def describe(self) -> str:
        """One line for the CLI: where the expectations come from and what they are."""
        parts = [f"speculative_algorithm {self.algorithm or 'None'}"]
        if self.kind != "autoregressive":
            width = (f"verify width {self.num_draft_tokens}" + (f", DDTree budget {self.budget}" if self.budget else "")
                     if self.num_draft_tokens else "not shown")
            parts.append(f"speculative_num_draft_tokens {self.num_draft_tokens or '?'} ({width})")
            if self.schedule is not None:
                parts.append(f"budget schedule {self.budget_schedule} (the runtime's schedule line)")
            if self.trial_set:
                parts.append(f"trial set {', '.join(self.trial_set)} (the runtime's trial-set line)")
        if self.cuda_graph_max_bs:
            parts.append(f"cuda_graph_max_bs {self.cuda_graph_max_bs} (from {self.cuda_graph_max_bs_from})")
        else:
            parts.append("cuda_graph_max_bs not shown")
        if self.decode_graphs_disabled:
            parts.append("decode CUDA graphs disabled")
        parts.append(f"tp_size {self.tp_size if self.tp_size is not None else 'not shown'}")
        if self.max_concurrency:
            parts.append(f"max concurrency {self.max_concurrency} (--max-concurrency)")
        return f"expectations from the log's server_args line (line {self.line_no}): " + ", ".join(parts)

    def as_dict(self) -> dict:
        return {"source": "server_args", "line": self.line_no, "spelling": self.spelling, "kind": self.kind,
                "speculative_algorithm": self.algorithm, "speculative_num_draft_tokens": self.num_draft_tokens,
                "verify_width": self.verify_width, "budget": self.budget, "cuda_graph_max_bs": self.cuda_graph_max_bs,
                "cuda_graph_max_bs_from": self.cuda_graph_max_bs_from, "decode_graphs_disabled": self.decode_graphs_disabled,
                "tp_size": self.tp_size, "max_concurrency": self.effective_max_concurrency,
                "budget_schedule": self.budget_schedule, "trial_set": list(self.trial_set) if self.trial_set else None}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _max_of(value: Any) -> int | None:
    if isinstance(value, (list, tuple)) and value and all(_int(v) is not None for v in value):
        return max(value)
    return None


def _decode_phase(args: dict[str, Any]) -> dict[str, Any]:
    """`cuda_graph_config`'s decode phase: a dict in 0.5.23's `server_args={...}`, else its repr text."""
    cfg = args.get("cuda_graph_config")
    if isinstance(cfg, dict):
        decode = cfg.get("decode")
        return decode if isinstance(decode, dict) else {}
    if isinstance(cfg, str):  # `CudaGraphConfig(decode=PhaseConfig(backend='full', max_bs=32, ...), ...)`
        m = re.search(r"decode=PhaseConfig\(([^()]*)\)", cfg)
        if m:
            return {key: int(raw) if raw.isdigit() else raw
                    for key, raw in re.findall(r"\b(backend|max_bs)='?(\w+)", m.group(1))}
    return {}


def _int_list(value: Any) -> tuple[int, ...] | None:
    """`[1, 2, 8]` (a list in the line, or its text) -> (1, 2, 8); None for anything else."""
    if isinstance(value, str):
        value = [x for x in re.split(r"[\s,\[\]()]+", value) if x]
    if not isinstance(value, (list, tuple)) or not value:
        return None
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        return None


def _algorithm(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip("<> '\"").split(":")[0].split(".")[-1].upper()  # also `<SpeculativeAlgorithm.EAGLE: 1>`
    return None if text in ("", "NONE") else text


def expectations_from_log(parsed: ParsedJournal, *, max_concurrency: int | None = None) -> LogProfile | None:
    """The expectations the log's `server_args=` line states (the current process's), or None
    when the window has no such line."""
    sa = since_start(parsed).latest_server_args or parsed.latest_server_args
    if sa is None:
        return None
    args = sa.args
    algo = _algorithm(args.get("speculative_algorithm"))
    kind = ("autoregressive" if algo is None else "ddtree" if algo == "DDTREE" else
            "dflash" if algo == "DFLASH" else "speculative")
    draft = _int(args.get("speculative_num_draft_tokens"))
    if draft is None and kind == "dflash":
        draft = _int(args.get("speculative_dflash_block_size"))
    decode = _decode_phase(args)
    max_bs, max_bs_from = None, None
    # a bs list wins over max_bs (SGLang sets max_bs = max(bs)); the resolved config over the flags
    for source, value in (("cuda_graph_config[decode].bs", _max_of(decode.get("bs"))),
                          ("cuda_graph_config[decode].max_bs", _int(decode.get("max_bs"))),
                          ("cuda_graph_bs_decode", _max_of(args.get("cuda_graph_bs_decode"))),
                          ("cuda_graph_max_bs_decode", _int(args.get("cuda_graph_max_bs_decode"))),
                          ("cuda_graph_bs", _max_of(args.get("cuda_graph_bs"))),
                          ("cuda_graph_max_bs", _int(args.get("cuda_graph_max_bs")))):
        if value is not None:
            max_bs, max_bs_from = value, source
            break
    disabled = (args.get("disable_cuda_graph") is True or args.get("disable_decode_cuda_graph") is True
                or args.get("cuda_graph_backend_decode") == "disabled" or decode.get("backend") == "disabled")
    recent = since_start(parsed)
    sched_lines = [x for x in recent.schedules if x.line.process == recent.latest_process]
    trial_lines = [x for x in recent.trial_sets if x.line.process == recent.latest_process]
    return LogProfile(budget_schedule=sched_lines[0].text if sched_lines and kind == "ddtree" else None,
                      trial_set=trial_lines[0].candidates if trial_lines and kind == "ddtree" else None,
                      kind=kind, algorithm=algo, num_draft_tokens=draft if kind != "autoregressive" else None,
                      tp_size=_int(args.get("tp_size")), cuda_graph_max_bs=max_bs, cuda_graph_max_bs_from=max_bs_from,
                      decode_graphs_disabled=disabled, max_concurrency=max_concurrency, line_no=sa.line.line_no,
                      spelling=sa.spelling, cuda_graph_bs=_int_list(args.get("cuda_graph_bs_decode")))


# --------------------------------------------------------------------------- helpers


def _rank(label: str) -> str:
    return label or "main"


def _who(profile: ProfileLike) -> str:
    """'profile ddtree', or where a LogProfile's expectations come from."""
    return getattr(profile, "described_as", None) or f"profile {profile.name}"


def _unknown(check: str, diagnosis: str, details: dict) -> Finding:
    """A field the log does not print: not a failure, and the finding says so."""
    return Finding(check=check, ok=True, diagnosis=diagnosis, details={**details, "status": "unknown"})


def _width_need(profile: ProfileLike) -> str:
    """'DDTree budget 16 needs 17' and the like, for diagnoses."""
    if profile.kind == "ddtree":
        return f"DDTree budget {profile.budget} needs {profile.verify_width}"
    if profile.kind == "dflash":
        return f"DFlash block size {profile.block_size} needs {profile.verify_width}"
    if profile.kind != "autoregressive":
        algo = getattr(profile, "algorithm", None) or profile.kind
        return f"{algo} with --speculative-num-draft-tokens {profile.verify_width} needs {profile.verify_width}"
    return "autoregressive decode needs 1"


def _width_fix(profile: ProfileLike) -> str:
    if profile.kind == "ddtree":
        return ("load the DDTree runtime: the release's sglang.env must set SGLANG_PLUGINS=ddtree and put "
                "the release's site/ (runtime wheel) on PYTHONPATH, and the launch args must say "
                f"--speculative-num-draft-tokens {profile.verify_width}; then redeploy")
    if profile.kind == "dflash":
        return (f"launch with --speculative-num-draft-tokens {profile.verify_width} (the drafter's block size) "
                "and redeploy")
    if profile.kind != "autoregressive":
        return ("check the --speculative-* flags in the launch args (--speculative-num-draft-tokens "
                f"{profile.verify_width}) and the runtime that sizes the verify graph, then redeploy")
    return "remove the --speculative-* flags from the launch args and redeploy"


def _expected_kind(profile: ProfileLike) -> str:
    return TARGET_DECODE if profile.kind == "autoregressive" else TARGET_VERIFY


def _target_captures(captures: list[Capture], profile: ProfileLike) -> list[Capture]:
    """The graph the target model decodes with: target verify/decode, or in a legacy log the
    first unlabelled capture on each rank (SGLang captures the target before the draft)."""
    kind = _expected_kind(profile)
    found = [c for c in captures if c.kind == kind]
    if found:
        return found
    first: dict[str, Capture] = {}
    for c in captures:
        if c.kind == LEGACY:
            first.setdefault(c.rank, c)
    return list(first.values())


def _ranges(numbers: Iterable[int]) -> str:
    nums = sorted(set(numbers))
    parts, start = [], None
    for i, n in enumerate(nums):
        if start is None:
            start = n
        if i + 1 == len(nums) or nums[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


def _asker(profile: ProfileLike) -> str:
    return "the log's server_args" if isinstance(profile, LogProfile) else "the profile"


def _where(line) -> str:
    return f"{_rank(line.rank)}, line {line.line_no}" + (f", {line.timestamp:%Y-%m-%d %H:%M:%S}" if line.timestamp else "")


# --------------------------------------------------------------------------- startup


def validate_startup(parsed: ParsedJournal, profile: ProfileLike) -> list[Finding]:
    """Capture-time checks on the journal since the release started (see module doc)."""
    parsed = since_start(parsed)
    captures = parsed.captures_of()  # the current process; earlier ones show up as restarts
    trials = _trial_candidates(parsed, profile)
    if trials is not None:   # one graph set per verify width of the trial set, not one width
        widths = _trialset_findings(parsed, trials, verify_width=profile.verify_width,
                                    active=getattr(profile, "trial_active", None))
    elif _schedule(profile) is not None:
        widths = [_check_band_widths(captures, parsed, profile)]
    else:
        widths = [_check_verify_width(captures, profile)]
    findings = [_check_expected_graphs(captures, parsed, profile),
                _check_complete(captures),
                *widths,
                _check_batch_coverage(captures, profile)]
    if getattr(profile, "cuda_graph_bs", None):
        findings.append(_check_batch_list(captures, profile))
    findings += _check_failures(parsed)
    findings.append(_check_restarts(parsed))
    findings += _report_memory_and_time(captures, parsed)
    return findings


def _check_expected_graphs(captures: list[Capture], parsed: ParsedJournal, profile: ProfileLike) -> Finding:
    check = "capture.expected_graphs"
    kind = _expected_kind(profile)
    if not captures:
        disabled = (": the log's server_args disable decode CUDA graphs"
                    if getattr(profile, "decode_graphs_disabled", False) else "")
        return Finding(check=check, ok=False,
                       diagnosis="no CUDA-graph capture lines in the journal window: capture did not run, "
                                 "or the window misses the start" + disabled,
                       fix="check that the window starts before the unit's start, that the launch args do not "
                           "disable decode graphs (--cuda-graph-backend-decode disabled), and the log level is info")
    # a rank that logs anything in this process (weights, KV pool, ...) must log the capture too:
    # a rank that died quietly before capture shows up here
    logging_ranks = {ln.rank for ln in parsed.lines if ln.rank and ln.process == parsed.latest_process}
    ranks = sorted({c.rank for c in captures} | logging_ranks)
    targets = _target_captures(captures, profile)
    missing = [r for r in ranks if not any(c.rank == r for c in targets)]
    kinds = sorted({c.kind for c in captures})
    details = {"expected": kind, "ranks": [_rank(r) for r in ranks], "kinds": kinds,
               "tp_size": profile.tp_size}
    if not targets:
        other = ", ".join(kinds)
        if kind == TARGET_VERIFY and TARGET_DECODE in kinds:
            diag = (f"only a target decode graph (1 token/request) was captured: the server runs without "
                    f"speculative decoding, but {_who(profile)} needs target verify "
                    f"({_width_need(profile)})")
            fix = ("check --speculative-algorithm in the rendered launch args"
                   + (" and that SGLANG_PLUGINS=ddtree loads the DDTree runtime" if profile.kind == "ddtree" else ""))
        elif kind == TARGET_DECODE and TARGET_VERIFY in kinds:
            diag = (f"a target verify graph was captured: speculative decoding is on, but "
                    f"{_who(profile)} is autoregressive")
            fix = _width_fix(profile)
        else:
            diag = f"no {kind} graph was captured (captured: {other})"
            fix = "read the journal around the capture lines for the cause"
        return Finding(check=check, ok=False, diagnosis=diag, fix=fix, details=details)
    if missing:
        return Finding(check=check, ok=False,
                       diagnosis=f"{kind} graph missing on {', '.join(_rank(r) for r in missing)} "
                                 f"(other ranks captured it)",
                       fix="read that rank's lines in the journal: it died or hung before capture",
                       details=details)
    return Finding(check=check, ok=True,
                   diagnosis=f"{kind} graph captured on {len(ranks)} rank(s): {', '.join(_rank(r) for r in ranks)}",
                   details=details)


def _check_complete(captures: list[Capture]) -> Finding:
    check = "capture.complete"
    open_ = [c for c in captures if not c.complete]
    details = {"captures": len(captures), "incomplete": [c.as_dict() for c in open_]}
    if open_:
        first = open_[0]
        names = sorted({f"{c.kind} on {_rank(c.rank)}" for c in open_})
        return Finding(check=check, ok=False,
                       diagnosis=f"{len(open_)} capture(s) began and never ended ({'; '.join(names[:6])}"
                                 f"{'; ...' if len(names) > 6 else ''}): capture hung or crashed "
                                 f"(first began {_where(first.begin.line)})",
                       fix="read the journal after that line for a traceback or OOM; if it hung, lower "
                           "--cuda-graph-max-bs-decode or --mem-fraction-static and redeploy",
                       details=details)
    if not captures:
        return Finding(check=check, ok=False, diagnosis="no capture began, so none can be shown complete",
                       fix="see capture.expected_graphs", details=details)
    return Finding(check=check, ok=True, diagnosis=f"all {len(captures)} capture(s) have begin and end",
                   details=details)


def _check_verify_width(captures: list[Capture], profile: ProfileLike) -> Finding:
    check = "capture.verify_width"
    kind = _expected_kind(profile)
    want = profile.verify_width
    targets = _target_captures(captures, profile)
    details: dict = {"expected_kind": kind, "expected_tokens_per_req": want,
                     "per_rank": {_rank(c.rank): c.num_tokens_per_req for c in targets}}
    if want is None:
        return _unknown(check, f"unknown: the log's server_args line does not show speculative_num_draft_tokens, "
                               f"so the {kind} graph's width has nothing to be checked against", details)
    if not targets:
        return Finding(check=check, ok=False,
                       diagnosis=f"no {kind} graph to read num_tokens_per_req from ({_width_need(profile)})",
                       fix="see capture.expected_graphs", details=details)
    if all(c.kind == LEGACY for c in targets):
        if profile.kind == "autoregressive":
            return Finding(check=check, ok=True,
                           diagnosis="legacy capture lines print no num_tokens_per_req; a non-speculative "
                                     "decode graph is 1 token/request", details=details)
        return _unknown(check, f"unknown: the log does not show the verify graph's tokens/request: its capture "
                               f"lines use the pre-0.5.11 spelling ('Capture cuda graph begin/end'), which prints no "
                               f"num_tokens_per_req ({_width_need(profile)})", details)
    unknown = [c for c in targets if c.num_tokens_per_req is None]
    wrong = [c for c in targets if c.num_tokens_per_req is not None and c.num_tokens_per_req != want]
    if wrong:
        got = sorted({c.num_tokens_per_req for c in wrong})
        got_text = "/".join(str(g) for g in got)
        diag = f"{kind} graph captured with {got_text} tokens/request, {_width_need(profile)}"
        if profile.kind == "ddtree":
            hint = ("the drafter's block size" if profile.block_size in got else None)
            diag += (f"{' (' + hint + ')' if hint else ''}: the runtime lacks the graph-sizing patch "
                     "(runtime/ plugin not loaded? check SGLANG_PLUGINS)")
        elif profile.kind == "dflash":
            diag += ": --speculative-num-draft-tokens does not match the drafter's block size"
        details["wrong_ranks"] = [_rank(c.rank) for c in wrong]
        return Finding(check=check, ok=False, diagnosis=diag, fix=_width_fix(profile), details=details)
    if unknown:
        return Finding(check=check, ok=False,
                       diagnosis=f"{kind} capture lines on {', '.join(_rank(c.rank) for c in unknown)} print no "
                                 f"num_tokens_per_req: cannot show {_width_need(profile)}",
                       fix="validate a journal from SGLang 0.5.23, whose capture lines print it", details=details)
    return Finding(check=check, ok=True,
                   diagnosis=f"{kind} graph captured with {want} tokens/request on {len(targets)} rank(s) "
                             f"({_width_need(profile)})", details=details)


def _check_batch_coverage(captures: list[Capture], profile: ProfileLike) -> Finding:
    check = "capture.batch_coverage"
    need = profile.effective_max_concurrency
    targets = [c for c in _target_captures(captures, profile) if c.complete]
    with_bs = [c for c in targets if c.bs]
    details: dict = {"max_concurrency": need, "profile_cuda_graph_max_bs": profile.cuda_graph_max_bs,
                     "per_rank": {_rank(c.rank): list(c.bs) if c.bs else None for c in targets}}
    if not targets:
        return Finding(check=check, ok=False, diagnosis="no completed target graph capture to read batch sizes from",
                       fix="see capture.expected_graphs and capture.complete", details=details)
    if need is None:
        return _unknown(check, "unknown: the log's server_args line does not show cuda_graph_max_bs, so the "
                               "concurrency the graphs must cover is not known (pass --max-concurrency N)", details)
    if not with_bs and all(c.kind == LEGACY for c in targets):
        return _unknown(check, f"unknown: the log does not show the captured batch sizes: its pre-0.5.11 capture "
                               f"lines print no bs list (max concurrency {need})", details)
    if not with_bs:
        return Finding(check=check, ok=False,
                       diagnosis="the capture lines print no bs=[...] list: cannot show the graphs cover "
                                 f"max concurrency {need}",
                       fix="validate a journal from SGLang 0.5.23, whose capture end line prints bs=[...]",
                       details=details)
    # a batch of n runs in the smallest captured graph >= n, so coverage is the largest bs, on the worst rank
    # (a budget schedule captures one graph per band: a rank's largest is over all of its graphs)
    covered = _worst_rank_max_bs(with_bs)
    details["captured_max_bs"] = covered
    short_of_profile = profile.cuda_graph_max_bs is not None and covered < profile.cuda_graph_max_bs
    if covered < need:
        return Finding(check=check, ok=False,
                       diagnosis=f"captured batch sizes reach {covered}, max concurrency is {need}: "
                                 f"concurrencies {_ranges(range(covered + 1, need + 1))} will run without CUDA graphs"
                                 + (f" ({_asker(profile)} asked for {profile.cuda_graph_max_bs}: SGLang captured fewer, "
                                    "usually for lack of memory)" if short_of_profile else ""),
                       fix=f"raise --cuda-graph-max-bs-decode (profile cuda_graph_max_bs) to at least {need}, "
                           f"or serve at most {covered} concurrent requests",
                       details=details)
    return Finding(check=check, ok=True,
                   diagnosis=f"captured batch sizes reach {covered}, covering max concurrency {need}",
                   details=details)


def _check_batch_list(captures: list[Capture], profile: ProfileLike) -> Finding:
    """A profile with an explicit capture list (cuda_graph_bs, --capture-from-traffic): every
    rank's target graphs captured exactly those batch sizes (SGLang 0.5.23 takes the list as it
    is, clamped to --max-running-requests)."""
    check = "capture.batch_list"
    want = list(profile.captured_batch_sizes)  # type: ignore[attr-defined]
    targets = [c for c in _target_captures(captures, profile) if c.complete]
    per_rank: dict[str, set[int]] = {}
    for c in targets:
        if c.bs:
            per_rank.setdefault(c.rank, set()).update(c.bs)
    details: dict = {"want": want, "per_rank": {_rank(r): sorted(v) for r, v in per_rank.items()}}
    if not per_rank:
        return Finding(check=check, ok=False, diagnosis="no completed target capture line with a bs=[...] list: "
                                                        f"cannot show the chosen batch sizes {want} were captured",
                       fix="see capture.expected_graphs and capture.complete", details=details)
    wrong = {r: sorted(v) for r, v in per_rank.items() if sorted(v) != want}
    if wrong:
        r, got = next(iter(wrong.items()))
        extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
        return Finding(check=check, ok=False,
                       diagnosis=f"{_rank(r)} captured bs {got}, the profile's cuda_graph_bs is {want}"
                                 + (f" (missing {missing})" if missing else "") + (f" (extra {extra})" if extra else ""),
                       fix="check the unit's --cuda-graph-bs-decode (opsctl render) and SGLang's own clamps "
                           "(--max-running-requests, attention-TP alignment)", details=details)
    return Finding(check=check, ok=True,
                   diagnosis=f"captured exactly the chosen batch sizes {_ranges(want)} on {len(per_rank)} rank(s)",
                   details=details)


def _worst_rank_max_bs(captures: list[Capture]) -> int:
    per_rank: dict[str, int] = {}
    for c in captures:
        per_rank[c.rank] = max(per_rank.get(c.rank, 0), max(c.bs))  # type: ignore[arg-type]
    return min(per_rank.values())


def _schedule(profile: ProfileLike) -> "schedule_mod.BudgetSchedule | None":
    return getattr(profile, "schedule", None) if profile.kind == "ddtree" else None


def _check_band_widths(captures: list[Capture], parsed: ParsedJournal, profile: ProfileLike) -> Finding:
    """A DDTree budget schedule: every captured batch size's verify graph at its band's width
    (budget + 1), on every rank, and every rank running the schedule the profile asks for."""
    check = "capture.band_widths"
    sched = _schedule(profile)
    assert sched is not None
    targets = [c for c in _target_captures(captures, profile) if c.kind == TARGET_VERIFY]
    lines = [x for x in parsed.schedules if x.line.process == parsed.latest_process]
    details: dict = {"schedule": sched.text, "widths": list(sched.widths),
                     "schedule_lines": {_rank(x.rank): x.text for x in lines},
                     "per_rank": defaultdict(list)}
    for c in targets:
        details["per_rank"][_rank(c.rank)].append({"num_tokens_per_req": c.num_tokens_per_req,
                                                   "bs": list(c.bs) if c.bs else None})
    details["per_rank"] = dict(details["per_rank"])
    fix_runtime = ("deploy a runtime with budget schedules (runtime/README.md, 'Budget schedule') and check that the "
                   f"unit's environment sets {schedule_mod.SCHEDULE_ENV}; then redeploy")
    if not targets:
        return Finding(check=check, ok=False, diagnosis=f"no target verify graph to read the bands' widths from "
                       f"(schedule {sched.text})", fix="see capture.expected_graphs", details=details)
    if not lines:
        return Finding(check=check, ok=False,
                       diagnosis=f"the runtime printed no 'DDTree budget schedule' line: it did not load the "
                                 f"schedule {sched.text} (every batch size then runs the widest band)",
                       fix=fix_runtime, details=details)
    other = [x for x in lines if x.text != sched.text]
    if other:
        return Finding(check=check, ok=False,
                       diagnosis=f"{_rank(other[0].rank)} loaded budget schedule {other[0].text}, "
                                 f"{_asker(profile)} says {sched.text}",
                       fix="the release's schedule file and profile disagree: re-render and redeploy", details=details)
    ranks = sorted({c.rank for c in targets} | {x.rank for x in lines})
    wrong: dict[tuple[int, int], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))  # (band, got) -> rank -> bs
    unknown = []
    captured_by_rank: dict[str, list[int]] = defaultdict(list)
    for c in targets:
        captured_by_rank[c.rank].extend(c.bs or ())
    band_bs: dict[int, set[int]] = defaultdict(set)
    for c in targets:
        if not c.bs or c.num_tokens_per_req is None:
            unknown.append(c)
            continue
        for bs in c.bs:
            i = sched.band_index(bs, captured_by_rank[c.rank])
            band_bs[i].add(bs)
            if c.num_tokens_per_req != sched.bands[i].width:
                wrong[(i, c.num_tokens_per_req)][_rank(c.rank)].append(bs)
    missing_ranks = [r for r in ranks if r not in captured_by_rank]
    allcap = sorted({b for sizes in captured_by_rank.values() for b in sizes})
    if wrong:
        (i, got), by_rank = next(iter(sorted(wrong.items())))
        band = sched.bands[i]
        sizes = sorted({b for v in by_rank.values() for b in v})
        details["wrong"] = [{"band": sched.band_range(i, allcap), "budget": sched.bands[i].budget, "got": g,
                             "want": sched.bands[i].width, "ranks": sorted(r)} for (i, g), r in sorted(wrong.items())]
        return Finding(check=check, ok=False,
                       diagnosis=f"batch {sched.band_range(i, allcap)} (budget {band.budget}) has its verify graph captured with "
                                 f"{got} tokens/request for bs {_ranges(sizes)} on "
                                 f"{'every rank (' + str(len(ranks)) + ')' if len(by_rank) == len(ranks) else ', '.join(sorted(by_rank))}, needs "
                                 f"{band.width} (budget {band.budget} + 1)"
                                 + (f"; {len(wrong) - 1} more band/width mismatch(es)" if len(wrong) > 1 else ""),
                       fix=fix_runtime, details=details)
    if unknown or missing_ranks:
        who = sorted({_rank(c.rank) for c in unknown} | {_rank(r) for r in missing_ranks})
        return Finding(check=check, ok=False,
                       diagnosis=f"cannot show the bands' widths on {', '.join(who)}: capture lines without "
                                 "num_tokens_per_req or bs=[...], or no verify capture",
                       fix="validate a journal from SGLang 0.5.23 with the DDTree runtime's schedule lines",
                       details=details)
    parts = [f"batch {sched.band_range(i, allcap)}: {b.width} token{'s' if b.width != 1 else ''}/request "
             f"(bs {_ranges(band_bs[i])})"
             for i, b in enumerate(sched.bands) if band_bs.get(i)]
    return Finding(check=check, ok=True,
                   diagnosis=f"budget schedule {sched.text} on {len(ranks)} rank(s), each band's verify graph at its "
                             f"width: " + "; ".join(parts), details=details)


# --------------------------------------------------------------------------- a DDTree trial set (issue #37)

_TRIAL_FIX_RUNTIME = ("deploy a runtime with trial sets (runtime/README.md, 'Trial set and live switch') and check that "
                      f"the unit's environment sets {schedule_mod.TRIAL_SET_ENV} to the release's trial-set file; "
                      "then redeploy")


def _trial_candidates(parsed: ParsedJournal, profile: ProfileLike) -> list[str] | None:
    """The trial set a DDTree start is judged against: the profile's `trial_set` (candidates), else the
    runtime's `DDTree trial set:` line of the current process (the runtime refuses to start with a set
    whose widest width is not --speculative-num-draft-tokens, which trialset.loaded checks); None: no
    trial set."""
    if profile.kind != "ddtree":
        return None
    want = getattr(profile, "trial_set", None)
    if want:
        return [str(c) for c in want]
    lines = _trial_set_lines(parsed)
    return list(lines[0].candidates) if lines else None


def _trial_set_lines(parsed: ParsedJournal) -> list:
    lines = [x for x in parsed.trial_sets if x.line.process == parsed.latest_process]
    return sorted(lines, key=lambda x: (x.line.tp_rank is None, x.line.tp_rank or 0))   # TP0's first


def _short_bs(bs) -> str:
    return _ranges(bs) if bs else "none"


def validate_trialset_start(parsed: ParsedJournal, candidates=None, *, active: str | int | None = None,
                            verify_width: int | None = None) -> list[Finding]:
    """Findings on a DDTree trial-set start (runtime/README.md, "Trial set and live switch"), on the
    journal since the release started (its last server process):

    - `trialset.loaded`: every rank printed `DDTree trial set:` with these `candidates` (any spelling
      that normalises to the runtime's names: 8, "8", "1:8"; None: the log's own set), and its widest
      width is `verify_width` (the server's --speculative-num-draft-tokens) when given;
    - `capture.trial_widths`: on every rank one target-verify capture per verify width any candidate
      needs, over exactly the captured batch sizes some candidate routes to it, and no other width;
    - `capture.trial_drafts`: the drafter captured once per draft budget over the bs routed to it
      (unknown when the drafter's graphs were not captured at all);
    - `trialset.active`: the candidate serving (the last `DDTree active:` line), a candidate of the set,
      and `active` when given (what the control file asked for), with the refusals since.

    The rest of a start (failures, restarts, batch coverage, memory) is `validate_startup`'s, which runs
    these same checks in place of `capture.verify_width` for a trial-set start."""
    parsed = since_start(parsed)
    return _trialset_findings(parsed, candidates, active=active, verify_width=verify_width)


def _trialset_findings(parsed: ParsedJournal, candidates, *, active=None, verify_width=None) -> list[Finding]:
    set_lines = _trial_set_lines(parsed)
    if candidates is None:
        candidates = list(set_lines[0].candidates) if set_lines else None
    if not candidates:
        return [Finding(check="trialset.loaded", ok=False,
                        diagnosis="no trial set to check: none was given and the runtime printed no 'DDTree trial "
                                  "set' line since the release started", fix=_TRIAL_FIX_RUNTIME,
                        details={"process": parsed.latest_process})]
    try:
        names = [schedule_mod.candidate_name(c) for c in candidates]
        want_active = schedule_mod.candidate_name(active) if active is not None else None
    except ConfigError as exc:
        return [Finding(check="trialset.loaded", ok=False, diagnosis=f"the expected trial set is not one: {exc.problem}",
                        fix=exc.fix, details={"candidates": [str(c) for c in candidates]})]
    return [_check_trial_loaded(parsed, names, set_lines, verify_width),
            _check_trial_widths(parsed, names),
            _check_trial_drafts(parsed, names),
            _check_trial_active(parsed, names, want_active)]


def _check_trial_loaded(parsed: ParsedJournal, names: list[str], set_lines: list, verify_width: int | None) -> Finding:
    check = "trialset.loaded"
    widths = schedule_mod.trial_widths(names)
    budgets = schedule_mod.trial_draft_budgets(names)
    details: dict = {"candidates": names, "widths": widths, "draft_budgets": budgets,
                     "set_lines": {_rank(x.rank): list(x.candidates) for x in set_lines},
                     "configured_active": set_lines[0].active if set_lines else None, "verify_width": verify_width}
    if not set_lines:
        return Finding(check=check, ok=False,
                       diagnosis=f"the runtime printed no 'DDTree trial set' line: it did not load the trial set "
                                 f"{', '.join(names)} (the server then serves one budget, and the control file "
                                 "switches nothing)", fix=_TRIAL_FIX_RUNTIME, details=details)
    other = [x for x in set_lines if set(x.candidates) != set(names)]
    if other:
        x = other[0]
        return Finding(check=check, ok=False,
                       diagnosis=f"{_rank(x.rank)} loaded trial set {', '.join(x.candidates)}, expected {', '.join(names)}",
                       fix="the release's trial-set file and what was asked disagree: re-render and redeploy",
                       details=details)
    logging = {ln.rank for ln in parsed.lines if ln.rank and ln.process == parsed.latest_process}
    missing = sorted(logging - {x.rank for x in set_lines})
    if missing:
        return Finding(check=check, ok=False,
                       diagnosis=f"no 'DDTree trial set' line on {', '.join(_rank(r) for r in missing)} (other ranks "
                                 "loaded it): those ranks did not load the runtime's trial set",
                       fix=_TRIAL_FIX_RUNTIME, details=details)
    if verify_width is not None and widths and widths[0] != verify_width:
        return Finding(check=check, ok=False,
                       diagnosis=f"the trial set's widest verify width is {widths[0]} (budget {widths[0] - 1}), "
                                 f"--speculative-num-draft-tokens is {verify_width}: they must be equal",
                       fix=f"render the release with --speculative-num-draft-tokens {widths[0]} (the largest budget "
                           "of the trial set + 1) and redeploy", details=details)
    ranks = sorted({x.rank for x in set_lines})
    return Finding(check=check, ok=True,
                   diagnosis=f"trial set {', '.join(names)} loaded on {len(ranks)} rank(s) (verify widths "
                             f"{','.join(map(str, widths))}; draft budgets {','.join(map(str, budgets)) or '-'}; "
                             f"configured active {set_lines[0].active})", details=details)


def _per_rank_captures(parsed: ParsedJournal, *kinds: str) -> dict[str, list[Capture]]:
    out: dict[str, list[Capture]] = defaultdict(list)
    for c in parsed.captures_of():
        if c.kind in kinds:
            out[c.rank].append(c)
    return dict(out)


def _trial_routing(parsed: ParsedJournal) -> dict:
    """The active candidate and `trial bs` of the last start's trial-set line (what the others capture)."""
    lines = _trial_set_lines(parsed)
    if not lines or not lines[0].trial_bs:
        return {}
    return {"active": lines[0].active, "trial_bs": list(lines[0].trial_bs)}


def _check_trial_widths(parsed: ParsedJournal, names: list[str]) -> Finding:
    """Each verify width of the trial set captured on every rank, over the bs its candidates route to it."""
    check = "capture.trial_widths"
    targets = _per_rank_captures(parsed, TARGET_VERIFY)
    units = [u for u in parsed.trial_units if u.kind == "width" and u.line.process == parsed.latest_process]
    details: dict = {"candidates": names, "widths": schedule_mod.trial_widths(names),
                     "per_rank": {_rank(r): [{"num_tokens_per_req": c.num_tokens_per_req,
                                              "bs": list(c.bs) if c.bs else None} for c in cs]
                                  for r, cs in targets.items()}}
    if not targets:
        if units and all(u.bs is None for u in units):
            return _unknown(check, "unknown: CUDA graphs are disabled (the runtime's width lines say 'bs -'): no "
                                   "verify graph to check", details)
        return Finding(check=check, ok=False, diagnosis=f"no target verify graph to read the trial set's widths from "
                       f"({', '.join(names)})", fix="see capture.expected_graphs", details=details)
    logging = {ln.rank for ln in parsed.lines if ln.rank and ln.process == parsed.latest_process}
    problems: list[tuple[str, str]] = []   # (what, rank)
    plan = None
    for rank in sorted(set(targets) | logging):
        caps = targets.get(rank, [])
        if not caps:
            problems.append(("no target verify capture", rank))
            continue
        if any(c.num_tokens_per_req is None or not c.bs for c in caps):
            problems.append(("a capture line without num_tokens_per_req or bs=[...]", rank))
            continue
        plan = schedule_mod.trial_plan(names, sorted({b for c in caps for b in c.bs}),  # type: ignore[union-attr]
                                       **_trial_routing(parsed))
        want = {u.key: set(u.bs) for u in plan.widths if u.bs}
        got: dict[int, set[int]] = defaultdict(set)
        for c in caps:
            n = c.num_tokens_per_req
            if c.trial is not None and c.trial in want and n != c.trial:
                # the graphs after `DDTree trial width W` captured at another width: that width's graphs are wrong
                users = next(u.users for u in plan.widths if u.key == c.trial)
                problems.append((f"verify width {c.trial} (budget {c.trial - 1}, for {', '.join(users)}) captured with "
                                 f"{n} tokens/request (bs {_short_bs(c.bs)}), needs {c.trial}", rank))
                n = c.trial
            got[n].update(c.bs)  # type: ignore[index, arg-type]
        for w in sorted(set(got) - set(want), reverse=True):
            problems.append((f"a target verify graph captured with {w} tokens/request (bs {_short_bs(got[w])}), a width "
                             f"no candidate needs (trial widths {','.join(str(x) for x in want)})", rank))
        for w in sorted(set(want) - set(got), reverse=True):
            users = next(u.users for u in plan.widths if u.key == w)
            problems.append((f"verify width {w} (budget {w - 1}, for {', '.join(users)}) not captured", rank))
        for w in sorted(set(want) & set(got), reverse=True):
            if got[w] != want[w]:
                problems.append((f"verify width {w} (budget {w - 1}) captured for bs {_short_bs(got[w])}, its candidates "
                                 f"route bs {_short_bs(want[w])} to it", rank))
    ranks = sorted(set(targets) | logging)
    if problems:
        by_what: dict[str, list[str]] = defaultdict(list)
        for what, rank in problems:
            by_what[what].append(rank)
        what, where = next(iter(by_what.items()))
        on = f"every rank ({len(ranks)})" if len(where) == len(ranks) and len(ranks) > 1 else ", ".join(_rank(r) for r in where)
        details["problems"] = [{"problem": w, "ranks": [_rank(r) for r in rs]} for w, rs in by_what.items()]
        return Finding(check=check, ok=False,
                       diagnosis=f"on {on}: {what}" + (f"; {len(by_what) - 1} more problem(s)" if len(by_what) > 1 else ""),
                       fix=_TRIAL_FIX_RUNTIME, details=details)
    assert plan is not None
    parts = [f"width {u.key} (bs {_short_bs(u.bs)}) for {', '.join(u.users)}" for u in plan.widths if u.bs]
    return Finding(check=check, ok=True,
                   diagnosis=f"trial set {', '.join(names)} on {len(ranks)} rank(s), each verify width captured over "
                             "the batch sizes its candidates route to it: " + "; ".join(parts), details=details)


def _check_trial_drafts(parsed: ParsedJournal, names: list[str]) -> Finding:
    """The drafter captured once per draft budget (with that budget's head), over the bs routed to it."""
    check = "capture.trial_drafts"
    drafts = _per_rank_captures(parsed, *TRIAL_DRAFT_KINDS)
    targets = _per_rank_captures(parsed, TARGET_VERIFY)
    units = [u for u in parsed.trial_units if u.kind == "draft" and u.line.process == parsed.latest_process]
    details: dict = {"draft_budgets": schedule_mod.trial_draft_budgets(names),
                     "per_rank": {_rank(r): [{"budget": c.trial, "bs": list(c.bs) if c.bs else None,
                                              "complete": c.complete} for c in cs] for r, cs in drafts.items()}}
    if not drafts and not units:
        return _unknown(check, "unknown: the drafter's CUDA graphs were not captured (no draft capture and no 'DDTree "
                               "trial draft budget' line): its budgets run eagerly", details)
    problems: list[tuple[str, str]] = []
    plan = None
    for rank in sorted(set(drafts) | set(targets)):
        tcaps = [c for c in targets.get(rank, []) if c.bs]
        if not tcaps:
            problems.append(("no target verify capture to route the draft budgets' batch sizes by", rank))
            continue
        plan = schedule_mod.trial_plan(names, sorted({b for c in tcaps for b in c.bs}),  # type: ignore[union-attr]
                                       **_trial_routing(parsed))
        mine = drafts.get(rank, [])
        for u in plan.drafts:
            caps = [c for c in mine if c.trial == u.key]
            if not caps:
                problems.append((f"draft budget {u.key} (for {', '.join(u.users)}) not captured", rank))
            elif not all(c.complete for c in caps):
                problems.append((f"draft budget {u.key}'s capture began and never ended", rank))
            elif set(b for c in caps for b in (c.bs or ())) != set(u.bs):
                got = sorted({b for c in caps for b in (c.bs or ())})
                problems.append((f"draft budget {u.key} captured for bs {_short_bs(got)}, its candidates route bs "
                                 f"{_short_bs(u.bs)} to it", rank))
        extra = sorted({c.trial for c in mine if c.trial is not None} - {u.key for u in plan.drafts}, reverse=True)
        for b in extra:
            problems.append((f"a draft capture for budget {b}, which no candidate routes a captured bs to", rank))
    if problems:
        by_what: dict[str, list[str]] = defaultdict(list)
        for what, rank in problems:
            by_what[what].append(rank)
        what, where = next(iter(by_what.items()))
        details["problems"] = [{"problem": w, "ranks": [_rank(r) for r in rs]} for w, rs in by_what.items()]
        return Finding(check=check, ok=False,
                       diagnosis=f"on {', '.join(_rank(r) for r in where)}: {what}"
                                 + (f"; {len(by_what) - 1} more problem(s)" if len(by_what) > 1 else ""),
                       fix=_TRIAL_FIX_RUNTIME, details=details)
    assert plan is not None
    ranks = sorted(set(drafts) | set(targets))
    return Finding(check=check, ok=True,
                   diagnosis=f"the drafter captured once per draft budget on {len(ranks)} rank(s): "
                             + "; ".join(f"budget {u.key} (bs {_short_bs(u.bs)})" for u in plan.drafts),
                   details=details)


def _check_trial_active(parsed: ParsedJournal, names: list[str], want: str | None) -> Finding:
    """Which candidate serves (TP0's last `DDTree active:` line), and whether it is the one asked for."""
    check = "trialset.active"
    state = journal_mod.trial_state(parsed)
    if state is None:
        return Finding(check=check, ok=False, diagnosis="no trial set loaded, so no candidate is active",
                       fix="see trialset.loaded", details={"expected": want})
    details = {k: state[k] for k in ("active", "since_step", "configured_active", "announced", "switches", "refusals")}
    details["expected"] = want
    current, since = state["active"], state["since_step"]
    late = [r for r in state["refusals"] if r["after_last_switch"]]
    if not state["announced"]:
        if want is not None and want != current:
            return Finding(check=check, ok=False,
                           diagnosis=f"the runtime has not said which candidate serves yet (no 'DDTree active:' line); "
                                     f"the trial-set file configures {current}, {want} was asked for",
                           fix="wait for the server to be ready, send load, and read the journal again", details=details)
        return _unknown(check, f"unknown: the runtime has not printed 'DDTree active:' yet (it does when its graphs are "
                               f"captured); the trial-set file configures {current}", details)
    if current not in names:
        return Finding(check=check, ok=False,
                       diagnosis=f"the runtime serves {current}, which is not a candidate of {', '.join(names)}",
                       fix=_TRIAL_FIX_RUNTIME, details=details)
    if want is not None and current != want:
        # the refusal of what was asked for, else the last of a control file that could not be read
        refused = [r for r in late if r["candidate"] == want] or [r for r in late if r["candidate"] is None]
        why = (f"; the control was refused at line {refused[-1]['line']}: {refused[-1]['reason']}" if refused else
               "; no refusal: the switch is applied at the next meeting of decode steps (every "
               f"{schedule_mod.CONTROL_EVERY_STEPS_ENV} decode steps), so an idle server has not applied it yet")
        return Finding(check=check, ok=False,
                       diagnosis=f"serving {current} since decode step {since}, {want} was asked for" + why,
                       fix=("write the control file again, atomically, naming a captured candidate "
                            f"({', '.join(names)})" if refused else
                            "send load (the switch needs decode steps) and read the journal again"),
                       details=details)
    switches = max(len(state["switches"]) - 1, 0)
    extra = (f"; {len(state['refusals'])} control(s) refused, the last: {state['refusals'][-1]['reason']}"
             if state["refusals"] else "")
    return Finding(check=check, ok=True,
                   diagnosis=f"serving {current} since decode step {since} ({switches} switch(es) since the start)" + extra,
                   details=details)


def _failure_text(f: Failure) -> str:
    text = f.summary[:200]
    if f.headless:
        text += " (the tail of a traceback: its 'Traceback (most recent call last):' line is before the window)"
    return text


def _check_failures(parsed: ParsedJournal) -> list[Finding]:
    """startup.* for failures before the ready line (all of them when the server never got
    ready), serving.errors for those after it."""
    out = []
    serving = [f for f in parsed.failures if f.after_ready]
    groups = [
        ("startup.capture_failed", ("capture_failed",),
         "lower --mem-fraction-static (e.g. 0.8) or --cuda-graph-max-bs-decode and redeploy; "
         "capture.memory shows what the graphs took"),
        ("startup.cuda_oom", ("cuda_oom",),
         "lower --mem-fraction-static or --cuda-graph-max-bs-decode (graph memory is in capture.memory), "
         "or the DDTree budget (verify width x batch is the verify forward's size)"),
        ("startup.errors", ("traceback", "fatal", "kv_alloc_failed"),
         "read the traceback in the journal (journalctl -u UNIT --since <release start>) and fix its cause"),
    ]
    for check, kinds, fix in groups:
        found = [f for f in parsed.failures if f.kind in kinds and not f.after_ready]
        details = {"count": len(found), "failures": [f.as_dict() for f in found[:10]]}
        if check == "startup.cuda_oom":
            # `Decode out of memory happened` / `KV cache pool is full. Retract requests` is SGLang
            # retracting requests when the KV pool fills under load: normal, not a failure
            details["kv_retractions"] = len(parsed.retractions)
        if found:
            first = found[0]
            what = {"startup.capture_failed": "CUDA-graph capture failed",
                    "startup.cuda_oom": "CUDA out of memory",
                    "startup.errors": "error(s)"}[check]
            out.append(Finding(check=check, ok=False,
                               diagnosis=f"{what} since the release started ({len(found)}x); first at "
                                         f"{_where(first.line)}: {_failure_text(first)}",
                               fix=fix, details=details))
        else:
            none = {"startup.capture_failed": "no 'Capture cuda graph failed'",
                    "startup.cuda_oom": "no CUDA out-of-memory error",
                    "startup.errors": "no traceback or fatal error"}[check]
            out.append(Finding(check=check, ok=True, diagnosis=none + (" during start-up" if serving else ""),
                               details=details))
    if serving or parsed.ready:
        out.append(_check_serving(serving, parsed))
    return out


def _check_serving(serving: list[Failure], parsed: ParsedJournal) -> Finding:
    check = "serving.errors"
    details = {"count": len(serving), "failures": [f.as_dict() for f in serving[:10]]}
    if not serving:
        return Finding(check=check, ok=True, diagnosis=f"no exception after start-up (ready at {_where(parsed.ready[-1])})",
                       details=details)
    first = serving[0]
    ready = next((r for r in parsed.ready if r.process == first.line.process), None)
    kinds = sorted({f.kind for f in serving})
    return Finding(check=check, ok=False,
                   diagnosis=f"exception after start-up, while serving ({len(serving)}x: {', '.join(kinds)})"
                             + (f"; the server was ready at {_where(ready)}" if ready is not None else "")
                             + f"; first at {_where(first.line)}: {_failure_text(first)}",
                   fix="read the journal from that line on (journalctl -u UNIT --since <release start>) and fix "
                       "its cause; an exception in CUDA-graph replay usually means the served batches do not match "
                       "the captured graph (see capture.verify_width and capture.batch_coverage)",
                   details=details)


def _check_restarts(parsed: ParsedJournal) -> Finding:
    check = "startup.restarts"
    starts = parsed.process_starts
    events = parsed.unit_events
    started = [e for e in events if e.kind == "started"]
    died, requested = [], False  # an exit after a requested stop (`Stopping ...`) is not a death
    for e in events:
        if e.kind == "started":
            requested = False
        elif e.kind == "stopping":
            requested = True
        elif e.kind in ("exited", "failed", "restart_scheduled") and not requested:
            died.append(e)
    restarts = max(parsed.restarts, len(started) - 1)
    details = {"process_starts": [{"pid": s.pid, "line": s.line.line_no, "reason": s.reason,
                                   "timestamp": s.line.timestamp.isoformat() if s.line.timestamp else None}
                                  for s in starts],
               "unit_events": [{"kind": e.kind, "line": e.line.line_no, "text": e.line.text[:200]} for e in events]}
    if restarts or died:
        parts = []
        if restarts:
            pids = [str(s.pid) for s in starts if s.pid is not None]
            parts.append(f"the server restarted {restarts} time(s) since the release started"
                         + (f" (pid {' -> '.join(pids)})" if len(pids) > 1 else ""))
        if died:
            parts.append(f"systemd: '{died[0].line.text[:160]}'")
        return Finding(check=check, ok=False, diagnosis="; ".join(parts),
                       fix="read the journal before the first restart for its cause (startup.* findings list "
                           "errors found), fix it and redeploy", details=details)
    return Finding(check=check, ok=True, diagnosis="one server process since the release started", details=details)


def _report_memory_and_time(captures: list[Capture], parsed: ParsedJournal) -> list[Finding]:
    done = [c for c in captures if c.complete]
    if not done:
        return []
    per_kind: dict[str, dict] = defaultdict(lambda: {"ranks": 0, "mem_usage_gb_max": None,
                                                     "avail_mem_after_gb_min": None, "elapsed_s_max": None})
    per_rank_mem: dict[str, float] = defaultdict(float)
    per_rank_time: dict[str, float] = defaultdict(float)
    for c in done:
        k = per_kind[c.kind]
        k["ranks"] += 1
        if c.mem_usage_gb is not None:
            k["mem_usage_gb_max"] = max(k["mem_usage_gb_max"] or 0.0, c.mem_usage_gb)
            per_rank_mem[c.rank] += c.mem_usage_gb
        if c.avail_mem_after_gb is not None:
            k["avail_mem_after_gb_min"] = (c.avail_mem_after_gb if k["avail_mem_after_gb_min"] is None
                                           else min(k["avail_mem_after_gb_min"], c.avail_mem_after_gb))
        if c.elapsed_s is not None:
            k["elapsed_s_max"] = max(k["elapsed_s_max"] or 0.0, c.elapsed_s)
            per_rank_time[c.rank] += c.elapsed_s
    kinds = dict(per_kind)
    mem_total = round(max(per_rank_mem.values()), 2) if per_rank_mem else None
    avail = [v["avail_mem_after_gb_min"] for v in kinds.values() if v["avail_mem_after_gb_min"] is not None]
    mem_text = ", ".join(f"{k} {v['mem_usage_gb_max']:.2f} GB" for k, v in kinds.items()
                         if v["mem_usage_gb_max"] is not None) or "not printed"
    mem_details = {"per_kind": kinds, "total_gb_max_rank": mem_total,
                   "avail_mem_after_gb_min": min(avail) if avail else None}
    if mem_total is None and not avail:
        mem = _unknown("capture.memory", "unknown: the log does not show the graphs' memory (its capture lines print "
                                         "no 'mem usage=' and no 'avail mem=')", mem_details)
    else:
        mem = Finding(check="capture.memory", ok=True,
                      diagnosis=f"graph memory per rank (max): {mem_text}"
                                + (f"; total {mem_total:.2f} GB" if mem_total is not None else "")
                                + (f"; {min(avail):.2f} GB left after capture" if avail else ""),
                      details=mem_details)
    time_total = round(max(per_rank_time.values()), 2) if per_rank_time else None
    time_text = ", ".join(f"{k} {v['elapsed_s_max']:.1f} s" for k, v in kinds.items()
                          if v["elapsed_s_max"] is not None) or "not printed"
    details: dict = {"per_kind": {k: v["elapsed_s_max"] for k, v in kinds.items()}, "total_s_max_rank": time_total}
    ready_after = None
    ready = [r for r in parsed.ready if r.process == parsed.latest_process]
    begin_ts = [c.begin.line.timestamp for c in captures if c.begin.line.timestamp]
    if ready and ready[0].timestamp and begin_ts:
        ready_after = (ready[0].timestamp - min(begin_ts)).total_seconds()
        details["ready_after_first_capture_s"] = ready_after
    if time_total is None and ready_after is None:
        tm = _unknown("capture.time", "unknown: the log does not show how long capture took (its capture lines print "
                                      "no elapsed time and carry no timestamps)", details)
    else:
        tm = Finding(check="capture.time", ok=True,
                     diagnosis=f"capture time per rank (max): {time_text}"
                               + (f"; total {time_total:.1f} s" if time_total is not None else "")
                               + (f"; ready {ready_after:.0f} s after the first capture began" if ready_after is not None else ""),
                     details=details)
    return [mem, tm]


# --------------------------------------------------------------------------- decode


def implied_draft_tokens(accept_len: float, accept_rate: float,
                         half_ulp: float = PRINT_HALF_ULP) -> tuple[float, float] | None:
    """Interval of num_draft_tokens = 1 + (accept_len - 1) / accept_rate consistent with the two
    printed values (each exact to +-half_ulp). None when the line carries no information
    (nothing accepted); the upper end is inf when the rate may be 0."""
    a_lo, a_hi = accept_len - half_ulp, accept_len + half_ulp
    r_lo, r_hi = max(accept_rate - half_ulp, 0.0), accept_rate + half_ulp
    lo = 1.0 + max(a_lo - 1.0, 0.0) / r_hi
    hi = math.inf if r_lo <= 0.0 else 1.0 + max(a_hi - 1.0, 0.0) / r_lo
    if math.isinf(hi) and lo <= 2.0:
        return None  # e.g. accept len 1.00, rate 0.00: nothing accepted, every width (>= 2) fits
    return lo, hi


def validate_decode(parsed: ParsedJournal, profile: ProfileLike, *, require: bool = True) -> list[Finding]:
    """Checks on the decode lines of the current process under the probe load.

    With `require=False` and no decode lines, returns nothing (startup-only validation).
    """
    parsed = since_start(parsed)
    lines = [d for d in parsed.decodes_of() if (d.running_reqs or 0) > 0]
    if not lines:
        if not require:
            return []
        return [Finding(check="decode.present", ok=False,
                        diagnosis="no decode line with running requests in the journal window",
                        fix="run a short probe load first (SGLang prints a decode line every "
                            "--decode-log-interval decode steps, 40 by default)",
                        details={"decode_lines": len(parsed.decodes)})]
    findings = [_check_decode_graph(lines, parsed, profile)]
    if profile.kind != "autoregressive":
        findings.append(_check_draft_tokens(lines, parsed, profile))
    if _schedule(profile) is not None:
        findings.append(_check_band_acceptance(lines, parsed, profile))
    trials = _trial_candidates(parsed, profile)
    if trials is not None:
        findings.append(_check_trial_acceptance(parsed, profile))
    return findings


def _band_of_line(d: DecodeLine, sched, capture_bs: list[int]) -> int:
    return sched.band_index(d.running_reqs or 1, capture_bs)


def _captured_sizes(parsed: ParsedJournal, profile: ProfileLike) -> list[int]:
    sizes: set[int] = set()
    for c in _target_captures(parsed.captures_of(), profile):
        if c.bs:
            sizes.update(c.bs)
    return sorted(sizes)


def _check_band_acceptance(lines: list[DecodeLine], parsed: ParsedJournal, profile: ProfileLike) -> Finding:
    """Draft tokens accepted per round, read back per band (the band from #running-req): never
    more than the band's tree holds, and none at all in a budget-0 band (its drafter is off).
    A decode line averages the steps since the rank's previous line, so a line is read only
    when that previous line was in the same band (the interval did not start in another one);
    and a band fails only when most of its lines do."""
    check = "decode.band_acceptance"
    sched = _schedule(profile)
    assert sched is not None
    capture_bs = _captured_sizes(parsed, profile)
    per_band: dict[int, list[DecodeLine]] = defaultdict(list)
    prev_band: dict[str, int] = {}
    straddling = 0
    for d in lines:
        band = _band_of_line(d, sched, capture_bs)
        before = prev_band.get(d.rank)
        prev_band[d.rank] = band
        if d.accept_len is None:
            continue
        if before != band:
            straddling += 1
            continue
        per_band[band].append(d)
    rows, bad = [], []
    for i, band in enumerate(sched.bands):
        ds = per_band.get(i, [])
        if not ds:
            continue
        over = [d for d in ds if (d.accept_len - 1.0) > band.budget + PRINT_HALF_ULP]  # type: ignore[operator]
        mean = sum(d.accept_len for d in ds) / len(ds)  # type: ignore[misc]
        rows.append({"band": sched.band_range(i, capture_bs), "budget": band.budget, "lines": len(ds),
                     "accept_len_mean": round(mean, 2), "drafts_per_round": round(mean - 1.0, 2),
                     "lines_over_budget": len(over)})
        if len(over) * 2 > len(ds):
            bad.append((i, band, ds, over, mean))
    details = {"schedule": sched.text, "bands": rows, "lines_after_a_band_change": straddling}
    if not rows:
        return _unknown(check, "unknown: no decode line under load whose interval stayed in one band "
                               f"({straddling} followed a band change)", details)
    if bad:
        i, band, ds, over, mean = bad[0]
        what = ("a budget-0 band must accept no draft (its drafter is off)" if band.budget == 0 else
                f"a tree of {band.budget} nodes accepts at most {band.budget} drafts per round")
        return Finding(check=check, ok=False,
                       diagnosis=f"batch {sched.band_range(i, capture_bs)}: {len(over)} of {len(ds)} decode lines accept more "
                                 f"drafts per round than the band allows (mean accept len {mean:.2f}; {what}): the "
                                 "runtime is not running this band's budget",
                       fix="check the runtime's 'DDTree budget schedule' line and capture.band_widths; redeploy "
                           "a runtime with budget schedules", details=details)
    seen = "; ".join(f"batch {r['band']} (budget {r['budget']}): {r['drafts_per_round']:.2f} drafts/round over "
                     f"{r['lines']} line(s)" for r in rows)
    return Finding(check=check, ok=True, diagnosis=f"accepted drafts per round by band: {seen}"
                   + (f" ({straddling} line(s) after a band change not read)" if straddling else ""), details=details)


def _check_trial_acceptance(parsed: ParsedJournal, profile: ProfileLike) -> Finding:
    """A trial set: drafts accepted per round, read back per active candidate and its band (from
    #running-req): never more than the band's tree holds. A decode line whose interval holds a switch
    (`mixed`) is not read; a candidate fails when most of its lines are over."""
    check = "decode.trial_acceptance"
    state = journal_mod.trial_state(parsed)
    if state is None:
        return Finding(check=check, ok=False, diagnosis="no trial set loaded: no candidate to read the decode lines by",
                       fix="see trialset.loaded", details={})
    capture_bs = _captured_sizes(parsed, profile)
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    mixed = 0
    for d in state["decodes"]:
        if not d["running_reqs"] or d["accept_len"] is None:
            continue
        if d["mixed"]:
            mixed += 1
            continue
        try:
            band = schedule_mod.parse_candidate(d["active"]).band_for(d["running_reqs"], capture_bs)
        except ConfigError:
            continue
        groups[(d["active"], band.budget)].append(d)
    rows, bad = [], []
    for (cand, budget), ds in groups.items():
        over = [d for d in ds if d["accept_len"] - 1.0 > budget + PRINT_HALF_ULP]
        mean = sum(d["accept_len"] for d in ds) / len(ds)
        rows.append({"candidate": cand, "budget": budget, "lines": len(ds), "accept_len_mean": round(mean, 2),
                     "lines_over_budget": len(over)})
        if len(over) * 2 > len(ds):
            bad.append(rows[-1])
    details = {"rows": rows, "mixed_lines": mixed, "active": state["active"], "switches": state["switches"]}
    if not rows:
        return _unknown(check, "unknown: no decode line under load whose interval stayed with one candidate "
                               f"({mixed} spanned a switch)", details)
    if bad:
        r = bad[0]
        return Finding(check=check, ok=False,
                       diagnosis=f"candidate {r['candidate']} (budget {r['budget']} at its batch sizes): "
                                 f"{r['lines_over_budget']} of {r['lines']} decode lines accept more drafts per round "
                                 f"than its tree holds (mean accept len {r['accept_len_mean']:.2f}): the runtime is not "
                                 "serving the candidate its 'DDTree active:' line names",
                       fix="check the runtime's 'DDTree active:' lines and capture.trial_widths; redeploy a runtime "
                           "with the live switch", details=details)
    seen = "; ".join(f"{r['candidate']} (budget {r['budget']}): accept len {r['accept_len_mean']:.2f} over "
                     f"{r['lines']} line(s)" for r in rows)
    return Finding(check=check, ok=True, diagnosis=f"accept length by active candidate: {seen}"
                   + (f" ({mixed} line(s) spanning a switch not read)" if mixed else ""), details=details)


def _graph_bound(parsed: ParsedJournal, profile: ProfileLike) -> tuple[int | None, str]:
    """The largest batch that can run in a captured decode graph, and how it is known: the
    capture lines' bs list (worst rank), else the configured cuda_graph_max_bs (SGLang never
    captures more than that)."""
    targets = [c for c in _target_captures(parsed.captures_of(), profile) if c.complete and c.bs]
    if targets:
        bound = _worst_rank_max_bs(targets)
        return bound, f"the largest captured batch size ({bound})"
    if profile.cuda_graph_max_bs:
        return (profile.cuda_graph_max_bs, f"{_asker(profile)}'s cuda_graph_max_bs ({profile.cuda_graph_max_bs}; "
                "the window shows no captured bs list, and SGLang captures at most that)")
    return None, ""


def _reqs_of(decodes: list[DecodeLine]) -> str:
    return ", ".join(map(str, sorted({d.running_reqs for d in decodes if d.running_reqs is not None})[:8]))


def _check_decode_graph(lines: list[DecodeLine], parsed: ParsedJournal, profile: ProfileLike) -> Finding:
    check = "decode.cuda_graph"
    without = [d for d in lines if d.cuda_graph is False]
    unknown = [d for d in lines if d.cuda_graph is None]
    on_graph = len(lines) - len(without) - len(unknown)
    bound, bound_text = _graph_bound(parsed, profile)
    # a batch above the largest captured size cannot replay a graph: SGLang runs it eagerly, as designed
    eager = [d for d in without if bound is not None and d.running_reqs is not None and d.running_reqs > bound]
    bad = [d for d in without if d not in eager]
    details = {"decode_lines": len(lines), "without_graph": len(without), "kv_retractions": len(parsed.retractions),
               "running_reqs_max": max(d.running_reqs or 0 for d in lines), "graph_bound": bound,
               "eager_fallback": len(eager), "unexpected_without_graph": len(bad), "no_graph_field": len(unknown)}
    fallback = (f"{len(eager)} of {len(lines)} decode lines ran eagerly at #running-req {_reqs_of(eager)}, above "
                f"{bound_text}: SGLang's expected eager fallback, not a failure" if eager else "")
    if bad:
        at = (f"at batch sizes that were captured (#running-req {_reqs_of(bad)}, not above {bound_text}"
              if bound is not None else f"(#running-req {_reqs_of(bad)}")
        return Finding(check=check, ok=False,
                       diagnosis=f"{len(bad)} of {len(lines)} decode lines ran without CUDA graphs {at}; "
                                 f"first at {_where(bad[0].line)})" + (f"; {fallback}" if fallback else ""),
                       fix=("graphs were captured for those batch sizes but not replayed: check the launch args "
                            "(--cuda-graph-backend-decode, --disable-cuda-graph-padding) and the journal around "
                            "that line, then redeploy" if bound is not None else
                            "batches above the largest captured bs, or capture disabled: see capture.batch_coverage; "
                            "raise --cuda-graph-max-bs-decode to the probe's concurrency"),
                       details=details)
    if len(unknown) == len(lines):
        return _unknown(check, "unknown: the log does not show whether decode ran on CUDA graphs (its decode lines "
                               "print no 'cuda graph:' field: an older SGLang)", details)
    parts = []
    if on_graph:
        parts.append(f"{on_graph} decode line(s) under load say cuda graph: True" if without or unknown else
                     f"all {on_graph} decode lines under load say cuda graph: True")
    if fallback:
        parts.append(fallback)
    if unknown:
        parts.append(f"{len(unknown)} print no 'cuda graph:' field (unknown)")
    return Finding(check=check, ok=True, diagnosis="; ".join(parts), details=details)


def _prints_accept_len(lines: list[DecodeLine], parsed: ParsedJournal) -> bool:
    """Would this log's SGLang print accept len if it were speculating? Releases whose decode line
    has a 'cuda graph:' field do (accept len came first), and so do those with 0.5.11+ capture lines."""
    return parsed.log_format == "0.5.23" or any(d.cuda_graph is not None for d in lines)


def _check_draft_tokens(lines: list[DecodeLine], parsed: ParsedJournal, profile: ProfileLike) -> Finding:
    check = "decode.draft_tokens_per_round"
    want = profile.verify_width
    spec = [d for d in lines if d.accept_len is not None and d.accept_rate is not None]
    sched = _schedule(profile)
    if sched is not None:  # a budget-0 band drafts nothing: its lines cannot show the round width
        capture_bs = _captured_sizes(parsed, profile)
        drafted = [d for d in spec if sched.bands[_band_of_line(d, sched, capture_bs)].budget > 0]
        if spec and not drafted:
            return _unknown(check, f"unknown: every decode line under load ran in a budget-0 band of {sched.text} "
                                   "(no drafts), so the round width cannot be read back", {"lines": len(spec)})
        spec = drafted
    details: dict = {"expected": want, "formula": "1 + (accept_len - 1) / accept_rate", "sglang_version": "0.5.23",
                     "lines": len(spec)}
    if want is None:
        return _unknown(check, "unknown: the log's server_args line does not show speculative_num_draft_tokens, "
                               "so the draft tokens per round have nothing to be checked against", details)
    if not spec and any(d.accept_len is not None for d in lines):
        return _unknown(check, "unknown: the log does not show accept rate (its decode lines print accept len "
                               "only: a release before SGLang 0.5.23, whose accept-rate formula the read-back "
                               "needs)", details)
    if not spec and not _prints_accept_len(lines, parsed):
        return _unknown(check, "unknown: the log does not show accept len: its decode lines are an older format "
                               "(no 'cuda graph:' field, no accept fields) that cannot tell whether speculative "
                               "decoding ran", details)
    if not spec:
        return Finding(check=check, ok=False,
                       diagnosis=f"the decode lines print no accept len/accept rate: the server runs without "
                                 f"speculative decoding, but {_who(profile)} is {profile.kind}",
                       fix=_width_fix(profile), details=details)
    if parsed.log_format == "legacy":
        # older SGLang defined accept rate differently; reading it back would be a guess
        return Finding(check=check, ok=True,
                       diagnosis="not checked: the log predates SGLang 0.5.23, whose accept-rate formula the "
                                 "read-back needs", details=details)
    informative = []
    bad = []
    lo_all, hi_all = 1.0, math.inf
    for d in spec:
        iv = implied_draft_tokens(d.accept_len, d.accept_rate)  # type: ignore[arg-type]
        if iv is None:
            continue
        informative.append((d, iv))
        lo_all, hi_all = max(lo_all, iv[0]), min(hi_all, iv[1])
        if not iv[0] <= want <= iv[1]:
            bad.append((d, iv))
    details["informative_lines"] = len(informative)
    details["intervals"] = [{"line": d.line.line_no, "accept_len": d.accept_len, "accept_rate": d.accept_rate,
                             "implied_min": round(iv[0], 2), "implied_max": None if math.isinf(iv[1]) else round(iv[1], 2)}
                            for d, iv in informative[:20]]
    if not informative:
        return Finding(check=check, ok=False,
                       diagnosis=f"every decode line under load shows accept len 1.00: no draft token was accepted, "
                                 f"so the round width cannot be read back (and speculation gains nothing)",
                       fix="check the drafter matches the target model and the tree mask/positions of the runtime",
                       details=details)
    if bad:
        d, iv = bad[0]
        ints = list(range(math.ceil(lo_all), math.floor(hi_all) + 1)) if not math.isinf(hi_all) else []
        implied = (f"{ints[0]}" if len(ints) == 1 else
                   f"{ints[0]}-{ints[-1]}" if ints else f"{iv[0]:.1f}-{iv[1]:.1f}")
        details["implied"] = ints or None
        rng = f"{iv[0]:.1f}-{'inf' if math.isinf(iv[1]) else format(iv[1], '.1f')}"
        return Finding(check=check, ok=False,
                       diagnosis=f"decode lines imply {implied} draft tokens per round (accept len {d.accept_len:.2f}, "
                                 f"accept rate {d.accept_rate:.2f} -> {rng}; {len(bad)} of {len(informative)} lines), "
                                 f"{_width_need(profile)}; {FORMULA_NOTE}",
                       fix=_width_fix(profile), details=details)
    return Finding(check=check, ok=True,
                   diagnosis=f"{len(informative)} decode line(s) fit {want} draft tokens per round "
                             f"({_width_need(profile)}); {FORMULA_NOTE}", details=details)


# --------------------------------------------------------------------------- an excerpt (no server_args line)

_CAPTURE_FRAME = re.compile(r"\bin (?:capture\w*|init_cuda_graphs?|init_all_cuda_graphs|capture_cuda_graphs)\b|"
                            r"cuda_graph_runner\.py\", line \d+, in __init__")
_REPLAY_MESSAGE = re.compile(r"Piecewise CUDA Graph failed|[Ss]ize mismatch|must match the size of tensor")
_REPLAY_TEXT = re.compile(r"\bin (?:replay\w*|can_run)\b|cuda_graph_runner\.repl|Piecewise CUDA Graph failed|"
                          r"[Ss]ize mismatch|must match the size of tensor")


def _cause_fix(text: str, default: str) -> str:
    """The fix an operator can act on, from the exception line (the most specific cause first)."""
    low = text.lower()
    if "custom_all_reduce" in low or "custom all-reduce" in low or "custom allreduce" in low:
        return ("custom all-reduce failed during capture: relaunch with --disable-custom-all-reduce (and check the "
                "GPUs' NVLink/P2P topology: nvidia-smi topo -m)")
    if "out of memory" in low or "outofmemory" in low:
        return ("lower --mem-fraction-static (e.g. 0.8) or --cuda-graph-max-bs-decode (graph memory grows with the "
                "largest captured batch) and redeploy")
    if "illegal memory access" in low:
        return ("a kernel read out of bounds: rerun with CUDA_LAUNCH_BLOCKING=1 to find it; meanwhile try another "
                "--attention-backend, drop --enable-torch-compile, or --disable-cuda-graph")
    if "nccl" in low or "gloo" in low:
        return ("the ranks could not talk: run with NCCL_DEBUG=INFO, check the network/IB interfaces "
                "(NCCL_SOCKET_IFNAME) and that every rank is up; --disable-custom-all-reduce rules out the custom path")
    return default


def _quoted(f: Failure, parsed: ParsedJournal) -> str:
    """The exception line, quoted, with its own line number (a traceback's failure starts at its header)."""
    at = next((ln.line_no for ln in parsed.lines if ln.line_no >= f.line.line_no and ln.text.strip() == f.summary),
              f.line.line_no)
    return f"'{f.summary[:400]}' (line {at})"


def validate_excerpt(parsed: ParsedJournal) -> list[Finding]:
    """Findings from a pasted excerpt with no server_args line (a traceback from a ticket): what
    it shows (capture failed, OOM, a graph-replay error, other errors, each with the exception
    line quoted and the fix) and `unknown` for what it cannot say (expected graphs, widths, batch
    coverage, restarts, decode)."""
    frames = [ln.text for ln in parsed.lines if ln.text.lstrip().startswith("File ")]
    in_capture = any(_CAPTURE_FRAME.search(t) for t in frames)
    replay_at = next((ln for ln in parsed.lines if _REPLAY_TEXT.search(ln.text)), None)
    failures = list(parsed.failures)
    closed = [f for f in failures if "Traceback (most recent" not in f.summary]
    reported: set[str] = set()
    findings: list[Finding] = []

    def fail(check: str, what: str, found: list[Failure], fix: str) -> None:
        first = found[0]
        reported.update(f.summary for f in found)
        findings.append(Finding(check=check, ok=False,
                                diagnosis=f"{what}: {_quoted(first, parsed)}" + (f" ({len(found)} such lines)" if len(found) > 1 else ""),
                                fix=_cause_fix(first.summary, fix),
                                details={"failures": [f.as_dict() for f in found[:10]], "excerpt": True}))

    capture = [f for f in failures if f.kind == "capture_failed"]
    if not capture and in_capture and not replay_at:
        capture = [f for f in closed if f.kind == "traceback"]
    if capture:
        fail("startup.capture_failed", "CUDA-graph capture failed", capture,
             "read the exception: lower --mem-fraction-static or --cuda-graph-max-bs-decode for memory, "
             "--disable-cuda-graph to start without graphs while the cause is fixed")
    else:
        findings.append(Finding(check="startup.capture_failed", ok=True, diagnosis="no capture failure in the excerpt",
                                details={"excerpt": True}))
    oom = [f for f in failures if f.kind == "cuda_oom"]
    if oom:
        fail("startup.cuda_oom", "CUDA out of memory", oom,
             "lower --mem-fraction-static or --cuda-graph-max-bs-decode, or the DDTree budget")
    else:
        findings.append(Finding(check="startup.cuda_oom", ok=True, diagnosis="no CUDA out-of-memory error in the excerpt",
                                details={"excerpt": True}))
    replay_msg = replay_at is not None and bool(_REPLAY_MESSAGE.search(replay_at.text))
    if replay_at is not None:
        exc = [f for f in closed if f.summary not in reported and f.kind == "traceback"
               and f.line.line_no >= replay_at.line_no]
        if not exc and replay_msg:
            # the replay error is a message of its own (`Piecewise CUDA Graph failed with error: ...`)
            cause = next((ln for ln in parsed.lines if ln.line_no > replay_at.line_no
                          and re.search(r"Root cause|[Ss]ize mismatch", ln.text)), None)
            text = replay_at.text.strip() + (f" {cause.text.strip()}" if cause is not None else "")
            exc = [Failure("traceback", replay_at, text)]
        fix = ("the served batch does not fit the captured graph: validate a full journal of the release "
               "(capture.verify_width, capture.batch_coverage); meanwhile --disable-piecewise-cuda-graph (piecewise "
               "graphs) or --disable-cuda-graph keeps it serving")
        if exc:
            fail("serving.replay_error", "CUDA-graph replay failed", exc, fix)
        else:
            findings.append(Finding(check="serving.replay_error", ok=False,
                                    diagnosis=f"CUDA-graph replay failed at line {replay_at.line_no} "
                                              f"('{replay_at.text.strip()[:200]}'); the excerpt stops before the "
                                              "exception line", fix=fix, details={"excerpt": True}))
    others = [f for f in failures if f.kind in ("traceback", "fatal", "kv_alloc_failed") and f.summary not in reported]
    if replay_msg:
        others = [f for f in others if f.line.line_no < replay_at.line_no]  # the scheduler dying of that replay error
    elif replay_at is not None:  # the traceback that runs through the replay frame is the replay error
        holder = [f for f in others if f.kind == "traceback" and f.line.line_no < replay_at.line_no][-1:]
        others = [f for f in others if f not in holder]
    if others:
        named = [f for f in others if "Traceback (most recent" not in f.summary]
        first = (named or others)[0]
        what = "error(s)" if named else "a traceback whose exception line is not in the excerpt"
        findings.append(Finding(check="startup.errors", ok=False,
                                diagnosis=f"{what}: {_quoted(first, parsed)}" + (f" ({len(others)} in all)" if len(others) > 1 else ""),
                                fix=_cause_fix(" ".join(f.summary for f in others),
                                               "read the whole traceback in the journal (journalctl -u UNIT) and fix its cause"),
                                details={"failures": [f.as_dict() for f in others[:10]], "excerpt": True}))
    else:
        findings.append(Finding(check="startup.errors", ok=True, diagnosis="no other traceback or fatal error in the excerpt",
                                details={"excerpt": True}))
    why = "the excerpt has no server_args line, so what the server was launched with is not known"
    captures = parsed.captures_of()
    findings.append(_check_complete(captures) if captures else
                    _unknown("capture.complete", "unknown: the excerpt has no capture lines", {"excerpt": True}))
    for check, what in (("capture.expected_graphs", "which graphs were expected"),
                        ("capture.verify_width", "the verify graph's width"),
                        ("capture.batch_coverage", "the batch sizes the graphs must cover"),
                        ("startup.restarts", "whether the server restarted (an excerpt is not the whole journal)"),
                        ("decode.draft_tokens_per_round", "the draft tokens per round")):
        findings.append(_unknown(check, f"unknown: {what}: {why}", {"excerpt": True}))
    return findings


# --------------------------------------------------------------------------- both


def validate(parsed: ParsedJournal, profile: ProfileLike, *, require_decode: bool) -> list[Finding]:
    """Startup checks, then decode checks (required after the probe load; optional otherwise)."""
    return validate_startup(parsed, profile) + validate_decode(parsed, profile, require=require_decode)


def all_ok(findings: list[Finding]) -> bool:
    """No error among them (a warning that is not ok, e.g. startup.slower, fails nothing by itself)."""
    return not any(f.failed for f in findings)
