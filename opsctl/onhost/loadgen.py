"""Stdlib-only load generator and greedy canary for SGLang's native `/generate`.

Part of the host-side package (opsctl/onhost/): shipped to the inference host in
`<root>/bin/opsctl-onhost.pyz` and run there with the host's `python3` (on-host load
keeps the network out of the numbers), and imported by opsctl on the controller. It
must therefore depend on nothing but the standard library (Python >= 3.8): asyncio and
raw HTTP/1.1 over sockets; `/metrics` is read by the package's one Prometheus parser.

    python3 opsctl-onhost.pyz loadgen --url http://127.0.0.1:30000 --concurrency 1,8,32 \
        --input-len 128 --output-len 64 --requests-per-level 32 --repeats 3 \
        --warmup 4 --seed 0 [--prompt-file F] [--canary-file F] --json

With `--json`, stdout carries one JSON object per line:
  * one line per (repeat, concurrency level), `"record": "level"`, with the
    field names of `sglang.bench_serving --output-file` (request_throughput,
    output_throughput, {mean,median,std,p90,p95,p99}_{e2e_latency,ttft,tpot,itl}_ms,
    concurrency, accept_length, max_output_tokens_per_s, completed, duration,
    total_input_tokens, total_output_tokens, max_concurrency, ...) plus extras
    (repeat, errors, error_samples, metrics_accept_length, request_accept_length,
    level_accept_length, ...);
  * with a canary, one line `"record": "canary"` with the prompts, the greedy
    outputs and, when the canary file carried reference outputs, the first mismatch.
Progress goes to stderr. The exit status is 0 when the run completed (errors are
data, reported in the lines), 2 on bad arguments, 3 when the server is unreachable.

Timing follows bench_serving: TTFT is the time from sending the request to the
first SSE event carrying tokens; a later event carrying n new tokens (speculative
decoding can emit several per step) contributes n inter-token latencies of
gap/n each; E2E ends at `data: [DONE]` (or the end of the stream); TPOT is
(E2E - TTFT) / (output_len - 1). Percentiles use linear interpolation (numpy's
default). `concurrency` is bench_serving's *effective* concurrency
(sum of E2E / duration); the configured level is `max_concurrency`.

Accept length, per level:
  * accept_length          `/server_info` internal_states[0].avg_spec_accept_length
                           read after the level (bench_serving's field; it is the
                           server's cumulative average since start);
  * metrics_accept_length  `/metrics`: the delta of sglang:generation_tokens_total /
                           sglang:spec_verify_calls_total over the level when both
                           counters exist, else the sglang:spec_accept_length gauge;
  * request_accept_length  sum(completion_tokens) / sum(spec_verify_ct) over this
                           level's requests (meta_info of the final SSE event);
  * level_accept_length    the first of request, metrics, server_info that exists.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from . import prometheus

__all__ = [
    "LoadSpec", "RequestResult", "ProgressEvent", "run", "run_async", "run_level", "compute_metrics",
    "make_prompts", "load_prompt_file", "canary_prompts", "run_canary", "run_canary_async",
    "compare_canary", "fetch_accept_lengths", "http_json", "main",
]

LOADGEN_VERSION = 1
BACKEND = "opsctl-loadgen"
_MAX_HEADER = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024
_READ_SIZE = 64 * 1024
_COMPLETION_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


# --------------------------------------------------------------------------- specs
@dataclass
class LoadSpec:
    """What to run. Every loop is bounded by counts and by the timeouts here."""

    url: str = "http://127.0.0.1:30000"
    concurrency: List[int] = field(default_factory=lambda: [1, 4, 16])
    input_len: int = 128
    output_len: int = 64
    requests_per_level: int = 16       # at least `concurrency` requests run per level
    repeats: int = 1
    warmup: int = 2
    seed: int = 0
    vocab_low: int = 1000              # random token ids are drawn from [vocab_low, vocab_high)
    vocab_high: int = 30000
    prompt_file: Optional[str] = None
    requests_file: Optional[str] = None  # JSON lines {level, repeat, workload, messages|input_ids, max_tokens}
    canary_only: bool = False            # run the greedy canary alone (no warm-up, no levels)
    request_timeout_s: float = 300.0   # one request, from connect to [DONE]
    idle_timeout_s: float = 60.0       # the longest silence inside one stream
    level_timeout_s: float = 1800.0    # one level; requests past it are errors
    ignore_eos: bool = True
    canary_file: Optional[str] = None  # prompts (+ reference outputs) for the greedy canary
    canary_prompts: int = 0            # or generate this many canary prompts from the seed
    canary_input_len: int = 64
    canary_output_len: int = 32
    tag: Optional[str] = None

    def requests_for(self, concurrency: int) -> int:
        return max(int(self.requests_per_level), int(concurrency))

    def validate(self) -> None:
        if not self.concurrency or any(int(c) < 1 for c in self.concurrency):
            raise ValueError("concurrency levels must be positive integers")
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError("--input-len and --output-len must be >= 1")
        if self.repeats < 1 or self.repeats > 100:
            raise ValueError("--repeats must be within 1..100")
        if self.requests_per_level < 1 or self.requests_per_level > 1_000_000:
            raise ValueError("--requests-per-level must be within 1..1000000")
        if self.warmup < 0 or self.warmup > 10_000:
            raise ValueError("--warmup must be within 0..10000")
        if not (0 <= self.vocab_low < self.vocab_high):
            raise ValueError("vocab range must satisfy 0 <= low < high")
        for t in (self.request_timeout_s, self.idle_timeout_s, self.level_timeout_s):
            if not (t > 0):
                raise ValueError("timeouts must be positive")
        _split_url(self.url)


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    start_time: float = 0.0            # perf_counter at send
    ttft: float = 0.0                  # s
    latency: float = 0.0               # s, E2E
    itl: List[float] = field(default_factory=list)
    output_len: int = 0
    prompt_len: int = 0
    spec_verify_ct: int = 0
    output_ids: List[int] = field(default_factory=list)
    meta: Dict[str, Any] = field(default_factory=dict)   # meta_info of the final event
    workload: str = ""


@dataclass
class ProgressEvent:
    """`kind` is one of warmup_start, warmup_end, level_start, request_done,
    level_end, canary_start, canary_request_done, canary_end."""

    kind: str
    concurrency: int = 0
    repeat: int = 0
    done: int = 0
    total: int = 0
    errors: int = 0
    record: Optional[Dict[str, Any]] = None


ProgressFn = Callable[[ProgressEvent], None]


# --------------------------------------------------------------------------- HTTP
def _split_url(url: str) -> Tuple[str, int, str]:
    parts = urlsplit(url if "://" in url else "http://" + url)
    if parts.scheme != "http":
        raise ValueError("only http:// URLs are supported (run on the host or through a tunnel): %r" % url)
    if not parts.hostname:
        raise ValueError("URL has no host: %r" % url)
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


class _HTTPError(Exception):
    pass


async def _read_more(reader: asyncio.StreamReader, deadline: float, idle: float) -> bytes:
    remaining = deadline - time.perf_counter()
    if remaining <= 0:
        raise asyncio.TimeoutError()
    return await asyncio.wait_for(reader.read(_READ_SIZE), min(remaining, idle))


class _Watchdog:
    """Aborts a stream's transport at its deadline or after `idle` seconds without
    data. One timer per idle period instead of a wait_for() per read, which is
    a third of the client's CPU per token at C=256."""

    def __init__(self, transport: Any, deadline: float, idle: float):
        self.loop = asyncio.get_running_loop()
        self.transport, self.deadline, self.idle = transport, deadline, idle
        self.last = time.perf_counter()
        self.fired = False
        self.handle = None
        self._arm()

    def _arm(self) -> None:
        due = min(self.deadline, self.last + self.idle)
        self.handle = self.loop.call_later(max(0.0, due - time.perf_counter()), self._check)

    def _check(self) -> None:
        now = time.perf_counter()
        if now < self.deadline and now - self.last < self.idle:
            self._arm()
            return
        self.fired = True
        self.transport.abort()

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()


