#!/usr/bin/env python3
"""Our verify tensors through SGLang 0.5.23's own Triton kernels, on the GPU.

The device image cannot import sglang (its `sglang.srt.utils` pulls zmq,
msgspec, orjson, ... and SGLang wants torch 2.14.1), so this script loads the
three kernel modules the DDTree worker relies on from SGLang's source files,
unchanged, with only the platform helpers they import stubbed (CUDA = True):

  sglang/kernels/ops/speculative/spec_tree.py   verify_tree_greedy_triton
  sglang/kernels/ops/speculative/eagle.py       fill_accept_out_cache_loc_func
  sglang/kernels/ops/speculative/cache_locs.py  fill_front_out_cache_loc_func
                                                (assign_extend_cache_locs, which
                                                Triton's CPU interpreter cannot run)
  sglang/srt/speculative/eagle_worker_common.py _compact_accept_to_front (by AST)

For random trees built on the GPU by build_trees (one-launch and two-launch
configurations, V up to 163840): SGLang's greedy tree verify == our walk,
SGLang's KV-move indices == kv_move_plan, SGLang's front packing == the
window contract, compaction == ours; then build_trees + tree_verify_fields +
SGLang's verify + KV-move indices captured in one CUDA graph and replayed with
new logits / posteriors == eager.

  scripts: runtime/bench/stage-sglang-kernels DIR   (copies the files from .venv-sglang)
  device:  python3 runtime/bench/gpu_sglang_kernels.py --sglang-src DIR
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import random
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from sglang_ddtree import build_trees  # noqa: E402
from sglang_ddtree.verify import accept_walk, compact_accept_to_front, kv_move_plan, to_eagle_accept  # noqa: E402
from sglang_ddtree.worker import tree_verify_fields  # noqa: E402

from bench_build import capture_graph  # noqa: E402  (same folder)

KERNEL_FILES = ("spec_tree.py", "eagle.py", "cache_locs.py")
STUBS = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/utils.py": (
        "def is_cuda():\n    return True\n"
        "def is_cpu():\n    return False\n"
        "is_hip = is_musa = is_npu = is_xpu = is_cpu\n"
        "def next_power_of_2(n: int):\n    return 1 << (n - 1).bit_length() if n > 0 else 1\n"
    ),
    "sglang/srt/platforms/__init__.py": "current_platform = None\n",
    "sglang/srt/platforms/interface.py": (
        "def reject_out_of_tree_path(*a, **k):\n    raise RuntimeError('out-of-tree path')\n"
    ),
    "sglang/kernels/__init__.py": "",
    "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/speculative/__init__.py": "",
    # spec_tree imports the JIT CUDA tree module on CUDA; only the Triton verify is used here
    "sglang/kernels/ops/speculative/tree.py": "build_tree_kernel_efficient = None\nverify_tree_greedy = None\n",
}


def log(*a):
    print(*a, flush=True)


def load_sglang(src_dir):
    root = tempfile.mkdtemp(prefix="sgl-kernels-")
    for rel, text in STUBS.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    for name in KERNEL_FILES:
        with open(os.path.join(src_dir, name)) as f:
            text = f.read()
        with open(os.path.join(root, "sglang/kernels/ops/speculative", name), "w") as f:
            f.write(text)
    sys.path.insert(0, root)
    spec_tree = importlib.import_module("sglang.kernels.ops.speculative.spec_tree")
    eagle = importlib.import_module("sglang.kernels.ops.speculative.eagle")
    cache_locs = importlib.import_module("sglang.kernels.ops.speculative.cache_locs")
    with open(os.path.join(src_dir, "eagle_worker_common.py")) as f:
        tree = ast.parse(f.read())
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_compact_accept_to_front"][0]
    ns = {"torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "eagle_worker_common.py", "exec"), ns)
    return (spec_tree.verify_tree_greedy_triton, eagle.fill_accept_out_cache_loc_func,
            cache_locs.fill_front_out_cache_loc_func, ns["_compact_accept_to_front"])


def posterior_for(tr, rng, V, hit, gen):
    """Target tokens per node: a child's token with probability ``hit``, else random."""
    bs, N = tr.tokens.shape
    post = torch.randint(0, V, (bs, N), generator=gen)
    par, val, tok = tr.parents.cpu(), tr.valid.cpu(), tr.tokens.cpu()
    for b in range(bs):
        kids = {}
        for c in range(1, N):
            if val[b, c]:
                kids.setdefault(int(par[b, c]), []).append(int(tok[b, c]))
        for i, ks in kids.items():
            if rng.random() < hit:
                post[b, i] = rng.choice(ks)
    return post


