"""Issue 33: `opsctl validate --from-file` on what operators paste from tickets: SGLang tracebacks
and log excerpts copied from public SGLang issues and pull requests (data/pasted/, sources in its
README.md), kept as they were pasted. Each test states what the operator must see."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from opsctl import journal
from opsctl.errors import CheckFailed, ConfigError
from validate_lines import DATA

PASTED = DATA / "pasted"


@pytest.fixture
def run():
    from opsctl.cli import _output
    from opsctl.cli import validate as validate_cli

    app = typer.Typer()
    validate_cli.register(app)

    @app.callback()
    def _root() -> None:
        pass

    def invoke(path, *args: str):
        result = CliRunner().invoke(app, ["validate", "--from-file", str(path), "--json", *args])
        _output.set_json(False)
        exc = result.exception
        code = exc.exit_code if isinstance(exc, (CheckFailed, ConfigError)) else result.exit_code
        data = json.loads(result.stdout) if result.stdout.strip().startswith("{") else None
        return code, data, exc
    return invoke


def failed(data) -> dict:
    return {f["check"]: f for f in data["findings"] if not f["ok"]}


def unknown(data) -> set:
    return {f["check"] for f in data["findings"] if f["ok"] and f["details"].get("status") == "unknown"}


# (file, recognised by, {check: text the diagnosis quotes}, text the first failure's fix holds)
CASES = [
    ("sglang-5285-capture-oom.txt", "a traceback with frames in sglang/",
     {"startup.capture_failed": "'Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
                                "448.00 MiB. GPU 7 has a total capacity of 95.00' (line 18)",
      "startup.cuda_oom": "CUDA out of memory: 'Exception: Capture cuda graph failed: CUDA out of memory."},
     "lower --mem-fraction-static"),
    ("sglang-4205-capture-gloo-chained.txt", "a traceback with frames in sglang/",
     {"startup.capture_failed": "'Exception: Capture cuda graph failed: [../third_party/gloo/gloo/transport/tcp/"
                                "pair.cc:534] Connection cl' (line 18)"},
     "NCCL_DEBUG=INFO"),
    ("sglang-1467-capture-illegal-memory-access.txt", "a traceback with frames in sglang/",
     {"startup.capture_failed": "'Exception: Capture cuda graph failed: Triton Error [CUDA]: an illegal memory "
                                "access was encountered' (line 12)"},
     "CUDA_LAUNCH_BLOCKING=1"),
    ("sglang-5029-capture-illegal-memory-access-tail.txt", "a traceback with frames in sglang/",
     {"startup.capture_failed": "'Exception: Capture cuda graph failed: RuntimeError: CUDA error: an illegal memory "
                                "access was encountered' (line 3)"},
     "CUDA_LAUNCH_BLOCKING=1"),
    ("sglang-27948-custom-allreduce-capture.txt", "an exception SGLang raises",
     {"startup.capture_failed": "custom_all_reduce.cuh:37: CUDA error: invalid argument' (line 1)"},
     "--disable-custom-all-reduce"),
    ("sglang-4289-nccl-unhandled-system-error.txt", "SGLang log prefixes",
     {"startup.errors": "'RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)' "
                        "(line 13)"},
     "NCCL_DEBUG=INFO"),
    ("sglang-26987-serving-illegal-memory-access.txt", "an exception SGLang raises",
     {"startup.errors": "'torch.AcceleratorError: CUDA error: an illegal memory access was encountered' (line 1)"},
     "CUDA_LAUNCH_BLOCKING=1"),
    ("sglang-23351-piecewise-replay-size-mismatch.txt", "SGLang log prefixes",
     {"serving.replay_error": "Root cause: Size mismatch for shape#0('num_tokens'): expected 6 but got 8' (line 1)"},
     "--disable-piecewise-cuda-graph"),
    ("sglang-4801-replay-interleaved-ranks.txt", "SGLang log prefixes",
     {"serving.replay_error": "CUDA-graph replay failed at line 22 ('return self.cuda_graph_runner.repl'); the "
                              "excerpt stops before the exception line"},
     "capture.batch_coverage"),
    ("sglang-6309-ray-serving-traceback.txt", "SGLang log prefixes",
     {"startup.errors": "a traceback whose exception line is not in the excerpt: 'Scheduler hit an exception: "
                        "Traceback (most recent call last):' (line 1)"},
     "read the whole traceback"),
    ("sglang-1751-capture-flashinfer-prefixed.txt", "SGLang log prefixes",
     {"capture.complete": "1 capture(s) began and never ended (legacy-unlabelled on TP0)",
      "startup.errors": "a traceback whose exception line is not in the excerpt"},
     "read the whole traceback"),
]


@pytest.mark.parametrize("name,how,quotes,fix", CASES, ids=[c[0] for c in CASES])
def test_a_pasted_excerpt_gets_the_findings_it_supports(run, name, how, quotes, fix):
    code, data, exc = run(PASTED / name)
    assert code == 6 and isinstance(exc, CheckFailed), exc          # a failure the excerpt shows: exit 6
    assert data["excerpt"] is True and data["recognised_by"] == how
    bad = failed(data)
    assert set(quotes) <= set(bad), bad.keys()
    for check, text in quotes.items():
        assert text in bad[check]["diagnosis"], (check, bad[check]["diagnosis"])
    assert fix in exc.fix
    # what an excerpt without a server_args line cannot say is unknown, not failed
    assert {"capture.expected_graphs", "capture.verify_width", "capture.batch_coverage",
            "startup.restarts"} <= unknown(data)


def test_only_what_the_excerpt_shows_fails(run):
    # a capture OOM: capture failed and OOM, nothing else claimed
    _, data, _ = run(PASTED / "sglang-5285-capture-oom.txt")
    assert set(failed(data)) == {"startup.capture_failed", "startup.cuda_oom"}
    # a replay error is not reported as a capture failure, and its scheduler death is not a second error
    _, data, _ = run(PASTED / "sglang-23351-piecewise-replay-size-mismatch.txt")
    assert set(failed(data)) == {"serving.replay_error"}


def test_ray_prefixed_frames_are_read_as_frames():
    parsed = journal.load_file(PASTED / "sglang-6309-ray-serving-traceback.txt")
    frames = [ln for ln in parsed.lines if ln.text.startswith("  File ")]
    assert len(frames) == 4 and frames[0].text.startswith('  File "/sgl-workspace/sglang/python/sglang/srt/managers/')


def test_the_project_readme_is_still_refused_with_file_and_line(run):
    readme = DATA.parents[2] / "README.md"
    code, _, exc = run(readme)
    assert code == 2 and isinstance(exc, ConfigError)
    assert exc.problem.startswith(f"{readme}:1: ") and "holds no SGLang server log lines" in exc.problem
    assert "first unusable line: '# opsctl'" in exc.problem


def test_a_binary_file_is_refused_with_the_line_of_its_first_nul(run, tmp_path):
    f = tmp_path / "core.bin"
    f.write_bytes(b"Traceback (most recent call last):\nline two\n\x00\x01\x02")
    code, _, exc = run(f)
    assert code == 2 and exc.problem.startswith(f"{f}:3: ") and "not a text file" in exc.problem


def test_prose_quoting_an_exception_is_not_a_log(run, tmp_path):
    f = tmp_path / "notes.md"
    f.write_text("# Incident notes\n\nThe server died with\n\n" + "We saw this once.\n" * 6
                 + "RuntimeError: NCCL error: unhandled system error\n\nSee the runbook.\n")
    code, _, exc = run(f)
    assert code == 2 and "holds no SGLang server log lines" in exc.problem and exc.problem.startswith(f"{f}:1: ")


def test_sglang_messages_without_prefix_are_a_log(run, tmp_path):
    f = tmp_path / "stdout.txt"
    f.write_text("Load weight begin. avail mem=78.50 GB\nLoad weight end. type=LlamaForCausalLM, avail mem=63.41 GB\n"
                 "Capture cuda graph begin. This can take up to several minutes.\n"
                 "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n")
    code, data, _ = run(f)
    assert code == 6 and data["recognised_by"] == "SGLang's own log messages"
    assert "capture.complete" in failed(data) and "Not enough memory" in failed(data)["startup.errors"]["diagnosis"]
