"""Issue #36, opsctl's side: a ddtree release's Triton cache is complete before the switch.

What a release needs (specialisations from its budget or schedule, TP, capture list), when a
cache's manifest covers it, and the stage's `triton` step deciding against a host (a tmp install
root through LocalConnection, with a stand-in nvidia-smi and SGLang environment Python):
complete -> nothing; a controller cache -> shipped; torch and triton on the host -> compiled
there (CUDA_VISIBLE_DEVICES empty, the release's site/ on PYTHONPATH); else a note with the cost
and the fix. The second run of each changes nothing. No real compile here (30 s of CPU per
budget): the filler's own arguments are checked against `--count-only` where .venv-sglang exists.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from hostdirs import REPO, host_config, release
from opsctl import triton
from opsctl.config import load_inventory, resolve_profile
from opsctl.errors import ConfigError, HostError
from opsctl.flow.plan import Plan
from opsctl.flow.stage import _release_vars, triton_step
from opsctl.flow.steps import Steps
from opsctl.host.connection import LocalConnection
from opsctl.integrity import verify_release
from opsctl.releases import HostState
from opsctl.render import env_python, render
from opsctl.schedule import captured_batch_sizes

SHA = "ab12cd34ef56" + "0" * 52
OTHER_SHA = "ffff00001111" + "0" * 52
KIMI = {"model_type": "kimi_k25", "text_config": {"hidden_size": 7168, "vocab_size": 163840}}
SHAPE = triton.ModelShape(163840, 7168)
CAP32 = tuple(captured_batch_sizes(32))


def _needs(budget=16, **kw) -> triton.Needs:
    base = dict(arch="sm_120", runtime=SHA, block=8, vocab_shard=20480, hidden=7168, tp=8, capture_bs=CAP32,
                budgets=(budget,))
    return triton.Needs(**{**base, **kw})


def _manifest(specs, *, runtime=SHA, hidden=7168, tp=8, capture_bs=CAP32, triton_version="3.6.0") -> dict:
    return {"format": 1, "runtime": runtime, "hidden": hidden, "tp": tp, "dtype": "bf16",
            "capture_bs": list(capture_bs), "triton": triton_version,
            "specialisations": [{"budget": b, "block": 8, "vocab_shard": 20480, "arch": "sm_120"} for b in specs]}


# --------------------------------------------------------------------------- what a release needs


def test_a_single_budget_needs_one_specialisation_over_the_whole_capture_list():
    n = triton.needs_for(resolve_profile("ddtree", 16), SHAPE, arch="sm_120", runtime=SHA)
    assert n.specialisations == (triton.Specialisation(16, 8, 20480, "sm_120"),)
    assert (n.tp, n.hidden, n.vocab_shard, n.capture_bs) == (8, 7168, 20480, CAP32)
    args = n.aot_args()
    assert args[args.index("--budgets") + 1] == "16" and "--schedule" not in args
    assert args[args.index("--capture-bs") + 1] == ",".join(map(str, CAP32))
    assert args[args.index("--runtime") + 1] == SHA and args[args.index("--arch") + 1] == "sm_120"


def test_a_schedule_needs_each_band_with_a_tree_and_a_captured_size():
    prof = resolve_profile("ddtree", budget_schedule="1:16,8:4,32:0")
    n = triton.needs_for(prof, SHAPE, arch="sm_120", runtime=SHA)
    assert [s.budget for s in n.specialisations] == [4, 16]
    args = n.aot_args()
    assert args[args.index("--schedule") + 1] == "1:16,8:4,32:0" and "--budgets" not in args
    # a last band above the largest captured size has no graph, so no head is compiled at start for it
    above = triton.needs_for(resolve_profile("ddtree", budget_schedule="1:16,8:4,64:8"), SHAPE, arch="sm_120",
                             runtime=SHA)
    assert [s.budget for s in above.specialisations] == [4, 16]


def test_tp_shards_the_vocabulary_and_the_capture_list_follows_the_profile():
    prof = resolve_profile("ddtree", 16, overrides={"ddtree": {"tp_size": 4, "cuda_graph_max_bs": 64,
                                                              "max_running_requests": 48}})
    n = triton.needs_for(prof, SHAPE, arch="sm_90", runtime=SHA)
    assert (n.tp, n.vocab_shard) == (4, 40960)
    assert n.specialisations[0] == triton.Specialisation(16, 8, 40960, "sm_90")
    assert n.capture_bs == tuple(captured_batch_sizes(64, 48)) and max(n.capture_bs) == 48
    assert triton.needs_for(resolve_profile("ar-tp8"), SHAPE, arch="sm_120", runtime=SHA) is None


@pytest.mark.parametrize("text,arch", [("12.0", "sm_120"), ("9.0", "sm_90"), ("sm_120", "sm_120"),
                                       ("sm90", "sm_90"), ("120", "sm_120"), ("banana", None), ("", None)])
def test_arch_names(text, arch):
    assert triton.arch_name(text) == arch


def test_the_model_shape_comes_from_config_json_top_level_or_text_config():
    assert triton.ModelShape.from_config(KIMI) == SHAPE
    assert triton.ModelShape.from_config({"vocab_size": 1000, "hidden_size": 64}) == triton.ModelShape(1000, 64)
    assert triton.ModelShape.from_config({"model_type": "x"}) is None and triton.ModelShape.from_config(None) is None


def test_needs_named_without_an_inventory_are_checked():
    n = triton.needs_from(arch="sm_120", runtime=SHA, budgets=[16, 8], block=8, vocab_shard=20480, hidden=7168,
                          tp=8, max_bs=32)
    assert [s.budget for s in n.specialisations] == [8, 16] and n.capture_bs == CAP32
    with pytest.raises(ConfigError, match="no budget named"):
        triton.needs_from(arch="sm_120", runtime=SHA, block=8, vocab_shard=20480, hidden=7168, tp=8, max_bs=32)
    with pytest.raises(ConfigError, match="--vocab-shard 0"):
        triton.needs_from(arch="sm_120", runtime=SHA, budgets=[16], block=8, vocab_shard=0, hidden=7168, tp=8,
                          max_bs=32)
    with pytest.raises(ConfigError, match="--schedule"):
        triton.needs_from(arch="sm_120", runtime=SHA, schedule="8:16", block=8, vocab_shard=20480, hidden=7168,
                          tp=8, max_bs=32)


# --------------------------------------------------------------------------- coverage


def test_a_manifest_listing_every_specialisation_covers_the_release():
    assert triton.coverage(_manifest([16, 4]), _needs(16)).covered
    assert triton.coverage(_manifest([16]), _needs(16), triton_version="3.6.0").covered


def test_a_missing_specialisation_is_named():
    cov = triton.coverage(_manifest([4]), _needs(16))
    assert not cov.covered and cov.missing == (triton.Specialisation(16, 8, 20480, "sm_120"),)
    assert "budget 16" in cov.reason
    assert not triton.coverage({}, _needs(16)).covered and triton.coverage({}, _needs(16)).reason == "no manifest"


def test_a_capture_list_that_lacks_the_release_batch_sizes_does_not_cover():
    cov = triton.coverage(_manifest([16], capture_bs=captured_batch_sizes(16)), _needs(16))
    assert not cov.covered and "lack 18" in cov.reason
    # a longer capture list covers a shorter one
    assert triton.coverage(_manifest([16], capture_bs=captured_batch_sizes(64)), _needs(16)).covered


@pytest.mark.parametrize("change,says", [
    ({"runtime": OTHER_SHA}, "written for runtime ffff00001111"),
    ({"hidden": 4096}, "hidden 4096"),
    ({"tp": 4}, "tp 4"),
])
def test_a_cache_of_another_runtime_model_or_tp_does_not_cover(change, says):
    cov = triton.coverage(_manifest([16], **change), _needs(16))
    assert not cov.covered and says in cov.reason and cov.missing == _needs(16).specialisations


def test_the_triton_version_counts_only_where_the_host_s_is_known():
    doc = _manifest([16], triton_version="3.6.0")
    assert triton.coverage(doc, _needs(16)).covered
    cov = triton.coverage(doc, _needs(16), triton_version="3.4.0")
    assert not cov.covered and "Triton 3.6.0" in cov.reason


def test_merging_keeps_the_host_s_specialisations_only_where_they_stay_true():
    host_doc, shipped = _manifest([4]), _manifest([16])
    assert [s["budget"] for s in triton.merge_manifests(host_doc, shipped)["specialisations"]] == [4, 16]
    short = _manifest([4], capture_bs=captured_batch_sizes(16))   # compiled for fewer batch sizes
    assert [s["budget"] for s in triton.merge_manifests(short, shipped)["specialisations"]] == [16]
    assert [s["budget"] for s in triton.merge_manifests(_manifest([4], runtime=OTHER_SHA), shipped)
            ["specialisations"]] == [16]


# --------------------------------------------------------------------------- the stage step on a host

FAKE_SMI = "#!/bin/sh\nprintf '12.0\\n12.0\\n'\n"
# the host's SGLang environment: package metadata for the fact, and the filler (records its call,
# writes kernels and the manifest as `python -m sglang_ddtree.aot` does)
FAKE_ENV_PYTHON = r'''#!{python}
import json, os, sys
if sys.argv[1] == "-c":
    print(json.dumps({{"torch": "2.9.1", "triton": "3.5.1"}}))
    sys.exit(0)
assert sys.argv[1:3] == ["-m", "sglang_ddtree.aot"], sys.argv
a = sys.argv[3:]
arg = lambda k: a[a.index(k) + 1] if k in a else None
with open(os.environ["OPSCTL_TEST_CALLS"], "a") as f:
    f.write(json.dumps({{"argv": a, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "pythonpath": os.environ.get("PYTHONPATH")}}) + "\n")
if os.environ.get("OPSCTL_TEST_FAIL"):
    print("RuntimeError: ptxas failed", file=sys.stderr)
    sys.exit(1)
out = arg("--out")
os.makedirs(os.path.join(out, "KERNELHASH"), exist_ok=True)
open(os.path.join(out, "KERNELHASH", "head.cubin"), "wb").write(b"cubin")
budgets = [int(b) for b in (arg("--budgets") or "").split(",") if b]
doc = {{"format": 1, "runtime": arg("--runtime"), "hidden": int(arg("--hidden")), "tp": int(arg("--tp")),
       "dtype": arg("--dtype"), "triton": "3.5.1", "capture_bs": [int(x) for x in arg("--capture-bs").split(",")],
       "specialisations": [{{"budget": b, "block": int(arg("--block")), "vocab_shard": int(arg("--vocab-shard")),
                            "arch": arg("--arch")}} for b in budgets]}}
json.dump(doc, open(os.path.join(out, "opsctl-triton-manifest.json"), "w"))
print(json.dumps({{**doc, "fill": {{"distinct_kernels": 9, "wall_s": 1.0}}}}))
'''


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A host root with the lab inventory's host, a model config.json, an nvidia-smi of sm_120 GPUs,
    a staged ddtree release, and an empty controller cache."""
    root = tmp_path / "root"
    model = tmp_path / "models/kimi"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(KIMI))
    host_config(tmp_path, root)
    gv = tmp_path / "inv/group_vars/all.yml"
    gv.write_text(gv.read_text().replace("path: /srv/models/kimi-k2.6", f"path: {model}"))
    host = load_inventory(tmp_path / "inv").hosts["lab"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(triton, "CACHE_DIR", tmp_path / "controller-cache")
    monkeypatch.setenv("OPSCTL_TEST_CALLS", str(tmp_path / "calls.jsonl"))
    profile = host.profile("ddtree", 16)
    rid = "ddtree-b16-new"
    release(root, rid, "ddtree", kind="ddtree", budget=16)
    (root / "shared/cache/triton" / triton.cache_id(SHA)).mkdir(parents=True)   # the prepare play makes it
    plan = SimpleNamespace(host=host, profile=profile, release=rid, runtime_sha=SHA, triton=None, triton_outcome=None)
    events: list[dict] = []
    return SimpleNamespace(root=root, host=host, profile=profile, plan=plan, events=events, tmp=tmp_path,
                           steps=Steps(events.append, host.name), conn=LocalConnection(),
                           cache=root / "shared/cache/triton" / triton.cache_id(SHA), calls=tmp_path / "calls.jsonl")


def _plan(s, *, env_ready=True):
    s.plan.triton = triton.plan_release(s.conn, s.host, s.profile, SHA, env_ready=env_ready)
    return s.plan.triton


def _run_step(s) -> tuple[dict, dict]:
    _plan(s)
    s.events.clear()
    out = triton_step(s.conn, s.plan, s.steps)
    done = [e for e in s.events if e.get("event") == "step" and e["status"] != "start"]
    assert [e["step"] for e in done] == ["triton"]
    return out, done[0]


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(d.rglob("*")) if p.is_file()}


