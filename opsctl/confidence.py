"""How sure a verdict is: the speedup of a release over the baseline at one level, with a
bootstrap confidence interval over requests.

Each request's own decode rate (output tokens / end-to-end seconds) is a sample; a level's
speedup is mean(candidate rates) / mean(baseline rates) over the same requests (the same
seed gives both sides the same prompts). The interval resamples the requests of each side
with replacement (percentile bootstrap, 2,000 resamples, seeded so a verdict is
reproducible). A level is decided only when the interval clears the threshold:

    lower bound >= threshold  -> pass        upper bound < threshold -> fail
    otherwise, or fewer than `min_requests` samples on a side        -> inconclusive

Pure functions on plain data; the gate (opsctl/gates.py) and the measuring loop
(opsctl/flow/bench.py, opsctl/gates.py) use them.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Literal

Decision = Literal["pass", "fail", "inconclusive"]
BOOTSTRAP_RESAMPLES = 2000


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
    high: float
    n_candidate: int
    n_baseline: int
    confidence: float

    def pct(self) -> str:
        return (f"{(self.ratio - 1) * 100:+.1f} % [{(self.low - 1) * 100:+.1f}, {(self.high - 1) * 100:+.1f}] "
                f"({self.confidence * 100:.0f} % CI, n={self.n_candidate}/{self.n_baseline})")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def speedup_interval(candidate: list[float], baseline: list[float], *, confidence: float = 0.90,
                     resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Interval | None:
    """Ratio of means with a percentile-bootstrap interval; None without samples."""
    if not candidate or not baseline or _mean(baseline) <= 0:
        return None
    rng = random.Random(seed)
    nc, nb = len(candidate), len(baseline)
    ratios = []
    for _ in range(resamples):
        c = sum(candidate[rng.randrange(nc)] for _ in range(nc)) / nc
        b = sum(baseline[rng.randrange(nb)] for _ in range(nb)) / nb
        if b > 0:
            ratios.append(c / b)
    ratios.sort()
    tail = (1.0 - confidence) / 2.0
    lo = ratios[int(tail * (len(ratios) - 1))]
    hi = ratios[int((1.0 - tail) * (len(ratios) - 1))]
    return Interval(_mean(candidate) / _mean(baseline), lo, hi, nc, nb, confidence)


def decide(interval: Interval | None, threshold: float, min_requests: int) -> Decision:
    """pass / fail only when the interval clears `threshold` (a ratio: 1.05 = needs +5 %)
    with at least `min_requests` samples on each side; else inconclusive."""
    if interval is None or interval.n_candidate < min_requests or interval.n_baseline < min_requests:
        return "inconclusive"
    if interval.low >= threshold:
        return "pass"
    if interval.high < threshold:
        return "fail"
    return "inconclusive"
