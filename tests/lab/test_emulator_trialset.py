"""The emulator's DDTree trial set and live switch (runtime/README.md, "Trial set and live switch",
issue #37): the start-up lines and captures per verify width and per draft budget, the control file
switching the serving candidate with a request in flight, refusals, the runtime's own errors for a
trial-set file it rejects, and `/server_info`'s `internal_states[0]["ddtree"]`. The emulator runs the
runtime's own `sglang_ddtree.trialset` (grammar, capture plan, control file, switch); these tests run it
as a plain process on loopback (no lab) and read its output with opsctl's journal and validate."""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time

import pytest
from lab_emu import EMULATOR_SRC, RE_CAPTURE_BEGIN, RE_CAPTURE_END, RE_READY, Emu

sys.path.insert(0, str(EMULATOR_SRC))
from sglang.lab import perf, startup as emu_startup  # noqa: E402

from opsctl import journal, journal_findings as validate, startup  # noqa: E402

CANDIDATES = ["4", "8", "16", "1:16,3:4,16:0"]
SCHED = "1:16,3:4,16:0"
BS = [1, 2, 3, 4, 6, 8, 16]   # the runtime README's example: every line below is the README's own
TRIAL = ["--tp-size", "2", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
         "--speculative-num-draft-tokens", "17", "--cuda-graph-bs-decode", *map(str, BS)]
PROMPT = "Tell me a story about a cat"   # a chat prompt: the model scales accepted drafts by 0.9
CHAT = perf.DOMAIN_FACTOR["chat"]
_MSG = re.compile(r"^\[[\d-]+ [\d:]+(?: (?P<rank>TP\d+))?\] (?P<msg>.*)$")


def _env(tmp_path, doc=None, *, raw: str | None = None, every: int = 4, control: bool = True) -> dict:
    path = tmp_path / "trial-set.json"
    path.write_text(raw if raw is not None else json.dumps(doc or {"candidates": CANDIDATES, "active": "16"}))
    env = {"SGLANG_DDTREE_TRIAL_SET_FILE": str(path), "SGLANG_DDTREE_CONTROL_EVERY_STEPS": str(every),
           "SGLANG_DDTREE_CONTROL_INTERVAL_MS": "10"}
    if control:
        env["SGLANG_DDTREE_CONTROL_FILE"] = str(tmp_path / "control.json")
    return env


def _control(tmp_path, value) -> None:
    """Atomically, as the runtime asks: a temporary file in the same directory, renamed over the path."""
    tmp = tmp_path / ".control.json.tmp"
    tmp.write_text(json.dumps({"active": value}))
    os.replace(tmp, tmp_path / "control.json")


def _messages(emu: Emu, rank: str | None) -> list[str]:
    out = []
    for line in emu.lines:
        m = _MSG.match(line)
        if m and (rank is None or m["rank"] == rank):
            out.append(m["msg"])
    return out


def _shape(msg: str) -> str:
    """A start-up line without its modelled numbers: captures as `begin <width>` / `end <bs>`."""
    b, e = RE_CAPTURE_BEGIN.match(f"[2026-01-01 00:00:00] {msg}"), RE_CAPTURE_END.match(f"[2026-01-01 00:00:00] {msg}")
    if b:
        return f"{b['name']} begin {b['n']}"
    if e:
        return f"{e['name']} end [{e['bs']}]"
    if msg.startswith("DDTREE Triton compile: "):
        return msg.split(", elapsed=")[0]
    return msg


def _ddtree_state(emu: Emu) -> dict:
    status, body = emu.get("/server_info")
    assert status == 200
    return json.loads(body)["internal_states"][0]["ddtree"]


def _long_request(emu: Emu, n: int, out: dict) -> threading.Thread:
    def run():
        status, body = emu.post("/generate", {"text": PROMPT, "sampling_params": {
            "max_new_tokens": n, "temperature": 0, "ignore_eos": True}}, timeout=300)
        out["status"], out["body"] = status, json.loads(body)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _chat_accept(budget: int) -> float:
    """The model's accept length for the chat prompt at `budget` (perf.Model's DDTree curve, domain-scaled)."""
    return 1.0 + min((perf.ddtree_accept_len(budget) - 1.0) * CHAT, float(budget))


# ------------------------------------------------------------------ start-up


