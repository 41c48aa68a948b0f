"""The DDTree trial set and its live switch (issue #37): the trial-set file and the
control file (grammar, errors), what is captured for a set of candidates (verify
widths x batch sizes, draft budgets x batch sizes, the lines), the control's change
detection and its CPU cost per step, TP ranks agreeing on the switch step (two real
gloo processes), and ``_ddtree_decode`` run step after step (stand-ins of SGLang as in
test_worker_decode.py) while the active candidate changes 16 -> 4 -> 1:16,3:4,16:0
with a refused budget 32 in between: output == autoregressive greedy for every
request, every step verified at the width of the candidate active then, through the
runner / backend of that width, the drafter replayed from the graph of the active
budget.  The real SGLang 0.5.23 package (.venv-sglang): server-args validation with a
trial set, the hooks' registration and the SGLang symbols they rely on.
"""

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import types

import pytest
import torch

from sglang_ddtree.schedule import ENV_SCHEDULE_FILE, Band
from sglang_ddtree.trialset import (
    ENV_CONTROL_EVERY_STEPS,
    ENV_CONTROL_FILE,
    ENV_CONTROL_INTERVAL_MS,
    ENV_TRIAL_SET_FILE,
    NO_CHANGE,
    ActiveCandidate,
    ControlFile,
    TrialSet,
    load_trial_set,
    parse_candidate,
    parse_control,
)

from test_worker_decode import Rec, stubbed, _setup  # noqa: F401  (fixture)
from test_worker_step import V  # the toy drafter's hidden size (its LM head is the identity)

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")

CANDIDATES = ["4", "8", "16", "1:16,3:4,16:0"]
GRAPH_BS = [1, 2, 3, 4, 6, 8, 16]


def _write(path, obj):
    """Atomic, as the control file must be written (a temporary file, then rename)."""
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    os.replace(tmp, path)
    return str(path)


# ----------------------------------------------------------------- grammar
def test_parse_candidate_canonical_names():
    assert parse_candidate("16").name == "16" and parse_candidate(16).bands == (Band(1, 16),)
    assert parse_candidate(" 1:16 ").name == "16"  # one band from bs 1 is that budget
    c = parse_candidate("1:16,3:4,16:0")
    assert c.name == "1:16,3:4,16:0" and c.bands == (Band(1, 16), Band(3, 4), Band(16, 0))
    assert c.describe() == "schedule 1:16,3:4,16:0" and parse_candidate(32).describe() == "budget 32"


@pytest.mark.parametrize("value,msg", [
    (0, "budget must be in 1..1024"),
    ("1025", "budget must be in 1..1024"),
    (True, "expected a budget or a schedule"),
    (3.5, "expected a budget or a schedule"),
    ("", "empty"),
    ("1:0", "budget > 0"),
    ("2:16", "start at batch size 1"),
    ("1:16;3:4", "not MIN_BS:BUDGET"),
    ("-4", "not MIN_BS:BUDGET"),
])
def test_parse_candidate_errors(value, msg):
    with pytest.raises(ValueError, match=msg):
        parse_candidate(value)


def test_trial_set_file_and_env(tmp_path):
    path = _write(tmp_path / "ts.json", {"candidates": CANDIDATES, "active": "16"})
    ts = load_trial_set(17, {ENV_TRIAL_SET_FILE: path})
    assert ts.names == CANDIDATES and ts.active == 2 and ts.source == path
    assert ts.widths == [17, 9, 5, 1] and ts.draft_budgets == [16, 8, 4]
    # "active" by its non-canonical spelling; default: the first candidate
    assert load_trial_set(17, {ENV_TRIAL_SET_FILE: _write(tmp_path / "a.json", {
        "candidates": [4, "1:16"], "active": "1:16"})}).active == 1
    assert load_trial_set(17, {ENV_TRIAL_SET_FILE: _write(tmp_path / "b.json", {"candidates": ["16", "4"]})}).active == 0
    for env in ({}, {ENV_TRIAL_SET_FILE: ""}):
        assert load_trial_set(17, env) is None


@pytest.mark.parametrize("obj,msg", [
    ("{nope", "not valid JSON"),
    ([1], "JSON object"),
    ({}, "'candidates' must be a non-empty list"),
    ({"candidates": []}, "'candidates' must be a non-empty list"),
    ({"candidates": "4,8"}, "'candidates' must be a non-empty list"),
    ({"candidates": ["4", "x"]}, r"candidates\[1\]: .*not MIN_BS:BUDGET"),
    ({"candidates": ["16", "1:16"]}, "16 listed twice"),
    ({"candidates": ["4", "16"], "active": "8"}, "'active' 8 is not a candidate"),
    ({"candidates": ["4", "16"], "active": 0}, "'active': .*budget must be in"),
    ({"candidates": ["4", "16"], "activ": "4"}, "unknown key"),
    ({"candidates": ["4", "16"], "trial_bs": [0, 8]}, "'trial_bs' must be a non-empty list of batch sizes >= 1"),
    ({"candidates": ["4", "16"], "trial_bs": []}, "'trial_bs' must be a non-empty list"),
    ({"candidates": ["4", "16"], "trial_bs": "1,8"}, "'trial_bs' must be a non-empty list"),
])
def test_trial_set_file_errors(tmp_path, obj, msg):
    with pytest.raises(ValueError, match=msg):
        load_trial_set(17, {ENV_TRIAL_SET_FILE: _write(tmp_path / "ts.json", obj)})