def _env_python(s, **env):
    py = Path(str(env_python(s.host)))
    py.parent.mkdir(parents=True, exist_ok=True)
    py.write_text(FAKE_ENV_PYTHON.format(python=sys.executable))
    py.chmod(0o755)


def _controller_cache(s, specs=(16,), **kw) -> Path:
    d = triton.controller_cache_dir(SHA, "sm_120")
    (d / "K1").mkdir(parents=True)
    (d / "K1/kernel.cubin").write_bytes(b"\x7fELF cubin")
    (d / "K1/kernel.json").write_text("{}")
    (d / triton.MANIFEST_NAME).write_text(json.dumps(_manifest(list(specs), **kw)))
    return d


def test_a_complete_cache_changes_nothing(site):
    (site.cache / triton.MANIFEST_NAME).write_text(json.dumps(_manifest([16])))
    before = _tree(site.root)
    out, ev = _run_step(site)
    assert out["state"] == "complete" and out["specialisations"] == 1 and out["arch"] == "sm_120"
    assert ev["status"] == "ok" and ev["detail"] == "cache complete (1 specialisations), no compile at start"
    assert ev["triton"] == out and _tree(site.root) == before


def test_without_torch_or_a_controller_cache_the_step_names_the_cost_and_the_fix(site):
    before = _tree(site.root)
    out, ev = _run_step(site)
    assert out["state"] == "missing" and out["compiled_at_start"] == 1
    assert ev["status"] == "warn"
    assert ev["detail"] == ("no Triton cache for sm_120 on lab: the first start compiles 1 specialisation(s); "
                            "build one with 'opsctl runtime build --triton-arch sm_120' to ship it")
    assert _tree(site.root) == before
    again, _ = _run_step(site)
    assert again["state"] == "missing" and _tree(site.root) == before


