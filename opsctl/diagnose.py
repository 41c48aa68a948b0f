"""`opsctl diagnose`: why a speculative release lost to the autoregressive baseline and what
would win (issue #48), from what an operator has: a release's stored bench and journal on the
host, two bench files (any format `opsctl bench import` reads), or journal excerpts.

This module turns those inputs into per-level decode measurements (`Side`s) and accept-length
points; the arithmetic is opsctl/onhost/diagnosis.py (shared with the watch agent on the host).

A side's decode step, best source first:
  requests   the bench's request samples: (e2e - ttft) / verify rounds (autoregressive: / (tokens - 1)),
             accept = (tokens - 1) / rounds: decode only, prefill and queueing left out
  tpot       bench_serving's mean TPOT: step = TPOT x accept
  aggregate  C x accept / output tok/s (prefill included)
  journal    SGLang's `Decode batch` lines: #running-req x accept len / gen throughput
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from opsctl.errors import ConfigError
from opsctl.onhost import diagnosis as dg

AR_KINDS = ("autoregressive",)


def sides_from_run(run, *, baseline=None) -> list[dg.Side]:
    """One Side per concurrency level of a BenchRun (median over repeats); with `baseline`, the
    gate's judged speedup (ratio of mean per-request tok/s) at each level as measured_speedup."""
    from opsctl.gate import interval as cf

    out = []
    for c in run.concurrencies():
        levels = run.at(c)
        samples = cf.samples_of(levels)
        side = _from_samples(c, samples) or _from_level(c, run.median().at(c)[0] if levels else None)
        if side is None:
            continue
        side.tok_s = statistics.median([lv.output_throughput for lv in levels]) if levels else None
        eff = [lv.concurrency for lv in levels if "concurrency" not in lv.missing and lv.concurrency > 0]
        side.batch = statistics.median(eff) if eff else None  # bench_serving's effective concurrency
        if baseline is not None:
            side.measured_speedup = _judged_speedup(samples, cf.samples_of(baseline.at(c)), side.tok_s,
                                                    baseline.at(c))
        out.append(side)
    return out


def _from_samples(c: int, samples) -> dg.Side | None:
    ok = [s for s in samples if s.ok and s.e2e_s > 0 and s.output_tokens > 1]
    if not ok:
        return None
    decode_s = sum(max(s.e2e_s - s.ttft_s, 0.0) for s in ok)
    spec = [s for s in ok if s.verify_rounds > 0]
    if spec and len(spec) == len(ok):
        rounds = sum(s.verify_rounds for s in ok)
        accept = sum(s.output_tokens - 1 for s in ok) / rounds
        return dg.Side(c, decode_s * 1000.0 / rounds, accept, "requests")
    steps = sum(s.output_tokens - 1 for s in ok)
    return dg.Side(c, decode_s * 1000.0 / steps, 1.0, "requests")


def _from_level(c: int, lv) -> dg.Side | None:
    if lv is None:
        return None
    accept = lv.accept or 1.0
    tpot = lv.value("mean_tpot_ms")
    if tpot:
        return dg.Side(c, float(tpot) * accept, accept, "tpot")
    tput = lv.value("output_throughput")
    if tput:
        return dg.Side(c, c * accept * 1000.0 / float(tput), accept, "aggregate")
    return None


def _judged_speedup(cand, base, tok_s, base_levels) -> float | None:
    from opsctl.gate import interval as cf

    cr, br = cf.rates(cand), cf.rates(base)
    if cr and br:
        return (sum(cr) / len(cr)) / (sum(br) / len(br))
    btok = statistics.median([lv.output_throughput for lv in base_levels]) if base_levels else None
    return tok_s / btok if tok_s and btok else None


def sides_from_journal(parsed) -> list[dg.Side]:
    """Levels from SGLang's decode lines (TP0, or unlabelled): grouped by #running-req."""
    groups: dict[int, list[tuple[float, float]]] = {}
    for d in parsed.decodes:
        if d.line.tp_rank not in (None, 0) or not d.running_reqs or not d.gen_throughput:
            continue
        acc = d.accept_len or 1.0
        groups.setdefault(d.running_reqs, []).append((d.running_reqs * acc * 1000.0 / d.gen_throughput, acc))
    out = []
    for c, vals in sorted(groups.items()):
        out.append(dg.Side(c, statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals), "journal",
                           tok_s=statistics.median(c * v[1] * 1000.0 / v[0] for v in vals)))
    return out


def server_facts(parsed) -> dict[str, Any]:
    """budget / parallelism from the journal's server_args line (DDTree: num_draft_tokens - 1)."""
    sa = parsed.latest_server_args
    return _facts(sa.args) if sa is not None else {}


