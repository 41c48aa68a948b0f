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
    assert abs(sum(r[f"wall_{s}"] for s in gd.SEGMENTS) + r["wall_between"] - r["wall_total"]) < 1e-9
    s = gd.StepTimer.summarize(t.rows)
    assert s["steps"] == 1 and gd.non_forward(s, "wall") >= s["wall_head_tree"]
    tab = gd.breakdown_table([dict(config="site", bs=8, budget=16, summary=s, ar=s, accept_len=2.5)])
    assert tab.count("\n") == 2 and "| site | 8 | 16 |" in tab