def test_a_controller_cache_is_shipped_merged_and_then_complete(site):
    (site.cache / triton.MANIFEST_NAME).write_text(json.dumps(_manifest([4])))   # another budget already there
    _controller_cache(site)
    d = _plan(site)
    assert d.action == "ship" and "ship the controller's" in d.describe()
    out, ev = _run_step(site)
    assert out["state"] == "shipped" and out["files"] == 2 and out["bytes_sent"] > 0 and ev["status"] == "ok"
    assert (site.cache / "K1/kernel.cubin").read_bytes() == b"\x7fELF cubin"
    doc = json.loads((site.cache / triton.MANIFEST_NAME).read_text())
    assert [s["budget"] for s in doc["specialisations"]] == [4, 16] and doc["runtime"] == SHA
    assert not list(site.cache.parent.glob(".*incoming*"))   # the tar stream is gone
    after = _tree(site.root)
    again, ev2 = _run_step(site)
    assert again["state"] == "complete" and _tree(site.root) == after


def test_a_controller_cache_of_another_triton_is_not_shipped(site):
    _env_python(site)                                     # the host's Triton is 3.5.1
    _controller_cache(site, triton_version="3.6.0")
    d = _plan(site)
    assert d.action == "compile" and "Triton 3.6.0" in d.why_not_shipped


