"""Issue #49, reports: a report from a results file has a title (what, against which baseline, the
verdict when there is one) on the PNG, the Markdown and the HTML, and says when it has no baseline;
the gate's limit line is each level's own (C=1 needs +5 %, the other levels baseline -max_regression),
not "baseline -15 %" everywhere."""
from __future__ import annotations

from opsctl.gate.decide import GatePolicy, judge
from opsctl.gate.results import BenchLevel, BenchRun, read_jsonl, write_jsonl
from opsctl.report import gate_limits, html, markdown, plot_png, report_title, write_report


def mk(tok: dict[int, float], meta: dict, accept: float | None = None) -> BenchRun:
    return BenchRun(meta=meta, levels=[BenchLevel(max_concurrency=c, output_throughput=v, median_itl_ms=10.0,
                                                  completed=8, level_accept_length=accept) for c, v in tok.items()])


BASE = {1: 100.0, 4: 300.0, 8: 500.0}
CAND = {1: 150.0, 4: 310.0, 8: 480.0}


def test_a_report_from_results_files_has_a_title_its_baseline_and_verdict(tmp_path):
    run = read_jsonl(write_jsonl(mk(CAND, {}, accept=3.0), tmp_path / "candidate-run.jsonl"))
    base = read_jsonl(write_jsonl(mk(BASE, {}), tmp_path / "ar-baseline.jsonl"))
    v = judge(run, base, GatePolicy(concurrency=[1, 4, 8]), profile_kind="ddtree", canary_ran=False)
    assert report_title(run) == "candidate-run.jsonl"
    assert report_title(run, base) == "candidate-run.jsonl vs ar-baseline.jsonl"
    assert report_title(run, base, v) == f"candidate-run.jsonl vs ar-baseline.jsonl: {v.status.upper()}"
    md = markdown(run, base, v)
    assert md.startswith(f"# Bench report: candidate-run.jsonl vs ar-baseline.jsonl: {v.status.upper()}\n")
    assert "Baseline: ar-baseline.jsonl" in md and f"**Verdict: {v.status.upper()}**" in md
    assert "<h1>Bench report: candidate-run.jsonl vs ar-baseline.jsonl: " in html(run, base, v)
    alone = markdown(run)
    assert alone.startswith("# Bench report: candidate-run.jsonl\n") and "Baseline: none given, so no verdict" in alone
    assert "Baseline: none given" in html(run)
    titles = []
    import opsctl.report as report

    real = report.plot_png

    def spy(*a, **kw):
        titles.append(kw.get("title"))
        return real(*a, **kw)

    report.plot_png = spy
    try:
        write_report(run, tmp_path / "r1")
        write_report(run, tmp_path / "r2", base, v)
    finally:
        report.plot_png = real
    assert titles == ["candidate-run.jsonl", f"candidate-run.jsonl vs ar-baseline.jsonl: {v.status.upper()}"]


def test_the_limit_line_is_each_levels_own_rule():
    base = mk(BASE, {"release": "ar-tp8"})
    v = judge(mk(CAND, {"release": "ddtree-b16"}, accept=3.0), base,
              GatePolicy(concurrency=[1, 4, 8], max_regression=0.15), profile_kind="ddtree", canary_ran=False)
    limits = {c: (round(t, 1), w) for c, t, w in gate_limits(v, base)}
    assert limits == {1: (105.0, "+5 %"), 4: (255.0, "-15 %"), 8: (425.0, "-15 %")}
    # a baseline-kind release judged with no gain needed at C=1 (min_speedup -max_regression): the
    # limits are the recorded spec's (issue #53), and an older record's (no spec) its policy's
    thr = {**v.analysis["throughput"], "min_speedup": -0.15}
    ar = v.model_copy(update={"analysis": {**v.analysis, "throughput": thr}})
    assert {c: w for c, _, w in gate_limits(ar, base)} == {1: "-15 %", 4: "-15 %", 8: "-15 %"}
    older = v.model_copy(update={"analysis": None, "policy": {**v.policy, "min_speedup": -0.15}})
    assert {c: w for c, _, w in gate_limits(older, base)} == {1: "-15 %", 4: "-15 %", 8: "-15 %"}
    assert v.model_copy(update={"policy": {**v.policy, "min_speedup": -0.15}}).spec().throughput.min_speedup == 0.05


def test_the_plot_legend_names_each_levels_limit(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    labels: list[str] = []
    real = Axes.plot

    def plot(self, *a, **kw):
        if kw.get("label"):
            labels.append(kw["label"])
        return real(self, *a, **kw)

    monkeypatch.setattr(Axes, "plot", plot)
    base = mk(BASE, {"release": "ar-tp8"})
    v = judge(mk(CAND, {"release": "ddtree-b16"}, accept=3.0), base,
              GatePolicy(concurrency=[1, 4, 8], max_regression=0.15), profile_kind="ddtree", canary_ran=False)
    plot_png(mk(CAND, {"release": "ddtree-b16"}, accept=3.0), tmp_path / "p.png", base, verdict=v)
    (limit,) = [x for x in labels if x.startswith("gate limit")]
    assert limit == "gate limit: baseline +5 % at C=1, -15 % at C=4,8", limit


def test_the_plot_draws_the_floor_the_gate_judged_by(tmp_path, monkeypatch):
    """A profile's own accept-length floor (3.5) is the spec's, not the policy's table for the kind
    (2.0): the plot draws the floor the levels were held to (issue #53)."""
    from matplotlib.axes import Axes

    from opsctl.onhost.analysis import build_spec

    lines: list[str] = []
    real = Axes.axhline

    def axhline(self, *a, **kw):
        lines.append(kw.get("label", ""))
        return real(self, *a, **kw)

    monkeypatch.setattr(Axes, "axhline", axhline)
    base = mk(BASE, {"release": "ar-tp8"})
    policy = GatePolicy(concurrency=[1, 4, 8], max_regression=0.15)
    spec = build_spec({"name": "ddtree", "kind": "ddtree", "accept_len_floor": 3.5}, policy.model_dump(mode="json"))
    cand = mk(CAND, {"release": "ddtree-b16"}, accept=3.0)
    v = judge(cand, base, policy, profile_kind="ddtree", canary_ran=False, spec=spec)
    assert any("accept length 3.00 below the ddtree floor 3.50" in r for r in v.reasons)
    plot_png(cand, tmp_path / "p.png", base, verdict=v)
    assert [x for x in lines if x.startswith("gate floor")] == ["gate floor 3.50 (ddtree)"]
