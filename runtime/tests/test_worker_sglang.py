"""``DDTreeWorkerV2`` against the REAL sglang 0.5.23 package on the CPU
(.venv-sglang; skipped where it is absent).

Covered:
  * SGLang's own Triton kernels, run by Triton's interpreter on CPU tensors,
    consume our tensors as the worker hands them over: ``verify_tree_greedy``
    (spec_tree.py, the greedy EAGLE tree walk ``eagle_sample`` runs) on our
    retrieve_index / next_token / next_sibling gives our walk's accept_index /
    predict / accept_lens; ``fill_accept_out_cache_loc`` +
    ``fill_front_out_cache_loc_func`` (what ``move_accept_tokens_to_target_kvcache``
    feeds ``move_kv_cache``) give our KV move plan (the front-slot half by its
    documented contract: its Triton kernel loops over ``range(<tensor>)``, which
    Triton 3.6's interpreter cannot execute); SGLang's
    ``_compact_accept_to_front`` (eagle_worker_common.py, read from the
    installed source: the module itself needs einops/transformers) equals ours;
  * every ``from sglang... import name`` in worker.py / plugin.py names something
    that exists in the installed 0.5.23 source, and the DFlash methods the
    worker overrides or calls exist on ``DFlashWorkerV2``; the hooked dotted
    paths exist;
  * the worker class resolves through the plugin's factory (SGLang's DFlash
    module replaced by a stand-in: the real one needs transformers, sgl_kernel
    and a GPU): budget = num_draft_tokens - 1, DFlash constructed with the
    drafter's block size, verify width budget + 1, draft sampler / deferred
    verify gather disabled, extend/idle routed to DFlash and decode to the
    tree step, bad shapes rejected;
  * the CUDA-graph dummy: the AROUND hook on
    ``DecodeCudaGraphRunner.get_spec_info`` returns, for DDTREE's target runner
    only, a tree EagleVerifyInput of ``captured_req_width`` = budget + 1 tokens
    per request with the runner's custom-mask buffer (EagleVerifyInput replaced
    by a recorder whose accepted keywords are checked against the real
    dataclass); both hooks are registered by ``load_plugins()``.

NOT covered (needs sgl_kernel + GPU): running ``_ddtree_decode`` itself (the
DFlash draft forward, ``eagle_prepare_for_verify``, the target forward and
its attention backends with the tree mask, ``eagle_sample``'s CUDA kernels and
sampling path, ``move_kv_cache`` on a real pool, the draft-KV write), CUDA-graph
capture and replay with the tree dummy, TP > 1 collectives.
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from conftest import SRC

WORKER_PY = os.path.join(SRC, "sglang_ddtree", "worker.py")
PLUGIN_PY = os.path.join(SRC, "sglang_ddtree", "plugin.py")


def _sglang_root():
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        pytest.skip("sglang is not installed in this interpreter (run with .venv-sglang)")
    return os.path.dirname(spec.origin)


def _module_file(root, mod):
    rel = mod.split(".")[1:]
    base = os.path.join(root, *rel)
    for cand in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.exists(cand):
            return cand
    return None


def _defined_names(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names.add(t.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
    return names, tree


def _class_methods(tree, cls):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    raise AssertionError(cls)


def test_sglang_symbols_the_worker_uses_exist():
    root = _sglang_root()
    missing = []
    for src in (WORKER_PY, PLUGIN_PY):
        for node in ast.walk(ast.parse(open(src).read())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang."):
                f = _module_file(root, node.module)
                if f is None:
                    # "from sglang.srt.speculative import dflash_worker_v2": a submodule
                    for a in node.names:
                        if _module_file(root, node.module + "." + a.name) is None:
                            missing.append(f"{node.module}.{a.name}")
                    continue
                names, _ = _defined_names(f)
                for a in node.names:
                    if a.name not in names and _module_file(root, node.module + "." + a.name) is None:
                        missing.append(f"{node.module}:{a.name}")
    assert not missing, missing
    # DFlash internals the subclass overrides / calls
    _, tree = _defined_names(os.path.join(root, "srt/speculative/dflash_worker_v2.py"))
    meths = _class_methods(tree, "DFlashWorkerV2")
    for m in ("__init__", "forward_batch_generation", "_maybe_build_draft_sampler", "_defer_target_verify_gather",
              "_append_target_hidden_to_draft_kv_by_loc", "_draft_write_ids", "_make_next_draft_input_decode",
              "_ensure_draft_block_buffers"):
        assert m in meths, m
    fbg = [a.arg for a in meths["forward_batch_generation"].args.args]
    assert fbg == ["self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors"], fbg
    src = open(os.path.join(root, "srt/speculative/dflash_worker_v2.py")).read()
    for attr in ("_draft_seq_lens_cpu_buf", "_block_pos_offsets", "_mask_token_id", "_full_embed_gpu",
                 "_noise_embed_scale", "_draft_block_spec_info", "draft_parallel_layout", "use_compact_draft_cache"):
        assert f"self.{attr} =" in src or f"self.{attr}:" in src, attr
    # SGLang's helpers with the keyword arguments the worker passes
    _, tree = _defined_names(os.path.join(root, "srt/speculative/eagle_worker_common.py"))
    fin = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_finalize_accept_tree_path"][0]
    assert [a.arg for a in fin.args.kwonlyargs] == ["token_to_kv_pool_allocator", "num_draft_tokens"]
    # hooked paths
    _, tree = _defined_names(os.path.join(root, "srt/model_executor/runner/decode_cuda_graph_runner.py"))
    gsi = _class_methods(tree, "DecodeCudaGraphRunner")["get_spec_info"]
    assert [a.arg for a in gsi.args.args] == ["self", "num_tokens"]
    names, _ = _defined_names(os.path.join(root, "srt/speculative/spec_info.py"))
    assert "create_dummy_verify_input" in names


KERNELS = r"""
import json, sys, ast, os, importlib.util
import torch
sys.path.insert(0, os.environ["DDTREE_SRC"])
from sglang_ddtree import build_trees
from sglang_ddtree.verify import accept_walk, to_eagle_accept, kv_move_plan, compact_accept_to_front
from sglang_ddtree.worker import tree_verify_fields
from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton
from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc_func

