"""The DDTree decode step of ``sglang_ddtree.worker`` on the CPU, without SGLang's
GPU stack: the tensor functions the worker uses, and one end-to-end simulation
of the step over a paged KV cache.

Covered here (pure torch, CPU):
  * drafter hidden -> top-K log-probs over a vocab-parallel LM head: per-shard
    top-K + logsumexp merged == full log-softmax top-K (TP 1/2/3, uneven shards);
    the TP all-gather path through a fake process group; trees from the drafter
    hidden == ``build_trees`` on the materialised logits (path sets);
  * the EagleVerifyInput fields for a batch (shapes, dtypes, positions,
    FULL_MASK mask = whole committed prefix + ancestors-and-self, checked
    against an independent parent walk; the preallocated bool / uint8 buffer
    variants); the field names against the real ``EagleVerifyInput`` dataclass
    (read from the installed sglang source with ``ast`` when it is present);
  * acceptance in SGLang's layout (global accept_index, predict, accept_lens),
    the KV move plan and the front compaction vs straightforward per-request
    references;
  * END TO END: prefill + repeated DDTree steps of a random-weight transformer
    with a paged KV pool (random slot ids): one tree-verify forward of B+1
    tokens per request writing KV into the step's window, greedy acceptance,
    KV moved with the plan, predict / hidden states compacted to the front,
    seq_lens advanced by accept_len.  The next step only sees the compacted
    cache, and the output equals autoregressive greedy decoding exactly; the
    compacted hidden states (what the drafter's KV is built from) equal the
    autoregressive hidden states at the committed positions.

NOT covered here (needs sgl_kernel + a GPU): SGLang's attention backends
consuming the mask, the real ``move_kv_cache``, ``eagle_prepare_for_verify``,
``eagle_sample``'s CUDA kernels, the DFlash draft forward and the draft-KV
write, CUDA-graph capture/replay.  SGLang's own Triton kernels for the greedy
tree walk and the KV move indices are checked against these references in
test_worker_sglang.py (Triton interpreter).
"""

import ast
import importlib.util
import math
import os
import random

import pytest
import torch

from sglang_ddtree import build_trees
from sglang_ddtree.verify import (
    accept_walk,
    compact_accept_to_front,
    fill_custom_mask,
    greedy_accept,
    kv_move_plan,
    to_eagle_accept,
)
from sglang_ddtree.worker import (
    check_shapes,
    committed_outputs,
    draft_top_log_probs,
    draft_trees,
    merge_shard_tops,
    shard_top_logits,
    tree_verify_fields,
)