def test_the_host_compiles_without_its_gpus_and_the_second_run_changes_nothing(site):
    _env_python(site)
    d = _plan(site)
    assert d.action == "compile" and "compile 1 specialisation(s) on the host before the switch" in d.describe()
    out, ev = _run_step(site)
    assert out["state"] == "compiled" and out["kernels"] == 9 and ev["status"] == "ok"
    call = json.loads(site.calls.read_text())
    assert call["cuda"] == "" and call["pythonpath"] == str(site.root / "releases/ddtree-b16-new/site")
    a = call["argv"]
    assert a[a.index("--out") + 1] == str(site.cache) and a[a.index("--runtime") + 1] == SHA
    assert a[a.index("--budgets") + 1] == "16" and a[a.index("--vocab-shard") + 1] == "20480"
    after = _tree(site.root)
    again, _ = _run_step(site)
    assert again["state"] == "complete" and _tree(site.root) == after
    assert len(site.calls.read_text().splitlines()) == 1


def test_a_manifest_for_another_shape_is_dropped_before_the_host_compiles(site):
    _env_python(site)
    (site.cache / triton.MANIFEST_NAME).write_text(json.dumps(_manifest([4], hidden=4096)))
    out, _ = _run_step(site)
    doc = json.loads((site.cache / triton.MANIFEST_NAME).read_text())
    assert out["state"] == "compiled" and [s["budget"] for s in doc["specialisations"]] == [16]


