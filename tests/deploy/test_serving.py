"""What the DDTree runtime serves against what the live release means (issue #50 item 2), on plain data:
the /server_info fact's script run against a stub server, and the intent of each kind of release."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from opsctl import serving
from opsctl.releases import ReleaseInfo


def _serve(doc):
    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps(doc).encode()
            self.send_response(200 if self.path == "/server_info" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _fact_against(doc):
    srv = _serve(doc)
    try:
        fact = serving.ServingDDTree(sys.executable, srv.server_address[1], timeout_s=5)
        out = subprocess.run(["bash", "-c", fact.command()], capture_output=True, text=True, timeout=30).stdout
        return fact.process(out)
    finally:
        srv.shutdown()


def test_the_fact_reads_the_runtimes_ddtree_state_from_server_info():
    got = _fact_against({"internal_states": [{"ddtree": {"active": "1:16,2:8", "trial_set": True,
                                                         "last_refusal": "budget 31 was not captured"}}]})
    assert got == {"active": "1:16,2:8", "trial_set": True, "last_refusal": "budget 31 was not captured"}
    assert _fact_against({"internal_states": [{"load": 0}]}) is None        # not a DDTree server
    assert serving.ServingDDTree(sys.executable, 1).process("") is None     # no answer


def _rel(rid, **profile):
    return ReleaseInfo(rid, {"profile": {"name": "ddtree", "kind": "ddtree", **profile}})


def test_what_a_release_means_to_serve():
    assert serving.intended(_rel("b16", budget=16), []) == "16"
    assert serving.intended(_rel("s", budget=16, budget_schedule="1:16,2:8"), []) == "1:16,2:8"
    trial = _rel("t", budget=16, trial_set=["8", "16", "1:16,2:8"])
    assert serving.intended(trial, []) == "8"                                   # its trial set's first
    applied = [{"action": "promote", "result": "ok", "to_release": "t", "ddtree_active": "1:16,2:8"}]
    assert serving.intended(trial, applied) == "1:16,2:8"                       # tune --apply's winner
    assert serving.intended(ReleaseInfo("ar", {"profile": {"name": "ar-tp8", "kind": "autoregressive"}}), []) is None
    assert serving.same("16", "1:16") and not serving.same("8", "16") and not serving.same("1:16,2:8", "16")
    assert serving.as_budget("16") == (16, None) and serving.as_budget("1:16,2:8") == (None, "1:16,2:8")
