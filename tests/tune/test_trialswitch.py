"""The live switch on the host (opsctl/trialswitch.py): the control file written atomically with the
content the runtime parses, and the wait against a stand-in for SGLang's HTTP API that applies the
control file at a decode-step meeting, as the runtime does (runtime/README.md, "Trial set and live
switch"). The files opsctl writes are read back with the runtime's own parser (its pure-Python
modules, loaded without torch)."""
from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from opsctl import trialset, trialswitch
from opsctl.errors import CheckFailed, HostError
from opsctl.host.connection import LocalConnection
from hostdirs import host_config

REPO = Path(__file__).resolve().parents[2]


def runtime_trialset():
    """sglang_ddtree.trialset from runtime/src, without the package's __init__ (it imports torch)."""
    if "sglang_ddtree.trialset" not in sys.modules:
        pkg = types.ModuleType("sglang_ddtree")
        pkg.__path__ = [str(REPO / "runtime/src/sglang_ddtree")]
        sys.modules.setdefault("sglang_ddtree", pkg)
    return importlib.import_module("sglang_ddtree.trialset")


# --------------------------------------------------------------------------- the control file


def test_control_write_is_atomic_and_names_the_candidate(tmp_path):
    path = tmp_path / "shared/control/ddtree-active-0123456789.json"
    conn = LocalConnection()
    trialswitch.write_control(conn, str(path), "8")   # the directory is made
    assert json.loads(path.read_text()) == {"active": "8"}
    first = os.stat(path).st_ino
    trialswitch.write_control(conn, str(path), "1:16,3:4,16:0")
    # a rename over the path (a new inode): the runtime never reads a half-written file
    assert os.stat(path).st_ino != first
    assert json.loads(path.read_text()) == {"active": "1:16,3:4,16:0"}
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]   # no temporary file left
    assert oct(path.stat().st_mode & 0o777) == "0o644"                     # the service user reads it
    assert trialswitch.read_control(conn, str(path)) == "1:16,3:4,16:0"


def test_a_control_file_that_cannot_be_written_is_one_host_error(tmp_path):
    (tmp_path / "shared").write_text("a file where the directory should be")
    with pytest.raises(HostError) as exc:
        trialswitch.write_control(LocalConnection(), str(tmp_path / "shared/control/x.json"), "8")
    assert exc.value.problem.startswith(f"could not write the DDTree control file {tmp_path}/shared/control/x.json")
    assert "\n" not in exc.value.problem


def test_the_runtime_parses_the_files_opsctl_writes_and_switches_on_the_control_file(tmp_path):
    rt = runtime_trialset()
    cands = ("4", "8", "16", "1:16,3:4,16:0")
    ts = rt.TrialSet.from_json(json.loads(trialset.trial_set_json(cands)), "ddtree-trialset.json")
    assert ts.names == list(cands) and ts.names[ts.active] == "4"
    ts.check_num_draft_tokens(trialset.max_budget(cands) + 1)   # the render's --speculative-num-draft-tokens
    path = tmp_path / "control.json"
    trialswitch.write_control(LocalConnection(), str(path), "1:16,3:4,16:0")
    active = rt.ActiveCandidate(ts, control=rt.ControlFile(str(path), 0.0), every_steps=16)
    for _ in range(16):
        active.begin_step()
    assert active.name == "1:16,3:4,16:0" and active.since_step == 16
    assert rt.parse_control(trialset.control_json("32")).name == "32"


# --------------------------------------------------------------------------- the wait


class FakeSGLang:
    """/server_info with the DDTree status and /generate; a meeting every `every` decode steps reads the
    control file and switches, or refuses a candidate the trial set did not capture."""

    def __init__(self, control: Path, candidates: list[str], *, every: int = 16, applies: bool = True):
        self.control, self.candidates, self.every, self.applies = control, candidates, every, applies
        self.status = {"active": candidates[0], "since_step": 0, "decode_steps": 0, "trial_set": True,
                       "candidates": candidates, "last_refusal": None}
        self.generated = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, doc):
                body = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send({"version": "0.5.23", "internal_states": [{"ddtree": dict(fake.status)}]})

            def do_POST(self):
                doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.generated += 1
                for _ in range(doc["sampling_params"]["max_new_tokens"] // 4):   # accept length 4
                    fake.step()
                self._send({"output_ids": [1] * doc["sampling_params"]["max_new_tokens"]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def step(self):
        st = self.status
        st["decode_steps"] += 1
        if not self.applies or st["decode_steps"] % self.every or not self.control.exists():
            return
        want = json.loads(self.control.read_text())["active"]
        if want not in self.candidates:
            st["last_refusal"] = f"budget {want} was not captured (captured: {', '.join(self.candidates)})"
        elif want != st["active"]:
            st["active"], st["since_step"] = want, st["decode_steps"]

    def close(self):
        self.server.shutdown()


@pytest.fixture
def sglang(tmp_path):
    servers = []

    def make(**kw):
        s = FakeSGLang(tmp_path / "shared/control/active.json", ["4", "8", "16"], **kw)
        servers.append(s)
        return s, host_config(tmp_path, tmp_path / "root", port=s.port)

    yield make
    for s in servers:
        s.close()


def test_switch_live_sends_warm_up_requests_until_the_server_names_the_candidate(sglang):
    server, host = sglang()
    sw = trialswitch.switch_live(LocalConnection(), host, server.control, "8", timeout_s=20)
    assert sw.candidate == "8" and server.status["active"] == "8"
    # an idle server applies a control file only at a decode-step meeting: the wait drove the steps
    assert sw.warmup_requests >= 1 and server.generated == sw.warmup_requests
    assert sw.since_step == server.status["since_step"] and sw.since_step % 16 == 0


def test_switch_live_to_what_serves_already_sends_nothing(sglang):
    server, host = sglang()
    sw = trialswitch.switch_live(LocalConnection(), host, server.control, "4", timeout_s=20)
    assert sw.warmup_requests == 0 and server.generated == 0


def test_a_refused_candidate_fails_at_once_with_the_runtimes_reason(sglang):
    server, host = sglang()
    with pytest.raises(CheckFailed) as exc:
        trialswitch.switch_live(LocalConnection(), host, server.control, "32", timeout_s=60)
    assert exc.value.problem == ("the runtime refused the switch to 32: budget 32 was not captured (captured: 4, 8, "
                                 "16)")
    assert server.generated < 10   # not the whole timeout of warm-up requests


def test_a_switch_that_never_applies_times_out_with_what_serves(sglang):
    server, host = sglang(applies=False)
    with pytest.raises(CheckFailed) as exc:
        trialswitch.switch_live(LocalConnection(), host, server.control, "16", timeout_s=1.5)
    assert exc.value.problem.startswith("no switch to 16 within 1.5 s: still serving 4 after ")
    assert "switch_timeout_s" in exc.value.fix


def test_a_server_without_ddtree_state_is_named_as_such(tmp_path):
    sw_out = json.dumps({"result": "timeout", "status": None, "sent": 0, "seconds": 2.0,
                         "error": "ConnectionRefusedError: [Errno 111] Connection refused"})
    with pytest.raises(CheckFailed) as exc:
        trialswitch.parse_wait(sw_out + "\n", "8", 2.0)
    assert exc.value.problem == ("no switch to 8 within 2 s: /server_info shows no DDTree state "
                                 "(ConnectionRefusedError: [Errno 111] Connection refused)")
    assert "--restart-per-trial" in exc.value.fix
