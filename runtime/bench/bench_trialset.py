#!/usr/bin/env python3
"""Trial-set benchmark (issue #37): what serving several candidates from one start costs.

  python3 runtime/bench/bench_trialset.py [--quick] [--out DIR]
        [--candidates 4 8 16 32 1:32,8:16,32:8,64:0] [--bs 1 8 32 128]
  python3 runtime/bench/bench_trialset.py --cpu-smoke [--out DIR]   # no GPU: tiny sizes, eager calls

Needs torch and triton only (plus this runtime's source, found next to this file).
For the candidates of a trial set (``sglang_ddtree.trialset``; the first one is the
configured active one) and the batch sizes given (the captured list), as the
worker builds them at start:

1. **control check** (CPU): the per-decode-step cost of ``ActiveCandidate.begin_step``
   against a real control file -- the default (a meeting every 16 steps, a stat at
   most every 100 ms), a stat at every step, and a meeting that reads, parses and
   switches; plus one ``os.stat``.  Process CPU time and wall time per step.
2. **Triton cache** (GPU): every head kernel of every draft budget compiled ahead
   into TRITON_CACHE_DIR by ``aot.fill_cache`` in parallel processes (cache hits are
   only loaded), so the rest runs without compiling (``--no-aot``: compile at first launch).
3. **memory per candidate** (GPU): the candidates added one at a time, in order;
   each adds the draft heads of budgets not built yet (``DraftTreeHead``, static
   buffers sized for the largest bs any candidate routes to the budget, as the
   worker sizes them) and one CUDA graph per (budget, bs) it routes that is not
   captured yet, all graphs in one memory pool (as SGLang's runners share one).
   Per candidate: graphs and heads added, the heads' static buffers (bytes),
   torch's allocated / reserved and the device's used memory (``cudaMemGetInfo``:
   graph instantiation memory included) before -> after.  Beside it, the MODEL of
   what SGLang's triton attention backend adds per extra verify width / draft budget
   (``--context-len``): the runner's kv_indices (int64, max_bs * width * context)
   and verify mask (uint8, max_bs * width * (context + width)) -- not measured here
   (no SGLang on the device image).
4. **exactness**: every graph replayed with new hidden states / roots == the same
   head called eagerly (tokens, parents, depths, visibility, valid).
5. **replay time** per bs: each candidate's head graph (its budget at that bs)
   replayed alone, back to back, vs the candidates' distinct graphs at that bs
   replayed in alternation, one step each in turn (what a switch every step would
   cost; candidates routing the bs to the same budget share one graph); each
   replay between its own CUDA events; medians.

Prints a table and writes ``bench_trialset.json`` (+ ``results-trialset.txt``) into
``--out``.  H200: ~1.5-2.5 min with a cold Triton cache (most of it the parallel
compile), ``--quick`` ~1 min.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

DEFAULT_CANDIDATES = ["4", "8", "16", "32", "1:32,8:16,32:8,64:0"]
DEFAULT_BS = [1, 8, 32, 128]
QUICK_CANDIDATES = ["4", "16", "1:16,8:4"]
QUICK_BS = [1, 8]
T0 = time.perf_counter()


def log(*a):
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", nargs="+", default=None,
                    help=f"budgets and schedules, the first = the active one (default {' '.join(DEFAULT_CANDIDATES)})")
    ap.add_argument("--bs", nargs="+", type=int, default=None, help=f"captured batch sizes (default {DEFAULT_BS})")
    ap.add_argument("--shard", type=int, default=20480, help="LM-head vocabulary rows on this rank (V / TP)")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--block", type=int, default=8, help="drafter block (L = block - 1)")
    ap.add_argument("--reps", type=int, default=None, help="replays per timing (default 300; --quick 100)")
    ap.add_argument("--control-steps", type=int, default=200_000, help="decode steps simulated for the check's cost")
    ap.add_argument("--context-len", type=int, default=32768, help="max context length for the backend memory model")
    ap.add_argument("--aot-jobs", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--no-aot", action="store_true", help="no ahead-of-time cache fill (compile at first launch)")
    ap.add_argument("--quick", action="store_true", help=f"candidates {' '.join(QUICK_CANDIDATES)}, bs {QUICK_BS}, "
                                                         f"100 replays")
    ap.add_argument("--cpu-smoke", action="store_true", help="CPU, tiny sizes, eager calls instead of graphs")
    ap.add_argument("--out", default=None, help="directory for bench_trialset.json and results-trialset.txt")
    args = ap.parse_args(argv)
    if args.candidates is None:
        args.candidates = QUICK_CANDIDATES if args.quick else DEFAULT_CANDIDATES
    if args.bs is None:
        args.bs = QUICK_BS if args.quick else DEFAULT_BS
    if args.reps is None:
        args.reps = 100 if args.quick else 300
    if args.cpu_smoke:
        args.shard, args.hidden = min(args.shard, 1000), min(args.hidden, 64)
        args.reps = min(args.reps, 3)
        args.control_steps = min(args.control_steps, 50_000)
    args.bs = sorted(set(args.bs))
    return args


def build_plan(candidates, bs_list):
    """The trial set and, per bs, each candidate's budget there (SGLang's routing)."""
    from sglang_ddtree.trialset import TrialSet

    ts = TrialSet.from_json({"candidates": list(candidates)})
    ts.set_cuda_graph_bs(bs_list)
    ts.check_graph_bands()
    budget_at = {c.name: {bs: s.budget_for(bs) for bs in bs_list} for c, s in zip(ts.candidates, ts.schedules)}
    return ts, budget_at


# ------------------------------------------------------------------ 1. the control check
def control_check_cost(steps: int) -> dict:
    """CPU cost per decode step of the live switch's check (``ActiveCandidate.begin_step``)."""
    from sglang_ddtree.trialset import ActiveCandidate, ControlFile, TrialSet

    ts = TrialSet.from_json({"candidates": ["4", "8", "16", "1:16,3:4,16:0"], "active": "16"})
    out = {}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "control.json")

        def write(active):
            with open(path + ".tmp", "w") as f:
                json.dump({"active": active}, f)
            os.replace(path + ".tmp", path)

        write("16")
        for name, every, interval_s, n in (("default: meeting every 16 steps, stat <= every 100 ms", 16, 0.1, steps),
                                           ("a stat every step (every_steps 1, interval 0)", 1, 0.0, steps // 10)):
            ac = ActiveCandidate(ts, control=ControlFile(path, interval_s), every_steps=every)
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                ac.begin_step()
            out[name] = {"cpu_us_per_step": (time.process_time() - c0) / n * 1e6,
                         "wall_us_per_step": (time.perf_counter() - w0) / n * 1e6,
                         "steps": n, "stats": ac.control.stats, "reads": ac.control.reads}
        # a meeting that reads, parses and switches (the file renamed over before each)
        ac = ActiveCandidate(ts, control=ControlFile(path, 0.0), every_steps=1)
        names = ["4", "8", "1:16,3:4,16:0", "16"]
        costs = []
        for i in range(200):
            write(names[i % 4])
            c0 = time.perf_counter()
            ac.begin_step()
            costs.append((time.perf_counter() - c0) * 1e6)
        assert len(ac.switches) == 200, "every meeting should have switched"
        out["a meeting that switches (stat + read + parse)"] = {"wall_us_median": statistics.median(costs)}
        c0 = time.perf_counter()
        for _ in range(2000):
            os.stat(path)
        out["os.stat alone"] = {"wall_us": (time.perf_counter() - c0) / 2000 * 1e6}
    return out


# ------------------------------------------------------------------ 2. the Triton cache
def fill_triton_cache(args, budgets, capability) -> dict:
    """``python -m sglang_ddtree.aot`` (as a release's stage runs it: no GPU visible, one
    process per kernel) into the cache this process uses; hits are only loaded."""
    import subprocess

    from sglang_ddtree import aot

    arch = f"sm_{capability[0]}{capability[1]}"
    cache = aot.cache_dir()
    os.environ["TRITON_CACHE_DIR"] = cache  # this process reads the same directory
    log(f"2. Triton cache: filling {cache} for {arch} (budgets {budgets}, bs {args.bs}, {args.aot_jobs} processes)")
    src = os.path.join(HERE, "..", "src")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([src] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sglang_ddtree.aot", "--arch", arch,
                        "--budgets", ",".join(map(str, budgets)), "--block", str(args.block),
                        "--vocab-shard", str(args.shard), "--hidden", str(args.hidden),
                        "--capture-bs", ",".join(map(str, args.bs)), "--jobs", str(args.aot_jobs), "--out", cache],
                       env=env, capture_output=True, text=True)
    wall = round(time.perf_counter() - t, 2)
    try:
        fill = json.loads(r.stdout.strip().splitlines()[-1]).get("fill", {})
    except (ValueError, IndexError):
        fill = {"error": (r.stdout + r.stderr)[-2000:]}
    log(f"   {wall} s: {json.dumps(fill)[:300]}")
    return dict(fill, wall_s=wall, cache=cache, arch=arch, rc=r.returncode)


# ------------------------------------------------------------------ helpers (GPU)
def capture_graph(fn, pool, warmups=2):
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def mem_snapshot(cuda: bool) -> dict:
    import torch

    if not cuda:
        return {}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "device_used": total - free}