def test_a_trial_set_start_prints_the_runtimes_lines_and_one_capture_per_width(tmp_path):
    with Emu(tmp_path, TRIAL + ["--skip-server-warmup"], env=_env(tmp_path)) as emu:
        emu.wait_ready(60)
    wanted = ("DDTree", "Capture", "DDTREE Triton")
    tp0 = [_shape(m) for m in _messages(emu, "TP0") if m.startswith(wanted)]
    bs = str(BS)
    assert tp0 == [
        "DDTree trial set: 4, 8, 16, 1:16,3:4,16:0 (active 16; verify widths 17,9,5,1; draft budgets 16,8,4)",
        f"DDTree trial width 17 (budget 16): bs {bs} for 16, 1:16,3:4,16:0",
        "target verify begin 17", f"target verify end {bs}",
        f"DDTree trial width 9 (budget 8): bs {bs} for 8",
        "target verify begin 9", f"target verify end {bs}",
        f"DDTree trial width 5 (budget 4): bs {bs} for 4, 1:16,3:4,16:0",
        "target verify begin 5", f"target verify end {bs}",
        "DDTree trial width 1 (budget 0): bs [16] for 1:16,3:4,16:0",
        "target verify begin 1", "target verify end [16]",
        f"DDTree trial draft budget 16: bs {bs} for 16, 1:16,3:4,16:0",
        "draft decode begin 8", "DDTREE Triton compile: budget=16, block=8, vocab_shard=81920, arch=sm_120",
        f"draft decode end {bs}",
        f"DDTree trial draft budget 8: bs {bs} for 8",
        "draft decode begin 8", "DDTREE Triton compile: budget=8, block=8, vocab_shard=81920, arch=sm_120",
        f"draft decode end {bs}",
        f"DDTree trial draft budget 4: bs {bs} for 4, 1:16,3:4,16:0",
        "draft decode begin 8", "DDTREE Triton compile: budget=4, block=8, vocab_shard=81920, arch=sm_120",
        f"draft decode end {bs}",
        "DDTree active: 16 (since step 0)",
    ]
    # every rank prints the set and its capture lines; only TP0 the compile and the active line
    tp1 = [_shape(m) for m in _messages(emu, "TP1") if m.startswith(wanted)]
    assert tp1 == [m for m in tp0 if not m.startswith(("DDTREE Triton", "DDTree active"))]
    assert sum("DDTree active:" in ln for ln in emu.lines) == 1
    # the start-up model: each width's graphs and each budget's draft graphs are phases of their own
    s = startup.parse(emu.text())
    c = emu_startup.DEFAULTS
    for w, n in ((17, 7), (9, 7), (5, 7), (1, 1)):
        assert s.phase(f"capture target verify width {w}").seconds == pytest.approx(
            n * (c["capture_per_bs_s"] + c["capture_per_token_s"] * w) * emu_startup.rank_factor(1), abs=0.01)
    for b, secs in ((16, 22.1), (8, 9.6), (4, 6.8)):
        assert s.phase(f"compile budget {b}").seconds == secs
        assert s.phase(f"draft_capture budget {b}").seconds == pytest.approx(
            7 * c["draft_capture_per_bs_s"] * emu_startup.rank_factor(1), abs=0.01)
    assert not s.phase("draft_capture width 8")
    # opsctl reads the start as a trial set: no single-width verdict
    parsed = journal.parse(emu.text())
    found = {f.check: f for f in validate.validate_startup(parsed, validate.expectations_from_log(parsed))}
    assert "capture.verify_width" not in found and "capture.band_widths" not in found
    assert all(f.ok for f in found.values()), [f.diagnosis for f in found.values() if not f.ok]
    assert found["capture.trial_widths"].diagnosis.startswith(
        "trial set 4, 8, 16, 1:16,3:4,16:0 on 2 rank(s), each verify width captured over the batch sizes")


def test_graphs_disabled_print_bs_dash_and_no_capture_pairs(tmp_path):
    args = TRIAL + ["--skip-server-warmup", "--cuda-graph-backend-decode", "disabled"]
    with Emu(tmp_path, args, env=_env(tmp_path)) as emu:
        emu.wait_ready(60)
        assert emu.generate(PROMPT, 24)["meta_info"]["completion_tokens"] == 24
        assert _ddtree_state(emu)["active"] == "16"
    tp0 = [m for m in _messages(emu, "TP0") if m.startswith(("DDTree", "Capture"))]
    assert tp0 == ["DDTree trial set: 4, 8, 16, 1:16,3:4,16:0 (active 16; verify widths 17,9,5,1; draft budgets 16,8,4)",
                   "DDTree trial width 17 (budget 16): bs - for 16, 1:16,3:4,16:0",
                   "DDTree trial width 9 (budget 8): bs - for 8",
                   "DDTree trial width 5 (budget 4): bs - for 4, 1:16,3:4,16:0",
                   "DDTree trial width 1 (budget 0): bs - for 1:16,3:4,16:0",
                   "DDTree active: 16 (since step 0)"]
    parsed = journal.parse(emu.text())
    units = [u for u in parsed.trial_units if u.rank == "TP0"]
    assert [(u.kind, u.key, u.bs) for u in units] == [("width", 17, None), ("width", 9, None), ("width", 5, None),
                                                      ("width", 1, None)]


