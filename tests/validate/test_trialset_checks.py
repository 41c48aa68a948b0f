"""A DDTree trial-set start read back from its journal (issue #37): the runtime's trial-set, width,
draft-budget, active and refusal lines (its README's exact lines and the lab emulator's saved output,
tests/validate/data/trialset/), `journal.trial_state`, `validate.validate_trialset_start`, the capture
checks of `validate_startup` on a start whose verify widths are the trial set's union, acceptance per
active candidate, and the start-up phases per draft budget."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from opsctl import journal, schedule, startup
from opsctl.config import resolve_profile
from opsctl.journal_findings import expectations_from_log, validate, validate_startup, validate_trialset_start
from validate_lines import DATA

TS = DATA / "trialset"
README = TS / "runtime_readme_lines.journal.txt"
SWITCH = TS / "lab_emulator_trialset_switch.log"
WRONG = TS / "lab_emulator_trialset_wrong_width.log"
CANDS = ["4", "8", "16", "1:16,3:4,16:0"]
SCHED = "1:16,3:4,16:0"
REPO = Path(__file__).resolve().parents[2]


def _ddtree16():
    return resolve_profile("ddtree", budget=16, overrides={"ddtree": {"tp_size": 2, "cuda_graph_max_bs": 16}})


def _by_check(findings):
    return {f.check: f for f in findings}


def _text_without(path: Path, *needles: str) -> str:
    return "\n".join(ln for ln in path.read_text().splitlines() if not all(n in ln for n in needles))


# ------------------------------------------------------------------ the runtime's lines


def test_the_runtime_readme_lines_parse_field_by_field():
    def one(text):
        return journal.parse_trial_line(journal.LogLine(text, 1))

    s = one("DDTree trial set: 4, 8, 16, 1:16,3:4,16:0 (active 16; verify widths 17,9,5,1; draft budgets 16,8,4)")
    assert (s.candidates, s.active, s.widths, s.draft_budgets) == (tuple(CANDS), "16", (17, 9, 5, 1), (16, 8, 4))
    w = one("DDTree trial width 17 (budget 16): bs [1, 2, 3, 4, 6, 8, 16] for 16, 1:16,3:4,16:0")
    assert (w.kind, w.key, w.budget, w.bs, w.users) == ("width", 17, 16, (1, 2, 3, 4, 6, 8, 16), ("16", SCHED))
    w = one("DDTree trial width 1 (budget 0): bs [16] for 1:16,3:4,16:0")
    assert (w.key, w.budget, w.bs, w.users) == (1, 0, (16,), (SCHED,))
    assert one("DDTree trial width 9 (budget 8): bs - for 8").bs is None
    d = one("DDTree trial draft budget 16: bs [1, 2, 3, 4, 6, 8, 16] for 16, 1:16,3:4,16:0")
    assert (d.kind, d.key, d.budget, d.users) == ("draft", 16, 16, ("16", SCHED))
    a = one("DDTree active: 1:16,3:4,16:0 (since step 112)")
    assert (a.candidate, a.since_step) == (SCHED, 112)
    r = one("DDTree control refused: budget 32 was not captured (captured: 4, 8, 16, 1:16,3:4,16:0)")
    assert (r.candidate, r.reason) == ("32", "budget 32 was not captured (captured: 4, 8, 16, 1:16,3:4,16:0)")
    assert one("DDTree control refused: schedule 1:32,8:16 was not captured (captured: 4, 8, 16)").candidate == "1:32,8:16"
    r = one("DDTree control refused: /run/ddtree/control.json: not valid JSON (Expecting value: line 1 column 1)")
    assert r.candidate is None and r.reason.startswith("/run/ddtree/control.json: not valid JSON")
    assert one("DDTree budget schedule: 1:16,8:4 (verify widths 17,5)") is None   # the schedule's own line


def test_trial_state_of_the_runtime_readme_journal():
    st = journal.trial_state(journal.load_file(README))
    decodes = st.pop("decodes")
    assert st == {
        "candidates": CANDS, "configured_active": "16", "active": SCHED, "since_step": 112, "announced": True,
        "widths": [17, 9, 5, 1], "draft_budgets": [16, 8, 4], "ranks": ["TP0", "TP1"],
        "switches": [{"active": "16", "since_step": 0, "line": 49, "timestamp": "2026-12-04T10:00:25"},
                     {"active": SCHED, "since_step": 112, "line": 52, "timestamp": "2026-12-04T10:00:28"}],
        "refusals": [
            {"reason": "budget 32 was not captured (captured: 4, 8, 16, 1:16,3:4,16:0)", "candidate": "32",
             "line": 55, "timestamp": "2026-12-04T10:00:31", "after_last_switch": True},
            {"reason": "schedule 1:32,8:16 was not captured (captured: 4, 8, 16, 1:16,3:4,16:0)",
             "candidate": "1:32,8:16", "line": 56, "timestamp": "2026-12-04T10:00:32", "after_last_switch": True},
            {"reason": "/run/ddtree/control.json: not valid JSON (Expecting value: line 1 column 1 (char 0))",
             "candidate": None, "line": 57, "timestamp": "2026-12-04T10:00:33", "after_last_switch": True}]}
    # each decode line: the candidate serving when it was printed; the one whose interval held the switch is mixed
    assert [(d["line"], d["active"], d["mixed"], d["running_reqs"], d["accept_len"]) for d in decodes] == [
        (51, "16", False, 1, 5.4), (53, SCHED, True, 4, 4.2), (54, SCHED, False, 4, 3.3), (58, SCHED, False, 4, 3.25)]
    # also from plain text and from the entries of `journalctl -o json` (what the tune reads from the host)
    assert journal.trial_state(README.read_text())["active"] == SCHED
    entries = [{"MESSAGE": ln, "_PID": "4242", "SYSLOG_IDENTIFIER": "python"} for ln in SWITCH.read_text().splitlines()]
    st = journal.trial_state(entries)
    assert (st["active"], st["since_step"], [r["candidate"] for r in st["refusals"]]) == (SCHED, 104, ["32"])


def test_the_runtime_readme_journal_validates_as_a_trial_set_start():
    parsed = journal.load_file(README)
    # a profile that knows nothing of the trial set: the log's trial-set line decides the capture checks
    found = _by_check(validate(parsed, _ddtree16(), require_decode=True))
    assert all(f.ok for f in found.values()), [(f.check, f.diagnosis) for f in found.values() if not f.ok]
    assert "capture.verify_width" not in found and "capture.band_widths" not in found
    assert found["capture.trial_widths"].diagnosis == (
        "trial set 4, 8, 16, 1:16,3:4,16:0 on 2 rank(s), each verify width captured over the batch sizes its "
        "candidates route to it: width 17 (bs 1-4, 6, 8, 16) for 16, 1:16,3:4,16:0; width 9 (bs 1-4, 6, 8, 16) for "
        "8; width 5 (bs 1-4, 6, 8, 16) for 4, 1:16,3:4,16:0; width 1 (bs 16) for 1:16,3:4,16:0")
    # the README's draft lines spell the drafter's capture `draft verify`: read as the budget's capture all the same
    assert found["capture.trial_drafts"].diagnosis == (
        "the drafter captured once per draft budget on 2 rank(s): budget 16 (bs 1-4, 6, 8, 16); budget 8 "
        "(bs 1-4, 6, 8, 16); budget 4 (bs 1-4, 6, 8, 16)")
    assert found["trialset.active"].diagnosis.startswith(
        "serving 1:16,3:4,16:0 since decode step 112 (1 switch(es) since the start); 3 control(s) refused")
    acc = found["decode.trial_acceptance"]
    assert acc.details["rows"] == [
        {"candidate": "16", "budget": 16, "lines": 1, "accept_len_mean": 5.4, "lines_over_budget": 0},
        {"candidate": SCHED, "budget": 4, "lines": 2, "accept_len_mean": 3.27, "lines_over_budget": 0}]
    assert acc.details["mixed_lines"] == 1


# ------------------------------------------------------------------ the emulator's output


def test_trial_state_of_the_emulators_live_switch():
    st = journal.trial_state(journal.load_file(SWITCH))
    assert (st["candidates"], st["configured_active"], st["active"], st["since_step"]) == (CANDS, "16", SCHED, 104)
    assert [(s["active"], s["since_step"]) for s in st["switches"]] == [("16", 0), ("4", 12), (SCHED, 104)]
    assert st["refusals"] == [{"reason": "budget 32 was not captured (captured: 4, 8, 16, 1:16,3:4,16:0)",
                               "candidate": "32", "line": 78, "timestamp": "2026-12-04T02:45:41",
                               "after_last_switch": False}]
    clean = [(d["active"], d["running_reqs"], d["accept_len"]) for d in st["decodes"] if not d["mixed"]]
    assert clean[:3] == [("16", 1, 4.88), ("4", 1, 2.88), ("4", 1, 3.0)]
    assert {a for c, r, a in clean if c == SCHED and r == 1} == {5.38}   # bs 1: the schedule's budget 16
    # bs 4: its band 3:4, budget 4 (the first line's interval also holds the steps before: SGLang's counters run
    # from one decode line to the next)
    assert {a for c, r, a in clean if c == SCHED and r == 4} - {3.25, 3.28} == {3.7}
    assert sum(d["mixed"] for d in st["decodes"]) == 2


def test_the_emulators_trial_set_start_validates_with_the_logs_own_expectations():
    parsed = journal.load_file(SWITCH)
    lp = expectations_from_log(parsed)
    assert lp.trial_set == tuple(CANDS) and lp.as_dict()["trial_set"] == CANDS
    assert "trial set 4, 8, 16, 1:16,3:4,16:0 (the runtime's trial-set line)" in lp.describe()
    found = _by_check(validate(parsed, lp, require_decode=True))
    assert all(f.ok for f in found.values()), [(f.check, f.diagnosis) for f in found.values() if not f.ok]
    assert [c for c in found if c.startswith(("trialset", "capture.trial", "decode.trial"))] == [
        "trialset.loaded", "capture.trial_widths", "capture.trial_drafts", "trialset.active", "decode.trial_acceptance"]


def test_validate_trialset_start_takes_any_spelling_and_the_asked_for_candidate():
    parsed = journal.load_file(SWITCH)
    ok = validate_trialset_start(parsed, [4, "1:8", "16", SCHED], active=SCHED, verify_width=17)
    assert [(f.check, f.ok) for f in ok] == [("trialset.loaded", True), ("capture.trial_widths", True),
                                            ("capture.trial_drafts", True), ("trialset.active", True)]
    # the control asked for 8, nothing refused it, and the server still serves the schedule
    f = _by_check(validate_trialset_start(parsed, CANDS, active=8))["trialset.active"]
    assert not f.ok and f.diagnosis == (
        "serving 1:16,3:4,16:0 since decode step 104, 8 was asked for; no refusal: the switch is applied at the next "
        "meeting of decode steps (every SGLANG_DDTREE_CONTROL_EVERY_STEPS decode steps), so an idle server has not "
        "applied it yet") and "send load" in f.fix
    # another trial set than the one asked for, and a widest width that is not the server's
    f = _by_check(validate_trialset_start(parsed, ["4", "16"]))["trialset.loaded"]
    assert not f.ok and f.diagnosis == "TP0 loaded trial set 4, 8, 16, 1:16,3:4,16:0, expected 4, 16"
    f = _by_check(validate_trialset_start(parsed, CANDS, verify_width=33))["trialset.loaded"]
    assert not f.ok and "widest verify width is 17 (budget 16), --speculative-num-draft-tokens is 33" in f.diagnosis
    f = validate_trialset_start(parsed, ["16", "0"])[0]
    assert not f.ok and f.check == "trialset.loaded" and "a budget must be in 1..1024" in f.diagnosis


def test_a_width_captured_at_another_width_fails_naming_the_width_and_its_candidates():
    parsed = journal.load_file(WRONG)   # the lab fault wrong_verify_tokens on the trial set's second width
    found = _by_check(validate_startup(parsed, expectations_from_log(parsed)))
    f = found["capture.trial_widths"]
    assert not f.ok and f.diagnosis == ("on every rank (2): verify width 9 (budget 8, for 8) captured with 8 "
                                        "tokens/request (bs 1-8, 10, 12, 14, 16), needs 9")
    assert "SGLANG_DDTREE_TRIAL_SET_FILE" in f.fix
    assert found["trialset.loaded"].ok and found["capture.trial_drafts"].ok


def test_a_rank_missing_a_width_or_a_draft_budget_fails():
    text = _text_without(SWITCH, "TP1]", "num_tokens_per_req=9")
    text = "\n".join(ln for ln in text.splitlines()   # TP1's width-9 end line goes with its begin
                     if not ("TP1]" in ln and "target verify CUDA graph end" in ln and "elapsed=76.43" in ln))
    f = _by_check(validate_startup(journal.parse(text), _ddtree16()))["capture.trial_widths"]
    assert not f.ok and f.diagnosis == "on TP1: verify width 9 (budget 8, for 8) not captured", f.diagnosis
    lines = SWITCH.read_text().splitlines()   # TP0's drafter capture pair after `DDTree trial draft budget 8`
    i = next(i for i, ln in enumerate(lines) if "TP0] DDTree trial draft budget 8:" in ln)
    drop = [j for j in range(i, len(lines)) if "TP0]" in lines[j] and "draft decode CUDA graph" in lines[j]][:2]
    text = "\n".join(ln for j, ln in enumerate(lines) if j not in drop)
    f = _by_check(validate_startup(journal.parse(text), _ddtree16()))["capture.trial_drafts"]
    assert not f.ok and f.diagnosis.startswith("on TP0: draft budget 8 (for 8) not captured"), f.diagnosis


def test_an_old_runtime_without_the_trial_set_is_named():
    text = _text_without(SWITCH, "DDTree trial set:")
    f = _by_check(validate_trialset_start(journal.parse(text), CANDS))["trialset.loaded"]
    assert not f.ok and f.diagnosis.startswith("the runtime printed no 'DDTree trial set' line: it did not load the "
                                               "trial set 4, 8, 16, 1:16,3:4,16:0")
    # one rank without it
    text = _text_without(SWITCH, "TP1]", "DDTree trial set:")
    f = _by_check(validate_trialset_start(journal.parse(text), CANDS))["trialset.loaded"]
    assert not f.ok and f.diagnosis.startswith("no 'DDTree trial set' line on TP1")


def test_decode_lines_that_outrun_the_active_candidate_fail():
    # after the switch to 4, the decode lines keep budget 16's acceptance: the runtime did not switch
    lines = SWITCH.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if "DDTree active: 4 (since step 12)" in ln)
    end = next(i for i, ln in enumerate(lines) if "DDTree active: 1:16,3:4,16:0" in ln)
    for i in range(start, end):
        lines[i] = lines[i].replace("accept len: 2.88", "accept len: 5.38").replace("accept len: 3.00", "accept len: 5.38")
    found = _by_check(validate(journal.parse("\n".join(lines)), _ddtree16(), require_decode=True))
    f = found["decode.trial_acceptance"]
    assert not f.ok and f.diagnosis.startswith("candidate 4 (budget 4 at its batch sizes): 10 of 10 decode lines accept "
                                               "more drafts per round than its tree holds (mean accept len 5.38)")


def test_no_trial_set_no_trial_state_and_the_usual_width_check():
    healthy = journal.load_file(DATA / "ddtree_b16_healthy.journal.txt")
    assert journal.trial_state(healthy) is None
    found = _by_check(validate_startup(healthy, resolve_profile("ddtree", budget=16)))
    assert "capture.verify_width" in found and "capture.trial_widths" not in found


def test_startup_phases_per_width_and_per_draft_budget():
    s = startup.parse(SWITCH.read_text())
    assert [p.key for p in s.phases] == [
        "weight_load", "capture target verify width 17", "capture target verify width 9",
        "capture target verify width 5", "capture target verify width 1", "draft_capture budget 16",
        "draft_capture budget 8", "draft_capture budget 4", "compile budget 16", "compile budget 8",
        "compile budget 4", "warmup", "other"]
    # each budget's drafter capture less that budget's compile (which ran inside it): 12 bs x 1.0 s, slowest rank
    assert [s.phase(f"draft_capture budget {b}").seconds for b in (16, 8, 4)] == [12.04, 12.04, 12.04]
    assert startup.phase_label(s.phase("draft_capture budget 8")) == "draft decode graphs b8 (bs 1-16)"
    assert startup.phase_label(s.phase("capture target verify width 1")) == "target verify graphs b0 (bs 16)"
    assert sum(p.seconds for p in s.phases) == pytest.approx(s.total_s, abs=0.05)


# ------------------------------------------------------------------ opsctl's plan == the runtime's


@pytest.fixture(scope="module")
def runtime_trialset():
    """The runtime's own sglang_ddtree.trialset (pure Python), loaded as the emulator does."""
    sys.path.insert(0, str(REPO / "opsctl" / "lab" / "emulator"))
    sys.path.insert(0, str(REPO / "runtime" / "src"))
    try:
        from sglang.lab import ddtree_runtime
        return ddtree_runtime.trialset()
    finally:
        sys.path.remove(str(REPO / "runtime" / "src"))
        sys.path.remove(str(REPO / "opsctl" / "lab" / "emulator"))


