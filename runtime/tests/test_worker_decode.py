"""``DDTreeWorkerV2._ddtree_decode`` itself, run on the CPU step after step.

The worker's decode method is executed unchanged; what it imports from SGLang
is replaced (in ``sys.modules``, for this test only) by small stand-ins, and the
DFlash base class by a stand-in that owns a toy target (the paged random-weight
transformer of test_worker_step.py, float64) and a toy drafter whose "hidden
states" are its logits (the LM head is the identity).  The stand-ins follow
SGLang 0.5.23's contracts:
  * ``eagle_prepare_for_verify``: out_cache_loc = ``prepared_out_cache_loc``,
    TARGET_VERIFY forward batch of ``draft_token`` / ``positions`` /
    ``custom_mask``; the target forward reads the request's committed prefix
    from its KV slots, attends with the FULL_MASK rows, writes K/V of the N
    tree tokens into the window;
  * ``eagle_sample`` (greedy): SGLang's ``verify_tree_greedy`` walk on the
    spec_info's retrieve links, written from its Triton kernel as a plain loop
    (the kernel itself is run on our tensors in test_worker_sglang.py);
  * ``_finalize_accept_tree_path``: ``move_accept_tokens_to_target_kvcache``
    (front slots <- accepted slots on the toy KV pool) + front compaction of
    predict and hidden states (checked against SGLang's code in
    test_worker_sglang.py).
Checked: greedy output == autoregressive greedy output over many steps (so the
KV compaction and seq_len bookkeeping are right: each step only sees the
compacted cache), accept lengths, the result's stride (= budget + 1), and the
drafter-context write (rows = autoregressive hidden states at committed
positions ``seq_len + k``, ``commit_lens`` = accept lengths, cache_loc = the
window's front slots).

NOT covered: the real SGLang modules behind the stand-ins (attention backends,
CUDA kernels, ``move_kv_cache``, CUDA graphs, the DFlash drafter network,
sampling with temperature > 0 through ``tree_speculative_sampling_target_only``).
"""

import contextlib
import json
import os
import random
import re
import sys
import types

import pytest
import torch

from conftest import job_result, subprocess_job
from test_worker_step import PagedLM, V, D  # noqa: F401  (same toy model)


# tokens generated per request: enough steps to cross several accept/commit rounds
# (the interpreter run below: 9, still 2-3 steps per request)
N_NEW = int(os.environ.get("DDTREE_TEST_N_NEW") or 16)


