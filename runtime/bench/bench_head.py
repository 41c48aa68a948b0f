#!/usr/bin/env python3
"""The decode step's draft head on the GPU: ``head.DraftTreeHead`` (the worker's own
head + tree function) against the LM-head GEMM alone and today's eager
``worker.draft_trees`` (one device call).

  PYTHONPATH=runtime/src python3 runtime/bench/bench_head.py [--out DIR]

Shapes: H 7168, L 7 (drafter block 8), budget 32, bf16 weight / hidden states /
logits; vocabulary shard 20480 (Kimi's 163840 over TP 8) and 163840 (TP 1);
batch 1, 8, 32, 128.

1. exactness + compilation, in parallel processes (Triton's on-disk cache then
   serves the timing): random hidden states and weights (bf16, logits ~ N(0, s)
   for a few s: many exact bf16 ties among the top-K), the head's trees vs
   ``build_trees`` on the full logits (the logits the head's own GEMM calls
   give, concatenated over the shards): tokens, parents, depths, visibility,
   valid all equal.  TP 1 at both shard sizes; a simulated TP 2-8 merge (every
   rank's shard of 20480 computed on this GPU, the all-gather by
   ``LoopbackGroup``).
2. timing, CUDA-graph replays (median of rounds, CUDA events; the GEMM alone
   and the head graph replayed alternately, each replay between its own
   events: head/GEMM is the median of the pairs' ratios, with the range of
   the middle half, not skewed by clocks that differ between the two):
     gemm        torch.mm(hidden rows 1..L [bs*7, H], W_shard.T) -> bf16 logits
     old eager   worker.draft_trees (what the worker ran before): eager
     old graph   the same captured in a CUDA graph
     head graph  DraftTreeHead(hidden [bs*8, H], input_ids) captured (TP 1)
     head eager  the same launched eagerly
     tp8 graph   (shard 20480) rank 0 of the TP-8 head: shard top-K, the
                 all-gather replaced by a local copy of the other ranks'
                 buffers (no NCCL on one GPU), merge + tree
     alt graph   the head with the other launch configuration (small <-> large)
     candidates  (shard 20480, batch <= 32) launch-configuration variants, graph
   after each capture: 3 replays with new hidden states == eager trees.
Raw output of the runs: results-head-h200.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

H, BLOCK, BUDGET = 7168, 8, 32
DEV = "cuda"
if os.environ.get("DDTREE_BENCH_DRY") == "1":  # CPU dry run of the exactness jobs (TRITON_INTERPRET=1)
    H, DEV = 64, "cpu"
L = BLOCK - 1
SHARDS = (20480, 163840)
BATCHES = (1, 8, 32, 128)
F = ("tokens", "parents", "depths", "visibility", "valid")


def log(*a):
    print(*a, flush=True)


def rand_case(V, bs, seed, scale, dev=None):
    dev = dev or DEV
    g = torch.Generator(device=dev).manual_seed(seed)
    W = torch.randn(V, H, device=dev, generator=g, dtype=torch.bfloat16) * (scale / H ** 0.5)
    hid = torch.randn(bs * BLOCK, H, device=dev, generator=g, dtype=torch.bfloat16)
    ids = torch.randint(0, 163840, (bs * BLOCK,), device=dev, generator=g)
    return W, hid, ids


def compare(tr, ref, bs):
    same = sum(all(torch.equal(getattr(tr, f)[b], getattr(ref, f)[b]) for f in F) for b in range(bs))
    paths = sum(tr.paths(b) == ref.paths(b) for b in range(bs))
    return same, paths


def exact_job(job):
    """One exactness case (also compiles its kernels): ``(job, trees, identical, same paths, s)``."""
    kind, V, tp, bs, seed, scale = job
    t0 = time.time()
    from sglang_ddtree import build_trees
    from sglang_ddtree.head import DraftTreeHead, LoopbackGroup

    if DEV == "cuda":
        torch.cuda.set_device(0)
    if kind == "tp1":
        W, hid, ids = rand_case(V, bs, seed, scale)
        h = DraftTreeHead(W, BUDGET, BLOCK, max_bs=bs)
        tr = h(hid, ids)
        logits = h.logits(hid)
    else:  # simulated TP: shards of V, vocabulary tp * V
        W, hid, ids = rand_case(V * tp, bs, seed, scale)
        sent, parts = [], []
        for r in range(tp):
            rec = LoopbackGroup(tp, r)
            hr = DraftTreeHead(W[r * V:(r + 1) * V], BUDGET, BLOCK, vocab_start=r * V, tp_group=rec,
                               vocab_size=tp * V, max_bs=bs)
            hr(hid, ids)
            sent.append(rec.sent)
            parts.append(hr.logits(hid))
        h0 = DraftTreeHead(W[:V], BUDGET, BLOCK, vocab_start=0, tp_group=LoopbackGroup(tp, 0, [None] + sent[1:]),
                           vocab_size=tp * V, max_bs=bs)
        tr = h0(hid, ids)
        logits = torch.cat(parts, -1)
    ref = build_trees(logits, BUDGET, ids.view(bs, BLOCK)[:, 0])
    if DEV == "cuda":
        torch.cuda.synchronize()
    same, paths = compare(tr, ref, bs)
    return job, bs, same, paths, time.time() - t0


def exactness_jobs():
    jobs = []
    for V in SHARDS:
        for bs in BATCHES:
            for seed, scale in ((11 * bs + 1, 1.0), (11 * bs + 2, 4.0)):
                jobs.append(("tp1", V, 1, bs, seed + V, scale))
    for tp in range(2, 9):
        for bs in (1, 8, 32):
            jobs.append(("tpsim", 20480, tp, bs, 100 * tp + bs, (1.0, 4.0)[bs % 2]))
    return jobs


def run_exactness(jobs, workers):
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.time()
    tot = {"tp1": [0, 0, 0], "tpsim": [0, 0, 0]}
    rows = []
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        futs = {ex.submit(exact_job, j): j for j in jobs}
        for f in cf.as_completed(futs):
            j = futs[f]
            try:
                job, n, same, paths, dt = f.result()
            except Exception as e:  # noqa: BLE001
                log(f"[exact] ERROR {j}: {type(e).__name__}: {str(e)[:300]}")
                rows.append({"job": j, "error": repr(e)[:300]})
                continue
            t = tot[job[0]]
            t[0] += n
            t[1] += same
            t[2] += paths
            rows.append({"job": job, "trees": n, "identical": same, "paths": paths})
            if same != n:
                log(f"[exact] MISMATCH {job}: {same}/{n} identical, {paths}/{n} same path sets")
    for k, (n, s, p) in tot.items():
        log(f"[exact] {k}: {n} trees, {s} identical to build_trees on the full logits, {p} same path sets "
            f"({n - s} differ)")
    log(f"[exact] {len(jobs)} cases in {time.time() - t0:.0f}s")
    return tot, rows


def capture_graph(fn, warmups=2):
    """As bench_build.capture_graph: warm-up on a side stream, capture, one replay."""
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


def time_events(fn, reps):
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps * 1e3  # us


def median_time(fn, reps, rounds=3):
    for _ in range(2):
        fn()
    ts = sorted(time_events(fn, reps) for _ in range(rounds))
    return ts[len(ts) // 2]


def interleaved_times(fa, fb, n):
    """Times (us) of ``fa`` and ``fb`` replayed alternately, one call each per
    pair, every call between its own CUDA events: both see the same clocks.
    (Alternating blocks of 300 replays, this file's first try, biased the
    ratio: after a block of GEMMs the head ran slower, after a block of heads
    the GEMM faster.)"""
    for _ in range(3):
        fa()
        fb()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3 * n)]
    for i in range(n):
        ev[3 * i].record()
        fa()
        ev[3 * i + 1].record()
        fb()
        ev[3 * i + 2].record()
    torch.cuda.synchronize()
    ta = [ev[3 * i].elapsed_time(ev[3 * i + 1]) * 1e3 for i in range(n)]
    tb = [ev[3 * i + 1].elapsed_time(ev[3 * i + 2]) * 1e3 for i in range(n)]
    return ta, tb


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def reps_for(us_guess):
    return int(max(5, min(300, 30000 / max(us_guess, 1.0))))


def graph_exact(g, out_trees, static_hid, static_ids, W, reference_head, bs, seed):
    """3 replays with new hidden states / root ids == eager build_trees on the head's logits."""
    from sglang_ddtree import build_trees

    ok = True
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for it in range(3):
        static_hid.copy_(torch.randn(static_hid.shape, device="cuda", generator=gen).to(torch.bfloat16) * (1 + it))
        static_ids.copy_(torch.randint(0, 163840, static_ids.shape, device="cuda", generator=gen))
        g.replay()
        torch.cuda.synchronize()
        got = [getattr(out_trees, f).clone() for f in F]
        ref = build_trees(reference_head.logits(static_hid), BUDGET, static_ids.view(bs, BLOCK)[:, 0])
        ok &= all(torch.equal(a, getattr(ref, f)) for a, f in zip(got, F))
    return bool(ok)