def test_trial_set_width_and_exclusive_with_schedule(tmp_path):
    path = _write(tmp_path / "ts.json", {"candidates": CANDIDATES})
    with pytest.raises(ValueError, match="widest width any candidate needs is 17 .* is 33"):
        load_trial_set(33, {ENV_TRIAL_SET_FILE: path})
    with pytest.raises(ValueError, match="both set"):
        load_trial_set(17, {ENV_TRIAL_SET_FILE: path, ENV_SCHEDULE_FILE: "/x.json"})
    with pytest.raises(ValueError, match="cannot be read"):
        load_trial_set(17, {ENV_TRIAL_SET_FILE: str(tmp_path / "missing.json")})


@pytest.mark.parametrize("text,msg", [
    ("", "empty"),
    ("  \n", "empty"),
    ('{"active": ', "not valid JSON"),
    ('["8"]', "expected a JSON object"),
    ('{"budget": "8"}', "unknown key"),
    ('{"active": "8", "when": 3}', "unknown key"),
    ("{}", "no 'active' key"),
    ('{"active": "1:8,1:4"}', "strictly increasing"),
    ('{"active": 0}', "budget must be in 1..1024"),
    ('{"active": null}', "expected a budget or a schedule"),
])
def test_parse_control_errors(text, msg):
    with pytest.raises(ValueError, match=msg) as e:
        parse_control(text, "/run/ctl.json")
    assert str(e.value).startswith("/run/ctl.json: ")


def test_parse_control_ok():
    assert parse_control('{"active": "1:16,3:4,16:0"}').name == "1:16,3:4,16:0"
    assert parse_control('{"active": 8}').name == "8" and parse_control('{"active": "1:8"}').name == "8"


# ----------------------------------------------------------------- what is captured
def test_capture_plan_and_lines():
    ts = TrialSet.from_json({"candidates": CANDIDATES, "active": "16"})
    ts.set_cuda_graph_bs(GRAPH_BS)
    ts.check_graph_bands()
    assert ts.verify_plan() == [
        (17, GRAPH_BS, ["16", "1:16,3:4,16:0"]),  # schedule: bs 1-2 at 17; budget 16: all
        (9, GRAPH_BS, ["8"]),
        (5, GRAPH_BS, ["4", "1:16,3:4,16:0"]),
        (1, [16], ["1:16,3:4,16:0"]),  # bs 9..16 pad to 16: the budget-0 band
    ]
    assert ts.draft_plan() == [(16, GRAPH_BS, ["16", "1:16,3:4,16:0"]), (8, GRAPH_BS, ["8"]),
                               (4, GRAPH_BS, ["4", "1:16,3:4,16:0"])]
    assert ts.log_line() == ("DDTree trial set: 4, 8, 16, 1:16,3:4,16:0 (active 16; verify widths 17,9,5,1; "
                             "draft budgets 16,8,4)")
    assert TrialSet.width_line(1, [16], ["1:16,3:4,16:0"]) == \
        "DDTree trial width 1 (budget 0): bs [16] for 1:16,3:4,16:0"
    assert TrialSet.draft_line(4, [1, 2], ["4", "1:16,3:4,16:0"]) == \
        "DDTree trial draft budget 4: bs [1, 2] for 4, 1:16,3:4,16:0"
    # a schedule band holding no captured bs can never be selected: a startup error, as for a schedule
    bad = TrialSet.from_json({"candidates": ["16", "1:16,3:4,4:8"]})  # 3 pads to 4
    bad.set_cuda_graph_bs([1, 2, 4, 8])
    with pytest.raises(ValueError, match=r"band\(s\) 3:4 contain no captured"):
        bad.check_graph_bands()
    # graphs off: nothing to capture per bs
    off = TrialSet.from_json({"candidates": ["4", "1:8,4:0"]})
    off.set_cuda_graph_bs(None)
    assert off.verify_plan() == [(9, None, ["1:8,4:0"]), (5, None, ["4"]), (1, None, ["1:8,4:0"])]


# ----------------------------------------------------------------- the control file
class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_control_file_change_detection(tmp_path):
    path = tmp_path / "ctl.json"
    clk = Clock()
    cf = ControlFile(str(path), 0.1, clock=clk)
    assert cf.poll() is None and cf.stats == 1  # absent
    _write(path, {"active": "8"})
    assert cf.poll() is None and cf.stats == 1  # within the interval: not even a stat
    clk.t = 0.1
    assert cf.poll() == '{"active": "8"}' and (cf.stats, cf.reads) == (2, 1)
    clk.t = 0.25
    assert cf.poll() is None and (cf.stats, cf.reads) == (3, 1)  # unchanged: stat only
    _write(path, {"active": "8"})  # the same text, renamed over it: a new inode -> read again
    clk.t = 0.4
    assert cf.poll() == '{"active": "8"}' and cf.reads == 2
    os.unlink(path)
    clk.t = 0.6
    assert cf.poll() is None
    _write(path, {"active": "8"})
    clk.t = 0.8
    assert cf.poll() == '{"active": "8"}' and cf.reads == 3  # reappeared: read again
    os.unlink(path)
    os.mkdir(path)  # something unreadable at the path
    clk.t = 1.0
    with pytest.raises(ValueError, match="cannot be read"):
        cf.poll()
    clk.t = 1.2
    assert cf.poll() is None  # the same unreadable thing: said once

    def no_permission(p):
        raise PermissionError(13, "Permission denied", p)

    denied = ControlFile(str(path), 0.0, clock=clk, stat=no_permission)
    with pytest.raises(ValueError, match="cannot be stat'ed"):
        denied.poll()
    assert denied.poll() is None and denied.stats == 2  # said once


class Lines:
    def __init__(self):
        self.lines = []

    def __call__(self, line):
        self.lines.append(line)


