"""`wheelhouse build --dry-run` names the directory it would write; the lab's host (the SGLang
emulator) is never given a real SGLang set: refused before anything is resolved."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from opsctl import wheelhouse as wh
from opsctl.cli import wheelhouse as wh_cli
from opsctl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture
def calls(monkeypatch):
    """wh.build replaced: records its arguments, resolves nothing, returns an empty set."""
    seen = []

    def fake_build(out, requirements, target, **kw):
        seen.append((out, requirements, kw.get("dry_run")))
        return wh.BuildResult(directory=out, target=target, requirements=requirements, entries=[],
                              dry_run=kw.get("dry_run", False))
    monkeypatch.setattr(wh, "build", fake_build)
    return seen


def test_dry_run_names_the_directory_it_would_write(calls, monkeypatch):
    monkeypatch.chdir(REPO)
    r = runner.invoke(wh_cli.wheelhouse_app, ["build", "--dry-run", "-i", "inventories/blackwell"],
                      terminal_width=200)
    assert r.exit_code == 0, r.output
    (out, reqs, dry), = calls
    assert dry is True and reqs == ["sglang==0.5.23"] and out is not None
    text = " ".join(r.output.split())
    assert f"dry run: would write {Path(out) / wh.LOCK_NAME} and 0 wheel(s) into {out}" in text
    assert "nothing was downloaded or written" in text


def test_the_lab_hosts_wheelhouse_is_refused_before_resolving_the_real_sglang(calls, monkeypatch):
    monkeypatch.chdir(REPO)
    r = runner.invoke(wh_cli.wheelhouse_app, ["build", "--dry-run", "-i", "inventories/lab"])
    assert isinstance(r.exception, ConfigError) and r.exception.exit_code == 2, r.output
    assert "is built by 'opsctl lab up'" in r.exception.problem and "run 'opsctl lab up'" in r.exception.fix
    assert calls == []  # nothing resolved
    # a real set for elsewhere, named with --out, is still allowed
    r = runner.invoke(wh_cli.wheelhouse_app, ["build", "--dry-run", "-i", "inventories/lab", "--out", "/tmp/wh-real"])
    assert r.exit_code == 0, r.output
    assert calls and calls[0][0] == Path("/tmp/wh-real")
