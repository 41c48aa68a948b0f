#!/usr/bin/env python3
"""The draft head's TP merge with a real all-gather, one process per GPU (issue #39).

Each rank builds ``head.DraftTreeHead`` on its vocabulary shard of one seeded
``[vocab, hidden]`` bf16 LM-head weight with the real ``torch.distributed``
process group (the head's TP flow: shard GEMM, per-shard top-K + logsumexp into
one float32 send buffer, ONE ``all_gather_into_tensor``, the exact merge and the
tree), then

1. **trees**: for every seed x weight mode x batch size, every rank's trees
   against ``build_trees`` on the full logits (rank 0: the concatenation over
   the shards of the logits the head's own GEMM calls give, from the full
   weight): tokens, parents, depths, visibility and valid all equal
   ("identical"); else, where a tie may be broken differently, the same root,
   a well-formed tree (parents first, depth = parent + 1, visibility =
   ancestors, distinct siblings) and the same multiset of node scores
   (sums of the full log-softmax along each node's path) ("tie-equal"); else
   "differ".  Weight modes: ``randn`` (logits ~ N(0, 1 or 4): bf16 ties among
   the top-K), ``dup`` (the first half of every shard = the first half of
   shard 0: each top token of shard 0 has an exact twin in every shard), ``int``
   (integer weights and hidden states in -2..2: ties everywhere).  The report
   counts the rows whose top-K holds an exact tie, and one across two shards.
2. **CUDA graph** (``--device cuda``): per batch size the head is captured with
   the collective inside (NCCL), then 3 replays with new hidden states and
   roots == the eager call on the same inputs, on every rank.
3. **time** (CUDA events, medians): the head's graph replayed in alternation
   with the LM-head GEMM alone on the same shard (cuBLAS, rows 1..L: as
   bench_head.py), the ratio per pair; each alone back to back; the
   all-gather alone (its own graph, the head's send-buffer size); the head eager.
   Rank 0's numbers, and the slowest rank's.

NVLink multicast stays off (set here, before NCCL starts): NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.

  python runtime/bench/tp_head.py --world 2 --out $OUT     # 2 GPUs (default world: every visible GPU)
  python runtime/bench/tp_head.py --world 8 --out $OUT     # 8 GPUs (shard 20480: Kimi K2 at TP 8)
  python runtime/bench/tp_head.py --world 1 --out $OUT     # one GPU: the 1-rank NCCL group, the head's
                                                           # merge flow forced (shard_merge=True)
  torchrun --nproc-per-node 8 runtime/bench/tp_head.py --out $OUT   # the same under torchrun
  python runtime/bench/tp_head.py --device cpu --backend gloo --world 4 --vocab 256 --hidden 32

Imports torch and the runtime package from runtime/src only.  Rank 0 writes
``results-tp-head-<tag>.txt`` (its log and the table) and ``.json`` into
``--out``.  ``--fault`` breaks the gather on purpose (checks the check:
tests/test_tp_head_dist.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NVLS_OFF)  # before torch / NCCL start (spawned ranks inherit it)

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from sglang_ddtree.head import all_gather_single  # noqa: E402

MODES = ("randn", "dup", "int")
FAULTS = ("none", "reverse", "dup", "fields")
FIELDS = ("tokens", "parents", "depths", "visibility", "valid")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=0, help="ranks (default: every visible GPU; CPU: 2)")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--block", type=int, default=8, help="drafter block (L = block - 1)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--modes", default=",".join(MODES), help="weight modes (randn, dup, int)")
    ap.add_argument("--bs", default="1,8,32,128", help="batch sizes")
    ap.add_argument("--replays", type=int, default=3, help="graph replays checked against eager per batch size")
    ap.add_argument("--no-time", action="store_true", help="checks only (CUDA: graphs checked, nothing timed)")
    ap.add_argument("--fault", default="none",
                    help="comma list of gathers to check: none (the real one), reverse (rank order reversed: the "
                         "merge must not care), dup (every slot holds rank 0's buffer), fields (the buffers laid "
                         "out field-major: values, ids, lse of every rank)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of results-tp-head-<tag>.{txt,json}")
    ap.add_argument("--tag", default=None, help="default: <gpu>x<world> (e.g. h200x2), cpu-x<world>")
    ap.add_argument("--timeout", type=float, default=600, help="process-group timeout (s)")
    ap.add_argument("--start-method", default=None, help="spawn (default) or fork (CPU only)")
    a = ap.parse_args(argv)
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.backend is None:
        a.backend = "nccl" if a.device == "cuda" else "gloo"
    if (a.device, a.backend) not in (("cuda", "nccl"), ("cpu", "gloo")):
        ap.error("--device cuda goes with --backend nccl, --device cpu with gloo")
    if not a.world:
        a.world = int(os.environ.get("WORLD_SIZE") or 0) or (torch.cuda.device_count() if a.device == "cuda" else 2)
    a.seeds = [int(x) for x in str(a.seeds).split(",") if x.strip()]
    a.modes = [x.strip() for x in str(a.modes).split(",") if x.strip()]
    a.bs = [int(x) for x in str(a.bs).split(",") if x.strip()]
    a.fault = [x.strip() for x in str(a.fault).split(",") if x.strip()]
    for m in a.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}")
    for f in a.fault:
        if f not in FAULTS:
            ap.error(f"unknown fault {f!r}")
    if a.hidden % 2:
        ap.error("--hidden must be even (bf16 rows are sent as int32 words)")
    if a.device == "cuda" and "LOCAL_RANK" not in os.environ and a.world > torch.cuda.device_count():
        ap.error(f"--world {a.world}: only {torch.cuda.device_count()} GPU(s) visible")
    if a.vocab % a.world:
        ap.error(f"--vocab {a.vocab} is not divisible by --world {a.world}")
    if a.device == "cpu":
        a.no_time = True
    return a


# ---------------------------------------------------------------------------
# groups
# ---------------------------------------------------------------------------


class FaultyGroup:
    """The real all-gather, then the gathered buffers rearranged (``fault``): a
    deliberately broken gather, so a run shows that the check catches one."""

    def __init__(self, pg, fault: str, K: int):
        self.pg, self.fault, self.K = pg, fault, int(K)
        self.world_size = dist.get_world_size(pg)

    def all_gather_into_tensor(self, out, inp):
        all_gather_single(out, inp, self.pg)
        W = self.world_size
        parts = out.view(W, -1)
        if self.fault == "reverse":
            parts.copy_(parts.flip(0))
        elif self.fault == "dup":
            parts.copy_(parts[0:1].expand(W, -1).clone())
        elif self.fault == "fields":
            rows = inp.numel() // (2 * self.K + 1)
            a, b = rows * self.K, 2 * rows * self.K
            out.copy_(torch.cat([parts[:, :a].reshape(-1), parts[:, a:b].reshape(-1), parts[:, b:].reshape(-1)]))


# ---------------------------------------------------------------------------
# trees: packing, comparison
# ---------------------------------------------------------------------------


def pack(tr) -> torch.Tensor:
    """A batch's trees as int64 ``[bs, 4N + N*N]`` (tokens, parents, depths, valid, visibility)."""
    bs = int(tr.tokens.shape[0])
    return torch.cat([tr.tokens.long(), tr.parents.long(), tr.depths.long(), tr.valid.long(),
                      tr.visibility.reshape(bs, -1).long()], 1)


