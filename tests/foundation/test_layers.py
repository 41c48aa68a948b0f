"""The layers hold (pyproject.toml [tool.importlinter]): cli -> tune -> flow -> host, render,
config; the flow's steps never import their callers; the core prints nothing and never
imports the lab. A deliberate cycle breaks them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(package_parent: Path) -> subprocess.CompletedProcess:
    if not LINT.exists():
        pytest.fail(f"{LINT} is missing: import-linter comes with the dev extra (scripts/bootstrap installs it)")
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run([str(LINT), "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=package_parent,
                          env=env, capture_output=True, text=True, timeout=300)


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "opsctl", tmp_path / "opsctl", ignore=shutil.ignore_patterns("__pycache__", "data"))
    return tmp_path


def test_the_layer_contracts_are_kept():
    p = lint(REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 broken" in p.stdout


@pytest.mark.parametrize("module,line,contract", [
    # a config module that reaches up into the flow (the old deploy <-> gating shape)
    ("config/loader.py", "from opsctl.flow import deploy as _cycle  # noqa", "nothing imports the flow"),
    # a step that imports the arrow that calls it
    ("flow/ready.py", "from opsctl.flow.deploy import deploy as _cycle  # noqa", "the flow's steps"),
    # the core printing with rich
    ("releases.py", "import rich as _rich  # noqa", "never imports typer, click or rich"),
    # production code reaching for the emulator
    ("flow/bench.py", "from opsctl.lab import constants as _lab  # noqa", "never imports the lab"),
    # the host-side package reaching for the controller's code (it runs on the host without opsctl)
    ("onhost/capture.py", "from opsctl.errors import ConfigError as _e  # noqa", "runs on the host's python3 alone"),
])
def test_a_deliberate_violation_breaks_its_contract(tmp_path, module, line, contract):
    root = copy_of_the_package(tmp_path)
    target = root / "opsctl" / module
    target.write_text(target.read_text() + "\n" + line + "\n")
    p = lint(root)
    assert p.returncode != 0, p.stdout
    broken = " ".join(p.stdout.split("Broken contracts", 1)[-1].split())  # names wrap at 80 columns
    assert contract in broken, p.stdout
