"""Bad input gets one line naming the problem and the fix, and exit code 2."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*OPSCTL, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "(fix: " in lines[0]
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_profile():
    assert_one_line_error(run("render", "turbo", "-i", "inventories/blackwell"), "unknown profile 'turbo'", "ddtree")


@pytest.mark.parametrize("budget", ["0", "-3"])
def test_budget_zero_or_negative(budget):
    assert_one_line_error(run("render", "ddtree", "--budget", budget, "-i", "inventories/blackwell"),
                          f"--budget {budget}", "1..")


def test_ddtree_without_budget():
    assert_one_line_error(run("render", "ddtree", "-i", "inventories/blackwell"), "needs --budget")


def test_budget_on_non_ddtree_profile():
    assert_one_line_error(run("render", "dflash", "--budget", "16", "-i", "inventories/blackwell"),
                          "--budget applies only to ddtree")


@pytest.fixture
def inv_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "inv"
    shutil.copytree(REPO / "inventories/blackwell", dst)
    return dst


def test_missing_required_host_fact(inv_copy: Path):
    gv = inv_copy / "group_vars/all.yml"
    gv.write_text("\n".join(line for line in gv.read_text().splitlines() if "interconnect" not in line) + "\n")
    assert_one_line_error(run("render", "ar-tp8", "-i", str(inv_copy)), "missing required setting interconnect",
                          "group_vars/all.yml")


def test_missing_gpu_count(inv_copy: Path):
    gv = inv_copy / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("    count: 8\n", ""))
    assert_one_line_error(run("render", "ar-tp8", "-i", str(inv_copy)), "gpu.count")


def test_malformed_yaml_names_file_and_line(inv_copy: Path):
    hosts = inv_copy / "hosts.yml"
    lines = hosts.read_text().splitlines()
    idx = next(i for i, line in enumerate(lines) if "ansible_user" in line)
    lines[idx] = "        ansible_user: [root"  # unclosed flow sequence
    hosts.write_text("\n".join(lines) + "\n")
    proc = run("render", "ar-tp8", "-i", str(inv_copy))
    assert_one_line_error(proc, "malformed YAML", "hosts.yml:")
    assert f"hosts.yml:{idx + 1}" in proc.stderr or f"hosts.yml:{idx + 2}" in proc.stderr


def test_wrong_type_in_inventory(inv_copy: Path):
    gv = inv_copy / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("http_port: 30000", "http_port: lots"))
    assert_one_line_error(run("render", "ar-tp8", "-i", str(inv_copy)), "http_port")


def test_missing_inventory_directory(tmp_path: Path):
    assert_one_line_error(run("render", "ar-tp8", "-i", str(tmp_path / "nope")), "no inventory at")


def test_unknown_limit_host():
    assert_one_line_error(run("render", "ar-tp8", "-i", "inventories/blackwell", "--limit", "ghost"), "'ghost'")


def test_help_teaches_with_examples():
    top = run("--help")
    assert top.returncode == 0 and "Examples" in top.stdout
    for cmd in ("render", "deploy", "rollback", "status", "history"):
        proc = run(cmd, "--help")
        assert proc.returncode == 0, proc.stderr
        assert "Example" in proc.stdout and "opsctl " in proc.stdout, cmd