async def _open_request(host: str, port: int, method: str, path: str, body: Optional[bytes],
                        deadline: float, idle: float, accept: str = "application/json"):
    """Connect, send, read the status line and headers. Returns
    (status, headers, reader, writer, leftover_body_bytes, mode, length)."""
    remaining = max(0.001, deadline - time.perf_counter())
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), min(remaining, idle))
    try:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        head = "%s %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: opsctl-loadgen/%d\r\nAccept: %s\r\nConnection: close\r\n" % (
            method, path or "/", host, port, LOADGEN_VERSION, accept)
        if body is not None:
            head += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        writer.write(head.encode("latin-1") + b"\r\n" + (body or b""))
        await writer.drain()
        buf = b""
        while b"\r\n\r\n" not in buf:
            if len(buf) > _MAX_HEADER:
                raise _HTTPError("response header too large")
            data = await _read_more(reader, deadline, idle)
            if not data:
                raise _HTTPError("connection closed before the response header")
            buf += data
        head_b, rest = buf.split(b"\r\n\r\n", 1)
        lines = head_b.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise _HTTPError("bad status line %r" % lines[0][:80])
        status = int(parts[1])
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            mode, length = "chunked", -1
        elif "content-length" in headers:
            mode, length = "length", int(headers["content-length"])
        else:
            mode, length = "close", -1
        return status, headers, reader, writer, rest, mode, length
    except BaseException:
        writer.close()
        raise


class _BodyDecoder:
    """Incremental decoder of an HTTP/1.1 body (chunked, Content-Length, or until close)."""

    def __init__(self, mode: str, length: int):
        self.mode = mode
        self.remaining = length
        self.buf = bytearray()
        self.chunk_left = 0        # bytes of the current chunk still to come
        self.need_crlf = False
        self.done = False

    def feed(self, data: bytes) -> bytes:
        if self.mode == "close":
            return data
        if self.mode == "length":
            out = data[: max(0, self.remaining)]
            self.remaining -= len(out)
            if self.remaining <= 0:
                self.done = True
            return bytes(out)
        self.buf += data
        out = bytearray()
        while not self.done:
            if self.chunk_left > 0:
                take = min(self.chunk_left, len(self.buf))
                if take == 0:
                    break
                out += self.buf[:take]
                del self.buf[:take]
                self.chunk_left -= take
                if self.chunk_left == 0:
                    self.need_crlf = True
                continue
            if self.need_crlf:
                if len(self.buf) < 2:
                    break
                del self.buf[:2]
                self.need_crlf = False
                continue
            nl = self.buf.find(b"\r\n")
            if nl < 0:
                if len(self.buf) > 4096:
                    raise _HTTPError("bad chunk size line")
                break
            size_s = bytes(self.buf[:nl]).split(b";", 1)[0].strip()
            del self.buf[: nl + 2]
            try:
                size = int(size_s, 16)
            except ValueError:
                raise _HTTPError("bad chunk size %r" % size_s[:20])
            if size == 0:
                self.done = True
                break
            self.chunk_left = size
        return bytes(out)


