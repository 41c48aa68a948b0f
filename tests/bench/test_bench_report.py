"""Reports: the PNG plot (valid, expected size), Markdown/HTML with verdict and table, compare()."""
from __future__ import annotations

import struct

from opsctl.gate.results import BenchLevel, BenchRun
from opsctl.gate.decide import judge
from opsctl.report import PLOT_PIXELS, compare, html, markdown, plot_png, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def mk(tok: dict[int, float], label: str, accept: float | None = None, itl: float = 10.0) -> BenchRun:
    return BenchRun(meta={"release": label}, levels=[
        BenchLevel(max_concurrency=c, output_throughput=v, median_itl_ms=itl * (1 + c / 64), completed=8,
                   level_accept_length=accept) for c, v in tok.items()])


BASE = mk({1: 98.0, 2: 180.0, 4: 330.0, 8: 600.0, 16: 1000.0, 32: 1500.0, 64: 1900.0, 128: 2100.0}, "ar-tp8")
CAND = mk({1: 50.0, 2: 90.0, 4: 170.0, 8: 300.0, 16: 520.0, 32: 800.0, 64: 1000.0, 128: 1100.0},
          "ddtree-b32", accept=1.51, itl=20.0)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_is_a_png_of_the_expected_size(tmp_path):
    p = plot_png(CAND, tmp_path / "plot.png", BASE, title="ddtree vs ar-tp8")
    assert p.is_file() and p.stat().st_size > 5000
    assert png_size(p) == PLOT_PIXELS == (1500, 400)


def test_plot_without_baseline(tmp_path):
    assert png_size(plot_png(CAND, tmp_path / "solo.png")) == PLOT_PIXELS


def test_report_files_carry_the_verdict_and_the_table(tmp_path):
    v = judge(CAND, BASE, profile_kind="ddtree", canary_ran=True)
    paths = write_report(CAND, tmp_path / "r", BASE, v)
    assert png_size(paths["png"]) == PLOT_PIXELS
    md = paths["markdown"].read_text()
    assert "**Verdict: FAIL** (ddtree)" in md and "| 1 | 98.0 | 50.0 | -49.0% |" in md
    assert "accept length 1.51 below the ddtree floor" in md and "![throughput" in md and "report.png" in md
    h = paths["html"].read_text()
    assert "<b>Verdict: FAIL</b>" in h and "<td>-49.0%</td>" in h and "<img src='report.png'" in h


def test_markdown_and_html_without_verdict():
    md = markdown(CAND)
    assert "| C | tok/s |" in md and "| 128 | 1100.0 |" in md
    assert "<table>" in html(CAND, BASE)


def test_compare_gives_per_level_deltas():
    d = {x.concurrency: x for x in compare(BASE, CAND)}
    assert round(d[1].tok_s_delta_pct, 1) == -49.0
    assert d[128].a_tok_s == 2100.0 and d[128].b_tok_s == 1100.0
    assert d[1].itl_delta_pct > 0 and d[1].b_accept == 1.51
    only_a = compare(BASE, mk({1: 100.0}, "x"))
    assert [x.concurrency for x in only_a][:2] == [1, 2] and only_a[1].b_tok_s is None


def _workload_run(kind: str, verify_rounds: int) -> BenchRun:
    samples = [["chat", 32, 1.0, 0.1, verify_rounds, True], ["humaneval", 32, 0.5, 0.1, verify_rounds, True]]
    return BenchRun(meta={"kind": kind}, levels=[BenchLevel(level=1, output_throughput=40.0, samples=samples)])


def test_workload_rows_name_the_baselines_accept_length_instead_of_a_dash():
    from opsctl.report import workload_rows

    release = _workload_run("ddtree", 8)           # 32 tokens in 8 rounds: accept length 4.00
    rows = workload_rows(release, _workload_run("autoregressive", 0), None)
    assert [(r[1], r[5], r[6]) for r in rows] == [("chat", "4.00", "1 (AR)"), ("humaneval", "4.00", "1 (AR)")]
    # a speculative baseline reports its own; one benched without metrics says it did not report it
    assert workload_rows(release, _workload_run("dflash", 16), None)[0][6] == "2.00"
    assert workload_rows(release, _workload_run("dflash", 0), None)[0][6] == "not reported"
    assert workload_rows(release, None, None)[0][6] == "no baseline"
