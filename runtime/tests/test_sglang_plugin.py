"""Registration and argument handling through the REAL sglang 0.5.23 package
(CPU, .venv-sglang).  Each check runs in a fresh interpreter of .venv-sglang
(plugin loading is process-global); skipped when .venv-sglang is absent."""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from conftest import REPO

pytestmark = pytest.mark.sglang


def run_py(python, code, env_extra=None, cwd=None):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(env_extra or {})
    p = subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env=env, cwd=cwd or "/", timeout=300)
    assert p.returncode == 0, f"rc={p.returncode}\nSTDOUT:\n{p.stdout}\nSTDERR:\n{p.stderr[-4000:]}"
    return p.stdout


REGISTER = """
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
"""


def test_registered_via_entry_point(sglang_python):
    out = run_py(sglang_python, REGISTER + """
    import json
    from importlib.metadata import entry_points
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "ddtree"]
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    algo2 = SpeculativeAlgorithm.from_string("ddtree")
    sizes = {b: algo.get_num_tokens_per_req_for_target_verify(b + 1, False) for b in (1, 8, 16, 32, 64, 256)}
    import sglang.srt.speculative.spec_info as si
    print(json.dumps(dict(
        n_eps=len(eps), value=eps[0].value, dist=eps[0].dist.name,
        name=algo.name, same=algo is algo2, sizes=sizes,
        dflash_family=algo.is_dflash_family(), is_dflash=algo.is_dflash(), is_eagle=algo.is_eagle(),
        speculative=algo.is_speculative(), overlap=algo.supports_overlap,
        hooked=hasattr(si.create_dummy_verify_input, "__wrapped__"),
    )))
    """, {"SGLANG_PLUGINS": "ddtree"})
    r = json.loads(out.strip().splitlines()[-1])
    assert r["n_eps"] == 1 and r["value"] == "sglang_ddtree.plugin:register"
    assert r["dist"] == "sglang-ddtree"
    assert r["name"] == "DDTREE" and r["same"]
    # graph sizing: the target-verify CUDA graph is captured with budget + 1 tokens per request
    assert r["sizes"] == {str(b): b + 1 for b in (1, 8, 16, 32, 64, 256)}
    assert r["dflash_family"] and not r["is_dflash"] and not r["is_eagle"] and r["speculative"]
    assert r["hooked"], "create_dummy_verify_input is not wrapped by the plugin's AROUND hook"


def test_not_loaded_when_not_allowed(sglang_python):
    out = run_py(sglang_python, REGISTER + """
    try:
        SpeculativeAlgorithm.from_string("DDTREE")
        print("FOUND")
    except ValueError:
        print("UNKNOWN")
    """, {"SGLANG_PLUGINS": "something_else"})
    assert out.strip().splitlines()[-1] == "UNKNOWN"


def test_register_idempotent_and_reserved_names(sglang_python):
    run_py(sglang_python, REGISTER + """
    from sglang_ddtree.plugin import register
    register(); register()
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang_ddtree.plugin import DUMMY_VERIFY_TARGET
    assert len(HookRegistry._hooks[DUMMY_VERIFY_TARGET]) == 1
    assert SpeculativeAlgorithm.from_string("DDTREE").name == "DDTREE"
    """, {"SGLANG_PLUGINS": "ddtree"})


def test_server_args_deploy_flags(sglang_python, tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"block_size": 8, "architectures": ["DFlashDraftModel"]}))
    drafter16 = tmp_path / "drafter16"
    drafter16.mkdir()
    (drafter16 / "config.json").write_text(json.dumps({"dflash_config": {"block_size": 16}}))
    out = run_py(sglang_python, REGISTER + f"""
    import argparse, json
    from sglang.srt.server_args import ServerArgs
    p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
    def args(ndt, drafter, *extra):
        a = p.parse_args(["--model-path", "{drafter}", "--speculative-algorithm", "DDTREE",
                          "--speculative-num-draft-tokens", str(ndt),
                          "--speculative-draft-model-path", drafter, "--device", "cpu", *extra])
        return ServerArgs.from_cli_args(a)
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    res = {{}}
    sa = args(33, "{drafter}")
    algo.validate_server_args(sa)
    algo.handle_server_args(sa)
    res["b32"] = [sa.speculative_algorithm, sa.speculative_num_draft_tokens, algo.block_size,
                  algo.get_num_tokens_per_req_for_target_verify(33, False),
                  algo.get_num_tokens_per_req_for_target_verify(33, True),
                  sa.speculative_num_steps, sa.speculative_eagle_topk]
    sa = args(9, "{drafter16}")
    algo.handle_server_args(sa)
    res["b8_bs16"] = [algo.block_size, algo.get_num_tokens_per_req_for_target_verify(9, False),
                      algo.get_num_tokens_per_req_for_target_verify(9, True)]
    for name, bad in [("ndt1", args(1, "{drafter}")),
                      ("blocksize_flag", args(33, "{drafter}", "--speculative-dflash-block-size", "8"))]:
        try:
            algo.validate_server_args(bad); res[name] = "accepted"
        except ValueError as e:
            res[name] = "rejected"
    print(json.dumps(res))
    """, {"SGLANG_PLUGINS": "ddtree"})
    r = json.loads(out.strip().splitlines()[-1])
    assert r["b32"] == ["DDTREE", 33, 8, 33, 8, 1, 1]
    assert r["b8_bs16"] == [16, 9, 16]
    assert r["ndt1"] == "rejected" and r["blocksize_flag"] == "rejected"


