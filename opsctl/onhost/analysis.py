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


def grade(observed: float, threshold: float, band: float = 0.0) -> str:
    """pass at or above `threshold`, marginal within `band` below it, else fail."""
    if observed >= threshold:
        return "pass"
    if observed >= threshold - band:
        return "marginal"
    return "fail"


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

    @staticmethod
    def status(observed: Optional[float], floor: Optional[float]) -> str:
        """n/a (no floor) | missing (nothing observed) | below | ok."""
        if floor is None:
            return "n/a"
        if observed is None:
            return "missing"
        return "below" if observed < floor else "ok"

    def fails(self, status: str) -> bool:
        return status == "below" or (status == "missing" and self.require_reported)


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
        """The speedup a level must show (a fraction): +min_speedup at speedup_concurrency, else -max_regression."""
        return self.min_speedup if self.speedup_level(c) else -self.max_regression

    def threshold_at(self, c: int) -> float:
        """The same as a ratio, the threshold a level's speedup interval must clear."""
        return (1 + self.min_speedup) if self.speedup_level(c) else (1 - self.max_regression)

    def grade_speedup(self, delta: float) -> str:
        return grade(delta, self.min_speedup, self.marginal_band)

    def grade_regression(self, delta: float) -> str:
        return grade(delta, -self.max_regression, self.marginal_band)

    @property
    def curve_limit(self) -> Optional[float]:
        return None if self.baseline_fraction is None else 1 - self.baseline_fraction

    def below_curve(self, ratio: float) -> bool:
        """Watch: decode tok/s at `ratio` x the baseline curve breaches."""
        return self.curve_limit is not None and ratio < self.curve_limit


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

    def level_fails(self, failed: int) -> bool:
        return failed > self.max_failed_requests

    def rate_breaches(self, rate: float) -> bool:
        return rate > self.max_error_rate

    def journal_breaches(self, lines: int) -> bool:
        return lines > self.max_journal_errors


@dataclass(frozen=True)
class RestartRule:
    max_restarts: Optional[int]         # watch: failed exits of the server allowed in the window

    def breaches(self, failures: int) -> bool:
        return failures > self.max_restarts


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


# --------------------------------------------------------------------------- the watch's window


def _median(values):
    return round(statistics.median(values), 3) if values else None


