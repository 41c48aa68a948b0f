#!/usr/bin/env python3
"""Verdict statistics by simulation: does the gate's interval cover, how often does the gate
pass a release with no real gain or fail one within the limit, and how many requests does it
spend to decide - the method before issue #34 against the current one.

    old: percentile bootstrap of the ratio of mean per-request tok/s (2,000 resamples), 90 %
         at every look; the re-measure starts its rounds afresh and the merged runs are judged.
    new: opsctl/gate/interval.py - log-t interval (Welch t on the log ratio of means), the gate's
         90 % spread over the level's planned looks (Bonferroni); the re-measure continues the
         rounds (`GatePolicy.looks_at`, `gate.decide.throughput_decision`).

Per-request rates are drawn two ways:
    lab     resampled from benchmarks/data/lab_rates.json: the lab's emulator measured the way
            the lab's gate measures it (benchmarks/lab_rates.py: ar-tp8, DDTree budget 16, DDTree
            32 with accept_collapse; the site mix, 64 requests per level), by workload in the
            gate's per-round counts (chat 4, humaneval 2, math 2 of 8). For a chosen true
            difference the DDTree rates are scaled to it; the lab's own cases use them as measured.
    server  real servers' shape: log-normal rates with a heavy right tail (sigma 0.25 for the
            baseline, 0.45 for the speculative release, whose acceptance varies by prompt), and
            5 % slow requests (x0.15-0.5: a long queue, a preemption) on both sides.
The gate's rounds as configured: the lab inventory (rounds of 8, cap 16, at least 8 per side,
baseline benched to the cap: 16; 2 rounds x 2 attempts = 4 looks) for the lab's rates, the
policy's defaults (rounds of 16, cap 48, baseline 48; 3 x 2 = 6 looks) for the server's.

Columns: `pass` / `fail` (the interval cleared the threshold), `not proven` (still
inconclusive after the re-measure: the gate fails it, as "not proven"), `requests` (the
release's requests at the level until the gate stopped, mean). False-pass = pass with no real
gain at the "+5 % needed" level (and at exactly +5 %, where the stated bound is 5 %); false-fail
= fail (interval wholly below) for a real -5 % at a "no worse than -10 %" level (and at exactly
-10 %). Coverage: one nominal 90 % interval at fixed n, how often it holds the true ratio.

About two minutes at idle priority on two cores (numpy for the old method's bootstrap):

    .venv/bin/python benchmarks/verdict_stats.py [--sims 1000] [--coverage-sims 2000] [--seed 1]

tests/gates/test_verdict_stats.py runs the new method's part with fewer cases (fixed seed).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from opsctl.gate import interval as cf  # noqa: E402

LAB_RATES = ROOT / "benchmarks" / "data" / "lab_rates.json"
CONFIDENCE = 0.90
RESAMPLES = 2000  # the old bootstrap's


# --------------------------------------------------------------------------- populations
@dataclass
class Population:
    """Where one side's requests come from: `draw(rng, n)` -> [(workload, rate)], and the
    true ratio of the candidate's mean to the baseline's."""
    name: str
    base: Callable[[random.Random, int], list[tuple[str, float]]]
    cand: Callable[[random.Random, int], list[tuple[str, float]]]
    ratio: float


def _lognormal_mean(sigma: float) -> float:
    return math.exp(sigma * sigma / 2)


SLOW_SHARE, SLOW_LOW, SLOW_HIGH = 0.05, 0.15, 0.5


def _server_rate(rng: random.Random, sigma: float) -> float:
    x = rng.lognormvariate(0.0, sigma)
    return x * rng.uniform(SLOW_LOW, SLOW_HIGH) if rng.random() < SLOW_SHARE else x


def server_population(ratio: float, base_sigma: float = 0.25, cand_sigma: float = 0.45) -> Population:
    """Heavy right tail and a few slow requests; the slow share is the same on both sides, so
    the true ratio of means is `ratio` exactly."""
    bm, cm = 100.0 / _lognormal_mean(base_sigma), 100.0 * ratio / _lognormal_mean(cand_sigma)
    return Population(f"server {_pct(ratio)}",
                      lambda rng, n: [("-", bm * _server_rate(rng, base_sigma)) for _ in range(n)],
                      lambda rng, n: [("-", cm * _server_rate(rng, cand_sigma)) for _ in range(n)], ratio)


def _round_counts(n: int, mix: dict[str, float]) -> dict[str, int]:
    """The gate's split of a round by workload (opsctl.gate.workloads.WorkloadSet.counts)."""
    raw = {k: w * n for k, w in mix.items()}
    counts = {k: int(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: raw[k] - counts[k], reverse=True)[: n - sum(counts.values())]:
        counts[k] += 1
    return counts


def _by_workload(rows: list) -> dict[str, list[float]]:
    by: dict[str, list[float]] = {}
    for w, r in rows:
        by.setdefault(w, []).append(r)
    return by


def _pool_sampler(by: dict[str, list[float]], scale: dict[str, float], mix: dict[str, float]):
    def draw(rng: random.Random, n: int) -> list[tuple[str, float]]:
        out = []
        for w, k in _round_counts(n, mix).items():
            out += [(w, rng.choice(by[w]) * scale[w]) for _ in range(k)]
        return out

    return draw


LAB_MIX = {"humaneval": 0.3, "chat": 0.5, "math": 0.2}
LAB_ROUND = 8  # the lab gate's rounds: chat 4, humaneval 2, math 2


def lab_population(level: int, ratio: float | None = None, candidate: str = "ddtree-b16",
                   data: dict | None = None) -> Population:
    """The lab emulator's measured rates at `level`: ar-tp8 against `candidate`. With `ratio`
    every workload of the candidate is scaled to that ratio against the baseline's same
    workload (a real difference of that size everywhere); None: as measured, where the truth is
    the ratio of the pools' means weighted as the gate's rounds draw them."""
    data = data or json.loads(LAB_RATES.read_text())
    base = _by_workload(data["servers"]["ar-tp8"][str(level)])
    cand = _by_workload(data["servers"][candidate][str(level)])
    mean = {k: {w: sum(v) / len(v) for w, v in d.items()} for k, d in (("b", base), ("c", cand))}
    if ratio is None:
        scale = {w: 1.0 for w in cand}
        weights = {w: k / LAB_ROUND for w, k in _round_counts(LAB_ROUND, LAB_MIX).items()}
        truth = (sum(weights[w] * mean["c"][w] for w in weights) / sum(weights[w] * mean["b"][w] for w in weights))
    else:
        scale = {w: ratio * mean["b"][w] / mean["c"][w] for w in cand}
        truth = ratio
    name = f"lab C={level} {candidate}" + ("" if ratio is None else f" scaled to {_pct(ratio)}")
    return Population(name, _pool_sampler(base, {w: 1.0 for w in base}, LAB_MIX), _pool_sampler(cand, scale, LAB_MIX),
                      truth)


# --------------------------------------------------------------------------- the gate's rounds
@dataclass(frozen=True)
class GateShape:
    """A level's measuring as configured (opsctl.gate.decide.GatePolicy)."""
    name: str
    per_round: int       # max(C, requests_per_level)
    cap: int             # max(max_requests, per_round)
    min_requests: int
    baseline_n: int      # the baseline is benched to the cap
    min_workload_requests: int = 4
    max_regression: float = 0.10

    @property
    def rounds(self) -> int:
        return -(-self.cap // self.per_round)

    @property
    def looks(self) -> int:
        """GatePolicy.looks_at: the rounds of a measurement and its one re-measure that can decide."""
        return max(1, sum(1 for j in range(1, 2 * self.rounds + 1) if j * self.per_round >= self.min_requests))


LAB_GATE = GateShape("lab inventory: rounds of 8, cap 16, baseline 16", 8, 16, 8, 16)
DEFAULT_GATE = GateShape("policy defaults: rounds of 16, cap 48, baseline 48", 16, 48, 8, 48)


def new_interval(cand: list[float], base: list[float], looks: int):
    return cf.speedup_interval(cand, base, confidence=CONFIDENCE, looks=looks)


_INDEX: dict = {}


def _resample_index(n: int, side: int):
    """2,000 resampling index sets for n requests, drawn once and reused across cases (each
    case's data are drawn afresh, so the estimates stay unbiased; it makes the old method's
    column several times faster)."""
    import numpy as np

    key = (n, side)
    if key not in _INDEX:
        _INDEX[key] = np.random.default_rng(1000 * n + side).integers(0, n, (RESAMPLES, n))
    return _INDEX[key]


def old_interval(cand: list[float], base: list[float], looks: int, rng=None):
    """The percentile bootstrap opsctl used before (2,000 resamples, ratio of means, the same
    quantile picks), 90 % at every look; numpy when present (same method, faster)."""
    nc, nb = len(cand), len(base)
    tail = (1.0 - CONFIDENCE) / 2.0
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - the venv has numpy (matplotlib's dependency)
        np = None
    if np is not None:
        c, b = np.asarray(cand), np.asarray(base)
        ratios = np.sort(c[_resample_index(nc, 0)].mean(1) / b[_resample_index(nb, 1)].mean(1))
        lo, hi = float(ratios[int(tail * (RESAMPLES - 1))]), float(ratios[int((1 - tail) * (RESAMPLES - 1))])
    else:
        r = rng or random.Random(0)
        ratios = sorted(sum(cand[r.randrange(nc)] for _ in range(nc)) / nc /
                        (sum(base[r.randrange(nb)] for _ in range(nb)) / nb) for _ in range(RESAMPLES))
        lo, hi = ratios[int(tail * (RESAMPLES - 1))], ratios[int((1 - tail) * (RESAMPLES - 1))]
    return cf.Interval(sum(cand) / nc / (sum(base) / nb), lo, hi, nc, nb, CONFIDENCE)


def _workload_fails(cand: list[tuple[str, float]], base: list[tuple[str, float]], shape: GateShape,
                    interval, rng) -> bool:
    """The gate's per-workload rule: a workload whose own interval is wholly below -10 % fails
    the level (new, `interval` None: confidence.workload_intervals spread over workloads x judges,
    GatePolicy.workload_looks_at; old: each workload's own bootstrap at 90 %)."""
    names = sorted({w for w, _ in cand})
    if len(names) < 2:  # one workload: its row is the level's own interval
        return False
    by_c = {w: [r for x, r in cand if x == w] for w in names}
    by_b = {w: [r for x, r in base if x == w] for w in names}
    if interval is None:  # new: opsctl.gate.interval.workload_intervals
        ivs = cf.workload_intervals(by_c, by_b, confidence=CONFIDENCE, looks=2 * len(names))
    else:
        ivs = {w: interval(by_c[w], by_b[w], rng) if by_c[w] and by_b[w] else None for w in names}
    return any(cf.decide(iv, 1 - shape.max_regression, shape.min_workload_requests) == "fail"
               for iv in ivs.values())


def run_gate(pop: Population, shape: GateShape, threshold: float, method: str, rng: random.Random) -> tuple[str, int]:
    """One level through the gate: rounds until decided or the cap, the judge (with the
    per-workload rule), the one re-measure of an undecided level. -> (pass | fail | not proven,
    the release's requests at the level)."""
    base = pop.base(rng, shape.baseline_n)
    b_rates = [r for _, r in base]
    if method == "new":
        def iv_of(c, b, _rng=None):
            return new_interval(c, b, shape.looks)
    else:
        def iv_of(c, b, _rng=None):
            return old_interval(c, b, 1, _rng)

    def decide(rows):
        return cf.decide(iv_of([r for _, r in rows], b_rates, rng), threshold, shape.min_requests)

    first: list[tuple[str, float]] = []
    d = "inconclusive"
    for _ in range(shape.rounds):
        first += pop.cand(rng, shape.per_round)
        d = decide(first)
        if d != "inconclusive":
            break
    wl = None if method == "new" else iv_of
    if _workload_fails(first, base, shape, wl, rng):
        return "fail", len(first)
    if d != "inconclusive":
        return d, len(first)
    # the re-measure
    second: list[tuple[str, float]] = []
    for _ in range(shape.rounds):
        second += pop.cand(rng, shape.per_round)
        # old: the re-measure's own rounds stop on its own samples; new: the rounds continue
        d = decide(second if method == "old" else first + second)
        if d != "inconclusive":
            break
    both = first + second
    if method == "old":
        d = decide(both)   # the judge on the merged runs
    if _workload_fails(both, base, shape, wl, rng):
        return "fail", len(both)
    return (d if d != "inconclusive" else "not proven"), len(both)


def gate_rates(pop: Population, shape: GateShape, threshold: float, method: str, sims: int, seed: int) -> dict:
    out = {"pass": 0, "fail": 0, "not proven": 0, "requests": 0}
    for i in range(sims):
        d, n = run_gate(pop, shape, threshold, method, random.Random(f"{seed}/{pop.name}/{i}"))
        out[d] += 1
        out["requests"] += n
    return {k: v / sims for k, v in out.items()}


def coverage(pop: Population, n_cand: int, n_base: int, method: str, sims: int, seed: int) -> dict:
    """One nominal 90 % interval at fixed n: how often it holds the true ratio, and the misses
    per side (low: the interval is wholly above the truth -> a false pass; high: wholly below)."""
    hold = above = below = 0
    for i in range(sims):
        rng = random.Random(f"{seed}/cov/{pop.name}/{n_cand}/{n_base}/{i}")
        c = [r for _, r in pop.cand(rng, n_cand)]
        b = [r for _, r in pop.base(rng, n_base)]
        iv = new_interval(c, b, 1) if method == "new" else old_interval(c, b, 1, rng)
        if iv.low > pop.ratio:
            above += 1
        elif iv.high < pop.ratio:
            below += 1
        else:
            hold += 1
    return {"coverage": hold / sims, "above": above / sims, "below": below / sims}


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f} %" if abs(ratio - 1) > 1e-9 else "none"


# --------------------------------------------------------------------------- tables
def coverage_rows(sims: int, seed: int, methods=("old", "new")) -> list[list[str]]:
    data = json.loads(LAB_RATES.read_text())
    pops = [("lab C=1", lab_population(1, 1.0, data=data)), ("lab C=8", lab_population(8, 1.0, data=data)),
            ("server", server_population(1.0))]
    sizes = [(8, 8), (16, 16), (32, 32), (64, 64), (8, 16), (16, 48)]
    rows = []
    for label, pop in pops:
        for nc, nb in sizes:
            cells = [label, f"{nc} / {nb}"]
            for m in methods:
                r = coverage(pop, nc, nb, m, sims, seed)
                cells.append(f"{r['coverage'] * 100:.1f} % ({r['above'] * 100:.1f} / {r['below'] * 100:.1f})")
            rows.append(cells)
    return rows


def gate_cases(data: dict | None = None) -> list[tuple[str, str, Population, GateShape, float]]:
    """(what it measures, truth, population, gate, threshold)."""
    data = data or json.loads(LAB_RATES.read_text())
    up, down = 1.05, 0.90
    cases = []
    for label, pop_of, shape, lvl_up, lvl_down in (
            ("lab", lambda lvl, r: lab_population(lvl, r, data=data), LAB_GATE, 1, 8),
            ("server", lambda lvl, r: server_population(r), DEFAULT_GATE, 1, 4)):
        cases += [
            ("false-pass", f"{label}, none, needs +5 %", pop_of(lvl_up, 1.00), shape, up),
            ("false-pass bound", f"{label}, exactly +5 %, needs +5 %", pop_of(lvl_up, 1.05), shape, up),
            ("win", f"{label}, +10 %, needs +5 %", pop_of(lvl_up, 1.10), shape, up),
            ("false-fail", f"{label}, -5 %, no worse than -10 %", pop_of(lvl_down, 0.95), shape, down),
            ("false-fail bound", f"{label}, exactly -10 %, no worse than -10 %", pop_of(lvl_down, 0.90), shape, down),
            ("loss", f"{label}, -15 %, no worse than -10 %", pop_of(lvl_down, 0.85), shape, down),
        ]
    cases += [
        ("clear win", "server, +50 %, needs +5 %", server_population(1.50), DEFAULT_GATE, up),
        ("clear loss", "server, -40 %, needs +5 %", server_population(0.60), DEFAULT_GATE, up),
    ]
    cases += [
        ("lab case: clear win", "lab C=1 DDTree b16 as measured, needs +5 %", lab_population(1, data=data),
         LAB_GATE, up),
        ("lab case: collapse", "lab C=1 DDTree b32 accept_collapse as measured, needs +5 %",
         lab_population(1, candidate="ddtree-b32-collapse", data=data), LAB_GATE, up),
        ("lab case: C=4", "lab C=4 DDTree b16 as measured, no worse than -10 %", lab_population(4, data=data),
         LAB_GATE, down),
        ("lab case: close call", "lab C=8 DDTree b16 as measured, no worse than -10 %", lab_population(8, data=data),
         LAB_GATE, down),
    ]
    return cases


def gate_rows(sims: int, seed: int, methods=("old", "new")) -> list[list[str]]:
    rows = []
    for what, label, pop, shape, thr in gate_cases():
        cells = [what, label.replace("as measured", f"as measured ({_pct(pop.ratio).replace(' ', '')})")]
        for m in methods:
            r = gate_rates(pop, shape, thr, m, sims, seed)
            cells.append(f"{r['pass'] * 100:.1f} / {r['fail'] * 100:.1f} / {r['not proven'] * 100:.1f}")
            cells.append(f"{r['requests']:.1f}")
        rows.append(cells)
    return rows


def _table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=1000, help="simulated gate runs per row (default 1000)")
    ap.add_argument("--coverage-sims", type=int, default=2000, help="simulated intervals per coverage row (default 2000)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    print(f"Coverage of one nominal 90 % interval ({a.coverage_sims} cases each; in brackets the misses: interval "
          "wholly above the truth / wholly below)\n")
    print(_table(["rates", "n release / baseline", "old: percentile bootstrap", "new: log-t"],
                 coverage_rows(a.coverage_sims, a.seed)))
    print(f"\nThe gate at one level, rounds as configured ({a.sims} cases each): pass / fail / not proven in %, "
          "and the release's requests to the decision (mean)\n")
    print(_table(["measures", "truth, threshold", "old: pass / fail / not proven", "old: requests",
                  "new: pass / fail / not proven", "new: requests"], gate_rows(a.sims, a.seed)))
    print(f"\n({time.monotonic() - t0:.0f} s; lab gate: {LAB_GATE.name}, {LAB_GATE.looks} looks; server gate: "
          f"{DEFAULT_GATE.name}, {DEFAULT_GATE.looks} looks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