# SGLang's _compact_accept_to_front from the installed source (module import needs einops/transformers)
root = os.path.dirname(importlib.util.find_spec("sglang").origin)
src = open(os.path.join(root, "srt/speculative/eagle_worker_common.py")).read()
fn = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "_compact_accept_to_front"][0]
ns = {"torch": torch}
exec(compile(ast.Module(body=[fn], type_ignores=[]), "eagle_worker_common.py", "exec"), ns)
sgl_compact = ns["_compact_accept_to_front"]

import random
rng = random.Random(0)
n_cases = 0
for seed in range(12):
    g = torch.Generator().manual_seed(seed)
    bs, L, V, B = rng.randint(1, 4), rng.randint(1, 6), rng.randint(3, 20), rng.randint(1, 16)
    N = B + 1
    D = min(L, B)
    tr = build_trees(torch.randn(bs, L, V, generator=g) * 3, B, torch.randint(0, V, (bs,), generator=g))
    seq = torch.randint(1, 30, (bs,), generator=g)
    f = tree_verify_fields(tr, seq, D, seq_lens_sum=int(seq.sum()))
    post = torch.randint(0, V, (bs, N), generator=g)
    for b in range(bs):
        for i in range(N):
            kids = [c for c in range(N) if tr.valid[b, c] and tr.parents[b, c] == i]
            if kids and rng.random() < 0.8:
                post[b, i] = tr.tokens[b, rng.choice(kids)]
    ours = to_eagle_accept(accept_walk(tr, post, D), N)
    # SGLang's greedy tree verify kernel (what eagle_sample runs for greedy batches)
    predict = torch.zeros(bs * N, dtype=torch.int32)
    acc = torch.full((bs, D + 1), -1, dtype=torch.int32)
    num = torch.empty(bs, dtype=torch.int32)
    verify_tree_greedy_triton(predict, acc, num, f["draft_token"].view(bs, N), f["retrieve_index"],
                              f["retrieve_next_token"], f["retrieve_next_sibling"], post)
    assert torch.equal(acc, ours[1]), (acc, ours[1])
    assert torch.equal(num + 1, ours[2])
    assert torch.equal(predict, ours[0]), (predict, ours[0])
    # KV move indices as move_accept_tokens_to_target_kvcache builds them
    window = (torch.randperm(500, generator=g)[: bs * N] + 1).to(torch.int64)
    size = bs * (D + 1)
    tgt = torch.zeros(size, dtype=torch.int64)
    srcl = torch.zeros(size, dtype=torch.int64)
    # fill_front_out_cache_loc_func's Triton kernel (assign_extend_cache_locs) loops over
    # range(<tensor>), which Triton 3.6's interpreter cannot run: its documented contract
    # ("pack the first num_front[i] slots of request i's window") is checked instead.
    w2 = window.view(bs, N)
    packed = torch.cat([w2[b, : int(num[b]) + 1] for b in range(bs)])
    tgt[: packed.numel()] = packed
    fill_accept_out_cache_loc_func(acc, window, srcl, size)
    rt, rs = kv_move_plan(acc, num + 1, window)
    assert torch.equal(tgt, rt), (tgt, rt)
    assert torch.equal(srcl, rs), (srcl, rs)
    # front compaction of predict and hidden states
    h = torch.randn(bs * N, 5, generator=g)
    assert torch.equal(sgl_compact(h, acc, bs, num_draft_tokens=N), compact_accept_to_front(h, acc, bs, N))
    assert torch.equal(sgl_compact(predict, acc, bs, num_draft_tokens=N), compact_accept_to_front(predict, acc, bs, N))
    n_cases += 1