# ------------------------------------------------------------------ the live switch


def test_the_control_switches_16_to_4_to_a_schedule_with_a_long_request_in_flight(tmp_path):
    n = 1500
    args = TRIAL + ["--decode-log-interval", "8"]
    with Emu(tmp_path, args, env=_env(tmp_path)) as emu:
        emu.wait_ready(60)
        state = _ddtree_state(emu)
        assert state == {"active": "16", "since_step": 0, "decode_steps": state["decode_steps"],
                         "candidates": CANDIDATES, "verify_widths": [17, 9, 5, 1], "draft_budgets": [16, 8, 4],
                         "control_file": str(tmp_path / "control.json"), "control_every_steps": 4,
                         "last_refusal": None, "trial_set": True}
        res: dict = {}
        req = _long_request(emu, n, res)
        for _ in range(3):   # a few intervals at 16 first
            assert emu.wait_line(r"Decode batch, #running-req: 1,", 30)
            time.sleep(0.05)
        _control(tmp_path, "1:4")   # any spelling that normalises to a candidate
        line = emu.wait_line(r"DDTree active: 4 \(since step \d+\)$", 30)
        assert line, emu.text()[-2000:]
        step4 = int(re.search(r"since step (\d+)", line)[1])
        state = _ddtree_state(emu)
        assert (state["active"], state["since_step"]) == ("4", step4) and state["decode_steps"] >= step4
        for _ in range(4):
            n_dec = sum("Decode batch" in ln for ln in emu.lines)
            deadline = time.monotonic() + 30
            while sum("Decode batch" in ln for ln in emu.lines) == n_dec and time.monotonic() < deadline:
                time.sleep(0.02)
        _control(tmp_path, SCHED)
        line = emu.wait_line(r"DDTree active: 1:16,3:4,16:0 \(since step \d+\)$", 30)
        assert line, emu.text()[-2000:]
        step_s = int(re.search(r"since step (\d+)", line)[1])
        assert step_s > step4
        req.join(timeout=120)
        assert res["status"] == 200 and res["body"]["meta_info"]["completion_tokens"] == n   # nothing lost
        assert res["body"]["meta_info"]["finish_reason"] == {"type": "length", "length": n}
        # the same request again, served by the schedule alone: the same tokens (speculation is lossless)
        again = json.loads(emu.post("/generate", {"text": PROMPT, "sampling_params": {
            "max_new_tokens": n, "temperature": 0, "ignore_eos": True}}, timeout=300)[1])
        assert again["output_ids"] == res["body"]["output_ids"]
        emu.load(4, 160, prompt_len=6)   # a batch of 4: the schedule's band 3:4 (budget 4)
        state = _ddtree_state(emu)
        assert (state["active"], state["since_step"], state["last_refusal"]) == (SCHED, step_s, None)
        text = emu.text()
    # the switches happened while the long request was running (before its response)
    done_at = next(i for i, ln in enumerate(emu.lines) if '"POST /generate HTTP/1.1" 200' in ln and i > 0
                   and any("DDTree active: 1:16" in x for x in emu.lines[:i]))
    assert any("DDTree active: 4 " in x for x in emu.lines[:done_at])

    st = journal.trial_state(text)
    assert (st["active"], st["since_step"], st["configured_active"]) == (SCHED, step_s, "16")
    assert [(s["active"], s["since_step"]) for s in st["switches"]] == [("16", 0), ("4", step4), (SCHED, step_s)]
    assert st["refusals"] == []
    # the performance model follows the active candidate from the next step: the accept length of each
    # interval that stayed with one candidate is that candidate's (budget at the running batch)
    by: dict[tuple[str, int], list[float]] = {}
    for d in st["decodes"]:
        if not d["mixed"] and d["running_reqs"]:
            by.setdefault((d["active"], d["running_reqs"]), []).append(d["accept_len"])
    assert len(by[("16", 1)]) >= 2 and by[("4", 1)] and by[(SCHED, 1)] and by[(SCHED, 4)], by
    # (the first line's interval also holds the warm-up request's rounds: SGLang counts until the next line)
    for a in by[("16", 1)][1:] + by[(SCHED, 1)]:   # the schedule gives bs 1 budget 16
        assert a == pytest.approx(_chat_accept(16), abs=0.15)
    for a in by[("4", 1)]:
        assert a == pytest.approx(_chat_accept(4), abs=0.15) and a - 1 <= 4
    math = 1.0 + (perf.ddtree_accept_len(4) - 1.0) * perf.DOMAIN_FACTOR["math"]   # the load's prompts (w0_0 ...)
    assert all(a == pytest.approx(math, abs=0.15) for a in by[(SCHED, 4)][1:])
    assert max(by[("4", 1)]) < min(by[("16", 1)][1:]) - 2.0
    # opsctl's read-back agrees with the server, and the decode lines fit the candidates
    parsed = journal.parse(text)
    prof = validate.expectations_from_log(parsed)
    found = {f.check: f for f in validate.validate(parsed, prof, require_decode=True)}
    assert all(f.ok for f in found.values()), [f.diagnosis for f in found.values() if not f.ok]
    assert found["decode.trial_acceptance"].details["mixed_lines"] >= 2
    ts = validate.validate_trialset_start(parsed, [4, "8", "1:16", SCHED], active="1:16,3:4,16:0", verify_width=17)
    assert [f.check for f in ts] == ["trialset.loaded", "capture.trial_widths", "capture.trial_drafts",
                                     "trialset.active"] and all(f.ok for f in ts)