def head_buffer_bytes(head) -> int:
    return sum(t.numel() * t.element_size() for t in (head._out or {}).values())


def backend_model_bytes(max_bs: int, width: int, context_len: int) -> dict:
    """SGLang 0.5.23's triton backend, per graph runner (init_cuda_graph_state):
    kv_indices int64 [max_bs * width * context], verify mask uint8 [max_bs * width * (context + width)]
    (the target's verify widths; a draft budget's runner has no verify mask)."""
    return {"kv_indices": max_bs * width * context_len * 8, "verify_mask": max_bs * width * (context_len + width)}


class Slot:
    """One (budget, bs) head call with its static inputs, and its graph."""

    def __init__(self, head, bs, block, hidden, device, gen, dtype):
        import torch

        self.head, self.bs, self.block = head, bs, block
        self.hid = torch.randn(bs * block, hidden, device=device, generator=gen).to(dtype)
        self.ids = torch.randint(0, head.Vs, (bs * block,), device=device, generator=gen)
        self.graph = None

    def call(self):
        return self.head(self.hid, self.ids)

    def refill(self, gen, scale):
        import torch

        self.hid.copy_((torch.randn(self.hid.shape, device=self.hid.device, generator=gen) * scale).to(self.hid.dtype))
        self.ids.copy_(torch.randint(0, self.head.Vs, self.ids.shape, device=self.ids.device, generator=gen))

    def replay(self):
        if self.graph is not None:
            self.graph.replay()
        else:  # CPU smoke: the call itself
            self.call()