async def http_request(url: str, method: str = "GET", path: str = "", payload: Any = None,
                       timeout: float = 30.0) -> Tuple[int, bytes]:
    """One non-streaming request; returns (status, body). Raises on network errors."""
    host, port, prefix = _split_url(url)
    body = json.dumps(payload).encode() if payload is not None else None
    deadline = time.perf_counter() + timeout
    status, _h, reader, writer, rest, mode, length = await _open_request(
        host, port, method, prefix + path, body, deadline, timeout)
    try:
        dec = _BodyDecoder(mode, length)
        out = bytearray(dec.feed(rest))
        while not dec.done:
            data = await _read_more(reader, deadline, timeout)
            if not data:
                break
            out += dec.feed(data)
            if len(out) > _MAX_BODY:
                raise _HTTPError("response body too large")
        return status, bytes(out)
    finally:
        writer.close()


async def http_json(url: str, path: str, payload: Any = None, timeout: float = 30.0) -> Any:
    method = "POST" if payload is not None else "GET"
    status, body = await http_request(url, method, path, payload, timeout)
    if status != 200:
        raise _HTTPError("%s %s -> HTTP %d: %s" % (method, path, status, body[:200].decode("utf-8", "replace")))
    return json.loads(body)


# --------------------------------------------------------------------------- one streamed request
async def stream_generate(url: str, payload: Dict[str, Any], timeout: float = 300.0,
                          idle_timeout: float = 60.0, deadline: Optional[float] = None,
                          keep_output_ids: bool = False, path: str = "/generate") -> RequestResult:
    """POST a streaming `/generate` (or `/v1/chat/completions`, path=...) and time every SSE
    event. Never raises for server or network failures: they come back as
    `success=False, error=...`."""
    res = RequestResult()
    chat = path.endswith("/chat/completions")
    host, port, prefix = _split_url(url)
    body = json.dumps(dict(payload, stream=True)).encode()
    chunks = 0          # chat: content chunks (one per decode step that produced text)
    usage_tokens = -1   # chat: usage.completion_tokens of the final chunk
    dog: Optional[_Watchdog] = None
    st = time.perf_counter()
    res.start_time = st
    dl = st + timeout if deadline is None else min(deadline, st + timeout)
    writer = None
    try:
        status, _h, reader, writer, rest, mode, length = await _open_request(
            host, port, "POST", prefix + path, body, dl, idle_timeout, accept="text/event-stream")
        if status != 200:
            dec = _BodyDecoder(mode, length)
            text = dec.feed(rest)
            while not dec.done and len(text) < 4096:
                data = await _read_more(reader, dl, idle_timeout)
                if not data:
                    break
                text += dec.feed(data)
            res.error = "HTTP %d: %s" % (status, text[:300].decode("utf-8", "replace").strip())
            return res
        dec = _BodyDecoder(mode, length)
        if time.perf_counter() >= dl:
            raise asyncio.TimeoutError()
        dog = _Watchdog(writer.transport, dl, idle_timeout)
        sse = bytearray()
        last_len = 0
        most_recent = st
        last_event: Optional[bytes] = None
        finished = False
        data = rest
        while True:
            now = time.perf_counter()
            if data:
                sse += dec.feed(data)
                if len(sse) > _MAX_BODY:
                    raise _HTTPError("SSE event larger than %d bytes" % _MAX_BODY)
                if b"\r" in sse:
                    sse = bytearray(sse.replace(b"\r\n", b"\n"))
                while True:
                    cut = sse.find(b"\n\n")
                    if cut < 0:
                        break
                    event = bytes(sse[:cut])
                    del sse[: cut + 2]
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        chunk = line[5:].strip()
                        if chunk == b"[DONE]":
                            finished = True
                            continue
                        if b'"error"' in chunk[:32]:
                            err = json.loads(chunk).get("error")
                            if err is not None:
                                res.error = "server error: %s" % (json.dumps(err)[:300],)
                                return res
                        if chat:
                            obj = json.loads(chunk)
                            usage = obj.get("usage")
                            if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                                usage_tokens = int(usage["completion_tokens"])
                                res.prompt_len = int(usage.get("prompt_tokens") or 0)
                            ext = (obj.get("sglext") or {}).get("spec_tokens_details")
                            if isinstance(ext, dict):
                                res.spec_verify_ct = int(ext.get("spec_verify_ct") or 0)
                            choices = obj.get("choices") or []
                            if not (choices and (choices[0].get("delta") or {}).get("content")):
                                continue
                            chunks += 1
                            if chunks == 1:
                                res.ttft = now - st
                            else:
                                res.itl.append(now - most_recent)  # per chunk; rescaled to tokens below
                            most_recent = now
                            last_len = chunks
                            continue
                        m = _COMPLETION_RE.search(chunk)
                        if m is not None:
                            n = int(m.group(1))
                        else:  # no meta_info.completion_tokens: count events that carry tokens
                            n = last_len + 1
                        last_event = chunk
                        if n > last_len:
                            if last_len == 0:
                                res.ttft = now - st
                            else:
                                gap = (now - most_recent) / (n - last_len)
                                res.itl.extend([gap] * (n - last_len))
                            most_recent = now
                            last_len = n
                if finished or dec.done:
                    break
            data = await reader.read(_READ_SIZE)
            if not data:
                break  # EOF (or the watchdog aborted the stream)
            dog.last = time.perf_counter()
        res.latency = time.perf_counter() - st
        dog.cancel()
        if dog.fired:
            raise asyncio.TimeoutError()
        res.output_len = last_len
        if chat:
            if usage_tokens > 0:
                # a chunk carries every token a decode step committed: spread its gap over them
                per = usage_tokens / max(chunks, 1)
                res.itl = [g / per for g in res.itl for _ in range(max(1, round(per)))][: max(usage_tokens - 1, 0)]
                res.output_len = usage_tokens
            last_event = None
        if last_event is not None:
            try:
                final = json.loads(last_event)
            except ValueError:
                final = {}
            meta = final.get("meta_info") or {}
            res.meta = meta if isinstance(meta, dict) else {}
            res.prompt_len = int(meta.get("prompt_tokens") or 0)
            res.spec_verify_ct = int(meta.get("spec_verify_ct") or 0)
            if keep_output_ids and isinstance(final.get("output_ids"), list):
                res.output_ids = [int(x) for x in final["output_ids"]]
        if last_len == 0:
            res.error = "stream ended without tokens"
            return res
        if not finished and mode != "close" and not dec.done:
            res.error = "stream ended before [DONE]"
            return res
        res.success = True
        return res
    except asyncio.TimeoutError:
        res.error = "timeout after %.1fs" % (time.perf_counter() - st)
        return res
    except (OSError, _HTTPError, ValueError) as e:
        res.error = "%s: %s" % (type(e).__name__, e)
        return res
    finally:
        if dog is not None:
            dog.cancel()
        if writer is not None:
            writer.close()


