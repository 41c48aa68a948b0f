"""Issue 36: the draft head's Triton specialisations, counted and compiled ahead
of time for a named GPU architecture on this CPU-only machine (aot.py)."""

import json
import os

import pytest

pytest.importorskip("triton")

from sglang_ddtree import aot
from sglang_ddtree.schedule import sglang_capture_bs

CAP128 = sglang_capture_bs(128)
# Kimi K2 at TP 8: 163840 / 8 = 20480 vocabulary rows per rank, hidden 7168, drafter block 8
KIMI = dict(block=8, vocab_shard=20480, hidden=7168)
# the emulator's line (opsctl/lab/emulator/sglang/lab/runtime_msgs.py, DDTREE_COMPILE)
EMULATOR_LINE = ("DDTREE Triton compile: budget={budget}, block={block}, vocab_shard={vocab_shard}, "
                 "arch={arch}, elapsed={elapsed:.2f} s, cache={cache}")


def test_sglang_capture_list():
    # SGLang 0.5.23 generate_decode_cuda_graph_batch_sizes, speculative case
    assert CAP128 == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48, 52, 56,
                      60, 64, 72, 80, 88, 96, 104, 112, 120, 128]
    assert sglang_capture_bs(300)[-4:] == [256, 272, 288, 300]
    assert sglang_capture_bs(6) == [1, 2, 3, 4, 5, 6]


def test_band_batch_sizes_follow_the_routing():
    bands = aot.band_batch_sizes("1:16,8:4,32:0", CAP128)
    assert bands == {16: [1, 2, 3, 4, 5, 6, 7], 4: [8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]}
    assert aot.band_batch_sizes(None, [1, 8], budgets=[4, 0, 16]) == {4: [1, 8], 16: [1, 8]}


def test_specialisations_do_not_grow_with_the_batch_size():
    """Every budget needs the same kernels whatever the capture list beyond its launch
    classes: one request (the fused one-launch kernel), up to pdl_rows_max rows (PDL,
    the Triton GEMM's tile heights 16 / 32 / 64), more rows; the budget-free kernels
    (GEMM, stream, row gather) are shared by every budget."""
    per = aot.release_specs(arch="sm_90", capture_bs=CAP128, budgets=[4, 8, 16, 32, 64], **KIMI)
    c = aot.count_specs(per)
    assert c["per_budget"] == {4: 9, 8: 9, 16: 9, 32: 9, 64: 9}
    # 3 per budget (fused top-K + tree at bs 1, group select, tree) + 6 shared
    assert c["total"] == 5 * 3 + 6
    names = sorted(s.name for s in per[16])
    assert names == sorted(["_topk_chunk_kernel", "_group_select_kernel", "_tree_kernel", "_groupmax_kernel",
                            "_groupmax_kernel", "_head_gemm_kernel", "_head_gemm_kernel", "_head_gemm_kernel",
                            "_gather_rows_kernel"])
    # one representative per class gives the same set; a larger capture list adds nothing
    few = aot.count_specs(aot.release_specs(arch="sm_90", capture_bs=[1, 2, 4, 8, 16, 32], budgets=[16], **KIMI))
    more = aot.count_specs(aot.release_specs(arch="sm_90", capture_bs=sglang_capture_bs(512), budgets=[16], **KIMI))
    assert few["total"] == more["total"] == 9
    # a release's schedule: only its bands' batch sizes (budget 4 never runs one request)
    s = aot.count_specs(aot.release_specs(arch="sm_90", capture_bs=CAP128, schedule="1:16,8:4,32:0", **KIMI))
    assert s == {"per_budget": {4: 6, 16: 7}, "total": 11}
    # TP 8: every rank's vocabulary offset is a runtime value (one kernel for all ranks)
    t = aot.count_specs(aot.release_specs(arch="sm_90", capture_bs=[1, 8, 32], budgets=[16], tp=8, **KIMI))
    assert t["total"] == 8  # chunk, select, merge + tree, 2 stream, GEMM 16 / 64, gather
    # pdl_late off (plain launches above pdl_rows_max): a second select and tree kernel per budget
    from sglang_ddtree import triton_kernels as tk

    old = tk.CONFIG["pdl_late"]
    tk.CONFIG["pdl_late"] = False
    try:
        off = aot.count_specs(aot.release_specs(arch="sm_90", capture_bs=CAP128, budgets=[16], **KIMI))
    finally:
        tk.CONFIG["pdl_late"] = old
    assert off["total"] == 11
    # before sm_90 there is no PDL: one class fewer for the stream kernel
    a = aot.count_specs(aot.release_specs(arch="sm_80", capture_bs=CAP128, budgets=[16], **KIMI))
    assert a["total"] == 8


def test_arch_names():
    assert aot.parse_arch("sm_120") == 120 and aot.parse_arch("sm90") == 90 and aot.parse_arch("12.0") == 120
    assert aot.arch_name(90) == "sm_90"


