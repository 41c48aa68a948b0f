#!/usr/bin/env python3
"""Batch-1 latency A/B for the graph-replayed builder (one short device call).

  PYTHONPATH=runtime/src python3 runtime/bench/bench_bs1.py [--budget 170] [--exact-cap 30]

Times build_trees(x[1, 7, 163840] bf16, 32) replayed from a CUDA graph for the
current default and for variants of the tree kernel (all-in-registers ``reg``,
warps) and of the small top-K configuration; the default is timed first and
last (noise).  Each variant's trees are checked against the torch beam before
it is timed.  Then bs 128 L 7 B 32 (default vs the large-regime reg variant),
then the fastest correct choice is applied and the GPU exactness (vs the heap
reference) and CUDA-graph replay checks run on it.  Stops itself by --budget s.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)

from sglang_ddtree import build_trees  # noqa: E402
from sglang_ddtree import triton_kernels as tk  # noqa: E402
from sglang_ddtree.reference import top_log_probs  # noqa: E402
from sglang_ddtree.tree import build_trees_from_top  # noqa: E402

V = 163840
FIELDS = ("tokens", "parents", "depths", "visibility", "valid")


def log(*a):
    print(*a, flush=True)


def graph_us(fn, reps=200, rounds=5):
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
    ts = []
    for _ in range(rounds):
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / reps * 1e3)
    ts.sort()
    return ts[len(ts) // 2], ts[0]


def tree_ok(dev, cfg_tree, gen):
    """variant tree kernel == torch beam on a few inputs (bf16 bs 1 / 3, fp32 L 15 B 64)."""
    for (bs, L, B, dt) in [(1, 7, 32, torch.bfloat16), (3, 7, 32, torch.bfloat16), (8, 7, 32, torch.bfloat16),
                           (2, 15, 64, torch.float32), (2, 4, 8, torch.float32)]:
        x = (torch.randn(bs, L, V, device=dev, generator=gen) * 3).to(dt)
        lp, ids = top_log_probs(x, B)
        ref = build_trees_from_top(lp, ids, B)
        tr = tk.build_trees_from_top_triton(lp, ids, B, **cfg_tree)
        for f in FIELDS:
            if not torch.equal(getattr(tr, f), getattr(ref, f)):
                return f"mismatch {f} at bs={bs} L={L} B={B}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=170.0)
    ap.add_argument("--exact-cap", type=float, default=30.0)
    ap.add_argument("--cases", type=int, default=40)
    args = ap.parse_args()
    t0 = time.time()
    dev = torch.device("cuda")
    import triton
    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    default = copy.deepcopy(tk.CONFIG)
    gen = torch.Generator(device=dev).manual_seed(7)
    x1 = torch.randn(1, 7, V, device=dev, generator=gen).to(torch.bfloat16)
    B = 32

    # (name, CONFIG overrides)
    variants = [
        ("default", {}),
        ("reg w8", {"tree_reg_small": True}),
        ("reg w4", {"tree_reg_small": True, "tree_warps_small": 4}),
        ("reg w2", {"tree_reg_small": True, "tree_warps_small": 2}),
        ("reg w1", {"tree_reg_small": True, "tree_warps_small": 1}),
        ("gather w4", {"tree_warps_small": 4}),
        ("gather w2", {"tree_warps_small": 2}),
        ("reg w4 + topk chunk16384", {"tree_reg_small": True, "tree_warps_small": 4,
                                      "small": dict(default["small"], chunk=16384)}),
        ("reg w4 + topk w8", {"tree_reg_small": True, "tree_warps_small": 4,
                              "small": dict(default["small"], warps=8)}),
        ("default (again)", {}),
    ]
    res = {}
    for name, ov in variants:
        if time.time() - t0 > args.budget * 0.45:
            log(f"[bs1] {name}: skipped (budget)")
            continue
        tk.CONFIG.clear()
        tk.CONFIG.update(copy.deepcopy(default))
        tk.CONFIG.update(copy.deepcopy(ov))
        try:
            small = tk.CONFIG["small"]
            err = tree_ok(dev, {"num_warps": tk.CONFIG.get("tree_warps_small") or tk.CONFIG["tree_warps"],
                                "reg": tk.CONFIG["tree_reg_small"]}, gen)
            lp, ids = tk.topk_logsumexp(x1, B)
            ok_topk = torch.equal(x1.float().gather(-1, ids).sort(-1).values,
                                  x1.float().topk(B, -1).values.sort(-1).values)
            ok_topk &= (lp - top_log_probs(x1, B)[0]).abs().max().item() < 1e-4
            med, best = graph_us(lambda: build_trees(x1, B))
            lp, ids = tk.topk_logsumexp(x1, B)
            t_topk, _ = graph_us(lambda: tk.topk_logsumexp(x1, B))
            t_tree, _ = graph_us(lambda: tk.build_trees_from_top_triton(lp, ids, B))
            lp2, ids2 = tk.topk_logsumexp(x1, B)  # after the replays (fused-merge counters)
            ok_topk &= torch.equal(ids2.sort(-1).values, ids.sort(-1).values)
        except Exception as e:  # noqa: BLE001
            log(f"[bs1] {name}: ERROR {type(e).__name__}: {str(e)[:400]}")
            continue
        ok = err is None and bool(ok_topk)
        res[name] = (med, ok, ov)
        log(f"[bs1] L=7 B=32 {name:28s}: graph {med:6.2f} us (min {best:6.2f})  topk {t_topk:5.2f}  "
            f"tree {t_tree:5.2f}  {'exact' if ok else 'WRONG ' + str(err) + ' topk ' + str(bool(ok_topk))}"
            f"  [{time.time() - t0:.0f}s]")
    base = min(v[0] for k, v in res.items() if k.startswith("default"))
    good = [(v[0], k, v[2]) for k, v in res.items() if v[1] and not k.startswith("default")]
    chosen = dict(default)
    if good:
        t, name, ov = min(good, key=lambda r: r[0])
        log(f"[bs1] fastest variant: {name} {t:.2f} us vs default {base:.2f} us (best of the two default runs)")
        if t < base - 0.3:
            chosen = copy.deepcopy(default)
            chosen.update(copy.deepcopy(ov))
    tk.CONFIG.clear()
    tk.CONFIG.update(copy.deepcopy(chosen))

    # bs 128 re-check: the chosen config (large regime unchanged) and with the reg tree
    x128 = torch.randn(128, 7, V, device=dev, generator=gen).to(torch.bfloat16)
    big = {}
    for name, ov in [("chosen", {}), ("chosen + large reg", {"tree_reg": True}), ("chosen (again)", {})]:
        if time.time() - t0 > args.budget * 0.6:
            log(f"[bs128] {name}: skipped (budget)")
            continue
        tk.CONFIG.clear()
        tk.CONFIG.update(copy.deepcopy(chosen))
        tk.CONFIG.update(ov)
        try:
            err = tree_ok(dev, {"num_warps": tk.CONFIG["tree_warps"], "reg": tk.CONFIG["tree_reg"]}, gen)
            med, best = graph_us(lambda: build_trees(x128, B), reps=100, rounds=3)
        except Exception as e:  # noqa: BLE001
            log(f"[bs128] {name}: ERROR {type(e).__name__}: {str(e)[:400]}")
            continue
        big[name] = (med, err is None)
        log(f"[bs128] L=7 B=32 {name:20s}: graph {med:6.2f} us (min {best:6.2f})  "
            f"{'exact' if err is None else 'WRONG ' + err}  [{time.time() - t0:.0f}s]")
    b0 = min(v[0] for k, v in big.items() if not k.endswith("reg")) if big else None
    # run 4: the bs-128 check passed by luck while bs-1 reg variants at 4 / 8
    # warps were WRONG: adopt reg only when every timed reg variant was exact
    reg_all_ok = all(v[1] for k, v in res.items() if k.startswith("reg"))
    if (reg_all_ok and "chosen + large reg" in big and big["chosen + large reg"][1] and b0
            and big["chosen + large reg"][0] < b0 - 0.5):
        chosen["tree_reg"] = True
    tk.CONFIG.clear()
    tk.CONFIG.update(copy.deepcopy(chosen))
    log(f"[choice] CONFIG = {tk.CONFIG}")

    # exactness + graph replay on the chosen configuration
    import bench_build as bb
    try:
        bb.graph_check(dev)
    except Exception as e:  # noqa: BLE001
        log(f"[cuda-graph] ERROR {type(e).__name__}: {str(e)[:400]}")
    log(f"  (graph check done at {time.time() - t0:.0f}s)")
    cap = max(5.0, min(args.exact_cap, args.budget - (time.time() - t0) - 5))
    try:
        bb.exactness(dev, args.cases, time_cap=cap)
    except Exception as e:  # noqa: BLE001
        log(f"[exactness] ERROR {type(e).__name__}: {str(e)[:400]}")
    # final: default vs chosen once more, back to back
    for name, cfg in [("default", default), ("chosen", chosen)]:
        if time.time() - t0 > args.budget:
            break
        tk.CONFIG.clear()
        tk.CONFIG.update(copy.deepcopy(cfg))
        med, best = graph_us(lambda: build_trees(x1, B))
        log(f"[final] bs1 L=7 B=32 {name}: graph {med:6.2f} us (min {best:6.2f})")
    log(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
