"""Load generator accuracy and behaviour against a server with a KNOWN token schedule."""
from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys

import pytest

from bench_fakeserver import FakeSGLang, Schedule
from opsctl.onhost import ARCHIVE_NAME, archive, loadgen
# milliseconds against a known schedule: run with a core each (scripts/test), never beside booting
# lab hosts, where the client came up to 3.5 % late on a 200 ms first token (two CI runs)
pytestmark = pytest.mark.timing

BENCH_SERVING_FIELDS = {
    "request_throughput", "input_throughput", "output_throughput", "total_throughput", "concurrency",
    "accept_length", "max_output_tokens_per_s", "completed", "duration", "total_input_tokens",
    "total_output_tokens", "max_concurrency",
    *[f"{s}_{m}_ms" for s in ("mean", "median", "std", "p90", "p95", "p99")
      for m in ("e2e_latency", "ttft", "tpot", "itl")],
}


def within(measured: float, truth: float, rel: float = 0.02) -> bool:
    return abs(measured - truth) <= rel * truth


def kept_schedule(measured: float, nominal: float, rel: float = 0.03, late: float = 0.15,
                  slower_is_higher: bool = True) -> bool:
    """The fake server sleeps to its schedule: a busy box or a VM's wake-up lag (a few % of
    each idle span, see the test below) makes it late, never early. A time comes out higher, a
    rate lower; `late` is the room for that, `rel` for the other side."""
    lo, hi = (1 - rel, 1 + late) if slower_is_higher else (1 - late, 1 + rel)
    return nominal * lo <= measured <= nominal * hi


def _levels(records):
    return {r["max_concurrency"]: r for r in records if r.get("record") == "level"}


def _truth(results):
    """What the server really sent, from its own clock (same CLOCK_MONOTONIC), counted from the
    client's send as bench_serving counts it: the connection's set-up is part of the time to the
    first token (on this VM the server's accept() ran 1-6 ms after the client's connect)."""
    metas = [r.meta for r in results]
    ttft = [m["t_first"] - r.start_time for m, r in zip(metas, results)]
    itl = [(m["t_send"] - m["t_first"]) / (r.output_len - 1) for m, r in zip(metas, results)]
    span = max(m["t_send"] for m in metas) - min(r.start_time for r in results)
    return sum(ttft) / len(ttft), sum(itl) / len(itl), sum(r.output_len for r in results) / span


def test_measured_ttft_itl_and_throughput_match_the_known_schedule():
    """Two truths: the schedule the server was told to keep (200 ms to the first
    token, then one token per 50 ms), and the send times the server recorded on
    its own clock, by the median over 3 repeats (the gate's own method).

    The bounds leave room for the machine and none for a wrong formula. On a VM a
    process that was idle for d reads its socket a few % of d after the data came
    (measured here: 1-5 % of d, drifting over the hours; busy CPUs do not help):
    the client's first token after 200 ms idle is 2-10 ms late, a token after a
    50 ms gap 0.5-2.5 ms. So the time to the first token has 10 % (a token too many
    is +25 %), the gaps 3 % (n instead of n - 1 of them is 10 %)."""
    ttft, gap, out_len = 0.200, 0.050, 11
    e2e = ttft + (out_len - 1) * gap                      # 0.7 s per request
    spec = loadgen.LoadSpec(input_len=8, output_len=out_len)
    prompts = [{"input_ids": [i, 2, 3]} for i in range(4)]
    per_level = {1: [], 4: []}
    with FakeSGLang(Schedule(ttft_s=ttft, gap_s=gap)) as url:
        spec.url = url
        asyncio.run(loadgen.run_level(spec, 4, prompts))          # warm-up
        for _ in range(3):
            for c in (1, 4):
                results, duration = asyncio.run(loadgen.run_level(spec, c, prompts[:2] if c == 1 else prompts))
                per_level[c].append((results, duration))
    for c, runs in per_level.items():
        errs = {"ttft": [], "itl": [], "tok_s": []}
        for results, duration in runs:
            assert all(r.success and r.output_len == out_len for r in results)
            m = loadgen.compute_metrics(results, duration)
            true_ttft, true_itl, true_tok_s = _truth(results)
            errs["ttft"].append(m["mean_ttft_ms"] / (true_ttft * 1000) - 1)
            errs["itl"].append(m["mean_itl_ms"] / (true_itl * 1000) - 1)
            errs["tok_s"].append(m["output_throughput"] / true_tok_s - 1)
        for k, e in errs.items():     # against what the server really sent: median error over repeats
            assert abs(statistics.median(e)) <= (0.10 if k == "ttft" else 0.03), (c, k, e)
        ms = [loadgen.compute_metrics(r, d) for r, d in runs]
        med = lambda k: statistics.median(x[k] for x in ms)   # noqa: E731
        n = len(runs[0][0])
        assert kept_schedule(med("median_ttft_ms"), ttft * 1000), (c, med("median_ttft_ms"))
        assert within(med("median_itl_ms"), gap * 1000, 0.03), (c, med("median_itl_ms"))
        assert within(med("mean_tpot_ms"), gap * 1000, 0.03), (c, med("mean_tpot_ms"))
        assert kept_schedule(med("median_e2e_latency_ms"), e2e * 1000, late=0.08), (c, med("median_e2e_latency_ms"))
        assert kept_schedule(med("output_throughput"), n * out_len / (n / c * e2e), late=0.08,
                             slower_is_higher=False), (c, med("output_throughput"))
        assert kept_schedule(med("request_throughput"), n / (n / c * e2e), late=0.08, slower_is_higher=False)
        if c == 4:
            assert within(med("concurrency"), 4.0, 0.03)   # effective concurrency, as bench_serving defines it