def test_active_candidate_meetings_switch_and_refusals(tmp_path):
    ts = TrialSet.from_json({"candidates": ["4", "8", "16"], "active": "16"})
    path = tmp_path / "ctl.json"
    log = Lines()
    ac = ActiveCandidate(ts, control=ControlFile(str(path), 0.0), every_steps=4, log=log)
    assert ac.active_line() == "DDTree active: 16 (since step 0)"
    _write(path, {"active": "8"})
    seen = [ts.names[ac.begin_step()] for _ in range(3)]
    assert seen == ["16"] * 3 and ac.control.stats == 0  # no meeting before step 4
    assert ts.names[ac.begin_step()] == "8" and log.lines == ["DDTree active: 8 (since step 4)"]
    _write(path, {"active": "32"})
    for _ in range(4):
        ac.begin_step()
    assert ac.name == "8" and ac.since_step == 4
    assert log.lines[-1] == "DDTree control refused: budget 32 was not captured (captured: 4, 8, 16)"
    _write(path, '{"active": "8"')  # malformed: refused, the active one stays
    for _ in range(4):
        ac.begin_step()
    assert ac.name == "8" and log.lines[-1].startswith(f"DDTree control refused: {path}: not valid JSON")
    for _ in range(8):  # unchanged file: no new line
        ac.begin_step()
    assert len(log.lines) == 3
    _write(path, {"active": "1:4"})  # canonical: budget 4
    for _ in range(4):
        ac.begin_step()
    assert ac.name == "4" and log.lines[-1] == "DDTree active: 4 (since step 24)"
    assert ac.switches == [(4, "8"), (24, "4")] and ac.meetings == 6
    st = ac.status()
    assert st["active"] == "4" and st["since_step"] == 24 and st["decode_steps"] == 24
    assert st["candidates"] == ["4", "8", "16"] and st["last_refusal"].startswith(f"{path}: not valid JSON")
    # no control file configured: never a meeting, never a broadcast
    calls = []
    quiet = ActiveCandidate(ts, control=None, broadcast=lambda v: calls.append(v) or v, every_steps=1)
    for _ in range(10):
        quiet.begin_step()
    assert calls == [] and quiet.meetings == 0 and quiet.name == "16"


def test_ranks_follow_tp0_at_the_same_step(tmp_path):
    """In-process lockstep of two ranks: rank 1 never looks at the file; it takes what
    TP0 broadcasts at each meeting, so both switch at the same step."""
    ts0 = TrialSet.from_json({"candidates": CANDIDATES, "active": "16"})
    ts1 = TrialSet.from_json({"candidates": CANDIDATES, "active": "16"})
    path = tmp_path / "ctl.json"
    mailbox = []
    log0, log1 = Lines(), Lines()

    def send(v):
        mailbox.append(v)
        return v

    def recv(v):
        assert v == NO_CHANGE  # a non-source rank proposes nothing
        return mailbox.pop(0)

    r0 = ActiveCandidate(ts0, control=ControlFile(str(path), 0.0), is_source=True, broadcast=send, every_steps=3,
                         log=log0)
    r1 = ActiveCandidate(ts1, control=ControlFile(str(path), 0.0), is_source=False, broadcast=recv, every_steps=3,
                         log=log1)
    trace = []
    for step in range(1, 31):
        if step == 5:
            _write(path, {"active": "1:16,3:4,16:0"})
        if step == 17:
            _write(path, {"active": "64"})
        trace.append((ts0.names[r0.begin_step()], ts1.names[r1.begin_step()]))
    assert all(a == b for a, b in trace), trace
    assert r0.switches == r1.switches == [(6, "1:16,3:4,16:0")]
    assert r1.control.stats == 0 and log1.lines == []  # only TP0 reads and prints
    assert log0.lines == ["DDTree active: 1:16,3:4,16:0 (since step 6)",
                          "DDTree control refused: budget 64 was not captured (captured: 4, 8, 16, 1:16,3:4,16:0)"]


GLOO_RANK = r"""
import json, os, sys
import torch, torch.distributed as dist
sys.path.insert(0, os.environ["DDTREE_SRC"])
from sglang_ddtree.trialset import ActiveCandidate, TrialSet
from sglang_ddtree.worker import tp_broadcast_int
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="file://" + os.environ["PG_FILE"], rank=rank, world_size=2)
group = type("G", (), dict(world_size=2, ranks=[0, 1], cpu_group=dist.group.WORLD))()
ts = TrialSet.from_json({"candidates": ["4", "8", "16", "1:16,3:4,16:0"], "active": "16"})
lines = []
ac = ActiveCandidate.from_env(ts, is_source=rank == 0, broadcast=lambda v: tp_broadcast_int(group, v),
                              log=lines.append)
ctl = os.environ["SGLANG_DDTREE_CONTROL_FILE"]
trace = []
for step in range(1, 41):
    if rank == 0 and step in (7, 19):  # only TP0's process writes (and reads) the control file
        tmp = ctl + ".tmp"
        open(tmp, "w").write(json.dumps({"active": "4" if step == 7 else "1:16,3:4,16:0"}))
        os.replace(tmp, ctl)
    trace.append(ac.name if ac.begin_step() is not None else None)
print(json.dumps(dict(trace=trace, switches=ac.switches, lines=lines, stats=ac.control.stats)), flush=True)
# torch 2.13's gloo group aborts at interpreter exit ("terminate called without an
# active exception", SIGABRT) in about 1 run in 7 when its threads are still joinable;
# a reference (``group``) keeps it alive past destroy_process_group. The answer is out,
# so both ranks meet, destroy the group and leave without the interpreter's teardown.
dist.barrier()
dist.destroy_process_group()
os._exit(0)
"""


