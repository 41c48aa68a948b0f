"""Issue #32 item 5: the guard (and every rollback) records `ok` only for a release that became
ready after the switch to it; else `failed`, and the next fallback is tried; `status` says the
live release is not ready instead of showing its old verdict `pass`."""
from __future__ import annotations

import http.server
import importlib.machinery
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from hostdirs import REPO, current, host_config, install_programs, make_current, read_ledger, release, write_ledger
from opsctl.errors import DeployFailed
from opsctl.flow import promote, switch as switch_mod
from opsctl.flow.steps import Steps
from opsctl.host.connection import LocalConnection
from opsctl.integrity import Integrity
from opsctl.releases import HostState, ReleaseInfo

READY = "The server is fired up and ready to roll!"


def load_guard():
    path = REPO / "playbooks/files/opsctl-guard"
    loader = importlib.machinery.SourceFileLoader("opsctl_guard", str(path))
    spec = importlib.util.spec_from_loader("opsctl_guard", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


guard = load_guard()

UP = ({"ActiveState": "active", "SubState": "running", "NRestarts": "0", "MainPID": "42"}, True, 200)
CRASHING = ({"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "0", "MainPID": "0"}, False, 0)


class FakeHost(guard.Host):
    """The guard's host I/O on a tmp install root: switches flip the link, probes answer per release."""

    def __init__(self, args, states: dict, damaged: dict | None = None, switch_rc: int = 0):
        super().__init__(args)
        self.states, self.damaged, self.switch_rc = states, damaged or {}, switch_rc
        self.records: list[dict] = []
        self.switched: list[str] = []

    def append(self, record):
        self.records.append(record)
        return True

    def verify(self, release):
        return self.damaged.get(release, [])

    def switch(self, release):
        if self.switch_rc:
            return self.switch_rc, "only 0 MiB free under ROOT, a switch needs 16 MiB"
        make_current(Path(self.root), release)
        self.switched.append(release)
        return 0, ""

    def epoch(self):
        return 1000

    def probe(self, since):
        return self.states[current(Path(self.root))]

    def serving_now(self):
        return self.states.get(current(Path(self.root)), CRASHING)[2] == 200

    def sleep(self, seconds):
        pass


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "root"
    for rid, created in (("ar-tp8-base", "2026-11-01T00:00:00Z"), ("ddtree-b16-good", "2026-11-02T00:00:00Z"),
                         ("ddtree-b8-new", "2026-11-03T00:00:00Z")):
        release(root, rid, rid.rsplit("-", 1)[0], created=created)
    make_current(root, "ddtree-b8-new")
    return root


def _args(root: Path, *fallbacks: str, expect: str = "ddtree-b8-new"):
    return guard.parse(["--root", str(root), "--service", "sglang-k26", "--host", "lab", "--port", "1",
                        "--expect", expect, "--", *fallbacks])


def test_a_fallback_that_does_not_start_is_recorded_failed_and_the_next_one_serves(root):
    args = _args(root, "ddtree-b16-good", "ar-tp8-base")
    host = FakeHost(args, {"ddtree-b16-good": CRASHING, "ar-tp8-base": UP})
    assert guard.revert(host, args) == 0
    assert host.switched == ["ddtree-b16-good", "ar-tp8-base"] and current(root) == "ar-tp8-base"
    first, second = host.records
    assert first["action"] == "rollback" and first["result"] == "failed" and first["switched"] is True
    assert first["to_release"] == "ddtree-b16-good" and first["from_release"] == "ddtree-b8-new"
    assert "auto-restart" in first["error"] and first["reason"] == "guard-timeout"
    assert second["result"] == "ok" and second["to_release"] == "ar-tp8-base"
    assert second["from_release"] == "ddtree-b16-good" and second["tried"] == ["ddtree-b16-good"]


def test_no_fallback_ready_records_every_failure_and_exits_1(root):
    args = _args(root, "ddtree-b16-good", "ar-tp8-base")
    host = FakeHost(args, {"ddtree-b16-good": CRASHING, "ar-tp8-base": CRASHING})
    assert guard.revert(host, args) == 1
    assert [(r["to_release"], r["result"]) for r in host.records] == [("ddtree-b16-good", "failed"),
                                                                      ("ar-tp8-base", "failed")]
    assert not any(r["result"] == "ok" for r in host.records)


def test_a_damaged_fallback_is_not_switched_to(root):
    args = _args(root, "ddtree-b16-good", "ar-tp8-base")
    host = FakeHost(args, {"ar-tp8-base": UP}, damaged={"ddtree-b16-good": ["site/x.py: sha256 1, the manifest says 2"]})
    assert guard.revert(host, args) == 0
    assert host.switched == ["ar-tp8-base"]
    assert host.records[0]["result"] == "failed" and host.records[0]["switched"] is False
    assert "site/x.py" in host.records[0]["error"] and host.records[1]["result"] == "ok"


def test_no_room_to_switch_changes_and_records_nothing(root):
    args = _args(root, "ddtree-b16-good")
    host = FakeHost(args, {"ddtree-b16-good": UP}, switch_rc=guard.NO_ROOM)
    assert guard.revert(host, args) == guard.NO_ROOM
    assert host.records == [] and current(root) == "ddtree-b8-new"


def test_a_guard_whose_release_is_no_longer_live_does_nothing(root):
    make_current(root, "ddtree-b16-good")
    args = _args(root, "ar-tp8-base")
    host = FakeHost(args, {"ar-tp8-base": UP})
    assert guard.revert(host, args) == 0
    assert host.switched == [] and host.records[0]["action"] == "guard" and host.records[0]["result"] == "unchanged"


@pytest.mark.parametrize("props,why", [
    ({"ActiveState": "activating", "SubState": "start", "NRestarts": "1", "MainPID": "7"}, "restarted 1 time"),
    ({"ActiveState": "failed", "SubState": "failed", "NRestarts": "0", "MainPID": "0"}, "exited during startup"),
    ({"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "0", "MainPID": "0"}, "auto-restart"),
])
def test_wait_ready_fails_a_start_as_the_controller_does(root, props, why):
    host = FakeHost(_args(root), {"ddtree-b8-new": (props, False, 0)})
    ready_s, err = guard.wait_ready(host, 0, timeout=60)
    assert ready_s is None and why in err


def test_wait_ready_times_out_and_a_pid_change_is_a_failed_start(root):
    host = FakeHost(_args(root), {"ddtree-b8-new": ({"ActiveState": "activating", "SubState": "start",
                                                     "NRestarts": "0", "MainPID": "7"}, False, 0)})
    assert "not ready within 0 s" in guard.wait_ready(host, 0, timeout=0)[1]
    pids = iter(["7", "8"])
    host.probe = lambda since: ({"ActiveState": "activating", "SubState": "start", "NRestarts": "0",
                                 "MainPID": next(pids)}, False, 0)
    assert "PID 7 -> 8" in guard.wait_ready(host, 0, timeout=60)[1]
    host.probe = lambda since: UP
    assert guard.wait_ready(host, 0, timeout=60)[1] is None


# --------------------------------------------------------------------------- the armed guard, end to end


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200 if self.path == "/health_generate" else 404)
        self.end_headers()

    def log_message(self, *a):
        pass


def _fake_bin(tmp_path: Path, root: Path, crashing: set[str]) -> Path:
    """systemctl and journalctl that answer for the release `current` points at."""
    fb = tmp_path / "fakebin"
    fb.mkdir()
    bad = " ".join(crashing)
    (fb / "systemctl").write_text(f"""#!/bin/bash
rel=$(basename "$(readlink {root}/current)")
case " {bad} " in *" $rel "*) printf 'ActiveState=activating\\nSubState=auto-restart\\nNRestarts=0\\nMainPID=0\\n';;
  *) printf 'ActiveState=active\\nSubState=running\\nNRestarts=0\\nMainPID=4242\\n';; esac
""")
    (fb / "journalctl").write_text(f"""#!/bin/bash
rel=$(basename "$(readlink {root}/current)")
case " {bad} " in *" $rel "*) echo 'RuntimeError: boom';; *) echo '{READY}';; esac
""")
    for f in fb.iterdir():
        f.chmod(0o755)
    return fb


def test_the_armed_guard_command_reverts_to_the_first_fallback_that_becomes_ready(tmp_path, root):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        host = host_config(tmp_path, root, port=srv.server_port)
        binp = install_programs(root)
        # a switch on this machine may not touch systemd: the stub flips the link as opsctl-switch does
        (binp / "opsctl-switch").write_text('#!/bin/bash\nln -sfn "releases/$3" "$1/.current.new" && '
                                            'mv -T "$1/.current.new" "$1/current"\n')
        sent: list[str] = []
        conn = SimpleNamespace(run=lambda cmd, check=True: sent.append(cmd))
        switch_mod.arm_guard(conn, host, ["ddtree-b16-good", "ar-tp8-base"], 30, expect="ddtree-b8-new")
        argv = shlex.split(sent[0].split("systemd-run", 1)[1])
        assert argv[argv.index("flock"):][:3] == ["flock", "-w", "900"]
        prog = argv[argv.index("flock") + 4:]  # after: flock -w 900 <lock>
        assert prog[0] == sys.executable and prog[1] == f"{root}/bin/opsctl-guard"
        env = {"PATH": f"{_fake_bin(tmp_path, root, {'ddtree-b16-good'})}:/usr/bin:/bin"}
        res = subprocess.run(prog, capture_output=True, text=True, timeout=120, env=env)
    finally:
        srv.shutdown()
        srv.server_close()
    assert res.returncode == 0, res.stderr
    assert current(root) == "ar-tp8-base"
    recs = read_ledger(root)
    assert [(r["to_release"], r["result"]) for r in recs] == [("ddtree-b16-good", "failed"), ("ar-tp8-base", "ok")]
    assert recs[0]["who"] == "opsctl-guard@lab" and recs[0]["host"] == "lab" and "auto-restart" in recs[0]["error"]
    # and status tells the truth in between: had the guard stopped after the first, the live release is not ready
    st = HostState(current="ddtree-b16-good", releases={r: ReleaseInfo(r, {}) for r in ("ddtree-b16-good",)},
                   ledger=[{"action": "verdict", "status": "pass", "release": "ddtree-b16-good"},
                           {"action": "promote", "result": "ok", "to_release": "ddtree-b16-good"}, recs[0]])
    assert st.live_not_ready() == recs[0] and st.judged("ddtree-b16-good") is False


# --------------------------------------------------------------------------- the controller's rollbacks


def _state(current_rel: str, *good: str) -> HostState:
    rels = {r: ReleaseInfo(r, {"profile": {"name": r.rsplit("-", 1)[0]}, "created_at": r}) for r in
            ("ar-tp8-base", "ddtree-b16-good", "ddtree-b12-older", "ddtree-b8-new")}
    ledger = [{"action": "promote", "result": "ok", "to_release": g} for g in reversed(good)]
    return HostState(current=current_rel, releases=rels, ledger=ledger)


@pytest.fixture
def io(monkeypatch):
    log: list = []
    not_ready: set[str] = set()

    def wait(conn, host, profile, since, steps):
        if [x[1] for x in log if x[0] == "switch"][-1] in not_ready:
            raise DeployFailed(f"{host.name}: start failed: the server exited during startup (auto-restart)")
        return SimpleNamespace(seconds=1.0)

    monkeypatch.setattr(promote, "switch", lambda conn, host, rel, **kw: log.append(("switch", rel)) or 0)
    monkeypatch.setattr(promote, "disarm_guard", lambda conn, host: log.append(("disarm", None)))
    monkeypatch.setattr(promote, "wait_ready", wait)
    monkeypatch.setattr(promote, "release_profile", lambda info, host: None)
    monkeypatch.setattr(promote, "check_release_files", lambda conn, host, rel, quick=False: Integrity(rel))
    monkeypatch.setattr(promote, "append_ledger", lambda conn, host, rec: log.append(("ledger", dict(rec))) or rec)
    return SimpleNamespace(log=log, not_ready=not_ready)


def _host():
    return SimpleNamespace(name="lab", baseline_profile="ar-tp8", unit_name="sglang-k26.service")


def test_the_rollback_after_a_failed_gate_tries_the_next_fallback(io):
    io.not_ready.add("ddtree-b16-good")
    state = _state("ddtree-b8-new", "ddtree-b16-good", "ddtree-b12-older")
    plan = SimpleNamespace(release="ddtree-b8-new", profile=SimpleNamespace(name="ddtree", budget=8), state=state)
    out = promote.roll_back_after_failure(object(), _host(), plan, "ddtree-b16-good", "gate failed", None,
                                          Steps(None, "lab"))
    ledger = [x[1] for x in io.log if x[0] == "ledger"]
    assert [(r["to_release"], r["result"]) for r in ledger] == [("ddtree-b16-good", "failed"),
                                                                ("ddtree-b12-older", "ok")]
    assert ledger[1]["from_release"] == "ddtree-b16-good" and ledger[1]["tried"] == ["ddtree-b16-good"]
    assert "rolled back to ddtree-b12-older, which serves again" in out and "ddtree-b16-good" in out
    assert [x for x in io.log if x[0] == "disarm"] == [("disarm", None)]   # once, after the first switch


def test_the_rollback_after_a_failed_gate_says_when_nothing_became_ready(io):
    io.not_ready.update({"ddtree-b16-good", "ar-tp8-base"})
    plan = SimpleNamespace(release="ddtree-b8-new", profile=SimpleNamespace(name="ddtree", budget=8),
                           state=_state("ddtree-b8-new", "ddtree-b16-good"))
    out = promote.roll_back_after_failure(object(), _host(), plan, ["ddtree-b16-good", "ar-tp8-base"], "gate failed",
                                          None, Steps(None, "lab"))
    assert "rollback FAILED" in out and "ar-tp8-base is live and does NOT serve" in out
    assert all(x[1]["result"] == "failed" for x in io.log if x[0] == "ledger")


def test_a_manual_rollback_whose_target_does_not_start_fails_and_the_next_one_serves(io, monkeypatch):
    io.not_ready.add("ddtree-b16-good")
    state = _state("ddtree-b8-new", "ddtree-b8-new", "ddtree-b16-good", "ddtree-b12-older")
    monkeypatch.setattr(promote, "connect", lambda host: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(promote, "read_state", lambda conn, host: state)
    monkeypatch.setattr(promote, "require_room", lambda conn, host, doing="": None)
    monkeypatch.setattr(promote, "HostLock", lambda conn, host, action: _NullLock())
    with pytest.raises(DeployFailed) as exc:
        promote.rollback_host(_host(), None, "manual", None)
    assert exc.value.exit_code == 5
    assert "rollback to ddtree-b16-good failed" in exc.value.problem and "ddtree-b12-older serves instead" in exc.value.problem
    ledger = [x[1] for x in io.log if x[0] == "ledger"]
    assert [(r["to_release"], r["result"]) for r in ledger] == [("ddtree-b16-good", "failed"),
                                                                ("ddtree-b12-older", "ok")]
    # the release the operator rolled back from comes last, after every other fallback
    assert ("switch", "ddtree-b8-new") not in io.log


def test_a_manual_rollback_goes_back_to_where_it_came_from_last(io, monkeypatch):
    io.not_ready.update({"ddtree-b16-good", "ddtree-b12-older"})
    state = _state("ar-tp8-base", "ar-tp8-base", "ddtree-b16-good", "ddtree-b12-older")
    monkeypatch.setattr(promote, "connect", lambda host: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(promote, "read_state", lambda conn, host: state)
    monkeypatch.setattr(promote, "require_room", lambda conn, host, doing="": None)
    monkeypatch.setattr(promote, "HostLock", lambda conn, host, action: _NullLock())
    with pytest.raises(DeployFailed, match="ar-tp8-base serves instead"):
        promote.rollback_host(_host(), "ddtree-b16-good", "manual", None)
    assert [x[1] for x in io.log if x[0] == "switch"] == ["ddtree-b16-good", "ddtree-b12-older", "ar-tp8-base"]


class _NullLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


# --------------------------------------------------------------------------- status


def test_status_says_the_live_release_is_not_ready_not_its_old_verdict(tmp_path, root, monkeypatch):
    from opsctl.cli.deploy import _verdict_cell
    from opsctl.flow import inspect

    host = host_config(tmp_path, root)
    make_current(root, "ddtree-b16-good")
    write_ledger(root, {"action": "verdict", "status": "pass", "release": "ddtree-b16-good", "ts": "t0"},
                 {"action": "promote", "result": "ok", "to_release": "ddtree-b16-good"},
                 {"action": "deploy", "result": "started", "to_release": "ddtree-b8-new"},
                 {"action": "rollback", "result": "failed", "switched": True, "from_release": "ddtree-b8-new",
                  "to_release": "ddtree-b16-good", "reason": "guard-timeout", "ts": "t1",
                  "error": "the server exited during startup and systemd scheduled a restart (auto-restart)"})
    monkeypatch.setattr(inspect, "connect", lambda h: LocalConnection())
    row = inspect.status(_single(host))[0]
    assert row["live_not_ready"]["error"].endswith("(auto-restart)") and row["live_not_ready"]["reason"] == "guard-timeout"
    assert row["last_verdict"]["status"] == "pass"     # its gate then ...
    assert _verdict_cell(row) == "NOT READY (rollback failed)"   # ... but status does not show it as `pass`
    # a later switch to it that became ready clears it
    write_ledger(root, {"action": "rollback", "result": "ok", "to_release": "ddtree-b16-good"})
    assert inspect.status(_single(host))[0]["live_not_ready"] is None


def _single(host):
    from opsctl.config import Inventory

    return Inventory(path=Path("inv"), name="inv", hosts={host.name: host}, groups={})


def test_the_guard_program_is_installed_by_the_prepare_playbook():
    play = (REPO / "playbooks/prepare.yml").read_text()
    assert "bin/opsctl-guard" in play and "bin/opsctl-verify" in play
    assert json.dumps(switch_mod.GUARD_PROGRAM) == '"opsctl-guard"'


def test_a_record_that_did_not_switch_says_nothing_about_what_is_live():
    """A fallback skipped for damaged files (or a deploy failed before its switch) is recorded with
    `switched: false`: check post's current-vs-ledger, `judged` and `live_not_ready` look past it."""
    from opsctl.checks import logic

    skipped = {"action": "rollback", "result": "failed", "switched": False, "from_release": "a", "to_release": "b",
               "error": "its files differ from its manifest: site/x.py"}
    ledger = [{"action": "promote", "result": "ok", "to_release": "b"},
              {"action": "promote", "result": "ok", "to_release": "a"}, skipped]
    assert logic.last_switch_record(ledger)["to_release"] == "a"
    st = HostState(current="a", releases={r: ReleaseInfo(r, {}) for r in "ab"}, ledger=ledger)
    assert st.judged("a") and st.judged("b") and st.live_not_ready() is None
    before_switch = {"action": "deploy", "result": "failed", "switched": False, "to_release": "c", "from_release": "a"}
    assert logic.last_switch_record(ledger + [before_switch])["to_release"] == "a"


# issue #50: when every fallback fails, the release that served when the guard began (it was ready)
def test_every_fallback_failing_restarts_the_release_that_served_when_the_guard_began(root):
    args = _args(root, "ddtree-b16-good", "ar-tp8-base")
    host = FakeHost(args, {"ddtree-b8-new": UP, "ddtree-b16-good": CRASHING, "ar-tp8-base": CRASHING})
    assert guard.revert(host, args) == 0
    assert host.switched == ["ddtree-b16-good", "ar-tp8-base", "ddtree-b8-new"] and current(root) == "ddtree-b8-new"
    last = host.records[-1]
    assert last["action"] == "rollback" and last["result"] == "ok" and last["last_resort"] is True
    assert last["to_release"] == "ddtree-b8-new" and last["from_release"] == "ar-tp8-base"
    assert last["tried"] == ["ddtree-b16-good", "ar-tp8-base"] and "last resort" in last["note"]
    # a release that was not serving when the guard began is no last resort: the host stays as it is
    args = _args(root, "ddtree-b16-good", "ar-tp8-base")
    make_current(root, "ddtree-b8-new")
    host = FakeHost(args, {"ddtree-b8-new": CRASHING, "ddtree-b16-good": CRASHING, "ar-tp8-base": CRASHING})
    assert guard.revert(host, args) == 1 and host.switched == ["ddtree-b16-good", "ar-tp8-base"]
    assert not any(r.get("last_resort") for r in host.records)


def test_fallbacks_never_switched_to_leave_the_serving_release_alone_as_the_last_resort(root):
    args = _args(root, "ddtree-b16-good", "ar-tp8-base")
    bad = ["sglang.env: sha256 1, the manifest says 2"]
    host = FakeHost(args, {"ddtree-b8-new": UP}, damaged={"ddtree-b16-good": bad, "ar-tp8-base": bad})
    assert guard.revert(host, args) == 0
    assert host.switched == [] and current(root) == "ddtree-b8-new"
    last = host.records[-1]
    assert last["last_resort"] is True and last["result"] == "ok" and last["restart"] is False


def test_a_guard_waits_for_a_switch_in_flight_and_acts_on_what_it_made(root):
    """A controller killed mid-switch frees the deploy lock while bin/opsctl-switch still runs: the
    guard waits on the switch's own lock, then reads what is live (here: the switch made the
    rollback, so there is nothing to revert), never the half-made state before it."""
    import fcntl
    import threading

    args = _args(root, "ar-tp8-base")
    host = FakeHost(args, {"ar-tp8-base": UP})
    fd = os.open(root / ".switch.lock", os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)   # the rollback's switch, in flight
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(guard.revert(host, args)))
    t.start()
    t.join(0.6)
    assert t.is_alive() and not done and host.switched == [] and host.records == []
    make_current(root, "ar-tp8-base")   # the switch flips, then releases its lock
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    t.join(10)
    assert done == [0] and host.switched == []
    assert host.records[0]["result"] == "unchanged" and host.records[0]["live"] == "ar-tp8-base"