def test_a_failed_compile_costs_the_start_not_the_deploy(site, monkeypatch):
    _env_python(site)
    monkeypatch.setenv("OPSCTL_TEST_FAIL", "1")
    out, ev = _run_step(site)
    assert out["state"] == "missing" and "ptxas failed" in out["error"] and ev["status"] == "warn"
    assert "the first start compiles 1 specialisation(s)" in ev["detail"]


def test_a_host_without_a_gpu_architecture_is_a_host_error(site, monkeypatch):
    (site.tmp / "bin/nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    with pytest.raises(HostError, match="reports no GPU compute capability"):
        _plan(site)


def test_the_plan_says_what_the_step_would_do_without_compiling(site):
    d = _plan(site, env_ready=False)   # a first deploy: the environment comes with the prepare play
    assert d.action == "compile" and d.env_pending and "if that has torch and triton" in d.describe()
    assert not site.calls.exists()
    assert d.as_dict()["missing"] == [{"budget": 16, "block": 8, "vocab_shard": 20480, "arch": "sm_120"}]


def test_the_release_gets_its_cache_link_and_the_manifest_its_needs(site):
    host, profile = site.host, site.profile
    plan = Plan(host, profile, render(host, profile), "ddtree-b16-new", HostState(None), None, SHA, None, None, "")
    plan.triton = _plan(site)
    v = _release_vars(plan, "")
    assert v["opsctl_triton_cache_id"] == "ab12cd34ef56"
    manifest = json.loads(next(__import__("base64").b64decode(f["content_b64"]) for f in v["opsctl_release_files"]
                               if f["path"] == "manifest.json"))
    assert manifest["triton"]["arch"] == "sm_120" and manifest["triton"]["specialisations"][0]["budget"] == 16
    assert plan.as_dict()["triton"]["action"] == "missing"
    ar = host.profile("ar-tp8")
    plain = Plan(host, ar, render(host, ar), "ar-tp8-x", HostState(None), None, None, None, None, "")
    assert _release_vars(plain, "")["opsctl_triton_cache_id"] == "" and "triton" not in plain.manifest()


def test_the_release_check_does_not_report_the_triton_link(site):
    rel = site.root / "releases/ddtree-b16-new"
    os.symlink(triton.release_link_target(SHA), rel / "triton")
    assert (rel / "triton").resolve() == site.cache.resolve()
    rep = verify_release(site.conn, site.host, "ddtree-b16-new")
    assert rep.ok, rep.problems


# --------------------------------------------------------------------------- render and the prepare play


def test_only_ddtree_reads_its_cache_through_the_release_link():
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    assert render(host, host.profile("ddtree", 16)).env["TRITON_CACHE_DIR"] == "/opt/opsctl/current/triton"
    assert render(host, host.profile("ar-tp8")).env["TRITON_CACHE_DIR"] == "/opt/opsctl/shared/cache/triton"


def _prepare_trees() -> tuple[dict, list[dict]]:
    play = yaml.safe_load((REPO / "playbooks/prepare.yml").read_text())[0]
    tasks: list[dict] = []

    def walk(items):
        for t in items or []:
            tasks.append(t)
            walk(t.get("block"))

    walk(play["tasks"])
    return play["vars"], [t["opsctl_tree"] for t in tasks if "opsctl_tree" in t]


@pytest.mark.parametrize("cache_id,user", [("ab12cd34ef56", "sglang"), ("", "")])
def test_the_prepare_play_makes_the_shared_cache_and_the_release_link(cache_id, user):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    play_vars, (layout, staged) = _prepare_trees()
    t = Templar(loader=DataLoader(), variables={
        **play_vars, "opsctl_root": "/opt/opsctl", "opsctl_release_id": "r", "opsctl_env_dir": "/e",
        "opsctl_wheelhouse_dir": "", "opsctl_triton_cache_id": cache_id, "opsctl_service_user": user,
        "opsctl_drafter_digest": "d" * 64})
    dirs, links = t.template(layout["dirs"]), t.template(staged["links"])
    assert {"path": "shared/cache/triton", "owner": user} in dirs and {"path": "releases"} in dirs
    assert {"path": "drafter", "target": "../../shared/drafters/" + "d" * 64} in links
    if cache_id:
        assert {"path": f"shared/cache/triton/{cache_id}", "owner": user} in dirs
        assert {"path": "triton", "target": triton.release_link_target(SHA)} in links
    else:
        assert len(links) == 1 and not any(d["path"].startswith("shared/cache/triton/") for d in dirs)


# --------------------------------------------------------------------------- the controller's cache (runtime build)


FAKE_COMPILER = r'''#!{python}
import json, os, sys
if sys.argv[1] == "-c":
    print("3.6.0")
    sys.exit(0)
a = sys.argv[3:]
arg = lambda k: a[a.index(k) + 1] if k in a else None
with open(os.environ["OPSCTL_TEST_CALLS"], "a") as f:
    f.write(json.dumps({{"argv": a, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "site": sorted(os.listdir(os.environ["PYTHONPATH"]))}}) + "\n")
out = arg("--out")
mp = os.path.join(out, "opsctl-triton-manifest.json")
old = json.load(open(mp)) if os.path.exists(mp) else {{}}
budgets = [int(b) for b in (arg("--budgets") or "").split(",") if b]
if arg("--schedule"):
    budgets += [int(p.split(":")[1]) for p in arg("--schedule").split(",") if int(p.split(":")[1]) > 0]
new = [{{"budget": b, "block": int(arg("--block")), "vocab_shard": int(arg("--vocab-shard")), "arch": arg("--arch")}}
       for b in budgets]
doc = {{"format": 1, "runtime": arg("--runtime"), "hidden": int(arg("--hidden")), "tp": int(arg("--tp")),
       "dtype": "bf16", "triton": "3.6.0", "capture_bs": [int(x) for x in arg("--capture-bs").split(",")],
       "specialisations": old.get("specialisations", []) + new}}
os.makedirs(os.path.join(out, "K" + str(budgets[0])), exist_ok=True)
json.dump(doc, open(mp, "w"))
print(json.dumps({{**doc, "fill": {{"distinct_kernels": 9 * len(new)}}}}))
'''


@pytest.fixture
def compiler(tmp_path, monkeypatch):
    py = tmp_path / "compiler-python"
    py.write_text(FAKE_COMPILER.format(python=sys.executable))
    py.chmod(0o755)
    wheel = tmp_path / "sglang_ddtree-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang_ddtree/__init__.py", "")
        zf.writestr("sglang_ddtree/aot.py", "")
    monkeypatch.setattr(triton, "CACHE_DIR", tmp_path / "controller-cache")
    monkeypatch.setenv("OPSCTL_TEST_CALLS", str(tmp_path / "calls.jsonl"))
    return SimpleNamespace(python=str(py), wheel=wheel, out=tmp_path / "dist", calls=tmp_path / "calls.jsonl")


