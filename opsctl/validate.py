"""Startup validation: findings from a parsed SGLang journal and the release's profile.

Pure: `opsctl.journal` parses, this module judges, the caller (CLI or deploy) prints or
records. A check that cannot be proven from the log fails: a release whose graphs we
cannot show to be right is refused, not waved through.

Entry points:
    validate_startup(parsed, profile) -> list[Finding]   capture, failures, restarts, memory/time
    validate_decode(parsed, profile)  -> list[Finding]   decode lines under the probe load
    validate(parsed, profile, *, require_decode)         both
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Protocol

from opsctl.findings import Finding
from opsctl.journal import (LEGACY, TARGET_DECODE, TARGET_VERIFY, Capture, DecodeLine, ParsedJournal,
                            since_start)

# half a unit in the last printed place: SGLang prints accept len/rate with two decimals
PRINT_HALF_ULP = 0.005
FORMULA_NOTE = ("read back with 1 + (accept_len - 1) / accept_rate, SGLang 0.5.23's accept-rate "
                "definition (correct drafts / (rounds x (num_draft_tokens - 1)))")


class ProfileLike(Protocol):
    """What validation reads from `opsctl.config.Profile`."""

    name: str
    kind: str  # "autoregressive" | "dflash" | "ddtree"
    budget: int | None
    block_size: int | None
    tp_size: int
    cuda_graph_max_bs: int
    max_concurrency: int | None

    @property
    def verify_width(self) -> int: ...


# --------------------------------------------------------------------------- helpers


def _rank(label: str) -> str:
    return label or "main"


def _max_concurrency(profile: ProfileLike) -> int:
    return getattr(profile, "max_concurrency", None) or profile.cuda_graph_max_bs


def _width_need(profile: ProfileLike) -> str:
    """'DDTree budget 16 needs 17' and the like, for diagnoses."""
    if profile.kind == "ddtree":
        return f"DDTree budget {profile.budget} needs {profile.verify_width}"
    if profile.kind == "dflash":
        return f"DFlash block size {profile.block_size} needs {profile.verify_width}"
    return "autoregressive decode needs 1"


def _width_fix(profile: ProfileLike) -> str:
    if profile.kind == "ddtree":
        return ("load the DDTree runtime: the release's sglang.env must set SGLANG_PLUGINS=ddtree and put "
                "the release's site/ (runtime wheel) on PYTHONPATH, and the launch args must say "
                f"--speculative-num-draft-tokens {profile.verify_width}; then redeploy")
    if profile.kind == "dflash":
        return (f"launch with --speculative-num-draft-tokens {profile.verify_width} (the drafter's block size) "
                "and redeploy")
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


def _where(line) -> str:
    return f"{_rank(line.rank)}, line {line.line_no}" + (f", {line.timestamp:%Y-%m-%d %H:%M:%S}" if line.timestamp else "")


# --------------------------------------------------------------------------- startup


def validate_startup(parsed: ParsedJournal, profile: ProfileLike) -> list[Finding]:
    """Capture-time checks on the journal since the release started (see module doc)."""
    parsed = since_start(parsed)
    captures = parsed.captures_of()  # the current process; earlier ones show up as restarts
    findings = [_check_expected_graphs(captures, parsed, profile),
                _check_complete(captures),
                _check_verify_width(captures, profile),
                _check_batch_coverage(captures, profile)]
    findings += _check_failures(parsed)
    findings.append(_check_restarts(parsed))
    findings += _report_memory_and_time(captures, parsed)
    return findings


def _check_expected_graphs(captures: list[Capture], parsed: ParsedJournal, profile: ProfileLike) -> Finding:
    check = "capture.expected_graphs"
    kind = _expected_kind(profile)
    if not captures:
        return Finding(check=check, ok=False,
                       diagnosis="no CUDA-graph capture lines in the journal window: capture did not run, "
                                 "or the window misses the start",
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
                    f"speculative decoding, but profile {profile.name} needs target verify "
                    f"({_width_need(profile)})")
            fix = ("check --speculative-algorithm in the rendered launch args"
                   + (" and that SGLANG_PLUGINS=ddtree loads the DDTree runtime" if profile.kind == "ddtree" else ""))
        elif kind == TARGET_DECODE and TARGET_VERIFY in kinds:
            diag = (f"a target verify graph was captured: speculative decoding is on, but profile "
                    f"{profile.name} is autoregressive")
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
    if not targets:
        return Finding(check=check, ok=False,
                       diagnosis=f"no {kind} graph to read num_tokens_per_req from ({_width_need(profile)})",
                       fix="see capture.expected_graphs", details=details)
    if all(c.kind == LEGACY for c in targets):
        if profile.kind == "autoregressive":
            return Finding(check=check, ok=True,
                           diagnosis="legacy capture lines print no num_tokens_per_req; a non-speculative "
                                     "decode graph is 1 token/request", details=details)
        return Finding(check=check, ok=False,
                       diagnosis=f"the capture lines use the pre-0.5.11 spelling ('Capture cuda graph begin/end'), "
                                 f"which prints no num_tokens_per_req: cannot show the verify graph has "
                                 f"{want} tokens/request ({_width_need(profile)})",
                       fix="validate a journal from SGLang 0.5.23, the deployed version", details=details)
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
    need = _max_concurrency(profile)
    targets = [c for c in _target_captures(captures, profile) if c.complete]
    with_bs = [c for c in targets if c.bs]
    details: dict = {"max_concurrency": need, "profile_cuda_graph_max_bs": profile.cuda_graph_max_bs,
                     "per_rank": {_rank(c.rank): list(c.bs) if c.bs else None for c in targets}}
    if not targets:
        return Finding(check=check, ok=False, diagnosis="no completed target graph capture to read batch sizes from",
                       fix="see capture.expected_graphs and capture.complete", details=details)
    if not with_bs:
        return Finding(check=check, ok=False,
                       diagnosis="the capture lines print no bs=[...] list: cannot show the graphs cover "
                                 f"max concurrency {need}",
                       fix="validate a journal from SGLang 0.5.23, whose capture end line prints bs=[...]",
                       details=details)
    # a batch of n runs in the smallest captured graph >= n, so coverage is the largest bs, on the worst rank
    covered = min(max(c.bs) for c in with_bs)  # type: ignore[arg-type]
    details["captured_max_bs"] = covered
    short_of_profile = covered < profile.cuda_graph_max_bs
    if covered < need:
        return Finding(check=check, ok=False,
                       diagnosis=f"captured batch sizes reach {covered}, max concurrency is {need}: "
                                 f"concurrencies {_ranges(range(covered + 1, need + 1))} will run without CUDA graphs"
                                 + (f" (the profile asked for {profile.cuda_graph_max_bs}: SGLang captured fewer, "
                                    "usually for lack of memory)" if short_of_profile else ""),
                       fix=f"raise --cuda-graph-max-bs-decode (profile cuda_graph_max_bs) to at least {need}, "
                           f"or serve at most {covered} concurrent requests",
                       details=details)
    return Finding(check=check, ok=True,
                   diagnosis=f"captured batch sizes reach {covered}, covering max concurrency {need}",
                   details=details)


def _check_failures(parsed: ParsedJournal) -> list[Finding]:
    out = []
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
        found = [f for f in parsed.failures if f.kind in kinds]
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
                                         f"{_where(first.line)}: {first.summary[:200]}",
                               fix=fix, details=details))
        else:
            none = {"startup.capture_failed": "no 'Capture cuda graph failed'",
                    "startup.cuda_oom": "no CUDA out-of-memory error",
                    "startup.errors": "no traceback or fatal error"}[check]
            out.append(Finding(check=check, ok=True, diagnosis=none, details=details))
    return out


def _check_restarts(parsed: ParsedJournal) -> Finding:
    check = "startup.restarts"
    starts = parsed.process_starts
    events = parsed.unit_events
    started = [e for e in events if e.kind == "started"]
    died = [e for e in events if e.kind in ("exited", "failed", "restart_scheduled")]
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
    mem = Finding(check="capture.memory", ok=True,
                  diagnosis=f"graph memory per rank (max): {mem_text}"
                            + (f"; total {mem_total:.2f} GB" if mem_total is not None else "")
                            + (f"; {min(avail):.2f} GB left after capture" if avail else ""),
                  details={"per_kind": kinds, "total_gb_max_rank": mem_total,
                           "avail_mem_after_gb_min": min(avail) if avail else None})
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
    findings = [_check_decode_graph(lines, parsed)]
    if profile.kind != "autoregressive":
        findings.append(_check_draft_tokens(lines, parsed, profile))
    return findings


def _check_decode_graph(lines: list[DecodeLine], parsed: ParsedJournal) -> Finding:
    check = "decode.cuda_graph"
    without = [d for d in lines if d.cuda_graph is False]
    unknown = [d for d in lines if d.cuda_graph is None]
    details = {"decode_lines": len(lines), "without_graph": len(without), "kv_retractions": len(parsed.retractions),
               "running_reqs_max": max(d.running_reqs or 0 for d in lines)}
    if without:
        reqs = sorted({d.running_reqs for d in without if d.running_reqs is not None})
        return Finding(check=check, ok=False,
                       diagnosis=f"{len(without)} of {len(lines)} decode lines ran without CUDA graphs "
                                 f"(#running-req {', '.join(map(str, reqs[:8]))}; first at {_where(without[0].line)})",
                       fix="batches above the largest captured bs, or capture disabled: see capture.batch_coverage; "
                           "raise --cuda-graph-max-bs-decode to the probe's concurrency",
                       details=details)
    if len(unknown) == len(lines):
        return Finding(check=check, ok=False, diagnosis="the decode lines print no 'cuda graph:' field",
                       fix="validate a journal from SGLang 0.5.23", details=details)
    return Finding(check=check, ok=True, diagnosis=f"all {len(lines) - len(unknown)} decode lines under load "
                   "say cuda graph: True", details=details)


def _check_draft_tokens(lines: list[DecodeLine], parsed: ParsedJournal, profile: ProfileLike) -> Finding:
    check = "decode.draft_tokens_per_round"
    want = profile.verify_width
    spec = [d for d in lines if d.accept_len is not None and d.accept_rate is not None]
    details: dict = {"expected": want, "formula": "1 + (accept_len - 1) / accept_rate", "sglang_version": "0.5.23",
                     "lines": len(spec)}
    if not spec and any(d.accept_len is not None for d in lines):
        return Finding(check=check, ok=True,
                       diagnosis="not checked: the decode lines print accept len but no accept rate (a release "
                                 "before SGLang 0.5.23, whose accept-rate formula the read-back needs)",
                       details=details)
    if not spec:
        return Finding(check=check, ok=False,
                       diagnosis=f"the decode lines print no accept len/accept rate: the server runs without "
                                 f"speculative decoding, but profile {profile.name} is {profile.kind}",
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


# --------------------------------------------------------------------------- both


def validate(parsed: ParsedJournal, profile: ProfileLike, *, require_decode: bool) -> list[Finding]:
    """Startup checks, then decode checks (required after the probe load; optional otherwise)."""
    return validate_startup(parsed, profile) + validate_decode(parsed, profile, require=require_decode)


def all_ok(findings: list[Finding]) -> bool:
    return all(f.ok for f in findings)
