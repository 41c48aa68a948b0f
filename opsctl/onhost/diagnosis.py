"""Why a speculative release lost, and what would win (issue #48): the arithmetic of `opsctl
diagnose`, the "Why" of a report, a failed gate's reason line, tune's table and the watch's trip
notice, in one place.

At concurrency C a request commits `accept` tokens per decode step, so

    speedup(C)  = accept(C) / step_ratio(C),    step_ratio = step_spec(C) / step_ar(C)
    break-even accept(C) = step_ratio(C)

and the speculative step splits into the target's verify forward over C x (budget + 1) tokens
(measured by the runtime's step line, else estimated from the baseline's own steps, which are
forwards over C tokens: `ForwardModel`) and the remainder (drafter, tree, host work).

A losing level's shortfall is split in log space, so the parts add up:

    acceptance      ln(reference accept / accept)   (below what this drafter reached: a smaller
                                                    budget, or what the profile declares)
    verify_compute  ln(verify_ms / step_ar_ms)      (what the verify forward costs over an AR step)
    overhead        ln(step_ms / verify_ms)         (drafter + tree + host on top of the verify)
    parallelism     ln(other baseline / baseline)   (where the other parallelism's AR baseline is
                                                    faster at this level: TP vs EP)

Each cause's share is its part of the sum. The emulator's performance model computes the same
parts from what it knows (opsctl/lab/emulator/sglang/lab/perf.py `loss_parts`), which is how the
lab tests check the shares.

Standard library only (Python >= 3.8): the watch agent runs it on the host.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

SCHEMA = "opsctl.diagnosis/1"

# The runtime's step line (runtime/src/sglang_ddtree/stepparts.py; the emulator prints the same):
#   DDTree step parts: bs=8 budget=16 sampled=10 of=200 drafter_ms=0.334 tree_ms=0.041 prep_ms=1.162
#   target_ms=18.520 commit_ms=0.111 step_ms=21.004
STEP_PARTS_MARK = "DDTree step parts:"
PART_KEYS = ("drafter_ms", "tree_ms", "prep_ms", "target_ms", "commit_ms")
PART_NAMES = {"drafter_ms": "drafter forward", "tree_ms": "head + tree", "prep_ms": "verify preparation",
              "target_ms": "target forward", "commit_ms": "accept/commit"}
_KV = re.compile(r"([a-z_]+)=([0-9.]+)")

CAUSE_WORDS = {"acceptance": "acceptance", "verify_compute": "verify compute", "overhead": "overhead",
               "parallelism": "parallelism"}
MIN_CAUSE_SHARE = 0.05    # a part below 5 % of a loss is not named as a cause
DEFAULT_BUDGETS = (4, 8, 16, 32, 64)


@dataclass
class StepParts:
    """One step line: medians over `sampled` of `of` decode steps at one (bs, budget)."""
    bs: int
    budget: int
    sampled: int
    of: int
    parts: Dict[str, float]
    step_ms: float

    @property
    def width(self) -> int:
        return self.budget + 1


def parse_step_parts(lines: Iterable[str]) -> List[StepParts]:
    """Every step line in a journal (any prefix before the mark: journald's, SGLang's)."""
    out = []
    for line in lines:
        i = line.find(STEP_PARTS_MARK)
        if i < 0:
            continue
        kv = dict((k, v) for k, v in _KV.findall(line[i + len(STEP_PARTS_MARK):]))
        try:
            out.append(StepParts(bs=int(kv["bs"]), budget=int(kv["budget"]), sampled=int(kv.get("sampled", 0)),
                                 of=int(kv.get("of", 0)), parts={k: float(kv[k]) for k in PART_KEYS},
                                 step_ms=float(kv["step_ms"])))
        except (KeyError, ValueError):
            continue
    return out


def merge_step_parts(lines: Sequence[StepParts]) -> Dict[Tuple[int, int], StepParts]:
    """(bs, budget) -> one entry: each part the sample-weighted mean of the lines' medians."""
    groups: Dict[Tuple[int, int], List[StepParts]] = {}
    for sp in lines:
        groups.setdefault((sp.bs, sp.budget), []).append(sp)
    out = {}
    for key, g in groups.items():
        w = [max(sp.sampled, 1) for sp in g]
        tw = float(sum(w))
        out[key] = StepParts(bs=key[0], budget=key[1], sampled=sum(sp.sampled for sp in g), of=sum(sp.of for sp in g),
                             parts={k: sum(sp.parts[k] * wi for sp, wi in zip(g, w)) / tw for k in PART_KEYS},
                             step_ms=sum(sp.step_ms * wi for sp, wi in zip(g, w)) / tw)
    return out