def test_the_controller_cache_is_filled_from_the_wheel_and_copied_to_out(compiler):
    needs = [_needs(16), _needs(8), triton.Needs("sm_120", SHA, 8, 20480, 7168, 8, CAP32, (), "1:32,8:4,32:0")]
    build = triton.build_cache(compiler.wheel, SHA, needs, compiler.out, compiler=triton.check_python(compiler.python))
    calls = [json.loads(line) for line in compiler.calls.read_text().splitlines()]
    assert len(calls) == 1 and calls[0]["cuda"] == "" and calls[0]["site"] == ["sglang_ddtree"]
    a = calls[0]["argv"]
    assert a[a.index("--budgets") + 1] == "8,16" and a[a.index("--schedule") + 1] == "1:32,8:4,32:0"
    assert a[a.index("--out") + 1] == str(triton.controller_cache_dir(SHA, "sm_120"))
    assert build.directory == compiler.out / "triton-sm_120-ab12cd34ef56"
    assert triton.read_local_manifest(build.directory) == triton.read_local_manifest(build.controller_dir)
    assert sorted(s.budget for s in build.specialisations) == [4, 8, 16, 32] and build.triton_version == "3.6.0"
    assert build.as_dict()["kernels"] == 36


def test_a_controller_cache_for_another_shape_is_started_over(compiler):
    d = triton.controller_cache_dir(SHA, "sm_120")
    d.mkdir(parents=True)
    (d / triton.MANIFEST_NAME).write_text(json.dumps(_manifest([4], tp=4)))
    build = triton.build_cache(compiler.wheel, SHA, [_needs(16)], compiler.out,
                               compiler=triton.check_python(compiler.python))
    assert [s.budget for s in build.specialisations] == [16]