print(json.dumps({"cases": n_cases}))
"""


def _run(python, code, env_extra):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(env_extra)
    p = subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                       cwd="/", timeout=600)
    assert p.returncode == 0, f"rc={p.returncode}\nSTDOUT:\n{p.stdout}\nSTDERR:\n{p.stderr[-5000:]}"
    return p.stdout


def test_sglang_triton_kernels_accept_our_tensors(sglang_python):
    out = _run(sglang_python, KERNELS, {"TRITON_INTERPRET": "1", "DDTREE_SRC": SRC,
                                        "SGLANG_DDTREE_DISABLE_TRITON": "1"})
    assert json.loads(out.strip().splitlines()[-1])["cases"] == 12


def test_load_plugins_registers_both_hooks(sglang_python):
    out = _run(sglang_python, """
    import json
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.plugins.hook_registry import HookRegistry
    import sglang_ddtree.plugin as pl
    assert pl.__file__.startswith(%r), pl.__file__
    hooks = {t: [h[1].__name__ for h in HookRegistry._hooks.get(t, [])]
             for t in (pl.DUMMY_VERIFY_TARGET, pl.GRAPH_SPEC_INFO_TARGET)}
    print(json.dumps(hooks))
    """ % SRC, {"SGLANG_PLUGINS": "ddtree", "PYTHONPATH": SRC})
    r = json.loads(out.strip().splitlines()[-1])
    assert r["sglang.srt.speculative.spec_info.create_dummy_verify_input"] == ["_dummy_verify_hook"]
    assert r["sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"] == [
        "_graph_spec_info_hook"]


# ---------------------------------------------------------------- stand-ins
class _Recorder:
    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.kw = kw


@pytest.fixture
def fake_eagle(monkeypatch):
    """EagleVerifyInput / CaptureHiddenMode stand-ins (their real modules import
    transformers and the GPU stack)."""
    fbi = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
    fbi.CaptureHiddenMode = types.SimpleNamespace(FULL="FULL", NULL="NULL")
    ei = types.ModuleType("sglang.srt.speculative.eagle_info")
    ei.EagleVerifyInput = _Recorder
    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor.forward_batch_info", fbi)
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.eagle_info", ei)
    return ei


def _real_eagle_fields():
    root = _sglang_root()
    tree = ast.parse(open(os.path.join(root, "srt/speculative/eagle_info.py")).read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EagleVerifyInput":
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)}
    raise AssertionError


def test_graph_capture_dummy_is_tree_of_budget_plus_one(fake_eagle):
    from sglang_ddtree import plugin as pl

    calls = []

    def original(runner, num_tokens):
        calls.append(num_tokens)
        return "ORIGINAL"

    mask = torch.ones(10, dtype=torch.bool)
    for budget, block in ((32, 8), (8, 16), (1, 2), (256, 16)):
        algo = types.SimpleNamespace(name="DDTREE", block_size=block)
        runner = types.SimpleNamespace(
            model_runner=types.SimpleNamespace(spec_algorithm=algo, is_draft_worker=False),
            captured_req_width=budget + 1, buffers=types.SimpleNamespace(custom_mask=mask))
        d = pl._graph_spec_info_hook(original, runner, 7 * (budget + 1))
        assert isinstance(d, _Recorder)
        assert d.draft_token_num == budget + 1
        assert d.custom_mask is mask and d.topk > 1
        assert 1 <= d.spec_steps <= min(block - 1, budget) or (budget == 1 and d.spec_steps == 1)
        assert set(d.kw) <= _real_eagle_fields(), set(d.kw) - _real_eagle_fields()
    assert calls == []
    # the drafter's runner and other algorithms keep SGLang's own dummy
    draft_runner = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(spec_algorithm=types.SimpleNamespace(name="DDTREE"), is_draft_worker=True),
        captured_req_width=8, buffers=None)
    assert pl._graph_spec_info_hook(original, draft_runner, 16) == "ORIGINAL"
    other = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(spec_algorithm=types.SimpleNamespace(name="DFLASH"), is_draft_worker=False),
        captured_req_width=8, buffers=None)
    assert pl._graph_spec_info_hook(original, other, 16) == "ORIGINAL"
    assert calls == [16, 16]


def test_make_tree_verify_input_keywords(fake_eagle):
    from sglang_ddtree import build_trees
    from sglang_ddtree.worker import make_tree_verify_input

    tr = build_trees(torch.randn(3, 4, 30), 10, torch.tensor([1, 2, 3]))
    vi = make_tree_verify_input(tr, torch.tensor([4, 5, 6]), 4, seq_lens_sum=15,
                                prepared_out_cache_loc=torch.arange(33), kv_loc_plan="PLAN")
    assert set(vi.kw) <= _real_eagle_fields(), set(vi.kw) - _real_eagle_fields()
    assert vi.draft_token_num == 11 and vi.draft_token.shape == (33,) and vi.capture_hidden_mode == "FULL"
    assert vi.kv_loc_plan == "PLAN" and vi.custom_mask.numel() == 15 * 11 + 3 * 11 * 11


@pytest.fixture
def fake_dflash(monkeypatch, tmp_path):
    """SGLang's dflash_worker_v2 module replaced by a stand-in DFlashWorkerV2."""
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"block_size": 8}))
    mod = types.ModuleType("sglang.srt.speculative.dflash_worker_v2")
    state = {"spec": types.SimpleNamespace(speculative_num_draft_tokens=33,
                                           speculative_draft_model_path=str(drafter),
                                           speculative_use_rejection_sampling=False)}
    mod.get_spec = lambda: state["spec"]

    class DFlashWorkerV2:
        def __init__(self, server_args, gpu_id, nccl_port, target_worker):
            self.block_size = int(mod.get_spec().speculative_num_draft_tokens)  # what DFlash reads
            self.speculative_num_draft_tokens = self.block_size
            self.selector = None
            self.lilicorr = None
            self._is_domino = False
            self.use_compact_draft_cache = False

        def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
            return "DFLASH"

        def _maybe_build_draft_sampler(self):
            return "ARGMAX-SAMPLER"

        def _defer_target_verify_gather(self):
            return "DEFERRED"

    mod.DFlashWorkerV2 = DFlashWorkerV2
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dflash_worker_v2", mod)
    try:
        import sglang.srt.speculative as pkg

        monkeypatch.setattr(pkg, "dflash_worker_v2", mod, raising=False)
    except ImportError:
        pkg = types.ModuleType("sglang.srt.speculative")
        pkg.dflash_worker_v2 = mod
        for name in ("sglang", "sglang.srt"):
            monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "sglang.srt.speculative", pkg)
    import sglang_ddtree.worker as w

    monkeypatch.setattr(w, "_WORKER_CLS", None)
    return mod, state, drafter


