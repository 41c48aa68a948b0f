"""Workloads: real prompt sets, the site's own traffic files, deterministic selection."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.gate.workloads import DEFAULT_MIX, WorkloadSet, load, load_file, mix_key, parse_mix
from opsctl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

# sglang.bench_serving's ShareGPT format (ShareGPT_V3_unfiltered_cleaned_split.json), two real-shaped entries
SHAREGPT = [
    {"id": "QWJhYvA_0", "conversations": [
        {"from": "human", "value": "Summarize the main ideas of Jeff Walker's Product Launch Formula into bullet points."},
        {"from": "gpt", "value": "Here are the main ideas of Jeff Walker's Product Launch Formula:\n\n* Pre-launch: build "
                                 "anticipation with free, valuable content.\n* Launch: open the cart for a short time."}]},
    {"id": "i6IyJda_0", "conversations": [
        {"from": "human", "value": "How to tell if a customer segment is well segmented? In 3 bullet points."},
        {"from": "gpt", "value": "1. Homogeneity\n2. Distinctiveness\n3. Stability"},
        {"from": "human", "value": "thanks"}]},
    {"id": "short", "conversations": [{"from": "human", "value": "only a question, no answer"}]},
]


def test_humaneval_reads_the_packages_164_prompts():
    reqs = load("humaneval")
    assert len(reqs) == 164
    first = dict(reqs[0].messages[0])
    assert first["role"] == "user" and "def has_close_elements" in first["content"]
    assert all(r.max_tokens and r.max_tokens >= 16 for r in reqs)


@pytest.mark.parametrize("name", ["chat", "math"])
def test_shipped_sets_are_a_few_dozen_varied_prompts(name):
    reqs = load(name)
    assert 30 <= len(reqs) <= 60
    lens = [len(dict(r.messages[0])["content"]) for r in reqs]
    assert max(lens) > 3 * min(lens)  # varied in length
    assert len({dict(r.messages[0])["content"] for r in reqs}) == len(reqs)
    note = json.loads((REPO / "opsctl/data/workloads" / f"{name}.jsonl").read_text().splitlines()[0])
    assert "written for opsctl" in note["_note"]


def test_sharegpt_file_takes_the_first_human_turn_and_the_answer_length(tmp_path):
    f = tmp_path / "sharegpt.json"
    f.write_text(json.dumps(SHAREGPT))
    reqs = load_file(f, "file:" + str(f))
    assert len(reqs) == 2  # the entry without an answer is skipped, as bench_serving does
    assert dict(reqs[0].messages[0])["content"].startswith("Summarize the main ideas")
    assert reqs[1].max_tokens == round(len("1. Homogeneity\n2. Distinctiveness\n3. Stability") / 4)


def test_openai_request_log_and_plain_prompts(tmp_path):
    log = tmp_path / "requests.jsonl"
    log.write_text(json.dumps({"model": "kimi", "messages": [{"role": "system", "content": "be brief"},
                                                              {"role": "user", "content": "hi"}], "max_tokens": 64})
                   + "\n" + json.dumps({"messages": [{"role": "user", "content": "and you?"}]}) + "\n")
    reqs = load_file(log, "file:x")
    assert [r.max_tokens for r in reqs] == [64, None] and len(reqs[0].messages) == 2
    # the gate's output_len caps a request's own answer length; a request without one gets it
    assert [r.payload(32)["max_tokens"] for r in reqs] == [32, 32]
    assert [r.payload(128)["max_tokens"] for r in reqs] == [64, 128]
    plain = tmp_path / "prompts.txt"
    plain.write_text("first prompt\n\nsecond prompt\n")
    assert [dict(r.messages[0])["content"] for r in load_file(plain, "file:y")] == ["first prompt", "second prompt"]


@pytest.mark.parametrize("body,where", [
    ('{"messages": [{"role": "user", "content": "ok"}]}\n{"messages": "not a list"}\n', ":2:"),
    ('{"messages": [{"role": "user", "content": "ok"}]}\n{not json\n', ":2:"),
    ('{"messages": [{"role": "user", "content": "ok"}], "max_tokens": -5}\n', ":1:"),
])
def test_a_malformed_request_log_names_file_and_line(tmp_path, body, where):
    f = tmp_path / "bad.jsonl"
    f.write_text(body)
    with pytest.raises(ConfigError) as exc:
        load_file(f, "file:" + str(f))
    assert f"{f}{where}" in exc.value.problem


def test_malformed_sharegpt_json_names_the_line(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('[\n  {"conversations": [\n    {"from": "human", "value": "x"},\n  ]}\n]\n')
    with pytest.raises(ConfigError) as exc:
        load_file(f, "file:" + str(f))
    assert f"{f}:" in exc.value.problem and "not valid JSON" in exc.value.problem


def test_mixes_parse_and_unknown_names_suggest():
    assert parse_mix("humaneval:0.3,chat:0.5,math:0.2") == pytest.approx({"humaneval": 0.3, "chat": 0.5, "math": 0.2})
    assert parse_mix("humaneval,chat") == {"humaneval": 0.5, "chat": 0.5}
    assert parse_mix(None) == DEFAULT_MIX and "random" not in DEFAULT_MIX
    with pytest.raises(ConfigError, match="did you mean 'humaneval'"):
        parse_mix("humaneva")
    with pytest.raises(ConfigError, match="weight"):
        parse_mix("chat:0")
    assert mix_key(parse_mix("math,chat")) == "chat=0.500,math=0.500"


def test_selection_is_deterministic_split_by_weight_and_the_same_for_both_sides():
    ws = WorkloadSet.load(parse_mix("humaneval:0.3,chat:0.5,math:0.2"))
    a = ws.select(20, seed=7, level=4, repeat=1)
    b = WorkloadSet.load(parse_mix("humaneval:0.3,chat:0.5,math:0.2")).select(20, seed=7, level=4, repeat=1)
    assert a == b
    assert sorted(r.workload for r in a) == sorted(["humaneval"] * 6 + ["chat"] * 10 + ["math"] * 4)
    assert ws.select(20, seed=7, level=4, repeat=2) != a  # another round, other requests
    rnd = WorkloadSet.load({"random": 1.0}, input_len=12).select(3, seed=0, level=1, repeat=0)
    assert all(len(r.input_ids) == 12 and not r.messages for r in rnd)


def test_bench_with_a_malformed_workload_file_is_exit_2_before_any_request(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"messages": []}\n')
    p = subprocess.run([sys.executable, "-m", "opsctl", "bench", "--url", "http://127.0.0.1:9", "--workload",
                        f"file:{f}"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 2 and f"{f}:1:" in p.stderr and "Traceback" not in p.stderr