def unpack(row: torch.Tensor, N: int) -> dict:
    return dict(tokens=row[:N], parents=row[N:2 * N], depths=row[2 * N:3 * N], valid=row[3 * N:4 * N].bool(),
                visibility=row[4 * N:].view(N, N).bool())


def node_scores(t: dict, lp: torch.Tensor):
    """Sorted path scores of a tree's valid non-root nodes under ``lp`` ``[L, V]``
    (float64 log-softmax), or a string saying why the tree is malformed."""
    tok, par, dep, val, vis = (t[k].tolist() if k != "visibility" else t[k] for k in
                               ("tokens", "parents", "depths", "valid", "visibility"))
    N, (L, V) = len(tok), lp.shape
    score = [0.0] * N
    seen = set()
    anc = torch.zeros((N, N), dtype=torch.bool)
    anc[0, 0] = True
    if not val[0] or par[0] != -1 or dep[0] != 0:
        return "root"
    for i in range(1, N):
        if not val[i]:
            if any(val[i:]):
                return f"valid nodes after an invalid one at {i}"
            break
        p, d, x = par[i], dep[i], tok[i]
        if not (0 <= p < i) or not val[p] or d != dep[p] + 1 or not (1 <= d <= L) or not (0 <= x < V):
            return f"node {i}: parent {p}, depth {d}, token {x}"
        if (p, x) in seen:
            return f"node {i}: sibling token {x} twice"
        seen.add((p, x))
        score[i] = score[p] + float(lp[d - 1, x])
        anc[i] = anc[p]
        anc[i, i] = True
    if not torch.equal(anc, vis):
        return "visibility != ancestors"
    return sorted(score[i] for i in range(1, N) if val[i])


