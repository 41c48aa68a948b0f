"""Greedy losslessness canary: deterministic prompts, exact comparison, first divergence."""
from __future__ import annotations

import json
import subprocess
import sys

from bench_fakeserver import FakeSGLang, Schedule
from opsctl.gate import canary
from opsctl.onhost import ARCHIVE_NAME, archive
from opsctl.gate.results import from_records


def test_prompts_are_deterministic_from_the_seed():
    a = canary.make_prompts(seed=7, n=4, input_len=16)
    assert a == canary.make_prompts(seed=7, n=4, input_len=16)
    assert a != canary.make_prompts(seed=8, n=4, input_len=16)
    assert len(a) == 4 and all(len(p) == 16 for p in a)


def test_identical_outputs_compare_equal():
    assert canary.compare([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) is None


def test_first_divergence_is_reported_by_prompt_and_position():
    m = canary.compare([[1, 2, 3], [4, 5, 6], [7, 8, 9]], [[1, 2, 3], [4, 5, 0], [7, 0, 9]])
    assert (m.prompt, m.position, m.expected, m.got) == (1, 2, 6, 0)
    assert "prompt 1, token 2" in m.one_line()


def test_a_shorter_output_or_a_missing_prompt_is_a_mismatch():
    m = canary.compare([[1, 2, 3]], [[1, 2]])
    assert (m.prompt, m.position, m.expected, m.got, m.reason) == (0, 2, 3, None, "length differs")
    m = canary.compare([[1], [2]], [[1]])
    assert (m.prompt, m.got) == (1, None)


def test_a_wrong_greedy_token_on_the_server_is_caught_at_its_position(tmp_path):
    prompts = canary.make_prompts(seed=0, n=4, input_len=8)
    with FakeSGLang(Schedule()) as url:
        baseline = canary.run(url, prompts, max_new_tokens=12)
    with FakeSGLang(Schedule(corrupt_first_token=prompts[2][0], corrupt_position=5)) as url:
        candidate = canary.run(url, prompts, max_new_tokens=12)
    assert all(len(o) == 12 for o in baseline)
    m = canary.compare(baseline, candidate)
    assert m is not None and (m.prompt, m.position) == (2, 5)
    assert m.expected == baseline[2][5] and m.got == candidate[2][5]


def test_the_script_reproduces_a_stored_canary_file_on_the_host(tmp_path):
    """The deploy's flow: baseline run emits the canary; the candidate gets it as --canary-file."""
    loadgen_py = tmp_path / ARCHIVE_NAME   # as the host runs it: the host-side archive's load generator
    loadgen_py.write_bytes(archive())
    args = ["--concurrency", "1", "--input-len", "8", "--output-len", "2", "--requests-per-level", "1",
            "--warmup", "0", "--json", "--quiet"]
    with FakeSGLang(Schedule(ttft_s=0.001, gap_s=0.001)) as url:
        base = subprocess.run([sys.executable, str(loadgen_py), "loadgen", "--url", url, "--canary-prompts", "3",
                               "--canary-output-len", "6", *args], capture_output=True, text=True, timeout=30)
    ref = from_records(json.loads(x) for x in base.stdout.splitlines()).canary
    assert ref is not None and ref.outputs is not None and not ref.compared
    ref_file = tmp_path / "canary.json"
    ref_file.write_text(json.dumps(ref.reference()))
    for corrupt, expect in ((None, None), (ref.prompts[1][0], (1, 4))):
        sched = Schedule(ttft_s=0.001, gap_s=0.001, corrupt_first_token=corrupt, corrupt_position=4)
        with FakeSGLang(sched) as url:
            p = subprocess.run([sys.executable, str(loadgen_py), "loadgen", "--url", url, "--canary-file", str(ref_file), *args],
                               capture_output=True, text=True, timeout=30)
        rec = from_records(json.loads(x) for x in p.stdout.splitlines()).canary
        assert rec.compared
        assert (None if rec.mismatch is None else (rec.mismatch["prompt"], rec.mismatch["position"])) == expect
