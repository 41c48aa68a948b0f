#!/usr/bin/env python3
"""Where the draft head's time goes, and which launch options shorten it (one device call).

  PYTHONPATH=runtime/src python3 runtime/bench/profile_head.py [--out DIR] [--batches 1,8,32,128]

For the shard vocabulary 20480 (H 7168, L 7, budget 32, bf16), per batch size:

1. the LM-head GEMM alone (``torch.mm`` on bs*7 rows, and on the whole bs*8
   block), CUDA-graph replay, and its kernel; above 16 requests also the
   gather_rows + GEMM graph (the head's GEMM input), against the GEMM alone;
2. ``DraftTreeHead`` captured in a CUDA graph under each variant (``CONFIG``
   overrides / head arguments): replay time interleaved with the GEMM alone's
   (``bench_head.interleaved_times``; ratio = median of the pairs' ratios); 3
   replays with new hidden states == ``build_trees`` on the head's own logits
   (under the variant's configuration, and under the default one); a
   ``torch.profiler`` trace of graph replays: each kernel's mean duration and
   the mean gap before it (launch latency the graph does not hide), the whole
   replay's span and the tail (span less the GEMM: what the variants change,
   free of the GEMM's drift); for TP8_FLOW variants the same for the TP-8
   flow (the all-gather replaced by local copies);
3. (batches 1, 8, 32) the tree kernel alone on fixed top-K lists (L 7),
   register path (4 and 8 warps) and through memory (== the torch beam).

Its runs on the H200 and what they decided: results-head-h200.txt.
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
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from bench_head import (BLOCK, BUDGET, F, H, L, capture_graph, graph_exact, median, median_time,  # noqa: E402
                        interleaved_times, rand_case, tp8_head)

V = 20480


def log(*a):
    print(*a, flush=True)


TP8_FLOW = ("default",)
# the tree kernel alone: (register path, warps)
TREE_ALONE = ((False, 8), (True, 4), (True, 8))


def variants(bs):
    """(name, CONFIG overrides, head keyword arguments); every variant gets a
    kernel trace, the TP8_FLOW ones also the TP-8 flow.  (Runs a-e of
    results-head-h200.txt timed other variants: PDL, warp counts, rank-based
    selection, torch's row copy, stream + select in one launch, select
    options, steps of the tree kernel.)"""
    return [("default", {}, {}), ("tree 8 warps", {"tree_warps": 8}, {}),
            ("tree via memory", {"tree_gather": False}, {})]


def tree_alone(bs, gather):
    """The tree kernel alone on fixed top-K lists of L rows (graph replay, us) and == the torch beam."""
    from sglang_ddtree import triton_kernels as tk
    from sglang_ddtree.reference import top_log_probs
    from sglang_ddtree.tree import build_trees_from_top

    gen = torch.Generator(device="cuda").manual_seed(L)
    x = torch.randn(bs, L, 2048, device="cuda", generator=gen) * 3
    lp, ids = top_log_probs(x, BUDGET)
    root = torch.arange(bs, device="cuda")
    g, out = capture_graph(lambda: tk.build_trees_from_top_triton(lp, ids, BUDGET, root, gather=gather))
    t = median_time(g.replay, 300, rounds=5)
    ref = build_trees_from_top(lp, ids, BUDGET, root)
    ok = all(torch.equal(getattr(out, f), getattr(ref, f)) for f in F)
    del g
    return round(t, 2), ok


def exact_vs_default(head, hid, ids, out, bs, default_config):
    """The last replay's trees == build_trees under the default configuration
    on the head's logits (a reference that does not share the variant's kernels)."""
    from sglang_ddtree import build_trees
    from sglang_ddtree import triton_kernels as tk

    cur = json.loads(json.dumps(tk.CONFIG))
    restore(default_config)
    try:
        ref = build_trees(head.logits(hid), BUDGET, ids.view(bs, BLOCK)[:, 0])
    finally:
        restore(cur)
    return all(torch.equal(getattr(out, f), getattr(ref, f)) for f in F)


def apply_config(over):
    from sglang_ddtree import triton_kernels as tk

    saved = json.loads(json.dumps(tk.CONFIG))
    for k, v in over.items():
        if isinstance(v, dict):
            tk.CONFIG[k] = dict(tk.CONFIG[k], **v)
        else:
            tk.CONFIG[k] = v
    return saved


def restore(saved):
    from sglang_ddtree import triton_kernels as tk

    tk.CONFIG.clear()
    tk.CONFIG.update(saved)


def kernel_profile(replay, n=40):
    """Mean duration per kernel of one replay, mean gap before it, mean span."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            replay()
        torch.cuda.synchronize()
    evs = []
    for e in prof.events():
        if "CUDA" in str(getattr(e, "device_type", "")) and e.time_range.elapsed_us() > 0:
            evs.append((e.time_range.start, e.time_range.end, e.name))
    evs.sort()
    if not evs or len(evs) % n:
        return {"events": len(evs), "error": "events do not split into replays"}
    per = len(evs) // n
    names = [evs[i][2][:60] for i in range(per)]
    dur = [0.0] * per
    gap = [0.0] * per
    span = 0.0
    for r in range(n):
        chunk = evs[r * per:(r + 1) * per]
        span += chunk[-1][1] - chunk[0][0]
        for i, (s, e, _) in enumerate(chunk):
            dur[i] += e - s
            if i:
                gap[i] += s - chunk[i - 1][1]
    return {"span_us": round(span / n, 2),
            "kernels": [{"name": names[i], "us": round(dur[i] / n, 2), "gap_before_us": round(gap[i] / n, 2)}
                        for i in range(per)]}