def test_multi_token_events_split_the_gap_and_report_accept_length():
    # speculative decoding: each SSE event carries 3 tokens (one verify step)
    with FakeSGLang(Schedule(ttft_s=0.2, gap_s=0.03, tokens_per_event=3, accept_length=3.0)) as url:
        spec = loadgen.LoadSpec(url=url, concurrency=[2], input_len=8, output_len=21, requests_per_level=2, warmup=2)
        rec = _levels(loadgen.run(spec))[2]
    assert rec["total_output_tokens"] == 42
    # 30 ms per 3 tokens (unsplit: 30 ms and 0); 5 %: a VM's wake-up lag after each 30 ms gap
    assert within(rec["median_itl_ms"], 10.0, 0.05), rec["median_itl_ms"]
    assert rec["request_accept_length"] == pytest.approx(3.0)   # 21 tokens / 7 verify steps
    assert rec["accept_length"] == pytest.approx(3.0)           # /server_info
    assert rec["metrics_accept_length"] == pytest.approx(3.0)   # /metrics
    assert rec["level_accept_length"] == pytest.approx(3.0)


def test_records_use_bench_serving_field_names_and_count_errors():
    with FakeSGLang(Schedule(ttft_s=0.005, gap_s=0.001, fail_every=2)) as url:
        spec = loadgen.LoadSpec(url=url, concurrency=[1], input_len=4, output_len=4, requests_per_level=6, warmup=0)
        rec = _levels(loadgen.run(spec))[1]
    assert BENCH_SERVING_FIELDS <= set(rec)
    assert rec["errors"] == 3 and rec["completed"] == 3
    assert any("HTTP 500" in e for e in rec["error_samples"])
    assert rec["accept_length"] is None                 # autoregressive server: no accept length


def test_a_stalled_stream_times_out_as_an_error_not_a_hang():
    with FakeSGLang(Schedule(ttft_s=1.0, gap_s=0.01)) as url:
        spec = loadgen.LoadSpec(url=url, concurrency=[2], input_len=4, output_len=4, requests_per_level=2,
                                warmup=0, request_timeout_s=0.2)
        rec = _levels(loadgen.run(spec))[2]
    assert rec["errors"] == 2 and rec["completed"] == 0
    assert "timeout" in rec["error_samples"][0]
    assert rec["duration"] < 0.8


def test_repeats_are_separate_lines_and_progress_is_reported():
    events = []
    with FakeSGLang(Schedule(ttft_s=0.002, gap_s=0.001)) as url:
        spec = loadgen.LoadSpec(url=url, concurrency=[1, 2], input_len=4, output_len=3, requests_per_level=2,
                                repeats=2, warmup=1)
        recs = loadgen.run(spec, events.append)
    assert [(r["max_concurrency"], r["repeat"]) for r in recs] == [(1, 0), (2, 0), (1, 1), (2, 1)]
    kinds = [e.kind for e in events]
    assert kinds.count("level_start") == 4 and kinds.count("level_end") == 4 and "warmup_start" in kinds
    done = [e for e in events if e.kind == "request_done"]
    assert len(done) == 8 and all(e.done <= e.total for e in done)


@pytest.fixture(scope="module")
def loadgen_cmd(tmp_path_factory) -> list[str]:
    """The load generator as the host runs it: from the host-side archive."""
    path = tmp_path_factory.mktemp("host") / ARCHIVE_NAME
    path.write_bytes(archive())
    return [str(path), "loadgen"]


def test_runs_as_a_script_with_the_standard_library_only(tmp_path, loadgen_cmd):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input_ids": [5, 6, 7]}\n{"text": "hello"}\n')
    with FakeSGLang(Schedule(ttft_s=0.002, gap_s=0.001, accept_length=2.0)) as url:
        # -S: no site-packages at all, -I: isolated; the archive must work on its own on the host
        p = subprocess.run([sys.executable, "-S", "-I", *loadgen_cmd, "--url", url, "--concurrency", "1,2",
                            "--input-len", "4", "--output-len", "5", "--requests-per-level", "3", "--repeats", "1",
                            "--warmup", "1", "--seed", "3", "--prompt-file", str(prompts), "--canary-prompts", "2",
                            "--json"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in p.stdout.splitlines()]
    lv = _levels(recs)
    assert set(lv) == {1, 2} and lv[2]["total_output_tokens"] == 15 and lv[2]["dataset_name"] == "file"
    canary = [r for r in recs if r["record"] == "canary"][0]
    assert len(canary["outputs"]) == 2 and len(canary["outputs"][0]) == loadgen.LoadSpec().canary_output_len
    assert "[loadgen]" in p.stderr                       # progress on stderr, not in the JSON


def test_script_exit_codes_for_bad_arguments_and_unreachable_server(loadgen_cmd):
    bad = subprocess.run([sys.executable, *loadgen_cmd, "--concurrency", "0"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2
    down = subprocess.run([sys.executable, *loadgen_cmd, "--url", "http://127.0.0.1:9", "--json"],
                          capture_output=True, text=True, timeout=30)
    assert down.returncode == 3 and "cannot reach" in down.stderr and down.stdout == ""


def test_percentiles_follow_numpy_linear_interpolation():
    r = [loadgen.RequestResult(success=True, ttft=t, latency=t + 0.01, output_len=2, itl=[0.01], start_time=0.0)
         for t in (0.01, 0.02, 0.03, 0.04, 0.10)]
    m = loadgen.compute_metrics(r, 1.0)
    assert m["median_ttft_ms"] == pytest.approx(30.0)
    assert m["p90_ttft_ms"] == pytest.approx(76.0)       # numpy.percentile([10,20,30,40,100], 90)
    assert m["std_ttft_ms"] == pytest.approx(31.62277, rel=1e-4)
