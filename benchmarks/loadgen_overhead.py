#!/usr/bin/env python3
"""Load generator overhead: can `opsctl/onhost/loadgen.py` drive C=256 streams
without being the bottleneck?

A fast stub server (asyncio, SGLang's native SSE format with cumulative
`output_ids` and `meta_info.completion_tokens`, chunked like uvicorn) runs in
separate processes on loopback and emits one token per stream every GAP ms.
The client runs C=256 streams against it; the table shows, per offered rate:
streams sustained (peak in flight), tokens/s handled vs offered, ITL p50 measured vs the
schedule, the client's own CPU time per token (process_time, this process only)
and its CPU utilisation, the server's CPU, and whether the client is the
bottleneck (it is when tokens/s fall >5% short of the ideal, or ITL p50 is
>5% off the schedule, while the client's CPU is >=90% busy; a shortfall with
the client below that means the machine as a whole ran out of CPU: events then
queue in the socket and arrive together, and ITL p50 drops towards 0).
"server CPU" is the stub's processes together, in % of one CPU.

Bounded: a few levels of a few seconds each, < 60 s in all. Stdlib only.

    python3 benchmarks/loadgen_overhead.py [--concurrency 256] [--gaps-ms 100,50,25,10] [--output-len 48]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_loadgen():
    """The host-side package's load generator, as the host runs it (standard library only)."""
    sys.path.insert(0, str(ROOT))
    from opsctl.onhost import loadgen

    return loadgen


# --------------------------------------------------------------------------- stub server
async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ttft: float, gap: float) -> None:
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
        n = int(json.loads(body)["sampling_params"]["max_new_tokens"])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n")
        ids = bytearray()
        for k in range(n):
            delay = t0 + ttft + k * gap - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            ids += (b"," if k else b"") + str(1000 + k).encode()
            ev = (b'data: {"text": "x", "output_ids": [' + bytes(ids) + b'], "meta_info": {"id": "r", '
                  b'"finish_reason": null, "prompt_tokens": 32, "completion_tokens": ' + str(k + 1).encode()
                  + b', "cached_tokens": 0}}\n\n')
            writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            if k % 8 == 0:
                await writer.drain()
        done = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


def _server_main(lsock: socket.socket, ttft: float, gap: float) -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _handle(r, w, ttft, gap), sock=lsock, backlog=1024)
        async with server:
            await server.serve_forever()
    asyncio.run(main())


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class StubServer:
    def __init__(self, ttft: float, gap: float, workers: int):
        self.ttft, self.gap, self.workers = ttft, gap, workers

    def __enter__(self) -> "StubServer":
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

    def cpu(self) -> float:
        return sum(_cpu_s(p.pid) for p in self.procs)

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
            p.join(timeout=5)


# --------------------------------------------------------------------------- measurement
def measure(lg, conc: int, gap: float, out_len: int, rounds: int, workers: int) -> dict:
    ttft = 0.02
    with StubServer(ttft, gap, workers) as srv:
        spec = lg.LoadSpec(url=srv.url, concurrency=[conc], input_len=32, output_len=out_len,
                           requests_per_level=conc * rounds, warmup=0, request_timeout_s=60, level_timeout_s=50)
        prompts = [{"input_ids": [7] * 32}] * (conc * rounds)
        asyncio.run(lg.run_level(spec, min(conc, 32), prompts[:32]))      # warm both ends
        s_cpu0, c_cpu0 = srv.cpu(), time.process_time()
        results, duration = asyncio.run(lg.run_level(spec, conc, prompts))
        c_cpu, s_cpu = time.process_time() - c_cpu0, srv.cpu() - s_cpu0
    m = lg.compute_metrics(results, duration)
    tokens = m["total_output_tokens"]
    edges = sorted([(r.start_time, 1) for r in results] + [(r.start_time + r.latency, -1) for r in results
                                                           if r.success], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, d in edges:
        live += d
        peak = max(peak, live)
    offered = conc / gap                                    # tok/s while all streams decode
    per_req = ttft + (out_len - 1) * gap
    ideal = conc * rounds * out_len / (rounds * per_req)    # incl. the first-token wait
    itl_ms = m["median_itl_ms"]
    short = m["output_throughput"] < 0.95 * ideal
    itl_off = abs(itl_ms / (gap * 1000) - 1) > 0.05
    client_util = c_cpu / duration
    return {
        "gap_ms": gap * 1000, "streams": peak, "completed": m["completed"],
        "errors": len(results) - m["completed"], "offered_tok_s": offered, "ideal_tok_s": ideal,
        "tok_s": m["output_throughput"], "itl_p50_ms": itl_ms, "itl_p99_ms": m["p99_itl_ms"],
        "ttft_p50_ms": m["median_ttft_ms"], "client_cpu_us_per_tok": c_cpu / max(tokens, 1) * 1e6,
        "client_util": client_util, "server_util": s_cpu / duration, "duration_s": duration,
        "client_bottleneck": (short or itl_off) and client_util >= 0.9,
        "shortfall": short or itl_off,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--gaps-ms", default="100,50,25,10")
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--server-workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    lg = _load_loadgen()
    t_start = time.monotonic()
    rows = []
    for g in [float(x) / 1000 for x in a.gaps_ms.split(",")]:
        est = a.rounds * (0.02 + (a.output_len - 1) * g) + 2
        if time.monotonic() - t_start + est > 55:
            print(f"skipping gap {g * 1000:.0f} ms: would pass the 60 s bound", file=sys.stderr)
            continue
        rows.append(measure(lg, a.concurrency, g, a.output_len, a.rounds, a.server_workers))
    if a.json:
        print(json.dumps(rows))
        return 0
    print(f"loadgen overhead: C={a.concurrency}, output {a.output_len} tokens/request, {a.rounds} rounds, "
          f"{len(os.sched_getaffinity(0))} CPUs, stub server in {a.server_workers} separate process(es), "
          f"python {sys.version.split()[0]}, load average before: {os.getloadavg()[0]:.2f}")
    hdr = ("gap ms", "streams", "offered tok/s", "handled tok/s", "of ideal", "ITL p50 ms", "ITL p99 ms",
           "client us/tok", "client CPU", "server CPU", "client bottleneck")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---:" for _ in hdr) + "|")
    for r in rows:
        print("| %.0f | %d | %.0f | %.0f | %.1f%% | %.2f | %.2f | %.1f | %.0f%% | %.0f%% | %s |" % (
            r["gap_ms"], r["streams"], r["offered_tok_s"], r["tok_s"], 100 * r["tok_s"] / r["ideal_tok_s"],
            r["itl_p50_ms"], r["itl_p99_ms"], r["client_cpu_us_per_tok"], 100 * r["client_util"],
            100 * r["server_util"], "YES" if r["client_bottleneck"] else
            ("no, but the box is saturated (client+server CPU)" if r["shortfall"] else "no")))
    if rows:
        us = statistics.median(r["client_cpu_us_per_tok"] for r in rows)
        print(f"\nclient cost ~{us:.1f} us CPU per streamed token: one core handles ~{1e6 / us:,.0f} tok/s "
              f"before the client itself limits the measurement.")
        print(f"total {time.monotonic() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