@pytest.mark.parametrize("cands, capture_bs", [
    (CANDS, [1, 2, 3, 4, 6, 8, 16]),
    (["4", "8", "16", "32", "1:32,8:16,32:8,64:0"], list(range(1, 9)) + list(range(10, 33, 2)) + [40, 48, 56, 64]),
    (["1:8", "1:16,12:0", 4], [1, 2, 4, 8, 12, 16, 24, 32]),
])
def test_opsctls_trial_plan_is_the_runtimes(runtime_trialset, cands, capture_bs):
    rt = runtime_trialset.TrialSet([runtime_trialset.parse_candidate(c) for c in cands])
    rt.set_cuda_graph_bs(capture_bs)
    ours = schedule.trial_plan(cands, capture_bs)
    assert list(ours.candidates) == rt.names == [schedule.candidate_name(c) for c in cands]
    assert [(u.key, list(u.bs), list(u.users)) for u in ours.widths] == [(w, bs, us) for w, bs, us in rt.verify_plan()]
    assert [(u.key, list(u.bs), list(u.users)) for u in ours.drafts] == [
        (b, bs, us) for b, bs, us in rt.draft_plan() if bs]
    assert schedule.trial_widths(cands) == rt.widths and schedule.trial_draft_budgets(cands) == rt.draft_budgets