def evaluate_window(samples: list, spec: AnalysisSpec, now: float) -> list:
    """The watch's findings over the spec's window (spec.window), one per rule: status ok |
    breach | insufficient | unknown | n/a. Metric rules need the window's `min_samples` samples
    taken under decode traffic: an idle server never breaches, and metrics that cannot be read
    are `unknown`. All of the rule is the spec's."""
    if not spec.watched or spec.window.window_s is None or spec.window.min_samples is None:
        raise ValueError(f"the analysis of {spec.profile or spec.kind!r} was built without the watch's rules")
    window_s, min_samples = float(spec.window.window_s), int(spec.window.min_samples)
    win = [s for s in samples if s.get("ts", 0) > now - window_s]
    ok = [s for s in win if s.get("status") == "ok"]
    dec = [s for s in ok if s.get("decode")]
    out = []

    acc = spec.accept_length
    floor = acc.watch_floor
    if floor is None:
        out.append({"rule": "accept_length", "status": "n/a", "detail": "no accept-length floor for this profile"})
    else:
        # a budget schedule's budget-0 band accepts nothing by design: only drafting samples count
        vals = [s["accept_len"] for s in dec if s.get("accept_len") and not acc.undrafted_at(s.get("running") or 0)]
        med = _median(vals)
        if len(vals) < min_samples:
            out.append({"rule": "accept_length", "status": "insufficient", "observed": med, "threshold": floor,
                        "samples": len(vals), "detail": f"{len(vals)} of {min_samples} decode samples"})
        else:
            bad = acc.status(med, floor) == "below"
            out.append({"rule": "accept_length", "status": "breach" if bad else "ok", "observed": med,
                        "threshold": floor, "samples": len(vals),
                        "min": round(min(vals), 3), "max": round(max(vals), 3),
                        "detail": f"median accept length {med:.2f} {'<' if bad else '>='} floor {floor:.2f} "
                                  f"({len(vals)} decode samples in {int(window_s)} s)"})

    thr = spec.throughput
    limit = thr.curve_limit
    ratios = [(s["gen_tps"] / s["expected_tps"], s) for s in dec if s.get("expected_tps")]
    if limit is None:
        out.append({"rule": "throughput", "status": "n/a", "detail": "throughput rule off"})
    elif dec and not ratios:
        out.append({"rule": "throughput", "status": "unknown", "detail": "no baseline bench curve on the host"})
    elif len(ratios) < min_samples:
        out.append({"rule": "throughput", "status": "insufficient", "samples": len(ratios),
                    "threshold": round(limit, 3), "detail": f"{len(ratios)} of {min_samples} decode samples"})
    else:
        med = _median([r for r, _ in ratios])
        tps = _median([s["gen_tps"] for _, s in ratios])
        exp = _median([s["expected_tps"] for _, s in ratios])
        conc = _median([s["running"] for _, s in ratios])
        bad = thr.below_curve(med)
        out.append({"rule": "throughput", "status": "breach" if bad else "ok", "observed": med,
                    "threshold": round(limit, 3), "samples": len(ratios), "gen_tps": tps, "baseline_tps": exp,
                    "concurrency": conc,
                    # the rule judges the median of per-sample ratios; the medians of tok/s beside it
                    # need not divide to it, so the words say which number is judged
                    "detail": f"median per-sample ratio {med:.2f} x the baseline ({'below' if bad else 'within'} "
                              f"the {limit:.2f} limit, {len(ratios)} samples; median {tps:.1f} tok/s at "
                              f"concurrency {conc:g} against the baseline's {exp:.1f})"})

    err = spec.errors
    fin = sum(s.get("finished") or 0 for s in ok)
    ab = sum(s.get("aborted") or 0 for s in ok)
    busy = [s for s in ok if s.get("decode") or (s.get("finished") or 0) + (s.get("aborted") or 0) > 0]
    jerr = [s.get("journal") for s in win if s.get("journal") is not None]
    errors = sum(j["cuda_errors"] + j["tracebacks"] for j in jerr)
    if err.journal_breaches(errors):
        out.append({"rule": "errors", "status": "breach", "observed": errors, "threshold": err.max_journal_errors,
                    "detail": f"{errors} CUDA error / traceback lines in the journal in {int(window_s)} s "
                              f"(limit {err.max_journal_errors})",
                    "examples": [x for j in jerr for x in j.get("examples", [])][:3]})
    elif fin + ab < err.min_requests or len(busy) < min_samples:
        out.append({"rule": "errors", "status": "insufficient" if ok else "unknown", "requests": int(fin + ab),
                    "journal_errors": errors,
                    "detail": f"{int(fin + ab)} requests in the window (need {err.min_requests})"})
    else:
        rate = ab / (fin + ab)
        bad = err.rate_breaches(rate)
        out.append({"rule": "errors", "status": "breach" if bad else "ok", "observed": round(rate, 4),
                    "threshold": err.max_error_rate, "requests": int(fin + ab), "aborted": int(ab),
                    "journal_errors": errors,
                    "detail": f"{int(ab)} of {int(fin + ab)} requests aborted ({100 * rate:.1f}%, limit "
                              f"{100 * err.max_error_rate:.1f}%)"})

    crashes = sum(j["crashes"] for j in jerr)
    max_r = spec.restarts.max_restarts
    if not jerr:
        out.append({"rule": "restarts", "status": "unknown", "detail": "journal not readable"})
    else:
        bad = spec.restarts.breaches(crashes)
        out.append({"rule": "restarts", "status": "breach" if bad else "ok", "observed": crashes, "threshold": max_r,
                    "restarts": sum(j["restarts"] for j in jerr),
                    "detail": f"the server failed {crashes} time(s) in {int(window_s)} s (limit {max_r})",
                    **({"examples": [x for j in jerr for x in j.get("examples", [])][:3]} if crashes else {})})
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
