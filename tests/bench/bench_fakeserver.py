"""A stdlib SGLang stand-in for the bench tests: streams `/generate` on a KNOWN
schedule (first SSE event `ttft_s` after the connection is accepted, then one
event every `gap_s`, each carrying `tokens_per_event` tokens, chunked like
uvicorn), answers non-streaming greedy requests with deterministic output ids
(optionally corrupted at one position of one prompt, as a tree-mask bug would),
and serves `/server_info` and `/metrics` with a fixed accept length.

It runs as several single-threaded worker processes blocked in accept() on one
socket, with a minimal raw HTTP parser: on a 2-core CI machine the server's own
CPU time must not move the schedule that is the truth the client is measured
against."""
from __future__ import annotations

import json
import multiprocessing
import socket
import time
from dataclasses import dataclass


def greedy_token(input_ids: list[int], k: int) -> int:
    return (sum(input_ids) * 31 + k * 7919) % 32000


@dataclass
class Schedule:
    ttft_s: float = 0.05
    gap_s: float = 0.01
    tokens_per_event: int = 1
    accept_length: float | None = None       # /server_info, /metrics, meta_info spec_verify_ct
    fail_every: int = 0                      # every n-th streamed request -> HTTP 500
    corrupt_first_token: int | None = None   # the prompt starting with this input id ...
    corrupt_position: int = 0                # ... gets a wrong output token here


def _read_request(c: socket.socket) -> tuple[str, str, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = c.recv(65536)
        if not d:
            raise OSError("closed")
        buf += d
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
    while len(body) < length:
        d = c.recv(65536)
        if not d:
            raise OSError("closed")
        body += d
    return method, path, body[:length]


def _respond(c: socket.socket, status: int, body: bytes, ctype: str = "application/json") -> None:
    c.sendall(b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
        status, ctype.encode(), len(body), body))


def _handle(c: socket.socket, t_accept: float, s: Schedule, counter) -> None:
    method, path, body = _read_request(c)
    if method == "GET" and path == "/server_info":
        st: dict = {"last_gen_throughput": 1.0}
        if s.accept_length is not None:
            st["avg_spec_accept_length"] = s.accept_length
        _respond(c, 200, json.dumps({"internal_states": [st]}).encode())
        return
    if method == "GET" and path == "/metrics":
        lines = ["# TYPE sglang:spec_accept_length gauge"]
        if s.accept_length is not None:
            lines.append('sglang:spec_accept_length{model_name="m",tp_rank="0"} %s' % s.accept_length)
        _respond(c, 200, ("\n".join(lines) + "\n").encode(), "text/plain")
        return
    if method != "POST" or path != "/generate":
        _respond(c, 404, b'{"detail": "Not Found"}')
        return
    req = json.loads(body)
    ids = req.get("input_ids") or [len(req.get("text", ""))]
    max_new = int((req.get("sampling_params") or {}).get("max_new_tokens", 16))
    out = [greedy_token(ids, k) for k in range(max_new)]
    if s.corrupt_first_token is not None and ids[0] == s.corrupt_first_token and s.corrupt_position < len(out):
        out[s.corrupt_position] = (out[s.corrupt_position] + 1) % 32000
    if not req.get("stream"):
        _respond(c, 200, json.dumps({"text": "", "output_ids": out, "meta_info": {
            "prompt_tokens": len(ids), "completion_tokens": len(out)}}).encode())
        return
    with counter.get_lock():
        counter.value += 1
        nreq = counter.value
    if s.fail_every and nreq % s.fail_every == 0:
        _respond(c, 500, b'{"error": "injected"}')
        return
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
              b"Connection: close\r\n\r\n")
    sent = k = 0
    t_first = 0.0
    while sent < max_new:
        delay = t_accept + s.ttft_s + k * s.gap_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent += min(s.tokens_per_event, max_new - sent)
        k += 1
        meta = {"prompt_tokens": len(ids), "completion_tokens": sent}
        if s.accept_length is not None:
            meta["spec_verify_ct"] = k
        # what the server really did (CLOCK_MONOTONIC, the same clock as the client's
        # perf_counter): the truth when the box is too busy to keep the schedule
        t_send = time.perf_counter()
        t_first = t_send if k == 1 else t_first
        meta.update(t_accept=t_accept, t_first=t_first, t_send=t_send)
        ev = b"data: " + json.dumps({"text": "x", "output_ids": out[:sent], "meta_info": meta}).encode() + b"\n\n"
        c.sendall(b"%x\r\n%s\r\n" % (len(ev), ev))
    done = b"data: [DONE]\n\n"
    c.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


class _LocalCounter:
    value = 0

    def get_lock(self):
        import contextlib
        return contextlib.nullcontext()


def _warm(schedule: Schedule) -> None:
    """Run every code path once before accepting: a freshly forked worker's first
    request is milliseconds slower (copy-on-write faults, first calls)."""
    quick = Schedule(ttft_s=0.0, gap_s=0.0, tokens_per_event=schedule.tokens_per_event,
                     accept_length=schedule.accept_length)
    for req in (b"GET /server_info HTTP/1.1\r\n\r\n", b"GET /metrics HTTP/1.1\r\n\r\n",
                *[b"POST /generate HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body) for body in (
                    json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}, "stream": st}).encode()
                    for st in (False, True))]):
        a, b = socket.socketpair()
        try:
            b.sendall(req)
            _handle(a, time.perf_counter(), quick, _LocalCounter())
        finally:
            a.close()
            b.close()


def _serve(schedule: Schedule, lsock: socket.socket, counter) -> None:
    _warm(schedule)
    while True:
        c, _addr = lsock.accept()
        t_accept = time.perf_counter()   # the schedule starts when the connection is accepted
        try:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _handle(c, t_accept, schedule, counter)
        except (OSError, ValueError):
            pass
        finally:
            try:
                c.close()
            except OSError:
                pass


class FakeSGLang:
    """`with FakeSGLang(Schedule(...)) as url:` serves on 127.0.0.1:<ephemeral>
    from `workers` processes, one stream each at a time."""

    def __init__(self, schedule: Schedule | None = None, workers: int = 8):
        self.schedule = schedule or Schedule()
        self.workers = workers
        self.port = 0
        self.procs: list = []

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def __enter__(self) -> str:
        ctx = multiprocessing.get_context("fork")
        lsock = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = lsock.getsockname()[1]
        counter = ctx.Value("i", 0)
        for _ in range(self.workers):
            p = ctx.Process(target=_serve, args=(self.schedule, lsock, counter), daemon=True)
            p.start()
            self.procs.append(p)
        lsock.close()
        return self.url

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.join(timeout=5)