def one_case(sgl, dev, rng, bs, L, V, B, hit):
    verify_greedy, fill_accept, fill_front, sgl_compact = sgl
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    N = B + 1
    D = min(L, B)
    x = (torch.randn(bs, L, V, generator=gen) * 3).to(dev, torch.bfloat16)
    roots = torch.randint(0, V, (bs,), generator=gen).to(dev)
    tr = build_trees(x, B, roots)
    seq = torch.randint(1, 300, (bs,), generator=gen).to(dev)
    f = tree_verify_fields(tr, seq, D, seq_lens_sum=int(seq.sum()))
    post = posterior_for(tr, rng, V, hit, gen).to(dev)
    ours = to_eagle_accept(accept_walk(tr, post, D), N)
    predict = torch.zeros(bs * N, dtype=torch.int32, device=dev)
    acc = torch.full((bs, D + 1), -1, dtype=torch.int32, device=dev)
    num = torch.empty(bs, dtype=torch.int32, device=dev)
    verify_greedy(predict, acc, num, f["draft_token"].view(bs, N), f["retrieve_index"],
                  f["retrieve_next_token"], f["retrieve_next_sibling"], post)
    errs = []
    if not torch.equal(acc, ours[1]):
        errs.append("accept_index")
    if not torch.equal(num + 1, ours[2]):
        errs.append("accept_len")
    if not torch.equal(predict, ours[0]):
        errs.append("predict")
    window = (torch.randperm(100000, generator=gen)[: bs * N] + 1).to(dev, torch.int64)
    size = bs * (D + 1)
    srcl = torch.zeros(size, dtype=torch.int64, device=dev)
    fill_accept(acc, window, srcl, size)
    tgt = torch.zeros(size, dtype=torch.int64, device=dev)
    fill_front(num + 1, window, tgt)
    rt, rs = kv_move_plan(acc, num + 1, window)
    if not torch.equal(srcl, rs):
        errs.append("kv-src")
    if not torch.equal(tgt, rt):
        errs.append("kv-tgt (assign_extend_cache_locs)")
    h = torch.randn(bs * N, 7, device=dev)
    if not torch.equal(sgl_compact(h, acc, bs, num_draft_tokens=N), compact_accept_to_front(h, acc, bs, N)):
        errs.append("compact")
    return errs, float((num + 1).float().mean())


def graph_case(sgl, dev, bs, L, V, B):
    """build_trees -> tree_verify_fields -> SGLang verify -> KV-move indices, in one graph."""
    verify_greedy, fill_accept, fill_front, _ = sgl
    N = B + 1
    D = min(L, B)
    x = (torch.randn(bs, L, V, device=dev) * 3).to(torch.bfloat16)
    roots = torch.randint(0, V, (bs,), device=dev)
    post = torch.randint(0, V, (bs, N), device=dev)
    seq = torch.randint(1, 300, (bs,), device=dev)
    seq_sum = int(seq.sum())
    mask_buf = torch.zeros(seq_sum * N + bs * N * N, dtype=torch.bool, device=dev)
    window = (torch.randperm(100000, device=dev)[: bs * N] + 1).to(torch.int64)
    size = bs * (D + 1)

    def step():
        tr = build_trees(x, B, roots)
        f = tree_verify_fields(tr, seq, D, seq_lens_sum=seq_sum, mask_buf=mask_buf)
        # the posterior: the target agrees with the drafter's first child where ``post`` says so
        predict = torch.zeros(bs * N, dtype=torch.int32, device=dev)
        acc = torch.full((bs, D + 1), -1, dtype=torch.int32, device=dev)
        num = torch.empty(bs, dtype=torch.int32, device=dev)
        verify_greedy(predict, acc, num, f["draft_token"].view(bs, N), f["retrieve_index"],
                      f["retrieve_next_token"], f["retrieve_next_sibling"], post)
        srcl = torch.zeros(size, dtype=torch.int64, device=dev)
        fill_accept(acc, window, srcl, size)
        tgt = torch.zeros(size, dtype=torch.int64, device=dev)
        fill_front(num + 1, window, tgt)
        return [tr.tokens, tr.parents, f["draft_token"], f["positions"], f["retrieve_next_token"],
                mask_buf, predict, acc, num, srcl, tgt]

    g, outs = capture_graph(step)
    ok = True
    accepted = []
    for it in range(3):
        x.copy_((torch.randn(bs, L, V, device=dev) * (2 + it)).to(torch.bfloat16))
        roots.copy_(torch.randint(0, V, (bs,), device=dev))
        # a target that agrees with every node's first child: deep accepts
        e = step()
        nxt = e[4].view(bs, N).long()
        post.copy_(torch.where(nxt >= 0, e[0].gather(1, nxt.clamp(min=0)), post))
        g.replay()
        torch.cuda.synchronize()
        got = [t.clone() for t in outs]
        ok &= all(torch.equal(a, b) for a, b in zip(got, step()))
        accepted.append(float((got[8] + 1).float().mean()))
    return ok, accepted