@dataclass
class Side:
    """One side's decode measurement at one concurrency level."""
    concurrency: int
    step_ms: float                   # one decode step (ms)
    accept: float = 1.0              # tokens committed per step (1 for autoregressive)
    source: str = "requests"         # requests | tpot | aggregate | journal
    tok_s: Optional[float] = None    # measured aggregate output tok/s (for the record)
    measured_speedup: Optional[float] = None  # what the gate judged, candidate side only
    batch: Optional[float] = None    # the running batch the steps had on average (<= C: requests come and go)

    @property
    def running(self) -> float:
        """The decode batch: the effective concurrency (at least 1: a decode step has a request),
        a whole number when it is within 0.1 of one."""
        b = self.batch if self.batch and 0 < self.batch <= self.concurrency else float(self.concurrency)
        b = max(1.0, b)
        return float(round(b)) if abs(b - round(b)) <= 0.1 else b

    @property
    def decode_tok_s(self) -> float:
        return self.concurrency * self.accept * 1000.0 / self.step_ms


class ForwardModel:
    """Forward time against tokens per forward, from points (tokens, ms, kind): the baseline's
    steps (`baseline`: C tokens), the runtime's measured target forwards (`measured`: bs x width)
    and, only when fewer than two of those exist, the candidate's whole steps as upper bounds
    (`bound`). Linear between neighbouring points; outside them the least-squares line, never
    cheaper for more tokens than the largest point."""

    def __init__(self, points: Sequence[Tuple[float, float, str]]):
        good = [p for p in points if p[2] != "bound" and p[1] > 0]
        use = good if len({p[0] for p in good}) >= 2 else [p for p in points if p[1] > 0]
        by_tokens: Dict[float, List[Tuple[float, str]]] = {}
        for t, ms, kind in use:
            by_tokens.setdefault(float(t), []).append((ms, kind))
        self.points = sorted((t, statistics.fmean(m for m, _ in v), _best_kind(k for _, k in v))
                             for t, v in by_tokens.items())
        xs = [p[0] for p in self.points]
        ys = [p[1] for p in self.points]
        self.slope, self.intercept = _fit(xs, ys)

    def estimate(self, tokens: float) -> Tuple[Optional[float], str]:
        """(ms, how): how is measured | interpolated | extrapolated, `bound` when the model rests
        on the candidate's whole steps, `none` without points."""
        pts = self.points
        if not pts:
            return None, "none"
        bound = any(k == "bound" for _, _, k in pts)
        for t, ms, kind in pts:
            if abs(t - tokens) < 1e-9:
                return ms, ("bound" if kind == "bound" else "measured" if kind == "measured" else "interpolated")
        if len(pts) == 1:
            return None, "none"
        lo = [p for p in pts if p[0] < tokens]
        hi = [p for p in pts if p[0] > tokens]
        if lo and hi:
            (t0, m0, _), (t1, m1, _) = lo[-1], hi[0]
            ms = m0 + (m1 - m0) * (tokens - t0) / (t1 - t0)
            return ms, "bound" if bound else "interpolated"
        ms = self.intercept + self.slope * tokens
        if not hi:   # above every point: at least the largest point's time
            ms = max(ms, pts[-1][1])
        else:
            ms = max(min(ms, pts[0][1]), 1e-3)
        return ms, "bound" if bound else "extrapolated"


def _best_kind(kinds: Iterable[str]) -> str:
    ks = set(kinds)
    for k in ("measured", "baseline", "bound"):
        if k in ks:
            return k
    return "baseline"


def _fit(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float]:
    if len(xs) < 2:
        return 0.0, (ys[0] if ys else 0.0)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return 0.0, my
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
    return slope, my - slope * mx


