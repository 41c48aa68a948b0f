"""Bench reports: a PNG plot (output tok/s and ITL p50 vs concurrency, release
against baseline, log-2 x axis), a Markdown and an HTML summary with the
verdict and the per-level table, and `compare(a, b)` per-level deltas."""
from __future__ import annotations

import html as _html
from pathlib import Path

from pydantic import BaseModel

from opsctl.gate.results import BenchRun
from opsctl.gate.decide import Verdict

PLOT_SIZE_IN = (15.0, 4.0)
PLOT_DPI = 100
PLOT_PIXELS = (int(PLOT_SIZE_IN[0] * PLOT_DPI), int(PLOT_SIZE_IN[1] * PLOT_DPI))  # (width, height)


class LevelDelta(BaseModel):
    concurrency: int
    a_tok_s: float | None
    b_tok_s: float | None
    tok_s_delta_pct: float | None
    a_itl_p50_ms: float | None
    b_itl_p50_ms: float | None
    itl_delta_pct: float | None
    a_ttft_p50_ms: float | None
    b_ttft_p50_ms: float | None
    a_accept: float | None
    b_accept: float | None
    a_errors: int | None = None  # None: that side has no result at this level ('-', not 0)
    b_errors: int | None = None
    a_lacks: list[str] = []     # fields A's (imported) result lacks: shown as missing, never 0
    b_lacks: list[str] = []

    @property
    def label(self) -> str:
        return "?" if self.concurrency == 0 else str(self.concurrency)


# LevelDelta column -> (side, BenchLevel field); a delta lacks what either side lacks
_DELTA_FIELDS = {"a_tok_s": ("a", "output_throughput"), "b_tok_s": ("b", "output_throughput"),
                 "a_itl_p50_ms": ("a", "median_itl_ms"), "b_itl_p50_ms": ("b", "median_itl_ms"),
                 "a_ttft_p50_ms": ("a", "median_ttft_ms"), "b_ttft_p50_ms": ("b", "median_ttft_ms"),
                 "tok_s_delta_pct": ("ab", "output_throughput"), "itl_delta_pct": ("ab", "median_itl_ms"),
                 "a_errors": ("a", "errors"), "b_errors": ("b", "errors")}


def delta_cell(d: LevelDelta, column: str, fmt: str) -> str:
    """A compare cell: 'missing' when a side's result lacks the field, '-' when the level is absent."""
    sides, name = _DELTA_FIELDS.get(column, ("", ""))
    if any(name in getattr(d, f"{side}_lacks") for side in sides):
        return "missing"
    v = getattr(d, column)
    return "-" if v is None else fmt % v


def level_label(lv) -> str:
    """The concurrency column: '?' for an imported result that shows no concurrency."""
    return "?" if lv.level == 0 else str(lv.level)


def lacking_for_verdict(run: BenchRun, base: BenchRun | None) -> str | None:
    """What the gate needs and an imported result lacks ('A C=8 lacks median_itl_ms'), or None."""
    for name, r in (("the run", run), ("the baseline", base)):
        if r is None:
            continue
        for lv in r.levels:
            need = [f for f in ("output_throughput", "median_itl_ms") if f in lv.missing]
            if lv.level == 0:
                need.append("concurrency")
            if need:
                return f"{name} at C={level_label(lv)} (line {lv.source_line}) lacks {', '.join(need)}"
    return None