# --------------------------------------------------------------------------- prompts
def make_prompts(rng: random.Random, n: int, input_len: int, low: int, high: int) -> List[List[int]]:
    return [[rng.randrange(low, high) for _ in range(input_len)] for _ in range(n)]


def load_prompt_file(path: str) -> List[Dict[str, Any]]:
    """A prompt file is JSON lines (`{"input_ids": [...]}`, `{"text": ...}` or
    `{"prompt": ...}`) or plain text, one prompt per non-empty line. Returns
    request fragments (`{"input_ids": [...]}` or `{"text": "..."}`)."""
    out: List[Dict[str, Any]] = []
    with open(path, "r", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 1_000_000:
                break
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                obj = json.loads(line)
                if isinstance(obj.get("input_ids"), list):
                    out.append({"input_ids": [int(x) for x in obj["input_ids"]]})
                elif isinstance(obj.get("text"), str):
                    out.append({"text": obj["text"]})
                elif isinstance(obj.get("prompt"), str):
                    out.append({"text": obj["prompt"]})
                else:
                    raise ValueError("%s:%d: no input_ids/text/prompt" % (path, i + 1))
            else:
                out.append({"text": line})
    if not out:
        raise ValueError("%s: no prompts" % path)
    return out


def canary_prompts(seed: int, n: int, input_len: int, low: int = 1000, high: int = 30000) -> List[List[int]]:
    """Deterministic canary prompts: the same (seed, n, input_len, range) always
    gives the same token ids, independent of the load's prompts."""
    rng = random.Random("opsctl-canary-%d" % seed)
    return make_prompts(rng, n, input_len, low, high)


# --------------------------------------------------------------------------- metrics
def _pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    f = int(math.floor(k))
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def _stats(prefix: str, xs: Sequence[float], out: Dict[str, Any]) -> None:
    n = len(xs)
    mean = sum(xs) / n if n else 0.0
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / n) if n else 0.0
    out["mean_%s_ms" % prefix] = mean * 1000
    out["median_%s_ms" % prefix] = _pct(xs, 50) * 1000
    out["std_%s_ms" % prefix] = std * 1000
    out["p90_%s_ms" % prefix] = _pct(xs, 90) * 1000
    out["p95_%s_ms" % prefix] = _pct(xs, 95) * 1000
    out["p99_%s_ms" % prefix] = _pct(xs, 99) * 1000


def compute_metrics(results: Sequence[RequestResult], duration: float,
                    input_lens: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """bench_serving's `calculate_metrics`, in its field names."""
    ok = [r for r in results if r.success]
    dur = max(duration, 1e-9)
    itls: List[float] = []
    tpots: List[float] = []
    total_in = 0
    for i, r in enumerate(results):
        if not r.success:
            continue
        total_in += r.prompt_len or (input_lens[i] if input_lens is not None else 0)
        if r.output_len > 1:
            tpots.append((r.latency - r.ttft) / (r.output_len - 1))
        itls.extend(r.itl)
    total_out = sum(r.output_len for r in ok)
    m: Dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "input_throughput": total_in / dur,
        "output_throughput": total_out / dur,
        "total_throughput": (total_in + total_out) / dur,
    }
    _stats("e2e_latency", [r.latency for r in ok], m)
    _stats("ttft", [r.ttft for r in ok], m)
    _stats("tpot", tpots, m)
    _stats("itl", itls, m)
    m["max_itl_ms"] = max(itls) * 1000 if itls else 0.0
    m["concurrency"] = sum(r.latency for r in ok) / dur
    max_tok = 0.0
    max_conc = 0
    if ok:
        t0 = min(r.start_time for r in ok)
        t1 = max(r.start_time + r.latency for r in ok)
        nsec = int(math.ceil(t1 - t0)) + 1
        toks = [0] * nsec
        conc = [0] * nsec
        for r in ok:
            t = r.start_time + r.ttft
            times = [t]
            for g in r.itl:
                t += g
                times.append(t)
            for tt in times:
                b = int(tt - t0)
                if 0 <= b < nsec:
                    toks[b] += 1
            for s in range(int(r.start_time - t0), min(int(r.start_time + r.latency - t0) + 1, nsec)):
                conc[s] += 1
        max_tok = float(max(toks))
        max_conc = int(max(conc))
    m["max_output_tokens_per_s"] = max_tok
    m["max_concurrent_requests"] = max_conc
    return m


