"""Issue 33: `opsctl bench import` on what operators paste: bench_serving console summaries of
several versions (one cut short), result files of older JSON field sets, several results in
one file (data/pasted/, sources in its README.md). Each result says its format and the fields
it lacks; compare and report show a lacking field as missing, never as 0."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from opsctl.gate.results import (FORMAT_CONSOLE, FORMAT_FIRST_JSON, FORMAT_JSONL, import_results, read_jsonl,
                                  write_jsonl)
from opsctl.cli import bench as bench_cli
from opsctl.errors import CheckFailed, ConfigError
from opsctl.report import compare, markdown

PASTED = Path(__file__).parent / "data" / "pasted"


@pytest.fixture
def app():
    a = typer.Typer()
    bench_cli.register(a)
    return a


def invoke(app, *args):
    from opsctl.cli import _output

    result = CliRunner().invoke(app, list(args))
    _output.set_json(False)
    exc = result.exception
    code = exc.exit_code if isinstance(exc, (CheckFailed, ConfigError)) else result.exit_code
    return code, result.stdout, result.stderr, exc


# --------------------------------------------------------------------------- console summaries


def test_v040_summary_with_the_reqeuest_typo_cut_mid_table():
    (lv,) = import_results(PASTED / "sglang-2805-v0.4.0-summary-truncated.txt").levels
    assert lv.source_format == FORMAT_CONSOLE and lv.source_line == 2
    assert lv.output_throughput == 1915.40 and lv.completed == 1648 and lv.total_output_tokens == 326408
    assert lv.mean_ttft_ms == 44294.80 and lv.median_e2e_latency_ms == 81160.44
    # `Max reqeuest concurrency: not set`: no limit, so the level is the effective concurrency,
    # derived as bench_serving defines it (mean E2E x completed / duration)
    assert lv.level == round(80126.93 / 1000 * 1648 / 170.41) and lv.derived == ["concurrency"]
    # the cut: `Median TTFT (ms):` has no value and nothing follows -> lacking, not 0 and not an error
    assert {"median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "mean_tpot_ms"} <= set(lv.missing)
    assert lv.value("median_ttft_ms") is None and lv.value("output_throughput") == 1915.40


def test_speculative_summary_keeps_accept_length():
    (lv,) = import_results(PASTED / "sglang-13376-ngram-accept-length-summary.txt").levels
    assert lv.accept_length == 5.86 and lv.accept == 5.86
    assert lv.max_concurrency == 256 and lv.level == 256 and lv.concurrency == 142.34
    assert lv.output_throughput == 6148.70 and lv.request_throughput == 3.07
    assert "median_ttft_ms" in lv.missing and "median_itl_ms" in lv.missing  # cut after `Accept length`


def test_newest_summary_fields_p90_and_peak():
    (lv,) = import_results(PASTED / "sglang-26445-p90-summary.txt").levels
    assert lv.max_concurrency == 8 and lv.p90_e2e_latency_ms == 172984.00 and lv.p99_e2e_latency_ms == 175397.60
    assert lv.max_output_tokens_per_s == 465.00 and lv.median_ttft_ms == 461.96 and lv.p99_ttft_ms == 1920.03
    assert "mean_tpot_ms" in lv.missing and "concurrency" not in lv.missing and lv.derived == []


def test_two_summaries_in_one_markdown_file_the_second_cut_short():
    run = import_results(PASTED / "dlora-request-rate-summaries.md")
    first, second = run.levels
    assert (first.source_line, second.source_line) == (3, 35)
    # the old format: no max-concurrency line, `Total throughput`, ITL under `Inter-token Latency`
    assert first.total_throughput == 2121.89 and first.median_itl_ms == 0.0 and "median_itl_ms" not in first.missing
    assert first.median_tpot_ms == -0.0 and first.p99_itl_ms == 0.0
    # the second stops after `Request throughput`: what it shows is kept, the rest lacks; no level
    assert second.request_throughput == 3.83 and second.completed == 996
    assert second.level == 0 and {"output_throughput", "concurrency", "median_itl_ms"} <= set(second.missing)


# --------------------------------------------------------------------------- JSON formats


def test_the_first_json_lines_ever_written_bench_rps_from_pr_670(tmp_path):
    """Collected: sglang.bench_rps's line from sgl-project/sglang PR #670 (July 2024), whose
    `ttft`/`itl` are the Median TTFT/ITL (ms) it read from bench_serving's summary."""
    run = import_results(PASTED / "sglang-670-bench-rps-first-json.jsonl")
    (lv,) = run.levels
    assert (lv.source_format, lv.source_line) == (FORMAT_FIRST_JSON, 1)
    assert (lv.output_throughput, lv.median_ttft_ms, lv.median_itl_ms) == (397.51, 32.04, 12.19)
    assert lv.model_extra["request_rate"] == 2
    # only four fields: the rest lacks, none is 0 and none is derived (no E2E, count or duration)
    assert {"median_ttft_ms", "median_itl_ms", "output_throughput"}.isdisjoint(lv.missing)
    assert {"completed", "duration", "request_throughput", "mean_e2e_latency_ms", "p99_itl_ms", "p99_ttft_ms",
            "errors", "concurrency"} <= set(lv.missing) and lv.derived == []
    assert lv.level == 0 and lv.value("request_throughput") is None and lv.value("errors") is None
    rec = next(json.loads(ln) for ln in write_jsonl(run, tmp_path / "x.jsonl").read_text().splitlines()
               if '"level"' in ln)
    assert rec["median_itl_ms"] == 12.19 and rec["p99_itl_ms"] is None and rec["completed"] is None
    assert rec["source_format"] == FORMAT_FIRST_JSON