def test_an_uncaptured_candidate_is_refused_and_nothing_changes(tmp_path):
    args = TRIAL + ["--decode-log-interval", "8", "--skip-server-warmup"]
    with Emu(tmp_path, args, env=_env(tmp_path, {"candidates": CANDIDATES, "active": "8"})) as emu:
        emu.wait_ready(60)
        res: dict = {}
        req = _long_request(emu, 1200, res)
        assert emu.wait_line(r"Decode batch", 30)
        _control(tmp_path, 32)
        assert emu.wait_line(r"DDTree control refused: budget 32 was not captured "
                             r"\(captured: 4, 8, 16, 1:16,3:4,16:0\)$", 30), emu.text()[-2000:]
        assert _ddtree_state(emu)["last_refusal"] == "budget 32 was not captured (captured: 4, 8, 16, 1:16,3:4,16:0)"
        _control(tmp_path, "1:32,8:16")
        assert emu.wait_line(r"DDTree control refused: schedule 1:32,8:16 was not captured", 30)
        _control(tmp_path, "8")   # the candidate already active: nothing to say
        (tmp_path / ".c.tmp").write_text("{not json")
        os.replace(tmp_path / ".c.tmp", tmp_path / "control.json")
        assert emu.wait_line(r"DDTree control refused: .*control\.json: not valid JSON \(", 30)
        seen = len(emu.lines)
        deadline = time.monotonic() + 30   # a few more meetings: the unchanged file is not read again
        while sum("Decode batch" in ln for ln in emu.lines[seen:]) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        state = _ddtree_state(emu)
        req.join(timeout=120)
        assert res["status"] == 200 and res["body"]["meta_info"]["completion_tokens"] == 1200
    assert (state["active"], state["since_step"]) == ("8", 0)
    assert "not valid JSON" in state["last_refusal"]
    assert [ln.split("] ", 1)[1] for ln in emu.lines if "DDTree active:" in ln] == ["DDTree active: 8 (since step 0)"]
    refused = [ln for ln in emu.lines if "DDTree control refused" in ln]
    assert len(refused) == 3 and all(" TP0] " in ln for ln in refused)   # once per change of the file, TP0 only
    st = journal.trial_state(emu.text())
    assert st["active"] == "8" and [r["candidate"] for r in st["refusals"]] == ["32", "1:32,8:16", None]
    assert all(r["after_last_switch"] for r in st["refusals"])
    accepts = [d["accept_len"] for d in st["decodes"] if d["running_reqs"] == 1]
    assert accepts and all(d["active"] == "8" and not d["mixed"] for d in st["decodes"])
    assert all(a == pytest.approx(_chat_accept(8), abs=0.15) for a in accepts)   # budget 8 throughout
    parsed = journal.parse(emu.text())
    active = {f.check: f for f in validate.validate_trialset_start(parsed, CANDIDATES, active=32)}["trialset.active"]
    assert not active.ok and "serving 8 since decode step 0, 32 was asked for" in active.diagnosis
    assert "the control was refused at line" in active.diagnosis and "budget 32 was not captured" in active.diagnosis


