"""The GPU decode harness (bench/gpu_decode.py) on the CPU: what runs without a
GPU -- its statistics (the chi-square test the sampling check uses), the
request plan (the batch grows and shrinks), the oracle drafter's coin, the
step-cost accounting and the report table -- through the script's own
``--cpu-smoke`` entry point, in a fresh interpreter (no sglang import)."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(HERE), "bench")
sys.path.insert(0, BENCH)

import gpu_decode as gd  # noqa: E402


def test_cpu_smoke_entry_point():
    p = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_decode.py"), "--cpu-smoke"], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.splitlines()[0])
    assert r["chi2_p_same"] > 1e-3 and r["chi2_p_shifted"] < 1e-6
    assert abs(r["hit_rate"] - 0.8) < 0.02
    assert "| b16 | 1 | 16 |" in p.stdout


def test_chi2_calibration():
    import torch

    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(30, generator=g), 0)
    ps = []
    for _ in range(40):
        c = torch.bincount(torch.multinomial(p, 2000, replacement=True, generator=g), minlength=30).tolist()
        ps.append(gd.chi2_gof(c, p.tolist())[2])
    # p-values of a true null are ~uniform: few tiny ones, median near 0.5
    assert sum(x < 0.01 for x in ps) <= 3 and 0.2 < sorted(ps)[20] < 0.8
    assert abs(gd.chi2_sf(3.84, 1) - 0.05) < 1e-3 and abs(gd.chi2_sf(18.31, 10) - 0.05) < 1e-3
    # dict cells with a remainder cell; pooling of small cells
    st, dof, pv = gd.chi2_gof({(0, 0): 50, (0, 1): 50}, {(0, 0): 0.5, (0, 1): 0.5})
    assert dof == 1 and pv > 0.99


def test_grow_shrink_plan_and_bands():
    plan = gd.grow_shrink_plan(16, seed=3, min_new=160, max_new=420)
    arrivals = sorted({a for a, _, _ in plan})
    sizes = [sum(1 for a, _, _ in plan if a <= t) for t in arrivals]
    assert len(plan) == 16 and sizes == [1, 2, 4, 8, 16]
    assert all(160 <= n <= 420 and 4 <= p <= 24 for _, p, n in plan)
    # the identity schedule routes bs 1..16 to all four bands (graphs at every bs)
    budgets = [gd._budget_for(gd.ID_SCHEDULE, bs, list(range(1, 17))) for bs in range(1, 17)]
    assert sorted(set(budgets)) == [0, 8, 16, 32] and budgets[0] == 32 and budgets[-1] == 0
    assert [gd._budget_for(gd.SITE_SCHEDULE, bs, [1, 8, 32, 128]) for bs in (1, 8, 32, 128)] == [32, 16, 8, 0]


def test_step_timer_nesting_and_table():
    t = gd.StepTimer(cuda=False)
    t.start_step()
    with t.seg("draft_fwd"):
        with t.seg("head_tree"):
            pass
    with t.seg("head_tree"):
        pass
    t.end_step(bs=2)
    r = t.rows[0]
    assert r["wall_draft_fwd"] > 0 and r["wall_head_tree"] > 0 and r["wall_between"] >= 0
    assert abs(sum(r[f"wall_{s}"] for s in gd.SEGMENTS) + r["wall_between"] - r["wall_host"]) < 1e-9
    assert r["wall_total"] >= r["wall_host"]
    s = gd.StepTimer.summarize(t.rows)
    assert s["steps"] == 1 and gd.non_forward(s, "wall") >= s["wall_head_tree"]
    tab = gd.breakdown_table([dict(config="site", bs=8, budget=16, summary=s, ar=s, accept_len=2.5)])
    assert tab.count("\n") == 2 and "| site | 8 | 16 |" in tab


def test_emulated_graph_replay_and_dry_defaults():
    """The CPU dry run's graph stand-in: a replay re-runs the captured calls on
    the static inputs and leaves the results in the captured outputs; the dry
    run's toy sizes apply unless given."""
    import torch

    gd.DEV[0] = "cpu"
    try:
        x = torch.arange(4.0)
        g, out = gd.capture_graph(lambda: (x * 2, x + 1))
        assert isinstance(g, gd.EmulatedGraph) and out[0].tolist() == [0, 2, 4, 6]
        ref = out[0]
        x.copy_(torch.tensor([1.0, 1.0, 1.0, 1.0]))
        g.replay()
        assert ref is out[0] and out[0].tolist() == [2, 2, 2, 2] and out[1].tolist() == [2, 2, 2, 2]
    finally:
        gd.DEV[0] = "cuda"
    a = gd.parse_args(["--dry-cpu", "--vocab", "128"])
    assert a.vocab == 128 and a.hidden == 32 and a.bd_bs == [1, 4] and a.id_schedule == "1:8,2:4,3:0"
    assert gd.parse_args([]).vocab == 32768 and gd.parse_args([]).id_schedule is None