def _facts(args: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"algorithm": args.get("speculative_algorithm")}
    n = args.get("speculative_num_draft_tokens")
    if out["algorithm"] == "DDTREE" and isinstance(n, int):
        out["budget"] = n - 1
    if isinstance(args.get("ep_size"), int):
        out["parallel"] = "ep" if args["ep_size"] > 1 else "tp"
    return out


def ddtree_start(parsed, budget: int | None = None):
    """The journal from the last DDTree server_args line (at `budget` when known) to the next
    server_args line: a saved journal often runs on past the release, into the rollback's
    autoregressive start."""
    import dataclasses

    def facts_of(sa) -> dict[str, Any]:
        return _facts(sa.args)

    pick = [sa for sa in parsed.server_args if facts_of(sa).get("algorithm") == "DDTREE"
            and (budget is None or facts_of(sa).get("budget") in (None, budget))]
    if not pick:
        return parsed
    sa = pick[-1]
    lo = sa.line.line_no
    later = [x.line.line_no for x in parsed.server_args if x.line.line_no > lo]
    hi = min(later) if later else float("inf")
    inside = lambda n: lo <= n < hi  # noqa: E731
    return dataclasses.replace(parsed, lines=[x for x in parsed.lines if inside(x.line_no)],
                               decodes=[d for d in parsed.decodes if inside(d.line.line_no)], server_args=[sa])


class Input:
    """One side of a diagnosis read from a file: a bench run, or a journal."""

    def __init__(self, path: Path, run=None, journal=None):
        self.path, self.run, self.journal = path, run, journal

    @property
    def meta(self) -> dict:
        return dict(self.run.meta) if self.run is not None else {}


def load_input(path: str | Path) -> Input:
    """A bench file (the formats `opsctl bench import` takes) or a journal (text, `-o json`,
    pasted excerpts with decode or step lines), told apart by what parses."""
    from opsctl.gate.results import import_results

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file", "pass a bench results file (.jsonl, bench_serving output) or a "
                          "saved journal, or a release id from 'opsctl history' with an inventory")
    for reader in (_own_jsonl, import_results):   # opsctl's own file keeps its metadata (release, budget)
        try:
            run = reader(path)
        except (ConfigError, ValueError, OSError):
            continue
        if run is not None and run.levels:
            return Input(path, run=run)
    from opsctl import journal

    parsed = journal.load_file(path)
    if parsed.decodes or dg.parse_step_parts(line.text for line in parsed.lines):
        return Input(path, journal=parsed)
    raise ConfigError(f"{path}: neither bench results nor SGLang decode lines (`Decode batch, ...`) nor the "
                      "runtime's `DDTree step parts:` lines", "pass the release's bench (.jsonl, bench_serving "
                      "output) or its journal (journalctl -u UNIT > FILE)")


def _own_jsonl(path: Path):
    """A run file opsctl wrote (a `{"record": "meta"}` first line), read with its metadata."""
    from opsctl.gate.results import read_jsonl

    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    return read_jsonl(path) if first.startswith('{"record": "meta"') else None


def budget_from_meta(meta: Mapping[str, Any]) -> int | None:
    b = meta.get("budget")
    if isinstance(b, int):
        return b
    label = str(meta.get("profile") or "")
    if "--budget " in label:
        try:
            return int(label.split("--budget ", 1)[1].split()[0])
        except ValueError:
            return None
    return None


def history_points(ledger: Iterable[Mapping[str, Any]], exclude: str | None = None) -> list[dg.AcceptPoint]:
    """Accept lengths this host measured: every judged single-budget ddtree release's levels (the
    ledger's verdict records), the best level per release."""
    out = []
    for rec in ledger:
        if rec.get("action") != "verdict" or not isinstance(rec.get("budget"), int) or rec.get("release") == exclude:
            continue
        accs = [r.get("accept_length") for r in rec.get("rows") or [] if isinstance(r.get("accept_length"), (int, float))]
        if accs:
            out.append(dg.AcceptPoint(rec["budget"], float(max(accs)), f"measured on this host ({rec.get('release')})"))
    return out


def reference_points(reference: Mapping[int, float] | None) -> list[dg.AcceptPoint]:
    return [dg.AcceptPoint(int(b), float(a), "profile reference") for b, a in sorted((reference or {}).items())]


