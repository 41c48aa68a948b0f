"""The SGLang 0.5.23 emulator, run locally (no lab needed): log formats, endpoints, model, faults."""
from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from lab_emu import (RE_CAPTURE_BEGIN, RE_CAPTURE_END, RE_CAPTURE_FAILED, RE_DECODE, RE_PREFILL, RE_READY, Emu,
                     EMULATOR_SRC)

import sys

sys.path.insert(0, str(EMULATOR_SRC))
from sglang.lab import perf  # noqa: E402  (the emulator's model, imported from its source)

DDTREE16 = ["--tp-size", "8", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
            "--speculative-num-draft-tokens", "17", "--cuda-graph-max-bs-decode", "64"]


def _journal():
    try:
        from opsctl import journal
    except ImportError:
        return None
    return journal


def decodes(emu: Emu) -> list[dict]:
    out = []
    for line in emu.lines:
        m = RE_DECODE.match(line)
        if m:
            out.append({k: v for k, v in m.groupdict().items()})
    return out


# ------------------------------------------------------------------ startup lines

def test_startup_lines_parse_with_sglang_formats(tmp_path):
    with Emu(tmp_path, DDTREE16 + ["--decode-log-interval", "2"]) as emu:
        emu.wait_ready()
        emu.generate("hello world", 24)
        emu.wait_line(RE_DECODE, 5)
        text = emu.text()
    begins = [RE_CAPTURE_BEGIN.match(l) for l in emu.lines if "CUDA graph begin" in l]
    ends = [RE_CAPTURE_END.match(l) for l in emu.lines if "CUDA graph end" in l]
    assert begins and all(begins) and ends and all(ends), text[:4000]
    verify = [m for m in begins if m["name"] == "target verify"]
    assert [m["rank"] for m in verify] == [f"TP{r}" for r in range(8)]
    assert {m["n"] for m in verify} == {"17"}               # DDTREE: budget + 1
    verify_end = [m for m in ends if m["name"] == "target verify"]
    bs = [int(x) for x in verify_end[0]["bs"].split(",")]
    assert bs == list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))   # SGLang's spec list, max 64
    draft = [m for m in begins if m["name"] == "draft decode"]
    assert {m["n"] for m in draft} == {"8"}                 # the drafter runs block_size tokens
    assert sum(bool(RE_READY.match(l)) for l in emu.lines) == 1
    assert any(RE_PREFILL.match(l) for l in emu.lines)
    assert decodes(emu), text[-2000:]
    assert any(l.startswith("[") and "] server_args=ServerArgs(" in l for l in emu.lines)
    journal = _journal()
    if journal is not None:  # the validator's parser reads the same lines
        parsed = journal.parse(text)
        kinds = {(c.kind, c.num_tokens_per_req, c.complete) for c in parsed.captures}
        assert any(n == 17 and ok for _, n, ok in kinds), kinds
        assert len(parsed.ready) == 1
        assert parsed.decodes and parsed.decodes[0].accept_len is not None
        assert not parsed.failures, parsed.failures


def test_autoregressive_and_dflash_widths(tmp_path):
    with Emu(tmp_path / "ar", ["--tp-size", "8", "--cuda-graph-max-bs-decode", "32"]) as emu:
        emu.wait_ready()
    ar = [RE_CAPTURE_BEGIN.match(l) for l in emu.lines if "CUDA graph begin" in l]
    assert {(m["name"], m["n"]) for m in ar} == {("target decode", "1")}
    ar_end = [RE_CAPTURE_END.match(l) for l in emu.lines if "CUDA graph end" in l][0]
    assert [int(x) for x in ar_end["bs"].split(",")] == [1, 2, 4, 8, 12, 16, 24, 32]
    with Emu(tmp_path / "df", ["--tp-size", "8", "--speculative-algorithm", "DFLASH",
                               "--speculative-draft-model-path", "{drafter}"]) as emu:
        emu.wait_ready()
    df = [RE_CAPTURE_BEGIN.match(l) for l in emu.lines if "target verify CUDA graph begin" in l]
    assert {m["n"] for m in df} == {"8"}                     # DFLASH: block size (from the drafter's config)