# ----------------------------------------------------------------- draft head
def _shards(V, tp):
    return [r * V // tp for r in range(tp + 1)]  # vocab-parallel shards are equal-size


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_shard_merge_is_exact_log_softmax_topk(tp):
    g = torch.Generator().manual_seed(tp)
    n, H, V, K = 7, 16, 96, 12
    hs = torch.randn(n, H, generator=g)
    W = torch.randn(V, H, generator=g)
    ref_lp, ref_id = torch.log_softmax(hs @ W.T, -1).topk(K)
    b = _shards(V, tp)
    parts = [shard_top_logits(hs, W[b[r]:b[r + 1]], K, vocab_start=b[r], chunk_rows=3) for r in range(tp)]
    vals = torch.stack([p[0] for p in parts])
    ids = torch.stack([p[1] for p in parts])
    lse = torch.stack([p[2] for p in parts])
    lp, idx = merge_shard_tops(vals, ids, lse, K)
    assert torch.equal(idx, ref_id)
    assert (lp - ref_lp).abs().max() < 1e-5


class FakeGroup:
    """rank 0 of a 2-rank group: all_gather returns [mine, the other rank's]."""

    def __init__(self, other):
        self.world_size = 2
        self.other = list(other)

    def all_gather_into_tensor(self, out, inp):
        out.copy_(torch.cat([inp.flatten(), self.other.pop(0).flatten()]))


def test_draft_top_log_probs_tp2_and_trees():
    g = torch.Generator().manual_seed(3)
    bs, blk, H, V, B = 3, 5, 16, 64, 10
    hid = torch.randn(bs, blk, H, generator=g)
    W = torch.randn(V, H, generator=g) * 0.7
    root = torch.randint(0, V, (bs,), generator=g)
    logits = hid[:, 1:] @ W.T  # [bs, L, V]
    ref_lp, ref_id = torch.log_softmax(logits, -1).topk(B)
    lp1, id1 = draft_top_log_probs(hid, W, B)
    assert lp1.shape == (bs, blk - 1, B) and torch.equal(id1, ref_id)
    # TP 2: rank 0 owns [0, 32), rank 1 [32, 64)
    other = shard_top_logits(hid[:, 1:].reshape(-1, H), W[32:], B, vocab_start=32)
    lp2, id2 = draft_top_log_probs(hid, W[:32], B, vocab_start=0, tp_group=FakeGroup(other))
    assert torch.equal(id2, ref_id) and (lp2 - ref_lp).abs().max() < 1e-5
    tr = draft_trees(hid, W, B, root)
    ref = build_trees(logits, B, root)
    assert torch.equal(tr.tokens[:, 0], root)
    for b in range(bs):
        assert tr.paths(b) == ref.paths(b)


# ----------------------------------------------------------------- verify fields
def _ancestors(parents, i):
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


def test_tree_verify_fields_layout_and_mask():
    g = torch.Generator().manual_seed(0)
    bs, L, V, B = 4, 5, 30, 13
    N = B + 1
    tr = build_trees(torch.randn(bs, L, V, generator=g) * 2, B, torch.randint(0, V, (bs,), generator=g))
    seq = torch.tensor([5, 1, 9, 3])
    f = tree_verify_fields(tr, seq, L, seq_lens_sum=int(seq.sum()))
    assert f["draft_token"].shape == (bs * N,) and f["draft_token"].dtype == torch.int64
    assert f["positions"].shape == (bs * N,) and f["positions"].dtype == torch.int64
    for k in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        assert f[k].shape == (bs, N) and f[k].dtype == torch.int64
    assert f["draft_token_num"] == N and f["spec_steps"] == L and f["topk"] > 1
    assert f["custom_mask"].dtype == torch.bool
    assert f["custom_mask"].numel() == int(seq.sum()) * N + bs * N * N
    off = 0
    for b in range(bs):
        P = int(seq[b])
        m = f["custom_mask"][off:off + N * (P + N)].view(N, P + N)
        off += N * (P + N)
        par = tr.parents[b].tolist()
        val = tr.valid[b].tolist()
        for i in range(N):
            assert m[i, :P].all(), "every node sees the whole committed prefix"
            want = _ancestors(par, i) if val[i] else set()
            got = {j for j in range(N) if m[i, P + j]}
            assert got == want, (b, i)
            if val[i]:
                d = 0
                j = i
                while par[j] >= 0:
                    j, d = par[j], d + 1
                assert int(f["positions"][b * N + i]) == P + d
    # preallocated buffers: bool with host sum, uint8 whole-buffer (no host sum)
    buf = torch.zeros(5000, dtype=torch.bool)
    f2 = tree_verify_fields(tr, seq, L, seq_lens_sum=int(seq.sum()), mask_buf=buf)
    assert torch.equal(f2["custom_mask"], f["custom_mask"])
    buf8 = torch.zeros(5000, dtype=torch.uint8)
    f3 = tree_verify_fields(tr, seq, L, seq_lens_sum=None, mask_buf=buf8)
    assert f3["custom_mask"].data_ptr() == buf8.data_ptr()
    assert torch.equal(buf8[: f["custom_mask"].numel()].bool(), f["custom_mask"])
    assert bool(buf8[f["custom_mask"].numel():].bool().all())


def _sglang_src(rel):
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        pytest.skip("sglang is not installed in this interpreter (run with .venv-sglang)")
    path = os.path.join(os.path.dirname(spec.origin), rel)
    if not os.path.exists(path):
        pytest.skip(f"{path} absent")
    return open(path, encoding="utf-8").read()


def _dataclass_fields(src, cls_name):
    tree = ast.parse(src)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            fields = {}
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    fields[st.target.id] = st.value is not None
            return fields
    raise AssertionError(f"{cls_name} not found")


def test_fields_match_real_eagle_verify_input():
    fields = _dataclass_fields(_sglang_src("srt/speculative/eagle_info.py"), "EagleVerifyInput")
    tr = build_trees(torch.randn(2, 3, 20), 6)
    ours = set(tree_verify_fields(tr, torch.tensor([2, 3]), 3, seq_lens_sum=5)) | {"capture_hidden_mode"}
    extra = {"prepared_out_cache_loc", "kv_loc_plan"}  # what the worker adds
    assert ours | extra <= set(fields), (ours | extra) - set(fields)
    required = {k for k, has_default in fields.items() if not has_default}
    # custom_mask = field() has a value node but no default: treat as required
    assert required - {"custom_mask"} <= ours and "custom_mask" in ours


# ----------------------------------------------------------------- accept / compaction
def test_to_eagle_accept_and_compaction_vs_reference():
    rng = random.Random(0)
    for seed in range(25):
        g = torch.Generator().manual_seed(seed)
        bs, L, V, B = rng.randint(1, 5), rng.randint(1, 6), rng.randint(3, 25), rng.randint(1, 20)
        N = B + 1
        tr = build_trees(torch.randn(bs, L, V, generator=g) * 3, B, torch.randint(0, V, (bs,), generator=g))
        post = torch.randint(0, V, (bs, N), generator=g)
        for b in range(bs):  # follow the tree often
            for i in range(N):
                kids = [c for c in range(N) if tr.valid[b, c] and tr.parents[b, c] == i]
                if kids and rng.random() < 0.75:
                    post[b, i] = tr.tokens[b, rng.choice(kids)]
        Dm = min(L, B)  # the worker's spec_steps: accept_index width Dm + 1 <= N
        res = accept_walk(tr, post, Dm)
        predict, acc, lens = to_eagle_accept(res, N)
        assert predict.dtype == acc.dtype == lens.dtype == torch.int32
        assert acc.shape == (bs, Dm + 1)
        window = torch.randperm(1000, generator=g)[: bs * N] + 1  # slot ids of the verify window
        tgt, src = kv_move_plan(acc, lens, window)
        pc = compact_accept_to_front(predict, acc, bs, N).view(bs, N)
        hid = torch.randn(bs * N, 3, generator=g)
        hc = compact_accept_to_front(hid, acc, bs, N).view(bs, N, 3)
        seq = torch.randint(0, 50, (bs,), generator=g)
        bonus, new_seq = committed_outputs(pc.flatten(), lens, seq, N)
        k = 0
        for b in range(bs):
            path = [i for i in res.accept_index[b].tolist() if i >= 0]
            n = len(path)
            assert int(lens[b]) == n
            assert [int(x) for x in acc[b, :n]] == [b * N + i for i in path]
            assert all(int(x) == -1 for x in acc[b, n:])
            toks = [int(tr.tokens[b, i]) for i in path[1:]] + [int(res.bonus_token[b])]
            assert pc[b, :n].tolist() == toks  # committed tokens
            assert int(bonus[b]) == int(res.bonus_token[b]) and int(new_seq[b]) == int(seq[b]) + n
            for j, i in enumerate(path):
                assert torch.equal(hc[b, j], hid[b * N + i])
                assert int(tgt[k]) == int(window[b * N + j]) and int(src[k]) == int(window[b * N + i])
                k += 1
        assert (tgt[k:] == 0).all() and (src[k:] == 0).all()


def test_check_shapes():
    check_shapes(32, 8)
    check_shapes(7, 8)
    check_shapes(3, 8)  # window max(N, block) = 8 slots of the 2N = 8 reserved
    with pytest.raises(ValueError, match="at least 3"):
        check_shapes(2, 8)
    with pytest.raises(ValueError):
        check_shapes(6, 1)


# ----------------------------------------------------------------- end to end
V, D, H, LAYERS, MAXPOS = 40, 32, 4, 2, 256


class PagedLM:
    """Random-weight float64 transformer with a paged KV pool: ``kv[layer]``
    is ``[2, num_slots, D]``, requests map positions to slots via ``req_to_token``."""

    def __init__(self, seed, num_slots):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
        self.emb, self.pos = r(V, D), r(MAXPOS, D) * 0.5
        self.layers = [dict(q=r(D, D) / math.sqrt(D), k=r(D, D) / math.sqrt(D), v=r(D, D) / math.sqrt(D),
                            o=r(D, D) / math.sqrt(D), w1=r(D, 4 * D) / math.sqrt(D), w2=r(4 * D, D) / math.sqrt(4 * D))
                       for _ in range(LAYERS)]
        self.out = r(D, V) / math.sqrt(D) * 4
        self.kv = torch.zeros(LAYERS, 2, num_slots, D, dtype=torch.float64)

    def forward(self, tokens, positions, prefix_slots, new_slots, mask):
        """Queries ``tokens`` attend ``prefix_slots`` (cached) + themselves per
        ``mask [T, P+T]``; their K/V are written to ``new_slots``.  Returns
        ``(logits [T, V], hidden [T, D])``."""
        x = self.emb[tokens] + self.pos[positions]
        T = x.shape[0]
        for li, p in enumerate(self.layers):
            h = torch.nn.functional.layer_norm(x, (D,))
            q, k, v = h @ p["q"], h @ p["k"], h @ p["v"]
            self.kv[li, 0, new_slots] = k
            self.kv[li, 1, new_slots] = v
            K = torch.cat([self.kv[li, 0, prefix_slots], k])
            Vv = torch.cat([self.kv[li, 1, prefix_slots], v])
            qh = q.view(T, H, D // H).transpose(0, 1)
            kh = K.view(-1, H, D // H).transpose(0, 1)
            vh = Vv.view(-1, H, D // H).transpose(0, 1)
            att = (qh @ kh.transpose(1, 2)) / math.sqrt(D // H)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + (att @ vh).transpose(0, 1).reshape(T, D) @ p["o"]
            h = torch.nn.functional.layer_norm(x, (D,))
            x = x + torch.nn.functional.gelu(h @ p["w1"]) @ p["w2"]
        hid = torch.nn.functional.layer_norm(x, (D,))
        return hid @ self.out, hid

    def full(self, seq):
        """No cache: causal forward of the whole sequence (autoregressive reference)."""
        T = len(seq)
        scratch = torch.arange(T) + self.kv.shape[2] - T  # throwaway slots at the end of the pool
        saved = self.kv[:, :, scratch].clone()
        out = self.forward(torch.tensor(seq), torch.arange(T), scratch[:0], scratch,
                           torch.tril(torch.ones(T, T, dtype=torch.bool)))
        self.kv[:, :, scratch] = saved
        return out


def _draft_logits(truth, L, hit, rng, g):
    x = torch.randn(L, V, generator=g)
    for i in range(L):
        t = truth[i] if i < len(truth) else 0
        if rng.random() >= hit:
            t = rng.choice([u for u in range(V) if u != t])
        x[i, t] += 6.0
    return x


@pytest.mark.parametrize("L,B,hit", [(4, 9, 0.7), (7, 24, 0.9), (3, 3, 0.5), (1, 1, 1.0)])
def test_end_to_end_paged_step_equals_autoregressive(L, B, hit):
    N = B + 1
    rng = random.Random(L * 100 + B)
    g = torch.Generator().manual_seed(L * 7 + B)
    bs, n_new = 5, 16
    row = 64 + 2 * N + n_new
    num_slots = bs * row + 200
    model = PagedLM(L + B, num_slots)
    req_to_token = (torch.randperm(bs * row, generator=g) + 1).view(bs, row)  # slot 0 = padding slot
    prompts = [[rng.randrange(V) for _ in range(rng.randint(1, 10))] for _ in range(bs)]
    refs = []
    for p in prompts:  # AR greedy reference
        s = list(p)
        for _ in range(n_new + L + 2):
            s.append(int(model.full(s)[0][-1].argmax()))
        refs.append(s)
    # prefill
    seqs, bonus = [], []
    seq_lens = torch.zeros(bs, dtype=torch.long)
    for b, p in enumerate(prompts):
        T = len(p)
        slots = req_to_token[b, :T]
        logits, _ = model.forward(torch.tensor(p), torch.arange(T), slots[:0], slots,
                                  torch.tril(torch.ones(T, T, dtype=torch.bool)))
        seqs.append(list(p))
        bonus.append(int(logits[-1].argmax()))
        seq_lens[b] = T
    bonus = torch.tensor(bonus)
    accept_total = []
    while any(len(seqs[b]) < len(prompts[b]) + n_new for b in range(bs)):
        # 1) drafter -> trees (root = bonus)
        x = torch.stack([_draft_logits(refs[b][len(seqs[b]) + 1:len(seqs[b]) + 1 + L], L, hit, rng, g)
                         for b in range(bs)])
        trees = build_trees(x, B, bonus)
        # 2) tree verify inputs and ONE forward of N tokens per request into the window
        f = tree_verify_fields(trees, seq_lens, min(L, B), seq_lens_sum=int(seq_lens.sum()))
        window = torch.stack([req_to_token[b, int(seq_lens[b]):int(seq_lens[b]) + N] for b in range(bs)]).flatten()
        logits_all, hid_all = [], []
        off = 0
        for b in range(bs):
            P = int(seq_lens[b])
            m = f["custom_mask"][off:off + N * (P + N)].view(N, P + N)
            off += N * (P + N)
            lg, hd = model.forward(f["draft_token"].view(bs, N)[b], f["positions"].view(bs, N)[b],
                                   req_to_token[b, :P], window.view(bs, N)[b], m)
            logits_all.append(lg)
            hid_all.append(hd)
        logits_all = torch.stack(logits_all)
        hid_all = torch.cat(hid_all)
        # 3) accept (greedy walk) in SGLang's layout
        res = greedy_accept(trees, logits_all, max_depth=min(L, B))
        predict, acc, lens = to_eagle_accept(res, N)
        # 4) KV move + front compaction
        tgt, src = kv_move_plan(acc, lens, window)
        model.kv[:, :, tgt] = model.kv[:, :, src].clone()
        predict_c = compact_accept_to_front(predict, acc, bs, N)
        hid_c = compact_accept_to_front(hid_all, acc, bs, N).view(bs, N, D)
        new_bonus, new_seq = committed_outputs(predict_c, lens, seq_lens, N)
        for b in range(bs):
            n = int(lens[b])
            committed = predict_c.view(bs, N)[b, :n].tolist()
            # the drafter's context rows: target hidden of the accepted path == AR hidden there
            full_seq = seqs[b] + [int(bonus[b])] + committed[:-1]
            _, ar_hid = model.full(full_seq)
            P = int(seq_lens[b])
            assert torch.allclose(hid_c[b, :n], ar_hid[P:P + n], atol=1e-9), "compacted hidden != AR hidden"
            seqs[b] += [int(bonus[b])] + committed[:-1]
            accept_total.append(n)
        bonus, seq_lens = new_bonus, new_seq
    for b in range(bs):
        k = len(prompts[b]) + n_new
        assert seqs[b][:k] == refs[b][:k], f"L={L} B={B}: DDTree step output differs from AR greedy"
    print(f"L={L} B={B} hit={hit}: steps={len(accept_total) // bs} mean accept_len={sum(accept_total) / len(accept_total):.2f}")
    assert max(accept_total) <= min(L, B) + 1
    if hit == 1.0:
        assert min(accept_total) == min(L, B) + 1
