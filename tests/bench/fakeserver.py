"""A stdlib SGLang stand-in for the bench tests: streams `/generate` on a KNOWN
schedule (first event at `ttft_s` after the request arrives, then one event
every `gap_s`, each carrying `tokens_per_event` tokens), answers non-streaming
greedy requests with deterministic output ids (optionally corrupted at one
prompt/position, as a tree-mask bug would), and serves `/server_info` and
`/metrics` with a fixed accept length."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def greedy_token(input_ids: list[int], k: int) -> int:
    return (sum(input_ids) * 31 + k * 7919) % 32000


@dataclass
class Schedule:
    ttft_s: float = 0.05
    gap_s: float = 0.01
    tokens_per_event: int = 1
    accept_length: float | None = None       # /server_info, /metrics, meta_info
    fail_every: int = 0                      # every n-th streamed request -> HTTP 500
    corrupt: tuple[int, int] | None = None   # (prompt index by first token order, position) -> wrong token
    corrupt_first_token: int | None = None   # corrupt the prompt whose first input id is this
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    sched: Schedule

    def log_message(self, *a):  # quiet
        pass

    def setup(self):
        self.t_accept = time.perf_counter()   # the schedule starts when the connection is accepted
        super().setup()

    def _send_json(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        s = self.sched
        if self.path == "/server_info":
            st = {"last_gen_throughput": 1.0}
            if s.accept_length is not None:
                st["avg_spec_accept_length"] = s.accept_length
            self._send_json({"internal_states": [st]})
        elif self.path == "/metrics":
            lines = ["# TYPE sglang:spec_accept_length gauge"]
            if s.accept_length is not None:
                lines.append('sglang:spec_accept_length{model_name="m",tp_rank="0"} %s' % s.accept_length)
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._send_json({"error": "not found"}, 404)

    def do_POST(self):
        t_arrive = self.t_accept
        s = self.sched
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n))
        ids = req.get("input_ids") or [len(req.get("text", ""))]
        sp = req.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 16))
        out = [greedy_token(ids, k) for k in range(max_new)]
        if s.corrupt_first_token is not None and ids[0] == s.corrupt_first_token and s.corrupt is not None:
            pos = s.corrupt[1]
            if pos < len(out):
                out[pos] = (out[pos] + 1) % 32000
        with s.lock:
            s.requests += 1
            nreq = s.requests
        if not req.get("stream"):
            self._send_json({"text": "", "output_ids": out,
                             "meta_info": {"prompt_tokens": len(ids), "completion_tokens": len(out)}})
            return
        if s.fail_every and nreq % s.fail_every == 0:
            self._send_json({"error": "injected"}, 500)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        k = 0
        verify = 0
        while sent < max_new:
            due = t_arrive + s.ttft_s + k * s.gap_s
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            step = min(s.tokens_per_event, max_new - sent)
            sent += step
            verify += 1
            meta = {"prompt_tokens": len(ids), "completion_tokens": sent}
            if s.accept_length is not None:
                meta["spec_verify_ct"] = verify
            ev = b"data: " + json.dumps({"text": "x", "output_ids": out[:sent], "meta_info": meta}).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            k += 1
        done = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


class FakeSGLang:
    """`with FakeSGLang(Schedule(...)) as url:` serves on 127.0.0.1:<ephemeral>."""

    def __init__(self, schedule: Schedule | None = None):
        self.schedule = schedule or Schedule()
        handler = type("H", (_Handler,), {"sched": self.schedule})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def __enter__(self) -> str:
        self.thread.start()
        return self.url

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