class Rec:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _ref_verify_tree_greedy(cand, ridx, nxt, sib, target, width):
    """verify_tree_greedy_kernel_triton (spec_tree.py) as a loop."""
    bs, N = cand.shape
    predict = torch.zeros(bs * N, dtype=torch.int32)
    acc = torch.full((bs, width), -1, dtype=torch.int32)
    num = torch.zeros(bs, dtype=torch.int32)
    for b in range(bs):
        last = int(ridx[b, 0])
        acc[b, 0] = last
        cur = 0
        n = 0
        for j in range(1, width):
            cur = int(nxt[b, cur])
            t = int(target.view(-1)[last])
            found = False
            while cur != -1:
                if int(cand[b, cur]) == t:
                    predict[last] = t
                    n += 1
                    acc[b, n] = int(ridx[b, cur])
                    last = int(ridx[b, cur])
                    found = True
                    break
                cur = int(sib[b, cur])
            if not found:
                break
        num[b] = n
        predict[last] = int(target.view(-1)[last])
    return predict, acc, num


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    from test_worker_step import _draft_logits  # noqa: F401

    mods = {}

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        mods[name] = m
        return m

    class TreeMaskMode:
        FULL_MASK, QLEN_ONLY = 0, 1

    def assign_extend_cache_locs_func(req_pool_indices, req_to_token, start_offset, end_offset, batch_size,
                                      draft_token_num, device):
        return torch.cat([req_to_token[int(r), int(s):int(e)] for r, s, e in
                          zip(req_pool_indices, start_offset, end_offset)])

    def eagle_prepare_for_verify(verify_input, req_to_token_pool, batch, target_worker):
        batch.input_ids = verify_input.draft_token
        batch.out_cache_loc = verify_input.prepared_out_cache_loc
        batch.forward_mode = "TARGET_VERIFY"
        fb = Rec(input_ids=verify_input.draft_token, positions=verify_input.positions,
                 out_cache_loc=batch.out_cache_loc, seq_lens=batch.seq_lens, req_pool_indices=batch.req_pool_indices,
                 spec_info=verify_input, kv_loc_plan=verify_input.kv_loc_plan)
        return fb, False

    def eagle_sample(verify_input, batch, logits_output, grammar_mask=None):
        assert grammar_mask is None
        bs = len(batch.seq_lens)
        N = verify_input.draft_token_num
        target = logits_output.next_token_logits.argmax(-1).view(bs, N)
        predict, acc, num = _ref_verify_tree_greedy(
            verify_input.draft_token.view(bs, N), verify_input.retrieve_index, verify_input.retrieve_next_token,
            verify_input.retrieve_next_sibling, target, verify_input.spec_steps + 1)
        return predict, num + 1, acc

    def _finalize_accept_tree_path(batch, accept_index, accept_lens, predict, logits_output, bs, *,
                                   token_to_kv_pool_allocator, num_draft_tokens):
        from sglang_ddtree.verify import compact_accept_to_front, kv_move_plan

        tgt, src = kv_move_plan(accept_index, accept_lens, batch.out_cache_loc)
        token_to_kv_pool_allocator.move_kv_cache(tgt, src)
        logits_output.hidden_states = compact_accept_to_front(logits_output.hidden_states, accept_index, bs,
                                                              num_draft_tokens)
        return compact_accept_to_front(predict, accept_index, bs, num_draft_tokens)

    class DFlashDraftInputV2(Rec):
        pass

    mod("sglang.kernels.ops.speculative.cache_locs", assign_extend_cache_locs_func=assign_extend_cache_locs_func)
    mod("sglang.srt.layers.logprob_processor", compute_spec_logprobs=None)
    mod("sglang.srt.managers.utils", GenerationBatchResult=Rec)
    mod("sglang.srt.speculative.dflash_info_v2", DFlashDraftInputV2=DFlashDraftInputV2)
    mod("sglang.srt.speculative.eagle_utils", TreeMaskMode=TreeMaskMode,
        eagle_prepare_for_verify=eagle_prepare_for_verify, eagle_sample=eagle_sample)
    mod("sglang.srt.speculative.eagle_info", EagleVerifyInput=Rec)
    mod("sglang.srt.speculative.eagle_worker_common", _finalize_accept_tree_path=_finalize_accept_tree_path)
    mod("sglang.srt.speculative.spec_utils", GrammarTree=None, build_grammar_vocab_mask=None,
        draft_tp_context=lambda layout: contextlib.nullcontext())
    mod("sglang.srt.lora.layers", unwrap_lora_layer=lambda x: x)
    mod("sglang.srt.model_executor.forward_batch_info",
        CaptureHiddenMode=types.SimpleNamespace(FULL="FULL", NULL="NULL"), ForwardBatch=Rec,
        ForwardMode=types.SimpleNamespace(TARGET_VERIFY="TARGET_VERIFY"), enable_num_token_non_padded=lambda: False)
    mod("sglang.srt.speculative.spec_info", SpeculativeAlgorithm=types.SimpleNamespace(DFLASH="DFLASH"))
    state = {"exec": types.SimpleNamespace(graph=types.SimpleNamespace(cuda_graph_config=types.SimpleNamespace(
        decode=types.SimpleNamespace(bs=[1, 2, 4, 8], backend="full"))))}

    class Ctx:  # RuntimeContext.override on the resolved config leaves the worker touches
        def override(self, source, **fields):
            state.setdefault("overrides", []).append((source, dict(fields)))
            for k, v in fields.items():
                if k == "cuda_graph_config":
                    state["exec"].graph.cuda_graph_config = v
                else:
                    setattr(state["spec"], k, v)

    def with_phase(cfg, phase, **changes):
        ph = dict(vars(getattr(cfg, phase)))
        ph.update(changes)
        return types.SimpleNamespace(**{phase: types.SimpleNamespace(**ph)})

    mod("sglang.srt.runtime_context",
        get_parallel=lambda: types.SimpleNamespace(attn_dp_enabled=False, tp_group=types.SimpleNamespace(world_size=1)),
        get_exec=lambda: state["exec"], get_context=lambda: Ctx(), get_spec=lambda: state["spec"])
    mod("sglang.srt.model_executor.cuda_graph_config", with_phase=with_phase,
        Backend=types.SimpleNamespace(DISABLED="disabled", FULL="full"))
    mod("sglang.srt.speculative.dflash_utils", is_dense_head_weight=lambda w: True,
        resolve_dflash_verify_mask_policy=lambda backend: ("TritonAttnBackend", True))
    dfw = mod("sglang.srt.speculative.dflash_worker_v2",
              get_spec=lambda: state["spec"],
              _resolve_dflash_embedding_module=lambda draft_model, target_model: target_model.get_input_embeddings())
    mod("sglang.srt.speculative", dflash_worker_v2=dfw)
    for name in ("sglang", "sglang.srt", "sglang.kernels", "sglang.kernels.ops", "sglang.srt.layers",
                 "sglang.srt.managers", "sglang.srt.lora", "sglang.srt.model_executor"):
        mods.setdefault(name, types.ModuleType(name))
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)
    import sglang_ddtree.worker as w

    monkeypatch.setattr(w, "_WORKER_CLS", None)
    return dfw, state, DFlashDraftInputV2, tmp_path


