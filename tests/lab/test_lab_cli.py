"""`opsctl lab` command line: errors map to exit codes without touching a host."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]


def run(*args, user=None):
    pre = []
    if user is not None:
        # another user, who keeps CAP_DAC_READ_SEARCH only (an ambient capability): it reads the
        # clone wherever it is, a 0700 home directory included (issue #49), and is still not root
        # (euid 65534, no other capability), which is what `opsctl lab up` checks
        pre = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups",
               "--inh-caps=-all,+dac_read_search", "--ambient-caps=-all,+dac_read_search",
               "--bounding-set=-all,+dac_read_search"]
    return subprocess.run(pre + OPSCTL + list(args), capture_output=True, text=True, cwd=REPO, timeout=60)


def test_unknown_fault_is_bad_input():
    r = run("lab", "fault", "set", "no-such-fault")
    assert r.returncode == 2 and "unknown lab fault" in r.stderr


def test_bad_fault_param_is_bad_input():
    r = run("lab", "fault", "set", "crash-after", "requests")
    assert r.returncode == 2 and "not key=value" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop to nobody")
def test_up_without_root_is_a_clear_lab_error():
    r = run("lab", "up", user=65534)
    assert r.returncode == 7 and "needs root" in r.stderr, r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop to nobody")
def test_the_other_user_is_not_root_and_reads_a_clone_in_a_0700_home(tmp_path):
    # what run(user=...) gives: euid 65534, no capability but reading, wherever the clone is
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "f").write_text("x")
    pre = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = ("import os, sys; print(os.geteuid(), open(sys.argv[1]).read());"
             "open(sys.argv[1], 'w')")
    caps = ["--inh-caps=-all,+dac_read_search", "--ambient-caps=-all,+dac_read_search",
            "--bounding-set=-all,+dac_read_search"]
    p = subprocess.run(pre + caps + ["/usr/bin/python3", "-c", probe, str(home / "f")], capture_output=True,
                       text=True, timeout=30)
    assert p.stdout.split() == ["65534", "x"] and "PermissionError" in p.stderr, p.stdout + p.stderr  # reads, cannot write
    bare = subprocess.run(pre + ["/usr/bin/python3", "-c", probe, str(home / "f")], capture_output=True,
                          text=True, timeout=30)
    assert "PermissionError" in bare.stderr and not bare.stdout  # without it, a 0700 home is closed


def test_fault_names_are_documented():
    from opsctl.lab import FAULTS

    doc = (REPO / "docs" / "lab.md").read_text()
    for name in FAULTS:
        assert f"`{name}`" in doc, name


def test_wheel_is_deterministic_and_named_for_pip(tmp_path):
    import zipfile

    from opsctl.lab import artifacts

    a, b = artifacts.build_wheel_bytes(), artifacts.build_wheel_bytes()
    assert a == b
    built = artifacts.ensure(tmp_path / "wh", tmp_path / "drafter")
    # emulator wheel, pylock.toml (emulator + runtime wheel, no deps), config.json, model.safetensors
    assert len(built) == 4 and artifacts.ensure(tmp_path / "wh", tmp_path / "drafter") == []
    from opsctl import wheelhouse

    assert {e.name for e in wheelhouse.read_lock(tmp_path / "wh").entries} == {"sglang", "sglang-ddtree"}
    assert wheelhouse.verify(tmp_path / "wh").ok
    whl = tmp_path / "wh" / "sglang-0.5.23+lab-py3-none-any.whl"
    names = zipfile.ZipFile(whl).namelist()
    assert "sglang/launch_server.py" in names and "sglang/lab/flags_table.json" in names
    assert "sglang-0.5.23+lab.dist-info/METADATA" in names
    import json

    cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert cfg["block_size"] == 8
    assert 2 * 2 ** 20 < (tmp_path / "drafter" / "model.safetensors").stat().st_size < 16 * 2 ** 20


def test_wheel_installs_offline_as_sglang_0_5_23(tmp_path):
    from opsctl.lab import artifacts

    artifacts.ensure(tmp_path / "wh", tmp_path / "drafter")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links",
                        str(tmp_path / "wh"), "sglang==0.5.23"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "sglang.launch_server", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--speculative-num-draft-tokens" in r.stdout


def test_more_than_5_hosts_is_a_one_line_lab_error():
    r = run("lab", "up", "--hosts", "7")
    assert r.returncode == 7 and "the lab runs at most 6 hosts on this machine" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [("lab", "ssh", "--host", "lab9"), ("lab", "fault", "list", "--host", "nope"),
                                  ("lab", "fault", "set", "crash-after", "--host", "lab8"),
                                  ("lab", "fault", "clear", "--host", "x"), ("lab", "down", "--host", "lab7")])
def test_unknown_lab_host_is_bad_input_naming_the_valid_names(args):
    r = run(*args)
    assert r.returncode == 2 and "unknown lab host" in r.stderr and "lab1, lab2, lab3, lab4" in r.stderr, r.stderr


def test_up_help_teaches_hosts():
    r = run("lab", "up", "--help")
    assert r.returncode == 0 and "--hosts" in r.stdout and "inventories/lab-fleet" in r.stdout