# ------------------------------------------------------------------ what the runtime rejects


# the runtime's messages (sglang_ddtree.trialset), "{path}" the trial-set file's path
@pytest.mark.parametrize("doc, raw, message", [
    ({"candidates": ["16", "1:16"]}, None,
     "DDTREE trial set {path}: candidate(s) 16 listed twice (after normalisation: a one-band schedule 1:B is "
     "budget B)"),
    ({"candidates": ["4", "8"]}, None,
     "DDTREE trial set {path}: the widest width any candidate needs is 9 (budget 8 + 1) but "
     "--speculative-num-draft-tokens is 17; they must be equal (KV over-allocation and buffers are sized for the "
     "widest width)."),
    ({"candidates": ["16"], "active": "8"}, None, "DDTREE trial set file {path}: 'active' 8 is not a candidate (16)"),
    ({"candidates": ["16"], "budgets": [4]}, None,
     "DDTREE trial set file {path}: unknown key(s) budgets (expected 'candidates' and optionally 'active' and 'trial_bs')"),
    ({"candidates": ["0", "16"]}, None,
     "DDTREE trial set file {path}: candidates[0]: DDTREE trial candidate '0': a budget must be in 1..1024 "
     "(budget 0 alone drafts nothing; use it as a band of a schedule)"),
    ({"candidates": ["16", "1:16,8:0,4:4"]}, None,
     "DDTREE trial set file {path}: candidates[1]: DDTREE budget schedule '1:16,8:0,4:4': MIN_BS must be strictly "
     "increasing (8 then 4)"),
    (None, "{not json", "DDTREE trial set file {path} is not valid JSON: Expecting property name enclosed in double "
                        "quotes: line 1 column 2 (char 1)"),
])
def test_a_trial_set_file_the_runtime_rejects_fails_the_start(tmp_path, doc, raw, message):
    env = _env(tmp_path, doc, raw=raw)
    emu = Emu(tmp_path, TRIAL, env=env)
    assert emu.wait_exit(60) == 1
    text = emu.text()
    assert "ValueError: " + message.format(path=env["SGLANG_DDTREE_TRIAL_SET_FILE"]) in text.splitlines(), text[-1500:]
    assert 'sglang_ddtree/plugin.py", line 88, in validate_server_args' in text
    assert "Load weight begin" not in text and not RE_READY.search(text)


def test_a_trial_set_beside_a_schedule_file_is_refused(tmp_path):
    env = _env(tmp_path)
    sched = tmp_path / "ddtree-schedule.json"
    sched.write_text(json.dumps({"schedule": "1:16,8:4", "bands": [{"min_bs": 1, "budget": 16}, {"min_bs": 8, "budget": 4}]}))
    env["SGLANG_DDTREE_SCHEDULE_FILE"] = str(sched)
    emu = Emu(tmp_path, TRIAL, env=env)
    assert emu.wait_exit(60) == 1
    assert ("ValueError: DDTREE: SGLANG_DDTREE_TRIAL_SET_FILE and SGLANG_DDTREE_SCHEDULE_FILE are both set; a trial "
            "set carries its schedules as candidates: set only SGLANG_DDTREE_TRIAL_SET_FILE.") in emu.text()


def test_a_candidate_band_without_a_captured_batch_size_dies_in_the_capture(tmp_path):
    env = _env(tmp_path, {"candidates": ["16", "1:16,32:4"]})   # captured bs stop at 16: band 32:4 holds none
    emu = Emu(tmp_path, TRIAL, env=env)
    assert emu.wait_exit(60) == 1
    text = emu.text()
    assert "DDTree trial set: 16, 1:16,32:4 (active 16; verify widths 17,5; draft budgets 16,4)" in text
    assert "Scheduler hit an exception: Traceback" in text and "Capture target verify" not in text
    assert ("ValueError: DDTREE budget schedule 1:16,32:4: band(s) 32:4 contain no captured CUDA-graph batch size "
            "(captured bs [1, 2, 3, 4, 6, 8, 16])") in text


def test_a_bad_control_step_count_fails_like_the_worker(tmp_path):
    emu = Emu(tmp_path, TRIAL, env=_env(tmp_path, every=0))
    assert emu.wait_exit(60) == 1
    assert "ValueError: DDTREE: SGLANG_DDTREE_CONTROL_EVERY_STEPS must be >= 1, got 0" in emu.text()
    assert "sglang_ddtree/worker.py" in emu.text()