def test_ep_ranks_prefix(tmp_path):
    with Emu(tmp_path, ["--tp-size", "8", "--ep-size", "8"]) as emu:
        emu.wait_ready()
    ranks = [RE_CAPTURE_BEGIN.match(l)["rank"] for l in emu.lines if "CUDA graph begin" in l]
    assert ranks == [f"TP{r} EP{r}" for r in range(8)]


# ------------------------------------------------------------------ flags (the real parser's table)

@pytest.mark.parametrize("argv,needle", [
    (["--cuda-graph-max-bs", "16"], "ambiguous option: --cuda-graph-max-bs"),   # gone in 0.5.23 (prefix of two flags)
    (["--enable-ep-moe"], "unrecognized arguments: --enable-ep-moe"),                  # gone
    (["--cuda-graph-backend-decode", "fast"], "invalid choice"),
    (["--tp-size", "eight"], "invalid int value"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_rejects_what_sglang_rejects(tmp_path, argv, needle):
    emu = Emu(tmp_path, argv)
    rc = emu.wait_exit()
    assert rc == 2 and needle in emu.text(), emu.text()


def test_ddtree_needs_an_allowed_plugin(tmp_path):
    emu = Emu(tmp_path / "none", DDTREE16, ddtree_plugin=False)
    assert emu.wait_exit() == 1
    assert "ValueError: Unknown speculative algorithm name: DDTREE" in emu.text()
    emu = Emu(tmp_path / "blocked", DDTREE16, plugins="something_else")
    assert emu.wait_exit() == 1
    assert "Skipping plugin ddtree (not in SGLANG_PLUGINS)" in emu.text()
    with Emu(tmp_path / "ok", DDTREE16, plugins=None) as emu:   # unset SGLANG_PLUGINS: all plugins load
        emu.wait_ready()


def test_missing_model_and_draft_paths_fail_like_sglang(tmp_path):
    emu = Emu(tmp_path / "m", ["--model-path", str(tmp_path / "nope")])
    assert emu.wait_exit() == 1
    assert f"OSError: Can't load the configuration of '{tmp_path / 'nope'}'" in emu.text()
    emu = Emu(tmp_path / "d", ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                               str(tmp_path / "nodrafter")])
    assert emu.wait_exit() == 1
    assert "Can't load the configuration of" in emu.text() and "nodrafter" in emu.text()


# ------------------------------------------------------------------ endpoints

def test_health_generate_503_before_ready_then_200(tmp_path):
    with Emu(tmp_path, ["--tp-size", "8"], faults={"slow_start": {"load_s": 0, "warmup_s": 1.5}}) as emu:
        codes = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                codes.append(emu.get("/health_generate", timeout=5)[0])
            except OSError:
                codes.append(None)            # port not open yet (weights loading)
            if codes[-1] == 200:
                break
            time.sleep(0.05)
        assert 503 in codes and codes[-1] == 200, codes
        assert codes.index(200) > codes.index(503)
        assert emu.get("/health")[0] == 200 and emu.get("/ready")[0] == 200


def test_endpoints(tmp_path):
    with Emu(tmp_path, DDTREE16 + ["--enable-metrics", "--served-model-name", "kimi-k2.6"]) as emu:
        emu.wait_ready()
        out = emu.generate("the quick brown fox", 16)
        assert out["meta_info"]["completion_tokens"] == 16 and len(out["output_ids"]) == 16
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 16}
        st, body = emu.post("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 5,
                                                                                      "temperature": 0}})
        assert st == 200 and len(json.loads(body)["output_ids"]) == 5
        # native streaming
        req = urllib.request.Request(emu.url + "/generate", data=json.dumps(
            {"text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 12, "temperature": 0}}).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            events = [l for l in r.read().decode().split("\n\n") if l.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        last = json.loads(events[-2][6:])
        assert last["meta_info"]["completion_tokens"] == 12
        # OpenAI streaming completions
        req = urllib.request.Request(emu.url + "/v1/completions", data=json.dumps(
            {"model": "kimi-k2.6", "prompt": "hi", "max_tokens": 10, "stream": True, "temperature": 0,
             "stream_options": {"include_usage": True}}).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            chunks = [l[6:] for l in r.read().decode().split("\n\n") if l.startswith("data: ")]
        assert chunks[-1] == "[DONE]"
        body = [json.loads(c) for c in chunks[:-1]]
        assert "".join(c["choices"][0]["text"] for c in body if c["choices"]) == last["text"][:len(
            "".join(c["choices"][0]["text"] for c in body if c["choices"]))]
        assert body[-1]["usage"]["completion_tokens"] == 10
        st, body = emu.post("/v1/completions", {"model": "kimi-k2.6", "prompt": "hi", "max_tokens": 4})
        assert st == 200 and json.loads(body)["usage"]["completion_tokens"] == 4
        st, body = emu.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert st == 200 and json.loads(body)["choices"][0]["message"]["role"] == "assistant"
        st, body = emu.get("/v1/models")
        assert json.loads(body)["data"][0]["id"] == "kimi-k2.6"
        st, body = emu.get("/server_info")
        info = json.loads(body)
        assert info["speculative_algorithm"] == "DDTREE" and info["tp_size"] == 8
        assert info["internal_states"][0]["avg_spec_accept_length"] > 3
        st, body = emu.get("/metrics")
        text = body.decode()
        for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:gen_throughput",
                     "sglang:generation_tokens_total", "sglang:time_to_first_token_seconds",
                     "sglang:inter_token_latency_seconds", "sglang:e2e_request_latency_seconds",
                     "sglang:is_cuda_graph", "sglang:num_running_reqs", "sglang:num_queue_reqs"):
            assert name in text, name
        assert emu.get("/nope")[0] == 404


def test_metrics_off_without_flag(tmp_path):
    with Emu(tmp_path, ["--tp-size", "8"]) as emu:
        emu.wait_ready()
        assert emu.get("/metrics")[0] == 404


# ------------------------------------------------------------------ model: greedy + performance

PROMPTS = ["alpha beta gamma", "the cat sat on the mat", "one two three four"]


def _greedy(tmp_path, args, faults=None, env=None):
    with Emu(tmp_path, args, faults=faults, env=env) as emu:
        emu.wait_ready()
        return [emu.generate(p, 20)["output_ids"] for p in PROMPTS]


def test_greedy_output_is_lossless_across_profiles(tmp_path):
    ar = _greedy(tmp_path / "ar", ["--tp-size", "8"])
    ep = _greedy(tmp_path / "ep", ["--tp-size", "8", "--ep-size", "8"])
    dd = _greedy(tmp_path / "dd", DDTREE16)
    df = _greedy(tmp_path / "df", ["--tp-size", "8", "--speculative-algorithm", "DFLASH",
                                   "--speculative-draft-model-path", "{drafter}"])
    assert ar == ep == dd == df
    assert len({tuple(x) for x in ar}) == len(PROMPTS)     # per-prompt outputs differ


@pytest.mark.timing  # tokens per second against the performance model
def test_64_concurrent_requests_match_the_model(tmp_path):
    """DDTree budget 8, TP8, 64 concurrent requests: decode lines within 10% of perf.Model."""
    args = ["--tp-size", "8", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
            "--speculative-num-draft-tokens", "9", "--cuda-graph-max-bs-decode", "64", "--decode-log-interval", "4"]
    model = perf.Model("tp", "DDTREE", 9, 8)
    domain = perf.domain_of(" ".join(f"w0_{j}" for j in range(16)))  # what emu.load sends
    want_accept, want_tput = model.accept_len_for(domain), model.throughput_for(64, domain)
    with Emu(tmp_path, args) as emu:
        emu.wait_ready()
        t0 = time.monotonic()
        outs = emu.load(64, 96)
        wall = time.monotonic() - t0
    assert all(o["meta_info"]["completion_tokens"] == 96 for o in outs)
    lines = [d for d in decodes(emu) if d["running"] == "64"]
    # the first line's interval includes the prefill; the last ones the short final steps of
    # requests that only need their remaining few tokens
    steady = [d for d in lines[1:] if int(d["tokens"]) < 0.9 * 64 * (16 + 96)]
    assert len(steady) >= 3, emu.text()[-3000:]
    for d in steady:
        assert abs(float(d["accept_len"]) - want_accept) / want_accept < 0.10, (d, want_accept)
        assert abs(float(d["gen"]) - want_tput) / want_tput < 0.10, (d, want_tput)
        assert d["cuda_graph"] == "True"
        # 0.5.23's accept rate: correct drafts / (rounds * (num_draft_tokens - 1)) -> 9 read back
        n = 1 + (float(d["accept_len"]) - 1) / float(d["accept_rate"])
        assert abs(n - 9) < 0.6, n
    assert wall < 30


def test_performance_model_numbers():
    assert round(perf.Model("tp").throughput(1)) == 98
    assert round(perf.Model("ep").throughput(1)) == 65
    assert abs(perf.ddtree_accept_len(8) - 4.5) < 0.05
    assert 5.3 <= perf.ddtree_accept_len(16) <= 6.4
    assert perf.ddtree_accept_len(64) - perf.ddtree_accept_len(32) < 0.2          # flattening
    ar, dd = perf.Model("tp"), perf.Model("tp", "DDTREE", 17)
    assert dd.throughput(1) > 2 * ar.throughput(1)                                 # wins at low concurrency
    assert dd.throughput(128) < ar.throughput(128)                                 # loses at high concurrency
    broken = perf.Model("tp", "DDTREE", 33, 8, perf.COLLAPSE_ACCEPT_LEN, perf.COLLAPSE_CPU_TREE_MS_PER_REQ)
    assert 45 <= broken.throughput(1) <= 55 and 80 <= broken.throughput(128) <= 92
    assert 1.5 <= broken.accept_len() <= 1.65
    assert perf.Model("ep").throughput(128) > perf.Model("tp").throughput(128)     # EP wins at high concurrency


# ------------------------------------------------------------------ faults

def test_fault_capture_failure(tmp_path):
    emu = Emu(tmp_path, DDTREE16, faults={"capture_failure": {}})
    assert emu.wait_exit() == 1
    text = emu.text()
    assert any(RE_CAPTURE_FAILED.match(l) for l in emu.lines), text[-2000:]
    assert "Possible solutions:" in text and "Received sigquit from a child process" in text
    assert not RE_READY.search(text) and not any(RE_CAPTURE_END.match(l) for l in emu.lines)
    journal = _journal()
    if journal is not None:
        parsed = journal.parse(text)
        assert parsed.failures and not parsed.ready


def test_fault_wrong_verify_tokens(tmp_path):
    args = DDTREE16 + ["--decode-log-interval", "2"]
    with Emu(tmp_path / "log", args, faults={"wrong_verify_tokens": {}}) as emu:
        emu.wait_ready()
        emu.generate("hello there", 40)
    verify = [RE_CAPTURE_BEGIN.match(l) for l in emu.lines if "target verify CUDA graph begin" in l]
    assert {m["n"] for m in verify} == {"8"}                  # captured with block_size, not budget+1 (17)
    d = [x for x in decodes(emu) if x["accept_rate"] and float(x["accept_rate"]) > 0][-1]
    n = 1 + (float(d["accept_len"]) - 1) / float(d["accept_rate"])
    assert abs(n - 8) < 1.0, (d, n)                           # decode lines imply 8 draft tokens, as on the site
    emu = Emu(tmp_path / "crash", args, faults={"wrong_verify_tokens": {"crash": True}})
    assert emu.wait_exit() == 1
    assert "RuntimeError: The size of tensor a" in emu.text() and not RE_READY.search(emu.text())


def test_fault_slow_start(tmp_path):
    t0 = time.monotonic()
    with Emu(tmp_path, ["--tp-size", "8"], faults={"slow_start": {"load_s": 2.5}}) as emu:
        time.sleep(1.0)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", emu.port), timeout=1).close()
        emu.wait_ready(20)
    assert time.monotonic() - t0 >= 2.5


def test_fault_crash_after(tmp_path):
    with Emu(tmp_path, ["--tp-size", "8"], faults={"crash_after": {"requests": 3}}) as emu:
        emu.wait_ready()
        for i in range(3):
            try:
                emu.generate(f"p{i}", 4)
            except OSError:
                pass
        assert emu.wait_exit(10) == 1
    assert "Scheduler hit an exception" in emu.text() and "illegal memory access" in emu.text()


@pytest.mark.timing  # tokens per second against the performance model
def test_fault_accept_collapse_is_the_sites_broken_ddtree(tmp_path):
    args = ["--tp-size", "8", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
            "--speculative-num-draft-tokens", "33", "--decode-log-interval", "10"]
    with Emu(tmp_path, args, faults={"accept_collapse": {}}) as emu:
        emu.wait_ready()
        emu.generate("one request", 80)
    lines = [d for d in decodes(emu) if d["running"] == "1"][1:]
    assert lines, emu.text()[-2000:]
    for d in lines:
        assert 1.4 <= float(d["accept_len"]) <= 1.75, d
        assert 45 <= float(d["gen"]) <= 58, d                 # ~50 tok/s at C=1 (site)


def test_fault_wrong_output(tmp_path):
    good = _greedy(tmp_path / "good", DDTREE16)
    bad = _greedy(tmp_path / "bad", DDTREE16, faults={"wrong_output": {"after_tokens": 3}})
    assert all(g[:3] == b[:3] and g != b for g, b in zip(good, bad))


def test_fault_port_in_use(tmp_path):
    emu = Emu(tmp_path / "f", ["--tp-size", "8"], faults={"port_in_use": {}})
    assert emu.wait_exit() == 1
    assert "error while attempting to bind on address" in emu.text() and "address already in use" in emu.text()
    with socket.socket() as s:                                 # a real listener has the same effect
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        emu = Emu(tmp_path / "real", ["--tp-size", "8"], port=s.getsockname()[1])
        assert emu.wait_exit() == 1
        assert "[Errno 98] error while attempting to bind" in emu.text()


def test_gpu_registry_for_nvidia_smi(tmp_path):
    import subprocess
    import os

    smi = EMULATOR_SRC.parent / "nvidia_smi.py"
    with Emu(tmp_path, ["--tp-size", "8"]) as emu:
        emu.wait_ready()
        env = dict(os.environ, OPSCTL_LAB_RUN_DIR=str(emu.dirs["run"]))
        apps = subprocess.run([sys.executable, str(smi), "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader"], env=env, capture_output=True, text=True).stdout
        assert str(emu.proc.pid) in apps
        gpus = subprocess.run([sys.executable, str(smi), "--query-gpu=name,memory.total,memory.used,driver_version",
                               "--format=csv,noheader,nounits"], env=env, capture_output=True, text=True).stdout
        rows = [r.split(", ") for r in gpus.strip().splitlines()]
        assert len(rows) == 8 and all(r[0] == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition" for r in rows)
        assert all(r[1] == "97887" and int(r[2]) > 80000 for r in rows)
    apps = subprocess.run([sys.executable, str(smi), "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                          env=env, capture_output=True, text=True).stdout
    assert apps.strip() == ""


@pytest.mark.timing  # tokens per second against the site's numbers
@pytest.mark.parametrize("extra,want", [([], 98.0), (["--ep-size", "8"], 65.0)])
def test_autoregressive_c1_matches_the_site(tmp_path, extra, want):
    with Emu(tmp_path, ["--tp-size", "8", "--decode-log-interval", "10"] + extra) as emu:
        emu.wait_ready()
        emu.generate("a single request", 61)
    lines = [d for d in decodes(emu) if d["running"] == "1"][1:]     # the first interval includes the prefill
    assert len(lines) >= 4
    for d in lines:
        assert abs(float(d["gen"]) - want) / want < 0.10, (d, want)
        assert d["accept_len"] is None


# ------------------------------------------------------------------ DDTree budget schedule

SCHEDULE = "1:16,8:4,32:0"
DDTREE_SCHED = ["--tp-size", "8", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
                "--speculative-num-draft-tokens", "17", "--cuda-graph-max-bs-decode", "32"]


def _schedule_env(tmp_path, text: str = SCHEDULE) -> dict:
    bands = [{"min_bs": int(a), "budget": int(b)} for a, b in (p.split(":") for p in text.split(","))]
    path = tmp_path / "ddtree-schedule.json"
    path.write_text(json.dumps({"schedule": text, "bands": bands}))
    return {"SGLANG_DDTREE_SCHEDULE_FILE": str(path)}


def test_budget_schedule_captures_each_band_at_its_width(tmp_path):
    with Emu(tmp_path, DDTREE_SCHED, env=_schedule_env(tmp_path)) as emu:
        emu.wait_ready()
    tp0 = [l for l in emu.lines if " TP0] " in l]
    assert any(l.endswith(f"DDTree budget schedule: {SCHEDULE} (verify widths 17,5,1)") for l in tp0)
    begins = [RE_CAPTURE_BEGIN.match(l) for l in tp0 if "target verify CUDA graph begin" in l]
    ends = [RE_CAPTURE_END.match(l) for l in tp0 if "target verify CUDA graph end" in l]
    graphs = [(int(b["n"]), [int(x) for x in e["bs"].split(",")]) for b, e in zip(begins, ends)]
    # one graph per captured batch size, at its band's width: memory does not multiply
    assert graphs == [(17, list(range(1, 8))), (5, [8] + list(range(10, 31, 2))), (1, [32])]
    draft_end = [RE_CAPTURE_END.match(l) for l in tp0 if "draft decode CUDA graph end" in l][0]
    assert 32 not in [int(x) for x in draft_end["bs"].split(",")]   # budget 0: no drafter graph


@pytest.mark.timing  # tokens per second against the performance model (c=1 fell below 70 % beside the unit tier)
def test_budget_schedule_steps_follow_the_running_batch_and_stay_lossless(tmp_path):
    args = DDTREE_SCHED + ["--decode-log-interval", "4"]
    with Emu(tmp_path / "s", args, env=_schedule_env(tmp_path)) as emu:
        emu.wait_ready()
        t0 = time.monotonic()
        emu.load(1, 64)
        c1 = 64 / (time.monotonic() - t0)
        emu.load(32, 64)
        lines = decodes(emu)
    by_batch = {}
    for d in lines:
        by_batch.setdefault(int(d["running"]), []).append(float(d["accept_len"]))
    assert max(by_batch[1]) - 1 <= 16 and min(by_batch[1]) > 3.0           # budget 16's tree at batch 1
    assert all(a == 1.0 for a in by_batch[32][1:])                          # budget 0: no drafts at batch 32
    model16 = perf.Model("tp", "DDTREE", 17)
    assert c1 > 0.7 * model16.throughput_for(1, perf.domain_of("w0_0 w0_1"))
    assert _greedy(tmp_path / "g", args, env=_schedule_env(tmp_path)) == _greedy(tmp_path / "ar", ["--tp-size", "8"])


def test_a_schedule_the_plugin_would_reject_fails_the_start(tmp_path):
    env = _schedule_env(tmp_path, "1:8,8:4")   # widest band needs 9 draft tokens, the server says 17
    emu = Emu(tmp_path, DDTREE_SCHED, env=env)
    assert emu.wait_exit() == 1
    assert "ValueError: DDTREE budget schedule" in emu.text() and "--speculative-num-draft-tokens 9" in emu.text()


def test_fault_wrong_verify_tokens_hits_one_band_and_validate_names_it(tmp_path):
    journal = _journal()
    with Emu(tmp_path, DDTREE_SCHED, env=_schedule_env(tmp_path),
             faults={"wrong_verify_tokens": {"num_tokens_per_req": 8, "band": 1}}) as emu:
        emu.wait_ready()
    begins = {RE_CAPTURE_BEGIN.match(l)["n"] for l in emu.lines if "target verify CUDA graph begin" in l}
    assert begins == {"17", "8", "1"}
    if journal is None:
        return
    from opsctl.config import resolve_profile
    from opsctl.journal_findings import validate_startup

    found = {f.check: f for f in validate_startup(journal.parse(emu.text()), resolve_profile(
        "ddtree", budget_schedule=SCHEDULE))}
    bad = found["capture.band_widths"]
    assert not bad.ok and "batch 8-30 (budget 4)" in bad.diagnosis and "captured with 8 tokens/request" in bad.diagnosis
    assert "needs 5" in bad.diagnosis and "every rank (8)" in bad.diagnosis


def test_a_budget_too_small_for_the_drafter_block_fails_like_the_runtime(tmp_path):
    args = ["--tp-size", "8", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
            "--speculative-num-draft-tokens", "3"]   # budget 2: 2 x 3 = 6 KV slots per step, block 8
    emu = Emu(tmp_path, args)
    assert emu.wait_exit() == 1
    assert "must fit the per-step KV reservation" in emu.text() and "at least 3" in emu.text()
    with Emu(tmp_path / "ok", args[:-1] + ["4"]) as ok:   # budget 3: 8 slots hold the block
        ok.wait_ready()


def test_fault_scopes_pick_the_algorithm_and_the_draft_width():
    from sglang.lab import faults as emu_faults

    active = {"capture_failure": {"message": "x", "algorithm": "DDTREE", "num_draft_tokens": 8},
              "slow_start": {"load_s": 1.0, "algorithm": "none"}}
    assert list(emu_faults.for_algorithm(active, "DDTREE", 8)) == ["capture_failure"]  # budget 7
    assert emu_faults.for_algorithm(active, "DDTREE", 8)["capture_failure"] == {"message": "x"}
    assert emu_faults.for_algorithm(active, "DDTREE", 17) == {}  # another budget starts
    assert list(emu_faults.for_algorithm(active, None)) == ["slow_start"]


def test_ddtree_step_line_carries_the_models_parts_and_the_host_overhead_fault(tmp_path):
    """The runtime's `DDTree step parts:` line, every SGLANG_DDTREE_STEP_PARTS_EVERY decode steps:
    the target forward over bs x (budget + 1) tokens and the drafter as the performance model has
    them, and the host_overhead fault in the verify preparation only."""
    from opsctl.onhost.diagnosis import parse_step_parts

    with Emu(tmp_path, DDTREE16, faults={"host_overhead": {"ms_per_step": 30}},
             env={"SGLANG_DDTREE_STEP_PARTS_EVERY": "5"}) as emu:
        emu.wait_ready()
        emu.generate("one request", 60)
        emu.wait_line("DDTree step parts:", timeout=10)
    parts = [p for p in parse_step_parts(emu.lines) if p.bs == 1]
    assert parts, emu.text()[-2000:]
    want = perf.Model("tp", "DDTREE", 17, host_ms_per_step=30.0).step_parts(1)
    p = parts[0]
    assert p.budget == 16 and p.sampled >= 1 and p.of == 5
    assert p.parts["target_ms"] == pytest.approx(9.68 + 0.52 * 17, abs=1e-3)
    assert p.parts["prep_ms"] == pytest.approx(30.0, abs=1e-3)
    assert p.parts == pytest.approx(want, abs=1e-3)
    assert p.step_ms == pytest.approx(sum(want.values()), abs=1e-2)


def test_no_step_line_without_ddtree_or_when_turned_off(tmp_path):
    with Emu(tmp_path, DDTREE16, env={"SGLANG_DDTREE_STEP_PARTS_EVERY": "0"}) as emu:
        emu.wait_ready()
        emu.generate("one request", 40)
    assert "DDTree step parts:" not in emu.text()


def test_the_harness_starts_again_when_its_free_port_was_taken(tmp_path, monkeypatch):
    """CI saw it (stop 55): another test's client socket took the port free_port() had picked, the
    emulator died with [Errno 98] after its capture, and a test failed on the harness, not the emulator."""
    import lab_emu
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    real_free_port = lab_emu.free_port
    monkeypatch.setattr(lab_emu, "free_port", lambda: next(ports, None) or real_free_port())
    try:
        with Emu(tmp_path, ["--tp-size", "8"]) as emu:
            emu.wait_ready()
            assert emu.port != taken.getsockname()[1]
            assert emu.get("/health")[0] == 200
    finally:
        taken.close()
