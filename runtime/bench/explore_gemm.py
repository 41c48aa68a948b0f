#!/usr/bin/env python3
"""The head's few-row LM-head GEMM (``triton_kernels.head_gemm``) against cuBLAS
(``torch.mm``), per block configuration: how ``CONFIG["head_gemm"]`` was chosen.

  PYTHONPATH=runtime/src python3 runtime/bench/explore_gemm.py [--out DIR] [--M 8 16 32 64] [--N 20480]

One line per (M, configuration): graph-replay time in alternation with cuBLAS's
graph (each replay between its own CUDA events; medians of 200 pairs), the
median ratio, the bandwidth of reading the weight, and how many logits differ
from cuBLAS's (another summation order can round differently).  Shapes: H 7168,
bf16, shard N (default 20480 = Kimi's 163840 over TP 8).  Results:
results-head-h200.txt (session of 2026-12-02, third)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))

# (BN, BK, stages, warps) per BM (rows padded to a power of 2, at least 16)
CONFIGS = {
    16: [(256, 128, 3, 4), (256, 128, 4, 4), (256, 64, 6, 4), (256, 128, 3, 8), (128, 256, 3, 4), (64, 256, 4, 4)],
    32: [(256, 64, 4, 8), (256, 128, 3, 4), (256, 128, 3, 8), (256, 64, 5, 4), (128, 128, 4, 4)],
    64: [(256, 64, 4, 8), (256, 64, 5, 8), (256, 64, 3, 8), (256, 64, 4, 4), (128, 128, 4, 4), (64, 128, 4, 4)],
    128: [(256, 64, 3, 8), (128, 64, 4, 8), (128, 128, 3, 8)],
    256: [(128, 64, 3, 8), (64, 64, 4, 8)],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--deadline", type=float, default=420, help="stop starting new configurations after this many s")
    ap.add_argument("--N", type=int, nargs="*", default=[20480])
    ap.add_argument("--M", type=int, nargs="*", default=[8, 16, 32, 64, 128, 224])
    args = ap.parse_args()
    from bench_head import capture_graph, interleaved_times, median
    from sglang_ddtree import triton_kernels as tk

    t0 = time.time()
    H = 7168
    res = []
    for N in args.N:
        g = torch.Generator(device="cuda").manual_seed(1)
        W = (torch.randn((N, H), device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        for M in args.M:
            BM = max(16, tk._next_pow2(M))
            x = torch.randn((M, H), device="cuda", generator=g).to(torch.bfloat16)
            ref = torch.mm(x, W.t())
            g_ref, _ = capture_graph(lambda: torch.mm(x, W.t()))
            for c in CONFIGS.get(BM, []):
                if time.time() - t0 > args.deadline:
                    print("deadline", flush=True)
                    break
                cfg = (BM,) + c
                r = {"N": N, "M": M, "cfg": list(c)}
                try:
                    out = tk.head_gemm(x, W, cfg)
                    torch.cuda.synchronize()
                    r["max_diff"] = float((out.float() - ref.float()).abs().max())
                    r["frac_diff"] = round(float((out != ref).float().mean()), 5)
                    gt, _ = capture_graph(lambda: tk.head_gemm(x, W, cfg))
                    ta, tb = interleaved_times(g_ref.replay, gt.replay, 200)
                    r["cublas_us"], r["triton_us"] = round(median(ta), 2), round(median(tb), 2)
                    r["ratio"] = round(median([b / a for a, b in zip(ta, tb)]), 3)
                    r["GBps"] = round(N * H * 2 / (median(tb) * 1e-6) / 1e9)
                    del gt
                except Exception as e:  # noqa: BLE001 -- e.g. a configuration past the shared memory
                    r["error"] = repr(e)[:160]
                print(json.dumps(r), flush=True)
                res.append(r)
            del g_ref
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "explore_gemm.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