class Plan:
    def __init__(self, write_virtual, **kw):
        self.write_virtual = write_virtual
        self.kw = kw

    def bind(self, fb, translator):
        fb.bound_plan = self

    def write_ids(self, translator):
        return self.write_virtual


def _setup(stubbed, L, B, bs, hit, seed, graph=False, n_new=None, capture_bs=(1, 2, 4, 8)):
    dfw, state, DraftInput, tmp = stubbed
    N, blk = B + 1, L + 1
    drafter = tmp / f"drafter{L}"
    drafter.mkdir(exist_ok=True)
    (drafter / "config.json").write_text(json.dumps({"block_size": blk}))
    state["spec"] = types.SimpleNamespace(speculative_num_draft_tokens=N, speculative_draft_model_path=str(drafter),
                                          speculative_use_rejection_sampling=False)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    n_new = N_NEW if n_new is None else n_new
    row = 40 + 2 * N + n_new
    pool_slots = bs * row + 200
    model = PagedLM(seed, pool_slots)
    req_to_token = (torch.randperm(bs * row, generator=g) + 1).view(bs, row)
    pool_idx = torch.randperm(bs, generator=g)  # request b lives in req_to_token row pool_idx[b]
    rt = torch.empty_like(req_to_token)
    rt[pool_idx] = req_to_token
    prompts = [[rng.randrange(V) for _ in range(rng.randint(1, 9))] for _ in range(bs)]
    refs = []
    for p in prompts:
        s = list(p)
        for _ in range(n_new + 2 * L + 4):
            s.append(int(model.full(s)[0][-1].argmax()))
        refs.append(s)
    eye = torch.eye(V, dtype=torch.float64)
    calls = []

    class Translator:
        def plan(self, *, req_pool_indices, seq_lens, seq_lens_cpu, write_virtual, read_extent):
            return Plan(write_virtual, read_extent=read_extent)

    class Allocator:
        def move_kv_cache(self, tgt, src):
            model.kv[:, :, tgt] = model.kv[:, :, src].clone()

    class TargetWorker:
        model_runner = None

        def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, pp_proxy_tensors=None):
            fb = forward_batch
            bs_ = len(fb.seq_lens)
            vi = fb.spec_info
            Nn = vi.draft_token_num
            logits, hid = [], []
            off = 0
            for b in range(bs_):
                P = int(fb.seq_lens[b])
                rows = vi.custom_mask[off:off + Nn * (P + Nn)].view(Nn, P + Nn).bool()
                off += Nn * (P + Nn)
                lg, hd = model.forward(fb.input_ids.view(bs_, Nn)[b], fb.positions.view(bs_, Nn)[b],
                                       rt[int(fb.req_pool_indices[b]), :P], fb.out_cache_loc.view(bs_, Nn)[b], rows)
                logits.append(lg)
                hid.append(hd)
            return Rec(logits_output=Rec(next_token_logits=torch.cat(logits), hidden_states=torch.cat(hid)),
                       can_run_cuda_graph=False, routed_experts_output=None, indexer_topk_output=None)

    heads = []
    draft_calls = []  # (request, position of the block root) per drafter forward
    graph_mode = [graph]  # the stand-in draft runner replays a draft graph (mutable: tests switch it on later)

    class DraftRunner:
        kv_index_translator = Translator()

        def forward(self, fb):
            bs_ = fb.batch_size
            ids = fb.input_ids.view(bs_, blk)
            pos = fb.positions.view(bs_, blk)
            assert (ids[:, 1:] == 99999).all() and fb.out_cache_loc.numel() == bs_ * blk
            hidden = torch.zeros(bs_, blk, V, dtype=torch.float64)
            for b in range(bs_):
                r = int((pool_idx == fb.req_pool_indices[b]).nonzero())
                p0 = int(pos[b, 0])
                draft_calls.append((r, p0))
                assert refs[r][p0] == int(ids[b, 0]), "block root must be the bonus token at position seq_len"
                hidden[b, 1:] = _dl(refs[r][p0 + 1:p0 + 1 + L], L, hit, rng, g).double()
            if not graph_mode[0]:
                return Rec(logits_output=Rec(hidden_states=hidden.view(bs_ * blk, V)))
            # a draft CUDA-graph replay: the batch padded to a captured size, the
            # capture tail hook (the head DFlash registered) run on the padded
            # hidden states and input ids; outputs stay in the head's buffers
            P = next(c for c in capture_bs if c >= bs_)
            hp = torch.randn(P, blk, V, generator=g, dtype=torch.float64) * 5  # padding rows: garbage
            hp[:bs_] = hidden
            ip = torch.randint(0, V, (P, blk), generator=g)
            ip[:bs_] = ids
            heads[0](hp.view(P * blk, V), ip.view(-1))
            return Rec(logits_output=Rec(hidden_states=hidden.view(bs_ * blk, V)), can_run_graph=True)

    target_model = Rec(lm_head=Rec(weight=eye), get_input_embeddings=lambda: (lambda ids: torch.zeros(*ids.shape, 4)))
    tw = TargetWorker()
    tw.model_runner = Rec(model=target_model)

    class FakeDFlash:
        def __init__(self, server_args, gpu_id, nccl_port, target_worker):
            self.block_size = int(dfw.get_spec().speculative_num_draft_tokens)
            self.device = "cpu"
            self.selector = self.lilicorr = None
            self._is_domino = self.use_compact_draft_cache = False
            self.target_worker = target_worker
            # as DFlash: self.model_runner is the target's model runner
            self.model_runner = target_worker.model_runner
            self.model_runner.__dict__.update(
                req_to_token_pool=Rec(req_to_token=rt), attn_backend=Rec(verify_mask=None, max_context_len=row),
                kv_index_translator=Translator(), token_to_kv_pool_allocator=Allocator())
            self.draft_model_runner = DraftRunner()
            self.draft_model = Rec()
            self.draft_parallel_layout = None
            self._mask_token_id = 99999
            self._full_embed_gpu = None
            self._noise_embed_scale = 1.0
            self._block_pos_offsets = torch.arange(self.block_size)
            self._draft_block_spec_info = "DRAFT_BLOCK_SPEC"

        def _ensure_draft_block_buffers(self, bs_):
            self._draft_seq_lens_cpu_buf = torch.zeros(bs_, dtype=torch.int64)

        def _draft_write_ids(self, plan):
            return plan.write_ids(None)

        def _append_target_hidden_to_draft_kv_by_loc(self, **kw):
            calls.append(kw)

        def _make_next_draft_input_decode(self, *, bonus_tokens, new_seq_lens):
            return DraftInput(bonus_tokens=bonus_tokens, new_seq_lens=new_seq_lens)

    dfw.DFlashWorkerV2 = FakeDFlash
    from sglang_ddtree import plugin as pl

    worker = pl._worker_factory(None)(None, 0, 0, tw)
    if graph:  # what DFlash's init_cuda_graphs does before capturing the draft graph
        worker._draft_sampler = worker._maybe_build_draft_sampler()
        heads.append(worker._draft_sampler)
        assert worker._draft_sampler is worker._ddtree_get_head()
    return locals()


