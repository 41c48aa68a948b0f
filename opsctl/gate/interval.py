"""How sure a verdict is: the speedup of a release over the baseline at one level, with a
confidence interval over requests, and the sequential rule that lets the gate look at it after
every round without spending more error than it states.

Each request's own decode rate (output tokens / end-to-end seconds) is a sample; a level's
speedup is mean(candidate rates) / mean(baseline rates) over the same requests (the same
seed gives both sides the same prompts).

**The interval** (`METHOD`, "log-t"): a Welch t interval on the log of that ratio of means,

    log(ratio) +/- t(df) * se,   se^2 = s_c^2 / (n_c m_c^2) + s_b^2 / (n_b m_b^2)

(the delta method for the log of each mean, Welch-Satterthwaite degrees of freedom), taken
back with exp, so it is asymmetric around the ratio as a ratio should be. Closed form: no
resampling, the same numbers on every run. Chosen by simulation (benchmarks/verdict_stats.py,
docs/verdict-statistics.md): the percentile bootstrap used before covered the true ratio 81-87 %
of the time at n = 8-16 for a nominal 90 %, BCa no better at these sizes; this one 89-94 % on the
lab emulator's rates and on heavy-tailed server-like rates (its remaining misses are mostly on
the high side: a right tail the sample has not seen).

**The sequential rule** (Bonferroni over the planned looks): the gate measures a level in
rounds, looks at the interval after each, and stops as soon as it is decided; an undecided
verdict is re-measured once (continuing the same rounds). Those are at most `looks` looks,
planned before the first (`GatePolicy.looks_at`). Each look uses the interval at confidence
1 - (1 - confidence) / looks, so the chance that *any* look's interval misses the true ratio on
a side is at most (1 - confidence) / 2 over the whole gate (as far as the t approximation holds;
the simulation measures it): with the default 90 %, a release whose true speedup is below the
threshold passes with at most 5 % probability, one whose true speedup is at or above it fails
on the interval (wholly below) with at most 5 %, whether the verdict came at the first look or
the last. The per-workload rule ("a workload wholly below the limit fails the level") is a
second, fail-only check with its own (1 - confidence) / 2: a workload's interval
(`workload_intervals`) takes each side's spread as the larger of its own and the level's pooled
within-workload spread, its confidence spread over the mix's workloads x the gate's judges
(`GatePolicy.workload_looks_at`). A level is decided only when the interval clears the threshold:

    lower bound >= threshold  -> pass        upper bound < threshold -> fail
    otherwise, or fewer than `min_requests` samples on a side        -> inconclusive

Pure functions on plain data, standard library only; the gate (opsctl/gate/decide.py) and the
measuring loop (opsctl/gate/measure.py) use them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Iterable, Literal

from opsctl.onhost.analysis import against_interval

Decision = Literal["pass", "fail", "inconclusive"]
METHOD = "log-t"
METHOD_TEXT = "Welch t interval on the log of the ratio of mean per-request tok/s"
SEQUENTIAL_TEXT = "Bonferroni over the planned looks (rounds x attempts)"


@dataclass(frozen=True)
class Sample:
    workload: str
    output_tokens: int
    e2e_s: float
    ttft_s: float = 0.0
    verify_rounds: int = 0
    ok: bool = True

    @property
    def rate(self) -> float:
        return self.output_tokens / self.e2e_s if self.e2e_s > 0 else 0.0


def samples_of(levels: Iterable) -> list[Sample]:
    """Every request sample of some level records (BenchLevel or dict with 'samples')."""
    out: list[Sample] = []
    for lv in levels:
        raw = lv.get("samples") if isinstance(lv, dict) else getattr(lv, "samples", None)
        for s in raw or []:
            try:
                out.append(Sample(str(s[0]), int(s[1]), float(s[2]), float(s[3]), int(s[4]), bool(s[5])))
            except (IndexError, TypeError, ValueError):
                continue
    return out


def rates(samples: Iterable[Sample], workload: str | None = None) -> list[float]:
    return [s.rate for s in samples if s.ok and s.e2e_s > 0 and (workload is None or s.workload == workload)]


def accept_length(samples: Iterable[Sample], workload: str | None = None) -> float | None:
    ok = [s for s in samples if s.ok and s.verify_rounds > 0 and (workload is None or s.workload == workload)]
    rounds = sum(s.verify_rounds for s in ok)
    return sum(s.output_tokens for s in ok) / rounds if rounds else None


@dataclass(frozen=True)
class Interval:
    ratio: float       # candidate / baseline (1.25 = +25 %)
    low: float
    high: float        # math.inf when a side has fewer than 2 samples
    n_candidate: int
    n_baseline: int
    confidence: float  # what the gate states: over all `looks` (each look's own is look_confidence)
    looks: int = 1     # planned looks this confidence is split over (Bonferroni)
    method: str = METHOD

    @property
    def look_confidence(self) -> float:
        return look_confidence(self.confidence, self.looks)

    def pct(self) -> str:
        """`+12.0 % [+3.1, +22.0] (90 % CI over 6 looks, 98.3 % each; log-t; 16 vs 48 requests)`:
        the interval, what its confidence means, the method and the requests it rests on."""
        hi = "+inf" if not math.isfinite(self.high) else f"{(self.high - 1) * 100:+.1f}"
        conf = f"{_pct_text(self.confidence)} % CI"
        if self.looks > 1:
            conf += f" over {self.looks} looks, {_pct_text(self.look_confidence)} % each"
        return (f"{(self.ratio - 1) * 100:+.1f} % [{(self.low - 1) * 100:+.1f}, {hi}] "
                f"({conf}; {self.method}; {self.n_candidate} vs {self.n_baseline} requests)")


def _pct_text(p: float) -> str:
    v = p * 100
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.1f}".rstrip("0").rstrip(".")


def look_confidence(confidence: float, looks: int) -> float:
    """Each look's two-sided confidence when `confidence` is spread over `looks` (Bonferroni)."""
    return 1.0 - (1.0 - confidence) / max(1, int(looks))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _var(xs: list[float], m: float) -> float:
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def _rel_var(xs: list[float]) -> tuple[float, int]:
    """(sample variance / mean^2, degrees of freedom) of one side."""
    m = _mean(xs)
    return (_var(xs, m) / (m * m) if m > 0 else 0.0), len(xs) - 1


