#!/usr/bin/env python3
"""DDTree tree-construction benchmark + GPU checks (one device call).

  PYTHONPATH=runtime/src python3 runtime/bench/bench_build.py [--out DIR] [--quick]

1. exactness on the GPU: Triton builder (and the torch fallback for budgets
   above the fused kernel's limit) vs the heap reference, random fp32 logits,
   as sets of root-to-node token paths; visibility = ancestors; parents first.
2. CUDA graph: capture build_trees + verify-input construction, replay with new
   logits, compare with eager.
3. timing table, V = 163840 (bf16 logits), L in {7, 15}, budget in
   {8, 16, 32, 64}, batch in {1, 8, 32, 128}:
     heap     reference path: batched GPU top-k + logsumexp, one copy to the
              CPU, serial Python heaps (what the reference code does)
     eager    build_trees, eager launches
     graph    build_trees replayed from a CUDA graph
     floor    bytes of logits / measured copy bandwidth (HBM floor)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from sglang_ddtree import build_trees  # noqa: E402
from sglang_ddtree.reference import build_tree, top_log_probs  # noqa: E402
from sglang_ddtree.verify import build_verify_inputs, greedy_accept  # noqa: E402

V_KIMI = 163840


def log(*a):
    print(*a, flush=True)


def check_tree(tr, b, ref):
    """Path sets equal, parents precede children, visibility == ancestors."""
    if ref.paths() != tr.paths(b):
        return "paths"
    par = tr.parents[b].tolist()
    val = tr.valid[b].tolist()
    vis = tr.visibility[b].cpu()
    N = len(par)
    anc = torch.zeros(N, N, dtype=torch.bool)
    for i in range(N):
        if not val[i]:
            continue
        if i > 0 and not (0 <= par[i] < i):
            return "parent-order"
        j = i
        while j >= 0:
            anc[i, j] = True
            j = par[j] if j > 0 else -1
    if not torch.equal(anc, vis):
        return "visibility"
    return None


def exactness(dev, n_cases, seed=0, time_cap=150.0):
    rng = random.Random(seed)
    shapes = []
    for L in (1, 4, 7, 15):
        for B in (1, 8, 32, 64, 256):
            for V in (2, 1000, V_KIMI, 200000):
                shapes.append((L, B, V))
    rng.shuffle(shapes)
    shapes = shapes[:n_cases]
    trees = bad = 0
    fails = []
    t0 = time.time()
    done = 0
    for (L, B, V) in shapes:
        if time.time() - t0 > time_cap:
            log(f"[exactness] time cap reached after {done} shapes")
            break
        done += 1
        bs = rng.choice([1, 16, 64]) if V < 100000 else rng.choice([1, 8, 16])
        g = torch.Generator(device=dev).manual_seed(rng.randrange(1 << 30))
        x = torch.randn(bs, L, V, device=dev, generator=g) * rng.choice([1.0, 3.0, 8.0])
        tr = build_trees(x, B)
        torch.cuda.synchronize()
        xc = x.cpu()
        for b in range(bs):
            ref = build_tree(xc[b], B)
            err = check_tree(tr, b, ref)
            trees += 1
            if err:
                bad += 1
                fails.append((L, B, V, bs, b, err))
    log(f"[exactness] GPU builder vs heap reference: {trees} trees over {done} shapes, "
        f"{bad} mismatches ({time.time() - t0:.1f}s)")
    for f in fails[:10]:
        log("   mismatch", f)
    return trees, bad


def graph_check(dev):
    ok_all = True
    for (bs, L, B) in [(8, 7, 32), (4, 15, 64), (2, 7, 128)]:
        V = V_KIMI
        N = B + 1
        x_static = torch.randn(bs, L, V, device=dev, dtype=torch.bfloat16)
        root_static = torch.randint(0, V, (bs,), device=dev)
        seq_lens = torch.randint(5, 50, (bs,), device=dev)
        seq_sum = int(seq_lens.sum())
        mask_buf = torch.empty(seq_sum * N + bs * N * N, dtype=torch.bool, device=dev)
        tgt_static = torch.randn(bs * N, 1000, device=dev)

        def step():
            tr = build_trees(x_static, B, root_static)
            vi = build_verify_inputs(tr, seq_lens, seq_sum, mask_buf)
            acc = greedy_accept(tr, tgt_static, max_depth=L)
            return tr, vi, acc

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out_tr, out_vi, out_acc = step()
        ok = True
        for it in range(3):
            x_static.copy_(torch.randn(bs, L, V, device=dev).to(torch.bfloat16) * (1 + it))
            root_static.copy_(torch.randint(0, V, (bs,), device=dev))
            tgt_static.copy_(torch.randn(bs * N, 1000, device=dev))
            g.replay()
            torch.cuda.synchronize()
            got = [out_tr.tokens, out_tr.parents, out_tr.depths, out_tr.visibility, out_tr.valid,
                   out_vi.draft_token, out_vi.positions, out_vi.custom_mask.clone(),
                   out_vi.retrieve_index, out_vi.retrieve_next_token, out_vi.retrieve_next_sibling,
                   out_acc.accept_index, out_acc.bonus_token]
            got = [t.clone() for t in got]
            e_tr, e_vi, e_acc = step()
            torch.cuda.synchronize()
            exp = [e_tr.tokens, e_tr.parents, e_tr.depths, e_tr.visibility, e_tr.valid,
                   e_vi.draft_token, e_vi.positions, e_vi.custom_mask,
                   e_vi.retrieve_index, e_vi.retrieve_next_token, e_vi.retrieve_next_sibling,
                   e_acc.accept_index, e_acc.bonus_token]
            ok &= all(torch.equal(a, b) for a, b in zip(got, exp))
        log(f"[cuda-graph] bs={bs} L={L} B={B}: capture ok, 3 replays with new inputs == eager: {ok}")
        ok_all &= ok
    return ok_all


def copy_bandwidth(dev):
    n = 1 << 30  # 1 GiB
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    reps = 20
    e0.record()
    for _ in range(reps):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    sec = e0.elapsed_time(e1) / 1e3 / reps
    bw = 2 * n / sec  # bytes read + written per second
    del a, b
    return bw


def time_events(fn, reps):
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps * 1e3  # us


def heap_path(x, B):
    bs, L, V = x.shape
    K = min(B, V)
    lp, ids = top_log_probs(x, K)  # batched on GPU
    lp_np = lp.cpu().numpy()  # one copy (synchronises)
    ids_np = ids.cpu().numpy()
    return [build_tree(None, B, top=(lp_np[b], ids_np[b])) for b in range(bs)]


def bench_table(dev, bw, quick=False):
    rows = []
    Ls = (7, 15)
    Bs = (8, 16, 32, 64)
    bss = (1, 8, 32, 128)
    if quick:
        Ls, Bs, bss = (7,), (32,), (1, 8, 32, 128)
    for L in Ls:
        for B in Bs:
            for bs in bss:
                x = torch.randn(bs, L, V_KIMI, device=dev).to(torch.bfloat16)
                floor_us = x.numel() * x.element_size() / bw * 1e6
                # heap reference
                heap_path(x, B)
                torch.cuda.synchronize()
                reps = 3 if bs >= 32 else 10
                t0 = time.perf_counter()
                for _ in range(reps):
                    heap_path(x, B)
                heap_us = (time.perf_counter() - t0) / reps * 1e6
                # eager
                for _ in range(3):
                    build_trees(x, B)
                torch.cuda.synchronize()
                eager_us = time_events(lambda: build_trees(x, B), 20)
                # graph
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    build_trees(x, B)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    build_trees(x, B)
                g.replay()
                torch.cuda.synchronize()
                graph_us = time_events(g.replay, 200)
                del g
                from sglang_ddtree import tree as _tree
                r = dict(impl=_tree.LAST_IMPL, V=V_KIMI, L=L, budget=B, batch=bs, heap_us=heap_us, eager_us=eager_us,
                         graph_us=graph_us, floor_us=floor_us,
                         graph_over_floor=graph_us / floor_us, heap_over_graph=heap_us / graph_us)
                rows.append(r)
                log(f"  L={L:2d} B={B:3d} bs={bs:3d}  heap {heap_us:10.1f} us  eager {eager_us:8.1f} us  "
                    f"graph {graph_us:8.1f} us  floor {floor_us:7.1f} us  "
                    f"graph/floor {graph_us / floor_us:5.2f}  heap/graph {heap_us / graph_us:7.1f}  [{r['impl']}]")
    return rows


def graph_time(fn, reps=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return time_events(g.replay, reps)


def breakdown(dev, bw, quick=False):
    from sglang_ddtree import triton_kernels as tk
    from sglang_ddtree.tree import build_trees_from_top

    shapes = [(1, 7, 32), (128, 7, 32)] if quick else [(1, 7, 32), (128, 7, 32), (1, 15, 64), (128, 15, 64)]
    for (bs, L, B) in shapes:
        x = torch.randn(bs, L, V_KIMI, device=dev).to(torch.bfloat16)
        K = min(B, V_KIMI)
        t_topk = graph_time(lambda: tk.topk_logsumexp(x, K))
        lp, ids = tk.topk_logsumexp(x, K)
        t_tree = graph_time(lambda: tk.build_trees_from_top_triton(lp, ids, B))
        t_torchtree = graph_time(lambda: build_trees_from_top(lp, ids, B))
        t_torchtopk = graph_time(lambda: top_log_probs(x, K))
        floor = x.numel() * 2 / bw * 1e6
        log(f"[breakdown] bs={bs} L={L} B={B}: triton topk+lse {t_topk:.1f} us (torch topk+lse {t_torchtopk:.1f}), "
            f"triton tree {t_tree:.1f} us (torch tree {t_torchtree:.1f}), floor {floor:.1f} us")


def _graph_median(fn, reps=100, rounds=3):
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
    ts = sorted(time_events(g.replay, reps) for _ in range(rounds))
    return ts[len(ts) // 2]


def autotune(dev, budget_s=150.0, tree=False):
    """Time the candidate launch configurations on this device (each top-K
    stage separately, then both together, in CUDA graphs) and set
    ``triton_kernels.CONFIG`` to the fastest correct ones (reported; the
    library's defaults are set to this run's choice).  Candidates past
    ``budget_s`` are skipped."""
    from sglang_ddtree import triton_kernels as tk
    from sglang_ddtree.tree import build_trees_from_top

    t_start = time.time()
    out = {}

    def v0(chunk=4096, mpack32=False, fuse=False, warps=None, sel=None):
        return {"impl": "v0", "chunk": chunk, "warps": warps, "sel_warps": sel, "mpack32": mpack32, "fuse": fuse}

    def v2(chunk=8192, S=64, warps=8, sel=8, load2d=False, epack32=False, hier=1):
        return {"impl": "v2", "chunk": chunk, "S": S, "warps": warps, "sel_warps": sel,
                "load2d": load2d, "epack32": epack32, "hier": hier}

    cands = {
        "large": [v2(), v2(epack32=True), v2(epack32=True, hier=4), v2(epack32=True, hier=8),
                  v2(S=32, epack32=True, hier=8), v2(epack32=True, hier=4, load2d=True),
                  v2(epack32=True, hier=4, warps=4), v2(chunk=16384, epack32=True, hier=4),
                  v2(epack32=True, hier=4, sel=4)],
        "small": [v0(), v0(mpack32=True), v0(mpack32=True, fuse=True), v0(8192, mpack32=True, fuse=True),
                  v0(mpack32=True, fuse=True, warps=8), v0(8192, mpack32=True), v0(2048, mpack32=True, fuse=True)],
    }
    shapes = {"large": (128, 7, 32), "small": (1, 7, 32)}
    g = torch.Generator(device=dev).manual_seed(123)
    x32 = torch.randn(2, 3, V_KIMI, device=dev, generator=g) * 2
    for regime, (bs, L, B) in shapes.items():
        x = torch.randn(bs, L, V_KIMI, device=dev, generator=g).to(torch.bfloat16)
        ref_vals = x.float().topk(B, -1).values
        rlp, _ = top_log_probs(x, B)
        best = None

        def correct(cfg):
            lp, ids = tk.topk_logsumexp(x, B, cfg=cfg)
            ok = torch.equal(x.float().gather(-1, ids).sort(-1).values, ref_vals.sort(-1).values)
            ok &= (lp - rlp).abs().max().item() < 1e-4
            lp32, ids32 = tk.topk_logsumexp(x32, B, cfg=cfg)
            ok &= torch.equal(ids32, top_log_probs(x32, B)[1])
            return bool(ok)

        stop = budget_s * (0.55 if regime == "large" else 1.0)
        for cfg in cands[regime]:
            if time.time() - t_start > stop:
                log(f"[tune] {regime} {cfg}: skipped (tuning budget)")
                continue
            try:
                ok = correct(cfg)
                bufs = {}
                tk.topk_logsumexp(x, B, cfg=cfg, _bufs=bufs)
                t1 = _graph_median(lambda: tk.topk_logsumexp(x, B, cfg=cfg, _stages=1, _bufs=bufs))
                t2 = (_graph_median(lambda: tk.topk_logsumexp(x, B, cfg=cfg, _stages=2, _bufs=bufs))
                      if not cfg.get("fuse") else 0.0)
                t = _graph_median(lambda: tk.topk_logsumexp(x, B, cfg=cfg))
                ok &= correct(cfg)  # again after the timed replays (fused-merge counters)
            except Exception as e:  # noqa: BLE001
                log(f"[tune] {regime} {cfg}: ERROR {type(e).__name__}: {str(e)[:300]}")
                continue
            log(f"[tune] {regime} bs={bs} L={L} B={B} {cfg}: stage1 {t1:.1f} us, stage2 {t2:.1f} us, "
                f"both {t:.1f} us{'' if ok else '  WRONG'}")
            if ok and (best is None or t < best[0]):
                best = (t, cfg)
        if best is not None:
            tk.CONFIG[regime] = dict(best[1])
            out[regime] = {"cfg": best[1], "us": best[0]}
            log(f"[tune] {regime}: chosen {best[1]} ({best[0]:.1f} us)")
    if not tree:
        log(f"[tune] CONFIG = {tk.CONFIG}")
        return out
    # tree kernel: register gathers or memory round trips, warps
    trees = {}
    for B in (32, 64):
        x = torch.randn(1, 7, V_KIMI, device=dev, generator=g).to(torch.bfloat16)
        lp, ids = tk.topk_logsumexp(x, B)
        ref = build_trees_from_top(lp, ids, B)
        for gat in (False, True):
            for nw in (4, 8):
                try:
                    tr = tk.build_trees_from_top_triton(lp, ids, B, num_warps=nw, gather=gat)
                    ok = all(torch.equal(getattr(tr, f), getattr(ref, f))
                             for f in ("tokens", "parents", "depths", "visibility", "valid"))
                    t = _graph_median(lambda: tk.build_trees_from_top_triton(lp, ids, B, num_warps=nw, gather=gat))
                except Exception as e:  # noqa: BLE001
                    log(f"[tune] tree B={B} gather={gat} warps={nw}: ERROR {type(e).__name__}: {str(e)[:300]}")
                    continue
                log(f"[tune] tree L=7 B={B} gather={gat} warps={nw}: {t:.1f} us{'' if ok else '  WRONG'}")
                if ok:
                    trees.setdefault((gat, nw), {})[B] = t
    scored = [(v[32] + 0.25 * v[64], k) for k, v in trees.items() if 32 in v and 64 in v]
    if scored:
        _, (gat, nw) = min(scored)
        tk.CONFIG["tree_gather"] = gat
        tk.CONFIG["tree_warps"] = nw
        out["tree"] = {"gather": gat, "warps": nw}
        log(f"[tune] tree: chosen gather={gat} warps={nw}")
    log(f"[tune] CONFIG = {tk.CONFIG}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", type=int, default=64)
    ap.add_argument("--exact-cap", type=float, default=150.0)
    ap.add_argument("--tune", action="store_true", help="time candidate launch configs first and use the fastest")
    ap.add_argument("--tune-budget", type=float, default=150.0, help="seconds of top-K candidates")
    ap.add_argument("--tune-tree", action="store_true", help="also tune the tree kernel (gather, warps)")
    ap.add_argument("--no-breakdown", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    import triton

    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}, "
        f"SMs {torch.cuda.get_device_properties(0).multi_processor_count}")
    res = {}
    t0 = time.time()
    if args.tune:
        try:
            res["tune"] = autotune(dev, args.tune_budget, args.tune_tree)
        except Exception:
            traceback.print_exc()
        log(f"  (tuning done at {time.time() - t0:.0f}s)")
    try:
        res["graph"] = graph_check(dev)
    except Exception:
        traceback.print_exc()
        res["graph"] = "error"
    log(f"  (graph check done at {time.time() - t0:.0f}s)")
    bw = copy_bandwidth(dev)
    log(f"[bandwidth] device-to-device copy: {bw / 1e12:.2f} TB/s (read + written)")
    res["copy_bw_Bps"] = bw
    try:
        log("[table] V=163840, bf16 logits; times per call (all requests of the batch)")
        res["table"] = bench_table(dev, bw, args.quick)
    except Exception:
        traceback.print_exc()
    log(f"  (table done at {time.time() - t0:.0f}s)")
    try:
        if not args.no_breakdown:
            breakdown(dev, bw, args.quick)
    except Exception:
        traceback.print_exc()
    try:
        res["exactness"] = exactness(dev, args.cases, time_cap=args.exact_cap)
    except Exception:
        traceback.print_exc()
        res["exactness"] = "error"
    rows = res.get("table", [])
    md = ["| L | budget | batch | heap ref (us) | builder eager (us) | builder graph (us) | HBM floor (us) | graph/floor | heap/graph |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['L']} | {r['budget']} | {r['batch']} | {r['heap_us']:.1f} | {r['eager_us']:.1f} | "
                  f"{r['graph_us']:.1f} | {r['floor_us']:.1f} | {r['graph_over_floor']:.2f} | {r['heap_over_graph']:.0f} |")
    log("\n".join(md))
    for r in rows:
        if r["L"] == 7 and r["budget"] == 32 and r["batch"] == 128:
            log(f"[target] bs128 L7 B32: graph {r['graph_us']:.1f} us = {r['graph_over_floor']:.2f}x floor "
                f"(target <= 2), heap/graph {r['heap_over_graph']:.0f}x (target >= 50)")
        if r["L"] == 7 and r["budget"] == 32 and r["batch"] == 1:
            log(f"[target] bs1 L7 B32: graph {r['graph_us']:.1f} us (target <= 25)")
    b1 = [r for r in rows if r["batch"] == 1]
    if b1:
        log(f"[target] batch 1: graph max {max(r['graph_us'] for r in b1):.1f} us over {len(b1)} configs (target <= 25)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    log(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