def test_compile_line_is_the_emulators():
    kw = dict(budget=16, block=8, vocab_shard=20480, arch="sm_120", elapsed=22.104, cache="/x/triton")
    assert aot.compile_line(**kw) == EMULATOR_LINE.format(**kw)
    assert aot.compile_line(**kw) == ("DDTREE Triton compile: budget=16, block=8, vocab_shard=20480, arch=sm_120, "
                                      "elapsed=22.10 s, cache=/x/triton")


def test_manifest_format(tmp_path):
    d = str(tmp_path)
    assert aot.read_manifest(d) == {}
    aot.write_manifest(d, [{"budget": 16, "block": 8, "vocab_shard": 20480, "arch": "sm_120"}], extra={"tp": 8})
    aot.write_manifest(d, [{"budget": 16, "block": 8, "vocab_shard": 20480, "arch": "sm_120"},
                           {"budget": 4, "block": 8, "vocab_shard": 20480, "arch": "sm_90"}])
    doc = json.loads((tmp_path / aot.MANIFEST_NAME).read_text())
    assert aot.MANIFEST_NAME == "opsctl-triton-manifest.json"
    assert doc["format"] == 1
    assert doc["specialisations"] == [{"budget": 16, "block": 8, "vocab_shard": 20480, "arch": "sm_120"},
                                      {"budget": 4, "block": 8, "vocab_shard": 20480, "arch": "sm_90"}]
    for s in doc["specialisations"]:
        assert set(s) == {"budget", "block", "vocab_shard", "arch"}
    # another runtime's manifest lists nothing of this one
    aot.write_manifest(d, [{"budget": 8, "block": 8, "vocab_shard": 20480, "arch": "sm_90"}], extra={"runtime": "a"})
    aot.write_manifest(d, [{"budget": 32, "block": 8, "vocab_shard": 20480, "arch": "sm_90"}], extra={"runtime": "a"})
    assert [s["budget"] for s in aot.read_manifest(d)["specialisations"]] == [8, 32]
    aot.write_manifest(d, [{"budget": 16, "block": 8, "vocab_shard": 20480, "arch": "sm_90"}], extra={"runtime": "b"})
    assert [s["budget"] for s in aot.read_manifest(d)["specialisations"]] == [16]
    assert aot.read_manifest(d)["runtime"] == "b"
    # an unreadable manifest lists nothing
    (tmp_path / aot.MANIFEST_NAME).write_text("{")
    assert aot.read_manifest(d) == {}