def speedup_interval(candidate: list[float], baseline: list[float], *, confidence: float = 0.90,
                     looks: int = 1) -> Interval | None:
    """Ratio of means with its log-t interval at `confidence` spread over `looks` looks (each
    look at `look_confidence`); None without samples or with a baseline mean of 0."""
    if not candidate or not baseline:
        return None
    spread = (_rel_var(candidate) if len(candidate) > 1 else None, _rel_var(baseline) if len(baseline) > 1 else None)
    return _log_t(candidate, baseline, spread, confidence, looks, METHOD)


def _log_t(candidate: list[float], baseline: list[float], spread, confidence: float, looks: int,
           method: str) -> Interval | None:
    nc, nb = len(candidate), len(baseline)
    mc, mb = _mean(candidate), _mean(baseline)
    if mb <= 0:
        return None
    ratio = mc / mb
    if mc <= 0:
        return Interval(0.0, 0.0, 0.0, nc, nb, confidence, looks, method)
    (vc, dfc), (vb, dfb) = (s or (0.0, 0) for s in spread)
    if dfc < 1 or dfb < 1:  # no spread to estimate: an interval that decides nothing
        return Interval(ratio, 0.0, math.inf, nc, nb, confidence, looks, method)
    a, b = vc / nc, vb / nb
    se = math.sqrt(a + b)
    if se == 0.0:
        return Interval(ratio, ratio, ratio, nc, nb, confidence, looks, method)
    df = (a + b) ** 2 / ((a * a / dfc if a else 0.0) + (b * b / dfb if b else 0.0))
    q = 1.0 - (1.0 - look_confidence(confidence, looks)) / 2.0
    half = t_quantile(q, df) * se
    return Interval(ratio, ratio * math.exp(-half), ratio * math.exp(half), nc, nb, confidence, looks, method)


