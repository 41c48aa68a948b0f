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


def exactness_cases(n_cases, seed=0):
    """(L, B, V, bs, scale, seed) cases: every L x budget x vocab combination
    (L 1-15, budget 1-256, V 2-200k), batch 1-64, fp32 logits."""
    rng = random.Random(seed)
    shapes = [(L, B, V) for L in (1, 4, 7, 15) for B in (1, 8, 32, 64, 256) for V in (2, 1000, V_KIMI, 200000)]
    rng.shuffle(shapes)
    shapes = (shapes * (1 + n_cases // len(shapes)))[:n_cases]
    out = []
    for (L, B, V) in shapes:
        bs = rng.choice([1, 16, 64]) if V < 100000 else rng.choice([1, 8, 16])
        out.append((L, B, V, bs, rng.choice([1.0, 3.0, 8.0]), rng.randrange(1 << 30)))
    return out


def exactness(dev, cases, time_cap=150.0):
    trees = bad = 0
    fails = []
    t0 = time.time()
    done = 0
    for (L, B, V, bs, scale, seed) in cases:
        if time.time() - t0 > time_cap:
            log(f"[exactness] time cap reached after {done} shapes")
            break
        done += 1
        g = torch.Generator(device=dev).manual_seed(seed)
        x = torch.randn(bs, L, V, device=dev, generator=g) * scale
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


GRAPH_SHAPES = [(8, 7, 32), (4, 15, 64), (2, 7, 128), (128, 7, 32), (1, 15, 16)]


def graph_check(dev):
    ok_all = True
    for (bs, L, B) in GRAPH_SHAPES:
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

        g, (out_tr, out_vi, out_acc) = capture_graph(step)
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


def capture_graph(fn, warmups=2):
    """``(graph, outputs)``: ``fn`` run ``warmups`` times on a side stream (compiles,
    allocator), then captured; the graph is replayed once before it is returned."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    return g, out


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


def bench_table(dev, bw, shapes):
    rows = []
    for (L, B, bs) in shapes:
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
        g, _ = capture_graph(lambda: build_trees(x, B), warmups=1)
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
    g, _ = capture_graph(fn, warmups=1)
    return time_events(g.replay, reps)


BREAKDOWN_SHAPES = [(1, 7, 32), (128, 7, 32)]


def breakdown(dev, bw):
    """The two launches of the unfused path timed apart (which part costs what)."""
    from sglang_ddtree import triton_kernels as tk
    from sglang_ddtree.tree import build_trees_from_top

    shapes = BREAKDOWN_SHAPES
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
    g, _ = capture_graph(fn)
    ts = sorted(time_events(g.replay, reps) for _ in range(rounds))
    return ts[len(ts) // 2]


def _compile_job(job):
    """Worker of :func:`precompile`: one build_trees call of the given shape
    and configuration (fills Triton's on-disk cache for the main process)."""
    cfg, bs, L, B, V, dtype, root, mode = job
    import torch as _t
    from sglang_ddtree import build_trees as _bt
    from sglang_ddtree import triton_kernels as _tk

    _tk.CONFIG.update(cfg)
    t0 = time.time()
    x = _t.randn(bs, L, V, device="cuda").to(getattr(_t, dtype))
    r = _t.arange(bs, device="cuda") if root else None
    if mode == "parts":  # the breakdown's separate launches
        lp, ids = _tk.topk_logsumexp(x, min(B, V))
        _tk.build_trees_from_top_triton(lp, ids, B)
    else:
        _bt(x, B, r)
    _t.cuda.synchronize()
    return time.time() - t0


def precompile(jobs, workers=12):
    """Compile the kernels of ``jobs`` in parallel processes (Triton's cache is
    on disk and shared), so the timed code only loads them."""
    import concurrent.futures as cf
    import multiprocessing as mp

    from sglang_ddtree import triton_kernels as tk

    seen, uniq = set(), []
    for j in jobs:
        # the batch size only matters through the regime (rows <= small_rows)
        cfg, bs, L = j[0], j[1], j[2]
        rows_small = bs * L <= cfg.get("small_rows", tk.CONFIG["small_rows"])
        key = json.dumps([j[0], rows_small, *j[2:]], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            uniq.append(j)
    t0 = time.time()
    n_err = 0
    with cf.ProcessPoolExecutor(max_workers=max(1, min(workers, len(uniq))),
                                mp_context=mp.get_context("spawn")) as ex:
        futs = {ex.submit(_compile_job, j): j for j in uniq}
        for f in cf.as_completed(futs):
            try:
                f.result()
            except Exception as e:  # noqa: BLE001
                n_err += 1
                log(f"[precompile] ERROR {futs[f][1:]}: {type(e).__name__}: {str(e)[:200]}")
    log(f"[precompile] {len(uniq)} shape/config jobs in {time.time() - t0:.0f}s ({n_err} errors)")
    del tk


def _v0(chunk=8192, mpack32=True, fuse=True, warps=None, sel=None, tree=False):
    return {"impl": "v0", "chunk": chunk, "warps": warps, "sel_warps": sel, "mpack32": mpack32,
            "fuse": fuse, "tree": tree}


def _v2(chunk=8192, S=64, warps=8, sel=4, load2d=False, epack32=True, hier=4, ecap=0):
    return {"impl": "v2", "chunk": chunk, "S": S, "warps": warps, "sel_warps": sel,
            "load2d": load2d, "epack32": epack32, "hier": hier, "ecap": ecap}


TUNE_SHAPES = {"small": (1, 7, 32), "large": (128, 7, 32)}
TUNE_CANDIDATES = {
    # the current defaults first, then variants (runs 5-6 also timed v2 with
    # the select and the tree fused into other kernels: slower, removed)
    "small": [_v0(tree=True, warps=8), _v0(), _v0(16384, tree=True, warps=8), _v0(tree=True, warps=16)],
    "large": [_v2(ecap=64), _v2(), _v2(ecap=64, sel=8), _v2(ecap=64, warps=4)],
}
# where the small (latency) configuration stops paying: rows of these shapes
MID_SHAPES = [(2, 7, 32), (4, 7, 32), (8, 7, 32)]


def tune_jobs():
    return [({reg: c}, *TUNE_SHAPES[reg], V_KIMI, "bfloat16", False, "build")
            for reg, cands in TUNE_CANDIDATES.items() for c in cands]


def autotune(dev, budget_s=200.0):
    """Time whole ``build_trees`` calls (CUDA graphs, bf16 logits, V = 163840)
    for the candidate launch configurations of each regime and set
    ``triton_kernels.CONFIG`` to the fastest correct one.  Correct = the
    top-K values equal torch's (as sorted sets: bf16 ties) and the trees equal
    the two-launch path's on the same top-K, before and after the timed
    replays (the fused kernels' counters must come back to zero)."""
    from sglang_ddtree import triton_kernels as tk

    t_start = time.time()
    out = {}
    g = torch.Generator(device=dev).manual_seed(123)
    for regime, (bs, L, B) in TUNE_SHAPES.items():
        x = torch.randn(bs, L, V_KIMI, device=dev, generator=g).to(torch.bfloat16)
        x2 = torch.randn(bs, L, V_KIMI, device=dev, generator=g).to(torch.bfloat16)
        best = None

        def correct(cfg, xx):
            tr, _ = tk.build_trees_triton(xx, B, cfg=cfg)
            lp, ids = tk.topk_logsumexp(xx, B, cfg=dict(cfg, tree=False))
            ok = torch.equal(xx.float().gather(-1, ids).sort(-1).values, xx.float().topk(B, -1).values.sort(-1).values)
            ref = tk.build_trees_from_top_triton(lp, ids, B)
            ok &= all(torch.equal(getattr(tr, f), getattr(ref, f))
                      for f in ("tokens", "parents", "depths", "visibility", "valid"))
            return bool(ok)

        for cfg in TUNE_CANDIDATES[regime]:
            if time.time() - t_start > budget_s:
                log(f"[tune] {regime} {cfg}: skipped (tuning budget)")
                continue
            try:
                ok = correct(cfg, x)
                ts = []
                for _ in range(2):
                    ts.append(_graph_median(lambda: tk.build_trees_triton(x, B, cfg=cfg)))
                t = min(ts)
                ok &= correct(cfg, x2) and correct(cfg, x)
            except Exception as e:  # noqa: BLE001
                log(f"[tune] {regime} {cfg}: ERROR {type(e).__name__}: {str(e)[:300]}")
                continue
            log(f"[tune] {regime} bs={bs} L={L} B={B} {cfg}: build {t:.2f} us (2 medians: "
                f"{ts[0]:.2f}, {ts[1]:.2f}){'' if ok else '  WRONG'}")
            if ok and (best is None or t < best[0]):
                best = (t, cfg)
        if best is not None:
            tk.CONFIG[regime] = dict(best[1])
            out[regime] = {"cfg": best[1], "us": best[0]}
            log(f"[tune] {regime}: chosen {best[1]} ({best[0]:.2f} us)")
    # the row count up to which the small configuration is used
    small_rows = 7
    for (bs, L, B) in MID_SHAPES:
        x = torch.randn(bs, L, V_KIMI, device=dev, generator=g).to(torch.bfloat16)
        t = {reg: min(_graph_median(lambda: tk.build_trees_triton(x, B, cfg=tk.CONFIG[reg])) for _ in range(2))
             for reg in ("small", "large")}
        log(f"[tune] bs={bs} L={L} B={B} ({bs * L} rows): small config {t['small']:.2f} us, "
            f"large config {t['large']:.2f} us")
        if t["small"] > t["large"]:
            break
        small_rows = bs * L
    tk.CONFIG["small_rows"] = small_rows
    out["small_rows"] = small_rows
    log(f"[tune] CONFIG = {tk.CONFIG}")
    return out


def table_shapes(quick=False):
    if quick:
        return [(7, 32, bs) for bs in (1, 8, 32, 128)]
    return [(L, B, bs) for L in (7, 15) for B in (8, 16, 32, 64) for bs in (1, 8, 32, 128)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="table: L 7, budget 32 only")
    ap.add_argument("--cases", type=int, default=240, help="exactness shapes (each a batch of 1-64 trees)")
    ap.add_argument("--exact-cap", type=float, default=150.0, help="seconds of exactness checks at most")
    ap.add_argument("--tune", action="store_true", help="time candidate launch configs first and use the fastest")
    ap.add_argument("--tune-budget", type=float, default=200.0, help="seconds of candidates at most")
    ap.add_argument("--workers", type=int, default=12, help="parallel kernel-compile processes")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--deadline", type=float, default=540.0,
                    help="seconds after start by which the exactness checks stop (device call limit)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    import triton
    from sglang_ddtree import triton_kernels as tk

    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}, "
        f"SMs {torch.cuda.get_device_properties(0).multi_processor_count}")
    res = {}
    t0 = time.time()
    if args.tune:
        try:
            precompile(tune_jobs(), args.workers)
            res["tune"] = autotune(dev, args.tune_budget)
        except Exception:
            traceback.print_exc()
        log(f"  (tuning done at {time.time() - t0:.0f}s)")
    cfg = json.loads(json.dumps(tk.CONFIG))
    cases = exactness_cases(args.cases)
    jobs = [(cfg, bs, L, B, V_KIMI, "bfloat16", False, "build") for (L, B, bs) in table_shapes(args.quick)]
    jobs += [(cfg, bs, L, B, V_KIMI, "bfloat16", True, "build") for (bs, L, B) in GRAPH_SHAPES]
    jobs += [(cfg, bs, L, B, V, "float32", False, "build") for (L, B, V, bs, _, _) in cases]
    if not args.no_breakdown:
        jobs += [(cfg, bs, L, B, V_KIMI, "bfloat16", False, "parts") for (bs, L, B) in BREAKDOWN_SHAPES]
    precompile(jobs, args.workers)
    log(f"  (compiles done at {time.time() - t0:.0f}s)")
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
        res["table"] = bench_table(dev, bw, table_shapes(args.quick))
    except Exception:
        traceback.print_exc()
    log(f"  (table done at {time.time() - t0:.0f}s)")
    try:
        if not args.no_breakdown:
            breakdown(dev, bw)
    except Exception:
        traceback.print_exc()
    try:
        cap = min(args.exact_cap, args.deadline - (time.time() - t0))
        res["exactness"] = exactness(dev, cases, time_cap=cap)
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