def tp8_head(W, bs, **kw):
    """Rank 0 of a TP-8 head on the shard ``W`` (20480 rows of Kimi's 163840): the
    all-gather returns 7 other ranks' send buffers made up here (plausible shard
    lists: sorted values, int32 ids in the other shards, lse), by local copies."""
    from sglang_ddtree.head import DraftTreeHead, LoopbackGroup

    others = [None] + [torch.randn(bs * L * (2 * BUDGET + 1), device=DEV) for _ in range(7)]
    n = bs * L * BUDGET
    for o in others[1:]:
        o[:n] = o[:n].view(bs * L, BUDGET).sort(-1, descending=True).values.flatten()
        o[n:2 * n] = torch.randint(20480, 163840, (n,), device=DEV, dtype=torch.int32).view(torch.float32)
        o[2 * n:] = 12.0
    return DraftTreeHead(W, BUDGET, BLOCK, vocab_start=0, tp_group=LoopbackGroup(8, 0, others),
                         vocab_size=163840, max_bs=bs, **kw)


def candidates(bs, impl):
    """Launch-configuration variants timed at the small shard (name, cfg, CONFIG overrides,
    DraftTreeHead keywords)."""
    from sglang_ddtree import triton_kernels as tk

    out = [("default", None, {}, {})]
    pdl = bs * L <= int(tk.CONFIG.get("pdl_rows_max") or 0)
    out += [("no PDL" if pdl else "PDL", None, {"pdl_rows_max": 0 if pdl else bs * L}, {})]
    if bs * BLOCK <= 64:  # the Triton GEMM's rows (CONFIG head_gemm): cuBLAS instead, with and without PDL
        out += [("cuBLAS GEMM", None, {"head_gemm": {}}, {}),
                ("cuBLAS GEMM, no PDL (stop 27)", None, {"head_gemm": {}, "pdl_rows_max": 0}, {})]
    if bs * BLOCK == 64:
        out += [("Triton GEMM 4 warps", None, {"head_gemm": {**tk.CONFIG["head_gemm"], 64: (256, 64, 4, 4)}}, {})]
    return out


