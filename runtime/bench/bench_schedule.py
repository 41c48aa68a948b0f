#!/usr/bin/env python3
"""DDTree budget schedule benchmark (issue #18): one CUDA graph per captured bs at its band's width.

  PYTHONPATH=runtime/src python3 runtime/bench/bench_schedule.py [--schedule 1:32,8:16,32:8,64:0]
        [--bs 1,2,4,8,12,16,24,32,40,48,56,64] [--L 7] [--V 163840] [--out DIR]
  python3 runtime/bench/bench_schedule.py --cpu-smoke      # tiny sizes, no GPU: checks that it executes

For every captured batch size bs (default: SGLang's speculative capture list up to
cuda_graph_max_bs 64), routed to its band exactly as the worker does
(``BudgetSchedule``: pad to the captured bs, then the band with the largest
MIN_BS <= it):
  * ONE CUDA graph, captured at the band's width, that builds the trees from the
    drafter's logits (``build_trees``, the worker's path; budget 0: the root alone,
    no drafter) AND the verify inputs (``verify.build_verify_inputs``, the mask into
    one preallocated buffer sized for the widest band, as SGLang's verify-mask
    buffer); all bands' graphs share one graph memory pool, as SGLang's runners do;
  * 3 replays with new logits / roots / seq_lens, each == the eager build (trees:
    tokens, parents, depths, visibility, valid; verify tensors);
  * replay time, vs today's single-budget build at the same budget and bs: the same
    trees + verify inputs captured alone (own pool, mask buffer sized for that
    budget), and the trees alone (``build_trees`` graph, bench_build.py's "builder
    graph" column in results-h200.txt).
Prints a table; exits 1 if any check fails.  GPU: ~1-2 minutes (most of it Triton
compiles for the three budgets).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from sglang_ddtree import build_trees  # noqa: E402
from sglang_ddtree.schedule import BudgetSchedule, parse_schedule  # noqa: E402
from sglang_ddtree.verify import build_verify_inputs  # noqa: E402
from sglang_ddtree.worker import root_only_trees  # noqa: E402

SGLANG_SPEC_BS_64 = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
T0 = time.perf_counter()


def log(*a):
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


class Step:
    """The static inputs + the step function (trees + verify inputs) of one bs."""

    def __init__(self, dev, bs, L, V, budget, mask_width, max_seq, gen):
        self.bs, self.L, self.V, self.budget = bs, L, V, budget
        self.N = budget + 1
        self.dev = dev
        dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
        self.dt = dt
        self.x = torch.randn(bs, L, V, device=dev, generator=gen).to(dt)
        self.root = torch.randint(0, V, (bs,), device=dev, generator=gen)
        self.max_seq = max_seq
        self.seq_lens = torch.randint(5, max_seq, (bs,), device=dev, generator=gen)
        # host upper bound of the committed lengths (as SGLang keeps it): the layout follows
        # the device seq_lens; the buffer is sized for this bound at the mask width
        self.seq_sum = bs * max_seq
        self.mask_buf = torch.zeros(self.seq_sum * mask_width + bs * mask_width * mask_width, dtype=torch.bool,
                                    device=dev)

    def refill(self, gen, scale=1.0):
        self.x.copy_((torch.randn(self.bs, self.L, self.V, device=self.dev, generator=gen) * scale).to(self.dt))
        self.root.copy_(torch.randint(0, self.V, (self.bs,), device=self.dev, generator=gen))
        self.seq_lens.copy_(torch.randint(5, self.max_seq, (self.bs,), device=self.dev, generator=gen))

    def __call__(self):
        if self.budget > 0:
            tr = build_trees(self.x, self.budget, self.root)
        else:
            tr = root_only_trees(self.root)
        vi = build_verify_inputs(tr, self.seq_lens, self.seq_sum, self.mask_buf)
        return tr, vi

    def trees_only(self):
        return build_trees(self.x, self.budget, self.root)


def flat(out):
    tr, vi = out
    n = vi.custom_mask.numel()
    return [tr.tokens, tr.parents, tr.depths, tr.visibility, tr.valid, vi.draft_token, vi.positions,
            vi.custom_mask[:n], vi.retrieve_index, vi.retrieve_next_token, vi.retrieve_next_sibling]


def capture(fn, pool=None, warmups=2):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    return g, out


def time_us(fn, reps, cuda):
    if cuda:
        fn()
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps * 1e3
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="1:32,8:16,32:8,64:0")
    ap.add_argument("--bs", default=",".join(map(str, SGLANG_SPEC_BS_64)))
    ap.add_argument("--L", type=int, default=7)
    ap.add_argument("--V", type=int, default=163840, help="vocabulary (shard) of the drafter logits")
    ap.add_argument("--max-seq", type=int, default=2048, help="committed length bound (mask buffer size)")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default=None, help="directory for results-schedule.txt")
    ap.add_argument("--cpu-smoke", action="store_true", help="CPU, tiny sizes, eager 'graphs' (checks it runs)")
    args = ap.parse_args()

    if args.cpu_smoke:
        os.environ.setdefault("SGLANG_DDTREE_DISABLE_TRITON", "1")
        dev = torch.device("cpu")
        args.V, args.max_seq, args.reps = min(args.V, 1000), min(args.max_seq, 64), min(args.reps, 3)
        if args.bs == ",".join(map(str, SGLANG_SPEC_BS_64)):
            args.bs = "1,4,8,16,32,64"
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device (use --cpu-smoke on a CPU machine)")
        dev = torch.device("cuda")
    cuda = dev.type == "cuda"
    sched = BudgetSchedule(parse_schedule(args.schedule), source=args.schedule)
    bs_list = sorted({int(b) for b in args.bs.split(",")})
    sched.set_cuda_graph_bs(bs_list)
    sched.check_graph_bands()
    log(sched.log_line())
    for i, band in enumerate(sched.bands):
        log(f"band {band.min_bs}:{band.budget}: width {band.width}, captured bs {sched.cuda_graph_bs_for_band(i)}")
    if cuda:
        log(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    gen = torch.Generator(device=dev).manual_seed(0)
    widest = sched.budget_max + 1
    pool = torch.cuda.graph_pool_handle() if cuda else None
    ok_all = True
    rows = []
    for bs in bs_list:
        band = sched.band(bs)
        B, N = band.budget, band.width
        step = Step(dev, bs, args.L, args.V, B, widest, args.max_seq, gen)
        if cuda:
            g, out = capture(step, pool=pool)
            replay = g.replay
        else:
            out = None
            replay = None
        ok = True
        for it in range(3):
            step.refill(gen, 1.0 + it)
            if cuda:
                g.replay()
                torch.cuda.synchronize()
                got = [t.clone() for t in flat(out)]
            else:
                got = [t.clone() for t in flat(step())]
            exp = flat(step())  # eager
            if cuda:
                torch.cuda.synchronize()
            same = len(got) == len(exp) and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, exp))
            ok &= same
            tr = step()[0]
            ok &= tuple(tr.tokens.shape) == (bs, N) and bool((tr.tokens[:, 0] == step.root).all())
            if B > 0 and it == 0:  # trees of a budget-B build: B valid nodes + root per request (V >> B)
                ok &= bool((tr.valid.sum(1) == min(B, args.V ** args.L) + 1).all())
        banded_us = time_us(replay if cuda else step, args.reps, cuda)
        single_us = trees_us = None
        if B > 0:
            single = Step(dev, bs, args.L, args.V, B, N, args.max_seq, gen)  # today's: own mask width, own pool
            if cuda:
                gs, _ = capture(single)
                single_us = time_us(gs.replay, args.reps, cuda)
                gt, _ = capture(single.trees_only, warmups=1)
                trees_us = time_us(gt.replay, args.reps, cuda)
                del gs, gt
            else:
                single_us = time_us(single, args.reps, cuda)
                trees_us = time_us(single.trees_only, args.reps, cuda)
        ok_all &= ok
        rows.append((bs, B, N, banded_us, single_us, trees_us, ok))
        log(f"bs {bs}: band {band.min_bs}:{B} width {N}: graph {banded_us:.1f} us, single-budget "
            f"{'-' if single_us is None else f'{single_us:.1f}'} us, replays == eager: {ok}")

    lines = [
        f"schedule {sched.spec}, L {args.L}, V {args.V}, {'CUDA graphs' if cuda else 'CPU smoke (eager)'}",
        "| bs | budget | width | graph replay (us) | single-budget (us) | ratio | trees only (us) | replays == eager |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for bs, B, N, b_us, s_us, t_us, ok in rows:
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        ratio = "-" if s_us is None else f"{b_us / s_us:.3f}"
        lines.append(f"| {bs} | {B} | {N} | {b_us:.1f} | {fmt(s_us)} | {ratio} | {fmt(t_us)} | {ok} |")
    lines.append(f"ALL CHECKS {'PASSED' if ok_all else 'FAILED'} ({time.perf_counter() - T0:.1f} s)")
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results-schedule.txt"), "w") as f:
            f.write(text + "\n")
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