def test_ref_tree_sampling_contract():
    """The dry run's plain-loop target-only tree sampler: a child holding the
    drawn token is accepted (its predict slot holds it), else the drawn token
    is the bonus; accept_index / accept_token_num as the kernel writes them."""
    import torch

    # one request, tree: root(0) -> children 1 (token 3), 2 (token 5); 1 -> 3 (token 7)
    cand = torch.tensor([[9, 3, 5, 7]])
    ridx = torch.tensor([[0, 1, 2, 3]])
    nxt = torch.tensor([[1, 3, -1, -1]])
    sib = torch.tensor([[-1, 2, -1, -1]])
    V = 8
    probs = torch.zeros(1, 4, V)
    probs[0, 0, 3] = 1.0  # root: draws 3 -> child 1
    probs[0, 1, 6] = 1.0  # node 1: draws 6 -> no child holds it: bonus 6
    probs[0, 2:, 0] = 1.0
    pred = torch.zeros(4, dtype=torch.int32)
    acc = torch.full((1, 3), -1, dtype=torch.int32)
    num = torch.zeros(1, dtype=torch.int32)
    gd.ref_tree_sampling_target_only(pred, acc, num, cand, ridx, nxt, sib, torch.full((1, 4), 0.5),
                                     torch.full((1,), 0.5), probs, torch.zeros_like(probs))
    assert num.tolist() == [1] and acc.tolist() == [[0, 1, -1]] and pred[0] == 3 and pred[1] == 6


def test_step_parts_comparison_rules():
    """The H200 step-parts check (phase_stepparts): 10 % per part, absolute
    0.01 ms for parts under 0.05 ms; budget 0 (no drafter) compares 0 with 0."""
    s = dict(gpu_draft_fwd=0.4e-3, gpu_head_tree=0.03e-3, gpu_verify_prep=1.2e-3, gpu_target_fwd=3.6e-3,
             gpu_accept_commit=0.1e-3, gpu_total=5.5e-3)
    ok = dict(drafter_ms=0.43, tree_ms=0.039, prep_ms=1.1, target_ms=3.9, commit_ms=0.095, step_ms=5.2)
    rows = gd.compare_parts(s, ok)
    assert [r["part"] for r in rows] == ["drafter", "tree", "prep", "target", "commit", "step"]
    assert all(r["ok"] for r in rows), rows
    assert rows[1]["rule"] == "abs<=0.01ms" and rows[0]["rule"] == "rel<=10%"
    bad = dict(ok, tree_ms=0.045, target_ms=4.0)
    assert [r["part"] for r in gd.compare_parts(s, bad) if not r["ok"]] == ["tree", "target"]
    z = dict(s, gpu_draft_fwd=0.0, gpu_head_tree=0.0)
    assert all(r["ok"] for r in gd.compare_parts(z, dict(ok, drafter_ms=0.0, tree_ms=0.0)))
    table = gd.parts_table([dict(config="b16", bs=8, budget=16, compare=rows)])
    assert "| b16 | 8 | 16 | drafter | 0.400 | 0.430 | +7.5 | rel<=10% | ok |" in table
    # host wall clock when no CUDA spans were measured (the CPU dry run)
    w = {k.replace("gpu_", "wall_"): v for k, v in s.items()}
    assert all(r["ok"] for r in gd.compare_parts(w, ok))