@dataclass
class AcceptPoint:
    budget: int
    accept: float
    source: str          # "this release" | "measured on this host (RELEASE)" | "profile reference" | ...


class AcceptCurve:
    """Accept length against budget from the points we have: measured on this host, the
    profile's reference (the drafter measured elsewhere), this release. Between budgets:
    linear in log2(budget) from (0, 1.0); above the largest: held at it (a larger tree can only
    add accepted paths, so at least that)."""

    def __init__(self, points: Sequence[AcceptPoint]):
        best: Dict[int, AcceptPoint] = {}
        rank = {"this release": 0}
        for p in points:
            if p.budget <= 0 or p.accept <= 0:
                continue
            cur = best.get(p.budget)
            # a host measurement beats the reference; this release's own beats both at its budget
            if cur is None or rank.get(p.source, 1 if "host" in p.source else 2) < \
                    rank.get(cur.source, 1 if "host" in cur.source else 2):
                best[p.budget] = p
        self.points = [best[b] for b in sorted(best)]
        # between the points: never below what a smaller tree reached (a larger tree only adds
        # accepted paths); this release's own value below that is a finding, not a curve point
        self.envelope: List[AcceptPoint] = []
        top = 0.0
        for p in self.points:
            if p.source == "this release" and p.accept < top:
                continue
            top = max(top, p.accept)
            self.envelope.append(AcceptPoint(p.budget, top, p.source))

    def at(self, budget: int) -> Tuple[Optional[float], str]:
        if budget <= 0:
            return 1.0, "autoregressive"
        for p in self.points:
            if p.budget == budget:
                return p.accept, p.source
        if not self.envelope:
            return None, "no accept length known"
        lo = [p for p in self.envelope if p.budget < budget]
        hi = [p for p in self.envelope if p.budget > budget]
        if not hi:
            return lo[-1].accept, f"at least budget {lo[-1].budget}'s {lo[-1].accept:.2f} ({lo[-1].source})"
        x = math.log2(budget)
        if lo:
            p0, p1 = lo[-1], hi[0]
            x0, y0 = math.log2(p0.budget), p0.accept
        else:
            p1 = hi[0]
            x0, y0 = -1.0, 1.0   # budget 0.5 ~ no tree: accept 1
        x1, y1 = math.log2(p1.budget), p1.accept
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0), "interpolated"

    def reference_for(self, budget: int) -> Tuple[Optional[float], str]:
        """What this drafter should reach at `budget`: the best of the points at that budget or a
        smaller one, other than this release (a larger tree only adds accepted paths)."""
        cands = [p for p in self.points if p.budget <= budget and p.source != "this release"]
        if not cands:
            return None, ""
        p = max(cands, key=lambda q: q.accept)
        where = "at this budget" if p.budget == budget else f"at budget {p.budget}"
        return p.accept, f"{p.accept:.2f} {where} ({p.source})"


def loss_parts(accept: float, step_ms: float, verify_ms: float, ar_step_ms: float,
               reference_accept: Optional[float]) -> Dict[str, float]:
    """The log-space parts of a level's shortfall (see the module doc); each >= 0."""
    verify = min(max(verify_ms, 1e-9), step_ms)
    return {"acceptance": max(0.0, math.log(reference_accept / accept)) if reference_accept and accept > 0 else 0.0,
            "verify_compute": max(0.0, math.log(verify / ar_step_ms)) if ar_step_ms > 0 else 0.0,
            "overhead": max(0.0, math.log(step_ms / verify))}


def shares(parts: Mapping[str, float]) -> Dict[str, float]:
    total = sum(v for v in parts.values() if v > 0)
    return {k: (v / total if total > 0 else 0.0) for k, v in parts.items()}


def _round(v: Optional[float], n: int = 3) -> Optional[float]:
    return None if v is None else round(float(v), n)


