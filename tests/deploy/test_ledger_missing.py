"""Issue #32 item 8: a deleted (or emptied) ledger is reported as such by `status` and
`rollback`, with the releases on disk and what the operator can do (`rollback --to RELEASE`);
it used to read as "never judged, last good none" and "nothing to roll back to"."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hostdirs import current, host_config, make_current, read_ledger, release
from opsctl.config import Inventory
from opsctl.errors import ConfigError
from opsctl.flow import inspect, promote
from opsctl.host.connection import LocalConnection
from opsctl.integrity import Integrity
from opsctl.releases import HostState, ReleaseInfo, read_state


@pytest.fixture
def lost(tmp_path, monkeypatch):
    """Five releases on disk, one live, the ledger deleted."""
    root = tmp_path / "root"
    for i, rid in enumerate(("ar-tp8-a1", "ddtree-b16-a2", "ddtree-b8-a3", "ddtree-b4-a4", "ddtree-b12-a5")):
        release(root, rid, rid.rsplit("-", 1)[0], created=f"2026-11-0{i + 1}T00:00:00Z")
    make_current(root, "ddtree-b12-a5")
    host = host_config(tmp_path, root)
    monkeypatch.setattr(inspect, "connect", lambda h: LocalConnection())
    monkeypatch.setattr(promote, "connect", lambda h: LocalConnection())
    return SimpleNamespace(root=root, host=host, inv_dir=tmp_path / "inv",
                           inv=Inventory(path=Path("inv"), name="inv", hosts={"lab": host}, groups={}))


def test_read_state_knows_the_ledger_is_gone(lost):
    state = read_state(LocalConnection(), lost.host)
    assert state.ledger_exists is False and state.ledger_lost is True and len(state.releases) == 5
    (lost.root / "ledger.jsonl").write_text("")
    state = read_state(LocalConnection(), lost.host)
    assert state.ledger_exists is True and state.ledger_lost is True     # emptied: the same
    assert HostState(current=None).ledger_lost is False                   # a new host: nothing lost
    assert HostState(current="a", releases={"a": ReleaseInfo("a", {})},
                     ledger=[{"action": "promote"}]).ledger_lost is False


def test_status_reports_the_missing_ledger_and_lists_the_releases_on_disk(lost):
    from opsctl.cli.deploy import _verdict_cell

    row = inspect.status(lost.inv)[0]
    led = row["ledger"]
    assert led["lost"] is True and led["exists"] is False and led["path"] == f"{lost.root}/ledger.jsonl"
    assert f"the ledger {lost.root}/ledger.jsonl on lab is missing" in led["problem"]
    for rid in ("ar-tp8-a1", "ddtree-b16-a2", "ddtree-b8-a3", "ddtree-b4-a4", "ddtree-b12-a5"):
        assert rid in led["problem"]
    assert "ddtree-b12-a5 (ddtree-b12, 2026-11-05T00:00:00Z, live)" in led["problem"]
    assert [r["id"] for r in row["releases_on_disk"]][0] == "ddtree-b12-a5" and row["releases_on_disk"][0]["live"]
    assert _verdict_cell(row) == "unknown (ledger missing)"   # not "never judged"


def test_status_on_the_command_line_names_the_fix(lost, monkeypatch, capsys):
    from opsctl import cli

    monkeypatch.setattr(sys, "argv", ["opsctl", "status", "-i", str(lost.inv_dir)])
    try:
        cli.main()
    except SystemExit as exc:   # main() exits only on an error
        assert exc.code in (0, None)
    err = capsys.readouterr()
    assert "ledger.jsonl on lab is missing" in err.err and "opsctl rollback --to RELEASE" in err.err
    assert "unknown (ledger missing)" in err.out and "never judged" not in err.out + err.err


def test_rollback_without_a_target_refuses_naming_the_releases_and_the_fix(lost):
    with pytest.raises(ConfigError) as exc:
        promote.rollback_host(lost.host, None, "manual", None)
    line = exc.value.one_line()
    assert exc.value.exit_code == 2 and "\n" not in line
    assert "is missing (deleted?)" in line and "ar-tp8-a1 (ar-tp8" in line and "ddtree-b4-a4" in line
    assert "(fix: pick one of them: 'opsctl rollback --to RELEASE'" in line
    assert current(lost.root) == "ddtree-b12-a5" and not (lost.root / "ledger.jsonl").exists()


def test_rollback_to_a_named_release_works_and_starts_a_new_ledger(lost, monkeypatch):
    switched: list[str] = []
    monkeypatch.setattr(promote, "switch", lambda conn, host, rel, **kw: switched.append(rel) or make_current(lost.root, rel)
                        or 0)
    monkeypatch.setattr(promote, "disarm_guard", lambda conn, host: None)
    monkeypatch.setattr(promote, "wait_ready", lambda *a, **k: SimpleNamespace(seconds=1.0))
    monkeypatch.setattr(promote, "check_release_files", lambda conn, host, rel, quick=False: Integrity(rel))
    recs = promote.rollback_host(lost.host, "ar-tp8-a1", "ledger lost", None)
    assert switched == ["ar-tp8-a1"] and current(lost.root) == "ar-tp8-a1"
    assert [(r["action"], r["result"], r["to_release"]) for r in read_ledger(lost.root)] == \
        [("rollback", "ok", "ar-tp8-a1")] == [(r["action"], r["result"], r["to_release"]) for r in recs]