def test_dummy_verify_hook_routes_ddtree(sglang_python):
    out = run_py(sglang_python, REGISTER + """
    import torch
    import sglang_ddtree.plugin as pl
    import sglang.srt.speculative.spec_info as si
    seen = []
    pl.make_dummy_verify_input = lambda mask, n, bs=None: seen.append((mask.shape, n)) or "DDTREE-DUMMY"
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    mask = torch.ones(4, dtype=torch.bool)
    got = si.create_dummy_verify_input(algo, mask, 33, False)
    got_kw = si.create_dummy_verify_input(spec_algorithm=algo, custom_mask=mask, num_tokens_per_req=17, is_draft_worker=False)
    # the draft worker's dummy input stays SGLang's (DFlash family); on this CPU
    # venv the original may fail to import its CUDA-side modules: either way it is not ours
    try:
        other = si.create_dummy_verify_input(algo, mask, 8, True)
    except Exception as e:
        other = type(e).__name__
    print(got, got_kw, seen[0][1], seen[1][1], other != "DDTREE-DUMMY")
    """, {"SGLANG_PLUGINS": "ddtree"})
    assert out.strip().splitlines()[-1] == "DDTREE-DUMMY DDTREE-DUMMY 33 17 True"


def test_wheel_builds_and_installs_no_deps(sglang_python, tmp_path):
    build = os.path.join(REPO, "scripts", "build-runtime-wheel")
    env = dict(os.environ, PYTHON=sglang_python)
    whl = subprocess.run([build, str(tmp_path / "w1")], capture_output=True, text=True, env=env, timeout=300)
    assert whl.returncode == 0, whl.stderr
    path1 = whl.stdout.strip().splitlines()[-1]
    whl2 = subprocess.run([build, str(tmp_path / "w2")], capture_output=True, text=True, env=env, timeout=300)
    path2 = whl2.stdout.strip().splitlines()[-1]
    assert open(path1, "rb").read() == open(path2, "rb").read(), "wheel build is not reproducible"
    with zipfile.ZipFile(path1) as z:
        names = z.namelist()
        ep = z.read("sglang_ddtree-0.1.0.dist-info/entry_points.txt").decode()
        meta = z.read("sglang_ddtree-0.1.0.dist-info/METADATA").decode()
    assert "[sglang.srt.plugins]" in ep and "ddtree = sglang_ddtree.plugin:register" in ep
    assert "Requires-Dist" not in meta.split("Provides-Extra")[0]
    assert not any(n.startswith("tests/") for n in names)
    target = tmp_path / "site"
    p = subprocess.run([sglang_python, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                        "--target", str(target), path1], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = run_py(sglang_python, """
    import sys
    from importlib.metadata import entry_points
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "ddtree"]
    mine = [ep for ep in eps if str(ep.dist.locate_file("")).startswith(sys.path[1])]
    assert mine, [str(e.dist.locate_file("")) for e in eps]
    mine[0].load()()
    import sglang_ddtree
    assert sglang_ddtree.__file__.startswith(sys.path[1]), sglang_ddtree.__file__
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    print(SpeculativeAlgorithm.from_string("DDTREE").name)
    """, {"PYTHONPATH": str(target)})
    assert out.strip().splitlines()[-1] == "DDTREE"


def test_venv_has_wheel_install_not_source(sglang_python):
    out = run_py(sglang_python, """
    from importlib.metadata import distribution
    d = distribution("sglang-ddtree")
    print(d.version, d.read_text("direct_url.json") or "")
    """)
    assert out.startswith("0.1.0")