def _dl(truth, L, hit, rng, g):
    from test_worker_step import _draft_logits

    return _draft_logits(truth, L, hit, rng, g)


@pytest.mark.parametrize("graph", [False, True], ids=["eager-head", "graph-head"])
@pytest.mark.parametrize("L,B,bs,hit", [(4, 11, 3, 0.8), (7, 31, 4, 0.9), (3, 3, 2, 0.5), (7, 7, 3, 1.0),
                                        (7, 4, 3, 0.8), (7, 3, 2, 1.0)])  # budget < block - 1: window max(N, block)
def test_ddtree_decode_step_equals_autoregressive(stubbed, L, B, bs, hit, graph, monkeypatch, caplog):
    # the step-parts line (stepparts.py): every 2 decode steps, every step sampled (host clock on the CPU)
    monkeypatch.setenv("SGLANG_DDTREE_STEP_PARTS_EVERY", "2")
    monkeypatch.setenv("SGLANG_DDTREE_STEP_PARTS_SAMPLE", "1")
    caplog.set_level("INFO", logger="sglang_ddtree.worker")
    S = _setup(stubbed, L, B, bs, hit, seed=L * 10 + B, graph=graph)
    worker, model, prompts, refs, rt, pool_idx, calls = (S[k] for k in
                                                         ("worker", "model", "prompts", "refs", "rt", "pool_idx", "calls"))
    N = B + 1
    assert worker.ddtree_num_verify_tokens == N and worker.block_size == L + 1
    DraftInput = S["DraftInput"]
    # prefill (what DFlash's extend path leaves behind): prompt KV, bonus token
    seqs, bonus = [], []
    for b, p in enumerate(prompts):
        T = len(p)
        slots = rt[int(pool_idx[b]), :T]
        lg, _ = model.forward(torch.tensor(p), torch.arange(T), slots[:0], slots,
                              torch.tril(torch.ones(T, T, dtype=torch.bool)))
        seqs.append(list(p))
        bonus.append(int(lg[-1].argmax()))
    seq_lens = torch.tensor([len(p) for p in prompts])
    spec = DraftInput(bonus_tokens=torch.tensor(bonus), new_seq_lens=seq_lens)
    accept = []

    class Mode:
        def is_extend(self):
            return False

        def is_idle(self):
            return False

    n_new = N_NEW
    while any(len(seqs[b]) < len(prompts[b]) + n_new for b in range(bs)):
        spec.nxt_kv_lens_cpu = seq_lens + 2 * N  # prepare_for_decode's reservation (host)
        spec.nxt_kv_lens_sum = int(spec.nxt_kv_lens_cpu.sum())
        batch = Rec(forward_mode=Mode(), is_extend_in_batch=False, spec_info=spec, seq_lens=seq_lens.clone(),
                    seq_lens_cpu=None, seq_lens_sum=None, req_pool_indices=pool_idx.clone(), reqs=[None] * bs,
                    has_grammar=False, return_logprob=False, sampling_info=None, can_run_decode_cuda_graph=False,
                    out_cache_loc=None, input_ids=None)
        calls.clear()
        res = worker.forward_batch_generation(batch)
        assert res.speculative_num_draft_tokens == N and res.next_token_ids.numel() == bs * N
        lens = res.accept_lens
        out = res.next_token_ids.view(bs, N)
        assert len(calls) == 1
        c = calls[0]
        assert torch.equal(c["commit_lens"], lens.to(torch.int32))
        window = torch.stack([rt[int(pool_idx[b]), int(seq_lens[b]):int(seq_lens[b]) + N] for b in range(bs)])
        assert torch.equal(c["cache_loc_2d"], window) and torch.equal(c["cache_loc"], window.flatten())
        pos = c["positions"].view(bs, N)
        hid = c["target_hidden"].view(bs, N, -1)
        for b in range(bs):
            n = int(lens[b])
            committed = out[b, :n].tolist()
            P = int(seq_lens[b])
            assert pos[b].tolist() == list(range(P, P + N))
            _, ar_hid = model.full(seqs[b] + [int(spec.bonus_tokens[b])] + committed[:-1])
            assert torch.allclose(hid[b, :n], ar_hid[P:P + n], atol=1e-9), "drafter context != AR hidden"
            seqs[b] += [int(spec.bonus_tokens[b])] + committed[:-1]
            assert int(res.next_draft_input.bonus_tokens[b]) == committed[-1]
            accept.append(n)
        assert torch.equal(res.new_seq_lens, seq_lens + lens)
        seq_lens = res.new_seq_lens
        spec = res.next_draft_input
    for b in range(bs):
        k = len(prompts[b]) + n_new
        assert seqs[b][:k] == refs[b][:k], "DDTree decode differs from autoregressive greedy"
    head = worker._ddtree_head
    want_triton = os.environ.get("DDTREE_TEST_EXPECT_TRITON", "0") == "1"
    assert head.use_triton == want_triton, "the head ran the fused Triton path" if want_triton else "torch path"
    assert head.budget == B and head.L == L and head.tp == 1
    if graph:
        assert getattr(worker, "_ddtree_head_in_graph", False) and head._cap == 8
    print(f"L={L} B={B} hit={hit}: mean accept_len {sum(accept) / len(accept):.2f} over {len(accept) // bs} steps")
    assert max(accept) <= min(L, B) + 1
    steps = len(accept) // bs
    lines = [r.getMessage() for r in caplog.records if "DDTree step parts:" in r.getMessage()]
    assert len(lines) == steps // 2 >= 1, lines
    for ln in lines:
        assert re.fullmatch(rf"DDTree step parts: bs={bs} budget={B} sampled=2 of=2 drafter_ms=\d+\.\d{{3}} "
                            r"tree_ms=\d+\.\d{3} prep_ms=\d+\.\d{3} target_ms=\d+\.\d{3} commit_ms=\d+\.\d{3} "
                            r"step_ms=\d+\.\d{3}", ln), ln
    assert worker._ddtree_parts.lines == lines
    if hit == 1.0:  # every top-1 right: nearly always the whole chain (a narrow tree may trade depth for width)
        assert sum(accept) / len(accept) > 0.9 * (min(L, B) + 1)


