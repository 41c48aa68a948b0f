"""Host facts (opsctl/host/facts.py): each command's captured output parses to what the
flow, status and the checks act on; gather() asks several in one round trip and keeps
their outputs apart; the commands themselves run in a real shell."""
from __future__ import annotations

import json
import sys

import pytest

from opsctl.errors import HostError
from opsctl.host import facts
from opsctl.host.connection import LocalConnection, Result


class Recorder:
    """A Connection that answers one command with canned output and records what was asked."""

    def __init__(self, stdout: str):
        self.stdout = stdout
        self.commands: list[str] = []

    def run(self, command: str, check: bool = False, timeout: float = 60, **_):
        self.commands.append(command)
        return Result(command, 0, self.stdout)


SYSTEMCTL_SHOW = ("ActiveState=activating\nSubState=start\nNRestarts=0\nMainPID=4242\nResult=success\n"
                  "ActiveEnterTimestamp=\nUnitFileState=enabled\nInvocationID=5f1e\n")


def test_service_state_reads_systemctl_show():
    state = facts.ServiceState("sglang-k26.service").process(SYSTEMCTL_SHOW)
    assert state["ActiveState"] == "activating" and state["MainPID"] == "4242" and state["ActiveEnterTimestamp"] == ""
    assert "-p NRestarts" in facts.ServiceState("sglang-k26.service").command()


@pytest.mark.parametrize("out,want", [("1796125239\n", 1796125239), ("", None), ("n/a\n", None)])
def test_service_start_epoch(out, want):
    assert facts.ServiceStartEpoch("u").process(out) == want


@pytest.mark.parametrize("out,want", [("200\n", 200), ("503\n", 503), ("0\n", 0), ("", 0), ("Traceback\n", 0)])
def test_health_code(out, want):
    assert facts.HealthCode("/usr/bin/python3", 30000).process(out) == want


def test_health_code_asks_a_real_server_and_reads_its_status_line():
    # the probe is a bare-socket HTTP/1.0 request (run by the host's python3): it must read a real
    # server's 503 before ready, its 200 after, and 0 where nothing listens
    import http.server
    import socket
    import sys
    import threading

    answers = [503, 200]

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            code = answers.pop(0) if self.path == "/health_generate" else 404
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probe = facts.HealthCode(sys.executable, server.server_address[1], timeout_s=5)
        conn = LocalConnection()
        assert [probe.process(conn.run(probe.command()).stdout) for _ in range(2)] == [503, 200]
    finally:
        server.shutdown()
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    closed = facts.HealthCode(sys.executable, free, timeout_s=5)
    assert closed.process(LocalConnection().run(closed.command()).stdout) == 0


def test_ready_lines_counts_and_names_the_window():
    fact = facts.ReadyLines("sglang-k26.service", 1796125239)
    assert "--since @1796125239" in fact.command() and "fired up and ready to roll" in fact.command()
    assert fact.process("2\n") == 2 and fact.process("") == 0


def test_journal_window_parses_entries_and_refuses_a_failed_journalctl():
    entry = {"MESSAGE": "The server is fired up and ready to roll!", "__REALTIME_TIMESTAMP": "1796125239000000",
             "_PID": "4242", "SYSLOG_IDENTIFIER": "sglang-k26"}
    got = facts.JournalWindow("u", 1).process(json.dumps(entry) + "\n#rc=0\n")
    assert len(got) == 1 and "ready to roll" in str(got[0])
    with pytest.raises(HostError) as exc:
        facts.JournalWindow("u", 1).process("Failed to add filter\n#rc=1\n")
    assert "journalctl for u failed (exit 1)" in exc.value.problem


def test_journal_window_asks_for_long_fields_whole():
    # issue #49: `-o json` without --all writes a field over 4096 bytes as null, SGLang's server_args
    # line among them: a DDTree start was read as an autoregressive one (tune's outage projection)
    assert " -o json --all " in facts.JournalWindow("sglang-k26", 1).command()


def test_start_journal_of_this_invocation():
    out = "INV=5f1e\nLINES=120\nREADY=1\nFAIL Capture cuda graph failed: CUDA error: out of memory\n"
    got = facts.StartJournal("u").process(out)
    assert got == {"invocation": "5f1e", "lines": 120, "ready": 1,
                   "failures": ["Capture cuda graph failed: CUDA error: out of memory"]}
    assert facts.StartJournal("u").process("INV=\n")["invocation"] == ""