def safe_profile(replay):
    try:
        return kernel_profile(replay)
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)[:200]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--batches", default="1,8,32,128")
    args = ap.parse_args()
    import triton

    from sglang_ddtree.head import DraftTreeHead

    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    t0 = time.time()
    W, _, _ = rand_case(V, 1, 7 + V, 1.0)
    res = []
    for bs in (int(b) for b in args.batches.split(",")):
        _, hid, ids = rand_case(V, bs, 1000 + bs, 1.0)
        hs = hid.view(bs, BLOCK, H)[:, 1:].reshape(bs * L, H).contiguous()
        row = {"batch": bs}
        g_gemm, _ = capture_graph(lambda: torch.mm(hs, W.t()))
        row["gemm_us"] = round(median_time(g_gemm.replay, 300, rounds=5), 2)
        row["gemm_profile"] = safe_profile(g_gemm.replay)
        g, _ = capture_graph(lambda: torch.mm(hid, W.t()))
        row["gemm_block_us"] = round(median_time(g.replay, 300, rounds=5), 2)
        del g
        if bs * BLOCK > 128:  # the head's own GEMM input: rows 1..L gathered by one launch
            from sglang_ddtree.triton_kernels import gather_rows

            g, _ = capture_graph(lambda: torch.mm(gather_rows(hid, 0, bs, BLOCK), W.t()))
            ta, tb = interleaved_times(g_gemm.replay, g.replay, 300)
            row["gather_gemm_interleaved_us"] = [round(median(ta), 2), round(median(tb), 2)]
            row["gather_gemm_profile"] = safe_profile(g.replay)
            del g
        log(f"[bs {bs}] gemm alone {row['gemm_us']} us: {row['gemm_profile']}")
        if "gather_gemm_interleaved_us" in row:
            log(f"[bs {bs}] gemm alone vs gather + gemm, interleaved: {row['gather_gemm_interleaved_us']}; "
                f"{row['gather_gemm_profile']}")
        row["variants"] = {}
        for name, over, kw in variants(bs):
            saved = apply_config(over)
            try:
                head = DraftTreeHead(W, BUDGET, BLOCK, max_bs=bs, **kw)
                g, out = capture_graph(lambda: head(hid, ids))
                ta, tb = interleaved_times(g_gemm.replay, g.replay, 300)
                t = median(tb)
                ok = graph_exact(g, out, hid, ids, W, head, bs, seed=bs)
                v = {"us": round(t, 2), "gemm_interleaved_us": round(median(ta), 2),
                     "ratio": round(median([y / x for x, y in zip(ta, tb)]), 3), "exact": ok,
                     "exact_vs_default": exact_vs_default(head, hid, ids, out, bs, saved)}
                v["profile"] = safe_profile(g.replay)
                if "kernels" in v["profile"]:  # the span less the GEMM (the longest kernel)
                    v["tail_us"] = round(v["profile"]["span_us"] - max(k["us"] for k in v["profile"]["kernels"]), 2)
                if name in TP8_FLOW:
                    del g
                    h8 = tp8_head(W, bs, **kw)  # the TP-8 flow, all-gather by local copies
                    g, _ = capture_graph(lambda: h8(hid, ids))
                    v["tp8_us"] = round(median_time(g.replay, 300, rounds=5), 2)
                    v["tp8_profile"] = safe_profile(g.replay)
                del g
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                v = {"error": repr(e)[:300]}
            finally:
                restore(saved)
            row["variants"][name] = v
            log(f"[bs {bs}] {name}: " + json.dumps({k: x for k, x in v.items() if not k.endswith("profile")}))
            for pk in ("profile", "tp8_profile"):
                if pk in v and "kernels" in v[pk]:
                    log(f"    {pk} span {v[pk]['span_us']} us: " + "; ".join(
                        f"{k['name']} {k['us']} (+{k['gap_before_us']})" for k in v[pk]["kernels"]))
        if bs in (1, 8, 32):
            row["tree_alone"] = {}
            for reg, w in TREE_ALONE:
                saved = apply_config({"tree_warps": w})
                try:
                    row["tree_alone"][f"{'registers' if reg else 'memory'} {w}w"] = tree_alone(bs, reg)
                except Exception as e:  # noqa: BLE001
                    row["tree_alone"][f"{'registers' if reg else 'memory'} {w}w"] = repr(e)[:200]
                finally:
                    restore(saved)
            log(f"[bs {bs}] tree kernel alone (us, == torch beam): {row['tree_alone']}")
        log(f"[bs {bs}] gemm {row['gemm_us']} us, gemm on the whole block {row['gemm_block_us']} us")
        del g_gemm
        res.append(row)
        torch.cuda.empty_cache()
    log("| batch | GEMM (us) | " + " | ".join(n for n, _, _ in variants(128)) + " |")
    for r in res:
        cells = []
        for n, _, _ in variants(128):
            v = r["variants"].get(n)
            cells.append("-" if v is None else (v.get("error", "")[:20] or f"{v['us']} ({v['ratio']}, tail "
                                                 f"{v.get('tail_us')}){'' if v['exact'] else ' INEXACT'}"))
        log(f"| {r['batch']} | {r['gemm_us']} | " + " | ".join(cells) + " |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "profile_head.json"), "w") as f:
        json.dump(res, f, indent=1)
    log(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
