"""Issue 36 on the H200, one device call (~225 s of command): the draft head's start-up cost.

1. First call per (budget 4/8/16/32/64, bs 1/8/32/128) with a fresh Triton cache, for the
   kernels of branch s3-issue38 ("old") and this tree ("new"): one process per pair, 14 at
   a time on the 16 cores (compile is CPU work; the times include that contention).
2. A start-like sequence: schedule 1:16,8:4,32:0 over SGLang's capture list up to 128 (each
   band's head called once per captured bs, largest first), cold (fresh cache) old and new;
   then the cache filled ahead by ``python -m sglang_ddtree.aot --arch sm_90`` with no GPU
   visible (CUDA_VISIBLE_DEVICES=""), and the new sequence again with it: compiled kernels,
   compile lines, the runtime's share in seconds.
3. Head CUDA-graph replay old vs new at bs 1/8/32/128 for every budget (pairs alternated,
   each replay between its own events; same trees checked).

Staging (here): ``bench/stage-startup DIR`` puts both packages into DIR/pkgs; carry DIR and run
``DDTREE_STARTUP_PKGS=DIR/pkgs python3 runtime/bench/bench_startup.py`` (env DEV36_PHASE1_S:
no new phase-1 job after that many seconds, DEV36_KILL_AFTER_S, DEV36_PAR). Output: $OUT/log.txt,
$OUT/results.jsonl (bench/results-startup-h200.txt).
"""
import importlib
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# sglang_ddtree (this tree) and sglang_ddtree_old (branch s3-issue38) side by side (bench/stage-startup)
PKGS = os.environ.get("DDTREE_STARTUP_PKGS") or os.path.join(HERE, "pkgs")
OUT = os.environ.get("OUT") or "/tmp/out36"
WORK = "/tmp/w36"
SCHED = "1:16,8:4,32:0"
V, H, BLOCK = 20480, 7168, 8
PKG = {"old": "sglang_ddtree_old", "new": "sglang_ddtree"}
T0 = time.time()


def log(*a):
    line = f"[{time.time() - T0:7.1f}s] " + " ".join(str(x) for x in a)
    print(line, flush=True)
    with open(os.path.join(OUT, "log.txt"), "a") as f:
        f.write(line + "\n")


def emit(rec):
    with open(os.path.join(OUT, "results.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")


def n_kernels(d):
    n = 0
    for r, _, fs in os.walk(d):
        n += sum(1 for f in fs if f.endswith(".cubin"))
    return n


def setup(seed=0):
    sys.path.insert(0, PKGS)
    import torch
    torch.manual_seed(seed)
    W = (torch.randn(V, H, device="cuda", dtype=torch.bfloat16) * 0.02)
    a = torch.randn(64, H, device="cuda", dtype=torch.bfloat16)
    for m in (8, 64, 224, 896):  # cuBLAS handle + heuristics outside the timings
        torch.mm(torch.randn(m, H, device="cuda", dtype=torch.bfloat16), W.t())
    torch.cuda.synchronize()
    return torch, W


def job_first(version, budget, bs):
    torch, W = setup()
    hm = importlib.import_module(PKG[version] + ".head")
    hid = torch.randn(bs * BLOCK, H, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, V, (bs * BLOCK,), device="cuda")
    head = hm.DraftTreeHead(W, budget, BLOCK, max_bs=bs)
    d = os.environ["TRITON_CACHE_DIR"]
    k0 = n_kernels(d)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    head(hid, ids)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    head(hid, ids)
    torch.cuda.synchronize()
    second = time.perf_counter() - t0
    return {"kind": "first", "version": version, "budget": budget, "bs": bs, "first_s": round(first, 3),
            "second_ms": round(second * 1e3, 3), "kernels_compiled": n_kernels(d) - k0}


def job_start(version, tag):
    torch, W = setup()
    aot = importlib.import_module("sglang_ddtree.aot")
    hm = importlib.import_module(PKG[version] + ".head")
    bands = aot.band_batch_sizes(SCHED, aot.sglang_capture_bs(128))
    d = os.environ["TRITON_CACHE_DIR"]
    hid = torch.randn(128 * BLOCK, H, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, V, (128 * BLOCK,), device="cuda")
    k0 = n_kernels(d)
    lines, per_band, prep = [], {}, {}
    torch.cuda.synchronize()
    t_all = time.perf_counter()
    # SGLang captures the largest batch first: the budget-4 band (bs 8..30), then budget 16 (bs 1..7)
    for b in sorted(bands, key=lambda b: -max(bands[b])):
        bs_list = bands[b]
        t0 = time.perf_counter()
        head = hm.DraftTreeHead(W, b, BLOCK, max_bs=max(bs_list))
        if version == "new":
            prep[b] = aot.prepare_head(head, bs_list, announce=True, log=lines.append)
        for x in sorted(bs_list, reverse=True):
            head(hid[: x * BLOCK], ids[: x * BLOCK])
        torch.cuda.synchronize()
        per_band[b] = round(time.perf_counter() - t0, 3)
    total = time.perf_counter() - t_all
    return {"kind": "start", "version": version, "tag": tag, "schedule": SCHED, "bands": bands,
            "runtime_share_s": round(total, 3), "per_band_s": per_band, "kernels_compiled": n_kernels(d) - k0,
            "prepare": {b: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in p.items()}
                        for b, p in prep.items()},
            "compile_lines": lines}