def parse_reference(text: str | None) -> dict[int, float]:
    """`8:4.48,16:5.3` -> {8: 4.48, 16: 5.3}."""
    if not text:
        return {}
    out = {}
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            b, a = part.split(":")
            out[int(b)] = float(a)
        except ValueError:
            raise ConfigError(f"--reference-accept wants BUDGET:ACCEPT pairs, got {part!r}",
                              "e.g. --reference-accept 8:4.48,16:5.3") from None
        if out[int(b)] < 1 or int(b) < 1:
            raise ConfigError(f"--reference-accept {part!r}: a budget is >= 1 and an accept length >= 1",
                              "e.g. --reference-accept 8:4.48,16:5.3")
    return out


def diagnose(candidate: Sequence[dg.Side], baseline: Sequence[dg.Side], *, budget: int,
             this_accept: float | None = None, reference: Mapping[int, float] | None = None,
             history: Sequence[dg.AcceptPoint] = (), step_parts: Sequence[dg.StepParts] = (),
             other_baseline: Sequence[dg.Side] = (), baseline_label: str = "baseline", other_label: str = "",
             max_budget: int = 64, capture_bs: Sequence[int] | None = None, notes: Sequence[str] = (),
             source: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The diagnosis (opsctl.onhost.diagnosis.analyse) with the schedule the predicted best
    budgets make (`opsctl tune`'s schedule rule) and what it rests on."""
    from opsctl.schedule import schedule_from_best

    if budget is None or budget < 1:
        raise ConfigError("the release's DDTree budget is not known from its files",
                          "pass --budget N (the budget the release served)")
    if not candidate:
        raise ConfigError("no candidate measurement to diagnose (no bench level, no decode line)",
                          "pass the release's bench results or its journal")
    if not baseline and not other_baseline:
        raise ConfigError("no baseline measurement to compare with",
                          "pass --baseline FILE (the autoregressive baseline's bench or journal), or diagnose a "
                          "release on a host that stores its baseline")
    accept = this_accept if this_accept is not None else statistics.median(s.accept for s in candidate)
    curve = dg.AcceptCurve([*reference_points(reference), *history, dg.AcceptPoint(budget, accept, "this release")])
    d = dg.analyse(candidate, baseline, budget=budget, curve=curve, step_parts=step_parts,
                   other_baseline=other_baseline, baseline_label=baseline_label, other_label=other_label,
                   max_budget=max_budget, notes=notes)
    best = {int(c): b for c, b in d["best"].items()}
    d["schedule"] = schedule_from_best(best, capture_bs) if best and any(best.values()) else None
    d["source"] = dict(source or {})
    d["headline"] = dg.headline(d)
    return d


def from_runs(run, base, *, budget: int | None = None, reference: Mapping[int, float] | None = None,
              history: Sequence[dg.AcceptPoint] = (), journal=None, other=None, other_label: str = "",
              max_budget: int = 64, capture_bs: Sequence[int] | None = None,
              source: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A diagnosis from a candidate BenchRun (or journal-only levels) against a baseline BenchRun,
    with the candidate's journal (step lines) when there is one."""
    notes = []
    parts: list[dg.StepParts] = []
    facts: dict[str, Any] = {}
    if journal is not None:
        journal = ddtree_start(journal, budget or (budget_from_meta(run.meta) if run is not None else None))
        parts = dg.parse_step_parts(line.text for line in journal.lines)
        facts = server_facts(journal)
    budget = budget or (budget_from_meta(run.meta) if run is not None else None) or facts.get("budget")
    cand = sides_from_run(run, baseline=base) if run is not None else sides_from_journal(journal)
    if base is None:
        base_sides: list[dg.Side] = []
    elif isinstance(base, list):
        base_sides = base
    else:
        base_sides = sides_from_run(base)
    if not parts:
        notes.append("no `DDTree step parts:` line: the verify forward is estimated from the baseline's steps and "
                     "the remainder is drafter + tree + host together")
    other_sides = sides_from_run(other) if other is not None else []
    label = str((base.meta.get("profile") if base is not None and not isinstance(base, list) else None) or "baseline")
    return diagnose(cand, base_sides, budget=budget, reference=reference, history=history, step_parts=parts,
                    other_baseline=other_sides, baseline_label=label, other_label=other_label,
                    max_budget=max_budget, capture_bs=capture_bs, notes=notes, source=source)


def reason_line(d: Mapping[str, Any]) -> str:
    """The failed gate's one line: `why: ...` (the causes and the predicted best)."""
    return "why: " + dg.headline(d) + " (opsctl diagnose RELEASE for the numbers)"


def text_lines(d: Mapping[str, Any]) -> list[str]:
    """The diagnosis for people: a table per level, the causes with evidence, the predictions."""
    out = [f"DDTree budget {d['budget']} (verify width {d['verify_width']}) against {d['baseline']}"]
    cols = ["C", "accept", "step ms", "AR step ms", "ratio", "break-even", "verify ms", "rest ms", "speedup"]
    rows = []
    for r in d["levels"]:
        if "step_ratio" not in r:
            rows.append([str(r["concurrency"]), _f(r.get("accept"), "%.2f"), _f(r.get("step_ms"), "%.1f")] +
                        ["-"] * 6)
            continue
        sp = r["measured_speedup"] if r["measured_speedup"] is not None else r["speedup"]
        rows.append([str(r["concurrency"]), _f(r["accept"], "%.2f"), _f(r["step_ms"], "%.1f"),
                     _f(r["ar_step_ms"], "%.1f"), _f(r["step_ratio"], "%.2f"), _f(r["break_even_accept"], "%.2f"),
                     _f(r["verify_ms"], "%.1f") + _mark(r["verify_source"]), _f(r["remainder_ms"], "%.1f"),
                     _f(sp, "%.2fx")])
    widths = [max(len(c), *(len(x[i]) for x in rows)) if rows else len(c) for i, c in enumerate(cols)]
    out.append("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    out += ["  ".join(v.rjust(w) for v, w in zip(x, widths)) for x in rows]
    out.append("step: one decode step (ms); ratio: step / AR step = the accept needed to break even; verify: the "
               "target's forward over C x (budget + 1) tokens (m measured by the step line, i interpolated, "
               "e extrapolated, b bounded by the whole step); rest: drafter + tree + host; speedup: what the gate "
               "judged where measured, else accept / ratio")
    for r in d["levels"]:
        if r.get("parts"):
            p = r["parts"]
            out.append(f"C={r['concurrency']} step line (bs {p['bs']}, {p['sampled']} sampled steps): " + ", ".join(
                f"{dg.PART_NAMES[k]} {p[k]:.2f} ms" for k in dg.PART_KEYS) + f", outside the worker {p['outside_ms']:.2f} ms")
    if d["causes"]:
        out.append("causes, by share of the loss:")
        for c in d["causes"]:
            out.append(f"  {dg.CAUSE_WORDS.get(c['kind'], c['kind'])} {c['share'] * 100:.0f} %: {c['evidence']}")
    else:
        out.append("no level loses to the baseline: nothing to explain")
    preds = d["predictions"]
    if preds:
        levels = sorted({p["concurrency"] for p in preds})
        budgets = sorted({p["budget"] for p in preds})
        tab = {(p["budget"], p["concurrency"]): p for p in preds}
        out.append("predicted decode tok/s (a prediction from the accept curve and the step model; "
                   "`opsctl tune` measures it):")
        head = ["budget"] + [f"C={c}" for c in levels]
        body = []
        for b in budgets:
            cells = ["0 (AR)" if b == 0 else str(b) + (" (this)" if b == d["budget"] else "")]
            for c in levels:
                p = tab.get((b, c))
                star = "*" if d["best"].get(str(c)) == b else ""
                cells.append("-" if p is None else f"{p['tok_s']:.0f}{star}")
            body.append(cells)
        w = [max(len(h), *(len(x[i]) for x in body)) for i, h in enumerate(head)]
        out.append("  ".join(h.rjust(x) for h, x in zip(head, w)))
        out += ["  ".join(v.rjust(x) for v, x in zip(row, w)) for row in body]
        srcs = sorted({f"budget {p['budget']}: accept {p['accept']:.2f} ({p['accept_source']})" for p in preds
                       if p["budget"] not in (0, d["budget"]) and p["accept"] is not None})
        out.append("* best at that level; accept per budget: " + "; ".join(srcs))
    if d.get("schedule"):
        out.append(f"the schedule that follows: --budget-schedule {d['schedule']} (check it with "
                   f"'opsctl tune ddtree --budgets {','.join(str(b) for b in sorted(set(d['best'].values())) if b)}')")
    for n in d.get("notes") or []:
        out.append(f"note: {n}")
    return out


def _f(v, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt % v


def _mark(source: str) -> str:
    return {"measured": " m", "interpolated": " i", "extrapolated": " e", "bound": " b"}.get(source, "")


def recorded_predictions(ledger: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The newest DDTree verdict's diagnosis on a host's ledger (its predictions per budget and
    level), which `opsctl tune` checks against what it measures; None when there is none."""
    for rec in reversed(list(ledger)):
        d = rec.get("diagnosis")
        if rec.get("action") == "verdict" and isinstance(d, dict) and d.get("predictions"):
            return {"release": rec.get("release"), "ts": rec.get("ts"), "predictions": d["predictions"],
                    "best": d.get("best"), "schedule": d.get("schedule")}
    return None