def _cache_files(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


class _FakeDriver:
    """What JITFunction.run asks the driver for, on a machine with no GPU."""

    def __init__(self, arch):
        self.target = aot.target_for(arch)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return f"aot-test-{self.target.arch}"

    def get_current_stream(self, device):
        return 0


def test_aot_fill_for_sm_120_is_what_the_jit_loads(tmp_path, monkeypatch):
    """The whole budget-4 head at bs 16 for sm_120 (~6 s of compiling): cache
    entries and the manifest; then the JIT's own path (JITFunction.run, as a
    launch on an sm_120 GPU would go, stopped before the launch) finds every
    kernel in the cache: no compile, no new file."""
    from triton import knobs
    from triton.runtime import driver

    d = str(tmp_path / "cache")
    doc = aot.fill_cache(out=d, arch="sm_120", block=8, vocab_shard=2048, hidden=256, capture_bs=[16], budgets=[4])
    files = _cache_files(d)
    assert doc["fill"]["distinct_kernels"] == 3 and doc["fill"]["per_budget"]["4"]["compiled"] == 3
    assert sum(f.endswith(".cubin") for f in files) == 3
    man = aot.read_manifest(d)
    assert man["format"] == 1
    assert man["specialisations"] == [{"budget": 4, "block": 8, "vocab_shard": 2048, "arch": "sm_120"}]

    monkeypatch.setenv("TRITON_CACHE_DIR", d)
    hits = []
    prev_active, prev_listener = driver._active, knobs.compilation.listener
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    driver.set_active(_FakeDriver("sm_120"))
    try:
        launches = aot.head_launches(4, 8, 2048, 256, [16], pdl=True)
        assert len(launches) == 3
        for ln in launches:
            ln.fn.run(*[aot._arg(a) for a in ln.args], grid=(1,), warmup=True,
                      **{k: aot._arg(v) for k, v in ln.kwargs.items()})
    finally:
        driver._active = prev_active
        knobs.compilation.listener = prev_listener
        for ln in launches:
            ln.fn.device_caches.pop(_FakeDriver("sm_120").get_current_device(), None)
    assert hits == [True, True, True]
    assert _cache_files(d) == files


def test_aot_fill_for_sm_90_without_a_gpu(tmp_path):
    """The stream and row-gather kernels for sm_90 (cheap to compile; a partial
    fill writes no manifest), then the same again: all cache hits."""
    d = str(tmp_path / "cache")
    kw = dict(out=d, arch="sm_90", block=8, vocab_shard=2048, hidden=256, capture_bs=[1, 32], budgets=[4],
              kernels=["_groupmax_kernel", "_gather_rows_kernel"])
    doc = aot.fill_cache(**kw)
    assert doc["fill"]["per_budget"]["4"] == {"kernels": 2, "compiled": 2,
                                              "seconds": doc["fill"]["per_budget"]["4"]["seconds"]}
    files = _cache_files(d)
    assert sum(f.endswith(".cubin") for f in files) == 2
    assert any("_groupmax_kernel" in f for f in files) and any("_gather_rows_kernel" in f for f in files)
    ptx = [f for f in files if f.endswith(".ptx")]
    assert all(".target sm_90" in open(os.path.join(d, f)).read() for f in ptx)
    assert not os.path.exists(os.path.join(d, aot.MANIFEST_NAME))
    assert aot.fill_cache(**kw)["fill"]["per_budget"]["4"]["compiled"] == 0
    assert _cache_files(d) == files


def test_cli_count_only(capsys):
    assert aot.main(["--arch", "sm_90", "--budgets", "4,16", "--block", "8", "--vocab-shard", "20480",
                     "--out", "/nonexistent", "--count-only"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"per_budget": {"4": 9, "16": 9}, "total": 12}


def test_prepare_head_is_a_no_op_off_cuda():
    import torch

    from sglang_ddtree.head import DraftTreeHead

    h = DraftTreeHead(torch.zeros(64, 16), 4, 8, impl="torch")
    assert aot.prepare_head(h, [1, 2])["kernels"] == 0


def _real_launches(budget, bs_list, form, V=2048, H=256, block=8):
    """The launches a head on real (CPU) tensors makes, recorded (nothing runs):
    the worker's two call forms -- the draft graph's ``head(hidden, input_ids)``
    and the eager ``head(hidden, root_tokens=bonus)`` -- at real addresses."""
    import torch

    from sglang_ddtree.head import DraftTreeHead

    head = DraftTreeHead(torch.zeros(V, H, dtype=torch.bfloat16), budget, block, max_bs=max(bs_list), impl="triton")
    head._pdl_ok = True  # sm_90
    with aot.recording() as rec:
        for bs in bs_list:
            hid = torch.zeros(bs * block, H, dtype=torch.bfloat16)
            if form == "ids":
                head(hid, torch.zeros(bs * block, dtype=torch.int64))
            else:
                head(hid, root_tokens=torch.zeros(bs, dtype=torch.int32 if form == "root32" else torch.int64))
    return list(rec)


@pytest.mark.parametrize("form", ["ids", "root64", "root32"])
def test_every_launch_of_a_head_is_in_the_fill(form):
    """Issue 52: each specialisation a head launches (bound at real addresses) and
    each launch stub the driver would build for it is one the fill enumerates;
    a launch site the enumeration misses fails here."""
    tgt = aot.target_for("sm_90")
    for budget in (4, 16):
        fill = aot.head_specs(budget, 8, 2048, 256, [1, 8, 32], arch="sm_90")
        real = aot.unique_specs(_real_launches(budget, [1, 8, 32], form), tgt)
        missing = [(s.name, s.constexprs) for s in real if s.key not in {f.key for f in fill}]
        assert not missing, missing
        assert set(aot.launcher_sources(real)) <= set(aot.launcher_sources(fill))


def test_fill_builds_the_launch_stubs(tmp_path, monkeypatch):
    """The 7 files an H200 start still wrote after a fill (budget 4, bs 1): the
    driver's ``cuda_utils`` and the 6 launch stubs the head's kernels share --
    budgets 16 and 64 add none.  The fill now builds them (here recorded)."""
    per = {b: aot.launcher_sources(aot.head_specs(b, **KIMI, batch_sizes=[1, 8, 32], arch="sm_90"))
           for b in (4, 16, 64)}
    assert len(per[4]) == 6 and set(per[16]) <= set(per[4]) and set(per[64]) <= set(per[4])
    built = []
    monkeypatch.setattr(aot, "compile_spec", lambda spec, target: True)
    doc = aot.fill_cache(out=str(tmp_path), arch="sm_90", capture_bs=[1, 8, 32], budgets=[4, 16, 64],
                         launcher_builder=lambda src, name: built.append((name, src)), **KIMI)
    assert [n for n, _ in built].count("cuda_utils") == 1
    assert {s for n, s in built if n == "__triton_launcher"} == set(per[4])
    assert doc["fill"]["launchers"] == {"launchers": 6, "built": True}
    # a host that cannot link them says so in the manifest (the first launch builds them)

    def fail(src, name):
        raise FileNotFoundError("libcuda.so.1")

    doc = aot.fill_cache(out=str(tmp_path), arch="sm_90", capture_bs=[1], budgets=[4], launcher_builder=fail, **KIMI)
    assert doc["fill"]["launchers"]["built"] is False and "libcuda" in doc["fill"]["launchers"]["skipped"]