def compare_request(got: dict, ref: dict, logits_row: torch.Tensor) -> str:
    """``identical`` / ``tie-equal`` / ``differ: why`` (``logits_row`` ``[L, V]``: the full logits)."""
    if all(torch.equal(got[f], ref[f]) for f in FIELDS):
        return "identical"
    if int(got["tokens"][0]) != int(ref["tokens"][0]):
        return "differ: root token"
    lp = torch.log_softmax(logits_row.double(), -1)
    a, b = node_scores(got, lp), node_scores(ref, lp)
    if isinstance(b, str):
        return f"differ: the reference tree is malformed ({b})"
    if isinstance(a, str):
        return f"differ: {a}"
    if len(a) != len(b):
        return f"differ: {len(a)} nodes vs {len(b)}"
    worst = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
    return "tie-equal" if worst <= 1e-6 else f"differ: node scores (max diff {worst:.3g})"


def tie_rows(logits: torch.Tensor, K: int, Vs: int):
    """Rows (of ``[bs, L, V]``) whose top-K holds an exact tie: ``(any two entries,
    two entries from different shards)``."""
    x = logits.float().reshape(-1, logits.shape[-1])
    v, i = torch.topk(x, K, dim=-1)
    eq = (v[:, :, None] == v[:, None, :]) & ~torch.eye(K, dtype=torch.bool, device=v.device)
    other = (i[:, :, None] // Vs) != (i[:, None, :] // Vs)
    return int(eq.any(-1).any(-1).sum()), int((eq & other).any(-1).any(-1).sum())


# ---------------------------------------------------------------------------
# one rank
# ---------------------------------------------------------------------------


class Rank:
    def __init__(self, rank: int, world: int, args, dev: torch.device):
        self.rank, self.world, self.a, self.dev = rank, world, args, dev
        self.cuda = dev.type == "cuda"
        self.pg = dist.group.WORLD
        self.V, self.H = int(args.vocab), int(args.hidden)
        self.Vs = self.V // world
        self.block, self.L, self.B = int(args.block), int(args.block) - 1, int(args.budget)
        self.K = min(self.B, self.V)
        self.lines = []

    # -- logging / sync
    def log(self, *a):
        if self.rank == 0:
            s = " ".join(str(x) for x in a)
            self.lines.append(s)
            print(s, flush=True)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def barrier(self):
        self.sync()
        dist.barrier()
        self.sync()

    def agree_max(self, x: float) -> float:
        t = torch.tensor([float(x)], dtype=torch.float64, device=self.dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def gather_obj(self, obj):
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    # -- data (made on rank 0, sent to every rank: identical bits everywhere)
    def weight(self, seed: int, mode: str):
        """Rank 0: the full weight (else None); every rank: its shard."""
        V, H, Vs = self.V, self.H, self.Vs
        full = None
        if self.rank == 0:
            g = torch.Generator(device=self.dev).manual_seed(seed)
            if mode == "int":
                full = torch.randint(-2, 3, (V, H), generator=g, device=self.dev, dtype=torch.int8).to(torch.bfloat16)
            else:
                scale = 1.0 if seed % 2 else 4.0
                full = torch.randn(V, H, generator=g, device=self.dev, dtype=torch.bfloat16) * (scale / H ** 0.5)
            if mode == "dup":
                half = Vs // 2
                if self.world == 1:
                    full[half:2 * half] = full[:half]
                for r in range(1, self.world):
                    full[r * Vs:r * Vs + half] = full[:half]
        shard = torch.empty((Vs, H), dtype=torch.bfloat16, device=self.dev)
        parts = [full[r * Vs:(r + 1) * Vs].view(torch.int32) for r in range(self.world)] if self.rank == 0 else None
        dist.scatter(shard.view(torch.int32), parts, src=0)
        return full, shard

    def inputs(self, seed: int, mode: str, bs: int, out=None):
        """Hidden states [bs * block, H] bf16 and input ids [bs * block] (rank 0 draws, broadcast)."""
        n = bs * self.block
        hid = out[0] if out is not None else torch.empty((n, self.H), dtype=torch.bfloat16, device=self.dev)
        ids = out[1] if out is not None else torch.empty((n,), dtype=torch.int64, device=self.dev)
        if self.rank == 0:
            g = torch.Generator(device=self.dev).manual_seed(seed)
            if mode == "int":
                hid.copy_(torch.randint(-2, 3, (n, self.H), generator=g, device=self.dev, dtype=torch.int8))
            else:
                hid.copy_(torch.randn((n, self.H), generator=g, device=self.dev, dtype=torch.float32))
            ids.copy_(torch.randint(0, self.V, (n,), generator=g, device=self.dev))
        dist.broadcast(hid.view(torch.int32), src=0)
        dist.broadcast(ids, src=0)
        return hid, ids

    def head(self, shard, bs, fault="none"):
        from sglang_ddtree.head import DraftTreeHead

        group = self.pg if fault == "none" else FaultyGroup(self.pg, fault, self.K)
        return DraftTreeHead(shard, self.B, self.block, vocab_start=self.rank * self.Vs, tp_group=group,
                             vocab_size=self.V, max_bs=bs, shard_merge=True)

    def reference(self, full, hid, ids, bs):
        """Rank 0: (full logits [bs, L, V], build_trees on them)."""
        from sglang_ddtree import build_trees
        from sglang_ddtree.head import DraftTreeHead

        logits = torch.cat([DraftTreeHead(full[r * self.Vs:(r + 1) * self.Vs], self.B, self.block).logits(hid)
                            for r in range(self.world)], -1)
        return logits, build_trees(logits, self.B, ids.view(bs, self.block)[:, 0])

    # -- 1. trees
    def check_trees(self, fault: str) -> dict:
        a = self.a
        rows, tot = [], {"trees": 0, "identical": 0, "tie-equal": 0, "differ": 0}
        for seed in a.seeds:
            for mode in a.modes:
                full, shard = self.weight(seed, mode)
                for bs in a.bs:
                    hid, ids = self.inputs(1000 * seed + bs, mode, bs)
                    head = self.head(shard, bs, fault)
                    got = pack(head(hid, ids)).contiguous()
                    self.sync()
                    allg = torch.empty((self.world * got.numel(),), dtype=got.dtype, device=self.dev)
                    all_gather_single(allg, got.view(-1), self.pg)
                    allg = allg.view((self.world,) + tuple(got.shape))
                    if self.rank != 0:
                        continue
                    logits, ref = self.reference(full, hid, ids, bs)
                    refp = pack(ref).cpu()
                    allg, logits_c = allg.cpu(), None
                    N = self.B + 1
                    per_rank = []
                    for r in range(self.world):
                        c = {"identical": 0, "tie-equal": 0, "differ": 0}
                        for b in range(bs):
                            if torch.equal(allg[r, b], refp[b]):
                                c["identical"] += 1
                                continue
                            if logits_c is None:
                                logits_c = logits.float().cpu()
                            v = compare_request(unpack(allg[r, b], N), unpack(refp[b], N), logits_c[b])
                            k = v.split(":")[0]
                            c[k] += 1
                            if k == "differ" and c[k] <= 2:
                                self.log(f"  [trees] fault={fault} seed {seed} {mode} bs {bs} rank {r} "
                                         f"request {b}: {v}")
                        per_rank.append(c)
                        for k, n in c.items():
                            tot[k] += n
                        tot["trees"] += bs
                    ties, cross = tie_rows(logits, self.K, self.Vs)
                    row = dict(seed=seed, mode=mode, bs=bs, per_rank=per_rank,
                               ranks_agree=all(torch.equal(allg[r], allg[0]) for r in range(self.world)),
                               tie_rows=ties, cross_shard_tie_rows=cross, rows=bs * self.L)
                    rows.append(row)
                    self.log(f"[trees] fault={fault} seed {seed} {mode:5s} bs {bs:3d}: "
                             + ", ".join(f"r{r} {c['identical']}/{c['tie-equal']}/{c['differ']}"
                                         for r, c in enumerate(per_rank))
                             + f" (identical/tie-equal/differ); ranks agree {row['ranks_agree']}; "
                               f"rows with a tie in the top-{self.K}: {ties}/{row['rows']}, across shards {cross}")
                del full, shard
                if self.cuda:
                    torch.cuda.empty_cache()
        res = None
        if self.rank == 0:
            res = dict(tot, fault=fault, cases=rows, ranks_agree=all(r["ranks_agree"] for r in rows),
                       ok=tot["differ"] == 0 and tot["trees"] > 0 and all(r["ranks_agree"] for r in rows))
            self.log(f"[trees] fault={fault}: {tot['trees']} trees over {self.world} rank(s): {tot['identical']} "
                     f"identical to build_trees on the full logits, {tot['tie-equal']} tie-equal, "
                     f"{tot['differ']} differ -> {'OK' if res['ok'] else 'FAIL'}")
        return res

    # -- 2. graphs + 3. time
    def capture(self, fn, warmups=2):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warmups):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        # thread_local: the process group's watchdog thread may query events meanwhile
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            out = fn()
        torch.cuda.synchronize()
        return g, out

    def time_block(self, fn, reps):
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps * 1e3  # us

    def median_time(self, fn, reps, rounds=5):
        fn()
        ts = []
        for _ in range(rounds):
            self.barrier()  # every rank starts the round together (collectives wait for the slowest)
            ts.append(self.time_block(fn, reps))
        return sorted(ts)[len(ts) // 2]

    def interleaved(self, fa, fb, n):
        for _ in range(3):
            fa()
            fb()
        self.barrier()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3 * n)]
        for i in range(n):
            ev[3 * i].record()
            fa()
            ev[3 * i + 1].record()
            fb()
            ev[3 * i + 2].record()
        torch.cuda.synchronize()
        return ([ev[3 * i].elapsed_time(ev[3 * i + 1]) * 1e3 for i in range(n)],
                [ev[3 * i + 1].elapsed_time(ev[3 * i + 2]) * 1e3 for i in range(n)])

    def reps(self, fn):
        """Replays per timed block (~30 ms), the same on every rank (collectives must pair up)."""
        self.barrier()
        us = self.time_block(fn, 3)
        us = self.agree_max(us)
        return int(max(5, min(300, 30000 / max(us, 1.0))))

    def graphs_and_time(self) -> list:
        a = self.a
        F = FIELDS
        _, shard = self.weight(12345, "randn")
        rows = []
        for bs in a.bs:
            r = {"bs": bs}
            try:
                hid, ids = self.inputs(777 + bs, "randn", bs)
                head = self.head(shard, bs)
                r["send_KiB"] = bs * self.L * (2 * self.K + 1) * 4 / 1024
                r["gemm_chunks"] = -(-bs // head.chunk_requests(bs)[1])
                t0 = time.time()
                g, out = self.capture(lambda: head(hid, ids))
                r["capture_s"] = round(time.time() - t0, 2)
                eq = []
                for it in range(a.replays):
                    self.inputs(5000 + 10 * bs + it, ("randn", "int", "dup")[it % 3], bs, out=(hid, ids))
                    g.replay()
                    torch.cuda.synchronize()
                    rep = [getattr(out, f).clone() for f in F]
                    eager = head(hid, ids)
                    torch.cuda.synchronize()
                    eq.append(all(torch.equal(x, getattr(eager, f)) for x, f in zip(rep, F)))
                r["replays_equal_eager"] = all(eq)
                if not a.no_time:
                    hs = hid.view(bs, self.block, self.H)[:, 1:].reshape(bs * self.L, self.H).contiguous()
                    g_gemm, _ = self.capture(lambda: torch.mm(hs, shard.t()))
                    send = torch.randn(bs * self.L * (2 * self.K + 1), device=self.dev)
                    gath = torch.empty(self.world * send.numel(), device=self.dev)
                    g_coll, _ = self.capture(lambda: all_gather_single(gath, send, self.pg))
                    n = self.reps(g.replay)
                    ta, tb = self.interleaved(g_gemm.replay, g.replay, max(n, 40))
                    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
                    ratios = sorted(y / x for x, y in zip(ta, tb))
                    q = len(ratios) // 4
                    r.update(gemm_us=med(ta), head_graph_us=med(tb), ratio=med(ratios),
                             ratio_range=[ratios[q], ratios[-1 - q]], pairs=len(ratios))
                    r["gemm_alone_us"] = self.median_time(g_gemm.replay, self.reps(g_gemm.replay))
                    r["head_graph_alone_us"] = self.median_time(g.replay, n)
                    r["allgather_graph_us"] = self.median_time(g_coll.replay, self.reps(g_coll.replay))
                    r["head_eager_us"] = self.median_time(lambda: head(hid, ids), self.reps(lambda: head(hid, ids)),
                                                          rounds=3)
                    del g_gemm, g_coll
                del g
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                r["error"] = f"rank {self.rank}: {e!r}"[:400]
            allr = self.gather_obj(r)
            if self.rank == 0:
                row = dict(allr[0])
                row["replays_equal_eager"] = all(x.get("replays_equal_eager") is True for x in allr)
                errs = [x["error"] for x in allr if "error" in x]
                if errs:
                    row["error"] = "; ".join(errs)[:600]
                for k in ("head_graph_us", "head_graph_alone_us", "allgather_graph_us", "gemm_alone_us",
                          "head_eager_us"):
                    if all(k in x for x in allr):
                        row[k + "_max_rank"] = max(x[k] for x in allr)
                rows.append(row)
                self.log("[graph] " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                                  for k, v in row.items()}))
            if any("error" in x for x in allr):
                break  # a failed collective leaves the ranks out of step
            if self.cuda:
                torch.cuda.empty_cache()
        return rows

    # -- the run
    def describe(self) -> dict:
        d = {"world": self.world, "backend": self.a.backend, "device": self.a.device, "torch": torch.__version__,
             "env": {k: os.environ.get(k) for k in NVLS_OFF}}
        try:
            import triton

            d["triton"] = triton.__version__
        except Exception:  # noqa: BLE001
            d["triton"] = None
        if self.cuda:
            v = torch.cuda.nccl.version()
            d["nccl"] = str(v) if isinstance(v, int) else ".".join(str(x) for x in v)
            d["gpu"] = torch.cuda.get_device_name(self.dev)
        names = self.gather_obj(d.get("gpu", "cpu"))
        d["gpus"] = names
        if self.cuda and self.rank == 0:
            try:  # how the GPUs are linked (NVLink / PCIe), for the report
                topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
                d["topology"] = re.sub(r"\x1b\[[0-9;]*m", "", topo)  # no terminal escapes
            except Exception as e:  # noqa: BLE001
                d["topology"] = f"(nvidia-smi topo -m: {e!r})"
        return d

    def run(self) -> dict:
        a = self.a
        t0 = time.time()
        res = self.describe()
        res["args"] = {k: v for k, v in vars(a).items()}
        self.log(f"torch {res['torch']}, triton {res['triton']}, nccl {res.get('nccl')}, backend {a.backend}, "
                 f"world {self.world}, GPUs {res['gpus']}; vocab {self.V} (shard {self.Vs}), hidden {self.H}, "
                 f"budget {self.B}, block {self.block}; NVLS off: {res['env']}")
        if res.get("topology"):
            self.log("nvidia-smi topo -m:\n" + res["topology"].rstrip())
        res["checks"] = {}
        for fault in a.fault:
            res["checks"][fault] = self.check_trees(fault)
        self.log(f"  (trees checked at {time.time() - t0:.0f}s)")
        if self.cuda:
            res["graph"] = self.graphs_and_time()
            self.log(f"  (graphs{'' if a.no_time else ' and timing'} done at {time.time() - t0:.0f}s)")
        res["total_s"] = round(time.time() - t0, 1)
        if self.rank != 0:
            return None
        # the real gather (and the reversed rank order) must give the reference's trees;
        # a broken one (dup, fields) must be caught
        for f, c in res["checks"].items():
            c["caught"] = c["differ"] > 0
        ok = all(c["ok"] if f in ("none", "reverse") else c["caught"] for f, c in res["checks"].items())
        if self.cuda:
            ok = ok and bool(res["graph"]) and all(r.get("replays_equal_eager") and "error" not in r
                                                   for r in res["graph"])
        res["ok"] = ok
        res["table"] = table(res)
        for line in res["table"]:
            self.log(line)
        self.log(f"[result] {'OK' if ok else 'FAIL'} (total {res['total_s']}s)")
        res["log"] = self.lines
        return res


