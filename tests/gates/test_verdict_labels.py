"""The verdict a reader can check: the aggregate tok/s columns and the judged delta are each
labelled and shown with their own numbers, a level benched without a baseline is named and
the policy decides, and the table fits an 80-column terminal."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from opsctl.gate.results import BenchLevel, BenchRun
from opsctl.cli import _output
from opsctl.gate.decide import LEVEL_TABLE_LEGEND, GatePolicy, level_table, judge


def level(c: int, per_request: list[float], aggregate: float, accept: float | None = None) -> BenchLevel:
    samples = [["chat", 48, 48 / r, 0.05, int(48 / accept) if accept else 0, 1] for r in per_request]
    return BenchLevel(max_concurrency=c, repeat=0, output_throughput=aggregate, completed=len(samples),
                      level_accept_length=accept, samples=samples)


def run_of(levels: dict[int, tuple[list[float], float]], accept: float | None = None) -> BenchRun:
    return BenchRun(levels=[level(c, rs, agg, accept) for c, (rs, agg) in levels.items()])


# the row: aggregate 545.9 vs 528.7 (-3.1 %) while the per-request ratio of means is +2.0 %
BASE = run_of({1: ([95.0 + i % 3 for i in range(16)], 95.2), 8: ([60.0 + i % 5 for i in range(16)], 545.9)})
CAND = run_of({1: ([110.0 + i % 3 for i in range(16)], 111.0), 8: ([(60.0 + i % 5) * 1.02 for i in range(16)], 528.7)},
              accept=3.0)
POLICY = GatePolicy(concurrency=[1, 8], min_requests=8)


def test_the_aggregate_columns_and_the_judged_delta_are_labelled_and_checkable():
    v = judge(CAND, BASE, POLICY, profile_kind="ddtree", canary_ran=True)
    r8 = next(r for r in v.rows if r.concurrency == 8)
    assert r8.judged_on == "per-request"
    assert round(r8.aggregate_delta_pct, 1) == round((528.7 / 545.9 - 1) * 100, 1) == -3.2
    assert round(r8.delta_pct, 1) == round((r8.candidate_req_tok_s / r8.baseline_req_tok_s - 1) * 100, 1) == 2.0
    cols, cells, lines = level_table(v.rows)
    assert cols[1:5] == ["base tok/s", "rel tok/s", "agg Δ", "judged Δ"]
    row8 = next(c for c in cells if c[0] == "8")
    assert row8[1:5] == ["545.9", "528.7", "-3.2%", "+2.0%"]
    assert lines[0] == LEVEL_TABLE_LEGEND and "aggregate" in lines[0] and "per-request" in lines[0]
    line8 = next(ln for ln in lines if ln.startswith("C=8: "))
    assert line8.startswith("C=8: judged on per-request tok/s 61.9 -> 63.1: pass (+2.0 % ["), line8
    assert "agg Δ" in v.table() and LEVEL_TABLE_LEGEND in v.table()


def test_without_request_samples_the_judged_delta_is_the_aggregate_and_says_so():
    base = BenchRun(levels=[BenchLevel(max_concurrency=1, repeat=i, output_throughput=100.0, completed=8)
                            for i in range(3)])
    cand = BenchRun(levels=[BenchLevel(max_concurrency=1, repeat=i, output_throughput=90.0, completed=8)
                            for i in range(3)])
    v = judge(cand, base, GatePolicy(concurrency=[1], min_speedup=-0.2), profile_kind="ar-tp8", canary_ran=True)
    r = v.rows[0]
    assert r.judged_on == "aggregate" and r.aggregate_delta_pct == pytest.approx(r.delta_pct) == pytest.approx(-10)
    assert level_table(v.rows)[2][1].startswith("C=1: judged on aggregate tok/s 100.0 -> 90.0: pass (-10.0 %")


def test_a_level_benched_without_a_baseline_is_named_and_fails_by_default():
    base = BASE  # benched at 1 and 8, as the fleet deploy stored it
    cand = run_of({1: ([110.0 + i % 3 for i in range(16)], 111.0), 4: ([80.0] * 16, 300.0),
                   8: ([(60.0 + i % 5) * 1.02 for i in range(16)], 528.7)}, accept=3.0)
    text = "C=4: no baseline at this level — not judged; fix: opsctl bench --save-baseline"
    v = judge(cand, base, GatePolicy(concurrency=[1, 4, 8], min_requests=8), profile_kind="ddtree", canary_ran=True)
    assert v.status == "fail" and text in v.reasons
    r4 = next(r for r in v.rows if r.concurrency == 4)
    assert r4.status == "fail" and r4.judged_on == "not judged" and r4.candidate_tok_s == 300.0
    assert any(ln.startswith("C=4: no baseline at this level") for ln in level_table(v.rows)[2])
    # the policy may only note it: the gate then passes on the levels it could judge
    v = judge(cand, base, GatePolicy(concurrency=[1, 4, 8], min_requests=8, unbaselined_levels="note"),
              profile_kind="ddtree", canary_ran=True)
    assert v.status == "pass" and text in v.notes and 4 not in [r.concurrency for r in v.rows]
    # a level the policy does not list (an extra bench level) is named in the notes only
    v = judge(cand, base, GatePolicy(concurrency=[1, 8], min_requests=8), profile_kind="ddtree", canary_ran=True)
    assert v.status == "pass" and text in v.notes


def test_the_verdict_table_fits_80_columns(monkeypatch):
    from opsctl.cli.deploy import _print_verdict

    v = judge(CAND, BASE, POLICY, profile_kind="ddtree", canary_ran=True)
    rows = list(v.rows)
    # the widest cells a row can have: C=128, five-digit tok/s, -100.0 %, "inconclusive"
    rows.append(rows[-1].model_copy(update={"concurrency": 128, "baseline_tok_s": 12345.6,
                                            "candidate_tok_s": 10000.4, "aggregate_delta_pct": -100.0,
                                            "delta_pct": -100.0, "status": "inconclusive", "errors": 128}))
    cols, cells, lines = level_table(rows)
    buf = io.StringIO()
    monkeypatch.setattr(_output, "console", Console(file=buf, width=80, highlight=False, soft_wrap=True))
    _print_verdict({"host": "lab", "status": "fail", "reasons": [], "table": {"columns": cols, "rows": cells,
                                                                              "lines": []}})
    out = buf.getvalue().splitlines()
    assert max(len(ln) for ln in out) <= 80, "\n".join(out)
    body = [ln for ln in out if "12345.6" in ln]
    assert len(body) == 1 and "inconclusive" in body[0] and "-100.0%" in body[0]  # one line, no cell folded
    header = next(ln for ln in out if "base tok/s" in ln)
    assert "judged Δ" in header and "rel tok/s" in header
    assert all(len(ln) <= 80 for ln in v.table().splitlines()[:len(v.rows) + 1])  # header + rows