def make_cases(n, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        bs = rng.choice([1, 1, 4, 8, 32])
        L = rng.choice([3, 7, 7, 15])
        B = rng.choice([8, 16, 32, 32, 64])
        V = rng.choice([1000, 163840])
        out.append((bs, L, V, B, rng.choice([0.0, 0.5, 0.9, 1.0]), rng.randrange(1 << 30)))
    return out


def _warm(job):
    """Worker: compile the kernels of one shape (Triton's disk cache is shared)."""
    src, (bs, L, V, B) = job
    sgl = load_sglang(src)
    one_case(sgl, torch.device("cuda"), random.Random(0), bs, L, V, B, 0.5)
    return True


def warm_up(src, shapes, workers=14):
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.time()
    with cf.ProcessPoolExecutor(max_workers=min(workers, len(shapes)), mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_warm, [(src, s) for s in shapes]))
    log(f"[precompile] {len(shapes)} shapes in {time.time() - t0:.0f}s")


GRAPH_SHAPES = [(1, 7, 163840, 32), (8, 7, 163840, 32), (32, 7, 1000, 16), (4, 15, 163840, 64)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang-src", required=True, help="folder with SGLang 0.5.23's kernel files")
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    import triton

    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    cases = make_cases(args.cases)
    shapes = sorted({c[:4] for c in cases} | set(GRAPH_SHAPES))
    warm_up(args.sglang_src, shapes)
    sgl = load_sglang(args.sglang_src)
    t0 = time.time()
    bad, n, acc_by_hit = [], 0, {}
    for (bs, L, V, B, hit, seed) in cases:
        errs, mean_acc = one_case(sgl, dev, random.Random(seed), bs, L, V, B, hit)
        n += 1
        acc_by_hit.setdefault(hit, []).append(mean_acc)
        if errs:
            bad.append(((bs, L, V, B, hit), errs))
    log(f"[sglang-kernels] {n} cases ({len(shapes)} shapes: bs 1-32, L 3-15, B 8-64, V 1000 / 163840), "
        f"{len(bad)} with differences ({time.time() - t0:.1f}s)")
    for b in bad[:10]:
        log("   differs", b)
    log("[sglang-kernels] mean accept length by target/drafter agreement: "
        + ", ".join(f"{h}: {sum(v) / len(v):.2f}" for h, v in sorted(acc_by_hit.items())))
    graphs = {}
    for shape in GRAPH_SHAPES:
        ok, accepted = graph_case(sgl, dev, *shape)
        graphs[str(shape)] = ok
        log(f"[cuda-graph] bs={shape[0]} L={shape[1]} V={shape[2]} B={shape[3]}: build + verify fields + "
            f"SGLang verify + KV indices captured, 3 replays with new inputs == eager: {ok} "
            f"(mean accept length {', '.join(f'{a:.2f}' for a in accepted)})")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sglang_kernels.json"), "w") as f:
        json.dump({"cases": n, "differences": len(bad), "graphs": graphs}, f, indent=1)
    sys.exit(0 if not bad and all(graphs.values()) else 1)


if __name__ == "__main__":
    main()
