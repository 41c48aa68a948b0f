"""Verify inputs (EagleVerifyInput layout) and the acceptance walk."""

import random

import torch

from sglang_ddtree import build_trees
from sglang_ddtree.reference import build_tree, follow_verified_tree
from sglang_ddtree.verify import accept_walk, build_verify_inputs, greedy_accept, sample_accept


def _trees(seed=0, bs=5, L=6, V=40, B=24):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, L, V, generator=g) * 2
    root = torch.randint(0, V, (bs,), generator=g)
    return x, root, build_trees(x, B, root)


def test_layout():
    x, root, tr = _trees()
    bs, N = tr.tokens.shape
    seq = torch.tensor([3, 10, 1, 7, 4])
    vi = build_verify_inputs(tr, seq, int(seq.sum()))
    assert vi.draft_token_num == N
    assert torch.equal(vi.draft_token.view(bs, N), tr.tokens)
    assert torch.equal(vi.draft_token.view(bs, N)[:, 0], root)
    assert torch.equal(vi.positions.view(bs, N), seq.view(bs, 1) + tr.depths)
    off = 0
    for b in range(bs):
        R = int(seq[b]) + N
        m = vi.custom_mask[off:off + N * R].view(N, R)
        off += N * R
        assert m[:, : seq[b]].all()
        assert torch.equal(m[:, seq[b]:], tr.visibility[b])
    assert off == vi.custom_mask.numel()
    # retrieve links reproduce the parent structure
    ridx, nxt, sib = vi.retrieve_index, vi.retrieve_next_token, vi.retrieve_next_sibling
    for b in range(bs):
        par = tr.parents[b].tolist()
        val = tr.valid[b].tolist()
        for i in range(N):
            assert ridx[b, i].item() == (b * N + i if val[i] else -1)
            kids = [c for c in range(N) if val[c] and par[c] == i]
            got, c = [], nxt[b, i].item()
            while c != -1:
                got.append(c)
                c = sib[b, c].item()
            assert got == kids


def test_mask_buf_reuse():
    x, root, tr = _trees(1)
    seq = torch.tensor([2, 2, 2, 2, 2])
    buf = torch.zeros(10_000, dtype=torch.bool)
    a = build_verify_inputs(tr, seq, 10, buf).custom_mask
    b = build_verify_inputs(tr, seq, 10).custom_mask
    assert torch.equal(a, b)


def test_greedy_walk_matches_reference():
    rng = random.Random(0)
    for seed in range(40):
        L, V, B = rng.randint(1, 8), rng.randint(2, 30), rng.randint(1, 40)
        bs = rng.randint(1, 6)
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(bs, L, V, generator=g) * 3
        tr = build_trees(x, B)
        N = B + 1
        # posterior: mostly follow the tree's most likely path, with noise
        post = torch.randint(0, V, (bs, N), generator=g)
        for b in range(bs):
            for i in range(N):
                kids = [c for c in range(N) if tr.valid[b, c] and tr.parents[b, c] == i]
                if kids and rng.random() < 0.8:
                    post[b, i] = tr.tokens[b, rng.choice(kids)]
        res = accept_walk(tr, post, max_depth=L)
        for b in range(bs):
            # reference walk on the reference tree with the same posterior per path
            cm = [dict() for _ in range(N)]
            for c in range(1, N):
                if tr.valid[b, c]:
                    cm[tr.parents[b, c].item()][tr.tokens[b, c].item()] = c
            acc, bonus = follow_verified_tree(cm, post[b].tolist())
            got = [i for i in res.accept_index[b].tolist() if i >= 0]
            assert got == acc
            assert res.bonus_token[b].item() == bonus
            assert res.accept_length[b].item() == len(acc)
            toks = [tr.tokens[b, i].item() for i in acc[1:]] + [bonus]
            assert [t for t in res.committed[b].tolist() if t >= 0][: len(toks)] == toks


def test_greedy_accept_from_logits():
    x, root, tr = _trees(2, bs=3, L=4, V=20, B=10)
    N = 11
    logits = torch.randn(3, N, 20)
    res = greedy_accept(tr, logits.view(3 * N, 20), max_depth=4)
    res2 = accept_walk(tr, logits.argmax(-1), max_depth=4)
    assert torch.equal(res.accept_index, res2.accept_index)


def test_sampling_low_temperature_is_greedy():
    x, root, tr = _trees(3, bs=4, L=5, V=30, B=16)
    logits = torch.randn(4, 17, 30) * 5
    g = torch.Generator().manual_seed(0)
    res = sample_accept(tr, logits, torch.full((4,), 1e-4), max_depth=5, generator=g)
    ref = greedy_accept(tr, logits, max_depth=5)
    assert torch.equal(res.accept_index, ref.accept_index)
    assert torch.equal(res.bonus_token, ref.bonus_token)


def test_sampling_first_token_distribution():
    # the first committed token must be distributed as softmax(target[root] / T)
    V = 6
    x = torch.randn(1, 3, V)
    tr = build_trees(x, 4)
    logits = torch.randn(1, 5, V)
    T = 0.7
    n = 20000
    trees = type(tr)(*(t.expand(n, *t.shape[1:]) for t in (tr.tokens, tr.parents, tr.depths, tr.visibility, tr.valid)))
    g = torch.Generator().manual_seed(1)
    res = sample_accept(trees, logits.expand(n, 5, V), torch.full((n,), T), max_depth=3, generator=g)
    first = res.committed[:, 0]
    freq = torch.bincount(first, minlength=V).double() / n
    p = torch.softmax(logits[0, 0].double() / T, -1)
    assert (freq - p).abs().max() < 0.015
