"""opsctl's version (issue #53): one copy (opsctl/__init__.py, read by pyproject.toml), printed by
`opsctl --version`, the newest released section of CHANGELOG.md, and carried by what a deploy
writes on the host (the release's manifest.json, every ledger record the controller appends),
which `opsctl status` shows. Checked from this source tree, not from an installed copy's metadata
(the shared .venv's editable install was built at another version)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from hostdirs import REPO, host_config, make_current, read_ledger, release
import opsctl
from opsctl.config import Inventory
from opsctl.host.connection import LocalConnection


def test_the_version_is_written_once_and_pyproject_reads_it():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "opsctl.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", opsctl.__version__)
    emulator = REPO / "opsctl/lab/emulator"   # the emulated SGLang's own version (0.5.23+lab)
    hits = [p for p in (REPO / "opsctl").rglob("*.py")
            if emulator not in p.parents and re.search(r"^__version__\s*=", p.read_text(), re.M)]
    assert hits == [REPO / "opsctl/__init__.py"]


def test_the_version_is_the_newest_release_in_the_changelog():
    text = (REPO / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)$", text, re.M)
    assert released[0][0] == opsctl.__version__
    assert text.index("## [Unreleased]") < text.index(f"## [{opsctl.__version__}]")
    versions = [tuple(map(int, v.split("."))) for v, _ in released]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    dates = [d for _, d in released]
    assert dates == sorted(dates, reverse=True)


def test_opsctl_version_prints_it():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "opsctl", "--version"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"opsctl {opsctl.__version__}"


def test_the_release_manifest_and_every_ledger_record_carry_it(tmp_path):
    from opsctl.flow.plan import make_plan
    from opsctl.ledger import append_ledger

    root = tmp_path / "root"
    host = host_config(tmp_path, root)
    env = root / "shared/envs/sglang-0.5.23"
    env.mkdir(parents=True)
    (env / ".opsctl-complete").touch()
    plan = make_plan(LocalConnection(), host, host.profile("ar-tp8"))
    assert plan.manifest()["opsctl_version"] == opsctl.__version__
    # the version is not in the rendered files: it must not change the release id (a new opsctl
    # would restart a host whose serving did not change)
    assert not any(opsctl.__version__ in text for text in plan.rendered.release_files.values())
    append_ledger(LocalConnection(), host, {"action": "promote", "release": plan.release})
    assert read_ledger(root)[-1]["opsctl_version"] == opsctl.__version__


@pytest.fixture
def live(tmp_path, monkeypatch):
    from opsctl.flow import inspect

    root = tmp_path / "root"
    release(root, "ar-tp8-old", created="2026-12-01T00:00:00Z")
    release(root, "ar-tp8-new", created="2026-12-02T00:00:00Z")
    for rid, version in (("ar-tp8-old", None), ("ar-tp8-new", "0.6.0")):
        mpath = root / "releases" / rid / "manifest.json"
        m = json.loads(mpath.read_text())
        if version:
            m["opsctl_version"] = version
        mpath.write_text(json.dumps(m))
    make_current(root, "ar-tp8-new")
    host = host_config(tmp_path, root)
    monkeypatch.setattr(inspect, "connect", lambda h: LocalConnection())
    return SimpleNamespace(root=root, inv_dir=tmp_path / "inv",
                           inv=Inventory(path=Path("inv"), name="inv", hosts={"lab": host}, groups={}))


def test_status_shows_the_opsctl_that_built_each_release(live, monkeypatch, capsys):
    from opsctl import cli
    from opsctl.flow import inspect

    row = inspect.status(live.inv)[0]
    assert row["release"] == "ar-tp8-new" and row["opsctl_version"] == "0.6.0"
    assert {r["id"]: r["opsctl_version"] for r in row["releases_on_disk"]} == {"ar-tp8-new": "0.6.0",
                                                                              "ar-tp8-old": None}
    monkeypatch.setattr(sys, "argv", ["opsctl", "status", "-i", str(live.inv_dir), "--json"])
    try:
        cli.main()
    except SystemExit as exc:
        assert exc.code in (0, None)
    assert json.loads(capsys.readouterr().out)[0]["opsctl_version"] == "0.6.0"
    monkeypatch.setattr(sys, "argv", ["opsctl", "status", "-i", str(live.inv_dir)])
    try:
        cli.main()
    except SystemExit as exc:
        assert exc.code in (0, None)
    out = capsys.readouterr()
    assert f"ar-tp8-new was built by opsctl 0.6.0; this is opsctl {opsctl.__version__}" in out.out + out.err