WORKLOAD_METHOD = "log-t, spread pooled over workloads"


def workload_intervals(candidate: dict[str, list[float]], baseline: dict[str, list[float]], *,
                       confidence: float = 0.90, looks: int = 1) -> dict[str, Interval | None]:
    """Each workload's own speedup interval (log-t), its spread on each side the larger of its
    own and the level's pooled within-workload spread (relative variance, pooled over the
    workloads with 2+ requests, with their degrees of freedom). A workload judged on its 4
    requests must not get a razor-thin interval because those 4 happened to be alike: on
    step-quantized rates (the lab's: most requests in one cluster, a few faster) its own
    variance is often ~0 (benchmarks/verdict_stats.py)."""
    def pooled(groups: dict[str, list[float]]) -> tuple[float, int] | None:
        ss, df = 0.0, 0
        for xs in groups.values():
            if len(xs) > 1 and _mean(xs) > 0:
                v, d = _rel_var(xs)
                ss += v * d
                df += d
        return (ss / df, df) if df else None

    pc, pb = pooled(candidate), pooled(baseline)
    out: dict[str, Interval | None] = {}
    for name, cw in candidate.items():
        bw = baseline.get(name) or []
        if not cw or not bw:
            out[name] = None
            continue
        sides = []
        for xs, pool in ((cw, pc), (bw, pb)):
            own = _rel_var(xs) if len(xs) > 1 else None
            sides.append(max((s for s in (own, pool) if s is not None), key=lambda s: s[0], default=None))
        out[name] = _log_t(cw, bw, sides, confidence, looks, WORKLOAD_METHOD)
    return out


def decide(interval: Interval | None, threshold: float, min_requests: int) -> Decision:
    """pass / fail only when the interval clears `threshold` (a ratio: 1.05 = needs +5 %)
    with at least `min_requests` samples on each side; else inconclusive. The comparison is the
    analysis' (`analysis.against_interval`, which the gate's levels are judged by); this is
    the form the benchmarks call with a threshold of their own."""
    if interval is None:
        return "inconclusive"
    return against_interval(interval.low, interval.high, interval.n_candidate, interval.n_baseline, threshold,
                            min_requests)  # type: ignore[return-value]


# --------------------------------------------------------------------------- Student's t, standard library only
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _ibeta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (real, > 0) degrees of freedom."""
    tail = 0.5 * _ibeta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def _t_pdf(t: float, df: float) -> float:
    return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
                    - (df + 1) / 2 * math.log1p(t * t / df))


@lru_cache(maxsize=4096)
def _t_quantile(q: float, df: float) -> float:
    z = NormalDist().inv_cdf(q)
    if df > 1e7:
        return z
    # Cornish-Fisher start, then Newton on the exact CDF (bisection-safe)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    t = z + g1 / df + g2 / df ** 2
    lo, hi = 0.0, max(t * 4, 10.0)
    while t_cdf(hi, df) < q:
        hi *= 2
    for _ in range(100):
        f = t_cdf(t, df) - q
        if abs(f) < 1e-13:
            break
        if f > 0:
            hi = min(hi, t)
        else:
            lo = max(lo, t)
        step = f / _t_pdf(t, df)
        nt = t - step
        t = nt if lo < nt < hi else (lo + hi) / 2
        if hi - lo < 1e-12:
            break
    return t


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t with `df` degrees of freedom (0.5 < q < 1; df rounded to
    0.01, which moves the quantile by far less than the interval's own error)."""
    return _t_quantile(q, round(max(df, 1.0), 2))
