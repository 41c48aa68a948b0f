"""gpu_decode.py's device-agnostic parts: statistics (chi-square), the request
plan, the oracle drafter's coin, the step timer (CUDA events / host clock) and
the breakdown table -- CPU-tested in tests/test_gpu_decode.py."""

from __future__ import annotations

import contextlib
import random
import time

import torch


# ---------------------------------------------------------------------------
# statistics (device-agnostic; CPU-tested)
# ---------------------------------------------------------------------------


def chi2_sf(x: float, dof: int) -> float:
    """P(chi2_dof >= x) (regularized upper incomplete gamma)."""
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(max(x, 0.0) / 2.0, dtype=torch.float64)))


def chi2_gof(counts, probs, min_expected: float = 5.0):
    """Goodness of fit of ``counts`` (dict or list over cells) to ``probs`` (same
    cells; the remainder of the probability mass is one more cell).  Cells with
    expected count < ``min_expected`` are pooled.  Returns (stat, dof, p)."""
    if isinstance(counts, dict):
        keys = sorted(set(counts) | set(probs))
        c = [float(counts.get(k, 0)) for k in keys]
        p = [float(probs.get(k, 0.0)) for k in keys]
    else:
        c, p = [float(x) for x in counts], [float(x) for x in probs]
    n = sum(c)
    rest_p = max(0.0, 1.0 - sum(p))
    cells, pool_c, pool_p = [], 0.0, rest_p
    for ci, pi in zip(c, p):
        if pi * n >= min_expected:
            cells.append((ci, pi))
        else:
            pool_c += ci
            pool_p += pi
    if pool_p * n >= min_expected or (cells and pool_c > 0):
        cells.append((pool_c, max(pool_p, 1e-300)))
    elif pool_c > 0:  # all pooled mass tiny but observed: join the smallest cell
        ci, pi = cells.pop()
        cells.append((ci + pool_c, pi + pool_p))
    stat = sum((ci - n * pi) ** 2 / (n * pi) for ci, pi in cells)
    dof = len(cells) - 1
    return stat, dof, chi2_sf(stat, dof)


# ---------------------------------------------------------------------------
# the request plan: arrivals / lengths (device-agnostic; CPU-tested)
# ---------------------------------------------------------------------------


def grow_shrink_plan(n_req: int, seed: int, min_new: int, max_new: int, arrive_every: int = 3):
    """Requests arriving in doubling groups (1, 1, 2, 4, 8, ...) every
    ``arrive_every`` steps, each generating a random number of tokens: the batch
    grows to ``n_req`` and shrinks as they finish.  Returns
    ``[(arrival_step, prompt_len, n_new)]``."""
    rng = random.Random(seed)
    out, step, group = [], 0, 1
    while len(out) < n_req:
        for _ in range(min(group, n_req - len(out))):
            out.append((step, rng.randint(4, 24), rng.randint(min_new, max_new)))
        step += arrive_every
        group = 1 if len(out) < 2 else len(out)
    return out


def oracle_hit(req: torch.Tensor, pos: torch.Tensor, hit: float) -> torch.Tensor:
    """Deterministic per-(request slot, position) coin: True with probability ``hit``."""
    h = (req.to(torch.int64) * 1000003 + pos.to(torch.int64) * 7919 + 12345) * 2654435761
    h = torch.remainder(h, 1 << 31)
    return torch.remainder(h, 10007).to(torch.float32) < hit * 10007


# ---------------------------------------------------------------------------
# step-cost accounting (device-agnostic; CPU-tested)
# ---------------------------------------------------------------------------

SEGMENTS = ("draft_fwd", "head_tree", "verify_prep", "target_fwd", "accept_commit")
_TIMER = [None]  # the StepTimer of the running decode loop (module-level wrappers route to it)


def timed(seg, fn):
    """``fn`` with its calls charged to segment ``seg`` of the current step."""
    def inner(*a, **k):
        t = _TIMER[0]
        if t is None:
            return fn(*a, **k)
        with t.seg(seg):
            return fn(*a, **k)

    inner.__wrapped__ = fn
    return inner


