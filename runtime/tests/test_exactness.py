"""build_trees (pure torch, CPU) == heap reference, as sets of root-to-node paths.

Thousands of random cases: L 1..15, vocab 2..200k, budget 1..256, batch 1..64,
continuous random logits; plus structural checks (visibility = ancestors,
parents precede children, padding layout).
"""

import random

import pytest
import torch

from sglang_ddtree import build_trees
from sglang_ddtree.reference import build_tree


def structure_ok(tr, L):
    """Vectorised structural checks over the whole batch."""
    tokens, parents, depths, vis, valid = tr.tokens, tr.parents, tr.depths, tr.visibility, tr.valid
    bs, N = parents.shape
    idx = torch.arange(N).expand(bs, N)
    assert valid[:, 0].all() and (parents[:, 0] == -1).all() and (depths[:, 0] == 0).all()
    # valid nodes come first, then padding
    nvalid = valid.sum(1, keepdim=True)
    assert torch.equal(valid, idx < nvalid)
    real = valid & (idx > 0)
    # parents precede children, depth = parent depth + 1, depth <= L
    assert ((parents < idx) & (parents >= 0))[real].all()
    pdepth = depths.gather(1, parents.clamp(min=0))
    assert (depths == pdepth + 1)[real].all()
    assert (depths <= L).all()
    # padding: parent -1, fully masked
    assert (parents[~valid] == -1).all()
    assert not vis[~valid].any()
    assert not (vis & ~valid.unsqueeze(1)).any()
    # visibility == ancestors-or-self: recompute by walking parents
    anc = torch.zeros_like(vis)
    cur = idx.clone()
    alive = valid.clone()
    for _ in range(L + 1):
        # anc[b, i, cur[b, i]] |= alive[b, i] (a one-hot row per node, as bool)
        anc |= torch.zeros_like(vis).scatter_(2, cur.unsqueeze(-1), alive.unsqueeze(-1))
        nxt = parents.gather(1, cur)
        alive &= nxt >= 0
        cur = nxt.clamp(min=0)
    assert torch.equal(anc, vis)
    # sibling tokens are distinct (a path set, not a multiset)
    same = (parents.unsqueeze(2) == parents.unsqueeze(1)) & (tokens.unsqueeze(2) == tokens.unsqueeze(1))
    same &= real.unsqueeze(2) & real.unsqueeze(1)
    assert torch.equal(same, torch.diag_embed(real))


def run_cases(seed, n_batches, L_rng, V_rng, B_rng, bs_rng, scale=(0.5, 3.0, 10.0)):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    trees = 0
    for _ in range(n_batches):
        L = rng.randint(*L_rng)
        V = int(round(10 ** rng.uniform(*V_rng)))
        B = rng.randint(*B_rng)
        bs = rng.randint(*bs_rng)
        x = torch.randn(bs, L, V, generator=g) * rng.choice(scale)
        tr = build_trees(x, B)
        structure_ok(tr, L)
        assert tr.tokens.shape == (bs, B + 1)
        for b in range(bs):
            ref = build_tree(x[b], B)
            assert tr.paths(b) == ref.paths(), (L, V, B, bs, b)
            assert int(tr.valid[b].sum()) == ref.num_nodes + 1
            trees += 1
    return trees


def test_small_many():
    # ~3000 trees: small vocab (2..2000), any depth/budget/batch
    n = run_cases(1, 160, (1, 15), (0.31, 3.3), (1, 256), (1, 64))
    assert n > 2500


def test_small_budgets_tiny_vocab():
    # budget > number of possible prefixes (V**L small): trees are complete
    n = run_cases(2, 120, (1, 4), (0.31, 0.8), (1, 256), (1, 16))
    assert n > 500


def test_large_vocab():
    # a few big ones: vocab up to 200k
    n = run_cases(3, 8, (1, 15), (4.0, 5.31), (1, 256), (1, 4))
    assert n >= 8


def test_kimi_vocab_batch():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(16, 7, 163840, generator=g)
    tr = build_trees(x, 32)
    structure_ok(tr, 7)
    for b in range(16):
        assert tr.paths(b) == build_tree(x[b], 32).paths()


def test_root_tokens_and_layout():
    x = torch.randn(3, 4, 50)
    root = torch.tensor([5, 6, 7])
    tr = build_trees(x, 10, root)
    assert tr.tokens[:, 0].tolist() == [5, 6, 7]
    assert tr.tokens.dtype == torch.long and tr.visibility.dtype == torch.bool


def test_budget_one_and_L_one():
    x = torch.randn(2, 1, 9)
    tr = build_trees(x, 1)
    assert tr.valid.sum().item() == 4
    assert torch.equal(tr.tokens[:, 1], x[:, 0].argmax(-1))


def test_zero_logprob_ties_stay_prefix_closed():
    # one token with probability 1 at every depth: log-prob 0 ties child and parent
    x = torch.full((2, 6, 5), -1e4)
    x[:, :, 3] = 0.0
    tr = build_trees(x, 12)
    structure_ok(tr, 6)


def test_bad_inputs():
    with pytest.raises(ValueError):
        build_trees(torch.randn(4, 5), 3)
    with pytest.raises(ValueError):
        build_trees(torch.randn(1, 4, 5), 0)
