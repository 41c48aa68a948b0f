"""The DDTree budget schedule (issue #18): parsing / validation, routing (= SGLang's
``AdaptiveSpeculativeParams._route``), the banded target-verify capture (which
width each captured bs gets, the log lines), and ``_ddtree_decode`` run step after
step with a batch that grows and shrinks across bands (same stand-ins as
test_worker_decode.py): output == autoregressive greedy, budget-0 steps run no
drafter, the drafter context stays complete.
"""

import json
import logging
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from sglang_ddtree.schedule import (
    ENV_SCHEDULE_FILE,
    Band,
    BudgetSchedule,
    bands_from_json,
    load_schedule,
    parse_schedule,
)

from test_worker_decode import N_NEW, Rec, stubbed, _setup  # noqa: F401  (fixture)

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


# ----------------------------------------------------------------- parsing / validation
def test_parse_schedule_ok():
    assert parse_schedule("1:32,8:16,32:8,64:0") == [Band(1, 32), Band(8, 16), Band(32, 8), Band(64, 0)]
    assert parse_schedule("1:7") == [Band(1, 7)]
    assert parse_schedule("1:0,4:1024") == [Band(1, 0), Band(4, 1024)]
    s = BudgetSchedule(parse_schedule("1:32,8:16,32:8,64:0"), source="f")
    assert s.widths == [33, 17, 9, 1] and s.budget_max == 32
    assert s.log_line() == "DDTree budget schedule: 1:32,8:16,32:8,64:0 (verify widths 33,17,9,1)"