# --------------------------------------------------------------------------- server-side accept length
async def _scrape_metrics(url: str, timeout: float) -> Optional[prometheus.Metrics]:
    try:
        status, body = await http_request(url, "GET", "/metrics", None, timeout)
    except (OSError, asyncio.TimeoutError, _HTTPError, ValueError):
        return None
    if status != 200:
        return None
    return prometheus.parse(body.decode("utf-8", "replace"))


async def _server_info_accept(url: str, timeout: float) -> Optional[float]:
    try:
        info = await http_json(url, "/server_info", None, timeout)
    except (OSError, asyncio.TimeoutError, _HTTPError, ValueError):
        return None
    if isinstance(info, dict) and "decode" in info and isinstance(info["decode"], list) and info["decode"]:
        info = info["decode"][0]
    states = info.get("internal_states") if isinstance(info, dict) else None
    if isinstance(states, list) and states and isinstance(states[0], dict):
        v = states[0].get("avg_spec_accept_length")
        return float(v) if isinstance(v, (int, float)) else None
    return None


def _metrics_accept(before: Optional[prometheus.Metrics], after: Optional[prometheus.Metrics]) -> Optional[float]:
    if after is None:
        return None
    gen, ver = "sglang:generation_tokens_total", "sglang:spec_verify_calls_total"
    if before is not None and gen in after and ver in after:
        d_ver = (after.total(ver) or 0.0) - (before.total(ver) or 0.0)
        d_gen = (after.total(gen) or 0.0) - (before.total(gen) or 0.0)
        if d_ver > 0 and d_gen > 0:
            return d_gen / d_ver
    vals = [v for v in after.total_series("sglang:spec_accept_length") if v > 0]
    return sum(vals) / len(vals) if vals else None


async def fetch_accept_lengths(url: str, timeout: float = 10.0) -> Dict[str, Optional[float]]:
    """Accept length as the server reports it right now (server_info, metrics gauge)."""
    return {"accept_length": await _server_info_accept(url, timeout),
            "metrics_accept_length": _metrics_accept(None, await _scrape_metrics(url, timeout))}


# --------------------------------------------------------------------------- levels
def _chat_payload(req: Dict[str, Any], output_len: int, ignore_eos: bool) -> Dict[str, Any]:
    """An OpenAI chat-completions request as users send it (the server applies the model's
    chat template), greedy, with SGLang's per-request speculative details and usage."""
    return {"messages": req["messages"], "max_tokens": int(req.get("max_tokens") or output_len),
            "temperature": 0.0, "ignore_eos": ignore_eos, "stream_options": {"include_usage": True},
            "return_spec_tokens_details": True}


def _payload(prompt: Dict[str, Any], output_len: int, ignore_eos: bool, temperature: float = 0.0) -> Dict[str, Any]:
    return dict(prompt, sampling_params={"temperature": temperature, "max_new_tokens": output_len,
                                         "ignore_eos": ignore_eos})


async def run_level(spec: LoadSpec, concurrency: int, prompts: List[Dict[str, Any]],
                    on_done: Optional[Callable[[RequestResult], None]] = None) -> Tuple[List[RequestResult], float]:
    """Run `prompts` with at most `concurrency` in flight; returns every request's
    result and the level's wall duration (first send to last completion)."""
    return await _run_batch(spec, concurrency, prompts, on_done, time.perf_counter() + spec.level_timeout_s)


async def _run_batch(spec: LoadSpec, concurrency: int, prompts: List[Dict[str, Any]],
                     on_done: Optional[Callable[[RequestResult], None]], deadline: float) -> Tuple[List[RequestResult], float]:
    n = len(prompts)
    results: List[Optional[RequestResult]] = [None] * n
    next_i = [0]

    async def worker() -> None:
        while True:
            i = next_i[0]
            if i >= n:
                return
            next_i[0] = i + 1
            if time.perf_counter() >= deadline:
                r = RequestResult(error="level time budget (%.0fs) exhausted" % spec.level_timeout_s)
            elif "messages" in prompts[i]:
                r = await stream_generate(spec.url, _chat_payload(prompts[i], spec.output_len, spec.ignore_eos),
                                          spec.request_timeout_s, spec.idle_timeout_s, deadline,
                                          path="/v1/chat/completions")
            else:
                p = {k: v for k, v in prompts[i].items() if k in ("input_ids", "text")}
                r = await stream_generate(spec.url, _payload(p, int(prompts[i].get("max_tokens") or spec.output_len),
                                                             spec.ignore_eos),
                                          spec.request_timeout_s, spec.idle_timeout_s, deadline)
            r.workload = str(prompts[i].get("workload") or "")
            results[i] = r
            if on_done is not None:
                on_done(r)

    # A cyclic-GC pause inside a level would show up as a latency spike of the
    # server; collect before the level and not during it (a level is bounded).
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(min(concurrency, n))])
        duration = time.perf_counter() - t0
    finally:
        if gc_was_enabled:
            gc.enable()
    return [r if r is not None else RequestResult(error="not run") for r in results], duration


def load_requests_file(path: str) -> Dict[Tuple[int, int], List[Dict[str, Any]]]:
    """{(level, repeat): [request, ...]} from the controller's requests file (the exact
    requests each level and repeat sends, chosen there from the workload mix and the seed)."""
    out: Dict[Tuple[int, int], List[Dict[str, Any]]] = {}
    with open(path, "r", encoding="utf-8") as f:
        for i, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            if "messages" not in obj and "input_ids" not in obj and "text" not in obj:
                raise ValueError("%s:%d: no messages/input_ids/text" % (path, i + 1))
            out.setdefault((int(obj.get("level", 0)), int(obj.get("repeat", 0))), []).append(obj)
    if not out:
        raise ValueError("%s: no requests" % path)
    return out