def analyse(candidate: Sequence[Side], baseline: Sequence[Side], *, budget: int, curve: AcceptCurve,
            step_parts: Sequence[StepParts] = (), other_baseline: Sequence[Side] = (),
            baseline_label: str = "baseline", other_label: str = "", budgets: Sequence[int] = DEFAULT_BUDGETS,
            max_budget: int = 64, notes: Sequence[str] = ()) -> Dict[str, Any]:
    """The diagnosis as JSON-ready data: per level the rates, step times, step ratio, break-even
    accept, verify estimate and remainder; the causes ranked by share of the loss; predictions
    per budget and level; the best budget per level."""
    width = budget + 1
    base = {s.concurrency: s for s in baseline}
    other = {s.concurrency: s for s in other_baseline}
    merged = merge_step_parts([sp for sp in step_parts if sp.budget == budget])
    points: List[Tuple[float, float, str]] = [(float(s.concurrency), s.step_ms, "baseline") for s in baseline]
    points += [(float(sp.bs * sp.width), sp.parts["target_ms"], "measured") for sp in merged.values()
               if sp.parts["target_ms"] > 0]
    good = [p for p in points if p[2] != "bound"]
    if len({p[0] for p in good}) < 2:
        points += [(float(s.concurrency * width), s.step_ms, "bound") for s in candidate]
    model = ForwardModel(points)
    out_notes = list(notes)
    levels = []
    loss_total: Dict[str, float] = {}
    evidence: Dict[str, List[str]] = {}
    weight_total = 0.0
    ref_accept, ref_text = curve.reference_for(budget)
    for s in sorted(candidate, key=lambda x: x.concurrency):
        c = s.concurrency
        b = base.get(c)
        ar_step, ar_source = (b.step_ms, "measured") if b else model.estimate(float(c))
        if ar_step is None:
            levels.append({"concurrency": c, "accept": _round(s.accept), "step_ms": _round(s.step_ms),
                           "note": "no baseline step at this level and nothing to estimate it from"})
            continue
        batch = s.running
        sp = merged.get((round(batch), budget)) or _nearest(merged, round(batch), budget)
        verify_ms, verify_source = model.estimate(batch * width)
        if verify_ms is None:
            verify_ms, verify_source = s.step_ms, "bound"
        if verify_source == "bound":
            verify_ms = min(verify_ms, s.step_ms)
        step_ratio = s.step_ms / ar_step
        speedup = s.accept / step_ratio
        judged = s.measured_speedup
        loses = (judged if judged is not None else speedup) < 1.0
        remainder = max(0.0, s.step_ms - verify_ms)
        row: Dict[str, Any] = {
            "concurrency": c, "accept": _round(s.accept), "step_ms": _round(s.step_ms),
            "ar_step_ms": _round(ar_step), "ar_step_source": ar_source, "step_source": s.source,
            "step_ratio": _round(step_ratio), "break_even_accept": _round(step_ratio),
            "verify_ms": _round(verify_ms), "verify_source": verify_source,
            "verify_tokens": _round(batch * width, 1), "running_batch": _round(batch, 2),
            "remainder_ms": _round(remainder),
            "speedup": _round(speedup), "measured_speedup": _round(judged),
            "tok_s": _round(s.tok_s, 1), "baseline_tok_s": _round(b.tok_s if b else None, 1),
            "decode_tok_s": _round(s.decode_tok_s, 1),
            "baseline_decode_tok_s": _round(c * 1000.0 / ar_step, 1),
            "loses": loses, "parts": None, "causes": []}
        if sp is not None:
            pm = dict(sp.parts)
            row["parts"] = {"bs": sp.bs, "sampled": sp.sampled, **{k: _round(v) for k, v in pm.items()},
                            "line_step_ms": _round(sp.step_ms),
                            "outside_ms": _round(max(0.0, s.step_ms - sp.step_ms))}
        if loses:
            parts = loss_parts(s.accept, s.step_ms, verify_ms, ar_step, ref_accept)
            o = other.get(c)
            if o is not None and b is not None and o.decode_tok_s > b.decode_tok_s:
                parts["parallelism"] = math.log(o.decode_tok_s / b.decode_tok_s)
            sh = shares(parts)
            ev = _evidence(row, s, sp, ref_accept, ref_text, budget, b, o, baseline_label, other_label)
            row["causes"] = [{"kind": k, "share": round(sh[k], 3), "evidence": ev[k]}
                             for k in sorted(sh, key=lambda k: -sh[k]) if sh[k] >= MIN_CAUSE_SHARE]
            w = -math.log(max(judged if judged is not None else speedup, 1e-9))
            weight_total += w
            for k, v in sh.items():
                loss_total[k] = loss_total.get(k, 0.0) + w * v
                if v >= MIN_CAUSE_SHARE:
                    evidence.setdefault(k, []).append(f"C={c}: {ev[k]}")
        levels.append(row)
    causes = []
    if weight_total > 0:
        for k in sorted(loss_total, key=lambda k: -loss_total[k]):
            share = loss_total[k] / weight_total
            if share >= MIN_CAUSE_SHARE:
                causes.append({"kind": k, "share": round(share, 3), "evidence": "; ".join(evidence.get(k, []))})
    if ref_accept is None:
        out_notes.append("no reference accept length for this drafter (a smaller budget measured on this host, "
                         "or the profile's reference_accept): acceptance is not ranked as a cause")
    predictions, best = _predict(levels, candidate, curve, model, budget, budgets, max_budget)
    return {"schema": SCHEMA, "budget": budget, "verify_width": width, "baseline": baseline_label,
            "reference_accept": _round(ref_accept), "reference": ref_text, "levels": levels, "causes": causes,
            "predictions": predictions, "best": {str(c): b for c, b in best.items()},
            "forward_model": {"points": [[t, _round(ms), k] for t, ms, k in model.points],
                              "ms_per_token": _round(model.slope, 5), "fixed_ms": _round(model.intercept)},
            "accept_curve": [asdict(p) for p in curve.points], "notes": out_notes}