def test_one_cache_describes_one_shape():
    with pytest.raises(ConfigError, match="different shapes"):
        triton.fill_groups([_needs(16), _needs(16, tp=4, vocab_shard=40960)])
    with pytest.raises(ConfigError, match="nothing to compile"):
        triton.fill_groups([])
    runs = triton.fill_groups([_needs(16), _needs(8, schedule="1:8,8:4"), _needs(4, budgets=(), schedule="1:4,8:2")])
    assert [(r.budgets, r.schedule) for r in runs] == [((8, 16), "1:8,8:4"), ((), "1:4,8:2")]


def test_the_inventory_s_ddtree_profiles_with_named_budgets():
    inv = load_inventory(REPO / "inventories/lab")
    needs, skipped = triton.needs_for_inventory(inv, None, arch="sm_120", runtime=SHA, budgets=[16, 8],
                                                vocab_size=163840, hidden=7168)
    assert [n.budgets for n in needs] == [(8,), (16,)] and all(n.vocab_shard == 20480 for n in needs)
    assert skipped == []
    needs, skipped = triton.needs_for_inventory(inv, None, arch="sm_120", runtime=SHA, vocab_size=163840,
                                                hidden=7168)
    assert needs == [] and "ddtree" in skipped[0] and "--budgets" in skipped[0]


def test_the_inventory_mode_reads_the_model_s_sizes_on_the_host(site):
    inv = load_inventory(site.tmp / "inv")
    needs, _ = triton.needs_for_inventory(inv, "lab", arch="sm_120", runtime=SHA, schedule="1:16,8:4,32:0",
                                          connect=lambda host: LocalConnection())
    assert [s.budget for s in needs[0].specialisations] == [4, 16] and needs[0].hidden == 7168