# --------------------------------------------------------------------------
# the CPU dry run through SGLang's real modules (issue 52): identity + the step's
# host readbacks.  It needs what the device image has and the CPU venv lacks
# (transformers 5.19, einops, httpx, dill, openai: runtime/pyproject.toml's
# "dry-cpu" extra) -- in .venv-sglang, or a folder of them in DDTREE_DRY_CPU_PATH.
# --------------------------------------------------------------------------

# host reads of tensor values per decode step in the runtime's and SGLang's code
# (budget 16, bs 1 and 3): worker.py _ddtree_draft's int(seq_lens_cpu.sum()) and
# eagle_prepare_for_verify's int(batch.seq_lens_cpu.sum()) -- both of host tensors
# (no device wait); no .item() / .tolist() / .cpu() / nonzero / bool-index of a
# device tensor.  One more is a regression (runtime/README.md, "host round trips").
STEP_READBACKS = 2


def _dry_env():
    extra = os.environ.get("DDTREE_DRY_CPU_PATH", "")
    env = dict(os.environ, OMP_NUM_THREADS="1", TRITON_INTERPRET="1",
               DDTREE_HARNESS_ALSO_STUB="torchvision,torchaudio,timm,cv2,tvm_ffi",
               PYTHONPATH=os.pathsep.join(p for p in (extra, os.path.join(os.path.dirname(HERE), "src")) if p))
    probe = subprocess.run([sys.executable, "-c", "import transformers, einops, httpx, dill, openai"], env=env,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        import pytest

        # the whole suite (scripts/test) installs the extra: there a missing package is a failure
        why = ("the dry run needs runtime/pyproject.toml's dry-cpu extra (transformers 5.19, einops, httpx, dill, "
               "openai) in this venv or DDTREE_DRY_CPU_PATH: " + probe.stderr.strip().splitlines()[-1])
        (pytest.fail if os.environ.get("DDTREE_REQUIRE_DRY_CPU") else pytest.skip)(why)
    return env


def test_dry_cpu_identity_and_step_readbacks(tmp_path):
    """``gpu_decode.py --dry-cpu --phases identity,syncs`` in a fresh interpreter:
    the identity phase passes (4 requests, all bands, 0 mismatches) and every
    decode step of the syncs phase reads tensor values on the host exactly
    STEP_READBACKS times in runtime + SGLang code, its output == autoregressive."""
    env = _dry_env()
    p = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_decode.py"), "--dry-cpu", "--phases", "identity,syncs",
                        "--sy-bs", "1", "3", "--sy-steps", "3", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    res = json.load(open(tmp_path / "gpu_decode.json"))
    ident = res["identity"]
    assert ident["ok"] and ident["n_mismatch"] == 0 and ident["requests"] == 4 and ident["band_changes"] >= 2
    assert "[identity] PASS" in p.stdout
    rows = res["syncs"]
    assert [r["bs"] for r in rows] == [1, 3] and all(r["mismatches"] == 0 for r in rows)
    for r in rows:
        assert r["readbacks_per_step"] == [STEP_READBACKS] * 3, r["sites"]
        assert len(r["readbacks_per_step"]) == 3 and r["idle_ms_per_step"] >= 0
    assert "[syncs] bs 1: 3 steps, host readbacks per step (runtime + SGLang) 2..2" in p.stdout


def test_sync_counter_counts_host_readbacks():
    """The counter itself: each kind of host read in a step is counted once and
    attributed to its caller; outside begin/end nothing counts; patches undone."""
    import torch

    import gd_syncs

    x = torch.arange(6)
    orig_item = torch.Tensor.item
    with gd_syncs.SyncCounter() as c:
        x.sum().item()  # not counted: outside a step
        c.begin()
        x.sum().item()
        x.tolist()
        int(x[0])
        x[x > 2]
        torch.nonzero(x)
        torch.repeat_interleave(x, x)
        torch.repeat_interleave(x, x, output_size=15)  # sized: no readback
        x.to(torch.float32)  # dtype only
        c.end()
    assert torch.Tensor.item is orig_item
    assert c.rows == [{"other": 6}], c.rows
    whats = sorted(w for (_, w, _, _) in c.sites)
    assert whats == ["__int__", "bool-index", "item", "nonzero", "repeat_interleave", "tolist"], whats