class StepTimer:
    """Per decode step: host wall time of each segment (perf_counter around the
    call) and, on CUDA, the GPU stream span between CUDA events at the segment
    boundaries.  GPU "between" = the step's span minus the segments' spans;
    wall "between" = the host's time in the step (before the closing
    synchronize) minus the segments' (the Python between them), "total" = until
    the GPU has finished.  Nested segments (an inner call while an outer
    one runs) are charged to the outer one only."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.active = False
        self.rows = []
        self._stack = []

    def start_step(self):
        self.cur = {"wall": {s: 0.0 for s in SEGMENTS}, "events": []}
        self.active = True
        self.t0 = time.perf_counter()
        self.e0 = self._event()

    def _event(self):
        if not self.cuda:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    @contextlib.contextmanager
    def seg(self, name):
        if not self.active or self._stack:
            yield
            return
        self._stack.append(name)
        e1 = self._event()
        t1 = time.perf_counter()
        try:
            yield
        finally:
            t2 = time.perf_counter()
            e2 = self._event()
            self._stack.pop()
            self.cur["wall"][name] += t2 - t1
            self.cur["events"].append((name, e1, e2))

    def end_step(self, **extra):
        if not self.active:
            return
        e_end = self._event()
        host = time.perf_counter() - self.t0  # the host's time in the step (no wait for the GPU)
        if self.cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self.t0  # until the GPU has finished the step
        row = {"wall_total": wall, "wall_host": host, **{f"wall_{s}": v for s, v in self.cur["wall"].items()}}
        row["wall_between"] = host - sum(self.cur["wall"].values())
        if self.cuda:
            gpu = {s: 0.0 for s in SEGMENTS}
            for name, a, b in self.cur["events"]:
                gpu[name] += a.elapsed_time(b) / 1e3
            tot = self.e0.elapsed_time(e_end) / 1e3
            row.update({f"gpu_{s}": v for s, v in gpu.items()})
            row["gpu_total"] = tot
            row["gpu_between"] = tot - sum(gpu.values())
        row.update(extra)
        self.rows.append(row)
        self.active = False

    @staticmethod
    def summarize(rows, skip: int = 0):
        rows = rows[skip:]
        if not rows:
            return {}
        keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
        out = {}
        for k in keys:
            v = sorted(float(r[k]) for r in rows)
            out[k] = v[len(v) // 2]
        out["steps"] = len(rows)
        return out


def non_forward(summary: dict, prefix: str) -> float:
    """Per-step time that is neither forward: head + tree, verify prep,
    accept/commit and the time between segments."""
    return sum(summary.get(f"{prefix}_{k}", 0.0) for k in ("head_tree", "verify_prep", "accept_commit", "between"))


def breakdown_table(results, prefix=None) -> str:
    """Markdown table (ms per step, medians) of the breakdown rows: CUDA-event
    spans where measured (``prefix`` "gpu"), else / or host wall clock ("wall")."""
    hdr = ("| config | bs | budget | steps | accept len | drafter fwd | head + tree | verify prep | target fwd | "
           "accept/commit | between | **non-forward** | step | AR step | tok/s DDTree / AR |")
    lines = [hdr, "|" + "---|" * 15]
    for r in results:
        s = r["summary"]
        p = prefix or ("gpu" if "gpu_total" in s else "wall")

        def ms(k):
            return f"{1e3 * s.get(f'{p}_{k}', 0.0):.3f}"

        nf = 1e3 * non_forward(s, p)
        ar = r.get("ar", {})
        ar_ms = 1e3 * ar.get(f"{p}_total", ar.get("wall_total", 0.0))
        tps = r.get("tok_per_s", 0.0)
        ar_tps = r.get("ar_tok_per_s", 0.0)
        lines.append(
            f"| {r['config']} | {r['bs']} | {r['budget']} | {s.get('steps', 0)} | {r.get('accept_len', 0):.2f} | "
            f"{ms('draft_fwd')} | {ms('head_tree')} | {ms('verify_prep')} | {ms('target_fwd')} | "
            f"{ms('accept_commit')} | {ms('between')} | **{nf:.3f}** | {ms('total')} | {ar_ms:.3f} | "
            f"{tps:.0f} / {ar_tps:.0f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# SGLang 0.5.23 on the device: imports, what is real, what stands in
# ---------------------------------------------------------------------------
