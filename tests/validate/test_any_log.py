"""Issue 14, a validator that reads any SGLang log: traceback tails, exceptions while serving,
the eager fallback above the captured batch sizes, fields older formats do not print, and
expectations read from the log's own server_args line."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import typer
from typer.testing import CliRunner

from opsctl import journal
from opsctl.errors import CheckFailed, ConfigError
from opsctl.journal_findings import all_ok, expectations_from_log, validate, validate_decode, validate_startup
from validate_lines import DATA, begin, decode_line, end, healthy


def by_check(findings):
    return {f.check: f for f in findings}


J = "May 30 00:30:01 blackwell python[113022]: "  # journalctl's prefix, as in a saved journal

# a scheduler dying in decode-graph replay (the shape SGLang 0.5.23 prints), frames only
REPLAY_FRAMES = [
    '  File "/opt/opsctl/shared/envs/sglang-0.5.23/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", '
    'line 3480, in run_scheduler_process',
    "    scheduler.event_loop_overlap()",
    '  File "/opt/opsctl/shared/envs/sglang-0.5.23/lib/python3.11/site-packages/sglang/srt/model_executor/runner/'
    'decode_cuda_graph_runner.py", line 1311, in replay',
    "    self.replay_prepare(forward_batch, pp_proxy_tensors)",
]
REPLAY_ERROR = ("RuntimeError: The size of tensor a (136) must match the size of tensor b (64) at non-singleton "
                "dimension 0")
SIGQUIT = "[2026-05-30 00:30:01] Received sigquit from a child process. It usually means the child failed."


# --------------------------------------------------------------------------- 1. a traceback's tail


def test_traceback_tail_without_its_header_is_a_failure(profile):
    text = "".join(f"{J}{ln}\n" for ln in [decode_line(4.52, 0.22, t="00:30:00"), *REPLAY_FRAMES, REPLAY_ERROR])
    (f,) = journal.parse(text).failures
    assert f.kind == "traceback" and f.headless and f.summary == REPLAY_ERROR
    errors = by_check(validate_startup(journal.parse(text), profile("ddtree", 16)))["startup.errors"]
    assert not errors.ok
    assert REPLAY_ERROR[:60] in errors.diagnosis
    assert "the tail of a traceback: its 'Traceback (most recent call last):' line is before the window" in errors.diagnosis


def test_exception_line_alone_is_a_failure(profile):
    text = f"{J}AssertionError: draft tree has 18 nodes, budget is 16\n{J}{decode_line(4.52, 0.22)}\n"
    errors = by_check(validate_startup(journal.parse(text), profile("ddtree", 16)))["startup.errors"]
    assert not errors.ok and "AssertionError: draft tree has 18 nodes, budget is 16" in errors.diagnosis


def test_window_starting_inside_a_chained_traceback_is_one_failure():
    text = "\n".join(["During handling of the above exception, another exception occurred:", "",
                      "Traceback (most recent call last):", *REPLAY_FRAMES[:2],
                      "Exception: Capture cuda graph failed: boom"])
    failures = journal.parse(text).failures
    tracebacks = [f for f in failures if f.kind == "traceback"]
    assert len(tracebacks) == 1 and tracebacks[0].headless
    assert tracebacks[0].summary == "Exception: Capture cuda graph failed: boom"


@pytest.mark.parametrize("line", [
    "Possible solutions:",
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
    "/usr/lib/python3.11/site-packages/torch/cuda/__init__.py:61: FutureWarning: pynvml is deprecated.",
    "    self.replay_prepare(forward_batch, pp_proxy_tensors)",
    "ErrorHandler: retries left 3",
])
def test_bare_lines_that_are_not_a_traceback_are_not_failures(line):
    assert journal.parse(f"{J}{line}\n").failures == []


# --------------------------------------------------------------------------- 2. after start-up


def test_exception_while_serving_is_named_as_after_start_up(profile):
    lines = healthy("target verify", 17) + [
        decode_line(4.52, 0.22, t="00:29:00"),
        "[2026-05-30 00:30:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        *REPLAY_FRAMES, REPLAY_ERROR, SIGQUIT]
    findings = validate(journal.parse(lines), profile("ddtree", 16), require_decode=True)
    checks = by_check(findings)
    serving = checks["serving.errors"]
    assert not serving.ok and not all_ok(findings)
    assert serving.diagnosis.startswith("exception after start-up, while serving (2x: fatal, traceback)")
    assert "the server was ready at main, line 17" in serving.diagnosis and REPLAY_ERROR[:60] in serving.diagnosis
    assert checks["startup.errors"].ok and checks["startup.errors"].diagnosis == "no traceback or fatal error during start-up"


def test_the_same_exception_before_the_ready_line_stays_a_start_up_error(profile):
    lines = [begin("target verify", 17),
             "[2026-05-30 00:21:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
             *REPLAY_FRAMES, REPLAY_ERROR, SIGQUIT]
    checks = by_check(validate_startup(journal.parse(lines), profile("ddtree", 16)))
    assert not checks["startup.errors"].ok and "since the release started" in checks["startup.errors"].diagnosis
    assert "serving.errors" not in checks  # never got ready: nothing was served


# --------------------------------------------------------------------------- 3. eager fallback


def test_no_graph_above_the_largest_captured_batch_is_the_expected_fallback(profile):
    lines = healthy("target verify", 17) + [decode_line(4.52, 0.22, reqs=8),
                                            decode_line(4.52, 0.22, reqs=40, graph=False, t="00:22:10"),
                                            decode_line(4.52, 0.22, reqs=48, graph=False, t="00:22:20")]
    f = by_check(validate_decode(journal.parse(lines), profile("ddtree", 16)))["decode.cuda_graph"]
    assert f.ok
    assert ("2 of 3 decode lines ran eagerly at #running-req 40, 48, above the largest captured batch size (32): "
            "SGLang's expected eager fallback, not a failure") in f.diagnosis
    assert f.details["eager_fallback"] == 2 and f.details["graph_bound"] == 32


def test_bound_is_what_was_captured_not_what_was_asked(profile):
    lines = healthy("target verify", 17, bs=(1, 2, 4, 8, 16)) + [decode_line(4.52, 0.22, reqs=24, graph=False)]
    f = by_check(validate_decode(journal.parse(lines), profile("ddtree", 16)))["decode.cuda_graph"]
    assert f.ok and "above the largest captured batch size (16)" in f.diagnosis


def test_no_graph_at_a_captured_batch_size_stays_a_failure(profile):
    lines = healthy("target verify", 17) + [decode_line(4.52, 0.22, reqs=40, graph=False),
                                            decode_line(4.52, 0.22, reqs=16, graph=False, t="00:22:10")]
    f = by_check(validate_decode(journal.parse(lines), profile("ddtree", 16)))["decode.cuda_graph"]
    assert not f.ok
    assert f.diagnosis.startswith("1 of 2 decode lines ran without CUDA graphs at batch sizes that were captured "
                                  "(#running-req 16, not above the largest captured batch size (32)")
    assert "expected eager fallback" in f.diagnosis  # the 40 is still told apart


def test_without_capture_lines_the_configured_max_bs_bounds_the_fallback(profile):
    f = by_check(validate_decode(journal.parse([decode_line(4.52, 0.22, reqs=40, graph=False)]),
                                 profile("ddtree", 16)))["decode.cuda_graph"]
    assert f.ok and "above the profile's cuda_graph_max_bs (32;" in f.diagnosis


# --------------------------------------------------------------------------- 4. fields older formats do not print

OLD_DECODE = ("[2024-11-02 08:05:00 TP0] Decode batch. #running-req: 8, #token: 4000, token usage: 0.01, "
              "gen throughput (token/s): 301.20, #queue-req: 0")  # 0.4.1: no cuda graph, no accept len


def test_old_decode_line_fields_are_unknown_not_failed(profile):
    checks = by_check(validate_decode(journal.parse([OLD_DECODE]), profile("ddtree", 16)))
    graph, rounds = checks["decode.cuda_graph"], checks["decode.draft_tokens_per_round"]
    assert graph.ok and graph.details["status"] == "unknown"
    assert graph.diagnosis.startswith("unknown: the log does not show whether decode ran on CUDA graphs")
    assert rounds.ok and rounds.details["status"] == "unknown"
    assert rounds.diagnosis.startswith("unknown: the log does not show accept len")


def test_old_capture_lines_without_memory_or_bs_are_unknown(profile):
    legacy = ["[2024-11-02 08:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.",
              "[2024-11-02 08:00:12 TP0] Capture cuda graph end. Time elapsed: 12.34 s"]  # 0.4.1
    checks = by_check(validate_startup(journal.parse(legacy), profile("ar-tp8", None)))
    assert checks["capture.memory"].ok and checks["capture.memory"].details["status"] == "unknown"
    assert checks["capture.memory"].diagnosis.startswith("unknown: the log does not show the graphs' memory")
    cov = checks["capture.batch_coverage"]
    assert cov.ok and cov.diagnosis.startswith("unknown: the log does not show the captured batch sizes")
    assert checks["capture.time"].diagnosis.startswith("capture time per rank (max): legacy-unlabelled 12.3 s")
    untimed = by_check(validate_startup(journal.parse(["Capture cuda graph begin.", "Capture cuda graph end."]),
                                        profile("ar-tp8", None)))["capture.time"]
    assert untimed.ok and untimed.diagnosis.startswith("unknown: the log does not show how long capture took")


def test_named_capture_lines_without_bs_still_fail(profile):
    lines = ["[2026-05-30 00:21:00 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=17",
             "[2026-05-30 00:21:40 TP0] Capture target verify CUDA graph end. elapsed=40.00 s, mem usage=2.00 GB"]
    cov = by_check(validate_startup(journal.parse(lines), profile("ddtree", 16)))["capture.batch_coverage"]
    assert not cov.ok and "print no bs=[...] list" in cov.diagnosis


# --------------------------------------------------------------------------- 5. expectations from server_args

# SGLang 0.5.23 prints the resolved values as a dict (engine.py: server_args={resolved_dict()})
SA_0523 = ("[2026-05-30 00:20:05] server_args={'model_path': '/models/kimi-k2.6', 'tp_size': 4, 'dp_size': 1, "
           "'speculative_algorithm': 'DFLASH', 'speculative_num_draft_tokens': 8, 'speculative_num_steps': None, "
           "'speculative_draft_model_path': '/opt/opsctl/current/drafter', 'cuda_graph_config': {'decode': "
           "{'backend': 'full', 'max_bs': 16, 'bs': [1, 2, 4, 8, 12, 16], 'tc_compiler': 'eager'}, 'prefill': "
           "{'backend': 'breakable', 'max_bs': 8192, 'bs': None}}, 'cuda_graph_max_bs_decode': None, "
           "'disable_cuda_graph': False, 'attention_backend': 'flashinfer', 'api_key': None, "
           "'load_format': <LoadFormat.AUTO: 'auto'>, 'json_model_override_args': '{}', 'enable_dp_attention': False}")


def test_expectations_from_the_0523_dict_line():
    exp = expectations_from_log(journal.parse([SA_0523]))
    assert (exp.kind, exp.verify_width, exp.block_size, exp.tp_size) == ("dflash", 8, 8, 4)
    assert exp.cuda_graph_max_bs == 16 and exp.cuda_graph_max_bs_from == "cuda_graph_config[decode].bs"
    assert exp.describe().startswith("expectations from the log's server_args line (line 1): speculative_algorithm "
                                     "DFLASH, speculative_num_draft_tokens 8 (verify width 8)")


def test_expectations_from_the_serverargs_repr_line():
    exp = expectations_from_log(journal.load_file(DATA / "ddtree_b16_healthy.journal.txt"))
    assert (exp.kind, exp.budget, exp.verify_width, exp.cuda_graph_max_bs, exp.tp_size) == ("ddtree", 16, 17, 32, 8)
    assert expectations_from_log(journal.parse(healthy("target verify", 17))) is None  # no server_args line


def test_log_is_checked_against_its_own_server_args():
    good = [SA_0523] + healthy("target verify", 8, ranks=4, bs=(1, 2, 4, 8, 12, 16))
    findings = validate_startup(journal.parse(good), expectations_from_log(journal.parse(good)))
    assert all_ok(findings), [f.one_line() for f in findings if not f.ok]
    bad = [SA_0523] + healthy("target verify", 17, ranks=4, bs=(1, 2, 4, 8))
    checks = by_check(validate_startup(journal.parse(bad), expectations_from_log(journal.parse(bad))))
    assert checks["capture.verify_width"].diagnosis.startswith(
        "target verify graph captured with 17 tokens/request, DFlash block size 8 needs 8")
    assert "(the log's server_args asked for 16: SGLang captured fewer" in checks["capture.batch_coverage"].diagnosis


def test_other_algorithms_and_autoregressive_from_server_args():
    eagle = "[2026-05-30 00:20:05] server_args=ServerArgs(tp_size=1, speculative_algorithm='EAGLE', " \
            "speculative_num_draft_tokens=4, cuda_graph_max_bs=8)"
    lines = [eagle] + healthy("target verify", 5, ranks=1, bs=(1, 2, 4, 8))
    width = by_check(validate_startup(journal.parse(lines), expectations_from_log(journal.parse(lines))))[
        "capture.verify_width"]
    assert not width.ok and "EAGLE with --speculative-num-draft-tokens 4 needs 4" in width.diagnosis
    ar = ["[2026-05-30 00:20:05] server_args=ServerArgs(tp_size=1, speculative_algorithm=None, cuda_graph_max_bs=8)"]
    ar += healthy("target verify", 17, ranks=1, bs=(1, 2, 4, 8))
    graphs = by_check(validate_startup(journal.parse(ar), expectations_from_log(journal.parse(ar))))[
        "capture.expected_graphs"]
    assert not graphs.ok and "but the log's server_args (speculative_algorithm None) is autoregressive" in graphs.diagnosis


@pytest.fixture
def run():
    from opsctl.cli import _output
    from opsctl.cli import validate as validate_cli

    app = typer.Typer()
    validate_cli.register(app)

    @app.callback()
    def _root() -> None:
        pass

    def invoke(*args: str):
        result = CliRunner().invoke(app, ["validate", *args])
        _output.set_json(False)
        exc = result.exception
        code = exc.exit_code if isinstance(exc, (CheckFailed, ConfigError)) else result.exit_code
        return code, result.stdout, result.stderr, exc
    return invoke


def test_cli_without_profile_uses_server_args_and_says_so(run):
    code, out, _, exc = run("--from-file", str(DATA / "site_ddtree_b32_wrong_graph.journal.txt"))
    assert code == 0, exc
    assert ("expectations from the log's server_args line (line 2): speculative_algorithm DDTREE, "
            "speculative_num_draft_tokens 8 (verify width 8, DDTree budget 7)") in out
    code, out, err, exc = run("--from-file", str(DATA / "lab_emulator_w17_wrong_verify_tokens.log"), "--json")
    assert code == 6 and isinstance(exc, CheckFailed)
    data = json.loads(out)
    assert data["expectations"]["source"] == "server_args" and data["expectations"]["verify_width"] == 17
    assert "expectations from the log's server_args line" in err  # human text on stderr, JSON on stdout
    failed = {f["check"]: f for f in data["findings"] if not f["ok"]}
    assert "DFlash block size 17 needs 17" in failed["capture.verify_width"]["diagnosis"]


def test_cli_without_profile_or_server_args_line_refuses(run, tmp_path):
    log = tmp_path / "excerpt.txt"
    log.write_text("\n".join(healthy("target verify", 17)) + "\n")
    code, _, _, exc = run("--from-file", str(log))
    assert code == 2 and isinstance(exc, ConfigError)
    assert "has no server_args line" in exc.problem and "pass --profile" in exc.fix


def test_cli_max_concurrency_without_profile(run):
    code, out, _, _ = run("--from-file", str(DATA / "ddtree_b16_healthy.json"), "--max-concurrency", "64", "--json")
    assert code == 6
    (bad,) = [f for f in json.loads(out)["findings"] if not f["ok"]]
    assert bad["check"] == "capture.batch_coverage" and "33-64" in bad["diagnosis"]


def test_cli_marks_unknown_findings(run, tmp_path):
    log = tmp_path / "old.txt"
    log.write_text("[2024-11-02 08:00:00] server_args=ServerArgs(tp_size=1, speculative_algorithm=None, "
                   "cuda_graph_max_bs=8)\n" + OLD_DECODE + "\n")
    code, out, _, exc = run("--from-file", str(log), "--only", "decode")
    assert code == 0, exc
    row = next(ln for ln in out.splitlines() if "decode.cuda_graph" in ln)
    assert "unknown" in row.split("decode.cuda_graph")[0]


# --------------------------------------------------------------------------- 6. effective max concurrency


@dataclass(frozen=True)
class SiteProfile:
    """A profile whose site concurrency is not max_concurrency-or-cuda_graph_max_bs."""

    name: str = "ddtree"
    kind: str = "ddtree"
    budget: int | None = 16
    block_size: int | None = 8
    tp_size: int = 8
    cuda_graph_max_bs: int = 32
    max_concurrency: int | None = None

    @property
    def verify_width(self) -> int:
        return 17

    @property
    def effective_max_concurrency(self) -> int:
        return 48


def test_coverage_uses_the_profiles_effective_max_concurrency(profile):
    cov = by_check(validate_startup(journal.parse(healthy("target verify", 17)), SiteProfile()))["capture.batch_coverage"]
    assert not cov.ok and "max concurrency is 48: concurrencies 33-48" in cov.diagnosis
    real = profile("ddtree", 16, max_concurrency=40)
    assert real.effective_max_concurrency == 40
    cov = by_check(validate_startup(journal.parse(healthy("target verify", 17)), real))["capture.batch_coverage"]
    assert "max concurrency is 40" in cov.diagnosis


# --------------------------------------------------------------------------- 7. the ready line


def test_ready_line_has_one_definition_in_journal():
    assert journal.READY_LINE == "The server is fired up and ready to roll!"
    assert journal.READY_TEXT is journal.READY_LINE
    parsed = journal.parse([f"[2026-05-30 00:21:50] {journal.READY_LINE}",
                            "[2026-05-30 00:21:51 TP0] Scheduler hit an exception: Traceback (most recent call last):",
                            REPLAY_ERROR])
    assert len(parsed.ready) == 1 and [f.after_ready for f in parsed.failures] == [True]


def test_a_chosen_capture_list_in_the_logs_server_args_is_checked():
    """issue #51: a server started with --cuda-graph-bs-decode 1 2 4 8 16 (the 0.5.23 dict line) is held
    to exactly that list by `validate --from-file` without a profile."""
    line = SA_0523.replace("'cuda_graph_max_bs_decode': None", "'cuda_graph_max_bs_decode': 16, "
                           "'cuda_graph_bs_decode': [1, 2, 4, 8, 16]")
    exp = expectations_from_log(journal.parse([line]))
    assert exp.cuda_graph_bs == (1, 2, 4, 8, 16) and exp.captured_batch_sizes == [1, 2, 4, 8, 16]
    good = [line] + healthy("target verify", 8, ranks=4, bs=(1, 2, 4, 8, 16))
    assert by_check(validate_startup(journal.parse(good), exp))["capture.batch_list"].ok
    bad = [line] + healthy("target verify", 8, ranks=4, bs=(1, 2, 4, 8, 12, 16))
    f = by_check(validate_startup(journal.parse(bad), exp))["capture.batch_list"]
    assert not f.ok and "extra [12]" in f.diagnosis
    # SGLang's own list (no cuda_graph_bs_decode): no such check
    plain = expectations_from_log(journal.parse([SA_0523]))
    assert plain.cuda_graph_bs is None
    sglangs = [SA_0523] + healthy("target verify", 8, ranks=4, bs=(1, 2, 4, 8, 12, 16))
    assert "capture.batch_list" not in by_check(validate_startup(journal.parse(sglangs), plain))