def test_worker_class_through_plugin_factory(fake_dflash, tmp_path):
    mod, state, drafter = fake_dflash
    from sglang_ddtree import plugin as pl

    cls = pl._worker_factory(types.SimpleNamespace())
    assert cls.__name__ == "DDTreeWorkerV2" and issubclass(cls, mod.DFlashWorkerV2)
    w = cls(types.SimpleNamespace(), 0, 0, None)
    assert w.ddtree_budget == 32 and w.ddtree_num_verify_tokens == 33
    assert w.ddtree_block_size == 8 and w.block_size == 8, "DFlash must be built with the drafter's block size"
    assert w.ddtree_spec_steps == 7
    assert mod.get_spec().speculative_num_draft_tokens == 33, "spec view leaked out of __init__"
    assert w._defer_target_verify_gather() is None
    # the draft sampler hook returns DDTree's head (not DFlash's argmax sampler), built on
    # the target's LM head with static buffers for the largest captured batch
    import sglang.srt.runtime_context as rc
    from sglang_ddtree.head import DraftTreeHead

    monkeypatch = pytest.MonkeyPatch()
    try:
        monkeypatch.setattr(rc, "get_exec", lambda: types.SimpleNamespace(graph=types.SimpleNamespace(
            cuda_graph_config=types.SimpleNamespace(decode=types.SimpleNamespace(bs=[1, 4, 16])))))
        monkeypatch.setattr(rc, "get_parallel", lambda: types.SimpleNamespace(
            tp_group=types.SimpleNamespace(world_size=1)))
        # (the real modules import the CUDA stack)
        monkeypatch.setitem(sys.modules, "sglang.srt.lora.layers",
                            types.SimpleNamespace(unwrap_lora_layer=lambda x: x))
        monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dflash_utils",
                            types.SimpleNamespace(is_dense_head_weight=lambda t: True))
        w._target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
            model=types.SimpleNamespace(lm_head=types.SimpleNamespace(weight=torch.randn(100, 8)))))
        head = w._maybe_build_draft_sampler()
        assert isinstance(head, DraftTreeHead) and head is w._ddtree_get_head()
        assert head._cap == 16 and head.budget == 32 and head.L == 7 and head.tp == 1 and head.Vs == 100
        assert w._ddtree_head_in_graph
    finally:
        monkeypatch.undo()

    class Mode:
        def __init__(self, ext, idle=False):
            self.ext, self.idle = ext, idle

        def is_extend(self):
            return self.ext

        def is_idle(self):
            return self.idle

    w._ddtree_decode = lambda batch, **kw: "TREE"
    mk = lambda ext, idle=False, mixed=False: types.SimpleNamespace(  # noqa: E731
        forward_mode=Mode(ext, idle), is_extend_in_batch=mixed)
    assert w.forward_batch_generation(mk(True)) == "DFLASH"
    assert w.forward_batch_generation(mk(False, idle=True)) == "DFLASH"
    assert w.forward_batch_generation(mk(False, mixed=True)) == "DFLASH"
    assert w.forward_batch_generation(mk(False)) == "TREE"
    # drafter block (8) larger than the per-step KV reservation 2 x (budget + 1): rejected (budget 2: 6 slots)
    state["spec"] = types.SimpleNamespace(speculative_num_draft_tokens=3, speculative_draft_model_path=str(drafter),
                                          speculative_use_rejection_sampling=False)
    with pytest.raises(ValueError, match="per-step KV reservation"):
        cls(types.SimpleNamespace(), 0, 0, None)
    # budget 3: 8 slots hold the block (the step's window is max(budget + 1, block))
    state["spec"] = types.SimpleNamespace(speculative_num_draft_tokens=4, speculative_draft_model_path=str(drafter),
                                          speculative_use_rejection_sampling=False)
    assert cls(types.SimpleNamespace(), 0, 0, None).ddtree_budget == 3
    state["spec"] = types.SimpleNamespace(speculative_num_draft_tokens=9, speculative_draft_model_path=str(drafter),
                                          speculative_use_rejection_sampling=True)
    with pytest.raises(ValueError, match="rejection"):
        cls(types.SimpleNamespace(), 0, 0, None)