def table(res) -> list:
    md = []
    for f, c in res["checks"].items():
        md.append(f"trees (gather: {f}): {c['trees']} over {res['world']} rank(s), {c['identical']} identical to "
                  f"build_trees on the full logits, {c['tie-equal']} tie-equal, {c['differ']} differ; ranks agree "
                  f"{c['ranks_agree']}; rows with a top-K tie {sum(r['tie_rows'] for r in c['cases'])}"
                  f"/{sum(r['rows'] for r in c['cases'])}, across shards "
                  f"{sum(r['cross_shard_tie_rows'] for r in c['cases'])}"
                  + ("" if f in ("none", "reverse") else f"; broken gather caught: {c['caught']}"))
    rows = res.get("graph") or []
    if rows:
        md += ["", "| batch | send buffer (KiB/rank) | GEMM alone, paired (µs) | **head graph, paired (µs)** | "
                   "head/GEMM per pair (middle half) | each alone: head / GEMM (µs) | all-gather alone, graph (µs) | "
                   "head − GEMM − all-gather (µs) | head eager (µs) | slowest rank: head / all-gather (µs) | "
                   "replays == eager |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                md.append(f"| {r['bs']} | error: {r['error'][:200]} |")
                continue
            if "head_graph_us" not in r:
                md.append(f"| {r['bs']} | {r['send_KiB']:.1f} | – | – | – | – | – | – | – | – | "
                          f"{r['replays_equal_eager']} |")
                continue
            md.append(f"| {r['bs']} | {r['send_KiB']:.1f} | {r['gemm_us']:.1f} | **{r['head_graph_us']:.1f}** | "
                      f"{r['ratio']:.3f} ({r['ratio_range'][0]:.3f}–{r['ratio_range'][1]:.3f}) | "
                      f"{r['head_graph_alone_us']:.1f} / {r['gemm_alone_us']:.1f} | {r['allgather_graph_us']:.1f} | "
                      f"{r['head_graph_alone_us'] - r['gemm_alone_us'] - r['allgather_graph_us']:.1f} | "
                      f"{r['head_eager_us']:.1f} | {r['head_graph_alone_us_max_rank']:.1f} / "
                      f"{r['allgather_graph_us_max_rank']:.1f} | {r['replays_equal_eager']} |")
    return md


# ---------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------


def _rank_main(local_rank: int, world: int, init: str, args, res_path):
    os.environ.update(NVLS_OFF)
    rank = int(os.environ.get("RANK", local_rank)) if init == "env://" else local_rank
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(1)
        dev = torch.device("cpu")
    kw = dict(backend=args.backend, init_method=init, rank=rank, world_size=world,
              timeout=datetime.timedelta(seconds=args.timeout))
    if args.device == "cuda":
        kw["device_id"] = dev
    dist.init_process_group(**kw)
    try:
        res = Rank(rank, world, args, dev).run()
        if rank == 0:
            write_results(res, args)
            if res_path:
                with open(res_path, "w") as f:
                    json.dump(res, f, default=str)
    finally:
        dist.destroy_process_group()
    return res


def result_paths(res, args):
    tag = args.tag
    if not tag:
        if args.device == "cuda":
            name = (res.get("gpu") or "gpu").split()
            short = next((w for w in name if any(ch.isdigit() for ch in w)), name[-1]).lower()
            tag = f"{short}x{res['world']}"
        else:
            tag = f"cpu-x{res['world']}"
    base = os.path.join(args.out, f"results-tp-head-{tag}")
    return base + ".txt", base + ".json"


def write_results(res, args):
    os.makedirs(args.out, exist_ok=True)
    txt, js = result_paths(res, args)
    with open(txt, "w") as f:
        f.write("\n".join(res["log"]) + "\n")
    with open(js, "w") as f:
        json.dump({k: v for k, v in res.items() if k != "log"}, f, indent=1, default=str)
    print(f"[out] {txt} {js}", flush=True)


def launch(args) -> dict:
    """One process per rank (``torch.multiprocessing``), rendezvous through a file;
    returns rank 0's result (also written to ``--out``)."""
    import torch.multiprocessing as mp

    method = args.start_method or ("spawn" if args.device == "cuda" else "fork")
    if args.device == "cuda" and method != "spawn":
        raise ValueError("CUDA ranks need --start-method spawn")
    with tempfile.TemporaryDirectory(prefix="tp-head-") as d:
        res_path = os.path.join(d, "rank0.json")
        mp.start_processes(_rank_main, args=(args.world, "file://" + os.path.join(d, "rendezvous"), args, res_path),
                           nprocs=args.world, join=True, start_method=method)
        with open(res_path) as f:
            return json.load(f)


def main(argv=None) -> int:
    args = parse_args(argv)
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun: this process is one rank
        args.world = int(os.environ["WORLD_SIZE"])
        res = _rank_main(int(os.environ["LOCAL_RANK"]), args.world, "env://", args, None)
        return 0 if int(os.environ.get("RANK", "0")) != 0 or (res or {}).get("ok") else 1
    res = launch(args)
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
