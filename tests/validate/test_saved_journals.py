"""Issue #49 on real journals of the lab (tests/validate/data/lab_journals/, saved by
test_saved_journals_lab.py): across a deploy, a rollback and a tune every start is a clean one (the
switch stops the server with `systemctl kill`: no `Stopping` line), one real crash is exactly one
restart, and a `-o json` file saved without `--all` is refused with the fix."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl import journal
from opsctl.errors import ConfigError
from opsctl.journal_findings import expectations_from_log, validate_startup
from validate_lines import DATA

LAB = DATA / "lab_journals"
REPO = Path(__file__).resolve().parents[2]


def saved(name: str, kind: str, tmp_path: Path) -> Path:
    """The saved file as an operator has it (the JSON ones are gzipped in the repository)."""
    if kind == "text":
        return LAB / f"{name}.journal.txt"
    out = tmp_path / f"{name}.journal.{kind}"
    out.write_bytes(gzip.decompress((LAB / f"{name}.journal.{kind}.gz").read_bytes()))
    return out


def restarts_of(seg) -> object:
    expect = expectations_from_log(seg)
    return next(f for f in validate_startup(seg, expect) if f.check == "startup.restarts")


@pytest.mark.parametrize("kind", ["text", "json-all"])
def test_a_deploy_a_rollback_and_a_tune_are_clean_starts_not_restarts(kind, tmp_path):
    parsed = journal.load_file(saved("deploy-rollback-tune", kind, tmp_path))
    segs = journal.starts(parsed)
    # the baseline's tail, the deploy (ddtree b16), the rollback, the tune's trial and its restore
    assert len(segs) == 5
    assert not segs[0].server_args and [len(s.server_args) for s in segs[1:]] == [1, 1, 1, 1]
    assert [s.restarts for s in segs] == [0] * 5
    assert all(restarts_of(s).ok for s in segs[1:])
    # each switch is a requested stop: `systemctl kill` ("... on client request"), no `Stopping`
    stops = [e for e in parsed.unit_events if e.kind == "stopping"]
    assert len(stops) == 4 and all("on client request" in e.line.text for e in stops)
    # read whole, the four switches are four new server processes: what the operator saw
    assert parsed.restarts == 4


@pytest.mark.parametrize("kind", ["text", "json-all"])
def test_one_real_crash_is_exactly_one_restart(kind, tmp_path):
    segs = journal.starts(journal.load_file(saved("deploy-rollback-tune-crash", kind, tmp_path)))
    assert len(segs) == 6  # the five above and `systemctl restart` with the crash_after fault
    assert [s.restarts for s in segs] == [0, 0, 0, 0, 0, 1]
    found = restarts_of(segs[-1])
    assert not found.ok and "restarted 1 time(s)" in found.diagnosis, found.diagnosis
    assert "status=1/FAILURE" in found.diagnosis
    assert all(restarts_of(s).ok for s in segs[1:-1])


def _cli(path: Path, *args: str) -> tuple[int, dict, str]:
    p = subprocess.run([sys.executable, "-m", "opsctl", "validate", "--from-file", str(path), *args, "--json"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    docs = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return p.returncode, (docs[-1] if docs else {}), p.stderr


@pytest.mark.parametrize("kind", ["text", "json-all"])
def test_validate_from_file_passes_the_clean_file_and_fails_the_crash_once(kind, tmp_path):
    rc, doc, err = _cli(saved("deploy-rollback-tune", kind, tmp_path), "--start", "all")
    assert rc == 0 and doc["ok"] and doc["starts"] == 5, err
    assert "start 1 of 5 began before the file" in err
    restarts = [f for f in doc["findings"] if f["check"].endswith("startup.restarts")]
    assert len(restarts) == 4 and all(f["ok"] for f in restarts)
    rc, doc, err = _cli(saved("deploy-rollback-tune-crash", kind, tmp_path), "--start", "all")
    failed = [f for f in doc["findings"] if f["check"].endswith("startup.restarts") and not f["ok"]]
    assert rc == 6 and [f["check"] for f in failed] == ["start6.startup.restarts"], err
    assert "restarted 1 time(s)" in failed[0]["diagnosis"]


def test_json_saved_without_all_is_refused_with_the_fix(tmp_path):
    path = saved("deploy-rollback-tune", "json", tmp_path)
    with pytest.raises(ConfigError) as exc:
        journal.load_file(path)
    assert "4 of 437 journal entries have MESSAGE null" in exc.value.problem
    assert "without --all" in exc.value.problem and "-o json --all" in exc.value.fix
    rc, _, err = _cli(path)
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and "--all" in lines[0], err
