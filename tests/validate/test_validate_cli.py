"""`opsctl validate`: offline mode end to end, exit codes, --json, bad input, the live-mode hook."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from opsctl.cli import validate as validate_cli
from opsctl.errors import CheckFailed, ConfigError
from validate_lines import DATA, SITE_LINES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run():
    """Invoke `validate` in-process; returns (exit code as opsctl.cli.main maps it, stdout, exception)."""
    from opsctl.cli import _output

    app = typer.Typer()
    validate_cli.register(app)

    @app.callback()
    def _root() -> None:  # keeps `validate` a subcommand, as in the real app
        pass

    def invoke(*args: str):
        result = CliRunner().invoke(app, ["validate", *args])
        _output.set_json(False)
        exc = result.exception
        code = exc.exit_code if isinstance(exc, (CheckFailed, ConfigError)) else result.exit_code
        return code, result.stdout, exc
    return invoke


def test_healthy_log_exits_zero_with_a_table(run):
    code, out, exc = run("--from-file", str(DATA / "ddtree_b16_healthy.journal.txt"), "--profile", "ddtree",
                         "--budget", "16")
    assert code == 0, exc
    assert "capture.verify_width" in out and "FAIL" not in out


def test_site_log_fails_with_json_findings(run):
    code, out, exc = run("--from-file", str(DATA / "site_ddtree_b32_wrong_graph.journal.txt"), "--profile", "ddtree",
                         "--budget", "32", "--json")
    assert code == 6 and isinstance(exc, CheckFailed)
    data = json.loads(out)
    assert data["ok"] is False
    failed = {f["check"]: f for f in data["findings"] if not f["ok"]}
    assert set(failed) == {"capture.verify_width", "decode.draft_tokens_per_round"}
    assert "DDTree budget 32 needs 33" in failed["capture.verify_width"]["diagnosis"]
    assert {"check", "ok", "diagnosis", "fix", "details"} <= set(failed["capture.verify_width"])


def test_site_decode_lines_only(run, tmp_path):
    log = tmp_path / "ticket.txt"
    log.write_text(SITE_LINES)
    code, out, exc = run("--from-file", str(log), "--profile", "ddtree", "--budget", "32", "--only", "decode", "--json")
    assert code == 6
    (bad,) = [f for f in json.loads(out)["findings"] if not f["ok"]]
    assert "imply 8 draft tokens per round" in bad["diagnosis"]


def test_max_concurrency_option_feeds_the_coverage_check(run):
    code, out, _ = run("--from-file", str(DATA / "ddtree_b16_healthy.json"), "--profile", "ddtree", "--budget", "16",
                       "--max-concurrency", "64", "--json")
    assert code == 6
    (bad,) = [f for f in json.loads(out)["findings"] if not f["ok"]]
    assert bad["check"] == "capture.batch_coverage" and "33-64" in bad["diagnosis"]


@pytest.mark.parametrize("args, message", [
    (["--from-file", "LOG", "--budget", "16"], "--budget applies to --profile ddtree"),
    (["--from-file", "/nonexistent/journal.txt", "--profile", "ddtree", "--budget", "16"], "no such file"),
    (["--from-file", "LOG", "--profile", "ddtree"], "needs --budget"),
    (["--from-file", "LOG", "--profile", "nope"], "unknown profile"),
    (["--from-file", "LOG", "--profile", "ddtree", "--budget", "16", "--only", "bench"], "not a check group"),
    (["--profile", "ddtree", "--budget", "16"], "apply to --from-file only"),
])
def test_bad_input_is_a_config_error(run, args, message):
    args = [str(DATA / "ddtree_b16_healthy.journal.txt") if a == "LOG" else a for a in args]
    code, _, exc = run(*args)
    assert code == 2 and isinstance(exc, ConfigError) and message in exc.problem, exc
    assert exc.fix


def test_log_text_with_brackets_prints_literally(run, tmp_path):
    log = tmp_path / "ticket.txt"
    log.write_text("[2026-05-30 00:21:00 TP0] Traceback (most recent call last):\n"
                   "  File \"x.py\", line 1, in f\n"
                   "RuntimeError: [rank0] [/bold] NCCL error\n")
    code, out, exc = run("--from-file", str(log), "--profile", "ddtree", "--budget", "16")
    assert code == 6 and "[rank0]" in out and "[/bold]" in out


def test_empty_file_is_a_config_error(run, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    code, _, exc = run("--from-file", str(empty), "--profile", "ar-tp8")
    assert code == 2 and "no log lines" in exc.problem


def test_live_mode_calls_deploy_validate_live(run, monkeypatch):
    import opsctl.flow.validate as flow_validate
    from opsctl.findings import Finding

    calls = []

    def fake_validate_live(inventory_dir, limit):
        calls.append((inventory_dir, limit))
        return [Finding(check="capture.verify_width", ok=True, diagnosis="fine")]
    monkeypatch.setattr(flow_validate, "validate_live", fake_validate_live, raising=False)
    code, out, exc = run("--inventory", "inventories/lab", "--limit", "lab", "--json")
    assert code == 0, exc
    assert calls == [(Path("inventories/lab"), "lab")] and json.loads(out)["ok"] is True


def test_installed_command_end_to_end():
    proc = subprocess.run([sys.executable, "-m", "opsctl", "validate", "--from-file",
                           str(DATA / "site_ddtree_b32_wrong_graph.journal.txt"), "--profile", "ddtree", "--budget",
                           "32", "--json"], capture_output=True, text=True, cwd=REPO, timeout=60)
    # issue #53: this skipped when another command module broke 'import opsctl.cli', which is
    # exactly the breakage a user of 'opsctl validate' would meet: now it fails, naming it
    assert "Traceback" not in proc.stderr, f"'python -m opsctl validate' crashed: {proc.stderr[-1500:]}"
    assert proc.returncode == 6, proc.stderr
    data = json.loads(proc.stdout)  # exactly one JSON object on stdout
    assert data["ok"] is False
    assert "validation failed" in proc.stderr