def test_cli_import_of_the_bench_rps_line_shows_missing_not_zero(app, tmp_path):
    f = PASTED / "sglang-670-bench-rps-first-json.jsonl"
    code, out, _, exc = invoke(app, "bench", "import", str(f), "--out", str(tmp_path))
    assert code == 0, exc
    said = "".join(out.split())
    assert f"{f}:1:bench_serving first JSON result format,C=?;lacks".replace(" ", "") in said
    row = next(ln for ln in out.splitlines() if ln.startswith("│ ? "))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    # C, tok/s, req/s, TTFT p50, ITL p50, ITL p99, E2E p50, accept, errors
    assert cells == ["?", "397.5", "missing", "32.0", "12.19", "missing", "missing", "-", "missing"]
    code, out, _, _ = invoke(app, "bench", "import", str(f), "--out", str(tmp_path), "--json")
    (res,) = json.loads(out)["results"]
    assert res["format"] == FORMAT_FIRST_JSON and res["concurrency"] is None and res["derived"] == []
    assert "median_itl_ms" not in res["lacks"] and "p99_itl_ms" in res["lacks"]
    # as compare's A, the level B does not have shows '-' for B, not 0 errors
    code, out, _, exc = invoke(app, "bench", "compare", str(f), str(PASTED / "sglang-26445-p90-summary.txt"))
    assert code == 0, exc
    row = next(ln for ln in out.splitlines() if ln.startswith("│ ? "))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == ["?", "397.5", "-", "-", "12.19", "-", "-", "-", "-"]


def test_first_json_format_names_are_mapped():
    """Constructed (see data/pasted/README.md): bench_serving's own first `result = {...}` names."""
    (lv,) = import_results(PASTED / "first-format-from-dlora-summaries.jsonl").levels
    assert lv.source_format == FORMAT_FIRST_JSON
    assert (lv.output_throughput, lv.median_ttft_ms, lv.median_itl_ms) == (825.94, 606.88, 0.0)
    assert (lv.mean_e2e_latency_ms, lv.total_input_tokens, lv.duration) == (2098.07, 342460, 264.25)
    assert "p99_itl_ms" in lv.missing and "request_throughput" in lv.missing and "concurrency" in lv.derived


def test_v041_jsonl_of_request_rate_runs_keeps_each_run_apart():
    run = import_results(PASTED / "datacrunch-h200-llama-3.3-70b-online.jsonl")
    assert [lv.source_format for lv in run.levels] == [FORMAT_JSONL] * 5
    # `max_concurrency: null` and no `concurrency` field: each request rate gets its derived level
    assert run.concurrencies() == [8, 16, 52, 372, 1273] and run.repeats == 1
    assert run.levels[0].median_itl_ms == pytest.approx(13.6379, abs=1e-3)
    assert {"p99_itl_ms", "request_throughput", "std_ttft_ms"} <= set(run.levels[0].missing)


def test_the_current_jsonl_lacks_nothing(tmp_path):
    from test_bench_results import bench_serving_line

    f = tmp_path / "now.jsonl"
    f.write_text(bench_serving_line(8, 80.0) + "\n")
    (lv,) = import_results(f).levels
    assert lv.source_format == FORMAT_JSONL and lv.missing == ["errors"] and lv.level == 8