def sweep(W, hid, ids, bs, impl, g_gemm):
    """{name: [graph us, replays == eager, head/GEMM per pair]}: each candidate's graph
    replayed in alternation with the GEMM's (``g_gemm``), as the main timing."""
    from sglang_ddtree import triton_kernels as tk
    from sglang_ddtree.head import DraftTreeHead

    res = {}
    for name, cfg, over, kw in candidates(bs, impl):
        saved = json.loads(json.dumps(tk.CONFIG))
        saved["head_gemm"] = dict(tk.CONFIG["head_gemm"])  # int keys (JSON makes them strings)
        tk.CONFIG.update(over)
        try:
            hc = DraftTreeHead(W, BUDGET, BLOCK, max_bs=bs, cfg=cfg, **kw)
            g, out = capture_graph(lambda: hc(hid, ids))
            ta, tb = interleaved_times(g_gemm.replay, g.replay, reps_for(100 if W.shape[0] < 100000 else 700))
            t, ratio = median(tb), round(median([b / a for a, b in zip(ta, tb)]), 3)
            ok = graph_exact(g, out, hid, ids, W, hc, bs, seed=7 + bs)
            res[name] = [round(t, 2), ok, ratio]
            del g
        except Exception as e:  # noqa: BLE001
            res[name] = ["error", repr(e)[:200]]
        finally:
            tk.CONFIG.clear()
            tk.CONFIG.update(saved)
    return res