def test_without_a_trial_set_server_info_names_the_budget_or_schedule(tmp_path):
    one = TRIAL[:-len(BS) - 1] + ["--cuda-graph-max-bs-decode", "16", "--skip-server-warmup"]
    with Emu(tmp_path / "b", one) as emu:
        emu.wait_ready(60)
        assert _ddtree_state(emu) == {"active": "16", "trial_set": False}
    sched = tmp_path / "ddtree-schedule.json"
    sched.write_text(json.dumps({"schedule": SCHED, "bands": [{"min_bs": 1, "budget": 16}, {"min_bs": 3, "budget": 4},
                                                              {"min_bs": 16, "budget": 0}]}))
    with Emu(tmp_path / "s", one, env={"SGLANG_DDTREE_SCHEDULE_FILE": str(sched)}) as emu:
        emu.wait_ready(60)
        assert _ddtree_state(emu) == {"active": SCHED, "trial_set": False}
        assert not any("DDTree active" in ln or "DDTree trial" in ln for ln in emu.lines)
    with Emu(tmp_path / "ar", ["--tp-size", "2", "--skip-server-warmup"]) as emu:
        emu.wait_ready(60)
        assert "ddtree" not in json.loads(emu.get("/server_info")[1])["internal_states"][0]


def test_candidates_not_active_capture_only_the_batch_sizes_the_levels_reach(tmp_path):
    """`trial_bs` (opsctl tune's levels): the active candidate keeps every graph, the others capture
    per band the sizes the levels pad to and the band's largest; a width the active candidate uses
    keeps all. The start is shorter by the graphs left out, and a batch between a trial width's
    graphs steps at its next one."""
    doc = {"candidates": CANDIDATES, "active": "16", "trial_bs": [1, 4]}
    with Emu(tmp_path, TRIAL + ["--skip-server-warmup", "--enable-metrics"], env=_env(tmp_path, doc)) as emu:
        emu.wait_ready(60)
        tp0 = [_shape(m) for m in _messages(emu, "TP0") if m.startswith("DDTree trial ")][1:]
        assert tp0 == [
            "DDTree trial width 17 (budget 16): bs [1, 2, 3, 4, 6, 8, 16] for 16, 1:16,3:4,16:0",
            "DDTree trial width 9 (budget 8): bs [1, 4, 16] for 8",
            "DDTree trial width 5 (budget 4): bs [1, 4, 8, 16] for 4, 1:16,3:4,16:0",
            "DDTree trial width 1 (budget 0): bs [16] for 1:16,3:4,16:0",
            "DDTree trial draft budget 16: bs [1, 2, 3, 4, 6, 8, 16] for 16, 1:16,3:4,16:0",
            "DDTree trial draft budget 8: bs [1, 4, 16] for 8",
            "DDTree trial draft budget 4: bs [1, 4, 8, 16] for 4, 1:16,3:4,16:0",
        ]
        assert "DDTree trial set: 4, 8, 16, 1:16,3:4,16:0 (active 16; verify widths 17,9,5,1; draft budgets " \
               "16,8,4; trial bs 1,4)" in _messages(emu, "TP0")
        # opsctl's validation reads the trial bs from that line: every width and draft budget as planned
        parsed = journal.parse(emu.text())
        found = {f.check: f for f in validate.validate_startup(parsed, validate.expectations_from_log(parsed))}
        assert found["capture.trial_widths"].ok and found["capture.trial_drafts"].ok, \
            [f.diagnosis for f in found.values() if not f.ok]
        s = startup.parse(emu.text())
        c = emu_startup.DEFAULTS
        assert s.phase("capture target verify width 9").seconds == pytest.approx(
            3 * (c["capture_per_bs_s"] + c["capture_per_token_s"] * 9) * emu_startup.rank_factor(1), abs=0.01)
        # budget 8 live: two requests at once step at width 9's graph for 4 (padded), counted in /metrics
        _control(tmp_path, "8")
        emu.post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}})
        done = []
        threads = [threading.Thread(target=lambda: done.append(emu.post(
            "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 48, "ignore_eos": True}})))
            for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [code for code, _ in done] == [200, 200]
        _, metrics = emu.get("/metrics")
    assert re.search(r'opsctl_lab:cuda_graph_padded_steps_total\{[^}]*running_bs="2",graph_bs="4"\} [1-9]',
                     metrics.decode()), metrics.decode()[-800:]