def test_ledger_records_skip_and_report_bad_lines():
    text = '{"action": "promote", "result": "ok"}\n{"action": "rol\n[1, 2]\n\n{"action": "rollback"}\n'
    records, problems = facts.LedgerRecords("/opt/opsctl").process(text)
    assert [r["action"] for r in records] == ["promote", "rollback"]
    assert problems[0].startswith("line 2: not JSON") and problems[1].startswith("line 3: not a record (a JSON list)")


def test_current_release_and_manifests():
    assert facts.CurrentRelease("/opt/opsctl").process("releases/ddtree-b16-abc\n") == "ddtree-b16-abc"
    assert facts.CurrentRelease("/opt/opsctl").process("") is None
    got = facts.ReleaseManifests("/opt/opsctl").process('ar-tp8-1 {"id": "ar-tp8-1"}\nbroken {not json\n')
    assert got == {"ar-tp8-1": {"id": "ar-tp8-1"}}


def test_gpus_and_gpu_processes_from_nvidia_smi():
    gpus = facts.Gpus().process("0, GPU-a, NVIDIA RTX PRO 6000 Blackwell, Workstation Edition, 97887, 512, 580.95.05\n")
    assert gpus[0].name == "NVIDIA RTX PRO 6000 Blackwell, Workstation Edition" and gpus[0].total_mib == 97887
    with pytest.raises(ValueError):
        facts.Gpus().process("0, GPU-a\n")
    apps = facts.GpuProcesses().process("4242, GPU-a, 81234\n4243, GPU-b, [N/A]\nNo running processes found\n")
    assert [(a.pid, a.used_mib) for a in apps] == [(4242, 81234), (4243, 0)]


def test_gather_asks_once_and_keeps_each_output_apart():
    out = ("ActiveState=active\nMainPID=7\n\n--opsctl-fact-0--\n"
           "The server logged an error\nCUDA error: out of memory\n\n--opsctl-fact-1--\n"
           "1\n\n--opsctl-fact-2--\n"
           "200\n\n--opsctl-fact-3--\n")
    conn = Recorder(out)
    state, causes, ready, code = facts.gather(conn, facts.ServiceState("u"), facts.CauseLines("u", 5),
                                              facts.ReadyLines("u", 5), facts.HealthCode("python3", 30000))
    assert len(conn.commands) == 1
    assert state["MainPID"] == "7" and causes[-1] == "CUDA error: out of memory" and ready == 1 and code == 200


def test_gather_in_a_real_shell_isolates_each_command(tmp_path):
    # a fact that cds must not move the next one; a failing one must not stop the rest
    root = tmp_path / "root"
    (root / "releases" / "r1").mkdir(parents=True)
    (root / "releases" / "r1" / "manifest.json").write_text('{"id": "r1"}\n')
    (root / "current").symlink_to("releases/r1")
    (root / "ledger.jsonl").write_text('{"action": "promote"}\n')
    conn = LocalConnection()
    current, manifests, (records, problems), free, missing = facts.gather(
        conn, facts.CurrentRelease(str(root)), facts.ReleaseManifests(str(root)), facts.LedgerRecords(str(root)),
        facts.DiskFree(str(root / "not" / "yet")), facts.CurrentRelease(str(tmp_path / "nothing")))
    assert current == "r1" and manifests == {"r1": {"id": "r1"}}
    assert records == [{"action": "promote"}] and problems == []
    assert isinstance(free, int) and free > 0
    assert missing is None


# --------------------------------------------------------------------------- the ddtree Triton cache (issue #36)


def test_the_gpu_architecture_is_named_as_the_triton_compiler_does():
    fact = facts.GpuArch()
    assert fact.command() == "nvidia-smi --query-gpu=compute_cap --format=csv,noheader"
    assert fact.process("12.0\n12.0\n") == "sm_120" and fact.process("9.0\n") == "sm_90"
    assert fact.process("") is None and fact.process("NVIDIA-SMI has failed\n") is None
    with pytest.raises(HostError, match="different compute capabilities"):
        fact.process("12.0\n9.0\n")


def test_a_json_file_is_an_object_or_none():
    fact = facts.JsonFile("/srv/models/m/config.json")
    assert fact.command() == "cat /srv/models/m/config.json"
    assert fact.process('{"vocab_size": 8}') == {"vocab_size": 8}
    assert fact.process("") is None and fact.process("[1]") is None and fact.process("{broken") is None