def test_two_gloo_ranks_switch_at_the_same_step(tmp_path):
    """Two processes, a real gloo TP group: the worker's ``tp_broadcast_int`` carries
    TP0's proposal; both ranks switch at the same meeting step."""
    env = dict(os.environ, DDTREE_SRC=SRC, PG_FILE=str(tmp_path / "pg"),
               **{ENV_CONTROL_FILE: str(tmp_path / "ctl.json"), ENV_CONTROL_EVERY_STEPS: "4",
                  ENV_CONTROL_INTERVAL_MS: "0"})
    procs = [subprocess.Popen([sys.executable, "-c", GLOO_RANK], env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    r0, r1 = outs
    assert r0["trace"] == r1["trace"]
    assert r0["switches"] == r1["switches"] == [[8, "4"], [20, "1:16,3:4,16:0"]]
    assert r0["lines"] == ["DDTree active: 4 (since step 8)", "DDTree active: 1:16,3:4,16:0 (since step 20)"]
    assert r1["lines"] == [] and r1["stats"] == 0 and r0["stats"] == 10  # a stat per meeting (interval 0)


def test_control_check_cpu_cost_per_step(tmp_path):
    """The per-step cost of the check (process CPU time, so descheduling does not count):
    a step counter and, every 16th step, a clock read (and a stat at most every 100 ms).
    Printed for the record; bounded loosely."""
    ts = TrialSet.from_json({"candidates": CANDIDATES, "active": "16"})
    path = _write(tmp_path / "ctl.json", {"active": "16"})
    costs = {}
    for name, every, interval in (("default (every 16 steps, stat <= 10/s)", 16, 0.1),
                                  ("worst (a stat every step)", 1, 0.0)):
        ac = ActiveCandidate(ts, control=ControlFile(path, interval), every_steps=every)
        n = 200_000 if every > 1 else 20_000
        t0 = time.process_time()
        for _ in range(n):
            ac.begin_step()
        costs[name] = (time.process_time() - t0) / n * 1e6
        if every == 1:
            assert ac.control.stats == n and ac.control.reads == 1  # read once, then unchanged
    # a no-op step loop for comparison
    t0 = time.process_time()
    for _ in range(200_000):
        pass
    base = (time.process_time() - t0) / 200_000 * 1e6
    print("control check, CPU us per decode step:", {k: round(v, 3) for k, v in costs.items()},
          f"(empty loop {base:.3f})")
    assert costs["default (every 16 steps, stat <= 10/s)"] < 5.0
    assert costs["worst (a stat every step)"] < 100.0


# ----------------------------------------------------------------- decode while switching
SIZES = [1, 3, 2, 8, 10, 4, 6, 1, 9, 2, 5, 7, 3, 10, 1, 2, 6, 8, 9, 3, 1, 2, 10, 4, 7, 1, 2, 5]
WRITE_BEFORE = {3: "4", 9: "32", 13: "1:16,3:4,16:0"}  # control written before these (1-based) steps
EVERY = 4


def _expected_active(step):
    """The candidate serving decode step ``step`` (meetings at multiples of EVERY)."""
    if step >= 16:
        return "1:16,3:4,16:0"
    if step >= 4:
        return "4"
    return "16"


@pytest.mark.parametrize("graph", [False, True], ids=["eager-head", "graph-head"])
def test_decode_while_switching_equals_autoregressive(stubbed, monkeypatch, tmp_path, caplog, graph):
    from sglang_ddtree import plugin as pl
    from sglang_ddtree import worker as wmod

    L, Bmax, nreq = 4, 16, 10
    ts_path = _write(tmp_path / "trials.json", {"candidates": CANDIDATES, "active": "16"})
    ctl = tmp_path / "control.json"
    monkeypatch.setenv(ENV_TRIAL_SET_FILE, ts_path)
    monkeypatch.delenv(ENV_SCHEDULE_FILE, raising=False)
    monkeypatch.setenv(ENV_CONTROL_FILE, str(ctl))
    monkeypatch.setenv(ENV_CONTROL_EVERY_STEPS, str(EVERY))
    monkeypatch.setenv(ENV_CONTROL_INTERVAL_MS, "0")
    dfw, state, _, _ = stubbed
    # what the plugin's capture needs of SGLang beyond the decode stand-ins
    cgc = sys.modules["sglang.srt.model_executor.cuda_graph_config"]
    monkeypatch.setattr(cgc, "Phase", types.SimpleNamespace(DECODE="decode"), raising=False)
    monkeypatch.setattr(cgc, "check_cuda_graph_backend", lambda phase, backend: False, raising=False)
    runner_pkg = types.ModuleType("sglang.srt.model_executor.runner")
    base_runner = types.ModuleType("sglang.srt.model_executor.runner.base_cuda_graph_runner")
    base_runner.get_batch_sizes_to_capture = lambda mr, n: (list(GRAPH_BS), None)
    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor.runner", runner_pkg)
    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor.runner.base_cuda_graph_runner", base_runner)

    caplog.set_level(logging.INFO)
    S = _setup(stubbed, L, Bmax, nreq, 0.8, seed=11, graph=False, n_new=len(SIZES) * (L + 1))
    worker, model, prompts, refs, rt, pool_idx, calls, tw = (
        S[k] for k in ("worker", "model", "prompts", "refs", "rt", "pool_idx", "calls", "tw"))
    draft_calls = S["draft_calls"]
    assert worker.ddtree_trials.names == CANDIDATES and worker.ddtree_active.name == "16"
    assert worker.ddtree_schedule.spec == "1:16" and worker.ddtree_budget == 16

    # -- the target's startup capture through the plugin's hook (stand-in capture_decode_graph)
    mr = tw.model_runner
    mr.spec_algorithm = types.SimpleNamespace(name="DDTREE")
    mr.is_draft_worker = False
    backends = []

    def new_backend(tag):
        b = types.SimpleNamespace(tag=tag, verify_mask=None, max_context_len=10 ** 6)
        backends.append(b)
        return b

    mr._get_attention_backend = lambda init_new_workspace=False: new_backend(
        ("target", state["spec"].speculative_num_draft_tokens))
    startup_backend = mr.attn_backend
    target_log = []

    def fake_capture_decode_graph(*, model_runner):
        width = state["spec"].speculative_num_draft_tokens  # decode_num_tokens_per_req() under the override
        bs = list(state["exec"].graph.cuda_graph_config.decode.bs)
        target_log.append((width, bs))
        r = types.SimpleNamespace(captured_req_width=width, capture_bs=bs, attn_backend=model_runner.attn_backend)
        return types.SimpleNamespace(runner=r, memory_phase="target_verify", memory_usage_gb=0.25, capture_time=0.1)

    state["exec"].graph.cuda_graph_config.decode.bs = list(GRAPH_BS)
    cap = pl._capture_decode_graph_hook(fake_capture_decode_graph, model_runner=mr)
    assert target_log == [(17, GRAPH_BS), (9, GRAPH_BS), (5, GRAPH_BS), (1, [16])]  # each (width, bs) once
    assert state["spec"].speculative_num_draft_tokens == 17 and state["exec"].graph.cuda_graph_config.decode.bs == \
        GRAPH_BS  # overrides restored
    wstates = mr._ddtree_trial_states
    assert sorted(wstates) == [1, 5, 9, 17] and wstates[17].attn_backend is startup_backend
    assert [wstates[w].attn_backend.tag for w in (9, 5, 1)] == [("target", 9), ("target", 5), ("target", 1)]
    assert cap.runner is wstates[17].graph_runner and abs(cap.memory_usage_gb - 1.0) < 1e-9

    # -- the drafter's capture: DFlash's init_cuda_graphs (stand-in) through the same hook
    dmr = worker.draft_model_runner
    draft_log = []
    if graph:
        dmr.is_draft_worker = True
        dmr.attn_backend = new_backend(("draft", "startup"))
        dmr.decode_cuda_graph_runner = None
        n_backends = [0]

        def draft_backend(init_new_workspace=False):
            n_backends[0] += 1
            return new_backend(("draft", n_backends[0]))

        dmr._get_attention_backend = draft_backend

        def fake_draft_capture(*, model_runner):
            """One 'graph' per bs: the capture tail hook (DFlash's, calling the sampler) runs
            once at capture; the head it reached is what that graph replays."""
            bs_list = list(state["exec"].graph.cuda_graph_config.decode.bs)
            sampler = worker._draft_sampler
            baked = {}
            for P in sorted(bs_list, reverse=True):
                h = torch.randn(P * (L + 1), V, dtype=torch.float64)
                sampler(h, torch.zeros(P * (L + 1), dtype=torch.long))
                baked[P] = sampler.heads[sampler.capture_budget]
            draft_log.append((sampler.capture_budget, bs_list))
            r = types.SimpleNamespace(capture_bs=bs_list, baked=baked, attn_backend=model_runner.attn_backend,
                                      budget=sampler.capture_budget)
            return types.SimpleNamespace(runner=r, memory_phase="draft_decode", memory_usage_gb=0.1, capture_time=0.1)

        def fake_dflash_init_cuda_graphs(self):
            # DFlash: build the sampler before capture, then the draft worker's capture
            self._draft_sampler = self._maybe_build_draft_sampler()
            c = pl._capture_decode_graph_hook(fake_draft_capture, model_runner=self.draft_model_runner)
            self.draft_model_runner.decode_cuda_graph_runner = c.runner

        monkeypatch.setattr(dfw.DFlashWorkerV2, "init_cuda_graphs", fake_dflash_init_cuda_graphs, raising=False)
        worker.init_cuda_graphs()  # the scheduler's call after the target's
        assert isinstance(worker._draft_sampler, wmod.CaptureBudgetHead)
        assert draft_log == [(16, GRAPH_BS), (8, GRAPH_BS), (4, GRAPH_BS)]  # one capture per draft budget
        assert getattr(dmr, "_ddtree_draft_capture", None) is None  # the plan is consumed
        dstates = dmr._ddtree_draft_states
        assert sorted(dstates) == [4, 8, 16] and dstates[16].attn_backend.tag == ("draft", "startup")
        assert len({id(s.attn_backend) for s in dstates.values()}) == 3  # each budget its own draft backend
        assert {b: h._cap for b, h in worker._ddtree_heads.items()} == {16: 16, 8: 16, 4: 16}
        assert state["exec"].graph.cuda_graph_config.decode.bs == GRAPH_BS

        orig_forward = dmr.forward
        replays = []

        def replaying_forward(fb):
            """A draft graph replay: the installed runner's graph of the padded bs, i.e. the
            head baked into it at capture, on the padded hidden states."""
            out = orig_forward(fb)  # graph_mode off: the drafter's hidden states, no head call
            runner = dmr.decode_cuda_graph_runner
            bs_ = fb.batch_size
            P = next(c for c in runner.capture_bs if c >= bs_)
            assert dmr.attn_backend is runner.attn_backend, "draft backend != the replayed graph's"
            hidden = out.logits_output.hidden_states.view(bs_, L + 1, -1)
            hp = torch.randn(P, L + 1, hidden.shape[-1], dtype=hidden.dtype) * 5  # padding rows: garbage
            hp[:bs_] = hidden
            ip = torch.randint(0, V, (P, L + 1))
            ip[:bs_] = fb.input_ids.view(bs_, L + 1)
            runner.baked[P](hp.view(P * (L + 1), -1), ip.view(-1))
            replays.append((bs_, runner.budget))
            out.can_run_graph = True
            return out

        dmr.forward = replaying_forward
    else:
        # DFlash with its draft graph off (e.g. < 1 GB left after the target's): no sampler, no capture
        monkeypatch.setattr(dfw.DFlashWorkerV2, "init_cuda_graphs", lambda self: None, raising=False)
        worker.init_cuda_graphs()
        assert getattr(dmr, "_ddtree_draft_capture", None) is None and worker._ddtree_heads == {}

    # -- the target forward: the active candidate's width, that width's runner / backend
    seen = []
    orig_fwd = tw.forward_batch_generation

    def fwd(batch=None, forward_batch=None, is_verify=False, pp_proxy_tensors=None):
        bs_ = len(forward_batch.seq_lens)
        width = forward_batch.spec_info.draft_token_num
        runner = mr.decode_cuda_graph_runner
        padded = next(c for c in GRAPH_BS if c >= bs_)
        assert runner.captured_req_width == width and padded in runner.capture_bs
        assert mr.attn_backend is runner.attn_backend
        seen.append((bs_, width))
        return orig_fwd(batch, forward_batch, is_verify, pp_proxy_tensors)

    tw.forward_batch_generation = fwd

    seqs, bonus = [], []
    for b, p in enumerate(prompts):
        T = len(p)
        slots = rt[int(pool_idx[b]), :T]
        lg, _ = model.forward(torch.tensor(p), torch.arange(T), slots[:0], slots,
                              torch.tril(torch.ones(T, T, dtype=torch.bool)))
        seqs.append(list(p))
        bonus.append(int(lg[-1].argmax()))
    seq_lens = torch.tensor([len(p) for p in prompts])
    bonus = torch.tensor(bonus)
    DraftInput = S["DraftInput"]

    class Mode:
        def is_extend(self):
            return False

        def is_idle(self):
            return False

    expected = {c: worker.ddtree_trials.schedules[i] for i, c in enumerate(CANDIDATES)}
    widths_by_active = {}
    for t, k in enumerate(SIZES):
        step = t + 1
        if step in WRITE_BEFORE:
            _write(ctl, {"active": WRITE_BEFORE[step]})
        active = [(t * 3 + j) % nreq for j in range(k)]
        idx = torch.tensor(active)
        spec = DraftInput(bonus_tokens=bonus[idx].clone(), new_seq_lens=seq_lens[idx].clone())
        spec.nxt_kv_lens_cpu = seq_lens[idx] + 2 * (Bmax + 1)  # prepare_for_decode reserves 2 x the widest width
        spec.nxt_kv_lens_sum = int(spec.nxt_kv_lens_cpu.sum())
        batch = Rec(forward_mode=Mode(), is_extend_in_batch=False, spec_info=spec, seq_lens=seq_lens[idx].clone(),
                    seq_lens_cpu=None, seq_lens_sum=None, req_pool_indices=pool_idx[idx].clone(), reqs=[None] * k,
                    has_grammar=False, return_logprob=False, sampling_info=None, can_run_decode_cuda_graph=graph,
                    out_cache_loc=None, input_ids=None)
        calls.clear()
        draft_calls.clear()
        res = worker.forward_batch_generation(batch)
        want = _expected_active(step)
        assert worker.ddtree_active.name == want and worker.ddtree_active.step == step
        B = expected[want].budget_for(k)
        N = B + 1
        assert seen[-1] == (k, N), f"step {step}: verified at {seen[-1][1]}, want width {N} ({want})"
        assert res.speculative_num_draft_tokens == N and res.next_token_ids.numel() == k * N
        widths_by_active.setdefault(want, set()).add(N)
        if B == 0:
            assert draft_calls == [] and (res.accept_lens == 1).all()
        elif graph:
            assert replays[-1] == (k, B), f"step {step}: the draft graph of budget {replays[-1][1]} replayed, want {B}"
        lens = res.accept_lens
        out = res.next_token_ids.view(k, N)
        for j, r in enumerate(active):
            n = int(lens[j])
            committed = out[j, :n].tolist()
            seqs[r] += [int(bonus[r])] + committed[:-1]
            bonus[r] = committed[-1]
            seq_lens[r] = int(seq_lens[r]) + n
            assert n <= min(L, B) + 1
    # every step after each change verified at the new candidate's widths
    assert widths_by_active == {"16": {17}, "4": {5}, "1:16,3:4,16:0": {17, 5, 1}}, widths_by_active
    for r in range(nreq):
        assert seqs[r] == refs[r][:len(seqs[r])], f"request {r}: output differs from autoregressive greedy"
        assert len(seqs[r]) > len(prompts[r]) + 10
    msgs = [rec.getMessage() for rec in caplog.records]
    ddt = [m for m in msgs if m.startswith(("DDTree active", "DDTree control", "DDTree trial"))]
    want_lines = [
        "DDTree trial set: 4, 8, 16, 1:16,3:4,16:0 (active 16; verify widths 17,9,5,1; draft budgets 16,8,4)",
        f"DDTree trial width 17 (budget 16): bs {GRAPH_BS} for 16, 1:16,3:4,16:0",
        f"DDTree trial width 9 (budget 8): bs {GRAPH_BS} for 8",
        f"DDTree trial width 5 (budget 4): bs {GRAPH_BS} for 4, 1:16,3:4,16:0",
        "DDTree trial width 1 (budget 0): bs [16] for 1:16,3:4,16:0",
    ]
    if graph:
        want_lines += [f"DDTree trial draft budget 16: bs {GRAPH_BS} for 16, 1:16,3:4,16:0",
                       f"DDTree trial draft budget 8: bs {GRAPH_BS} for 8",
                       f"DDTree trial draft budget 4: bs {GRAPH_BS} for 4, 1:16,3:4,16:0"]
    want_lines += [
        "DDTree active: 16 (since step 0)",  # once the start-up captures are done
        "DDTree active: 4 (since step 4)",
        "DDTree control refused: budget 32 was not captured (captured: 4, 8, 16, 1:16,3:4,16:0)",
        "DDTree active: 1:16,3:4,16:0 (since step 16)",
    ]
    assert ddt == want_lines
    st = worker.ddtree_status()
    assert st["active"] == "1:16,3:4,16:0" and st["since_step"] == 16 and st["trial_set"] is True
    assert st["verify_widths"] == [17, 9, 5, 1] and st["draft_budgets"] == [16, 8, 4]


def test_internal_state_hook_adds_ddtree_status():
    from sglang_ddtree import plugin as pl

    worker = types.SimpleNamespace(ddtree_status=lambda: {"active": "8", "since_step": 3})
    controller = types.SimpleNamespace(scheduler=types.SimpleNamespace(draft_worker=worker))
    seen = []

    def original(ctrl, state):
        seen.append(ctrl)
        state["avg_spec_accept_length"] = 2.5

    state = {}
    pl._internal_state_hook(original, controller, state)
    assert seen == [controller] and state == {"avg_spec_accept_length": 2.5, "ddtree": {"active": "8", "since_step": 3}}
    other = {}  # another algorithm's worker: untouched
    pl._internal_state_hook(original, types.SimpleNamespace(scheduler=types.SimpleNamespace(draft_worker=object())),
                            other)
    assert "ddtree" not in other


# ----------------------------------------------------------------- real SGLang 0.5.23
def test_server_args_and_hooks_with_trial_set_real_sglang(sglang_python, tmp_path):
    """The real 0.5.23 parser / plugin loader (runtime/src first on the path): a trial set
    validates; its width mismatch, a malformed file, or a schedule file as well is a
    ValueError at server-args validation; the capture and internal-state hooks are
    registered; the SGLang code they rely on has the shape they assume (source)."""
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"block_size": 8}))
    good = _write(tmp_path / "good.json", {"candidates": CANDIDATES, "active": "16"})
    bad = _write(tmp_path / "bad.json", {"candidates": ["16", "2:8"]})
    sched = _write(tmp_path / "sched.json", {"bands": [{"min_bs": 1, "budget": 16}]})
    code = textwrap.dedent(f"""
        import argparse, ast, importlib.util, json, os
        from sglang.srt.plugins import load_plugins
        load_plugins()
        import sglang_ddtree
        assert sglang_ddtree.__file__.startswith({SRC!r}), sglang_ddtree.__file__
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.plugins.hook_registry import HookRegistry
        import sglang_ddtree.plugin as pl
        p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
        def args(ndt):
            a = p.parse_args(["--model-path", {str(drafter)!r}, "--speculative-algorithm", "DDTREE",
                              "--speculative-num-draft-tokens", str(ndt),
                              "--speculative-draft-model-path", {str(drafter)!r}, "--device", "cpu"])
            return ServerArgs.from_cli_args(a)
        algo = SpeculativeAlgorithm.from_string("DDTREE")
        res = {{}}
        for name, path, ndt, sched in [("good", {good!r}, 17, None), ("mismatch", {good!r}, 33, None),
                                       ("bad", {bad!r}, 17, None), ("both", {good!r}, 17, {sched!r})]:
            os.environ["SGLANG_DDTREE_TRIAL_SET_FILE"] = path
            os.environ.pop("SGLANG_DDTREE_SCHEDULE_FILE", None)
            if sched:
                os.environ["SGLANG_DDTREE_SCHEDULE_FILE"] = sched
            try:
                algo.validate_server_args(args(ndt)); res[name] = "ok"
            except ValueError as e:
                res[name] = "ValueError: " + str(e)[:300]
        res["hooks"] = {{t: [h[1].__name__ for h in HookRegistry._hooks.get(t, [])]
                        for t in (pl.CAPTURE_DECODE_TARGET, pl.INTERNAL_STATE_TARGET)}}
        root = os.path.dirname(importlib.util.find_spec("sglang").origin)
        def fn(rel, cls, name):
            tree = ast.parse(open(os.path.join(root, rel)).read())
            for node in ast.walk(tree):
                if cls is None and isinstance(node, ast.FunctionDef) and node.name == name:
                    return node
                if isinstance(node, ast.ClassDef) and node.name == cls:
                    return next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name)
        add = fn("srt/managers/scheduler_components/internal_state.py", "SchedulerInternalStateController",
                 "_add_speculative")
        get = fn("srt/managers/scheduler_components/internal_state.py", "SchedulerInternalStateController",
                 "get_internal_state")
        res["add_speculative_args"] = [a.arg for a in add.args.args]
        res["get_state_calls_it"] = "self._add_speculative" in ast.unparse(get)
        cdg = fn("srt/model_executor/model_runner_components/cuda_graph_setup.py", None, "capture_decode_graph")
        res["capture_kwonly"] = [a.arg for a in cdg.args.kwonlyargs]
        ps = open(os.path.join(root, "srt/distributed/parallel_state.py")).read()
        res["group_fields"] = all(f"self.{{a}} = " in ps for a in ("ranks", "world_size", "cpu_group"))
        sch = open(os.path.join(root, "srt/managers/scheduler.py")).read()
        res["scheduler_draft_worker"] = "self.draft_worker = DraftWorkerClass(" in sch
        mr = open(os.path.join(root, "srt/model_executor/model_runner.py")).read()
        res["runner_attrs"] = all(s in mr for s in ("self.decode_cuda_graph_runner = capture.decode.runner",
                                                    "def _get_attention_backend(", "self.is_draft_worker"))
        print(json.dumps(res))
    """)
    env = dict(os.environ, SGLANG_PLUGINS="ddtree", PYTHONPATH=SRC)
    p = subprocess.run([sglang_python, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["good"] == "ok", r
    assert r["mismatch"].startswith("ValueError") and "widest width any candidate needs is 17" in r["mismatch"], r
    assert r["bad"].startswith("ValueError") and "start at batch size 1" in r["bad"], r
    assert r["both"].startswith("ValueError") and "both set" in r["both"], r
    assert r["hooks"] == {pl_target: [fn] for pl_target, fn in (
        ("sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_decode_graph",
         "_capture_decode_graph_hook"),
        ("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController."
         "_add_speculative", "_internal_state_hook"))}, r
    assert r["add_speculative_args"] == ["self", "state"] and r["get_state_calls_it"]
    assert r["capture_kwonly"] == ["model_runner"]
    assert r["group_fields"] and r["scheduler_draft_worker"] and r["runner_attrs"], r


# ----------------------------------------------------------------- the benchmark's CPU-checkable parts
def test_bench_trialset_cpu_smoke(tmp_path):
    """bench/bench_trialset.py's argument parsing, plan, control-check timing, memory rows
    and replay table on the CPU (eager calls at tiny sizes)."""
    bench = os.path.join(os.path.dirname(HERE), "bench", "bench_trialset.py")
    env = dict(os.environ, SGLANG_DDTREE_DISABLE_TRITON="1")
    p = subprocess.run([sys.executable, bench, "--cpu-smoke", "--quick", "--control-steps", "20000",
                        "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.load(open(tmp_path / "bench_trialset.json"))
    assert doc["ok"] and doc["candidates"] == ["4", "16", "1:16,8:4"]
    assert doc["budget_at"]["1:16,8:4"] == {"1": 16, "8": 4}
    assert [r["candidate"] for r in doc["memory"]["per_candidate"]] == ["4", "16", "1:16,8:4"]
    assert doc["memory"]["per_candidate"][2]["new_graphs"] == []  # the schedule reuses 16@1 and 4@8
    assert doc["memory"]["per_candidate"][1]["new_heads"] == [16]
    cc = doc["control_check"]
    default = cc["default: meeting every 16 steps, stat <= every 100 ms"]
    assert default["steps"] == 20000 and default["stats"] >= 1 and default["cpu_us_per_step"] > 0
    assert cc["a stat every step (every_steps 1, interval 0)"]["stats"] == 2000
    assert [(r["bs"], r["candidate"], r["budget"]) for r in doc["replay"]] == [
        (1, "4", 4), (1, "16", 16), (1, "1:16,8:4", 16), (8, "4", 4), (8, "16", 16), (8, "1:16,8:4", 4)]
    assert all(r["alone_us"] > 0 and r["alternating_us"] > 0 for r in doc["replay"])
    assert len(doc["exact"]) == 4 and all(doc["exact"].values())
    text = open(tmp_path / "results-trialset.txt").read()
    assert "| bs | candidate | budget | alone (us) | alternating (us) | alternating / alone |" in text


def test_bench_trialset_arguments():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))
    try:
        import bench_trialset as bt
    finally:
        sys.path.pop(0)
    a = bt.parse_args([])
    assert a.candidates == bt.DEFAULT_CANDIDATES and a.bs == [1, 8, 32, 128] and a.reps == 300 and not a.no_aot
    q = bt.parse_args(["--quick", "--bs", "8", "1", "8"])
    assert q.candidates == bt.QUICK_CANDIDATES and q.bs == [1, 8] and q.reps == 100
    c = bt.parse_args(["--candidates", "8", "1:8,4:0", "--cpu-smoke"])
    assert c.candidates == ["8", "1:8,4:0"] and c.shard == 1000 and c.hidden == 64 and c.reps == 3
    ts, budget_at = bt.build_plan(["8", "1:8,4:0"], [1, 2, 4, 8])
    assert budget_at == {"8": {1: 8, 2: 8, 4: 8, 8: 8}, "1:8,4:0": {1: 8, 2: 8, 4: 0, 8: 0}}
    with pytest.raises(ValueError, match="contain no captured"):
        bt.build_plan(["8", "1:8,3:4,4:0"], [1, 2, 4, 8])  # 3 pads to 4: band 3:4 never selected
    assert bt.backend_model_bytes(128, 17, 32768) == {"kv_indices": 128 * 17 * 32768 * 8,
                                                      "verify_mask": 128 * 17 * (32768 + 17)}


def test_trial_bs_leaves_the_other_candidates_the_graphs_their_levels_reach(tmp_path):
    """Issue #51: `trial_bs` (a tune's levels): `active` keeps every captured bs; the others capture per
    band what those batch sizes pad to and the band's largest; the set line names them."""
    ts = load_trial_set(17, {ENV_TRIAL_SET_FILE: _write(tmp_path / "ts.json", {
        "candidates": ["4", "8", "16"], "active": "16", "trial_bs": [1, 5]})})
    ts.set_cuda_graph_bs([1, 2, 4, 6, 8, 16])
    assert [(w, bs) for w, bs, _ in ts.verify_plan()] == [(17, [1, 2, 4, 6, 8, 16]), (9, [1, 6, 16]), (5, [1, 6, 16])]
    assert [(b, bs) for b, bs, _ in ts.draft_plan()] == [(16, [1, 2, 4, 6, 8, 16]), (8, [1, 6, 16]), (4, [1, 6, 16])]
    assert ts.log_line().endswith("; draft budgets 16,8,4; trial bs 1,5)")