def _nearest(merged: Mapping[Tuple[int, int], StepParts], c: int, budget: int) -> Optional[StepParts]:
    cands = [sp for (bs, b), sp in merged.items() if b == budget]
    if not cands:
        return None
    sp = min(cands, key=lambda q: (abs(q.bs - c), -q.sampled))
    return sp if abs(sp.bs - c) <= max(1, c // 4) else None


def _evidence(row: Mapping[str, Any], s: Side, sp: Optional[StepParts], ref_accept: Optional[float], ref_text: str,
              budget: int, b: Optional[Side], o: Optional[Side], baseline_label: str, other_label: str) -> Dict[str, str]:
    c = s.concurrency
    ev = {}
    acc = f"accept {s.accept:.2f} against a break-even of {row['break_even_accept']:.2f}"
    if ref_accept:
        acc += f"; this drafter reached {ref_text}"
        if ref_accept > s.accept and "at budget" in ref_text:
            acc += " and a larger tree can only add accepted paths"
    ev["acceptance"] = acc
    v, ar = row["verify_ms"], row["ar_step_ms"]
    verify = (f"verify forward {v:.1f} ms over {row['running_batch']:g} x {budget + 1} = {row['verify_tokens']:g} tokens "
              f"({row['verify_source']}) is {v / ar:.1f}x an autoregressive step ({ar:.1f} ms)")
    if v > s.accept * ar:
        verify += (f"; it alone exceeds accept x AR step ({s.accept:.2f} x {ar:.1f} = {s.accept * ar:.1f} ms): "
                   f"no tree of budget {budget} wins at C={c} below accept {v / ar:.2f}")
    ev["verify_compute"] = verify
    ovh = f"remainder {row['remainder_ms']:.1f} ms per step beyond the verify forward"
    if sp is not None:
        ovh += " (step line, bs %d: %s)" % (sp.bs, ", ".join(f"{PART_NAMES[k]} {sp.parts[k]:.2f}" for k in PART_KEYS
                                                         if k != "target_ms"))
    else:
        ovh += " (drafter + tree + host, estimated: no step line)"
    ev["overhead"] = ovh
    if o is not None and b is not None:
        ev["parallelism"] = (f"{other_label} runs {o.decode_tok_s:.0f} decode tok/s at C={c} against "
                             f"{baseline_label}'s {b.decode_tok_s:.0f}")
    else:
        ev["parallelism"] = ""
    return ev


def _predict(levels: Sequence[Mapping[str, Any]], candidate: Sequence[Side], curve: AcceptCurve, model: ForwardModel,
             budget: int, budgets: Sequence[int], max_budget: int) -> Tuple[List[Dict[str, Any]], Dict[int, int]]:
    """Decode tok/s per candidate budget (0: autoregressive) and level: accept from the curve,
    step = verify forward over C x (b + 1) tokens + this level's measured remainder."""
    out: List[Dict[str, Any]] = []
    best: Dict[int, int] = {}
    cand = {s.concurrency: s for s in candidate}
    bs = sorted({0, budget, *[b for b in budgets if 0 < b <= max_budget], *[p.budget for p in curve.points
                                                                           if p.budget <= max_budget]})
    for row in levels:
        if "step_ratio" not in row:
            continue
        c = row["concurrency"]
        s = cand[c]
        scored = []
        for b in bs:
            if b == 0:
                tok = c * 1000.0 / row["ar_step_ms"]
                acc, acc_src, step, how = 1.0, "autoregressive", row["ar_step_ms"], row["ar_step_source"]
            elif b == budget:
                acc, acc_src, step, how = s.accept, "this release", s.step_ms, "measured"
                tok = s.decode_tok_s
            else:
                acc, acc_src = curve.at(b)
                v, how = model.estimate(s.running * (b + 1))
                if acc is None or v is None:
                    continue
                step = v + row["remainder_ms"]
                tok = c * acc * 1000.0 / step
            out.append({"budget": b, "concurrency": c, "tok_s": round(tok, 1), "accept": _round(acc),
                        "accept_source": acc_src, "step_ms": _round(step), "step_source": how})
            scored.append((tok, -b, b))
        if scored:
            best[c] = max(scored)[2]
    return out, best


def headline(d: Mapping[str, Any]) -> str:
    """One line: the ranked causes (or that nothing lost), and the predicted best budget per level."""
    causes = d.get("causes") or []
    losing = [r for r in d.get("levels", []) if r.get("loses")]
    if not losing:
        head = "no level loses to the baseline"
    else:
        measured = [x for x in losing if x.get("ar_step_source") == "measured"] or losing
        r = min(measured, key=lambda x: x["measured_speedup"] if x.get("measured_speedup") is not None
                else x.get("speedup") or 1.0)
        head = (f"C={r['concurrency']}: accept {r['accept']:.2f} against a break-even of {r['break_even_accept']:.2f} "
                f"(step {r['step_ms']:.1f} ms vs {r['ar_step_ms']:.1f} ms autoregressive)")
        if causes:
            shares_text = ", ".join(f"{CAUSE_WORDS.get(c['kind'], c['kind'])} {c['share'] * 100:.0f} %" for c in causes)
            head += f"; the loss over {len(losing)} losing level(s): {shares_text}"
    best = d.get("best") or {}
    if best:
        preds = {(p["budget"], p["concurrency"]): p for p in d.get("predictions", [])}
        parts = []
        for c, b in sorted(((int(c), b) for c, b in best.items())):
            p = preds.get((b, c))
            tok = f" {p['tok_s']:.0f} tok/s" if p else ""
            parts.append(f"C={c}: {'autoregressive' if b == 0 else f'budget {b}'}{tok}")
        head += "; predicted best: " + ", ".join(parts)
    return head


def window_line(accept: Optional[float], decode_tok_s: Optional[float], running: Optional[float],
                baseline_tok_s: Optional[float]) -> Optional[str]:
    """The watch's trip notice: from a window's accept length, decode throughput and running
    batch against the baseline's throughput at that concurrency, the step ratio and the accept
    it would need to break even."""
    if not accept or not decode_tok_s or not running or not baseline_tok_s:
        return None
    step = running * accept * 1000.0 / decode_tok_s
    ar_step = running * 1000.0 / baseline_tok_s
    ratio = step / ar_step
    return (f"why: accept {accept:.2f} against a break-even of {ratio:.2f} at running batch {running:.0f} "
            f"(step {step:.1f} ms vs {ar_step:.1f} ms autoregressive); `opsctl diagnose` splits it into "
            f"acceptance, verify compute and overhead")