def test_package_versions_come_from_metadata_and_a_missing_python_has_none():
    conn = LocalConnection()
    got = facts.get(conn, facts.PythonPackages(sys.executable, ("pytest", "no-such-package-36")))
    assert got["pytest"] and got["no-such-package-36"] is None
    assert facts.get(conn, facts.PythonPackages("/nonexistent/python", ("torch",))) == {"torch": None}
    assert facts.PythonPackages("p", ("torch", "triton")).process('{"torch": "2.9.1", "triton": 3}') == {
        "torch": "2.9.1", "triton": None}


# --------------------------------------------------------------------------- files, and the run's cache (issue #53)

def test_file_facts_on_a_real_shell(tmp_path):
    """The plan's live unit, the baseline's files and a release's bench are read through these:
    absent and empty are told apart, a marker file is only there on a clear yes."""
    conn = LocalConnection()
    (tmp_path / "unit").write_text("[Service]\nExecStart=x\n")
    (tmp_path / "empty").write_text("")
    (tmp_path / "ar-tp8.random.jsonl").write_text('{"record": "meta", "workload_mix": "chat"}\nrest\n')
    (tmp_path / "ar-tp8.code.jsonl").write_text('{"record": "meta", "workload_mix": "code"}\n')
    (tmp_path / "ar-ep8.random.jsonl").write_text('{"record": "meta"}\n')
    assert facts.get(conn, facts.TextFile(str(tmp_path / "unit"))) == "[Service]\nExecStart=x\n"
    assert facts.get(conn, facts.TextFile(str(tmp_path / "empty"))) == ""
    assert facts.get(conn, facts.TextFile(str(tmp_path / "nothing"))) is None
    assert facts.get(conn, facts.IsFile(str(tmp_path / "empty"))) is True
    assert facts.get(conn, facts.IsFile(str(tmp_path))) is False
    assert facts.get(conn, facts.NonEmptyFiles((str(tmp_path / "unit"), str(tmp_path / "empty")))) is False
    assert facts.get(conn, facts.NonEmptyFiles((str(tmp_path / "unit"),))) is True
    assert facts.get(conn, facts.FirstLines(str(tmp_path), "ar-tp8", ".jsonl")) == [
        '{"record": "meta", "workload_mix": "code"}', '{"record": "meta", "workload_mix": "chat"}']
    assert facts.get(conn, facts.FirstLines(str(tmp_path / "none"), "ar-tp8", ".jsonl")) == []
    # in one round trip, a file's own blank lines and the framing kept apart
    (tmp_path / "blank").write_text("\n\nx\n\n")
    got = facts.gather(conn, facts.TextFile(str(tmp_path / "blank")), facts.TextFile(str(tmp_path / "nothing")),
                       facts.IsFile(str(tmp_path / "unit")))
    assert got == ("\n\nx\n\n", None, True)


def test_output_cut_short_is_no_file_and_no_marker():
    assert facts.TextFile("/x").process("") is None
    assert facts.IsFile("/x").process("") is False and facts.NonEmptyFiles(("/x",)).process("") is False


class Counting(LocalConnection):
    def __init__(self):
        self.commands: list[str] = []

    def run(self, command, **kw):
        self.commands.append(command)
        return super().run(command, **kw)


def test_the_runs_cache_reads_each_fact_once(tmp_path):
    (tmp_path / "f").write_text("one\n")
    conn = Counting()
    with facts.cached(conn):
        assert facts.get(conn, facts.TextFile(str(tmp_path / "f"))) == "one\n"
        (tmp_path / "f").write_text("two\n")       # a block that changes the host must forget()
        assert facts.get(conn, facts.TextFile(str(tmp_path / "f"))) == "one\n"
        assert len(conn.commands) == 1
        # gather sends only what is not read yet, and answers in the order asked
        got = facts.gather(conn, facts.IsFile(str(tmp_path / "f")), facts.TextFile(str(tmp_path / "f")))
        assert got == (True, "one\n") and len(conn.commands) == 2 and "cat" not in conn.commands[-1]
        with facts.cached(conn):                     # nested: the outer cache
            assert facts.get(conn, facts.IsFile(str(tmp_path / "f"))) is True and len(conn.commands) == 2
        facts.forget(conn)
        assert facts.get(conn, facts.TextFile(str(tmp_path / "f"))) == "two\n" and len(conn.commands) == 3
    assert facts.get(conn, facts.TextFile(str(tmp_path / "f"))) == "two\n" and len(conn.commands) == 4
    facts.get(conn, facts.TextFile(str(tmp_path / "f")))
    assert len(conn.commands) == 5                   # outside a block every ask goes to the host
