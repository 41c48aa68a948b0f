"""Usage errors and bad inputs: typer's one-line usage error or opsctl's own, exit 2,
no traceback, against the dependency versions the lock installs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def opsctl(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opsctl", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "OPSCTL_INVENTORY": str(REPO / "inventories/lab")})


@pytest.mark.parametrize("args,says", [
    (["deploy", "ddtree", "--budget", "abc"], "Invalid value for '--budget'"),
    (["deploy", "ddtree", "--bugdet", "16"], "No such option: --bugdet"),
    (["deplyo", "ddtree"], "Did you mean 'deploy'?"),
    (["deploy"], "Missing argument"),
    (["rollback", "--to"], "Option '--to' requires an argument"),
    (["bench", "--repeats", "0"], "--repeats"),
])
def test_usage_error_is_one_line_and_exit_2(args, says):
    p = opsctl(*args)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and says in p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr


def test_unknown_profile_suggests_the_close_one():
    p = opsctl("render", "ddtre", "--budget", "4")
    assert p.returncode == 2
    assert "did you mean 'ddtree'?" in p.stderr and "Traceback" not in p.stderr


def test_bare_opsctl_shows_help():
    p = opsctl()
    assert p.returncode == 0 and "Usage: opsctl" in p.stdout and "deploy" in p.stdout


def test_the_code_imports_click_nowhere():
    # typer >= 0.25 bundles its own click; importing click would need an undeclared package
    for path in (REPO / "opsctl").rglob("*.py"):
        text = path.read_text()
        assert "import click" not in text and "from click" not in text, path


@pytest.mark.parametrize("args,says", [
    (["history", "--last", "0"], "--last 0"),
    (["history", "--last", "-3"], "--last -3"),
    (["validate", "--from-file", "README.md", "--profile", "ar-tp8"], "holds no SGLang server log lines"),
])
def test_bad_values_are_one_line_exit_2(args, says):
    p = opsctl(*args)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and "Traceback" not in p.stderr


def test_validate_from_a_binary_file_is_exit_2(tmp_path):
    f = tmp_path / "core.bin"
    f.write_bytes(bytes(range(256)) * 20)
    p = opsctl("validate", "--from-file", str(f), "--profile", "ar-tp8")
    assert p.returncode == 2 and "not a text file" in p.stderr and "Traceback" not in p.stderr


def test_render_into_an_unwritable_place_is_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = opsctl("render", "ar-tp8", "--out", str(blocker / "sub"))
    assert p.returncode == 2 and "cannot write the rendered files" in p.stderr and "Traceback" not in p.stderr


def test_report_on_a_malformed_result_line_names_file_and_line(tmp_path):
    f = tmp_path / "run.jsonl"
    f.write_text('{"record": "meta", "release": "x"}\n{"max_concurrency": 1, "output_throughput": "fast"}\n')
    p = opsctl("report", str(f), "--out", str(tmp_path / "rep"))
    assert p.returncode == 2, p.stderr
    assert f"{f}:2: malformed" in p.stderr and "output_throughput" in p.stderr and "Traceback" not in p.stderr


def test_report_on_a_file_that_is_not_a_result_names_the_file(tmp_path):
    p = opsctl("report", "README.md", "--out", str(tmp_path / "rep"))
    assert p.returncode == 2 and "README.md" in p.stderr


def test_every_command_help_has_an_example():
    for cmd in (["deploy"], ["rollback"], ["status"], ["history"], ["render"], ["validate"], ["bench"], ["report"],
                ["check"], ["lab", "down"]):
        p = opsctl(*cmd, "--help")
        assert p.returncode == 0 and ("Example" in p.stdout or "example" in p.stdout), cmd
