#!/usr/bin/env python3
"""Where the draft head's time goes, and which launch options shorten it (one device call).

  PYTHONPATH=runtime/src python3 runtime/bench/profile_head.py [--out DIR] [--batches 1,8,32,128]

For the shard vocabulary 20480 (H 7168, L 7, budget 32, bf16), per batch size:

1. the LM-head GEMM alone (``torch.mm`` on bs*7 rows, and on the whole bs*8
   block), CUDA-graph replay;
2. ``DraftTreeHead`` captured in a CUDA graph under each variant (``CONFIG``
   overrides / head arguments): median replay time, and 3 replays with new
   hidden states == ``build_trees`` on the head's own logits;
3. for the PROFILED variants, a ``torch.profiler`` trace of graph replays:
   each kernel's mean duration and the mean gap before it (launch latency the
   graph does not hide), and the whole replay's span; the same for the TP-8
   flow (the all-gather replaced by local copies).

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

from bench_head import (BLOCK, BUDGET, H, L, capture_graph, graph_exact, median_time, rand_case,  # noqa: E402
                        tp8_head)

V = 20480


def log(*a):
    print(*a, flush=True)


PROFILED = ("default", "torch row copy")


def variants(bs):
    """(name, CONFIG overrides, head keyword arguments); the PROFILED ones also
    get a kernel trace and the TP-8 flow."""
    out = [("default", {}, {}), ("torch row copy", {"row_copy": "torch"}, {}),
           ("tree 4 warps", {"tree_warps": 4}, {})]
    if bs * L > 7:
        out.append(("stream 4 warps", {"large": {"warps": 4}}, {}))
    if bs * BLOCK > 128:
        out.append(("whole-block GEMM", {}, {"full_rows_max": bs * BLOCK}))
    return out


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
        g, _ = capture_graph(lambda: torch.mm(hs, W.t()))
        row["gemm_us"] = round(median_time(g.replay, 300, rounds=5), 2)
        del g
        g, _ = capture_graph(lambda: torch.mm(hid, W.t()))
        row["gemm_block_us"] = round(median_time(g.replay, 300, rounds=5), 2)
        del g
        row["variants"] = {}
        for name, over, kw in variants(bs):
            saved = apply_config(over)
            try:
                head = DraftTreeHead(W, BUDGET, BLOCK, max_bs=bs, **kw)
                g, out = capture_graph(lambda: head(hid, ids))
                t = median_time(g.replay, 300, rounds=5)
                ok = graph_exact(g, out, hid, ids, W, head, bs, seed=bs)
                v = {"us": round(t, 2), "ratio": round(t / row["gemm_us"], 3), "exact": ok}
                if name in PROFILED:
                    v["profile"] = safe_profile(g.replay)
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
        log(f"[bs {bs}] gemm {row['gemm_us']} us, gemm on the whole block {row['gemm_block_us']} us")
        res.append(row)
        torch.cuda.empty_cache()
    log("| batch | GEMM (us) | " + " | ".join(n for n, _, _ in variants(128)) + " |")
    for r in res:
        cells = []
        for n, _, _ in variants(128):
            v = r["variants"].get(n)
            cells.append("-" if v is None else (v.get("error", "")[:20] or f"{v['us']} ({v['ratio']}){'' if v['exact'] else ' INEXACT'}"))
        log(f"| {r['batch']} | {r['gemm_us']} | " + " | ".join(cells) + " |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "profile_head.json"), "w") as f:
        json.dump(res, f, indent=1)
    log(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
