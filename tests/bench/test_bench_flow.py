"""The flow the deploy runs, on a LocalConnection: copy the host-side archive to the "host",
bench the baseline (storing its canary), bench a candidate with that canary,
parse, judge. Two fake servers stand in for the baseline and the release."""
from __future__ import annotations

import pytest

import json

from bench_fakeserver import FakeSGLang, Schedule
from opsctl.gate.decide import GatePolicy, judge
from opsctl.gate.measure import loadgen_command
from opsctl.gate.results import parse_loadgen_output
from opsctl.host.connection import LocalConnection
from opsctl.onhost import ARCHIVE_NAME, archive

# max_spread off: the fake servers' millisecond timings spread by tens of percent on a
# loaded 2-core CI machine; the noise gate has its own tests (test_bench_gates.py), this
# flow is about speed, accept length and the canary.
POLICY = GatePolicy(concurrency=[1, 2], input_len=8, output_len=12, requests_per_level=2, repeats=2, warmup=1,
                    canary_prompts=3, canary_input_len=8, canary_output_len=6, max_spread=10.0,
                    min_requests=4)


def bench(conn, remote, url, **kw):
    res = conn.run(loadgen_command(POLICY, url=url, remote_path=remote, quiet=True, **kw), timeout=60)
    return parse_loadgen_output(res.stdout, {"url": url})


@pytest.mark.timing  # judges wall-clock rates of fake servers: the timing tier, on a quieter machine
def test_slow_candidate_is_rejected_and_fast_lossless_one_passes(tmp_path):
    conn = LocalConnection()
    local = tmp_path / ARCHIVE_NAME
    local.write_bytes(archive())
    remote = str(tmp_path / "host" / ARCHIVE_NAME)
    conn.put(local, remote, mode=0o755)
    with FakeSGLang(Schedule(ttft_s=0.01, gap_s=0.004)) as url:                        # autoregressive baseline
        baseline = bench(conn, remote, url, make_canary=True)
    canary_file = tmp_path / "host" / "baseline-canary.json"
    canary_file.write_text(json.dumps(baseline.canary.reference()))

    # the site's failure: half the speed, accept length collapsed (1 token per verify step)
    with FakeSGLang(Schedule(ttft_s=0.01, gap_s=0.008, tokens_per_event=1, accept_length=1.0)) as url:
        slow = bench(conn, remote, url, canary_file=str(canary_file))
    v = judge(slow, baseline, POLICY, profile_kind="ddtree", canary_mismatch=slow.canary.mismatch,
              canary_ran=slow.canary.compared)
    assert v.status == "fail" and any("accept length 1.00 below" in r for r in v.reasons)
    assert v.rows[0].delta_pct < -30

    # 3 tokens per verify step at the same step time: ~3x faster, identical greedy output
    with FakeSGLang(Schedule(ttft_s=0.01, gap_s=0.004, tokens_per_event=3, accept_length=3.0)) as url:
        fast = bench(conn, remote, url, canary_file=str(canary_file))
    v = judge(fast, baseline, POLICY, profile_kind="ddtree", canary_mismatch=fast.canary.mismatch,
              canary_ran=fast.canary.compared)
    assert v.status == "pass", v.reasons

    # same speed-up, but a wrong greedy token: the canary fails it
    first = baseline.canary.prompts[0][0]
    with FakeSGLang(Schedule(ttft_s=0.01, gap_s=0.004, tokens_per_event=3, accept_length=3.0,
                             corrupt_first_token=first, corrupt_position=3)) as url:
        wrong = bench(conn, remote, url, canary_file=str(canary_file))
    v = judge(wrong, baseline, POLICY, profile_kind="ddtree", canary_mismatch=wrong.canary.mismatch,
              canary_ran=wrong.canary.compared)
    assert v.status == "fail"
    canary = ("canary: greedy output differs from the baseline at prompt 0, token 3 "
              f"(expected {baseline.canary.outputs[0][3]}, got {wrong.canary.outputs[0][3]})")
    # the canary alone fails it; beside it, at most a speed-up the 4 requests could not prove on a busy
    # machine (the sequential rule's interval), never a loss
    assert canary in v.reasons and all(r == canary or "not proven" in r for r in v.reasons), v.reasons
