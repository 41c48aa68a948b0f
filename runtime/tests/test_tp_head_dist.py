"""The draft head's TP merge over a real ``torch.distributed`` group (issue #39):
``bench/tp_head.py``'s check, on the CPU with gloo (one process per rank, the
head's torch path, eager).

* world 2 and 4 (and 1: the forced merge flow over a 1-rank group): every rank's
  ``DraftTreeHead`` on its vocabulary shard, with the real process group, builds
  trees equal to ``build_trees`` on the full logits -- identical, or where a tie
  is broken differently (torch.topk per shard, then over the shards) the same
  root, a well-formed tree and the same node scores; all ranks agree; seeds 1
  and 2 over the three weight modes, two of which force exact ties in the top-K
  across shards (asserted: the run counts such rows).
* the check fails when the merge is broken: the gathered buffers laid out
  field-major (world 2) or every slot holding rank 0's buffer (world 4) ->
  every tree "differ", ``ok`` False; the rank order reversed is no fault (the
  merge carries global ids) -> still equal.
* ``compare_request`` itself: a tie swap is tie-equal; another token, a repeated
  sibling, a wrong depth or visibility is "differ".
"""

import importlib.util
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(HERE), "bench")


def _harness():
    if "tp_head" not in sys.modules:
        if BENCH not in sys.path:
            sys.path.insert(0, BENCH)
        spec = importlib.util.spec_from_file_location("tp_head", os.path.join(BENCH, "tp_head.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["tp_head"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["tp_head"]


def _run(tmp_path, world, fault, seeds="1,2", bs="1,3"):
    th = _harness()
    args = th.parse_args(["--device", "cpu", "--backend", "gloo", "--world", str(world), "--vocab", "256",
                          "--hidden", "32", "--seeds", seeds, "--bs", bs, "--fault", fault, "--timeout", "120",
                          "--out", str(tmp_path)])
    res = th.launch(args)
    assert os.path.exists(tmp_path / f"results-tp-head-cpu-x{world}.json")
    return res


def _assert_equal_trees(c, world, n_cases):
    # 2 seeds x 3 modes x (1 + 3 requests) per rank
    assert c["trees"] == world * n_cases * 4, c["trees"]
    assert c["differ"] == 0 and c["identical"] + c["tie-equal"] == c["trees"], c
    assert c["identical"] > 0  # not only the lenient comparison
    assert c["ranks_agree"] and c["ok"]
    ties = {m: sum(r["cross_shard_tie_rows"] if world > 1 else r["tie_rows"] for r in c["cases"] if r["mode"] == m)
            for m in ("dup", "int")}
    for m, rows in ties.items():  # the forced ties are there (dup: every dup row; int: nearly every row)
        assert rows >= sum(r["rows"] for r in c["cases"] if r["mode"] == m) // 2, (m, rows)


@pytest.mark.timeout(120)
def test_world2_real_gather_and_broken_ones(tmp_path):
    res = _run(tmp_path, 2, "none,reverse,fields")
    ch = res["checks"]
    _assert_equal_trees(ch["none"], 2, 6)
    _assert_equal_trees(ch["reverse"], 2, 6)  # rank order does not matter to the merge
    f = ch["fields"]
    assert not f["ok"] and f["caught"] and f["differ"] == f["trees"] and f["identical"] == 0, f
    assert res["ok"]  # the real gather passes, the broken one is caught


@pytest.mark.timeout(120)
def test_world4_real_gather_and_lost_shards(tmp_path):
    res = _run(tmp_path, 4, "none,dup")
    _assert_equal_trees(res["checks"]["none"], 4, 6)
    d = res["checks"]["dup"]
    assert not d["ok"] and d["differ"] == d["trees"], d
    assert all(r["per_rank"][k]["differ"] == r["bs"] for r in d["cases"] for k in range(4))


@pytest.mark.timeout(120)
def test_world1_forced_merge(tmp_path):
    res = _run(tmp_path, 1, "none", seeds="1", bs="2")
    c = res["checks"]["none"]
    assert c["trees"] == 6 and c["differ"] == 0 and c["ok"] and res["ok"]
    assert all(r["tie_rows"] > 0 for r in c["cases"] if r["mode"] != "randn")


def test_compare_request():
    th = _harness()
    from sglang_ddtree import build_trees

    g = torch.Generator().manual_seed(5)
    L, V, B = 3, 40, 8
    logits = torch.randn(1, L, V, generator=g) * 3
    logits[0, 0, 7] = logits[0, 0, 3] = logits[0, 0].max() + 1  # two tied best tokens at depth 1
    ref = build_trees(logits, B, torch.tensor([11]), impl="torch")
    row = th.pack(ref)[0]
    N = B + 1
    t = th.unpack(row, N)
    assert th.compare_request(t, th.unpack(row.clone(), N), logits[0]) == "identical"

    def variant(fn):
        r = row.clone()
        u = th.unpack(r, N)
        fn(u)
        return th.compare_request(u, t, logits[0])

    tok = t["tokens"].tolist()
    d1 = [i for i in range(1, N) if int(t["depths"][i]) == 1]
    assert 3 in [tok[i] for i in d1] and 7 in [tok[i] for i in d1]
    # the two tied tokens swapped (their subtrees move with them: scores unchanged)
    swap = {3: 7, 7: 3}
    assert variant(lambda u: [u["tokens"].__setitem__(i, swap[tok[i]]) for i in d1 if tok[i] in swap]) == "tie-equal"
    # a depth-1 token replaced by one outside the tree (another score)
    other = next(x for x in range(V) if x not in tok)
    assert variant(lambda u: u["tokens"].__setitem__(d1[-1], other)).startswith("differ")
    # two siblings with one token
    assert variant(lambda u: u["tokens"].__setitem__(d1[1], tok[d1[0]])).startswith("differ")
    # a wrong depth; a visibility bit dropped; another root
    assert variant(lambda u: u["depths"].__setitem__(d1[0], 2)).startswith("differ")
    assert variant(lambda u: u["visibility"].__setitem__((d1[0], 0), False)).startswith("differ")
    assert variant(lambda u: u["tokens"].__setitem__(0, 12)) == "differ: root token"
