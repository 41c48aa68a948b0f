"""Results I/O: bench_serving import, our JSONL round trip, medians over repeats."""
from __future__ import annotations

import json

import pytest

from opsctl.gate.results import (BenchLevel, BenchRun, import_bench_serving, parse_loadgen_output, read_jsonl,
                                  write_jsonl)
from opsctl.errors import ConfigError


def bench_serving_line(max_concurrency: int, tok_s: float, *, details: bool = False) -> str:
    """One line as `python -m sglang.bench_serving --output-file` appends it (0.5.23 field set)."""
    rec = {
        "tag": None, "backend": "sglang", "dataset_name": "random", "request_rate": float("inf"),
        "max_concurrency": max_concurrency, "sharegpt_output_len": None, "random_input_len": 1024,
        "random_output_len": 256, "random_range_ratio": 0.0,
        "server_info": {"internal_states": [{"avg_spec_accept_length": 1.58, "last_gen_throughput": 70.1}],
                        "tp_size": 8},
        "duration": 40.0, "completed": 64, "total_input_tokens": 65536, "total_input_text_tokens": 65536,
        "total_input_vision_tokens": 0, "total_output_tokens": 16384, "total_output_tokens_retokenized": 16380,
        "request_throughput": 1.6, "input_throughput": 1638.4, "output_throughput": tok_s, "total_throughput": 2048.0,
        **{f"{s}_{m}_ms": 10.0 for s in ("mean", "median", "std", "p90", "p95", "p99")
           for m in ("e2e_latency", "ttft", "tpot", "itl")},
        "concurrency": max_concurrency * 0.97, "accept_length": 1.58, "max_output_tokens_per_s": tok_s * 1.2,
        "max_concurrent_requests": max_concurrency,
    }
    if details:
        rec.update(input_lens=[1024] * 3, output_lens=[256, 0, 256], ttfts=[0.1, 0.0, 0.1], itls=[[0.01]] * 3,
                   generated_texts=["a", "", "b"], errors=["", "boom", ""])
    return json.dumps(rec)   # Infinity, as json.dumps writes float('inf')


def test_import_bench_serving_file(tmp_path):
    f = tmp_path / "sglang_0529.jsonl"
    f.write_text("\n".join([bench_serving_line(1, 50.0), bench_serving_line(128, 87.0),
                            bench_serving_line(1, 52.0, details=True)]) + "\n")
    run = import_bench_serving(f)
    assert run.concurrencies() == [1, 128]
    assert [(lv.level, lv.repeat) for lv in run.levels] == [(1, 0), (128, 0), (1, 1)]
    assert run.levels[0].accept == pytest.approx(1.58)
    assert run.levels[2].errors == 1                           # from --output-details' per-request errors
    assert "server_info" not in run.levels[0].model_dump()     # dropped: big and not ours
    med = run.median()
    assert med.at(1)[0].output_throughput == 51.0 and med.at(1)[0].repeats_merged == 2
    assert run.meta["imported_from"] == "sglang.bench_serving" and run.meta["random_input_len"] == 1024


def test_import_rejects_files_without_results(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"hello": 1}\n')
    with pytest.raises(ConfigError):
        import_bench_serving(f)
    with pytest.raises(ConfigError):
        import_bench_serving(tmp_path / "missing.jsonl")


def test_jsonl_round_trip_keeps_levels_canary_and_meta(tmp_path):
    text = "\n".join([
        json.dumps({"record": "level", "max_concurrency": 1, "repeat": 0, "output_throughput": 100.0, "errors": 0,
                    "level_accept_length": 3.2, "error_samples": []}),
        json.dumps({"record": "level", "max_concurrency": 1, "repeat": 1, "output_throughput": 110.0, "errors": 0}),
        json.dumps({"record": "canary", "seed": 0, "max_new_tokens": 4, "prompts": [[1, 2]], "outputs": [[3, 4, 5, 6]],
                    "error": None, "mismatch": None, "compared": False}),
        "[loadgen] progress lines are ignored",
    ])
    run = parse_loadgen_output(text, {"release": "r1", "profile_kind": "ddtree"})
    p = write_jsonl(run, tmp_path / "out" / "run.jsonl")
    back = read_jsonl(p)
    assert back.meta["release"] == "r1" and back.repeats == 2
    assert back.canary.outputs == [[3, 4, 5, 6]]
    assert back.canary.reference() == {"seed": 0, "max_new_tokens": 4, "prompts": [[1, 2]], "outputs": [[3, 4, 5, 6]]}
    assert back.median().levels[0].output_throughput == 105.0
    assert back.median().levels[0].output_throughput_spread == pytest.approx(10 / 105)
    # a bench_serving file reads as a run too (bench compare accepts either)
    for line in p.read_text().splitlines()[1:3]:
        assert "output_throughput" in json.loads(line)


def test_loadgen_output_without_levels_is_an_error():
    with pytest.raises(ConfigError):
        parse_loadgen_output("[loadgen] cannot reach\n")


def test_median_sums_errors_over_repeats():
    run = BenchRun(levels=[BenchLevel(max_concurrency=4, repeat=i, output_throughput=v, errors=e)
                           for i, (v, e) in enumerate([(1.0, 1), (3.0, 0), (2.0, 2)])])
    lv = run.median().levels[0]
    assert (lv.output_throughput, lv.errors, lv.repeats_merged) == (2.0, 3, 3)
