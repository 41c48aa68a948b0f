"""`opsctl diagnose` and the report's "Why" on files saved from the lab (tests/diagnose/data/capture.py):
the ar-tp8 baseline's bench, and for a budget 32 under `accept_collapse` and a budget 8 under
`host_overhead`, the release's stored bench and its journal (text and `-o json --all`)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
OPSCTL = [sys.executable, "-m", "opsctl"]
BASE = str(DATA / "ar-tp8.bench.jsonl")
COLLAPSE = "ddtree-b32-accept-collapse"
OVERHEAD = "ddtree-b8-host-overhead"
REF = ["--reference-accept", "8:4.48,16:5.3"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*OPSCTL, *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})


def diagnose_json(*args: str) -> dict:
    p = run("diagnose", *args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def level(d: dict, c: int) -> dict:
    return next(r for r in d["levels"] if r["concurrency"] == c)


def error_line(p: subprocess.CompletedProcess) -> str:
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    return lines[0]


@pytest.mark.parametrize("journal", ["journal.txt", "journal.json"])
def test_the_sites_collapse_from_its_bench_and_journal(journal):
    d = diagnose_json(str(DATA / f"{COLLAPSE}.bench.jsonl"), "--baseline", BASE,
                      "--journal", str(DATA / f"{COLLAPSE}.{journal}"), *REF)
    assert d["budget"] == 32                                       # from the bench's metadata
    c1 = level(d, 1)
    assert c1["loses"] and 1.4 < c1["accept"] < 1.7
    assert 2.5 < c1["break_even_accept"] < 3.5                     # ~29 ms against ~10 ms
    assert c1["verify_source"] == "measured"                       # the step line at bs=1, budget 32
    assert c1["verify_ms"] == pytest.approx(9.68 + 0.52 * 33, rel=0.02)
    assert c1["parts"]["tree_ms"] == pytest.approx(1.0, abs=0.01)  # the fault's serial CPU tree, 1 ms/request
    assert c1["causes"][0]["kind"] == "acceptance"
    pred = {(p["budget"], p["concurrency"]): p["tok_s"] for p in d["predictions"]}
    assert pred[(8, 1)] > pred[(32, 1)]


def test_host_overhead_is_the_top_cause_with_the_step_lines_parts():
    d = diagnose_json(str(DATA / f"{OVERHEAD}.bench.jsonl"), "--baseline", BASE,
                      "--journal", str(DATA / f"{OVERHEAD}.journal.txt"), *REF)
    c1 = level(d, 1)
    assert c1["parts"]["prep_ms"] == pytest.approx(40.0, abs=0.01)
    assert c1["causes"][0]["kind"] == "overhead" and c1["causes"][0]["share"] > 0.6
    assert d["causes"][0]["kind"] == "overhead"


def test_a_journal_alone_is_a_candidate_its_budget_from_server_args():
    d = diagnose_json(str(DATA / f"{COLLAPSE}.journal.txt"), "--baseline", BASE, *REF)
    assert d["budget"] == 32 and d["levels"]
    assert all(r["step_source"] == "journal" for r in d["levels"] if "step_source" in r)
    assert any(r.get("loses") for r in d["levels"])


def test_the_human_output_names_causes_and_predictions():
    p = run("diagnose", str(DATA / f"{COLLAPSE}.bench.jsonl"), "--baseline", BASE, *REF)
    assert p.returncode == 0, p.stderr
    assert "causes, by share of the loss:" in p.stdout and "acceptance" in p.stdout
    assert "predicted decode tok/s" in p.stdout and "break-even" in p.stdout


@pytest.mark.parametrize("args,needle", [
    ([str(DATA / f"{COLLAPSE}.bench.jsonl")], "--baseline FILE"),
    (["no/such/run.jsonl", "--baseline", BASE], "no such file"),
    ([str(DATA / "README.md"), "--baseline", BASE], "neither bench results nor SGLang decode lines"),
    ([str(DATA / f"{COLLAPSE}.bench.jsonl"), "--baseline", BASE, "--reference-accept", "8=4"], "BUDGET:ACCEPT"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    p = run("diagnose", *args)
    assert p.returncode == 2
    assert needle in error_line(p)


def test_the_report_of_a_ddtree_bench_has_a_why(tmp_path):
    p = run("report", str(DATA / f"{COLLAPSE}.bench.jsonl"), "--baseline", BASE, "--out", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["diagnosis"]["levels"]
    md = (tmp_path / "report.md").read_text()
    assert "## Why" in md and "break-even" in md
    assert "<h2>Why</h2>" in (tmp_path / "report.html").read_text()


def test_tunes_table_cells_carry_the_accept_a_level_needs_and_why_it_lost():
    """opsctl tune's per-level results (its table's cells) from the same saved bench: the accept
    length, the accept the level needs (its step ratio) and a losing level's top cause."""
    from opsctl.cli.tune import _cell
    from opsctl.gate.results import read_jsonl
    from opsctl.tune import _level_results

    run = read_jsonl(DATA / f"{COLLAPSE}.bench.jsonl")
    base = read_jsonl(BASE)
    res = _level_results(run, base, [1, 4, 8], 0.9, budget=32, reference={8: 4.48, 16: 5.3})
    c1 = res[1]
    assert 1.4 < c1.accept < 1.7 and 2.5 < c1.step_ratio < 3.5 and c1.why.startswith("acceptance ")
    assert res[8].why.startswith("verify_compute ")
    cell = _cell(c1)
    assert f"accept {c1.accept:.2f} / needs {c1.step_ratio:.2f} (acceptance" in cell
    assert _level_results(run, base, [1], 0.9)[1].why is None   # a schedule trial: no budget, no diagnosis


def test_history_puts_a_failed_verdicts_causes_first():
    from opsctl.cli.deploy import _why_cell

    rec = {"action": "verdict", "reason": "C=1: speedup -46.0 % ...; why: C=1: accept 1.55 ...",
           "diagnosis": {"causes": [{"kind": "verify_compute", "share": 0.58}, {"kind": "acceptance", "share": 0.39}]}}
    assert _why_cell(rec).startswith("lost to verify_compute 58 %, acceptance 39 %; C=1: speedup")
    assert len(_why_cell(rec)) <= 80
    assert _why_cell({"reason": "manual rollback"}) == "manual rollback"
