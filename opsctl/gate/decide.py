"""Release gate: judge a candidate's bench against the host's baseline.

Pure functions over `BenchRun`s (no I/O). `judge()` decides each concurrency level by
the rules of the profile's analysis spec (opsctl/onhost/analysis.py: the same spec the
watch holds the release to after promotion) on the medians over repeats, or on the
speedup interval where requests were sampled, and returns a `Verdict` of pass / marginal / fail
with a per-level table and one line per reason. As in Kayenta's canary judge,
a result that misses a throughput threshold by less than `marginal_band` is
*marginal*: the caller re-measures once (`next_action`, `judge_with_remeasure`)
and fails the release if it is still marginal.

At the site, DDTree at budget 32 ran at ~50 tok/s at C=1 against the
autoregressive TP8 baseline's ~98 (-49%) with accept length 1.5-1.65: this gate
fails it on the C=1 speedup, on the regression limit and on the accept-length
floor, each with its own reason.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from opsctl.errors import ConfigError
from opsctl.onhost.analysis import GATE, AnalysisSpec, RuleResult, build_spec, clears, judge_accept_length, \
    judge_errors, judge_throughput

if TYPE_CHECKING:  # annotations only: opsctl.config imports this module for GatePolicy, and a command
    # that reads the inventory but judges nothing (render, watch) does not load the result models
    from opsctl.findings import Finding
    from opsctl.gate.results import BenchLevel, BenchRun

Status = Literal["pass", "marginal", "inconclusive", "fail"]
_RANK = {"pass": 0, "marginal": 1, "inconclusive": 2, "fail": 3}
ATTEMPTS = 2  # a measurement, and one re-measure of an undecided verdict (judge_with_remeasure)


class GatePolicy(BaseModel):
    """What a release must show against the baseline. Each inventory may override
    any field under `opsctl.gate:`; the loader validates it with the rest of the
    inventory (an unknown key, a wrong type or an out-of-range value is refused with
    its file:line). A profile's `accept_len_floor` overrides `accept_length_floor`
    for its kind (`HostConfig.gate_policy(profile)`). The thresholds here become rules
    through the profile's analysis (`HostConfig.analysis`, or `analysis(kind)` below).

    `concurrency` is the smoke bench's levels: small defaults (1, 4, 16) keep the
    bench inside a deploy short (about a minute on the site's host). List the
    site's target concurrency there too (e.g. `[1, 4, 16, 128]` when the host
    serves 128 concurrent streams): a speculative release can win at C=1 and lose
    at the load the site runs (DDTree budget 32 verifies 128 x 33 = 4,224 tokens
    per step at C=128). The baseline must have been benched at the same levels.
    """

    model_config = ConfigDict(extra="forbid")

    # --- the smoke bench
    concurrency: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1, 4, 16], min_length=1)
    input_len: int = Field(128, ge=1)
    output_len: int = Field(128, ge=1, description="output tokens per request at most (a dataset request's own "
                                                   "answer length when shorter)")
    requests_per_level: int = Field(16, ge=1, description="at least C requests run per level")
    repeats: int = Field(3, ge=1, le=20, description="repeats per level; medians are compared")
    warmup: int = Field(4, ge=0)
    seed: int = 0
    # --- throughput thresholds (fractions: 0.05 = 5%)
    speedup_concurrency: int = Field(1, ge=1, description="the level where the release must beat the baseline")
    min_speedup: float = Field(0.05, description="output tok/s at speedup_concurrency >= baseline x (1 + this)")
    max_regression: float = Field(0.10, ge=0, description="no level below baseline x (1 - this)")
    marginal_band: float = Field(0.03, ge=0, description="missing a threshold by less than this is marginal")
    max_spread: float = Field(0.15, ge=0, description="repeats spreading more ((max-min)/median) cap a level at marginal")
    # --- correctness and health
    max_errors: int = Field(0, ge=0, description="failed requests allowed over all repeats of a level")
    accept_length_floor: dict[str, float] = Field(
        default_factory=lambda: {"ddtree": 2.0, "dflash": 2.0, "eagle": 1.5, "eagle3": 1.5},
        description="per profile kind; the site's collapse was 1.51-1.65 (4.48 expected at budget 8)")
    require_accept_length: bool = Field(True, description="a kind with a floor must report an accept length")
    require_canary: bool = True
    canary_exempt_kinds: list[str] = Field(
        default_factory=lambda: ["autoregressive", "ar"],
        description="kinds whose greedy output may differ (e.g. ar-ep8 vs ar-tp8 reduce in another order)")
    canary_prompts: int = Field(8, ge=1)
    canary_input_len: int = Field(64, ge=1)
    canary_output_len: int = Field(32, ge=1)
    # --- workloads and confidence (opsctl/gate/workloads.py, opsctl/gate/interval.py)
    workloads: dict[str, float] = Field(
        default_factory=lambda: {"humaneval": 0.3, "chat": 0.5, "math": 0.2},
        description="the mix the gate measures on (name: weight); 'random' token ids are never the default")
    confidence: float = Field(0.90, gt=0.5, lt=1.0, description=(
        "two-sided confidence of the speedup interval over all of a level's planned looks (each look uses "
        "1 - (1 - confidence) / looks): a verdict at any look keeps each side's error at (1 - confidence) / 2"))
    min_requests: int = Field(8, ge=2, description="samples per level and side below which a level is inconclusive")
    max_requests: int = Field(48, ge=2, description="a level stops measuring at this many requests (the cap)")
    min_workload_requests: int = Field(4, ge=2, description="requests of a workload at a level to judge it alone")
    unbaselined_levels: Literal["fail", "note"] = Field(
        "fail", description="a level this policy lists that the stored baseline was not benched at: 'fail' fails "
                            "the gate, 'note' names it in the verdict's notes only (either way it is not judged)")

    @field_validator("workloads")
    @classmethod
    def _known_workloads(cls, v: dict[str, float]) -> dict[str, float]:
        from opsctl.gate.workloads import parse_mix

        return parse_mix(v)

    def requests_for(self, concurrency: int) -> int:
        return max(self.requests_per_level, concurrency)

    def rounds_at(self, concurrency: int) -> int:
        """Rounds one measurement runs at a level at most: rounds of `requests_for(C)` up to the cap."""
        per_round = self.requests_for(concurrency)
        return -(-max(self.max_requests, per_round) // per_round)

    def looks_at(self, concurrency: int) -> int:
        """The looks at a level's interval the gate plans before the first: every round of the
        measurement and of its one re-measure (`ATTEMPTS`; the re-measure's rounds continue the
        first's) that has `min_requests` samples and so can decide. The interval's confidence is
        spread over them (opsctl/gate/interval.py), so a verdict at any look carries the same error rate."""
        per_round = self.requests_for(concurrency)
        rounds = ATTEMPTS * self.rounds_at(concurrency)
        return max(1, sum(1 for j in range(1, rounds + 1) if j * per_round >= self.min_requests))

    def workload_looks_at(self, concurrency: int) -> int:
        """The looks the per-workload rule ("a workload wholly below -max_regression fails the
        level") is spread over: each workload of the mix, at each judge of the level (`ATTEMPTS`),
        so the rule names a workload that is within the limit with at most (1 - confidence) / 2
        over the level. With one workload its row is the level's own interval."""
        n = len(self.workloads)
        return ATTEMPTS * n if n > 1 else self.looks_at(concurrency)

    def analysis(self, profile_kind: str) -> AnalysisSpec:
        """The rules this policy states for a kind (opsctl/onhost/analysis.py), as a result file is
        judged by them (`opsctl report`, `bench compare`); a deploy judges by its profile's
        `HostConfig.analysis`, which adds the profile's own settings and the watch's."""
        return build_spec({"name": profile_kind, "kind": profile_kind}, self.model_dump())

    def loadgen_args(self, *, make_canary: bool = False, canary_file: str | None = None) -> list[str]:
        """The `loadgen.py` flags for this policy's smoke bench (add --url, --json).
        `make_canary`: decode the policy's canary prompts (a baseline run; store the
        printed canary record with the baseline). `canary_file`: reproduce a stored
        canary (a candidate run; the record then carries `mismatch`)."""
        args = ["--concurrency", ",".join(str(c) for c in self.concurrency), "--input-len", str(self.input_len),
                "--output-len", str(self.output_len), "--requests-per-level", str(self.requests_per_level),
                "--repeats", str(self.repeats), "--warmup", str(self.warmup), "--seed", str(self.seed)]
        if canary_file:
            args += ["--canary-file", canary_file]
        elif make_canary:
            args += ["--canary-prompts", str(self.canary_prompts), "--canary-input-len", str(self.canary_input_len),
                     "--canary-output-len", str(self.canary_output_len)]
        return args


class LevelRow(BaseModel):
    concurrency: int
    baseline_tok_s: float | None
    candidate_tok_s: float | None
    delta_pct: float | None
    baseline_itl_p50_ms: float | None
    candidate_itl_p50_ms: float | None
    accept_length: float | None
    baseline_accept_length: float | None = None
    errors: int = 0
    spread_pct: float = 0.0
    status: Status = "pass"
    why: str = ""  # the words for the status, matching the numbers: "within the -10 % limit"
    low_pct: float | None = None       # the speedup's confidence interval (percent), with samples
    high_pct: float | None = None
    samples: int | None = None         # candidate requests the interval rests on
    baseline_samples: int | None = None  # baseline requests it rests on
    method: str | None = None          # the interval's method (opsctl/gate/interval.py: "log-t")
    confidence_pct: float | None = None  # the gate's confidence over all planned looks (90)
    looks: int | None = None           # planned looks it is spread over; each look at 100 - (100 - conf) / looks
    # what the columns mean: baseline/candidate_tok_s are aggregate output throughput (medians over
    # repeats); delta_pct is the quantity the gate judged: with request samples the per-request
    # tok/s ratio of means behind the interval (baseline/candidate_req_tok_s), else the aggregate's
    judged_on: Literal["aggregate", "per-request", "not judged"] = "aggregate"
    aggregate_delta_pct: float | None = None
    baseline_req_tok_s: float | None = None
    candidate_req_tok_s: float | None = None
    workloads: dict[str, dict] = Field(default_factory=dict)  # per workload: delta/low/high %, accept, n, status


class Verdict(BaseModel):
    status: Status
    profile_kind: str
    rows: list[LevelRow] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)   # why not pass, one line each
    notes: list[str] = Field(default_factory=list)     # informational
    canary: dict | None = None
    attempts: int = 1
    policy: dict[str, Any] = Field(default_factory=dict)
    # the analysis spec the levels were judged by (AnalysisSpec.to_dict()); readers of a verdict
    # (opsctl report) take its thresholds from here; None in a verdict recorded before it was kept
    analysis: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    def spec(self) -> AnalysisSpec:
        """The rules this verdict judged by: its recorded spec, else (an older record) the spec
        its recorded policy builds for its kind."""
        if self.analysis:
            return AnalysisSpec.from_dict(self.analysis)
        return GatePolicy.model_validate({k: v for k, v in self.policy.items() if k in GatePolicy.model_fields}) \
            .analysis(self.profile_kind)

    def one_line(self) -> str:
        head = f"gate {self.status.upper()} ({self.profile_kind})"
        return head + (": " + "; ".join(self.reasons) if self.reasons else "")

    def table(self) -> str:
        """The per-level table as fixed-width text, at most 80 columns (terminal, ledger,
        reports): the cells of `level_table`, then its legend and one line per level."""
        cols, cells, lines = level_table(self.rows)
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
        out = ["  ".join(c.rjust(w) for c, w in zip(cols, widths)).rstrip()]
        out += ["  ".join(v.rjust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
        return "\n".join(out + lines)

    def findings(self) -> list[Finding]:
        from opsctl.findings import Finding

        out = [Finding(check=f"gate.level.c{r.concurrency}", ok=r.status == "pass",
                       diagnosis=f"{_f(r.candidate_tok_s, '%.1f')} vs {_f(r.baseline_tok_s, '%.1f')} tok/s "
                                 f"({_f(r.delta_pct, '%+.1f%%')}), {r.status}",
                       details=r.model_dump()) for r in self.rows]
        out.append(Finding(check="gate", ok=self.ok, diagnosis=self.one_line(),
                           fix="" if self.ok else "keep the baseline; see the reasons and `opsctl report`"))
        return out

    def record(self) -> dict[str, Any]:
        """For the ledger."""
        return self.model_dump(mode="json")


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt % v


LEVEL_TABLE_COLUMNS = ["C", "base tok/s", "rel tok/s", "agg Δ", "judged Δ", "accept", "err", "status"]
LEVEL_TABLE_LEGEND = ("tok/s and agg Δ: aggregate output throughput, baseline and release (medians); "
                      "judged Δ: what the gate judges, per-request tok/s (ratio of means) where requests were "
                      "sampled, else the aggregate")


def level_table(rows: list[LevelRow]) -> tuple[list[str], list[list[str]], list[str]]:
    """The verdict's levels for a terminal: a table narrow enough for 80 columns (short
    cells, every column labelled by LEVEL_TABLE_LEGEND), then one line per level with the
    judged quantity's own numbers (per-request tok/s, interval) and the status in words, so
    the aggregate columns and the judged delta can be checked against each other."""
    cells, lines = [], [LEVEL_TABLE_LEGEND]
    for r in rows:
        cells.append([str(r.concurrency), _f(r.baseline_tok_s, "%.1f"), _f(r.candidate_tok_s, "%.1f"),
                      _f(r.aggregate_delta_pct, "%+.1f%%"), _f(r.delta_pct, "%+.1f%%"),
                      _f(r.accept_length, "%.2f"), str(r.errors), r.status])
        judged = ""
        if r.judged_on == "per-request":
            judged = (f"judged on per-request tok/s {_f(r.baseline_req_tok_s, '%.1f')} -> "
                      f"{_f(r.candidate_req_tok_s, '%.1f')}: ")
        elif r.judged_on == "aggregate" and r.delta_pct is not None:
            judged = (f"judged on aggregate tok/s {_f(r.baseline_tok_s, '%.1f')} -> "
                      f"{_f(r.candidate_tok_s, '%.1f')}: ")
        lines.append(f"C={r.concurrency}: {judged}{r.why or r.status}"
                     + (f"; {d}" if (d := sign_disagreement(r)) else ""))
    return list(LEVEL_TABLE_COLUMNS), cells, lines


def _worst(*statuses: Status) -> Status:
    return max(statuses, key=lambda s: _RANK[s])


def judge(candidate: BenchRun, baseline: BenchRun, policy: GatePolicy | None = None, *, profile_kind: str,
          canary_mismatch: Any = None, canary_ran: bool | None = None, spec: AnalysisSpec | None = None) -> Verdict:
    """Judge `candidate` against `baseline` (all repeats; medians are compared) by the rules
    of `spec` (the profile's analysis, opsctl/onhost/analysis.py; default: the policy's rules
    for `profile_kind`). `policy` is the bench that was planned (levels, repeats, looks).

    `canary_mismatch`: None when the greedy canary was identical (or not run), else
    the first divergence (`CanaryMismatch` or loadgen's dict). `canary_ran=False`
    says the canary was not run; a kind that requires it then fails.
    The accept-length floor does not apply at levels the spec's budget schedule serves in a
    budget-0 band (no drafter, accept length 1 by design).
    Raises ConfigError when the baseline cannot be compared (no common level, or
    no measurement at the speedup level): that is a missing baseline, not a bad
    release.
    """
    policy = policy or GatePolicy()
    spec = spec or policy.analysis(profile_kind)
    thr, acc_rule = spec.throughput, spec.accept_length
    cand, base = candidate.median(), baseline.median()
    cand_at = {lv.level: lv for lv in cand.levels}
    base_at = {lv.level: lv for lv in base.levels}
    fix = ("bench the baseline profile at the policy's levels: deploy it and run "
           "`opsctl bench --save-baseline` (levels %s)" % ",".join(map(str, policy.concurrency)))
    if not base_at:
        raise ConfigError("the baseline has no measurements", fix)
    if thr.speedup_concurrency not in base_at:
        raise ConfigError(f"the baseline has no C={thr.speedup_concurrency} measurement "
                          f"(it has {sorted(base_at)})", fix)
    reasons: list[str] = []
    notes: list[str] = []
    floor = acc_rule.floor
    levels = sorted(set(policy.concurrency) | set(cand_at))
    rows: list[LevelRow] = []
    low_accept: list[tuple[int, float]] = []
    no_accept: list[int] = []
    for c in levels:
        floor_c = acc_rule.floor_at(c)
        if floor is not None and floor_c is None:
            notes.append(f"C={c}: the budget schedule does not draft at this level (budget 0): "
                         "no accept-length floor")
        b: BenchLevel | None = base_at.get(c)
        k: BenchLevel | None = cand_at.get(c)
        if b is None:
            text = f"C={c}: no baseline at this level — not judged; fix: opsctl bench --save-baseline"
            if c in policy.concurrency and policy.unbaselined_levels == "fail":
                reasons.append(text)
                rows.append(LevelRow(concurrency=c, baseline_tok_s=None,
                                     candidate_tok_s=k.output_throughput if k else None, delta_pct=None,
                                     baseline_itl_p50_ms=None, candidate_itl_p50_ms=k.median_itl_ms if k else None,
                                     accept_length=k.accept if k else None, errors=k.errors if k else 0,
                                     status="fail", judged_on="not judged",
                                     why="no baseline at this level — not judged"))
            else:
                notes.append(text)
            continue
        if k is None:
            reasons.append(f"C={c}: the candidate has no measurement at this level (bench did not run or crashed)")
            rows.append(LevelRow(concurrency=c, baseline_tok_s=b.output_throughput, candidate_tok_s=None,
                                 delta_pct=None, baseline_itl_p50_ms=b.median_itl_ms, candidate_itl_p50_ms=None,
                                 accept_length=None, baseline_accept_length=b.accept, status="fail"))
            continue
        st: Status = "pass"
        ratio = k.output_throughput / b.output_throughput if b.output_throughput > 0 else None
        delta = None if ratio is None else ratio - 1.0
        aggregate_delta = delta
        req_means: tuple[float | None, float | None] = (None, None)
        # the level by the analysis' one evaluator (onhost/analysis.py), the rules the watch's windows are judged by
        tp = judge_throughput(spec, phase=GATE, ratio=ratio, at=c)
        if delta is None:
            notes.append(f"C={c}: baseline throughput is 0; not compared")
        elif tp.status != "pass":
            marg = " (marginal)" if tp.status == "marginal" else ""
            if thr.speedup_level(c):
                need = thr.needed_delta(c)
                reasons.append(f"C={c}: output {k.output_throughput:.1f} tok/s vs baseline "
                               f"{b.output_throughput:.1f} ({delta * 100:+.1f}%), "
                               + (f"needs at least {need * 100:+.1f}%" if need >= 0
                                  else f"below the {need * 100:+.1f}% limit") + marg)
            else:
                reasons.append(f"C={c}: output {k.output_throughput:.1f} tok/s is {-delta * 100:.1f}% below the "
                               f"baseline's {b.output_throughput:.1f} (limit -{thr.max_regression * 100:.0f}%)"
                               + marg)
            st = _worst(st, tp.status)
        er, ar = _level_rules(k, spec, c)
        if er.status == "fail":
            reasons.append(f"C={c}: {k.errors} failed requests over {k.repeats_merged} repeat(s) "
                           f"(allowed {spec.errors.max_failed_requests})" + (f": {k.error_samples[0]}" if getattr(
                               k, "error_samples", None) else ""))
            st = "fail"
        if ar.status == "fail":
            if ar.observed is None:
                no_accept.append(c)
            else:
                low_accept.append((c, k.accept))
            st = "fail"
        why = _why(st, delta, c, spec, ar)
        conf = _confidence_level(c, candidate, baseline, policy, spec)
        if conf is not None:
            # with request samples on both sides the interval decides, not the medians
            interval, decision, per_workload, req_means = conf
            delta = interval.ratio - 1.0
            reasons[:] = [r for r in reasons if not _throughput_reason(r, c)]
            if decision == "fail":
                reasons.append(f"C={c}: speedup {interval.pct()}: the whole interval is below "
                               f"{_need(thr, c)[1]}")
            elif decision == "inconclusive":
                reasons.append(f"C={c}: speedup {interval.pct()}: "
                               + judge_throughput(spec, phase=GATE, interval=interval, at=c).detail)
            for name, w in per_workload.items():
                if w["status"] == "fail":
                    reasons.append(f"C={c}: {name} loses: {w['text']} (limit -{thr.max_regression * 100:.0f} %)")
                    decision = "fail"
            st = _worst(_status_without_throughput(er, ar), decision)
            why = _why(st, delta, c, spec, ar, interval=interval) if st == "pass" else \
                f"{st} ({interval.pct()})"
        else:
            interval, per_workload = None, {}
        spread = max(k.output_throughput_spread, b.output_throughput_spread)
        if interval is not None:
            spread = 0.0  # the interval already carries the noise
        if st == "pass" and spread > thr.max_spread:
            reasons.append(f"C={c}: repeats spread {spread * 100:.0f}% (> {thr.max_spread * 100:.0f}%): "
                           "too noisy to call (marginal)")
            st = "marginal"
        rows.append(LevelRow(concurrency=c, baseline_tok_s=b.output_throughput, candidate_tok_s=k.output_throughput,
                             delta_pct=None if delta is None else delta * 100, baseline_itl_p50_ms=b.median_itl_ms,
                             candidate_itl_p50_ms=k.median_itl_ms, accept_length=k.accept,
                             baseline_accept_length=b.accept, errors=k.errors, spread_pct=spread * 100, status=st,
                             why=why if st == "pass" else ("repeats too noisy to call" if spread > thr.max_spread
                                                           and why.startswith("pass") else why),
                             low_pct=(interval.low - 1) * 100 if interval else None,
                             high_pct=(interval.high - 1) * 100 if interval and math.isfinite(interval.high)
                             else None,
                             samples=interval.n_candidate if interval else None,
                             baseline_samples=interval.n_baseline if interval else None,
                             method=interval.method if interval else None,
                             confidence_pct=interval.confidence * 100 if interval else None,
                             looks=interval.looks if interval else None,
                             judged_on="per-request" if interval else "aggregate",
                             aggregate_delta_pct=None if aggregate_delta is None else aggregate_delta * 100,
                             baseline_req_tok_s=req_means[1], candidate_req_tok_s=req_means[0],
                             workloads={n: {k2: v for k2, v in w.items() if k2 != "text"}
                                        for n, w in per_workload.items()}))
    if not any(r.judged_on != "not judged" for r in rows):
        raise ConfigError("the candidate and the baseline share no concurrency level", fix)
    if low_accept:
        worst = min(a for _, a in low_accept)
        reasons.append(f"accept length {worst:.2f} below the {profile_kind} floor {floor:.2f} ("
                       + ", ".join(f"C={c}: {a:.2f}" for c, a in low_accept) + ")"
                       + accept_cause(workload_accept(candidate, [c for c, _ in low_accept]), floor))
    if no_accept:
        reasons.append(f"no accept length reported for a {profile_kind} release at C="
                       + ",".join(map(str, no_accept)) + f" (floor {floor:.2f}); start SGLang with --enable-metrics")

    canary: dict | None = None
    if canary_mismatch is not None:
        m = canary_mismatch if isinstance(canary_mismatch, dict) else canary_mismatch.model_dump()
        canary = {"identical": False, **m}
        line = (f"canary: greedy output differs from the baseline at prompt {m['prompt']}, token {m['position']} "
                f"(expected {m.get('expected')}, got {m.get('got')})")
        if spec.canary.required:
            reasons.append(line)
        else:
            notes.append(line + f"; not gated for kind {profile_kind}")
    elif canary_ran is False:
        canary = {"identical": None}
        if spec.canary.required:
            reasons.append("canary: not run; a speculative release must reproduce the baseline's greedy output")
    else:
        canary = {"identical": True} if canary_ran else None
        if canary_ran is None and spec.canary.required:
            notes.append("canary: not reported to the gate (pass canary_ran=True/False)")

    if candidate.repeats < policy.repeats and not any(r.samples for r in rows):
        # repeats are what medians are taken over; a level judged on per-request samples has its interval
        notes.append(f"candidate has {candidate.repeats} repeat(s), the policy asks for {policy.repeats}")
    status: Status = _worst("pass", *(r.status for r in rows))
    if canary is not None and canary.get("identical") is not True and spec.canary.required:
        status = "fail"
    # the record states the threshold the spec judged by (a baseline-kind release: no regression)
    recorded = policy.model_copy(update={"min_speedup": thr.min_speedup})
    return Verdict(status=status, profile_kind=profile_kind, rows=rows, reasons=reasons, notes=notes,
                   canary=canary, policy=recorded.model_dump(mode="json"), analysis=spec.to_dict())


def throughput_decision(policy: GatePolicy, c: int, candidate: list[float], baseline: list[float],
                        spec: AnalysisSpec):
    """(interval, decision) of level c's speedup from per-request rates: the interval at the
    spec's confidence spread over the level's looks the policy plans, decided against the
    level's threshold by the analysis' throughput rule (`analysis.judge_throughput`, the one the
    watch's windows are judged by). The one rule the measuring loop (opsctl/gate/measure.py)
    stops on and `judge` decides by."""
    from opsctl.gate import interval as cf

    interval = cf.speedup_interval(candidate, baseline, confidence=spec.interval.confidence, looks=policy.looks_at(c))
    if interval is None:
        return None, "inconclusive"
    return interval, judge_throughput(spec, phase=GATE, interval=interval, at=c).status


def _confidence_level(c: int, candidate: BenchRun, baseline: BenchRun, policy: GatePolicy, spec: AnalysisSpec):
    """(interval, decision, per-workload rows, (candidate, baseline) mean per-request tok/s)
    at level c, or None without request samples."""
    from opsctl.gate import interval as cf

    cs, bs = cf.samples_of(candidate.at(c)), cf.samples_of(baseline.at(c))
    if not cs or not bs:
        return None
    interval, decision = throughput_decision(policy, c, cf.rates(cs), cf.rates(bs), spec)
    if interval is None:
        return None
    per: dict[str, dict] = {}
    names = sorted({s.workload for s in cs})
    ivs = cf.workload_intervals({n: cf.rates(cs, n) for n in names}, {n: cf.rates(bs, n) for n in names},
                                confidence=spec.interval.confidence, looks=policy.workload_looks_at(c))
    for name in names:
        wc, iv = cf.rates(cs, name), ivs[name]
        row: dict = {"n": len(wc), "accept_length": cf.accept_length(cs, name),
                     "baseline_accept_length": cf.accept_length(bs, name)}
        if iv is not None:
            d = judge_throughput(spec, phase=GATE, interval=iv, workload=True).status
            row.update(delta_pct=(iv.ratio - 1) * 100, low_pct=(iv.low - 1) * 100,
                       high_pct=(iv.high - 1) * 100 if math.isfinite(iv.high) else None,
                       status=d if d != "inconclusive" else "not judged alone", text=iv.pct())
        else:
            row.update(status="no baseline samples", text="-")
        per[name] = row
    crates, brates = cf.rates(cs), cf.rates(bs)
    return interval, decision, per, (sum(crates) / len(crates), sum(brates) / len(brates))


def _throughput_reason(reason: str, c: int) -> bool:
    return reason.startswith(f"C={c}: output ") or reason.startswith(f"C={c}: repeats spread")


def workload_accept(run: BenchRun, levels: list[int]) -> dict[str, float]:
    """Accept length per workload over `levels`, from the requests' samples (output tokens over
    verify rounds, `[workload, tokens, e2e, ttft, verify rounds, ok]`); workloads without verify
    rounds (no speculative metadata) are left out."""
    tokens: dict[str, float] = {}
    rounds: dict[str, float] = {}
    for lv in run.levels:
        if lv.level not in levels:
            continue
        for smp in getattr(lv, "samples", None) or []:
            if len(smp) < 5 or not smp[4] or (len(smp) > 5 and not smp[5]):
                continue
            tokens[smp[0]] = tokens.get(smp[0], 0.0) + float(smp[1])
            rounds[smp[0]] = rounds.get(smp[0], 0.0) + float(smp[4])
    return {w: tokens[w] / rounds[w] for w in sorted(tokens) if rounds[w] > 0}


def accept_cause(per_workload: dict[str, float], floor: float | None) -> str:
    """What a low accept length points at, named only where the evidence supports it (issue #49):
    low on every workload of the mix is the signature of a bug in the tree (a larger tree can
    only add accepted paths, whatever the text); high on some and low on others is the drafter
    fitting some text and not other (a domain effect), not a bug; one workload or none cannot
    tell the two apart, and then no cause is named."""
    if floor is None or len(per_workload) < 2:
        return ("; one workload's requests (or none with verify rounds) cannot tell a tree bug from the "
                "drafter's domain: bench the workload mix to tell")
    shown = ", ".join(f"{w} {a:.2f}" for w, a in per_workload.items())
    high = [w for w, a in per_workload.items() if clears(a, floor)]
    if not high:
        return (f"; low on every workload ({shown}): a drop on every kind of text points at a tree-mask, "
                "position or graph-padding bug")
    return (f"; per workload {shown}: {', '.join(high)} at or above the floor, the others below: the drafter "
            "fits some text and not other (a domain effect, not a tree bug): a drafter trained for the "
            "served text, or keep the baseline for it")


def _level_rules(k: BenchLevel, spec: AnalysisSpec, c: int) -> tuple[RuleResult, RuleResult]:
    """Level c's errors and accept-length rules (onhost/analysis.py's evaluator)."""
    return (judge_errors(spec, phase=GATE, failed=k.errors),
            judge_accept_length(spec, k.accept, phase=GATE, at=c))


def _status_without_throughput(errors: RuleResult, accept: RuleResult) -> Status:
    """The level's status from errors and accept length only (the interval judges throughput)."""
    return "fail" if "fail" in (errors.status, accept.status) else "pass"


def _why(status: str, delta: float | None, c: int, spec: AnalysisSpec, accept: RuleResult, *, interval=None) -> str:
    """The status of one level in words that match its numbers (never "better" for a loss)."""
    if delta is None:
        return "not compared (baseline throughput 0)"
    pct = interval.pct() if interval is not None else f"{delta * 100:+.1f} %"
    acc = f", accept {accept.observed:.2f} >= floor {accept.threshold:.2f}" if accept.status == "pass" and \
        status == "pass" else ""
    if status != "pass":
        return f"{status} ({pct})"
    thr = spec.throughput
    gain = thr.speedup_level(c) and thr.min_speedup >= 0
    if gain or delta < 0:
        return f"pass ({pct}, {_need(thr, c)[0]}{acc})"
    return f"pass ({pct}, faster than the baseline{acc})"


def _need(thr, c: int) -> tuple[str, str]:
    """What level C must show, in words that read right with its sign (issue #49): a gain "at
    least +5 % needed here" / "the +5 % this level needs"; a loss allowed "within the -15 % limit" /
    "the -15 % limit" (never "at least -15 % needed")."""
    need = thr.needed_delta(c) * 100
    if thr.speedup_level(c) and need >= 0:
        return f"at least {need:+.0f} % needed here", f"the {need:+.0f} % this level needs"
    return f"within the {need:+.0f} % limit", f"the {need:+.0f} % limit"


def sign_disagreement(row: "LevelRow") -> str | None:
    """Where a level's aggregate delta and its judged per-request delta have opposite signs, the
    words that say so and why they can (issue #49: "agg Δ -1.5% judged Δ +62.3%" with nothing
    saying why); None where they agree or one is missing."""
    agg, judged = row.aggregate_delta_pct, row.delta_pct
    if row.judged_on != "per-request" or agg is None or judged is None or agg * judged >= 0:
        return None
    return (f"the aggregate ({agg:+.1f} %) and the per-request ratio ({judged:+.1f} %) disagree in sign: the "
            "aggregate is all output over the run's wall time (queueing, the slowest request and the mix weigh "
            "in), the per-request ratio each request's own tok/s; the gate judges the per-request ratio")


def verdict_summary(verdict: "Verdict") -> str:
    """One line per verdict, each level in the words of its row."""
    return "; ".join(f"C={r.concurrency}: {r.why or r.status}" for r in verdict.rows)


# --------------------------------------------------------------------------- marginal: re-measure once
def next_action(verdict: Verdict) -> Literal["promote", "remeasure", "rollback"]:
    """pass -> promote; fail -> rollback; marginal or inconclusive -> remeasure on the
    first attempt, rollback after a re-measure (a release not proven better does not stay)."""
    if verdict.status == "pass":
        return "promote"
    if verdict.status in ("marginal", "inconclusive") and verdict.attempts < 2:
        return "remeasure"
    return "rollback"


def finalize(verdict: Verdict) -> Verdict:
    """A verdict after the re-measure: still marginal or inconclusive -> fail."""
    if verdict.status not in ("marginal", "inconclusive") or verdict.attempts < 2:
        return verdict
    return verdict.model_copy(update={
        "status": "fail", "reasons": [*verdict.reasons, f"still {verdict.status} after one re-measure: failing "
                                      "(a release not proven better does not stay)"]})


def judge_with_remeasure(measure: Callable[[], BenchRun], baseline: BenchRun, policy: GatePolicy | None = None, *,
                         profile_kind: str, canary_mismatch: Any = None, canary_ran: bool | None = None,
                         first: BenchRun | None = None, spec: AnalysisSpec | None = None) -> tuple[Verdict, BenchRun]:
    """Measure (or take `first`), judge; if marginal, measure once more, judge
    the repeats of both runs together, and fail if still marginal. Returns the
    final verdict and the run it was judged on."""
    run = first if first is not None else measure()
    v = judge(run, baseline, policy, profile_kind=profile_kind, canary_mismatch=canary_mismatch,
              canary_ran=canary_ran, spec=spec)
    if next_action(v) != "remeasure":
        return v, run
    run = run.merged(measure())
    v2 = judge(run, baseline, policy, profile_kind=profile_kind, canary_mismatch=canary_mismatch,
               canary_ran=canary_ran, spec=spec)
    v2 = v2.model_copy(update={"attempts": 2, "notes": [*v2.notes, f"re-measured once after a {v.status} verdict"]})
    return finalize(v2), run