def _prompt_source(spec: LoadSpec):
    rng = random.Random(spec.seed)
    if spec.requests_file:
        table = load_requests_file(spec.requests_file)

        def take_planned(k: int, level: int = 0, repeat: int = 0) -> List[Dict[str, Any]]:
            reqs = table.get((level, repeat)) or table.get((level, 0)) or next(iter(table.values()))
            return [reqs[i % len(reqs)] for i in range(k)] if k > len(reqs) else reqs[:k]
        return take_planned
    if spec.prompt_file:
        pool = load_prompt_file(spec.prompt_file)
        order = list(range(len(pool)))
        rng.shuffle(order)
        pos = [0]

        def take(k: int, level: int = 0, repeat: int = 0) -> List[Dict[str, Any]]:
            out = []
            for _ in range(k):
                out.append(pool[order[pos[0] % len(order)]])
                pos[0] += 1
            return out
        return take

    def take_random(k: int, level: int = 0, repeat: int = 0) -> List[Dict[str, Any]]:
        return [{"input_ids": p} for p in make_prompts(rng, k, spec.input_len, spec.vocab_low, spec.vocab_high)]
    return take_random


async def run_async(spec: LoadSpec, progress: Optional[ProgressFn] = None) -> List[Dict[str, Any]]:
    """Warm up, then run every level `repeats` times (levels interleaved per repeat,
    so slow drift hits all levels alike). Returns the records (level lines, then the
    canary line when asked for)."""
    spec.validate()
    emit = progress or (lambda ev: None)
    take = _prompt_source(spec)
    records: List[Dict[str, Any]] = []
    if spec.canary_only:
        canary = await _canary_from_spec(spec, emit)
        return [canary] if canary is not None else []
    if spec.warmup > 0:
        wc = min(spec.warmup, max(spec.concurrency))
        emit(ProgressEvent("warmup_start", wc, 0, 0, spec.warmup))
        await _run_batch(spec, wc, take(spec.warmup), None, time.perf_counter() + spec.level_timeout_s)
        emit(ProgressEvent("warmup_end", wc, 0, spec.warmup, spec.warmup))
    for rep in range(spec.repeats):
        for conc in spec.concurrency:
            conc = int(conc)
            n = spec.requests_for(conc)
            prompts = take(n, conc, rep)
            if spec.requests_file:
                n = len(prompts)
            state = {"done": 0, "errors": 0}

            def on_done(r: RequestResult, conc=conc, rep=rep, n=n, state=state) -> None:
                state["done"] += 1
                state["errors"] += 0 if r.success else 1
                emit(ProgressEvent("request_done", conc, rep, state["done"], n, state["errors"]))

            emit(ProgressEvent("level_start", conc, rep, 0, n))
            before = await _scrape_metrics(spec.url, 10.0)
            started_at = time.time()
            results, duration = await _run_batch(spec, conc, prompts, on_done,
                                                 time.perf_counter() + spec.level_timeout_s)
            rec = level_record(spec, conc, rep, results, duration,
                               [len(p.get("input_ids", ())) for p in prompts])
            rec["started_at"] = started_at
            rec["accept_length"] = await _server_info_accept(spec.url, 10.0)
            rec["metrics_accept_length"] = _metrics_accept(before, await _scrape_metrics(spec.url, 10.0))
            rec["level_accept_length"] = next(
                (rec[k] for k in ("request_accept_length", "metrics_accept_length", "accept_length")
                 if rec.get(k) is not None), None)
            records.append(rec)
            emit(ProgressEvent("level_end", conc, rep, n, n, rec["errors"], rec))
    canary = await _canary_from_spec(spec, emit)
    if canary is not None:
        records.append(canary)
    return records