# --------------------------------------------------------------------------- missing, never 0


def test_a_lacking_field_survives_the_jsonl_round_trip_as_null(tmp_path):
    run = import_results(PASTED / "sglang-2805-v0.4.0-summary-truncated.txt")
    path = write_jsonl(run, tmp_path / "x.jsonl")
    rec = next(json.loads(ln) for ln in path.read_text().splitlines() if '"level"' in ln)
    assert rec["median_ttft_ms"] is None and rec["output_throughput"] == 1915.40 and rec["source_format"] == FORMAT_CONSOLE
    back = read_jsonl(path)
    assert back.levels[0].value("median_ttft_ms") is None and "median_ttft_ms" in back.levels[0].missing


def test_compare_and_report_show_missing_not_zero():
    a = import_results(PASTED / "dlora-request-rate-summaries.md")
    b = import_results(PASTED / "sglang-26445-p90-summary.txt")
    at8 = next(d for d in compare(a, b) if d.concurrency == 8)
    assert at8.a_tok_s == 825.94 and at8.b_tok_s == 189.26 and at8.b_itl_p50_ms is None
    assert "median_itl_ms" in at8.b_lacks
    md = markdown(b, a)
    row = next(ln for ln in md.splitlines() if ln.startswith("| 8 |"))
    assert row == "| 8 | 825.9 | 189.3 | -77.1% | 0.00 ms | missing | - | missing |"
    alone = next(ln for ln in markdown(b).splitlines() if ln.startswith("| 8 |"))
    assert "| missing |" in alone and "0.0 ms" not in alone


def test_cli_import_says_format_and_lacking_fields(app, tmp_path):
    code, out, err, exc = invoke(app, "bench", "import", str(PASTED / "sglang-13376-ngram-accept-length-summary.txt"),
                                 "--out", str(tmp_path))
    assert code == 0, exc
    said = "".join(out.split())  # rich wraps long lines at the test console's width
    assert "sglang-13376-ngram-accept-length-summary.txt:1:bench_serving console summary,C=256;lacks".replace(" ", "") in said
    assert "median_ttft_ms" in said and "5.86" in out
    code, out, _, _ = invoke(app, "bench", "import", str(PASTED / "datacrunch-h200-llama-3.3-70b-online.jsonl"),
                             "--out", str(tmp_path), "--json")
    data = json.loads(out)
    assert [r["format"] for r in data["results"]] == [FORMAT_JSONL] * 5 and data["results"][0]["line"] == 1
    assert "p99_itl_ms" in data["results"][0]["lacks"] and data["results"][0]["derived"] == ["concurrency"]


def test_cli_compare_reads_a_pasted_summary_directly(app):
    code, out, _, exc = invoke(app, "bench", "compare", str(PASTED / "dlora-request-rate-summaries.md"),
                               str(PASTED / "sglang-26445-p90-summary.txt"))
    assert code == 0, exc
    row = next(ln for ln in out.splitlines() if ln.startswith("│ 8 "))
    assert "825.9" in row and "189.3" in row and "missing" in row


def test_report_without_the_gate_fields_gives_no_verdict(app, tmp_path):
    code, out, _, exc = invoke(app, "report", str(PASTED / "sglang-26445-p90-summary.txt"), "--baseline",
                               str(PASTED / "dlora-request-rate-summaries.md"), "--out", str(tmp_path / "r"))
    assert code == 0, exc
    assert "no verdict: the run at C=8 (line 1) lacks median_itl_ms" in " ".join(out.split())
    assert (tmp_path / "r" / "report.md").is_file()


# --------------------------------------------------------------------------- nothing usable


def test_nothing_usable_names_file_and_first_unusable_line(app, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("\nbench went fine, numbers below\n{\"hello\": 1}\n")
    code, _, _, exc = invoke(app, "bench", "import", str(f), "--out", str(tmp_path))
    assert code == 2 and isinstance(exc, ConfigError)
    assert exc.problem.startswith(f"{f}:2: no bench_serving result") and "'bench went fine, numbers below'" in exc.problem
    readme = Path(__file__).resolve().parents[2] / "README.md"
    with pytest.raises(ConfigError, match=rf"^{readme}:1: no bench_serving result"):
        import_results(readme)


def test_binary_is_refused_with_its_line(tmp_path):
    f = tmp_path / "b.bin"
    f.write_bytes(b"ok\n\x00\x01")
    with pytest.raises(ConfigError, match=rf"^{f}:2: not a text file"):
        import_results(f)