F = ("tokens", "parents", "depths", "visibility", "valid")


def exact(slot, gen, cuda, rounds=2) -> bool:
    """Replays with new inputs == the same head called eagerly."""
    import torch

    ok = True
    for it in range(rounds):
        slot.refill(gen, 1.0 + it)
        slot.replay()
        if cuda:
            torch.cuda.synchronize()
        got = [getattr(slot.head.trees(slot.bs), f).clone() for f in F]
        ref = slot.call()
        ok &= all(torch.equal(a, getattr(ref, f)) for a, f in zip(got, F))
    return bool(ok)


def timed_runs(order, reps, cuda):
    """``order``: slots to replay in turn, ``reps`` rounds of it; each replay between its
    own events (CPU: perf_counter).  Returns {id(slot): [us, ...]}."""
    import torch

    out = {id(s): [] for s in order}
    for s in order:  # warm-up
        s.replay()
    n = reps * len(order)
    if cuda:
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        ev[0].record()
        for i in range(n):
            order[i % len(order)].replay()
            ev[i + 1].record()
        torch.cuda.synchronize()
        for i in range(n):
            out[id(order[i % len(order)])].append(ev[i].elapsed_time(ev[i + 1]) * 1e3)
    else:
        for i in range(n):
            t = time.perf_counter()
            order[i % len(order)].replay()
            out[id(order[i % len(order)])].append((time.perf_counter() - t) * 1e6)
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ.setdefault("SGLANG_DDTREE_DISABLE_TRITON", "1")
    import torch

    from sglang_ddtree.head import DraftTreeHead

    cuda = not args.cpu_smoke
    if cuda and not torch.cuda.is_available():
        sys.exit("no CUDA device (use --cpu-smoke on a CPU machine)")
    ts, budget_at = build_plan(args.candidates, args.bs)
    doc = {"args": vars(args), "candidates": ts.names, "budget_at": budget_at,
           "verify_plan": [{"width": w, "bs": bs, "candidates": u} for w, bs, u in ts.verify_plan()],
           "draft_plan": [{"budget": b, "bs": bs, "candidates": u} for b, bs, u in ts.draft_plan()]}
    log(ts.log_line())
    for w, bs, users in ts.verify_plan():
        log(ts.width_line(w, bs, users))
    for b, bs, users in ts.draft_plan():
        log(ts.draft_line(b, bs, users))

    log("1. control check: CPU cost per decode step")
    doc["control_check"] = control_check_cost(args.control_steps)
    for k, v in doc["control_check"].items():
        log(f"   {k}: {json.dumps({a: round(b, 3) if isinstance(b, float) else b for a, b in v.items()})}")

    if cuda:
        log(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
        if not args.no_aot:
            doc["aot_fill"] = fill_triton_cache(args, ts.draft_budgets, torch.cuda.get_device_capability())
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    W = (torch.randn(args.shard, args.hidden, device=dev, generator=gen) / args.hidden ** 0.5).to(dtype)
    pool = torch.cuda.graph_pool_handle() if cuda else None
    # each budget's head sized for the largest bs any candidate routes to it (as the worker)
    head_cap = {b: max(bs) for b, bs, _ in ts.draft_plan() if bs}

    log("3. memory per candidate (added in order; graphs share one pool)")
    heads, slots, mem_rows = {}, {}, []
    base = mem_snapshot(cuda)
    for c in ts.candidates:
        before = mem_snapshot(cuda)
        new_heads, new_graphs, head_bytes = [], [], 0
        t = time.perf_counter()
        for bs in args.bs:
            b = budget_at[c.name][bs]
            if b <= 0 or (b, bs) in slots:
                continue
            if b not in heads:
                heads[b] = DraftTreeHead(W, b, args.block, vocab_size=args.shard, max_bs=head_cap[b])
                new_heads.append(b)
                head_bytes += head_buffer_bytes(heads[b])
            s = Slot(heads[b], bs, args.block, args.hidden, dev, gen, dtype)
            if cuda:
                s.graph = capture_graph(s.call, pool)
            slots[(b, bs)] = s
            new_graphs.append([b, bs])
        after = mem_snapshot(cuda)
        row = {"candidate": c.name, "new_heads": new_heads, "new_graphs": new_graphs, "head_buffer_bytes": head_bytes,
               "build_s": round(time.perf_counter() - t, 3)}
        for k in after:
            row[f"{k}_delta"] = after[k] - before[k]
        mem_rows.append(row)
        log(f"   {c.name}: heads {new_heads}, graphs {new_graphs}, head buffers {head_bytes / 2**20:.3f} MiB"
            + ("".join(f", {k} {row[f'{k}_delta'] / 2**20:+.1f} MiB" for k in after)))
    doc["memory"] = {"per_candidate": mem_rows, "total": {k: mem_snapshot(cuda)[k] - base[k] for k in base}}
    # the model of SGLang's per-width / per-budget backend buffers (not measured here)
    model = []
    for w, bs, users in ts.verify_plan():
        if bs:
            model.append({"what": f"verify width {w}", "max_bs": max(bs),
                          **backend_model_bytes(max(bs), w, args.context_len)})
    for b, bs, users in ts.draft_plan():
        if bs:
            m = backend_model_bytes(max(bs), args.block, args.context_len)
            model.append({"what": f"draft budget {b}", "max_bs": max(bs), "kv_indices": m["kv_indices"],
                          "verify_mask": 0})
    doc["memory"]["sglang_triton_backend_model"] = {"context_len": args.context_len, "per_state": model}

    log("4. exactness: replays == eager calls")
    exact_gen = torch.Generator(device=dev).manual_seed(1)
    doc["exact"] = {f"{b}@{bs}": exact(s, exact_gen, cuda) for (b, bs), s in sorted(slots.items())}
    all_exact = all(doc["exact"].values())
    log(f"   {sum(doc['exact'].values())} of {len(doc['exact'])} graphs exact")

    log(f"5. replay time: each candidate alone vs all in alternation ({args.reps} replays each)")
    rows = []
    for bs in args.bs:
        order = [(c.name, slots.get((budget_at[c.name][bs], bs))) for c in ts.candidates]
        live = [(n, s) for n, s in order if s is not None]
        # candidates routing bs to the same budget share its graph: timed once, replayed once per turn
        distinct = list({id(s): s for _, s in live}.values())
        alone_by_slot = {id(s): statistics.median(timed_runs([s], args.reps, cuda)[id(s)]) for s in distinct}
        alone = {n: alone_by_slot[id(s)] for n, s in live}
        alt_times = timed_runs(distinct, args.reps, cuda) if distinct else {}
        for n, s in order:
            b = budget_at[n][bs]
            if s is None:
                rows.append({"bs": bs, "candidate": n, "budget": b, "alone_us": None, "alternating_us": None,
                             "ratio": None})
                continue
            a = statistics.median(alt_times[id(s)])
            rows.append({"bs": bs, "candidate": n, "budget": b, "alone_us": alone[n], "alternating_us": a,
                         "ratio": a / alone[n] if alone[n] else None})
        if live:
            step_alone = statistics.mean(alone[n] for n, _ in live)
            step_alt = statistics.mean(statistics.median(alt_times[id(s)]) for _, s in live)
            log(f"   bs {bs}: mean over candidates alone {step_alone:.1f} us, alternating {step_alt:.1f} us "
                f"({len(distinct)} distinct graphs in turn)")
    doc["replay"] = rows

    fmt = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    lines = [f"trial set {', '.join(ts.names)}; shard {args.shard}, H {args.hidden}, block {args.block}, "
             f"{'CUDA graphs' if cuda else 'CPU smoke (eager calls)'}",
             "", "control check (CPU, per decode step):"]
    for k, v in doc["control_check"].items():
        lines.append(f"  {k}: " + ", ".join(f"{a} {fmt(b, 3) if isinstance(b, float) else b}" for a, b in v.items()))
    lines += ["", "| candidate | new heads (budgets) | new graphs (budget@bs) | head buffers (KiB) | "
                  "allocated (MiB) | reserved (MiB) | device used (MiB) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in mem_rows:
        mib = lambda k: fmt(r[k] / 2**20, 2) if k in r else "-"  # noqa: E731
        lines.append(f"| {r['candidate']} | {','.join(map(str, r['new_heads'])) or '-'} | "
                     f"{' '.join(f'{b}@{bs}' for b, bs in r['new_graphs']) or '-'} | "
                     f"{r['head_buffer_bytes'] / 1024:.1f} | {mib('allocated_delta')} | {mib('reserved_delta')} | "
                     f"{mib('device_used_delta')} |")
    lines += ["", f"model, SGLang's triton backend per extra state (context {args.context_len}; not measured):",
              "| state | max bs | kv_indices (MiB) | verify mask (MiB) |", "| --- | --- | --- | --- |"]
    for m in model:
        lines.append(f"| {m['what']} | {m['max_bs']} | {m['kv_indices'] / 2**20:.1f} | {m['verify_mask'] / 2**20:.1f} |")
    lines += ["", "| bs | candidate | budget | alone (us) | alternating (us) | alternating / alone |",
              "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['bs']} | {r['candidate']} | {r['budget']} | {fmt(r['alone_us'])} | "
                     f"{fmt(r['alternating_us'])} | {fmt(r['ratio'], 3)} |")
    lines.append(f"graphs exact: {sum(doc['exact'].values())}/{len(doc['exact'])}; "
                 f"{'ALL CHECKS PASSED' if all_exact else 'CHECKS FAILED'} ({time.perf_counter() - T0:.1f} s)")
    text = "\n".join(lines)
    print(text, flush=True)
    doc["ok"] = all_exact
    doc["elapsed_s"] = round(time.perf_counter() - T0, 2)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_trialset.json"), "w") as f:
            json.dump(doc, f, indent=1, default=str)
        with open(os.path.join(args.out, "results-trialset.txt"), "w") as f:
            f.write(text + "\n")
    return 0 if all_exact else 1


if __name__ == "__main__":
    sys.exit(main())