def candidates_only(shards, batches, out_dir):
    """Only the candidates' sweep (paired with the GEMM), per shard and batch."""
    from sglang_ddtree import triton_kernels as tk

    rows = []
    for V in shards:
        W, _, _ = rand_case(V, 1, 7 + V, 1.0)
        for bs in batches:
            _, hid, ids = rand_case(V, bs, 1000 + bs, 1.0)
            hs = hid.view(bs, BLOCK, H)[:, 1:].reshape(bs * L, H).contiguous()
            g_gemm, _ = capture_graph(lambda: torch.mm(hs, W.t()))
            impl = tk.regime_config(bs * L, V)["impl"]
            r = {"V": V, "batch": bs, "cfg": impl, "candidates": sweep(W, hid, ids, bs, impl, g_gemm)}
            del g_gemm
            log("[cand] " + json.dumps(r))
            rows.append(r)
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "bench_head_candidates.json"), "w") as f:
                json.dump(rows, f, indent=1)
            torch.cuda.empty_cache()
        W = None  # the shard weight freed before the next one is made
    return rows


def timing(results, out_dir=None, sweep_candidates=True):
    from sglang_ddtree import triton_kernels as tk
    from sglang_ddtree.head import DraftTreeHead
    from sglang_ddtree.worker import draft_trees

    rows = []
    for V in SHARDS:
        W, _, _ = rand_case(V, 1, 7 + V, 1.0)
        for bs in BATCHES:
            r = {"V": V, "batch": bs}
            try:
                _, hid, ids = rand_case(V, bs, 1000 + bs, 1.0)
                hs = hid.view(bs, BLOCK, H)[:, 1:].reshape(bs * L, H).contiguous()
                root = ids.view(bs, BLOCK)[:, 0].contiguous()
                # GEMM alone (timed below, replay by replay in alternation with the head's graph)
                g_gemm, _ = capture_graph(lambda: torch.mm(hs, W.t()))
                # today's eager head
                r["old_eager_us"] = median_time(lambda: draft_trees(hid.view(bs, BLOCK, H), W, BUDGET, root),
                                                reps_for(4000), rounds=3)
                g, _ = capture_graph(lambda: draft_trees(hid.view(bs, BLOCK, H), W, BUDGET, root), warmups=1)
                r["old_graph_us"] = median_time(g.replay, reps_for(1500))
                del g
                # the new head, TP 1
                head = DraftTreeHead(W, BUDGET, BLOCK, max_bs=bs)
                r["cfg"] = tk.regime_config(bs * L, V)["impl"]
                r["full_block_gemm"] = head.chunk_requests(bs)[0]
                r["gemm_chunks"] = -(-bs // head.chunk_requests(bs)[1])
                r["logits_MiB"] = head.logits_bytes(bs) / 2 ** 20
                r["head_eager_us"] = median_time(lambda: head(hid, ids), reps_for(300))
                g, out = capture_graph(lambda: head(hid, ids))
                ta, tb = interleaved_times(g_gemm.replay, g.replay, reps_for(100 if V < 100000 else 700))
                # cross-check: the GEMM timed on its own, back to back
                r["gemm_alone_us"] = median_time(g_gemm.replay, reps_for(100 if V < 100000 else 700), rounds=5)
                if r["full_block_gemm"] and V == 20480:  # cuBLAS on the whole block (root rows too), back to back
                    g_blk, _ = capture_graph(lambda: torch.mm(hid, W.t()))
                    r["gemm_whole_block_alone_us"] = median_time(g_blk.replay, reps_for(100), rounds=5)
                    del g_blk
                grows = bs * BLOCK if r["full_block_gemm"] else bs * L
                if r["gemm_chunks"] == 1 and tk.head_gemm_config(grows, V, H, W.dtype) is not None:
                    # the head's own GEMM: the Triton one at these rows (CONFIG head_gemm), back to back
                    g_hg, _ = capture_graph(lambda: head._gemm_rows(hid, 0, bs, r["full_block_gemm"])[0])
                    r["head_triton_gemm_alone_us"] = median_time(g_hg.replay, reps_for(100 if V < 100000 else 700),
                                                                 rounds=5)
                    del g_hg
                r["gemm_us"], r["head_graph_us"] = median(ta), median(tb)
                ratios = sorted(b / a for a, b in zip(ta, tb))
                q = len(ratios) // 4
                r["ratio"], r["ratio_range"] = median(ratios), [ratios[q], ratios[-1 - q]]
                # the same graph timed on its own (how runs 1-3 timed it)
                r["head_graph_alone_us"] = median_time(g.replay, reps_for(100 if V < 100000 else 700), rounds=5)
                r["graph_ok"] = graph_exact(g, out, hid, ids, W, head, bs, seed=bs)
                del g
                # the other launch configuration
                other = tk.CONFIG["large"] if r["cfg"] == "v0" else tk.CONFIG["small"]
                alt = DraftTreeHead(W, BUDGET, BLOCK, max_bs=bs, cfg=other)
                g, out = capture_graph(lambda: alt(hid, ids))
                r["alt_graph_us"] = median_time(g.replay, reps_for(100 if V < 100000 else 700))
                del g
                # TP 8 flow at shard 20480 (all-gather replaced by local copies)
                if V == 20480:
                    h8 = tp8_head(W, bs)
                    g, out = capture_graph(lambda: h8(hid, ids))
                    r["tp8_graph_us"] = median_time(g.replay, reps_for(100))
                    del g
                    # the same flow with the request's L rows merged one after another
                    tk.CONFIG["merge_rows_2d"] = False
                    try:
                        g, out8 = capture_graph(lambda: h8(hid, ids))
                        r["tp8_merge_by_row_graph_us"] = median_time(g.replay, reps_for(100))
                        # both merges give the same trees on the same gathered buffers
                        trees_by_row = [getattr(out8, f).clone() for f in F]
                        tk.CONFIG["merge_rows_2d"] = True
                        g2, out2d = capture_graph(lambda: h8(hid, ids))
                        r["tp8_merges_agree"] = all(torch.equal(getattr(out2d, f), t) for f, t in zip(F, trees_by_row))
                        del g, g2
                    finally:
                        tk.CONFIG["merge_rows_2d"] = True
                if V == 20480 and sweep_candidates:
                    r["candidates"] = sweep(W, hid, ids, bs, r["cfg"], g_gemm)
                del g_gemm
                r["speedup_vs_old_eager"] = r["old_eager_us"] / r["head_graph_us"]
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                r["error"] = repr(e)[:300]
            rows.append(r)
            log("[time] " + json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}))
            if out_dir:  # what a call cut short by its time limit still brings back
                os.makedirs(out_dir, exist_ok=True)
                with open(os.path.join(out_dir, "bench_head.partial.json"), "w") as f:
                    json.dump(dict(results, timing=rows), f, indent=1, default=str)
            torch.cuda.empty_cache()
        W = None  # the shard weight freed before the next one is made
        torch.cuda.empty_cache()
    results["timing"] = rows
    return rows