def _pct(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return (new / old - 1.0) * 100.0


def compare(a: BenchRun, b: BenchRun) -> list[LevelDelta]:
    """Per-level deltas of B relative to A (A is the reference, e.g. the baseline),
    on the medians over repeats; levels present in either run."""
    am = {lv.level: lv for lv in a.median().levels}
    bm = {lv.level: lv for lv in b.median().levels}
    out = []
    for c in sorted(set(am) | set(bm)):
        x, y = am.get(c), bm.get(c)

        def v(lv, name):
            return lv.value(name) if lv is not None else None
        out.append(LevelDelta(
            concurrency=c,
            a_tok_s=v(x, "output_throughput"), b_tok_s=v(y, "output_throughput"),
            tok_s_delta_pct=_pct(v(y, "output_throughput"), v(x, "output_throughput")),
            a_itl_p50_ms=v(x, "median_itl_ms"), b_itl_p50_ms=v(y, "median_itl_ms"),
            itl_delta_pct=_pct(v(y, "median_itl_ms"), v(x, "median_itl_ms")),
            a_ttft_p50_ms=v(x, "median_ttft_ms"), b_ttft_p50_ms=v(y, "median_ttft_ms"),
            a_accept=x.accept if x else None, b_accept=y.accept if y else None,
            a_errors=x.errors if x else None, b_errors=y.errors if y else None,
            a_lacks=list(x.missing) if x else [], b_lacks=list(y.missing) if y else []))
    return out


def _label(run: BenchRun, default: str) -> str:
    m = run.meta
    source = Path(str(m["source"])).name if m.get("source") else None  # a results file: its name
    return str(m.get("release") or m.get("profile") or m.get("label") or source or default)


def report_title(run: BenchRun, baseline: BenchRun | None = None, verdict: Verdict | None = None) -> str:
    """The report's title, the same on the PNG, the Markdown and the HTML (issue #49: a report
    from a results file had none): what was measured, against which baseline, and the verdict
    when there is one."""
    title = _label(run, "release")
    if baseline is not None:
        title += f" vs {_label(baseline, 'baseline')}"
    if verdict is not None:
        title += f": {verdict.status.upper()}"
    return title


def gate_limits(verdict: Verdict, baseline: BenchRun) -> list[tuple[int, float, str]]:
    """(level, tok/s, words) of the throughput each level of the baseline must reach, by the
    level's own rule as the gate judged it: baseline x (1 + min_speedup) at the speedup level
    (C=1 needs +5 %), baseline x (1 - max_regression) elsewhere (issue #49: the plot drew
    "baseline -15 %" at C=1 too)."""
    if not verdict.policy and not verdict.analysis:
        return []
    thr = verdict.spec().throughput      # the thresholds the gate judged by, from its analysis spec
    out = []
    for lv in baseline.median().levels:
        if lv.level <= 0:
            continue
        need = thr.threshold_at(lv.level)   # the ratio the level's rule held it to (analysis.judge_throughput)
        out.append((lv.level, lv.output_throughput * need, f"{(need - 1) * 100:+.0f} %"))
    return out


# --------------------------------------------------------------------------- PNG
def plot_png(run: BenchRun, path: str | Path, baseline: BenchRun | None = None, *, title: str | None = None,
             verdict: Verdict | None = None) -> Path:
    """Write the plot (tok/s, ITL p50 and accept length vs concurrency; with a verdict, the
    gate's limits drawn in: the baseline x (1 - max regression) and the accept-length floor,
    so a reader sees why a level passed). Its size is exactly PLOT_PIXELS (width, height)."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=PLOT_SIZE_IN, dpi=PLOT_DPI)
    ax_tok, ax_itl, ax_acc = fig.subplots(1, 3)
    series = [(run.median(), _label(run, "release"), "tab:blue", "o-")]
    if baseline is not None:
        series.append((baseline.median(), _label(baseline, "baseline") + " (baseline)", "tab:gray", "s--"))
    levels: set[int] = set()
    any_accept = False
    for r, label, color, style in series:
        known = [lv for lv in r.levels if lv.level > 0]
        levels.update(lv.level for lv in known)
        for ax, name in ((ax_tok, "output_throughput"), (ax_itl, "median_itl_ms")):
            pts = [(lv.level, lv.value(name)) for lv in known if lv.value(name) is not None]  # lacking: no point
            ax.plot([a for a, _ in pts], [b for _, b in pts], style, color=color, label=label)
        acc = [(lv.level, lv.accept) for lv in known if lv.accept is not None]
        if acc:
            any_accept = True
            ax_acc.plot([a for a, _ in acc], [b for _, b in acc], style, color=color, label=label)
            for x, y in acc:
                # on an opaque box above every line: the per-workload lines pass through these points
                ax_acc.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 7), fontsize=7,
                                ha="center", va="bottom", color=color, zorder=5,
                                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none",
                                      "alpha": 0.9})
    for name, pts in per_workload_accept(run).items():
        any_accept = True
        ax_acc.plot([c for c, _ in pts], [a for _, a in pts], ":", marker=".", label=f"{name} (release)")
    limits = gate_limits(verdict, baseline) if verdict is not None and baseline is not None else []
    if limits:
        words = sorted({w for _, _, w in limits}, key=lambda w: -float(w.split()[0]))
        ax_tok.plot([c for c, _, _ in limits], [t for _, t, _ in limits], ":", marker="_", color="tab:red",
                    label="gate limit: baseline " + ", ".join(
                        f"{w} at C={','.join(str(c) for c, _, x in limits if x == w)}" for w in words))
    floor = None
    if verdict is not None and (verdict.policy or verdict.analysis):
        floor = verdict.spec().accept_length.floor   # the spec's floor (a profile's own one included)
        if floor is not None:
            ax_acc.axhline(float(floor), linestyle=":", color="tab:red",
                           label=f"gate floor {float(floor):.2f} ({verdict.profile_kind})")
    if not any_accept and floor is None:
        ax_acc.text(0.5, 0.5, "no accept length reported\n(autoregressive, or no --enable-metrics)",
                    ha="center", va="center", transform=ax_acc.transAxes, fontsize=9, color="0.4")
    ticks = sorted(levels) or [1]
    for ax, ylabel in ((ax_tok, "output tokens/s"), (ax_itl, "ITL p50 (ms)"), (ax_acc, "accept length (tokens/step)")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax_tok.set_title("output throughput")
    ax_itl.set_title("inter-token latency (p50)")
    ax_acc.set_title("accept length per level")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(p, format="png", dpi=PLOT_DPI)
    return p


def per_workload_accept(run: BenchRun) -> dict[str, list[tuple[int, float]]]:
    """{workload: [(level, accept length), ...]} from the run's request samples."""
    from opsctl.gate import interval as cf

    out: dict[str, list[tuple[int, float]]] = {}
    for c in run.concurrencies():
        samples = cf.samples_of(run.at(c))
        for name in sorted({s.workload for s in samples if s.workload}):
            acc = cf.accept_length(samples, name)
            if acc is not None:
                out.setdefault(name, []).append((c, acc))
    return out


def workload_rows(run: BenchRun, baseline: BenchRun | None, verdict: Verdict | None) -> list[list[str]]:
    """Per level and workload: requests, mean request tok/s, speedup with its interval, accept
    length against the baseline's: where a release wins and where it loses."""
    from opsctl.gate import interval as cf

    rows = []
    by_level = {r.concurrency: r for r in (verdict.rows if verdict else [])}
    for c in run.concurrencies():
        cs = cf.samples_of(run.at(c))
        bs = cf.samples_of(baseline.at(c)) if baseline is not None else []
        for name in sorted({s.workload for s in cs if s.workload}):
            rc = cf.rates(cs, name)
            w = by_level.get(c).workloads.get(name, {}) if c in by_level else {}
            iv = cf.speedup_interval(rc, cf.rates(bs, name)) if bs else None
            rows.append([str(c), name, str(len(rc)), _fmt(sum(rc) / len(rc) if rc else None, "%.1f"),
                         iv.pct() if iv else "-", _fmt(cf.accept_length(cs, name), "%.2f"),
                         _baseline_accept(baseline, bs, name), str(w.get("status", "-"))])
    return rows


def _baseline_accept(baseline: BenchRun | None, samples: list, workload: str) -> str:
    """The baseline's accept length for a workload's row: an autoregressive baseline reports none
    (no drafts to accept) but emits one token per forward step, and says so instead of "-"."""
    from opsctl.gate import interval as cf

    if baseline is None or not samples:
        return "no baseline"
    acc = cf.accept_length(samples, workload)
    if acc is not None:
        return f"{acc:.2f}"
    if baseline.meta.get("kind") == "autoregressive" and any(s.ok and s.workload == workload for s in samples):
        return "1 (AR)"
    return "not reported"


WORKLOAD_HEAD = ["C", "workload", "requests", "request tok/s", "speedup (CI)", "accept len", "baseline accept",
                 "judged"]


# --------------------------------------------------------------------------- Markdown / HTML
def _fmt(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt % v


def _table_rows(run: BenchRun, baseline: BenchRun | None, verdict: Verdict | None) -> tuple[list[str], list[list[str]]]:
    if verdict is not None and verdict.rows:
        head = ["C", "baseline tok/s", "release tok/s", "delta", "baseline ITL p50", "release ITL p50",
                "accept len", "errors", "status"]
        rows = [[str(r.concurrency), _fmt(r.baseline_tok_s, "%.1f"), _fmt(r.candidate_tok_s, "%.1f"),
                 _fmt(r.delta_pct, "%+.1f%%"), _fmt(r.baseline_itl_p50_ms, "%.2f ms"),
                 _fmt(r.candidate_itl_p50_ms, "%.2f ms"), _fmt(r.accept_length, "%.2f"), str(r.errors), r.why or r.status]
                for r in verdict.rows]
        return head, rows
    if baseline is not None:
        head = ["C", "baseline tok/s", "release tok/s", "delta", "baseline ITL p50", "release ITL p50",
                "accept len", "errors"]
        rows = [[d.label, delta_cell(d, "a_tok_s", "%.1f"), delta_cell(d, "b_tok_s", "%.1f"),
                 delta_cell(d, "tok_s_delta_pct", "%+.1f%%"), delta_cell(d, "a_itl_p50_ms", "%.2f ms"),
                 delta_cell(d, "b_itl_p50_ms", "%.2f ms"), _fmt(d.b_accept, "%.2f"), delta_cell(d, "b_errors", "%d")]
                for d in compare(baseline, run)]
        return head, rows
    head = ["C", "tok/s", "req/s", "TTFT p50", "ITL p50", "E2E p50", "accept len", "errors", "repeats"]
    def cell(lv, name: str, fmt: str) -> str:
        v = lv.value(name)
        return "missing" if v is None else fmt % v
    rows = [[level_label(lv), cell(lv, "output_throughput", "%.1f"), cell(lv, "request_throughput", "%.2f"),
             cell(lv, "median_ttft_ms", "%.1f ms"), cell(lv, "median_itl_ms", "%.2f ms"),
             cell(lv, "median_e2e_latency_ms", "%.1f ms"), _fmt(lv.accept, "%.2f"),
             cell(lv, "errors", "%d"), str(lv.repeats_merged)] for lv in run.median().levels]
    return head, rows


def start_lines(start: dict | None) -> list[str]:
    """The release's last start (opsctl.startup.last_start): when and why, then the start-up block
    a deploy prints (every phase at the site's scale, the lab's line, the comparison)."""
    if not start:
        return []
    from opsctl import startup

    return [f"Last start: {start.get('ts') or '?'} ({start.get('why') or '?'})", *startup.describe(start)]


def why_lines(diagnosis: dict | None) -> list[str]:
    """The "Why" section: `opsctl diagnose`'s text (opsctl/diagnose.py) for a DDTree release."""
    if not diagnosis:
        return []
    from opsctl.diagnose import text_lines

    return text_lines(diagnosis)


def markdown(run: BenchRun, baseline: BenchRun | None = None, verdict: Verdict | None = None,
             *, plot_name: str | None = None, start: dict | None = None, diagnosis: dict | None = None) -> str:
    lines = [f"# Bench report: {report_title(run, baseline, verdict)}", ""]
    if baseline is not None:
        lines += [f"Baseline: {_label(baseline, 'baseline')}", ""]
    else:
        lines += ["Baseline: none given, so no verdict (pass --baseline FILE to compare and judge)", ""]
    if verdict is not None:
        lines += [f"**Verdict: {verdict.status.upper()}** ({verdict.profile_kind})", ""]
        lines += [f"- {r}" for r in verdict.reasons]
        lines += [f"- note: {n}" for n in verdict.notes]
        if verdict.reasons or verdict.notes:
            lines.append("")
    head, rows = _table_rows(run, baseline, verdict)
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(" --- " for _ in head) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    wrows = workload_rows(run, baseline, verdict)
    if wrows:
        lines += ["", "Per workload (where the release wins and where it loses):", "",
                  "| " + " | ".join(WORKLOAD_HEAD) + " |", "|" + "|".join(" --- " for _ in WORKLOAD_HEAD) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in wrows]
    if run.canary is not None:
        c = run.canary
        lines.append("")
        if c.error:
            lines.append(f"Canary: error: {c.error}")
        elif c.mismatch:
            lines.append(f"Canary: MISMATCH at prompt {c.mismatch['prompt']}, token {c.mismatch['position']}")
        else:
            lines.append(f"Canary: {len(c.prompts)} prompts" + (", identical to the baseline" if c.compared
                                                                else ", not compared with a baseline"))
    why = why_lines(diagnosis)
    if why:
        lines += ["", "## Why", "", "```", *why, "```"]
    sl = start_lines(start)
    if sl:
        lines += ["", "## Start-up", "", sl[0], "", *[f"- {x.strip()}" for x in sl[1:]]]
    if plot_name:
        lines += ["", f"![throughput and ITL vs concurrency]({plot_name})"]
    return "\n".join(lines) + "\n"


def html(run: BenchRun, baseline: BenchRun | None = None, verdict: Verdict | None = None,
         *, plot_name: str | None = None, start: dict | None = None, diagnosis: dict | None = None) -> str:
    e = _html.escape
    title = f"Bench report: {report_title(run, baseline, verdict)}"
    parts = ["<!doctype html>", "<html><head><meta charset='utf-8'>", f"<title>{e(title)}</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
             ".pass{color:#070}.marginal{color:#b60}.fail{color:#b00}</style></head><body>",
             f"<h1>{e(title)}</h1>"]
    if baseline is not None:
        parts.append(f"<p>Baseline: {e(_label(baseline, 'baseline'))}</p>")
    else:
        parts.append("<p>Baseline: none given, so no verdict (pass --baseline FILE to compare and judge)</p>")
    if verdict is not None:
        parts.append(f"<p class='{verdict.status}'><b>Verdict: {verdict.status.upper()}</b> "
                     f"({e(verdict.profile_kind)})</p>")
        if verdict.reasons or verdict.notes:
            parts.append("<ul>" + "".join(f"<li>{e(r)}</li>" for r in verdict.reasons)
                         + "".join(f"<li>note: {e(n)}</li>" for n in verdict.notes) + "</ul>")
    head, rows = _table_rows(run, baseline, verdict)
    parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
    for r in rows:
        cls = r[-1].split(" ")[0] if r[-1].split(" ")[0] in ("pass", "marginal", "fail") else ""
        parts.append(f"<tr class='{cls}'>" + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>")
    parts.append("</table>")
    wrows = workload_rows(run, baseline, verdict)
    if wrows:
        parts.append("<h2>Per workload</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in WORKLOAD_HEAD) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>" for r in wrows]
        parts.append("</table>")
    why = why_lines(diagnosis)
    if why:
        parts.append("<h2>Why</h2><pre>" + e("\n".join(why)) + "</pre>")
    sl = start_lines(start)
    if sl:
        parts.append(f"<h2>Start-up</h2><p>{e(sl[0])}</p><ul>" + "".join(f"<li>{e(x.strip())}</li>" for x in sl[1:])
                     + "</ul>")
    if plot_name:
        parts.append(f"<p><img src='{e(plot_name)}' alt='throughput and ITL vs concurrency'></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(run: BenchRun, out_dir: str | Path, baseline: BenchRun | None = None,
                 verdict: Verdict | None = None, *, name: str = "report", start: dict | None = None,
                 diagnosis: dict | None = None) -> dict[str, Path]:
    """Write `<name>.png`, `<name>.md` and `<name>.html` into out_dir; `start`: the release's last
    start (a release's report: its phases under "Start-up")."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    png = plot_png(run, d / f"{name}.png", baseline, verdict=verdict, title=report_title(run, baseline, verdict))
    md = d / f"{name}.md"
    md.write_text(markdown(run, baseline, verdict, plot_name=png.name, start=start, diagnosis=diagnosis),
                  encoding="utf-8")
    ht = d / f"{name}.html"
    ht.write_text(html(run, baseline, verdict, plot_name=png.name, start=start, diagnosis=diagnosis),
                  encoding="utf-8")
    return {"png": png, "markdown": md, "html": ht}
