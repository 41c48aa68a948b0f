#!/usr/bin/env python3
"""Launch-configuration sweep for the Triton DDTree kernels (one device call, ~1-2 min).

  PYTHONPATH=runtime/src python3 runtime/bench/sweep.py

Per (bs, L, B): graph-replayed time of the stage-1/2 top-K + logsumexp for several
chunk sizes / warp counts, of the tree kernel for several warp counts, and of the
whole build_trees with the current defaults; each variant is first checked
against torch (top-K value sets and log-probabilities, trees vs the torch beam
on the same top-K).
"""

from __future__ import annotations

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from sglang_ddtree import build_trees  # noqa: E402
from sglang_ddtree import triton_kernels as tk  # noqa: E402
from sglang_ddtree.reference import top_log_probs  # noqa: E402
from sglang_ddtree.tree import build_trees_from_top  # noqa: E402

V = 163840


def log(*a):
    print(*a, flush=True)


def graph_time(fn, reps=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    best = []
    for _ in range(3):
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        best.append(e0.elapsed_time(e1) / reps * 1e3)
    return sorted(best)[1]


def check_topk(x, K, lp, ids):
    rlp, _ = top_log_probs(x, K)
    xv = x.float().gather(-1, ids)
    ok_vals = torch.equal(xv.sort(-1).values, x.float().topk(K, -1).values.sort(-1).values)
    err = (lp - rlp).abs().max().item()
    return ok_vals and err < 1e-4, err


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize()
    e0.record()
    for _ in range(10):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    bw = 2 * n / (e0.elapsed_time(e1) / 1e3 / 10)
    del a, b
    log(f"[bandwidth] {bw / 1e12:.2f} TB/s")

    topk_variants = [(4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16)]
    tree_variants = [1, 2, 4, 8]
    configs = [(128, 7, 32), (1, 7, 32), (32, 7, 32), (1, 7, 64), (1, 15, 64), (128, 15, 64), (1, 7, 8)]
    for (bs, L, B) in configs:
        x = torch.randn(bs, L, V, device=dev).to(torch.bfloat16)
        K = B
        floor = x.numel() * 2 / bw * 1e6
        line = [f"bs={bs} L={L} B={B} floor {floor:.1f}us |"]
        for (ch, nw) in topk_variants:
            if bs == 1 and ch == 16384 and nw == 16:
                continue
            try:
                lp, ids = tk.topk_logsumexp(x, K, chunk=ch, chunk_warps=nw)
                ok, err = check_topk(x, K, lp, ids)
                t = graph_time(lambda: tk.topk_logsumexp(x, K, chunk=ch, chunk_warps=nw))
                line.append(f"topk[{ch}/{nw}] {t:.1f}{'' if ok else ' BAD(%.1e)' % err}")
            except Exception as e:  # noqa: BLE001
                line.append(f"topk[{ch}/{nw}] ERR {type(e).__name__}: {str(e)[:200]}")
        log("  ".join(line))
        lp, ids = tk.topk_logsumexp(x, K)
        ref = build_trees_from_top(lp, ids, B)
        line = ["    tree |"]
        for nw in tree_variants:
            try:
                tr = tk.build_trees_from_top_triton(lp, ids, B, num_warps=nw)
                ok = all(torch.equal(getattr(tr, f), getattr(ref, f))
                         for f in ("tokens", "parents", "depths", "visibility", "valid"))
                t = graph_time(lambda: tk.build_trees_from_top_triton(lp, ids, B, num_warps=nw))
                line.append(f"tree[w{nw}] {t:.1f}{'' if ok else ' BAD'}")
            except Exception as e:  # noqa: BLE001
                line.append(f"tree[w{nw}] ERR {type(e).__name__}: {str(e)[:200]}")
        t = graph_time(lambda: build_trees(x, B))
        line.append(f"| build_trees(default) {t:.1f} us = {t / floor:.2f}x floor")
        log("  ".join(line))
    # fallback path (many exact ties) still right
    x = torch.zeros(4, 7, V, device=dev)
    x[:, :, ::5] = 1.0
    x = x.to(torch.bfloat16)
    lp, ids = tk.topk_logsumexp(x, 32)
    ok, err = check_topk(x, 32, lp, ids)
    t = graph_time(lambda: tk.topk_logsumexp(x, 32))
    log(f"[fallback] ties: ok={ok} err={err:.1e} topk {t:.1f} us")


if __name__ == "__main__":
    main()
