"""CLI: opsctl bench (--url), bench compare, bench import, report (typer CliRunner)."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from bench_fakeserver import FakeSGLang, Schedule
from opsctl.cli import bench as bench_cli
from opsctl.errors import CheckFailed, ConfigError
from test_bench_report import BASE, CAND, png_size
from test_bench_results import bench_serving_line
from opsctl.gate.results import write_jsonl


@pytest.fixture()
def app() -> typer.Typer:
    a = typer.Typer()
    bench_cli.register(a)
    return a


runner = CliRunner()


def test_bench_url_writes_results_and_prints_per_level(app, tmp_path):
    with FakeSGLang(Schedule(ttft_s=0.002, gap_s=0.001, accept_length=2.5)) as url:
        r = runner.invoke(app, ["bench", "--url", url, "--concurrency", "1,2", "--input-len", "4", "--output-len", "4",
                                "--requests-per-level", "2", "--repeats", "2", "--warmup", "1", "--canary", "2",
                                "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "tok/s" in r.output and "canary: 2 prompts decoded" in r.output
    files = list(tmp_path.glob("bench-*.jsonl"))
    assert len(files) == 1
    lines = [json.loads(x) for x in files[0].read_text().splitlines()]
    assert [x["record"] for x in lines] == ["meta", "level", "level", "level", "level", "canary"]
    assert lines[1]["accept_length"] == 2.5


def test_bench_url_json_mode_prints_json_lines(app):
    with FakeSGLang(Schedule(ttft_s=0.001, gap_s=0.001)) as url:
        r = runner.invoke(app, ["bench", "--url", url, "-c", "1", "--output-len", "3", "--requests-per-level", "1",
                                "--repeats", "1", "--warmup", "0", "--json"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert recs[0]["record"] == "meta" and recs[1]["max_concurrency"] == 1 and "output_throughput" in recs[1]


def test_bench_errors_are_check_failed(app):
    with FakeSGLang(Schedule(ttft_s=0.001, gap_s=0.001, fail_every=1)) as url:
        r = runner.invoke(app, ["bench", "--url", url, "-c", "1", "--requests-per-level", "2", "--repeats", "1",
                                "--warmup", "0"])
    assert isinstance(r.exception, CheckFailed) and "C=1: 2" in r.exception.problem


def test_bench_bad_levels_and_save_baseline_without_inventory_are_config_errors(app):
    r = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "-c", "1,x"])
    assert isinstance(r.exception, ConfigError)
    r = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--save-baseline"])
    assert isinstance(r.exception, ConfigError) and "--inventory" in r.exception.problem


def test_compare_prints_deltas(app, tmp_path):
    a, b = write_jsonl(BASE, tmp_path / "a.jsonl"), write_jsonl(CAND, tmp_path / "b.jsonl")
    r = runner.invoke(app, ["bench", "compare", str(a), str(b)])
    assert r.exit_code == 0, r.output
    assert "-49.0%" in r.output
    r = runner.invoke(app, ["bench", "compare", str(a), str(b), "--json"])
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert rows[0]["concurrency"] == 1 and round(rows[0]["tok_s_delta_pct"], 1) == -49.0


def test_compare_missing_file_is_a_config_error(app, tmp_path):
    r = runner.invoke(app, ["bench", "compare", str(tmp_path / "nope.jsonl"), str(tmp_path / "nope2.jsonl")])
    assert isinstance(r.exception, ConfigError)


def test_import_converts_a_bench_serving_file(app, tmp_path):
    src = tmp_path / "bs.jsonl"
    src.write_text(bench_serving_line(1, 50.0) + "\n" + bench_serving_line(128, 87.0) + "\n")
    r = runner.invoke(app, ["bench", "import", str(src), "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    out = tmp_path / "o" / "bs.opsctl.jsonl"
    assert out.is_file() and "87.0" in r.output


def test_report_writes_png_md_html_with_verdict(app, tmp_path):
    a, b = write_jsonl(BASE, tmp_path / "a.jsonl"), write_jsonl(CAND, tmp_path / "b.jsonl")
    r = runner.invoke(app, ["report", str(b), "--baseline", str(a), "--out", str(tmp_path / "rep"), "--kind", "ddtree"])
    assert r.exit_code == 0, r.output
    assert "gate FAIL (ddtree)" in r.output
    assert png_size(tmp_path / "rep" / "report.png") == (1500, 400)
    assert "Verdict: FAIL" in (tmp_path / "rep" / "report.md").read_text()
    assert (tmp_path / "rep" / "report.html").is_file()


def test_registered_in_the_main_app():
    # issue #53: this skipped when the app did not list `bench`, so losing the command passed
    from opsctl.cli import app as main_app
    cmd = typer.main.get_command(main_app)
    assert "bench" in cmd.commands and "report" in cmd.commands, sorted(cmd.commands)
    assert {"compare", "import"} <= set(cmd.commands["bench"].commands), sorted(cmd.commands["bench"].commands)


def test_report_default_name_is_what_help_says(app, tmp_path):
    # --help names both defaults; a results file gives report.*, a RELEASE id gives <release>.*
    cmd = typer.main.get_command(app).commands["report"]
    (opt,) = [p for p in cmd.params if p.name == "name"]
    assert "the RELEASE id for a release, 'report' for a file" in opt.help and opt.default is None
    f = write_jsonl(BASE, tmp_path / "a.jsonl")
    assert bench_cli.report_name(None, str(f)) == "report"
    assert bench_cli.report_name(None, "ddtree-b16-3ca2783571") == "ddtree-b16-3ca2783571"
    assert bench_cli.report_name("mine", "ddtree-b16-3ca2783571") == "mine"