def level_record(spec: LoadSpec, concurrency: int, repeat: int, results: Sequence[RequestResult],
                 duration: float, input_lens: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    rec: Dict[str, Any] = {
        "record": "level",
        "tag": spec.tag,
        "backend": BACKEND,
        "loadgen_version": LOADGEN_VERSION,
        "dataset_name": "workloads" if spec.requests_file else ("file" if spec.prompt_file else "random"),
        "max_concurrency": concurrency,
        "random_input_len": spec.input_len,
        "random_output_len": spec.output_len,
        "num_prompts": len(results),
        "repeat": repeat,
        "seed": spec.seed,
        "warmup": spec.warmup,
    }
    rec.update(compute_metrics(results, duration, input_lens))
    errs = [r.error for r in results if not r.success]
    rec["errors"] = len(errs)
    rec["error_samples"] = sorted(set(errs))[:3]
    tok = sum(r.output_len for r in results if r.success and r.spec_verify_ct > 0)
    ver = sum(r.spec_verify_ct for r in results if r.success and r.spec_verify_ct > 0)
    rec["request_accept_length"] = (tok / ver) if ver > 0 else None
    # every request, for confidence intervals (bootstrap over requests) and per-workload rows:
    # [workload, output tokens, e2e s, ttft s, verify rounds, ok]
    rec["samples"] = [[r.workload, r.output_len, round(r.latency, 6), round(r.ttft, 6), r.spec_verify_ct,
                       1 if r.success else 0] for r in results]
    by: Dict[str, List[RequestResult]] = {}
    for r in results:
        by.setdefault(r.workload or "-", []).append(r)
    if len(by) > 1 or spec.requests_file:
        rows = {}
        for name, rs in sorted(by.items()):
            ok = [r for r in rs if r.success]
            t = sum(r.output_len for r in ok if r.spec_verify_ct > 0)
            v = sum(r.spec_verify_ct for r in ok if r.spec_verify_ct > 0)
            rate = [r.output_len / r.latency for r in ok if r.latency > 0]
            rows[name] = {"requests": len(rs), "errors": len(rs) - len(ok),
                          "output_tokens": sum(r.output_len for r in ok),
                          "mean_request_tok_s": (sum(rate) / len(rate)) if rate else 0.0,
                          "median_ttft_ms": _pct([r.ttft for r in ok], 50) * 1000 if ok else 0.0,
                          "accept_length": (t / v) if v > 0 else None}
        rec["workloads"] = rows
    return rec


def run(spec: LoadSpec, progress: Optional[ProgressFn] = None) -> List[Dict[str, Any]]:
    return asyncio.run(run_async(spec, progress))


# --------------------------------------------------------------------------- canary
async def run_canary_async(url: str, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                           timeout: float = 120.0, progress: Optional[ProgressFn] = None) -> List[List[int]]:
    """Greedy (temperature 0) decode of each prompt, one at a time; returns the
    output token ids (`output_ids` of SGLang's non-streaming `/generate`). Raises
    RuntimeError when a prompt cannot be decoded: a canary with holes proves nothing."""
    outs: List[List[int]] = []
    for i, p in enumerate(prompts):
        payload = {"input_ids": list(p), "sampling_params": {"temperature": 0, "max_new_tokens": int(max_new_tokens),
                                                              "ignore_eos": True}}
        try:
            data = await http_json(url, "/generate", payload, timeout)
        except (OSError, asyncio.TimeoutError, _HTTPError, ValueError) as e:
            raise RuntimeError("canary prompt %d failed: %s: %s" % (i, type(e).__name__, e))
        if isinstance(data, list):
            data = data[0] if data else {}
        ids = data.get("output_ids") if isinstance(data, dict) else None
        if not isinstance(ids, list):
            raise RuntimeError("canary prompt %d: response has no output_ids" % i)
        outs.append([int(x) for x in ids])
        if progress is not None:
            progress(ProgressEvent("canary_request_done", 1, 0, i + 1, len(prompts)))
    return outs


def run_canary(url: str, prompts: Sequence[Sequence[int]], max_new_tokens: int, timeout: float = 120.0) -> List[List[int]]:
    return asyncio.run(run_canary_async(url, prompts, max_new_tokens, timeout))


def compare_canary(baseline: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> Optional[Dict[str, Any]]:
    """None when identical; else the first diverging prompt index and token
    position, with the expected (baseline) and actual (candidate) token there
    (None where a sequence ended)."""
    n = max(len(baseline), len(candidate))
    for i in range(n):
        a = list(baseline[i]) if i < len(baseline) else None
        b = list(candidate[i]) if i < len(candidate) else None
        if a is None or b is None:
            return {"prompt": i, "position": 0, "expected": a[0] if a else None, "got": b[0] if b else None,
                    "reason": "prompt missing from the %s" % ("baseline" if a is None else "candidate")}
        if a == b:
            continue
        for j in range(max(len(a), len(b))):
            x = a[j] if j < len(a) else None
            y = b[j] if j < len(b) else None
            if x != y:
                return {"prompt": i, "position": j, "expected": x, "got": y,
                        "reason": "token differs" if x is not None and y is not None else "length differs"}
    return None


def read_canary_file(path: str) -> Dict[str, Any]:
    with open(path, "r", encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("prompts"), list):
        raise ValueError("%s: a canary file is a JSON object with `prompts` (lists of token ids)" % path)
    return data


async def _canary_from_spec(spec: LoadSpec, emit: ProgressFn) -> Optional[Dict[str, Any]]:
    if spec.canary_file:
        ref = read_canary_file(spec.canary_file)
        prompts = [[int(x) for x in p] for p in ref["prompts"]]
        max_new = int(ref.get("max_new_tokens") or spec.canary_output_len)
        expected = ref.get("outputs")
    elif spec.canary_prompts > 0:
        prompts = canary_prompts(spec.seed, spec.canary_prompts, spec.canary_input_len, spec.vocab_low,
                                 spec.vocab_high)
        max_new = spec.canary_output_len
        expected = None
    else:
        return None
    emit(ProgressEvent("canary_start", 1, 0, 0, len(prompts)))
    rec: Dict[str, Any] = {"record": "canary", "seed": spec.seed, "max_new_tokens": max_new, "prompts": prompts}
    try:
        outs = await run_canary_async(spec.url, prompts, max_new, spec.request_timeout_s, emit)
        rec["outputs"] = outs
        rec["error"] = None
        rec["mismatch"] = compare_canary(expected, outs) if isinstance(expected, list) else None
    except RuntimeError as e:
        rec["outputs"] = None
        rec["error"] = str(e)
        rec["mismatch"] = None
    rec["compared"] = isinstance(expected, list) and rec["outputs"] is not None
    emit(ProgressEvent("canary_end", 1, 0, len(prompts), len(prompts), 0 if rec["error"] is None else 1, rec))
    return rec


# --------------------------------------------------------------------------- script
def _parse_levels(text: str) -> List[int]:
    try:
        levels = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError("concurrency must be a comma-separated list of integers: %r" % text)
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError("concurrency levels must be positive: %r" % text)
    return levels


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opsctl-onhost.pyz loadgen", description=__doc__.split("\n\n")[0])
    d = LoadSpec()
    p.add_argument("--url", default=d.url)
    p.add_argument("--concurrency", type=_parse_levels, default=d.concurrency, help="e.g. 1,4,16")
    p.add_argument("--input-len", type=int, default=d.input_len)
    p.add_argument("--output-len", type=int, default=d.output_len)
    p.add_argument("--requests-per-level", type=int, default=d.requests_per_level)
    p.add_argument("--repeats", type=int, default=d.repeats)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--vocab-low", type=int, default=d.vocab_low)
    p.add_argument("--vocab-high", type=int, default=d.vocab_high)
    p.add_argument("--prompt-file")
    p.add_argument("--canary-only", action="store_true", help="decode the greedy canary only (no levels)")
    p.add_argument("--requests-file", help="JSON lines {level, repeat, workload, messages|input_ids, max_tokens}: "
                   "the requests of each level and repeat (opsctl writes it from the workload mix)")
    p.add_argument("--canary-file", help="JSON {prompts, max_new_tokens[, outputs]}: decode greedily, compare to outputs")
    p.add_argument("--canary-prompts", type=int, default=0, help="generate N canary prompts from --seed")
    p.add_argument("--canary-input-len", type=int, default=d.canary_input_len)
    p.add_argument("--canary-output-len", type=int, default=d.canary_output_len)
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s)
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout_s)
    p.add_argument("--level-timeout", type=float, default=d.level_timeout_s)
    p.add_argument("--no-ignore-eos", action="store_true")
    p.add_argument("--tag")
    p.add_argument("--json", action="store_true", help="JSON lines on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def spec_from_args(a: argparse.Namespace) -> LoadSpec:
    return LoadSpec(url=a.url, concurrency=a.concurrency, input_len=a.input_len, output_len=a.output_len,
                    requests_per_level=a.requests_per_level, repeats=a.repeats, warmup=a.warmup, seed=a.seed,
                    vocab_low=a.vocab_low, vocab_high=a.vocab_high, prompt_file=a.prompt_file,
                    requests_file=a.requests_file, canary_only=a.canary_only,
                    request_timeout_s=a.request_timeout, idle_timeout_s=a.idle_timeout,
                    level_timeout_s=a.level_timeout, ignore_eos=not a.no_ignore_eos, canary_file=a.canary_file,
                    canary_prompts=a.canary_prompts, canary_input_len=a.canary_input_len,
                    canary_output_len=a.canary_output_len, tag=a.tag)


def _stderr_progress() -> ProgressFn:
    last = [0.0]

    def show(ev: ProgressEvent) -> None:
        now = time.monotonic()
        if ev.kind == "request_done" and ev.done < ev.total and now - last[0] < 0.5:
            return
        last[0] = now
        if ev.kind in ("warmup_start", "warmup_end"):
            msg = "warm-up: %d requests at C=%d %s" % (ev.total, ev.concurrency,
                                                       "..." if ev.kind == "warmup_start" else "done")
        elif ev.kind == "level_end" and ev.record is not None:
            r = ev.record
            msg = "C=%d repeat %d: %.1f tok/s, TTFT p50 %.1f ms, ITL p50 %.2f ms, errors %d" % (
                ev.concurrency, ev.repeat + 1, r["output_throughput"], r["median_ttft_ms"],
                r["median_itl_ms"], r["errors"])
        elif ev.kind.startswith("canary"):
            msg = "canary %d/%d" % (ev.done, ev.total)
        else:
            msg = "C=%d repeat %d: %d/%d requests (%d errors)" % (ev.concurrency, ev.repeat + 1, ev.done,
                                                                 ev.total, ev.errors)
        sys.stderr.write("[loadgen] %s\n" % msg)
        sys.stderr.flush()
    return show


def _table(records: List[Dict[str, Any]]) -> str:
    rows = ["%6s %6s %10s %9s %10s %10s %10s %8s %7s" % ("C", "repeat", "tok/s", "req/s", "TTFT p50",
                                                         "ITL p50", "E2E p50", "accept", "errors")]
    for r in records:
        if r.get("record") != "level":
            continue
        acc = r.get("level_accept_length")
        rows.append("%6d %6d %10.1f %9.2f %10.1f %10.2f %10.1f %8s %7d" % (
            r["max_concurrency"], r["repeat"] + 1, r["output_throughput"], r["request_throughput"],
            r["median_ttft_ms"], r["median_itl_ms"], r["median_e2e_latency_ms"],
            "-" if acc is None else "%.2f" % acc, r["errors"]))
    for r in records:
        if r.get("record") == "canary":
            if r.get("error"):
                rows.append("canary: ERROR %s" % r["error"])
            elif r.get("mismatch"):
                m = r["mismatch"]
                rows.append("canary: MISMATCH at prompt %d, token %d (expected %s, got %s)" % (
                    m["prompt"], m["position"], m["expected"], m["got"]))
            else:
                rows.append("canary: %d prompts decoded%s" % (len(r["prompts"]),
                                                              ", identical" if r.get("compared") else ""))
    return "\n".join(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        spec = spec_from_args(a)
        spec.validate()
        if spec.prompt_file and not os.path.exists(spec.prompt_file):
            raise ValueError("prompt file not found: %s" % spec.prompt_file)
        if spec.requests_file and not os.path.exists(spec.requests_file):
            raise ValueError("requests file not found: %s" % spec.requests_file)
        if spec.canary_file and not os.path.exists(spec.canary_file):
            raise ValueError("canary file not found: %s" % spec.canary_file)
    except ValueError as e:
        parser.error(str(e))
    try:
        asyncio.run(http_request(spec.url, "GET", "/server_info", None, 10.0))
    except (OSError, asyncio.TimeoutError, _HTTPError) as e:
        sys.stderr.write("[loadgen] cannot reach %s: %s: %s\n" % (spec.url, type(e).__name__, e))
        return 3
    records = run(spec, None if a.quiet else _stderr_progress())
    if a.json:
        for r in records:
            sys.stdout.write(json.dumps(r) + "\n")
    else:
        sys.stdout.write(_table(records) + "\n")
    sys.stdout.flush()
    return 0
