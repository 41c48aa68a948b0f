"""Losslessness: greedy DDTree speculative decoding over a small random-weight
transformer reproduces autoregressive greedy decoding exactly, using the
verify inputs (tokens, positions, custom mask) and the batched acceptance walk;
accept lengths rise with the drafter's hit rate."""

import math
import random

import torch

from sglang_ddtree import build_trees
from sglang_ddtree.verify import build_verify_inputs, greedy_accept

V, D, H, LAYERS, MAXPOS = 48, 32, 4, 2, 256


class TinyLM(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
        self.emb = r(V, D)
        self.pos = r(MAXPOS, D) * 0.5
        self.layers = [
            dict(q=r(D, D) / math.sqrt(D), k=r(D, D) / math.sqrt(D), v=r(D, D) / math.sqrt(D),
                 o=r(D, D) / math.sqrt(D), w1=r(D, 4 * D) / math.sqrt(D), w2=r(4 * D, D) / math.sqrt(4 * D))
            for _ in range(LAYERS)
        ]
        self.out = r(D, V) / math.sqrt(D) * 4

    def forward(self, tokens, positions, mask):
        """tokens/positions [T], mask [T, T] bool (query row attends key col)."""
        x = self.emb[tokens] + self.pos[positions]
        T = x.shape[0]
        for p in self.layers:
            h = torch.nn.functional.layer_norm(x, (D,))
            q = (h @ p["q"]).view(T, H, D // H).transpose(0, 1)
            k = (h @ p["k"]).view(T, H, D // H).transpose(0, 1)
            v = (h @ p["v"]).view(T, H, D // H).transpose(0, 1)
            att = (q @ k.transpose(1, 2)) / math.sqrt(D // H)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + (att @ v).transpose(0, 1).reshape(T, D) @ p["o"]
            h = torch.nn.functional.layer_norm(x, (D,))
            x = x + torch.nn.functional.gelu(h @ p["w1"]) @ p["w2"]
        return torch.nn.functional.layer_norm(x, (D,)) @ self.out


def causal(T):
    return torch.tril(torch.ones(T, T, dtype=torch.bool))


def ar_greedy(model, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        T = len(seq)
        logits = model(torch.tensor(seq), torch.arange(T), causal(T))
        seq.append(int(logits[-1].argmax()))
    return seq


def draft_logits(truth, L, hit, rng, g):
    """[L, V]: at each depth the true token is top-1 with probability ``hit``."""
    x = torch.randn(L, V, generator=g)
    for i in range(L):
        if rng.random() < hit:
            x[i, truth[i]] += 6.0
        else:
            wrong = rng.choice([t for t in range(V) if t != truth[i]])
            x[i, wrong] += 6.0
    return x


def spec_decode(model, prompts, refs, n_new, L, B, hit, seed):
    """Lock-step batched speculative decoding; returns outputs and accept lengths."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for p in prompts:  # prefill: the first bonus token
        T = len(p)
        seqs.append(list(p) + [int(model(torch.tensor(p), torch.arange(T), causal(T))[-1].argmax())])
    accept_lens = []
    all_seqs = seqs
    while True:
        active = [i for i, (s, p) in enumerate(zip(all_seqs, prompts)) if len(s) < len(p) + n_new + 1]
        if not active:
            break
        seqs = [all_seqs[i] for i in active]  # same list objects: appends land in all_seqs
        bs = len(seqs)
        truth = [refs[active[b]][len(seqs[b]):len(seqs[b]) + L] for b in range(bs)]
        x = torch.stack([draft_logits(truth[b], L, hit, rng, g) for b in range(bs)])
        root = torch.tensor([s[-1] for s in seqs])
        trees = build_trees(x, B, root)
        seq_lens = torch.tensor([len(s) - 1 for s in seqs])  # committed prefix without the root
        vi = build_verify_inputs(trees, seq_lens, int(seq_lens.sum()))
        N = B + 1
        tgt = []
        off = 0
        for b in range(bs):
            P = int(seq_lens[b])
            rows = vi.custom_mask[off:off + N * (P + N)].view(N, P + N)
            off += N * (P + N)
            mask = torch.zeros(P + N, P + N, dtype=torch.bool)
            mask[:P, :P] = causal(P)
            mask[P:] = rows
            toks = torch.cat([torch.tensor(seqs[b][:-1], dtype=torch.long), vi.draft_token.view(bs, N)[b]])
            pos = torch.cat([torch.arange(P), vi.positions.view(bs, N)[b]])
            tgt.append(model(toks, pos, mask)[P:])
        res = greedy_accept(trees, torch.stack(tgt), max_depth=L)
        for b in range(bs):
            n = int(res.num_accepted[b])
            seqs[b] += res.committed[b, : n + 1].tolist()
            accept_lens.append(int(res.accept_length[b]))
    return all_seqs, accept_lens


def test_lossless_and_accept_length_rises_with_hit_rate():
    model = TinyLM(0)
    rng = random.Random(0)
    L, B, n_new = 5, 12, 20
    prompts = [[rng.randrange(V) for _ in range(rng.randint(1, 12))] for _ in range(24)]
    refs = [ar_greedy(model, p, n_new + 2 * L + 4) for p in prompts]
    means = {}
    for hit in (0.0, 0.4, 0.8, 1.0):
        outs, acc = spec_decode(model, prompts, refs, n_new, L, B, hit, seed=int(hit * 10))
        for o, r, p in zip(outs, refs, prompts):
            k = len(p) + n_new
            assert o[:k] == r[:k], f"hit={hit}: speculative output differs from greedy"
        means[hit] = sum(acc) / len(acc)
    print("mean accept length by hit rate:", means)
    assert means[0.0] < means[0.4] < means[0.8] <= means[1.0]
    assert means[1.0] == L + 1  # every draft right: the whole chain plus the bonus
    assert means[0.0] >= 1.0


def test_lossless_other_shapes():
    model = TinyLM(1)
    rng = random.Random(1)
    for L, B in ((1, 1), (3, 2), (7, 40)):
        prompts = [[rng.randrange(V) for _ in range(rng.randint(1, 8))] for _ in range(4)]
        refs = [ar_greedy(model, p, 12 + 2 * L + 4) for p in prompts]
        outs, _ = spec_decode(model, prompts, refs, 12, L, B, 0.6, seed=L)
        for o, r, p in zip(outs, refs, prompts):
            assert o[: len(p) + 12] == r[: len(p) + 12]
