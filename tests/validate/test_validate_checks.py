"""opsctl.journal_findings: findings for the failures the site hit, and a pass for a healthy release."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from opsctl import journal
from opsctl.journal_findings import (all_ok, implied_draft_tokens, validate, validate_decode, validate_startup)
from validate_lines import DATA, EXAMPLES, SITE_LINES, begin, decode_line, end, healthy


def by_check(findings):
    out = {}
    for f in findings:
        assert f.check not in out, f"duplicate check {f.check}"
        out[f.check] = f
    return out


def failed(findings):
    return {f.check for f in findings if not f.ok}


# --------------------------------------------------------------------------- whole journals


@pytest.mark.parametrize("name", ["ddtree_b16_healthy.journal.txt", "ddtree_b16_healthy.json"])
def test_healthy_ddtree_b16_passes_everything(name, profile):
    findings = validate(journal.load_file(DATA / name), profile("ddtree", 16), require_decode=True)
    assert all_ok(findings), [f.one_line() for f in findings if not f.ok]
    checks = by_check(findings)
    assert {"capture.expected_graphs", "capture.complete", "capture.verify_width", "capture.batch_coverage",
            "startup.capture_failed", "startup.cuda_oom", "startup.errors", "startup.restarts",
            "capture.memory", "capture.time", "decode.cuda_graph", "decode.draft_tokens_per_round"} <= set(checks)
    assert checks["capture.memory"].details["per_kind"]["target verify"]["mem_usage_gb_max"] == 2.87
    assert checks["capture.time"].details["per_kind"]["target verify"] > 40


def test_site_journal_wrong_verify_graph_is_refused(profile):
    findings = by_check(validate(journal.load_file(DATA / "site_ddtree_b32_wrong_graph.journal.txt"),
                                 profile("ddtree", 32), require_decode=True))
    width = findings["capture.verify_width"]
    assert not width.ok
    assert width.diagnosis.startswith("target verify graph captured with 8 tokens/request, DDTree budget 32 needs 33")
    assert "runtime lacks the graph-sizing patch (runtime/ plugin not loaded? check SGLANG_PLUGINS)" in width.diagnosis
    assert "SGLANG_PLUGINS=ddtree" in width.fix and width.details["per_rank"]["TP7"] == 8
    rounds = findings["decode.draft_tokens_per_round"]
    assert not rounds.ok and "imply 8 draft tokens per round" in rounds.diagnosis and "needs 33" in rounds.diagnosis


def test_docs_examples_are_the_tested_samples():
    for name in ["ddtree_b16_healthy.journal.txt", "site_ddtree_b32_wrong_graph.journal.txt",
                 "ddtree_b16_capture_oom_restart.journal.txt"]:
        assert (EXAMPLES / name).read_text() == (DATA / name).read_text()


def test_hang_names_the_rank(profile):
    findings = by_check(validate_startup(journal.load_file(DATA / "ddtree_b16_hang_tp5.journal.txt"),
                                         profile("ddtree", 16)))
    assert not findings["capture.complete"].ok and "target verify on TP5" in findings["capture.complete"].diagnosis
    assert failed(findings.values()) == {"capture.complete"}


def test_capture_oom_and_restart(profile):
    findings = by_check(validate_startup(journal.load_file(DATA / "ddtree_b16_capture_oom_restart.journal.txt"),
                                         profile("ddtree", 16)))
    assert {"startup.capture_failed", "startup.cuda_oom", "startup.errors", "startup.restarts"} <= failed(findings.values())
    assert "TP3" in findings["startup.capture_failed"].diagnosis
    assert "120400 -> 120977" in findings["startup.restarts"].diagnosis
    # the second process captured fine: graph checks judge the current process
    assert findings["capture.verify_width"].ok and findings["capture.complete"].ok


# --------------------------------------------------------------------------- the site's decode lines


def test_site_two_sample_lines_are_flagged(profile):
    findings = by_check(validate_decode(journal.parse(SITE_LINES), profile("ddtree", 32)))
    assert findings["decode.cuda_graph"].ok  # the site's lines did run on graphs: the width is what is wrong
    f = findings["decode.draft_tokens_per_round"]
    assert not f.ok
    assert "imply 8 draft tokens per round" in f.diagnosis and "DDTree budget 32 needs 33" in f.diagnosis
    assert "SGLang 0.5.23" in f.diagnosis
    assert f.details["implied"] == [8]


@pytest.mark.parametrize("accept_len, accept_rate", [(1.51, 0.07), (1.65, 0.09)])
def test_site_lines_imply_eight(accept_len, accept_rate):
    lo, hi = implied_draft_tokens(accept_len, accept_rate)
    assert lo <= 8 <= hi and not lo <= 33 <= hi


@pytest.mark.parametrize("width", [2, 8, 9, 17, 33, 65])
def test_rounded_lines_from_the_right_width_always_fit(width):
    # every (accept len, accept rate) SGLang could print for this width must read back to it
    for correct_per_round in [x / 37 for x in range(1, 37 * (width - 1))][::7]:
        rate = correct_per_round / (width - 1)
        lo, hi = implied_draft_tokens(round(1 + correct_per_round, 2), round(rate, 2))
        assert lo <= width <= hi, (correct_per_round, rate)


def test_rate_printed_as_zero_leaves_the_upper_end_open():
    lo, hi = implied_draft_tokens(1.02, 0.00)
    assert math.isinf(hi) and lo > 1
    assert implied_draft_tokens(1.00, 0.00) is None


def test_no_accepted_drafts_cannot_prove_the_width(profile):
    f = by_check(validate_decode(journal.parse([decode_line(1.00, 0.00)]), profile("ddtree", 16)))[
        "decode.draft_tokens_per_round"]
    assert not f.ok and "accept len 1.00" in f.diagnosis


def test_right_width_decode_lines_pass(profile):
    lines = [decode_line(4.52, 0.22), decode_line(5.30, 0.27)]
    findings = by_check(validate_decode(journal.parse(lines), profile("ddtree", 16)))
    assert all_ok(findings.values())
    assert "SGLang 0.5.23" in findings["decode.draft_tokens_per_round"].diagnosis


def test_decode_without_cuda_graph_fails(profile):
    # 16 <= the profile's cuda_graph_max_bs 32: SGLang captured that size (or fewer), so eager is a failure
    lines = [decode_line(4.52, 0.22), decode_line(4.52, 0.22, reqs=16, graph=False)]
    findings = by_check(validate_decode(journal.parse(lines), profile("ddtree", 16)))
    assert not findings["decode.cuda_graph"].ok and "#running-req 16" in findings["decode.cuda_graph"].diagnosis


def test_spec_profile_with_non_speculative_decode_lines(profile):
    findings = by_check(validate_decode(journal.parse([decode_line(None, None)]), profile("ddtree", 16)))
    assert not findings["decode.draft_tokens_per_round"].ok
    assert "without speculative decoding" in findings["decode.draft_tokens_per_round"].diagnosis


def test_accept_len_without_rate_is_not_read_back(profile):
    line = ("[2025-01-10 10:00:00 TP0] Decode batch. #running-req: 1, #token: 20, token usage: 0.00, "
            "accept len: 2.31, cuda graph: True, gen throughput (token/s): 5.23, #queue-req: 0")
    f = by_check(validate_decode(journal.parse([line]), profile("ddtree", 16)))["decode.draft_tokens_per_round"]
    assert f.ok and f.diagnosis.startswith("unknown: the log does not show accept rate")
    assert f.details["status"] == "unknown"


def test_decode_required_or_optional(profile):
    parsed = journal.parse(healthy("target verify", 17))
    assert validate_decode(parsed, profile("ddtree", 16), require=False) == []
    (f,) = validate_decode(parsed, profile("ddtree", 16), require=True)
    assert f.check == "decode.present" and not f.ok
    idle = journal.parse([decode_line(4.5, 0.22, reqs=0)])  # no running requests: not under load
    assert validate_decode(idle, profile("ddtree", 16), require=False) == []


def test_kv_retraction_is_reported_not_failed(profile):
    lines = healthy("target verify", 17) + [
        "[2026-05-30 00:30:00 TP0] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.3000 -> 0.6000",
        decode_line(4.52, 0.22)]
    findings = by_check(validate(journal.parse(lines), profile("ddtree", 16), require_decode=True))
    assert all_ok(findings.values())
    assert findings["startup.cuda_oom"].details["kv_retractions"] == 1


# --------------------------------------------------------------------------- verify widths per profile kind


def test_ddtree_verify_width_budget_plus_one(profile):
    ok = by_check(validate_startup(journal.parse(healthy("target verify", 17)), profile("ddtree", 16)))
    assert ok["capture.verify_width"].ok
    bad = by_check(validate_startup(journal.parse(healthy("target verify", 8)), profile("ddtree", 16)))
    assert bad["capture.verify_width"].diagnosis.startswith(
        "target verify graph captured with 8 tokens/request, DDTree budget 16 needs 17 (the drafter's block size): "
        "the runtime lacks the graph-sizing patch (runtime/ plugin not loaded? check SGLANG_PLUGINS)")
    off_by_one = by_check(validate_startup(journal.parse(healthy("target verify", 16)), profile("ddtree", 16)))
    assert not off_by_one["capture.verify_width"].ok  # the root token is not in the budget


def test_dflash_verify_width_is_block_size(profile):
    ok = by_check(validate_startup(journal.parse(healthy("target verify", 8)), profile("dflash", None)))
    assert ok["capture.verify_width"].ok
    bad = by_check(validate_startup(journal.parse(healthy("target verify", 17)), profile("dflash", None)))
    assert "DFlash block size 8 needs 8" in bad["capture.verify_width"].diagnosis
    assert "--speculative-num-draft-tokens 8" in bad["capture.verify_width"].fix


def test_autoregressive_needs_target_decode_with_one(profile):
    ok = validate(journal.parse(healthy("target decode", 1) + [decode_line(None, None)]), profile("ar-tp8", None),
                  require_decode=True)
    assert all_ok(ok), [f.one_line() for f in ok if not f.ok]
    spec = by_check(validate_startup(journal.parse(healthy("target verify", 17)), profile("ar-tp8", None)))
    assert not spec["capture.expected_graphs"].ok and "speculative decoding is on" in spec["capture.expected_graphs"].diagnosis


def test_spec_profile_with_only_a_decode_graph(profile):
    findings = by_check(validate_startup(journal.parse(healthy("target decode", 1)), profile("ddtree", 16)))
    assert "runs without speculative decoding" in findings["capture.expected_graphs"].diagnosis
    assert not findings["capture.verify_width"].ok


def test_legacy_log_cannot_prove_a_verify_width_but_passes_autoregressive(profile):
    legacy = ["[2025-03-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=76.13 GB",
              "[2025-03-01 10:00:00 TP0] Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32]",
              "[2025-03-01 10:00:25 TP0] Capture cuda graph end. Time elapsed: 25.12 s. mem usage=1.23 GB. avail mem=74.90 GB."]
    spec = by_check(validate_startup(journal.parse(legacy), profile("ddtree", 16)))
    # the pre-0.5.11 lines print no num_tokens_per_req: unknown, not a failure (and not a pass either)
    width = spec["capture.verify_width"]
    assert width.ok and width.details["status"] == "unknown"
    assert width.diagnosis.startswith("unknown: the log does not show the verify graph's tokens/request")
    assert "pre-0.5.11" in width.diagnosis
    ar = validate_startup(journal.parse(legacy), profile("ar-tp8", None))
    assert all_ok(ar), [f.one_line() for f in ar if not f.ok]


def test_legacy_log_skips_the_accept_rate_read_back(profile):
    legacy = ["[2025-03-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=76.13 GB",
              "[2025-03-01 10:00:25 TP0] Capture cuda graph end. Time elapsed: 25.12 s. mem usage=1.23 GB. avail mem=74.90 GB.",
              decode_line(3.0, 0.5)]
    rounds = by_check(validate_decode(journal.parse(legacy), profile("ddtree", 16)))["decode.draft_tokens_per_round"]
    assert rounds.ok and rounds.diagnosis.startswith("not checked")


# --------------------------------------------------------------------------- graphs per rank and batch coverage


def test_rank_missing_the_verify_graph(profile):
    lines = healthy("target verify", 17, ranks=4) + [begin("draft decode", 8, "TP4"), end("draft decode", rank="TP4")]
    f = by_check(validate_startup(journal.parse(lines), profile("ddtree", 16)))["capture.expected_graphs"]
    assert not f.ok and "missing on TP4" in f.diagnosis


def test_rank_that_logged_but_never_captured(profile):
    lines = ["[2026-05-30 00:20:10 TP6] Load weight begin. avail mem=93.41 GB"] + healthy("target verify", 17, ranks=6)
    f = by_check(validate_startup(journal.parse(lines), profile("ddtree", 16)))["capture.expected_graphs"]
    assert not f.ok and "missing on TP6" in f.diagnosis


def test_batch_sizes_short_of_max_concurrency(profile):
    lines = healthy("target verify", 17, bs=(1, 2, 4, 8, 16))
    f = by_check(validate_startup(journal.parse(lines), profile("ddtree", 16, max_concurrency=24)))["capture.batch_coverage"]
    assert not f.ok
    assert "reach 16, max concurrency is 24: concurrencies 17-24 will run without CUDA graphs" in f.diagnosis
    assert "SGLang captured fewer" in f.diagnosis  # the profile asked for 32
    ok = by_check(validate_startup(journal.parse(lines), profile("ddtree", 16, max_concurrency=16, cuda_graph_max_bs=16)))
    assert ok["capture.batch_coverage"].ok


def test_worst_rank_decides_coverage(profile):
    lines = [begin("target verify", 17, "TP0"), end("target verify", (1, 2, 4, 8, 16, 32), "TP0"),
             begin("target verify", 17, "TP1"), end("target verify", (1, 2, 4, 8), "TP1")]
    f = by_check(validate_startup(journal.parse(lines), profile("ddtree", 16)))["capture.batch_coverage"]
    assert not f.ok and f.details["captured_max_bs"] == 8


def test_empty_journal_fails_loudly(profile):
    findings = by_check(validate(journal.parse(""), profile("ddtree", 16), require_decode=False))
    assert "no CUDA-graph capture lines" in findings["capture.expected_graphs"].diagnosis
    assert not all_ok(findings.values())


# --------------------------------------------------------------------------- profile protocol


@dataclass(frozen=True)
class PlainProfile:
    name: str = "ddtree"
    kind: str = "ddtree"
    budget: int | None = 16
    block_size: int | None = 8
    tp_size: int = 8
    cuda_graph_max_bs: int = 32
    max_concurrency: int | None = None

    @property
    def verify_width(self) -> int:
        return self.budget + 1

    @property
    def effective_max_concurrency(self) -> int:
        return self.max_concurrency or self.cuda_graph_max_bs


def test_any_object_with_the_profile_fields_works():
    findings = validate(journal.parse(healthy("target verify", 17) + [decode_line(4.52, 0.22)]), PlainProfile(),
                        require_decode=True)
    assert all_ok(findings)


def test_findings_are_json_serialisable(profile):
    import json

    findings = validate(journal.load_file(DATA / "site_ddtree_b32_wrong_graph.journal.txt"), profile("ddtree", 32),
                        require_decode=True)
    json.dumps([f.model_dump() for f in findings])


# --------------------------------------------------------------------------- the lab emulator's own output
# Raw stdout of opsctl/lab/emulator launched with a 17-token verify width (the emulator prints the same
# capture and decode lines for DFLASH --speculative-num-draft-tokens 17 as for DDTree budget 16) and a fault.


def test_lab_emulator_wrong_verify_tokens_fault(profile):
    findings = validate(journal.load_file(DATA / "lab_emulator_w17_wrong_verify_tokens.log"), profile("ddtree", 16),
                        require_decode=True)
    assert failed(findings) == {"capture.verify_width", "decode.draft_tokens_per_round"}
    width = by_check(findings)["capture.verify_width"]
    assert "captured with 8 tokens/request, DDTree budget 16 needs 17" in width.diagnosis


def test_lab_emulator_capture_failure_fault(profile):
    findings = validate(journal.load_file(DATA / "lab_emulator_w17_capture_failure.log"), profile("ddtree", 16),
                        require_decode=False)
    assert {"capture.complete", "startup.capture_failed", "startup.cuda_oom", "startup.errors"} <= failed(findings)
    assert "CUDA error: out of memory" in by_check(findings)["startup.capture_failed"].diagnosis


def test_a_chosen_capture_list_is_captured_exactly(profile):
    """issue #51: a profile with cuda_graph_bs (--capture-from-traffic) holds each rank to that list."""
    lines = healthy("target verify", 17, bs=(1, 2, 4, 9, 32))
    chosen = profile("ddtree", 16, cuda_graph_bs=(1, 2, 4, 9, 32))
    f = by_check(validate_startup(journal.parse(lines), chosen))["capture.batch_list"]
    assert f.ok, f.diagnosis
    assert f.details["want"] == [1, 2, 4, 9, 32]
    other = profile("ddtree", 16, cuda_graph_bs=(1, 2, 4, 8, 32))
    bad = by_check(validate_startup(journal.parse(lines), other))["capture.batch_list"]
    assert not bad.ok and "missing [8]" in bad.diagnosis and "extra [9]" in bad.diagnosis
    # without a chosen list there is no such check (SGLang's own list: capture.batch_coverage)
    assert "capture.batch_list" not in by_check(validate_startup(journal.parse(lines), profile("ddtree", 16)))
