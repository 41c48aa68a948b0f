"""A journal spanning several starts of the service (`journalctl -u UNIT > FILE` across deploys
and rollbacks) is read per start: a clean stop followed by a start is not a restart; systemd's
restart after a crash is."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from opsctl import journal
from opsctl.config import resolve_profile
from opsctl.cli import validate as validate_cli
from opsctl.errors import CheckFailed, ConfigError
from opsctl.journal_findings import validate_startup
from validate_lines import DATA

UNIT = "sglang-k26-ddtree.service"


def stop(t: str, *, exit_failure: bool = False) -> str:
    """A deliberate stop, as a deploy's switch or a rollback does it (systemctl restart/stop)."""
    lines = [f"May 30 {t} blackwell systemd[1]: Stopping {UNIT} - SGLang DDTree..."]
    if exit_failure:  # a server that exits 1 on SIGTERM: still a requested stop, not a crash
        lines += [f"May 30 {t} blackwell systemd[1]: {UNIT}: Main process exited, code=exited, status=1/FAILURE",
                  f"May 30 {t} blackwell systemd[1]: {UNIT}: Failed with result 'exit-code'."]
    lines += [f"May 30 {t} blackwell systemd[1]: {UNIT}: Deactivated successfully.",
              f"May 30 {t} blackwell systemd[1]: Stopped {UNIT} - SGLang DDTree."]
    return "\n".join(lines) + "\n"


@pytest.fixture
def whole(tmp_path):
    """Three deploys (three deliberate starts); the third crashed once (capture OOM) and systemd
    restarted it: one real restart in the file."""
    healthy = (DATA / "ddtree_b16_healthy.journal.txt").read_text()
    crash = (DATA / "ddtree_b16_capture_oom_restart.journal.txt").read_text()
    f = tmp_path / "whole.journal.txt"
    f.write_text(healthy + stop("00:30:00") + healthy.replace("113022", "114000")
                 + stop("00:40:00", exit_failure=True) + crash)
    return f


def test_the_file_is_cut_at_each_deliberate_start_and_only_the_crash_is_a_restart(whole):
    parsed = journal.load_file(whole)
    segs = journal.starts(parsed)
    assert len(segs) == 3
    restarts = [next(f for f in validate_startup(s, resolve_profile("ddtree", 16)) if f.check == "startup.restarts") for s in segs]
    assert [f.ok for f in restarts] == [True, True, False]
    assert "restarted 1 time(s)" in restarts[2].diagnosis
    assert sum(max(s.restarts, 0) for s in segs) == 1
    # read whole, as before, the deploys' switches counted as crashes
    assert parsed.restarts > 1


def test_a_crash_restart_without_a_requested_stop_stays_in_its_start():
    parsed = journal.load_file(DATA / "ddtree_b16_capture_oom_restart.journal.txt")
    (seg,) = journal.starts(parsed)
    assert seg is parsed and seg.restarts == 1


@pytest.fixture
def run():
    from opsctl.cli import _output

    app = typer.Typer()
    validate_cli.register(app)

    @app.callback()
    def _root() -> None:
        pass

    def invoke(*args: str):
        result = CliRunner().invoke(app, ["validate", *args])
        _output.set_json(False)
        exc = result.exception
        code = exc.exit_code if isinstance(exc, (CheckFailed, ConfigError)) else result.exit_code
        return code, result.stdout, exc
    return invoke


def test_validate_reads_the_last_start_by_default_and_every_start_with_start_all(run, whole):
    args = ("--from-file", str(whole), "--profile", "ddtree", "--budget", "16", "--only", "startup", "--json")
    code, out, _ = run(*args)
    data = json.loads(out)
    failed = [f for f in data["findings"] if not f["ok"]]
    assert code == 6 and data["starts"] == 3 and data["validated_starts"] == [3]
    restart = next(f for f in failed if f["check"] == "startup.restarts")
    assert "restarted 1 time(s)" in restart["diagnosis"]
    code, out, exc = run(*args[:-1][:-2], "--start", "1", "--json")
    assert code == 0, exc
    assert json.loads(out)["validated_starts"] == [1]
    code, out, _ = run(*args, "--start", "all")
    data = json.loads(out)
    bad = {f["check"] for f in data["findings"] if not f["ok"]}
    assert data["validated_starts"] == [1, 2, 3]
    assert "start3.startup.restarts" in bad and not any(c.startswith(("start1.", "start2.")) for c in bad)
    code, _, exc = run(*args, "--start", "4")
    assert code == 2 and "holds 3 start(s)" in exc.problem and "--start all" in exc.fix
