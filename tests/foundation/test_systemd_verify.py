"""The rendered unit passes `systemd-analyze verify` with nothing on stderr (unknown
keys are only warnings with exit 0, so stderr is what counts)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="systemd-analyze missing: run scripts/bootstrap (installs Debian's systemd)")


@pytest.mark.parametrize("profile", [["ddtree", "--budget", "16"], ["ar-tp8"], ["ar-ep8"], ["dflash"]],
                         ids=lambda p: "-".join(p))
@pytest.mark.parametrize("inventory", ["blackwell", "lab"])
def test_rendered_unit_verifies_clean(tmp_path: Path, profile, inventory):
    root = tmp_path / "root"
    proc = subprocess.run([sys.executable, "-m", "opsctl", "render", *profile, "-i", f"inventories/{inventory}",
                           "--out", str(root)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    # stubs under --root: the server binary and systemd's own units
    py = root / "opt/opsctl/shared/envs/sglang-0.5.23/bin/python"
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    res = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "sglang-k26.service"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_verify_catches_a_broken_unit(tmp_path: Path):
    """The check itself can fail: a unit with a typo'd key is reported on stderr."""
    root = tmp_path / "root"
    subprocess.run([sys.executable, "-m", "opsctl", "render", "ar-tp8", "-i", "inventories/lab", "--out", str(root)],
                   check=True, cwd=REPO, capture_output=True)
    unit = root / "opt/opsctl/current/sglang-k26.service"
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restrat=on-failure"))
    py = root / "opt/opsctl/shared/envs/sglang-0.5.23/bin/python"
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    res = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "sglang-k26.service"],
                         capture_output=True, text=True)
    assert "Restrat" in res.stderr
