"""Validation of a DDTree budget schedule from log lines: each band's verify width on every
rank, the schedule the runtime loaded, and the drafts accepted per round by band."""
from __future__ import annotations

from opsctl import journal
from opsctl.config import resolve_profile
from opsctl.journal_findings import expectations_from_log, validate, validate_decode, validate_startup
from validate_lines import begin, decode_line, end

SCHED = "1:16,8:4,32:0"
BANDS = [(17, range(1, 8)), (5, [8] + list(range(10, 31, 2))), (1, [32])]


def startup(widths=(17, 5, 1), ranks=2, schedule_line=SCHED) -> list[str]:
    lines = ["server_args=ServerArgs(speculative_algorithm='DDTREE', speculative_num_draft_tokens=17, "
             "cuda_graph_max_bs_decode=32, tp_size=2)"]
    if schedule_line:
        lines += [f"[2026-05-30 00:20:59 TP{r}] DDTree budget schedule: {schedule_line} (verify widths 17,5,1)"
                  for r in range(ranks)]
    for w, (_, bs) in zip(widths, BANDS):
        lines += [begin("target verify", w, f"TP{r}") for r in range(ranks)]
        lines += [end("target verify", list(bs), f"TP{r}") for r in range(ranks)]
    lines.append("[2026-05-30 00:21:50] The server is fired up and ready to roll!")
    return lines


def profile():
    return resolve_profile("ddtree", budget_schedule=SCHED, overrides={"ddtree": {"tp_size": 2}})


def findings(lines, prof=None, decode=False):
    parsed = journal.parse("\n".join(lines))
    prof = prof or profile()
    out = validate(parsed, prof, require_decode=True) if decode else validate_startup(parsed, prof)
    return {f.check: f for f in out}


def test_every_band_at_its_width_on_every_rank_passes():
    f = findings(startup())["capture.band_widths"]
    assert f.ok, f.diagnosis
    assert "batch 1-7: 17 tokens/request (bs 1-7)" in f.diagnosis and "batch 32+: 1 token/request (bs 32)" in f.diagnosis


def test_a_band_captured_at_another_width_fails_naming_band_bs_and_ranks():
    f = findings(startup(widths=(17, 8, 1)))["capture.band_widths"]
    assert not f.ok
    assert "batch 8-30 (budget 4) has its verify graph captured with 8 tokens/request" in f.diagnosis
    assert "needs 5 (budget 4 + 1)" in f.diagnosis and "every rank (2)" in f.diagnosis
    assert f.details["wrong"][0]["band"] == "8-30"


def test_a_runtime_that_ignored_the_schedule_fails():
    # no schedule line, one graph for everything at the widest width: what an old runtime does
    lines = startup(schedule_line=None)
    f = findings(lines)["capture.band_widths"]
    assert not f.ok and "did not load the schedule 1:16,8:4,32:0" in f.diagnosis
    assert "SGLANG_DDTREE_SCHEDULE_FILE" in f.fix


def test_a_rank_with_another_schedule_fails():
    lines = startup()
    lines[2] = lines[2].replace(SCHED, "1:16,8:8,32:0")
    f = findings(lines)["capture.band_widths"]
    assert not f.ok and "TP1 loaded budget schedule 1:16,8:8,32:0" in f.diagnosis


def test_expectations_from_the_log_take_the_schedule_line():
    parsed = journal.parse("\n".join(startup()))
    lp = expectations_from_log(parsed)
    assert lp.budget_schedule == SCHED and "budget schedule 1:16,8:4,32:0" in lp.describe()
    assert {f.check: f for f in validate_startup(parsed, lp)}["capture.band_widths"].ok


def _decode(reqs_accept: list[tuple[int, float]]) -> list[str]:
    # accept rate: correct drafts / (rounds x (17 - 1)), SGLang's global num_draft_tokens
    return [decode_line(a, (a - 1) / 16, reqs=r, t=f"00:22:{i:02d}") for i, (r, a) in enumerate(reqs_accept)]


def test_drafts_per_round_are_read_back_per_band():
    lines = startup() + _decode([(1, 5.2), (1, 5.4), (8, 3.1), (8, 3.0), (32, 1.0), (32, 1.0)])
    f = findings(lines, decode=True)
    band = f["decode.band_acceptance"]
    assert band.ok, band.diagnosis
    rows = {r["band"]: r for r in band.details["bands"]}
    assert rows["1-7"]["drafts_per_round"] == 4.4 and rows["32+"]["drafts_per_round"] == 0.0
    assert band.details["lines_after_a_band_change"] == 3  # the first line of each band is not read
    assert f["decode.draft_tokens_per_round"].ok   # budget-0 lines are left out of the width read-back


def test_a_budget_zero_band_that_drafts_fails():
    lines = startup() + _decode([(32, 1.0), (32, 2.4), (32, 2.5), (32, 2.6)])
    band = findings(lines, decode=True)["decode.band_acceptance"]
    assert not band.ok and "batch 32+" in band.diagnosis and "budget-0 band must accept no draft" in band.diagnosis


def test_a_line_after_a_band_change_is_not_read():
    # batch 1 (budget 16) then the batch grows to 8: that line's interval still averages budget-16 steps
    lines = startup() + _decode([(1, 5.2), (1, 5.3), (8, 5.1), (8, 3.0)])
    band = findings(lines, decode=True)["decode.band_acceptance"]
    assert band.ok, band.diagnosis
    assert {r["band"]: r["lines"] for r in band.details["bands"]} == {"1-7": 1, "8-30": 1}


def test_without_a_schedule_there_is_no_band_check():
    lines = [l for l in startup(widths=(17, 17, 17), schedule_line=None)]
    prof = resolve_profile("ddtree", 16, overrides={"ddtree": {"tp_size": 2}})
    f = findings(lines + _decode([(1, 5.2), (1, 5.0)]), prof, decode=True)
    assert "capture.band_widths" not in f and "decode.band_acceptance" not in f
    assert f["capture.verify_width"].ok