def test_a_python_without_torch_is_named():
    with pytest.raises(ConfigError, match="cannot import torch and triton") as exc:
        triton.check_python("/bin/false")
    assert "--python" in exc.value.fix


# --------------------------------------------------------------------------- the command line


def _opsctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opsctl", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("args,says", [
    (["--budgets", "16"], "--budgets given without --triton-arch"),
    (["--triton-arch", "sm_120", "--budgets", "16"], "needs --vocab-shard, --hidden"),
    (["--triton-arch", "ampere", "--budgets", "16", "--vocab-shard", "1", "--hidden", "2"], "not a GPU architecture"),
    (["--triton-arch", "sm_120", "--budgets", "8,x", "--vocab-shard", "1", "--hidden", "2"], "not a list of numbers"),
    (["--triton-arch", "sm_120", "-i", "inventories/lab", "--tp", "4"], "--tp with -i"),
    (["--triton-arch", "sm_120", "--limit", "lab", "--budgets", "16"], "--limit given without -i"),
    (["--triton-arch", "sm_120", "--budgets", "16", "--vocab-shard", "20480", "--hidden", "7168",
      "--python", "/nonexistent/python"], "--python /nonexistent/python"),
])
def test_runtime_build_refuses_bad_input_in_one_line_before_building(args, says, tmp_path):
    p = _opsctl("runtime", "build", "--out", str(tmp_path / "dist"), *args)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], p.stderr
    assert not (tmp_path / "dist").exists()


def test_runtime_build_help_has_an_example():
    p = _opsctl("runtime", "build", "--help")
    assert p.returncode == 0 and "opsctl runtime build --triton-arch sm_120 -i" in p.stdout


# --------------------------------------------------------------------------- the filler takes these arguments

SGLANG_PY = next((p for p in (os.environ.get("OPSCTL_SGLANG_PYTHON"), str(REPO / ".venv-sglang/bin/python"))
                  if p and Path(p).exists()), None)


@pytest.mark.sglang
@pytest.mark.skipif(SGLANG_PY is None, reason="no .venv-sglang (torch + triton): run scripts/sglang-venv")
def test_the_runtime_s_filler_accepts_opsctl_s_arguments():
    """`--count-only` enumerates without compiling (a few seconds of CPU: torch's import)."""
    n = triton.needs_for(resolve_profile("ddtree", budget_schedule="1:16,8:4,32:0"), SHAPE, arch="sm_120",
                         runtime=SHA)
    p = subprocess.run([SGLANG_PY, "-m", triton.AOT_MODULE, *n.aot_args(), "--out", "/nonexistent", "--count-only"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO / "runtime/src"), "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 0, p.stderr
    assert sorted(int(b) for b in json.loads(p.stdout.splitlines()[-1])["per_budget"]) == [4, 16]


def test_kernels_a_start_compiled_and_recorded_cover_the_next_deploy(site):
    """Issue #49: the server's start compiled its kernels into the release's cache and recorded them
    (`filled_by: start`, no runtime key: the lab's SGLang does so); the next deploy of the same
    runtime found "no Triton cache" and warned that the first start compiles, and that start had
    no compile phase. The directory is the runtime's own: its manifest is that runtime's."""
    doc = {k: v for k, v in _manifest([16]).items() if k not in ("runtime", "triton")}
    (site.cache / triton.MANIFEST_NAME).write_text(json.dumps({**doc, "filled_by": "start"}))
    out, ev = _run_step(site)
    assert out["state"] == "complete" and ev["status"] == "ok", (out, ev)
    assert "no Triton cache" not in ev["detail"]
    # a manifest without a runtime that a start did not write is still not trusted
    (site.cache / triton.MANIFEST_NAME).write_text(json.dumps(doc))
    out, ev = _run_step(site)
    assert out["state"] == "missing" and ev["status"] == "warn"
