"""What a deploy installs for the watch: a unit that `systemd-analyze verify` accepts,
configuration JSON the host program reads, and the CLI's help and errors."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.config import load_inventory
from opsctl.watch import host_config, playbook_vars, unit_name, unit_text

REPO = Path(__file__).resolve().parents[2]


def _host(tmp_path, extra: str = "  watch:\n    enabled: true\n"):
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories/lab", inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text() + extra)
    return load_inventory(inv).hosts["lab"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing: run scripts/bootstrap")
@pytest.mark.parametrize("broken", [False, True])
def test_watch_unit_verifies_clean_and_the_check_can_fail(tmp_path, broken):
    host = _host(tmp_path)
    root = tmp_path / "root"
    text = unit_text(host)
    if broken:
        text = text.replace("Restart=always", "Restrat=always")
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system" / unit_name(host)).write_text(text)
    for stub in ("usr/bin/python3",):
        p = root / stub
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    res = subprocess.run(["systemd-analyze", "verify", f"--root={root}", unit_name(host)], capture_output=True, text=True)
    if broken:
        assert "Restrat" in res.stderr
    else:
        assert res.returncode == 0 and res.stderr == "", res.stderr


def test_playbook_vars_install_or_remove(tmp_path):
    on = playbook_vars(_host(tmp_path / "a"))
    assert on["opsctl_watch_enabled"] is True and on["opsctl_watch_unit"] == "opsctl-watch-sglang-k26.service"
    cfg = json.loads(on["opsctl_watch_config"])
    assert cfg["unit"] == "sglang-k26.service" and cfg["root"] == "/opt/opsctl" and cfg["port"] == 30000
    assert cfg["baseline_profile"] == "ar-tp8" and cfg["model"] == "kimi-k2.6"
    assert set(cfg["analysis"]) >= {"ddtree", "ar-tp8"} and cfg["default_analysis"]["schema"] == "opsctl.analysis/1"
    assert " watch --config /opt/opsctl/watch.json run" in on["opsctl_watch_unit_text"]
    assert "/opt/opsctl/bin/opsctl-onhost.pyz watch" in on["opsctl_watch_unit_text"]
    off = playbook_vars(_host(tmp_path / "b", ""))
    assert off["opsctl_watch_enabled"] is False and off["opsctl_watch_config"] == ""


def test_watch_cli_help_has_examples_and_bad_input_is_one_line():
    for sub in ("status", "pause", "resume"):
        out = subprocess.run([sys.executable, "-m", "opsctl", "watch", sub, "--help"], capture_output=True, text=True,
                             cwd=REPO)
        assert out.returncode == 0 and "Example" in out.stdout and "--json" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "opsctl", "watch", "status", "-i", "/nonexistent"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2
    errs = [x for x in bad.stderr.splitlines() if x.startswith("error:")]
    assert len(errs) == 1 and "fix:" in errs[0]


def test_the_controller_runs_the_watch_from_the_hosts_archive(tmp_path):
    """`opsctl watch status` runs `<root>/bin/opsctl-onhost.pyz watch ... status` with the host's
    python3; a host an older opsctl staged (no archive) has no watch this opsctl can run."""
    from pathlib import PurePosixPath

    from opsctl import watch
    from opsctl.host.connection import LocalConnection
    from opsctl.onhost import ARCHIVE_NAME, archive

    base = _host(tmp_path / "inv")
    root = tmp_path / "root"
    host = base.model_copy(update={"settings": base.settings.model_copy(
        update={"install_root": PurePosixPath(root)})})
    (root / "bin").mkdir(parents=True)
    (root / "watch.json").write_text(json.dumps({**host_config(host), "state_dir": str(tmp_path / "state")}))
    conn = LocalConnection()
    assert watch.brief(conn, host) == {"state": "not installed"}
    (root / "bin" / ARCHIVE_NAME).write_bytes(archive())
    rep = watch._agent(conn, host, "status")
    assert rep["config"]["mode"] == "rollback" and rep["paused"] is None and rep["tripped"] is None