def job_time():
    torch, W = setup()
    old = importlib.import_module(PKG["old"] + ".head")
    new = importlib.import_module(PKG["new"] + ".head")
    rows = []

    def capture(fn):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        return g

    for budget in (32, 16, 4, 64, 8):
        for bs in (1, 8, 32, 128):
            hid = torch.randn(bs * BLOCK, H, device="cuda", dtype=torch.bfloat16)
            ids = torch.randint(0, V, (bs * BLOCK,), device="cuda")
            ho = old.DraftTreeHead(W, budget, BLOCK, max_bs=bs)
            hn = new.DraftTreeHead(W, budget, BLOCK, max_bs=bs)
            go = capture(lambda: ho(hid, ids))
            gn = capture(lambda: hn(hid, ids))
            to, tn = ho.trees(bs), hn.trees(bs)
            same = all(bool(torch.equal(getattr(to, f), getattr(tn, f)))
                       for f in ("tokens", "parents", "depths", "valid", "visibility"))
            n = 300
            for _ in range(5):
                go.replay()
                gn.replay()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3 * n)]
            for i in range(n):
                a, b = (go, gn) if i % 2 == 0 else (gn, go)
                ev[3 * i].record()
                a.replay()
                ev[3 * i + 1].record()
                b.replay()
                ev[3 * i + 2].record()
            torch.cuda.synchronize()
            t1 = [ev[3 * i].elapsed_time(ev[3 * i + 1]) * 1e3 for i in range(n)]
            t2 = [ev[3 * i + 1].elapsed_time(ev[3 * i + 2]) * 1e3 for i in range(n)]
            tol = [t1[i] if i % 2 == 0 else t2[i] for i in range(n)]
            tnew = [t2[i] if i % 2 == 0 else t1[i] for i in range(n)]
            med = lambda xs: sorted(xs)[len(xs) // 2]
            ratios = sorted(tnew[i] / tol[i] for i in range(n))
            r = {"kind": "time", "budget": budget, "bs": bs, "old_us": round(med(tol), 2),
                 "new_us": round(med(tnew), 2), "ratio_med": round(med(ratios), 4),
                 "ratio_q1": round(ratios[n // 4], 4), "ratio_q3": round(ratios[3 * n // 4], 4),
                 "same_trees": same}
            rows.append(r)
            print(json.dumps(r), flush=True)
            del go, gn, ho, hn
    return rows


def child(argv):
    mode = argv[0]
    if mode == "first":
        r = job_first(argv[1], int(argv[2]), int(argv[3]))
    elif mode == "start":
        r = job_start(argv[1], argv[2])
    elif mode == "time":
        r = job_time()
    print("RESULT " + json.dumps(r), flush=True)


def spawn(args, cache, cpu_only=False):
    env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONPATH=PKGS, PYTHONUNBUFFERED="1")
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    os.makedirs(cache, exist_ok=True)
    return subprocess.Popen([sys.executable, __file__, "--child"] + [str(a) for a in args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def collect(p, what):
    out = p.stdout.read()
    p.wait()
    res = None
    for ln in out.splitlines():
        if ln.startswith("RESULT "):
            res = json.loads(ln[7:])
    if res is None:
        log("FAILED", what, "rc", p.returncode, out[-3000:])
    else:
        emit(res)
        log(what, json.dumps(res)[:600])
    return res


def main():
    os.makedirs(OUT, exist_ok=True)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    log("start", subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip(),
        "cpus", os.cpu_count())
    deadline = float(os.environ.get("DEV36_PHASE1_S", "260"))
    jobs = [("start", "old", "cold"), ("start", "new", "cold")]
    first = [(v, b, bs) for b in (64, 32, 16, 8, 4) for bs in (1, 32, 8, 128) for v in ("old", "new")]
    jobs += [("first",) + j for j in first]
    par = int(os.environ.get("DEV36_PAR", "14"))
    running = []
    pending = list(jobs)
    while pending or running:
        while pending and len(running) < par and time.time() - T0 < deadline:
            j = pending.pop(0)
            cache = os.path.join(WORK, "c-" + "-".join(str(x) for x in j))
            running.append((j, spawn(j, cache)))
        if time.time() - T0 >= deadline and pending:
            log("deadline: skipped", pending)
            pending = []
        for j, p in list(running):
            if p.poll() is not None:
                running.remove((j, p))
                collect(p, "-".join(str(x) for x in j))
        if running and time.time() - T0 > deadline + float(os.environ.get("DEV36_KILL_AFTER_S", "90")):
            for j, p in running:
                p.kill()
                log("killed", j)
            running = []
        time.sleep(0.2)
    log("phase 1 done")
    # the stage's step: fill a cache for sm_90 on the CPU side (no GPU visible), then start with it
    pre = os.path.join(WORK, "prefilled")
    env = dict(os.environ, PYTHONPATH=PKGS, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "sglang_ddtree.aot", "--arch", "sm_90", "--schedule", SCHED,
                        "--block", str(BLOCK), "--vocab-shard", str(V), "--hidden", str(H), "--max-bs", "128",
                        "--jobs", "16", "--out", pre], env=env, capture_output=True, text=True)
    fill_s = time.time() - t0
    try:
        doc = json.loads(r.stdout.strip().splitlines()[-1])
    except Exception:
        doc = {"error": (r.stdout + r.stderr)[-3000:]}
    emit({"kind": "aot_fill", "arch": "sm_90", "wall_s": round(fill_s, 2), "kernels_in_cache": n_kernels(pre),
          "manifest": doc})
    log("aot fill", round(fill_s, 1), "s", json.dumps(doc)[:800])
    collect(spawn(("start", "new", "prefilled"), pre), "start-new-prefilled")
    # graph replay before/after: one cache holding both versions' kernels (phase 1's)
    merged = os.path.join(WORK, "merged")
    os.makedirs(merged, exist_ok=True)
    for dd in os.listdir(WORK):
        if dd.startswith("c-first-"):
            src = os.path.join(WORK, dd)
            for h in os.listdir(src):
                if not os.path.exists(os.path.join(merged, h)):
                    shutil.copytree(os.path.join(src, h), os.path.join(merged, h))
    p = spawn(("time",), merged)
    out = p.stdout.read()
    p.wait()
    for ln in out.splitlines():
        if ln.startswith("{"):
            emit(json.loads(ln))
    log("time done rc", p.returncode, out[-4000:] if p.returncode else "")
    log("all done")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
