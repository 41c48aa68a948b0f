"""One analysis for the gate and the watch (issue #34): the rules a release is held to, defined
once per profile as a typed spec, and evaluated by the gate before promotion (on its bench:
opsctl/gate/decide.py) and by the watch after it (on its window of /metrics and journal
samples: `evaluate_window`, run by watch_agent.py on the host). Argo Rollouts keeps one
AnalysisTemplate for its pre-promotion and its background analysis in the same way.

The rules, and where each phase measures them:

  accept_length  the floor of a speculative release (none for autoregressive); not applied at
                 running batches a budget schedule serves without a tree (accept length 1 by
                 design). Gate: each level's accept length. Watch: the median over the
                 window's drafting decode samples (its own floor when opsctl.watch.rules sets one).
  throughput     gate: each level's speedup over the baseline against +min_speedup at
                 speedup_concurrency and -max_regression elsewhere (marginal within
                 marginal_band); watch: decode tok/s against the baseline's bench curve at the
                 observed concurrency, breach below 1 - baseline_fraction.
  interval       gate: the speedup's confidence interval (opsctl/gate/interval.py) at
                 `confidence`, decided with at least `min_requests` samples a side; the watch
                 has no paired requests to put an interval on.
  errors         gate: failed requests of a level; watch: the aborted share of the window's
                 requests and CUDA error / traceback lines in the journal.
  restarts       watch: failed exits of the server in the window.
  canary         gate: greedy output identical to the baseline's, for the kinds that must.

Each rule is judged by one function here (issue #53: `judge_accept_length`, `judge_throughput`,
`judge_errors`, `judge_restarts`, returning a `RuleResult`), which the gate calls per level and
`evaluate_window` per window: the threshold that applies, the comparison (`clears`, `exceeds`),
the marginal band, the budget-0 band exception and the samples a rule needs are decided there
alone; each phase gathers its own observation and words its own verdict.

`build_spec` makes a profile's spec from the profile's fields and the inventory's
`opsctl.gate` and `opsctl.watch` rules (on the controller: `HostConfig.analysis`); the watch's
configuration carries each profile's spec as JSON (`to_dict` / `from_dict`), and
`for_release` fits it to the release that is live, from that release's manifest, the same way
on the host and on the controller.

Standard library only (Python >= 3.8): this module runs on the host.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Mapping, Optional

from .capture import BatchRange, in_ranges, parse_bands, profile_captured_batch_sizes, undrafted_batches

SCHEMA = "opsctl.analysis/1"
BASELINE_KIND = "autoregressive"   # the kind a baseline is; a release of it is held to no regression
DEFAULT_CUDA_GRAPH_MAX_BS = 32     # a manifest that does not say (written before the field existed)


def lookup_kind(table: Mapping[str, Any], kind: Optional[str]) -> Any:
    """A per-kind setting: the exact kind, then its first dash-separated word (`ddtree-b32` ->
    `ddtree`, `ar-tp8` -> `ar`); None when neither is listed."""
    k = (kind or "").lower()
    if k in table:
        return table[k]
    return table.get(k.split("-", 1)[0])


def clears(observed: float, threshold: float) -> bool:
    """The one comparison of a measured value with its floor or limit, for every rule and both
    phases: at the threshold clears it (an accept length of exactly the floor, a speedup ratio
    or a curve ratio of exactly the limit, an interval's low end exactly on it)."""
    return observed >= threshold


def exceeds(observed: float, allowed: float) -> bool:
    """The one comparison of a count or a rate with what a rule allows: at the limit is within it
    (failed requests, journal error lines, the aborted share, the server's failures)."""
    return observed > allowed


def grade(observed: float, threshold: float, band: float = 0.0) -> str:
    """pass where `observed` clears `threshold`, marginal where it clears `threshold - band`, else fail."""
    if clears(observed, threshold):
        return "pass"
    if clears(observed, threshold - band):
        return "marginal"
    return "fail"


def against_interval(low: float, high: float, n_candidate: int, n_baseline: int, threshold: float,
                     min_requests: int) -> str:
    """An interval against `threshold`: pass where its low end clears it, fail where its high end
    does not, inconclusive where it straddles it or either side has fewer than `min_requests`
    samples."""
    if n_candidate < min_requests or n_baseline < min_requests:
        return "inconclusive"
    if clears(low, threshold):
        return "pass"
    if not clears(high, threshold):
        return "fail"
    return "inconclusive"


@dataclass(frozen=True)
class AcceptLengthRule:
    floor: Optional[float]              # the gate's floor for the profile; None: no floor
    watch_floor: Optional[float]        # after promotion (opsctl.watch.rules.<profile>.accept_len_floor, else floor)
    require_reported: bool = True       # gate: a level with no accept length fails where a floor applies
    # running batches a budget schedule serves without a tree; None: the profile has no schedule
    undrafted: Optional[List[BatchRange]] = None

    def undrafted_at(self, batch: float) -> bool:
        return in_ranges(batch, self.undrafted)

    def floor_at(self, batch: Optional[float]) -> Optional[float]:
        """The gate's floor at a running batch of `batch` (a bench level's C), None where none applies."""
        return None if self.floor is None or (batch is not None and self.undrafted_at(batch)) else self.floor


@dataclass(frozen=True)
class ThroughputRule:
    speedup_concurrency: int
    min_speedup: float                  # fractions: 0.05 = 5 %
    max_regression: float
    marginal_band: float
    max_spread: float                   # gate: repeats spreading more cap a level at marginal
    baseline_fraction: Optional[float]  # watch: breach below the baseline curve x (1 - this); None: off

    def speedup_level(self, c: int) -> bool:
        return c == self.speedup_concurrency

    def needed_delta(self, c: int) -> float:
        """The speedup a level must show (a fraction): +min_speedup at speedup_concurrency, else
        -max_regression; no level, the speedup level included, may lose more than max_regression
        (a min_speedup below -max_regression does not loosen it there)."""
        return max(self.min_speedup, -self.max_regression) if self.speedup_level(c) else -self.max_regression

    @property
    def regression_limit(self) -> float:
        """The ratio to the baseline no level (and no workload of a level) may fall below."""
        return 1 - self.max_regression

    def threshold_at(self, c: int) -> float:
        """The same as a ratio, the threshold a level's speedup (its medians' ratio or its
        interval) must clear."""
        return (1 + self.needed_delta(c)) if self.speedup_level(c) else self.regression_limit

    @property
    def curve_limit(self) -> Optional[float]:
        """Watch: the ratio to the baseline's bench curve a window's decode tok/s must clear."""
        return None if self.baseline_fraction is None else 1 - self.baseline_fraction


@dataclass(frozen=True)
class IntervalRule:
    confidence: float                   # two-sided, over all of a level's planned looks
    min_requests: int                   # samples per side below which a level is inconclusive
    min_workload_requests: int          # requests of a workload at a level to judge it alone


@dataclass(frozen=True)
class ErrorRule:
    max_failed_requests: int            # gate: failed requests allowed over all repeats of a level
    # the watch's (None in a spec built for the gate alone, without the watch's settings)
    max_error_rate: Optional[float]     # aborted / (finished + aborted) in the window
    min_requests: Optional[int]         # requests in the window before the rate is judged
    max_journal_errors: Optional[int]   # CUDA error / traceback lines allowed in the window


@dataclass(frozen=True)
class RestartRule:
    max_restarts: Optional[int]         # watch: failed exits of the server allowed in the window


@dataclass(frozen=True)
class WindowRule:
    """The watch's window: how far back it looks, and the decode samples a metric rule needs
    there before it judges (an idle or young window is insufficient, never a breach). None in a
    spec built for the gate alone."""
    window_s: Optional[float] = None
    min_samples: Optional[int] = None


@dataclass(frozen=True)
class CanaryRule:
    required: bool                      # gate: greedy output must reproduce the baseline's


@dataclass(frozen=True)
class AnalysisSpec:
    profile: str
    kind: str
    accept_length: AcceptLengthRule
    throughput: ThroughputRule
    interval: IntervalRule
    errors: ErrorRule
    restarts: RestartRule
    canary: CanaryRule
    window: WindowRule = WindowRule()

    def to_dict(self) -> Dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AnalysisSpec":
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not an analysis spec ({SCHEMA}): schema {data.get('schema')!r}")
        acc = dict(data["accept_length"])
        if acc.get("undrafted") is not None:
            acc["undrafted"] = [list(r) for r in acc["undrafted"]]
        return cls(profile=data["profile"], kind=data["kind"], accept_length=AcceptLengthRule(**acc),
                   throughput=ThroughputRule(**data["throughput"]), interval=IntervalRule(**data["interval"]),
                   errors=ErrorRule(**data["errors"]), restarts=RestartRule(**data["restarts"]),
                   canary=CanaryRule(**data["canary"]), window=WindowRule(**(data.get("window") or {})))

    def for_release(self, profile: Optional[Mapping[str, Any]]) -> "AnalysisSpec":
        """This spec fitted to a live release's profile (its manifest's): an autoregressive
        release has no floor after promotion; with no floor of its own configured, the
        release's own `accept_len_floor` is its floor; the batches its budget schedule serves
        without a tree (None without a schedule)."""
        prof = profile or {}
        acc = self.accept_length
        watch_floor = acc.watch_floor
        if watch_floor is None and prof.get("accept_len_floor") is not None:
            watch_floor = float(prof["accept_len_floor"])
        if prof.get("kind") == BASELINE_KIND:
            watch_floor = None
        undrafted = undrafted_of(prof)
        return replace(self, accept_length=replace(acc, watch_floor=watch_floor, undrafted=undrafted))

    @property
    def watched(self) -> bool:
        """Built with the watch's settings (a spec for the gate alone is not)."""
        return self.restarts.max_restarts is not None

    def watch_rules(self) -> Dict[str, Any]:
        """The thresholds the watch judges by, flat (what `opsctl watch status` shows as rules)."""
        out: Dict[str, Any] = {
            "accept_len_floor": self.accept_length.watch_floor,
            "throughput_fraction": self.throughput.baseline_fraction,
            "max_error_rate": self.errors.max_error_rate, "min_requests": self.errors.min_requests,
            "max_journal_errors": self.errors.max_journal_errors, "max_restarts": self.restarts.max_restarts,
            "window_s": self.window.window_s, "min_samples": self.window.min_samples}
        if self.accept_length.undrafted is not None:
            out["undrafted_batches"] = [list(r) for r in self.accept_length.undrafted]
        return out


def undrafted_of(profile: Mapping[str, Any]) -> Optional[List[BatchRange]]:
    """The running batches a profile's budget schedule serves without a tree (SGLang pads a
    batch to the captured size it replays at, and that size's band decides); None without a
    schedule."""
    sched = profile.get("budget_schedule")
    if not sched:
        return None
    capture = profile_captured_batch_sizes(profile, DEFAULT_CUDA_GRAPH_MAX_BS)
    return undrafted_batches(parse_bands(sched), capture)


def build_spec(profile: Mapping[str, Any], gate: Mapping[str, Any], watch: Optional[Mapping[str, Any]] = None, *,
               deploy: bool = False) -> AnalysisSpec:
    """The analysis of one profile.

    `profile`: the profile's fields (name, kind, accept_len_floor, budget_schedule,
    cuda_graph_max_bs, max_running_requests; config.Profile or a manifest's `profile`).
    `gate`: `opsctl.gate` (GatePolicy's fields). `watch`: the profile's `opsctl.watch` rules
    (WatchRules' fields, `accept_len_floor` None unless the inventory sets it); None for a
    spec the gate alone judges by (a result file's verdict), with no after-promotion part.
    `deploy`: the spec a deploy's gate judges by, where a release of the baseline's kind is
    held to no regression rather than to a speedup (`opsctl report` and `bench compare`
    judge a result file by the policy as written).
    """
    kind = str(profile.get("kind") or "")
    speculative = kind != BASELINE_KIND
    own = profile.get("accept_len_floor")
    floor = float(own) if speculative and own is not None else lookup_kind(gate["accept_length_floor"], kind)
    watch_floor = None
    if speculative and watch is not None:
        watch_floor = watch.get("accept_len_floor")
        if watch_floor is None:
            watch_floor = own if own is not None else lookup_kind(gate["accept_length_floor"], kind)
    min_speedup = gate["min_speedup"]
    if deploy and kind == BASELINE_KIND:
        min_speedup = -gate["max_regression"]
    canary_exempt = lookup_kind({k: True for k in gate["canary_exempt_kinds"]}, kind) is not None
    return AnalysisSpec(
        profile=str(profile.get("name") or ""), kind=kind,
        accept_length=AcceptLengthRule(floor=floor, watch_floor=watch_floor,
                                       require_reported=bool(gate["require_accept_length"]),
                                       undrafted=undrafted_of(profile)),
        throughput=ThroughputRule(speedup_concurrency=int(gate["speedup_concurrency"]), min_speedup=min_speedup,
                                  max_regression=gate["max_regression"], marginal_band=gate["marginal_band"],
                                  max_spread=gate["max_spread"],
                                  baseline_fraction=watch.get("throughput_fraction") if watch else None),
        interval=IntervalRule(confidence=gate["confidence"], min_requests=int(gate["min_requests"]),
                              min_workload_requests=int(gate["min_workload_requests"])),
        errors=ErrorRule(max_failed_requests=int(gate["max_errors"]),
                         max_error_rate=watch["max_error_rate"] if watch else None,
                         min_requests=int(watch["min_requests"]) if watch else None,
                         max_journal_errors=int(watch["max_journal_errors"]) if watch else None),
        restarts=RestartRule(max_restarts=int(watch["max_restarts"]) if watch else None),
        canary=CanaryRule(required=bool(gate["require_canary"]) and not canary_exempt),
        window=WindowRule(window_s=watch.get("window_s") if watch else None,
                          min_samples=int(watch["min_samples"]) if watch and watch.get("min_samples") else None))


# --------------------------------------------------------------------------- the rules' one evaluator
# Issue #53: the gate's levels and the watch's windows are judged by these functions, one per
# rule; each phase gathers its observation (a level's medians or interval, a window's samples)
# and words its verdict, but the floor or limit an observation is held to, the comparison (at
# the threshold clears: `clears`, `exceeds`), the marginal band, the budget-0 band exception and
# the samples a rule needs before it judges are decided here alone.

GATE, WATCH = "gate", "watch"


@dataclass(frozen=True)
class RuleResult:
    """One rule's judgement of one observation (a gate's level, a watch's window).

    status: pass | marginal (a point estimate within the marginal band below its threshold; the
    gate's) | inconclusive (an interval straddling its threshold, or too few samples a side) |
    fail | insufficient (fewer samples than the rule needs before it judges) | n/a (the rule does
    not apply: no floor, a level the budget schedule serves without a tree, a rule turned off).
    `on`: what `observed` is where a rule judges more than one quantity (the watch's errors:
    journal_errors | error_rate). `detail`: the judgement in words that match its numbers."""
    rule: str
    status: str
    observed: Optional[float] = None
    threshold: Optional[float] = None
    samples: Optional[int] = None
    detail: str = ""
    on: str = ""

    @property
    def watch_status(self) -> str:
        """The watch's word for the status (ok | breach | insufficient | n/a)."""
        return _WATCH_STATUS[self.status]


_WATCH_STATUS = {"pass": "ok", "fail": "breach", "insufficient": "insufficient", "n/a": "n/a"}


def _too_few(rule: str, observed, threshold, samples: Optional[int], min_samples: Optional[int]) -> Optional[RuleResult]:
    if min_samples is not None and (samples or 0) < min_samples:
        return RuleResult(rule, "insufficient", observed, threshold, samples or 0,
                          f"{samples or 0} of {min_samples} decode samples")
    return None


def judge_accept_length(spec: AnalysisSpec, observed: Optional[float], *, phase: str, at: Optional[float] = None,
                        samples: Optional[int] = None, min_samples: Optional[int] = None,
                        window_s: Optional[float] = None) -> RuleResult:
    """The accept-length floor on one observation.

    Gate: a level's accept length (None where the release reported none: a fail where the spec
    requires it reported) at running batch `at` (the level's C), held to the gate's floor, which
    does not apply where the budget schedule serves `at` without a tree. Watch: the median of
    the window's drafting decode samples (`samples` of them, those at an undrafted running
    batch left out: `drafting`), held to the floor after promotion once there are `min_samples`."""
    acc = spec.accept_length
    if phase == GATE:
        floor = acc.floor_at(at)
        if floor is None:
            why = "no accept-length floor for this profile" if acc.floor is None else \
                "the budget schedule does not draft at this level (budget 0): no accept-length floor"
            return RuleResult("accept_length", "n/a", observed, None, samples, why)
    else:
        floor = acc.watch_floor
        if floor is None:
            return RuleResult("accept_length", "n/a", observed, None, samples, "no accept-length floor for this profile")
    few = _too_few("accept_length", observed, floor, samples, min_samples)
    if few is not None:
        return few
    if observed is None:
        return RuleResult("accept_length", "fail" if acc.require_reported else "n/a", None, floor, samples,
                          f"no accept length reported (floor {floor:.2f})")
    ok = clears(observed, floor)
    text = f"accept length {observed:.2f} {'>=' if ok else '<'} floor {floor:.2f}"
    if phase == WATCH:
        text = f"median {text} ({samples} decode samples in {int(window_s or 0)} s)"
    return RuleResult("accept_length", "pass" if ok else "fail", observed, floor, samples, text)


def drafting(spec: AnalysisSpec, pairs) -> List[float]:
    """The accept lengths of (accept length, running batch) pairs that the rule judges: those
    reported at a batch the budget schedule drafts at (its budget-0 band accepts nothing by design)."""
    return [a for a, batch in pairs if a and not spec.accept_length.undrafted_at(batch or 0)]


def judge_throughput(spec: AnalysisSpec, *, phase: str, ratio: Optional[float] = None, interval: Any = None,
                     at: Optional[int] = None, workload: bool = False, samples: Optional[int] = None,
                     min_samples: Optional[int] = None) -> RuleResult:
    """The throughput rule on one observation, a ratio to the baseline.

    Gate: level `at`'s speedup, held to `threshold_at(at)` (+min_speedup at the speedup level,
    -max_regression elsewhere; a workload of the level (`workload`): -max_regression): a point
    `ratio` (the medians over repeats) graded with the marginal band, or an `interval` (low,
    high, n_candidate, n_baseline: opsctl/gate/interval.py) decided with the spec's
    min_requests a side (min_workload_requests for a workload). Watch: the median per-sample
    ratio to the baseline's bench curve (`samples` of them), held to the curve limit once
    there are `min_samples`."""
    thr = spec.throughput
    if phase == WATCH:
        limit = thr.curve_limit
        if limit is None:
            return RuleResult("throughput", "n/a", ratio, None, samples, "throughput rule off")
        few = _too_few("throughput", ratio, limit, samples, min_samples)
        if few is not None:
            return few
        ok = clears(ratio, limit)
        return RuleResult("throughput", "pass" if ok else "fail", ratio, limit, samples,
                          f"{ratio:.2f} x the baseline ({'within' if ok else 'below'} the {limit:.2f} limit)")
    threshold = thr.regression_limit if workload else thr.threshold_at(at)
    if interval is not None:
        need = spec.interval.min_workload_requests if workload else spec.interval.min_requests
        st = against_interval(interval.low, interval.high, interval.n_candidate, interval.n_baseline, threshold, need)
        few = min(interval.n_candidate, interval.n_baseline) < need
        text = (f"too few samples (at least {need} per side)" if few else
                f"the interval straddles {(threshold - 1) * 100:+.0f} %: not proven") if st == "inconclusive" else \
            f"interval [{interval.low:.3f}, {interval.high:.3f}] {'clears' if st == 'pass' else 'below'} {threshold:.3f}"
        return RuleResult("throughput", st, interval.ratio, threshold, min(interval.n_candidate, interval.n_baseline),
                          text)
    if ratio is None:
        return RuleResult("throughput", "n/a", None, threshold, samples, "not compared (baseline throughput 0)")
    st = grade(ratio, threshold, thr.marginal_band)
    return RuleResult("throughput", st, ratio, threshold, samples,
                      f"{ratio:.3f} x the baseline against {threshold:.3f} ({st})")


def judge_errors(spec: AnalysisSpec, *, phase: str, failed: int = 0, requests: int = 0, aborted: int = 0,
                 journal_errors: int = 0, busy: int = 0, min_samples: Optional[int] = None,
                 window_s: Optional[float] = None) -> RuleResult:
    """The errors rule on one observation. Gate: a level's `failed` requests over its repeats,
    against max_failed_requests. Watch: the window's CUDA error / traceback lines
    (`journal_errors`) against max_journal_errors, then the aborted share of its `requests`
    (`aborted` of them) against max_error_rate, judged once there are min_requests requests
    and `min_samples` busy samples (`busy`)."""
    err = spec.errors
    if phase == GATE:
        bad = exceeds(failed, err.max_failed_requests)
        return RuleResult("errors", "fail" if bad else "pass", failed, err.max_failed_requests, None,
                          f"{failed} failed requests (allowed {err.max_failed_requests})", on="failed_requests")
    if exceeds(journal_errors, err.max_journal_errors):
        return RuleResult("errors", "fail", journal_errors, err.max_journal_errors, None,
                          f"{journal_errors} CUDA error / traceback lines in the journal in {int(window_s or 0)} s "
                          f"(limit {err.max_journal_errors})", on="journal_errors")
    if requests < err.min_requests or (min_samples is not None and busy < min_samples):
        return RuleResult("errors", "insufficient", None, err.max_error_rate, busy,
                          f"{int(requests)} requests in the window (need {err.min_requests})", on="error_rate")
    rate = aborted / requests
    bad = exceeds(rate, err.max_error_rate)
    return RuleResult("errors", "fail" if bad else "pass", round(rate, 4), err.max_error_rate, busy,
                      f"{int(aborted)} of {int(requests)} requests aborted ({100 * rate:.1f}%, limit "
                      f"{100 * err.max_error_rate:.1f}%)", on="error_rate")


def judge_restarts(spec: AnalysisSpec, failures: int, *, window_s: Optional[float] = None) -> RuleResult:
    """The restarts rule on a window's failed exits of the server (the watch's)."""
    limit = spec.restarts.max_restarts
    bad = exceeds(failures, limit)
    return RuleResult("restarts", "fail" if bad else "pass", failures, limit, None,
                      f"the server failed {failures} time(s) in {int(window_s or 0)} s (limit {limit})")


# --------------------------------------------------------------------------- the watch's window


def _median(values):
    return round(statistics.median(values), 3) if values else None


def _finding(r: RuleResult, **extra) -> dict:
    return {"rule": r.rule, "status": r.watch_status, **extra}


def evaluate_window(samples: list, spec: AnalysisSpec, now: float) -> list:
    """The watch's findings over the spec's window (spec.window), one per rule: status ok |
    breach | insufficient | unknown | n/a. Metric rules need the window's `min_samples` samples
    taken under decode traffic: an idle server never breaches, and metrics that cannot be read
    are `unknown`. Each rule is judged by the evaluator the gate's levels are judged by
    (`judge_accept_length`, `judge_throughput`, `judge_errors`, `judge_restarts`)."""
    if not spec.watched or spec.window.window_s is None or spec.window.min_samples is None:
        raise ValueError(f"the analysis of {spec.profile or spec.kind!r} was built without the watch's rules")
    window_s, min_samples = float(spec.window.window_s), int(spec.window.min_samples)
    win = [s for s in samples if s.get("ts", 0) > now - window_s]
    ok = [s for s in win if s.get("status") == "ok"]
    dec = [s for s in ok if s.get("decode")]
    out = []

    # a budget schedule's budget-0 band accepts nothing by design: only drafting samples count
    vals = drafting(spec, [(s.get("accept_len"), s.get("running")) for s in dec])
    med = _median(vals)
    r = judge_accept_length(spec, med, phase=WATCH, samples=len(vals), min_samples=min_samples, window_s=window_s)
    if r.status == "n/a":
        out.append(_finding(r, detail=r.detail))
    elif r.status == "insufficient":
        out.append(_finding(r, observed=med, threshold=r.threshold, samples=len(vals), detail=r.detail))
    else:
        out.append(_finding(r, observed=med, threshold=r.threshold, samples=len(vals),
                            min=round(min(vals), 3), max=round(max(vals), 3), detail=r.detail))

    ratios = [(s["gen_tps"] / s["expected_tps"], s) for s in dec if s.get("expected_tps")]
    med = _median([q for q, _ in ratios])
    r = judge_throughput(spec, phase=WATCH, ratio=med, samples=len(ratios), min_samples=min_samples)
    if r.status == "n/a":
        out.append(_finding(r, detail=r.detail))
    elif dec and not ratios:
        out.append({"rule": "throughput", "status": "unknown", "detail": "no baseline bench curve on the host"})
    elif r.status == "insufficient":
        out.append(_finding(r, samples=len(ratios), threshold=round(r.threshold, 3), detail=r.detail))
    else:
        tps = _median([s["gen_tps"] for _, s in ratios])
        exp = _median([s["expected_tps"] for _, s in ratios])
        conc = _median([s["running"] for _, s in ratios])
        bad = r.status == "fail"
        out.append(_finding(r, observed=med, threshold=round(r.threshold, 3), samples=len(ratios), gen_tps=tps,
                            baseline_tps=exp, concurrency=conc,
                            # the rule judges the median of per-sample ratios; the medians of tok/s beside it
                            # need not divide to it, so the words say which number is judged
                            detail=f"median per-sample ratio {med:.2f} x the baseline ({'below' if bad else 'within'} "
                                   f"the {r.threshold:.2f} limit, {len(ratios)} samples; median {tps:.1f} tok/s at "
                                   f"concurrency {conc:g} against the baseline's {exp:.1f})"))

    fin = sum(s.get("finished") or 0 for s in ok)
    ab = sum(s.get("aborted") or 0 for s in ok)
    busy = [s for s in ok if s.get("decode") or (s.get("finished") or 0) + (s.get("aborted") or 0) > 0]
    jerr = [s.get("journal") for s in win if s.get("journal") is not None]
    errors = sum(j["cuda_errors"] + j["tracebacks"] for j in jerr)
    r = judge_errors(spec, phase=WATCH, requests=fin + ab, aborted=ab, journal_errors=errors, busy=len(busy),
                     min_samples=min_samples, window_s=window_s)
    if r.status == "insufficient":
        out.append({"rule": "errors", "status": "insufficient" if ok else "unknown", "requests": int(fin + ab),
                    "journal_errors": errors, "detail": r.detail})
    elif r.on == "journal_errors":
        out.append(_finding(r, observed=errors, threshold=r.threshold, detail=r.detail,
                            examples=[x for j in jerr for x in j.get("examples", [])][:3]))
    else:
        out.append(_finding(r, observed=r.observed, threshold=r.threshold, requests=int(fin + ab), aborted=int(ab),
                            journal_errors=errors, detail=r.detail))

    if not jerr:
        out.append({"rule": "restarts", "status": "unknown", "detail": "journal not readable"})
    else:
        crashes = sum(j["crashes"] for j in jerr)
        r = judge_restarts(spec, crashes, window_s=window_s)
        out.append(_finding(r, observed=crashes, threshold=r.threshold, restarts=sum(j["restarts"] for j in jerr),
                            detail=r.detail,
                            **({"examples": [x for j in jerr for x in j.get("examples", [])][:3]} if crashes else {})))
    return out


def summarise(findings: list, samples: list, spec: AnalysisSpec, now: float) -> str:
    """healthy | breach | idle | unknown, from a window's findings (over the spec's window)."""
    window_s = float(spec.window.window_s or 0)
    if any(f["status"] == "breach" for f in findings):
        return "breach"
    win = [s for s in samples if s.get("ts", 0) > now - window_s]
    if win and all(s.get("status") != "ok" for s in win):
        return "unknown"
    if not any(s.get("decode") for s in win if s.get("status") == "ok"):
        return "idle"
    return "healthy"