@pytest.mark.parametrize("text,msg", [
    ("", "empty"),
    ("2:32", "start at batch size 1"),
    ("1:32,8:16,8:4", "strictly increasing"),
    ("1:32,8:16,4:4", "strictly increasing"),
    ("1:1025", "outside 0..1024"),
    ("1:0,8:0", "budget > 0"),
    ("1:-1", "not MIN_BS:BUDGET"),
    ("1:32;8:16", "not MIN_BS:BUDGET"),
    ("1:32,", "not MIN_BS:BUDGET"),
    ("1:3.5", "not MIN_BS:BUDGET"),
    ("0:4", "start at batch size 1"),
    ("a:4", "not MIN_BS:BUDGET"),
])
def test_parse_schedule_errors(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_schedule(text)


def _write(tmp_path, obj, name="sched.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


GOOD = {"schedule": "1:32,8:16,32:8,64:0",
        "bands": [{"min_bs": 1, "budget": 32}, {"min_bs": 8, "budget": 16}, {"min_bs": 32, "budget": 8},
                  {"min_bs": 64, "budget": 0}]}


def test_load_schedule_file_and_env(tmp_path):
    path = _write(tmp_path, GOOD)
    s = load_schedule(33, {ENV_SCHEDULE_FILE: path})
    assert s.spec == "1:32,8:16,32:8,64:0" and s.source == path
    # no "schedule" key: bands alone
    s2 = load_schedule(33, {ENV_SCHEDULE_FILE: _write(tmp_path, {"bands": GOOD["bands"]}, "b.json")})
    assert s2.bands == s.bands
    # unset (or empty) variable: today's single band
    for env in ({}, {ENV_SCHEDULE_FILE: ""}):
        one = load_schedule(33, env)
        assert one.bands == [Band(1, 32)] and one.source is None and one.budget_for(1000) == 32


@pytest.mark.parametrize("obj,msg", [
    ("{not json", "not valid JSON"),
    ([1, 2], "JSON object"),
    ({"schedule": "1:32"}, "'bands' must be a non-empty list"),
    ({"bands": []}, "'bands' must be a non-empty list"),
    ({"bands": [{"min_bs": 1}]}, r"bands\[0\]\.budget must be an integer"),
    ({"bands": [{"min_bs": "1", "budget": 32}]}, r"bands\[0\]\.min_bs must be an integer"),
    ({"bands": [{"min_bs": 1, "budget": True}]}, "must be an integer"),
    ({"bands": [{"min_bs": 1, "budget": 32}, {"min_bs": 1, "budget": 8}]}, "strictly increasing"),
    ({"schedule": "1:32,8:16", "bands": [{"min_bs": 1, "budget": 32}, {"min_bs": 8, "budget": 8}]}, "disagrees"),
    ({"schedule": "1:32,8:x", "bands": [{"min_bs": 1, "budget": 32}]}, "not MIN_BS:BUDGET"),
    (dict(GOOD, bands=GOOD["bands"][:1] + [{"min_bs": 8, "budget": 2000}]), "outside 0..1024"),
])
def test_load_schedule_file_errors(tmp_path, obj, msg):
    with pytest.raises(ValueError, match=msg):
        load_schedule(33, {ENV_SCHEDULE_FILE: _write(tmp_path, obj)})


def test_load_schedule_width_must_match_num_draft_tokens(tmp_path):
    path = _write(tmp_path, GOOD)
    with pytest.raises(ValueError, match="widest band's width is 33 .* --speculative-num-draft-tokens is 17"):
        load_schedule(17, {ENV_SCHEDULE_FILE: path})
    with pytest.raises(ValueError, match="cannot be read"):
        load_schedule(33, {ENV_SCHEDULE_FILE: str(tmp_path / "missing.json")})


# ----------------------------------------------------------------- routing
def test_routing_pads_to_graph_bs_then_band():
    s = BudgetSchedule(parse_schedule("1:32,8:16,32:8,64:0"), source="x")
    # graphs off: the running bs itself
    assert [s.budget_for(b) for b in (1, 7, 8, 31, 32, 63, 64, 500)] == [32, 32, 16, 16, 8, 8, 0, 0]
    s.set_cuda_graph_bs([1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64])
    # 5..7 pad to 8 -> band 8:16; 25..31 pad to 32 -> 32:8; 57..63 pad to 64 -> 64:0; > 64: itself
    assert [s.budget_for(b) for b in (1, 4, 5, 7, 8, 24, 25, 32, 56, 57, 64, 65, 1000)] == \
        [32, 32, 16, 16, 16, 16, 8, 8, 8, 0, 0, 0, 0]
    assert s.cuda_graph_bs_for_band(0) == [1, 2, 4]
    assert s.cuda_graph_bs_for_band(1) == [8, 12, 16, 24]
    assert s.cuda_graph_bs_for_band(2) == [32, 40, 48, 56]
    assert s.cuda_graph_bs_for_band(3) == [64]
    assert s.tree_cuda_graph_bs() == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56]
    s.check_graph_bands()
    # a band that holds no captured bs can never be selected: an error at startup
    s2 = BudgetSchedule(parse_schedule("1:32,5:16,8:8"), source="x")
    s2.set_cuda_graph_bs([1, 2, 4, 8, 16])
    with pytest.raises(ValueError, match=r"band\(s\) 5:16 contain no captured"):
        s2.check_graph_bands()
    s3 = BudgetSchedule(parse_schedule("1:32,128:0"), source="x")
    s3.set_cuda_graph_bs([1, 2, 4, 8, 64])
    with pytest.raises(ValueError, match="128:0"):
        s3.check_graph_bands()


def test_routing_equals_sglang_adaptive_route(sglang_python, tmp_path):
    """Our band choice == SGLang 0.5.23's ``AdaptiveSpeculativeParams._route`` (real
    class) with one slot per band, for many graph-bs lists and batch sizes."""
    code = textwrap.dedent(f"""
        import json, random, sys
        sys.path.insert(0, {SRC!r})
        from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams
        from sglang_ddtree.schedule import BudgetSchedule, parse_schedule
        rng = random.Random(0)
        n = 0
        for text in ["1:32,8:16,32:8,64:0", "1:8", "1:4,2:0,3:16", "1:0,100:7,300:1"]:
            bands = parse_schedule(text)
            cfg = {{str(b.min_bs): {{"candidate_steps": [i]}} for i, b in enumerate(bands)}}
            path = {str(tmp_path)!r} + "/cfg.json"
            json.dump(cfg, open(path, "w"))
            for graph in [None, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64], [1, 3, 7, 100, 128, 512],
                          sorted(rng.sample(range(1, 600), 9))]:
                ap = AdaptiveSpeculativeParams(initial_steps=0, cfg_path=path)
                ap.set_cuda_graph_bs(graph)
                s = BudgetSchedule(bands, source="x")
                s.set_cuda_graph_bs(graph)
                for bs in list(range(1, 700)):
                    assert s.band_index(bs) == ap.get_steps_for_batch(bs), (text, graph, bs)
                    n += 1
                if graph:
                    for i in range(len(bands)):
                        assert s.cuda_graph_bs_for_band(i) == ap.cuda_graph_bs_for_step(i), (text, graph, i)
        print("checked", n)
    """)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    p = subprocess.run([sglang_python, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "checked" in p.stdout


# ----------------------------------------------------------------- banded capture (stand-in SGLang)
class FakeRunner:
    def __init__(self, width, bs, backend):
        self.captured_req_width, self.capture_bs, self.attn_backend = width, list(bs), backend


def _capture_with_fakes(sched, graph_bs, n_max, model_runner, graphs_on=True):
    """``capture_banded_verify_graphs`` against stand-ins of SGLang's context: the
    fake ``capture_decode_graph`` reads the (overridden) width and bs list the way
    the real one does and prints its line pair."""
    from sglang_ddtree import plugin as pl

    spec = types.SimpleNamespace(speculative_num_draft_tokens=n_max)
    exec_cfg = types.SimpleNamespace(graph=types.SimpleNamespace(
        cuda_graph_config=types.SimpleNamespace(decode=types.SimpleNamespace(bs=list(graph_bs), backend="full"))))

    class Ctx:
        def override(self, source, **fields):
            for k, v in fields.items():
                if k == "cuda_graph_config":
                    exec_cfg.graph.cuda_graph_config = v
                else:
                    setattr(spec, k, v)

    def with_phase(cfg, phase, **ch):
        d = dict(vars(cfg.decode))
        d.update(ch)
        return types.SimpleNamespace(decode=types.SimpleNamespace(**d))

    capture_log = []
    Cap = types.SimpleNamespace

    def fake_capture_decode_graph(*, model_runner):
        if not graphs_on:
            return Cap(runner=None, memory_phase="target_verify", memory_usage_gb=0, capture_time=0)
        width = spec.speculative_num_draft_tokens  # decode_num_tokens_per_req() under the override
        bs = exec_cfg.graph.cuda_graph_config.decode.bs
        logging.getLogger("fake.cuda_graph_setup").info(
            f"Capture target verify CUDA graph begin. backend=full, num_tokens_per_req={width}, avail mem=70.00 GB")
        r = FakeRunner(width, bs, model_runner.attn_backend)
        logging.getLogger("fake.cuda_graph_setup").info(
            f"Capture target verify CUDA graph end. bs={r.capture_bs}, elapsed=0.10 s, mem usage=0.50 GB, "
            f"avail mem=69.50 GB.")
        capture_log.append((width, list(bs)))
        return Cap(runner=r, memory_phase="target_verify", memory_usage_gb=0.5, capture_time=0.1)

    backends = []

    def new_backend(mr):
        b = types.SimpleNamespace(width=spec.speculative_num_draft_tokens, verify_mask=None, max_context_len=10**6)
        backends.append(b)
        return b

    cap = pl.capture_banded_verify_graphs(
        fake_capture_decode_graph, model_runner, sched, ctx=Ctx(), exec_cfg=exec_cfg, spec=spec,
        graphs_on=graphs_on, all_bs=list(graph_bs) if graphs_on else None, new_backend=new_backend,
        with_phase=with_phase)
    # overrides restored
    assert spec.speculative_num_draft_tokens == n_max and exec_cfg.graph.cuda_graph_config.decode.bs == list(graph_bs)
    return cap, capture_log, backends


def test_banded_capture_widths_and_log_lines(caplog):
    sched = BudgetSchedule(parse_schedule("1:32,8:16,32:8,64:0"), source="/etc/ddtree-schedule.json")
    graph_bs = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]  # SGLang's list for spec decode up to 64
    home = types.SimpleNamespace(width=33, verify_mask=None, max_context_len=10**6)
    mr = types.SimpleNamespace(attn_backend=home)
    with caplog.at_level(logging.INFO):
        cap, log, backends = _capture_with_fakes(sched, graph_bs, 33, mr)
    assert log == [(33, [1, 2, 4]), (17, [8, 12, 16, 24]), (9, [32, 40, 48, 56]), (1, [64])]
    captured = [b for _, bss in log for b in bss]
    assert sorted(captured) == graph_bs and len(set(captured)) == len(captured)  # each bs once
    states = mr._ddtree_band_states
    assert [(s.width, s.bs) for s in states] == [(w, b) for w, b in log]
    assert states[0].attn_backend is home and mr.attn_backend is home  # the widest band keeps the startup backend
    assert [s.attn_backend.width for s in states] == [33, 17, 9, 1] and len(backends) == 3
    assert cap.runner is states[0].graph_runner and abs(cap.memory_usage_gb - 2.0) < 1e-9
    msgs = [r.getMessage() for r in caplog.records]
    want = ["DDTree budget schedule: 1:32,8:16,32:8,64:0 (verify widths 33,17,9,1)"]
    for w, bss in log:
        want += [f"Capture target verify CUDA graph begin. backend=full, num_tokens_per_req={w}, avail mem=70.00 GB",
                 f"Capture target verify CUDA graph end. bs={bss}, elapsed=0.10 s, mem usage=0.50 GB, "
                 f"avail mem=69.50 GB."]
    assert msgs == want


def test_banded_capture_graphs_disabled_and_empty_band(caplog):
    sched = BudgetSchedule(parse_schedule("1:16,8:32"), source="f")
    mr = types.SimpleNamespace(attn_backend=types.SimpleNamespace(width=33))
    with caplog.at_level(logging.INFO):
        cap, log, backends = _capture_with_fakes(sched, [1, 2, 4, 8, 16], 33, mr, graphs_on=False)
    assert log == [] and cap.runner is None
    assert [r.getMessage() for r in caplog.records] == ["DDTree budget schedule: 1:16,8:32 (verify widths 17,33)"]
    # the widest band (second here) keeps the startup backend; the other gets one at its width
    assert [s.attn_backend.width for s in mr._ddtree_band_states] == [17, 33]
    assert mr._ddtree_band_states[1].attn_backend is mr.attn_backend
    bad = BudgetSchedule(parse_schedule("1:16,3:32,4:8"), source="f")  # 3 pads to 4: band 3:32 is empty
    with pytest.raises(ValueError, match="contain no captured"):
        _capture_with_fakes(bad, [1, 2, 4, 8], 33, types.SimpleNamespace(attn_backend=None))


# ----------------------------------------------------------------- decode across bands
SIZES = [1, 2, 3, 4, 5, 6, 8, 7, 8, 6, 5, 4, 3, 2, 1, 7, 1, 5, 2, 8, 3, 6, 1, 2]


@pytest.mark.parametrize("graph", [False, True], ids=["eager-head", "graph-head"])
def test_decode_across_bands_equals_autoregressive(stubbed, monkeypatch, tmp_path, graph):
    """8 requests; each step runs a batch of SIZES[t] of them (rotating), so the
    batch grows and shrinks across the bands 1:11, 3:5, 5:0, 7:3 (graph bs
    [1, 2, 3, 4, 6, 8]: bs 5 pads to 6 -> the budget-0 band, bs 7 to 8 -> 7:3)
    and every request changes band mid-generation."""
    from sglang_ddtree import plugin as pl

    L, Bmax, nreq = 4, 11, 8
    graph_bs = [1, 2, 3, 4, 6, 8]
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps({"schedule": "1:11,3:5,5:0,7:3", "bands": [
        {"min_bs": 1, "budget": 11}, {"min_bs": 3, "budget": 5}, {"min_bs": 5, "budget": 0},
        {"min_bs": 7, "budget": 3}]}))
    monkeypatch.setenv(ENV_SCHEDULE_FILE, str(path))
    dfw, state, _, _ = stubbed
    tree_bs = [1, 2, 3, 4, 8]  # the drafter's graphs: bands with a tree only
    S = _setup(stubbed, L, Bmax, nreq, 0.8, seed=5, graph=False, n_new=len(SIZES) * (L + 1),
               capture_bs=tree_bs)
    worker, model, prompts, refs, rt, pool_idx, calls, tw = (
        S[k] for k in ("worker", "model", "prompts", "refs", "rt", "pool_idx", "calls", "tw"))
    draft_calls = S["draft_calls"]
    sched = worker.ddtree_schedule
    assert sched.spec == "1:11,3:5,5:0,7:3" and worker.ddtree_budget == 11
    # the target's startup capture through the plugin's banded path (stand-in capture)
    mr = tw.model_runner
    _, cap_log, _ = _capture_with_fakes(sched, graph_bs, Bmax + 1, mr)
    assert cap_log == [(12, [1, 2]), (6, [3, 4]), (1, [6]), (4, [8])]
    if graph:
        state["exec"].graph.cuda_graph_config.decode.bs = list(graph_bs)
        captured = []

        def fake_super_init(self):  # DFlash's init_cuda_graphs: build the sampler, capture the draft graph
            captured.append(list(state["exec"].graph.cuda_graph_config.decode.bs))
            self._draft_sampler = self._maybe_build_draft_sampler()
            S["heads"].append(self._draft_sampler)

        monkeypatch.setattr(dfw.DFlashWorkerV2, "init_cuda_graphs", fake_super_init, raising=False)
        S["graph_mode"][0] = True
        worker.init_cuda_graphs()
        assert captured == [tree_bs] and state["exec"].graph.cuda_graph_config.decode.bs == graph_bs
        assert isinstance(worker._draft_sampler, __import__("sglang_ddtree.worker", fromlist=["x"]).BandedDraftHead)
        # one head per tree band, sized for its band's captured bs
        assert {b: h._cap for b, h in worker._ddtree_heads.items()} == {11: 2, 5: 4, 3: 8}

    # the target forward: the band's width, the band's graph runner / backend switched in
    seen = []
    orig_fwd = tw.forward_batch_generation

    def fwd(batch=None, forward_batch=None, is_verify=False, pp_proxy_tensors=None):
        bs_ = len(forward_batch.seq_lens)
        width = forward_batch.spec_info.draft_token_num
        runner = mr.decode_cuda_graph_runner
        padded = next((c for c in graph_bs if c >= bs_), bs_)
        assert runner.captured_req_width == width and padded in runner.capture_bs
        assert mr.attn_backend is runner.attn_backend
        seen.append((bs_, width))
        return orig_fwd(batch, forward_batch, is_verify, pp_proxy_tensors)

    tw.forward_batch_generation = fwd

    # prefill: prompt KV, bonus token, the drafter context rows of the prompt
    seqs, bonus = [], []
    ctx = [dict() for _ in range(nreq)]  # request -> {position: target hidden row} written to the drafter KV
    for b, p in enumerate(prompts):
        T = len(p)
        slots = rt[int(pool_idx[b]), :T]
        lg, hd = model.forward(torch.tensor(p), torch.arange(T), slots[:0], slots,
                               torch.tril(torch.ones(T, T, dtype=torch.bool)))
        seqs.append(list(p))
        bonus.append(int(lg[-1].argmax()))
        for t in range(T):
            ctx[b][t] = hd[t]
    seq_lens = torch.tensor([len(p) for p in prompts])
    bonus = torch.tensor(bonus)
    DraftInput = S["DraftInput"]

    class Mode:
        def is_extend(self):
            return False

        def is_idle(self):
            return False

    budgets_seen = {}
    for t, k in enumerate(SIZES):
        active = [(t * 3 + j) % nreq for j in range(k)]
        idx = torch.tensor(active)
        spec = DraftInput(bonus_tokens=bonus[idx].clone(), new_seq_lens=seq_lens[idx].clone())
        spec.nxt_kv_lens_cpu = seq_lens[idx] + 2 * (Bmax + 1)
        spec.nxt_kv_lens_sum = int(spec.nxt_kv_lens_cpu.sum())
        batch = Rec(forward_mode=Mode(), is_extend_in_batch=False, spec_info=spec, seq_lens=seq_lens[idx].clone(),
                    seq_lens_cpu=None, seq_lens_sum=None, req_pool_indices=pool_idx[idx].clone(), reqs=[None] * k,
                    has_grammar=False, return_logprob=False, sampling_info=None, can_run_decode_cuda_graph=graph,
                    out_cache_loc=None, input_ids=None)
        calls.clear()
        draft_calls.clear()
        n_heads_before = {b: h._cap for b, h in worker._ddtree_heads.items()}
        res = worker.forward_batch_generation(batch)
        B = sched.budget_for(k)
        N = B + 1
        budgets_seen.setdefault(B, 0)
        budgets_seen[B] += 1
        assert worker.ddtree_band_log[-1] == (k, sched.band_index(k), B)
        assert seen[-1] == (k, N) and res.speculative_num_draft_tokens == N
        assert res.next_token_ids.numel() == k * N
        if B == 0:
            assert draft_calls == [], "a budget-0 band ran the drafter"
            assert {b: h._cap for b, h in worker._ddtree_heads.items()} == n_heads_before
            assert (res.accept_lens == 1).all()  # 0 correct drafts: accept len 1.00
        else:
            assert sorted(r for r, _ in draft_calls) == sorted(active)
            for r, p0 in draft_calls:  # the drafter's KV context is complete below the block
                assert set(range(p0)) <= set(ctx[r]), f"step {t}: request {r} drafter context has gaps"
        # the drafter-context write: accept_len rows of target hidden at seq_len + k
        assert len(calls) == 1
        c = calls[0]
        lens = res.accept_lens
        assert torch.equal(c["commit_lens"], lens.to(torch.int32))
        pos = c["positions"].view(k, N)
        hid = c["target_hidden"].view(k, N, -1)
        out = res.next_token_ids.view(k, N)
        for j, r in enumerate(active):
            n = int(lens[j])
            P = int(seq_lens[r])
            assert pos[j].tolist() == list(range(P, P + N))
            committed = out[j, :n].tolist()
            _, ar_hid = model.full(seqs[r] + [int(bonus[r])] + committed[:-1])
            assert torch.allclose(hid[j, :n], ar_hid[P:P + n], atol=1e-9), "drafter context != AR hidden"
            for q in range(n):
                ctx[r][P + q] = hid[j, q]
            seqs[r] += [int(bonus[r])] + committed[:-1]
            bonus[r] = committed[-1]
            seq_lens[r] = P + n
            assert n <= min(L, B) + 1
    assert set(budgets_seen) == {11, 5, 0, 3}, budgets_seen
    for r in range(nreq):
        assert seqs[r] == refs[r][:len(seqs[r])], f"request {r}: output differs from autoregressive greedy"
        assert len(seqs[r]) > len(prompts[r]) + 10
    # every request saw several bands
    print("budget steps:", budgets_seen, "lengths:", [len(s) - len(p) for s, p in zip(seqs, prompts)])


# ----------------------------------------------------------------- real SGLang: server args, hooks
def test_server_args_with_schedule_real_sglang(sglang_python, tmp_path):
    """With the real SGLang 0.5.23 parser / plugin loading (runtime/src first on the
    path): a good schedule validates; a width mismatch or a malformed file is a
    ValueError at server-args validation; width 1 (budget-0 band) is a valid
    target-verify width; the capture hook is registered."""
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"block_size": 8}))
    good = _write(tmp_path, GOOD, "good.json")
    bad = _write(tmp_path, {"bands": [{"min_bs": 2, "budget": 32}]}, "bad.json")
    code = textwrap.dedent(f"""
        import argparse, json, os
        from sglang.srt.plugins import load_plugins
        load_plugins()
        import sglang_ddtree
        assert sglang_ddtree.__file__.startswith({SRC!r}), sglang_ddtree.__file__
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang_ddtree.plugin import CAPTURE_DECODE_TARGET
        p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
        def args(ndt):
            a = p.parse_args(["--model-path", {str(drafter)!r}, "--speculative-algorithm", "DDTREE",
                              "--speculative-num-draft-tokens", str(ndt),
                              "--speculative-draft-model-path", {str(drafter)!r}, "--device", "cpu"])
            return ServerArgs.from_cli_args(a)
        algo = SpeculativeAlgorithm.from_string("DDTREE")
        res = {{}}
        for name, path, ndt in [("good", {good!r}, 33), ("mismatch", {good!r}, 17), ("bad", {bad!r}, 33),
                                ("missing", "/nonexistent.json", 33)]:
            os.environ["SGLANG_DDTREE_SCHEDULE_FILE"] = path
            try:
                algo.validate_server_args(args(ndt)); res[name] = "ok"
            except ValueError as e:
                res[name] = "ValueError: " + str(e)[:200]
        os.environ["SGLANG_DDTREE_SCHEDULE_FILE"] = {good!r}
        sa = args(33)
        algo.handle_server_args(sa)
        # what SGLang's resolve_num_tokens_per_req(phase="target_verify") returns (spec_utils.py:104-109;
        # that module needs transformers, absent here): the spec class's answer for the band's width
        res["widths"] = [algo.get_num_tokens_per_req_for_target_verify(w, False) for w in (33, 17, 9, 1)]
        res["hooked"] = len(HookRegistry._hooks.get(CAPTURE_DECODE_TARGET, []))
        print(json.dumps(res))
    """)
    env = dict(os.environ, SGLANG_PLUGINS="ddtree", PYTHONPATH=SRC)
    p = subprocess.run([sglang_python, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["good"] == "ok", r
    assert r["mismatch"].startswith("ValueError") and "widest band's width is 33" in r["mismatch"], r
    assert r["bad"].startswith("ValueError") and "batch size 1" in r["bad"], r
    assert r["missing"].startswith("ValueError") and "cannot be read" in r["missing"], r
    assert r["widths"] == [33, 17, 9, 1]
    assert r["hooked"] == 1