_INTERP_ENV = dict(os.environ, TRITON_INTERPRET="1", SGLANG_DDTREE_DISABLE_TRITON="0", DDTREE_TEST_EXPECT_TRITON="1",
                   DDTREE_TEST_N_NEW="9")
subprocess_job("decode:interp",
               [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__),
                "-k", "test_ddtree_decode_step_equals_autoregressive and "
                      "(4-11-3-0.8-graph-head or 7-7-3-1.0-eager-head)"],
               env=_INTERP_ENV, cwd=os.path.dirname(os.path.abspath(__file__)), timeout=900, cost=38)


@pytest.mark.subprocess_job("decode:interp")
def test_ddtree_decode_with_triton_head_in_interpreter():
    """The same decode steps with the head's fused Triton kernels (LM head, top-K +
    lse, tree kernel into the static buffers; draft-graph mode with padding, and
    eager), run by Triton's CPU interpreter (with the shortcuts of interp_fast.py;
    9 new tokens per request: 2-3 steps each): output == autoregressive greedy."""
    pytest.importorskip("triton")
    p = job_result("decode:interp")
    assert p.returncode == 0 and re.search(r"\b2 passed", p.stdout), p.stdout[-4000:] + p.stderr[-2000:]


def test_step_parts_sampler_of_the_worker(stubbed, monkeypatch):
    """The worker's step-parts sampler (``_ddtree_step_parts``): from the env,
    the host clock on a CPU device, enabled on TP rank 0 only (no marks, no line
    on the others)."""
    from sglang_ddtree.stepparts import PerfClock

    monkeypatch.setenv("SGLANG_DDTREE_STEP_PARTS_EVERY", "7")
    monkeypatch.setenv("SGLANG_DDTREE_STEP_PARTS_SAMPLE", "3")
    worker = _setup(stubbed, 4, 11, 3, 0.8, seed=1, graph=False)["worker"]
    worker._ddtree_parts = None
    p = worker._ddtree_step_parts()
    assert p is worker._ddtree_step_parts() and (p.every, p.sample, p.enabled) == (7, 3, True)
    assert isinstance(p.clock, PerfClock)
    worker._ddtree_parts, worker._target_tp_rank = None, 1
    p = worker._ddtree_step_parts()
    assert not p.enabled
    for _ in range(20):
        s = p.begin()
        s.mark("win0")
        s.done(3, 11)
        p.end()
    assert p.lines == [] and p.pending == []