def table(rows):
    md = ["| shard V | batch | GEMM alone, paired (us) | old eager (us) | old graph (us) | head eager (us) | "
          "**head graph, paired (us)** | head/GEMM per pair (range) | target <= 1.3 | old eager/head | alt config graph (us) | "
          "TP-8 flow graph* (us) | graph replays == eager | logits (MiB) | each alone: head/GEMM |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['V']} | {r['batch']} | error: {r['error'][:80]} |")
            continue
        tp8 = f"{r['tp8_graph_us']:.1f}" if "tp8_graph_us" in r else "-"
        md.append(f"| {r['V']} | {r['batch']} | {r['gemm_us']:.1f} | {r['old_eager_us']:.0f} | {r['old_graph_us']:.0f} | "
                  f"{r['head_eager_us']:.1f} | **{r['head_graph_us']:.1f}** ({r['cfg']}) | "
                  f"{r['ratio']:.3f} ({r['ratio_range'][0]:.3f}-{r['ratio_range'][1]:.3f}) | "
                  f"{'yes' if r['ratio'] <= 1.3 else 'NO'} | {r['speedup_vs_old_eager']:.0f}x | "
                  f"{r['alt_graph_us']:.1f} | {tp8} | {r['graph_ok']} | {r['logits_MiB']:.1f} | "
                  f"{r['head_graph_alone_us']:.1f}/{r['gemm_alone_us']:.1f} = "
                  f"{r['head_graph_alone_us'] / r['gemm_alone_us']:.3f} |")
    return md


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--skip-exact", action="store_true")
    ap.add_argument("--candidates-only", action="store_true",
                    help="only the launch-configuration sweep (paired with the GEMM), no exactness")
    ap.add_argument("--no-candidates", action="store_true", help="the full run without the candidates' sweep")
    ap.add_argument("--shards", type=int, nargs="*", default=list(SHARDS))
    ap.add_argument("--batches", type=int, nargs="*", default=list(BATCHES))
    args = ap.parse_args()
    import triton

    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}, "
        f"SMs {torch.cuda.get_device_properties(0).multi_processor_count}")
    t0 = time.time()
    if args.candidates_only:
        candidates_only(args.shards, args.batches, args.out)
        log(f"total {time.time() - t0:.0f}s")
        return
    res = {}
    if not args.skip_exact:
        try:
            res["exact"], res["exact_rows"] = run_exactness(exactness_jobs(), args.workers)
        except Exception:
            traceback.print_exc()
    log(f"  (exactness + compiles done at {time.time() - t0:.0f}s)")
    rows = timing(res, args.out, sweep_candidates=not args.no_candidates)
    log(f"  (timing done at {time.time() - t0:.0f}s)")
    md = table(rows)
    md.append("")
    md.append("* TP-8 flow: rank 0's shard GEMM + shard top-K (raw values, ids, lse), the all-gather replaced "
              "by local copies of 7 other ranks' buffers (one GPU: no NCCL), merge + tree in one kernel.")
    for r in rows:
        if "gemm_whole_block_alone_us" in r:
            hg = (f", the head's Triton GEMM on it {r['head_triton_gemm_alone_us']:.1f} us"
                  if "head_triton_gemm_alone_us" in r else "")
            md.append(f"GEMM alone V {r['V']} bs {r['batch']}: cuBLAS on rows 1..L ({r['batch'] * L}) "
                      f"{r['gemm_alone_us']:.1f} us, on the whole block ({r['batch'] * BLOCK}) "
                      f"{r['gemm_whole_block_alone_us']:.1f} us{hg}")
    for r in rows:
        if "tp8_merge_by_row_graph_us" in r:
            md.append(f"TP-8 flow V {r['V']} bs {r['batch']}: merge of the L rows in one top-K {r['tp8_graph_us']:.1f} us, "
                      f"row by row {r['tp8_merge_by_row_graph_us']:.1f} us, same trees: {r['tp8_merges_agree']}")
    for r in rows:
        if "candidates" in r:
            md.append(f"candidates V {r['V']} bs {r['batch']} (graph us, replays == eager, head/GEMM per pair): "
                      + "; ".join(f"{k} {' '.join(str(x) for x in v)}" for k, v in r["candidates"].items()))
    log("\n".join(md))
    ok = [r for r in rows if "error" not in r]
    if ok:
        worst = max(ok, key=lambda r: r["ratio"])
        log(f"[target] head graph <= 1.3x GEMM at every point: {all(r['ratio'] <= 1.3 for r in ok) and len(ok) == len(rows)} "
            f"(worst {worst['ratio']:.3f} at V {worst['V']} bs {worst['batch']})")
    if "exact" in res:
        log(f"[target] exactness: {json.dumps(res['exact'])} ([trees, identical, same paths])")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_head.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.join(args.out, "table_head.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    log(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
