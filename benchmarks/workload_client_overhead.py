#!/usr/bin/env python3
"""Client overhead of real-prompt load: text prompts sent through the chat template
(`/v1/chat/completions`, OpenAI SSE chunks, SGLang's `sglext` speculative details and the
usage chunk) against the token-id path (`/generate`, SGLang's native SSE), per output token,
at C = 1, 16, 64, 256.

A stub server (separate processes, loopback) streams one token every GAP ms in either
format; the client is `opsctl/onhost/loadgen.py` driven with the requests the gate sends
(humaneval / chat / math prompts from opsctl's workloads). The client's own CPU time
(process_time of this process) per streamed token is the number that matters: it must stay
far below the server's per-token time so the client never limits a measurement.

Bounded: 8 runs of a few seconds, < 90 s. Stdlib + opsctl.

    python3 benchmarks/workload_client_overhead.py [--levels 1,16,64,256] [--gap-ms 20] [--output-len 48]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _load_loadgen():
    """The host-side package's load generator, as the host runs it (standard library only)."""
    sys.path.insert(0, str(ROOT))
    from opsctl.onhost import loadgen

    return loadgen


async def _handle(reader, writer, ttft: float, gap: float) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        first = head.split(b"\r\n", 1)[0].split(b" ")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length) if length else b""
        if first[0] == b"GET":
            payload = b'{"internal_states": [{"last_gen_throughput": 0.0}]}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(payload), payload))
            await writer.drain()
            return
        req = json.loads(body)
        chat = first[1].endswith(b"/chat/completions")
        n = int(req["max_tokens"] if chat else req["sampling_params"]["max_new_tokens"])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n")
        ids = bytearray()
        for k in range(n):
            delay = t0 + ttft + k * gap - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if chat:
                ev = (b'data: {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": "m", '
                      b'"choices": [{"index": 0, "delta": {"content": " tok' + str(k).encode() + b'"}, '
                      b'"logprobs": null, "finish_reason": null}], "usage": null}\n\n')
            else:
                ids += (b"," if k else b"") + str(1000 + k).encode()
                ev = (b'data: {"text": "x", "output_ids": [' + bytes(ids) + b'], "meta_info": {"id": "r", '
                      b'"finish_reason": null, "prompt_tokens": 32, "completion_tokens": ' + str(k + 1).encode()
                      + b', "cached_tokens": 0, "spec_verify_ct": ' + str(k + 1).encode() + b'}}\n\n')
            writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            if k % 8 == 0:
                await writer.drain()
        tail = b""
        if chat:
            tail += (b'data: {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": "m", '
                     b'"choices": [], "sglext": {"spec_tokens_details": {"spec_verify_ct": %d, '
                     b'"spec_accept_length": 1.0}}}\n\n' % n)
            tail += (b'data: {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": "m", '
                     b'"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": %d, "total_tokens": %d}}\n\n'
                     % (n, n + 40))
        tail += b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError, ValueError, KeyError):
        pass
    finally:
        writer.close()


def _server_main(lsock, ttft, gap):
    async def main():
        server = await asyncio.start_server(lambda r, w: _handle(r, w, ttft, gap), sock=lsock, backlog=1024)
        async with server:
            await server.serve_forever()
    asyncio.run(main())


class Stub:
    def __init__(self, ttft: float, gap: float, workers: int = 2):
        self.ttft, self.gap, self.workers = ttft, gap, workers

    def __enter__(self):
        ctx = multiprocessing.get_context("fork")
        lsock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.url = "http://127.0.0.1:%d" % lsock.getsockname()[1]
        self.procs = [ctx.Process(target=_server_main, args=(lsock, self.ttft, self.gap), daemon=True)
                      for _ in range(self.workers)]
        for p in self.procs:
            p.start()
        lsock.close()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.join(timeout=5)


def measure(lg, prompts, conc: int, gap: float, out_len: int) -> dict:
    with Stub(0.02, gap) as srv:
        spec = lg.LoadSpec(url=srv.url, concurrency=[conc], output_len=out_len, requests_per_level=len(prompts),
                           warmup=0, request_timeout_s=60, level_timeout_s=60)
        asyncio.run(lg.run_level(spec, min(conc, 8), prompts[:8]))  # warm both ends
        c0 = time.process_time()
        results, duration = asyncio.run(lg.run_level(spec, conc, prompts))
        cpu = time.process_time() - c0
    tokens = sum(r.output_len for r in results if r.success)
    errors = sum(1 for r in results if not r.success)
    return {"tokens": tokens, "errors": errors, "duration": duration, "us_per_tok": cpu / max(tokens, 1) * 1e6,
            "client_util": cpu / duration, "tok_s": tokens / duration}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,16,64,256")
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--output-len", type=int, default=48)
    a = ap.parse_args(argv)
    from opsctl.gate.workloads import WorkloadSet, parse_mix

    lg = _load_loadgen()
    ws = WorkloadSet.load(parse_mix("humaneval:0.3,chat:0.5,math:0.2"), input_len=128)
    t0 = time.monotonic()
    rows = []
    for c in [int(x) for x in a.levels.split(",")]:
        n = max(2 * c, 16)
        text = [dict(r.payload(a.output_len), max_tokens=a.output_len) for r in ws.select(n, seed=0, level=c, repeat=0)]
        ids = [{"input_ids": [7] * 128, "max_tokens": a.output_len} for _ in range(n)]
        for label, prompts in (("token ids, /generate", ids), ("text, /v1/chat/completions", text)):
            rows.append({"C": c, "path": label, **measure(lg, prompts, c, a.gap_ms / 1000, a.output_len)})
    print(f"client overhead per output token: {a.output_len} tokens/request, one token every {a.gap_ms:.0f} ms per "
          f"stream, {len(os.sched_getaffinity(0))} CPUs, load average before {os.getloadavg()[0]:.2f}")
    print("| C | path | requests' tokens | errors | tok/s | client us/token | client CPU |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['C']} | {r['path']} | {r['tokens']} | {r['errors']} | {r['tok_s']:.0f} | {r['us_per_tok']:.1f} | "
              f"{100 * r['client_util']:.0f}% |")
    print(f"total {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
