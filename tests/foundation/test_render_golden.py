"""Rendering is pure: the same inventory and profile give the same bytes, and those
bytes are the reviewed golden files. Regenerate with OPSCTL_UPDATE_GOLDEN=1 after an
intended change and review the diff."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from opsctl.config import load_inventory, resolve_profile
from opsctl.render import render

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
CASES = [("blackwell", "ar-tp8", None), ("blackwell", "ar-ep8", None), ("blackwell", "dflash", None),
         ("blackwell", "ddtree", 16), ("blackwell", "ddtree", 32), ("lab", "ddtree", 16), ("lab", "ar-tp8", None),
         ("blackwell", "ddtree", "1:32,8:16,32:0"),  # a budget schedule (str)
         # tune's trial releases (issue #37): every candidate captured at one start (tuple)
         ("lab", "ddtree", ("4", "8", "16", "1:16,6:0", "1:8,6:0")),
         ("blackwell", "ddtree", ("8", "16", "32", "1:32,3:16,10:0"))]
# an explicit capture list (issue #51: --capture-from-traffic's choice): (inventory, profile, budget, list)
CAPTURE_CASES = [("blackwell", "ddtree", 16, (1, 2, 4, 9, 16, 32)), ("lab", "ar-tp8", None, (1, 3, 8))]


def _profile(host, prof, budget):
    if isinstance(budget, tuple):
        return host.profile(prof, trial_set=budget)
    if isinstance(budget, str):
        return host.profile(prof, budget_schedule=budget)
    return host.profile(prof, budget)


def _case_id(case) -> str:
    inv, prof, budget = case
    if isinstance(budget, tuple):
        return f"{inv}-{prof}-trial-" + "-".join(c.replace(":", "b").replace(",", "_") for c in budget)
    if isinstance(budget, str):
        return f"{inv}-{prof}-s" + "-".join(p.replace(":", "b") for p in budget.split(","))
    return f"{inv}-{prof}" + (f"-b{budget}" if budget else "")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_rendered_files_match_golden(case):
    inv_name, prof, budget = case
    host = next(iter(load_inventory(REPO / "inventories" / inv_name).hosts.values()))
    rendered = render(host, _profile(host, prof, budget))
    out = {**rendered.release_files, "argv.json": json.dumps(rendered.argv, indent=1) + "\n"}
    gdir = GOLDEN / _case_id(case)
    if os.environ.get("OPSCTL_UPDATE_GOLDEN"):
        gdir.mkdir(parents=True, exist_ok=True)
        for name, text in out.items():
            (gdir / name).write_text(text)
    expected = {p.name: p.read_text() for p in gdir.iterdir()}
    assert set(expected) == set(out)
    for name in out:
        assert out[name] == expected[name], f"{name} differs from {gdir / name}"


@pytest.mark.parametrize("case", CAPTURE_CASES, ids=lambda c: f"{c[0]}-{c[1]}" + (f"-b{c[2]}" if c[2] else "")
                         + "-bs" + "-".join(map(str, c[3])))
def test_rendered_capture_list_matches_golden(case):
    inv_name, prof, budget, bs = case
    host = next(iter(load_inventory(REPO / "inventories" / inv_name).hosts.values()))
    profile = host.profile(prof, budget, cuda_graph_bs=bs)
    rendered = render(host, profile)
    argv = rendered.argv
    i = argv.index("--cuda-graph-bs-decode")
    assert argv[i + 1:i + 1 + len(bs)] == [str(b) for b in bs]
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == str(max(bs))
    assert profile.captured_batch_sizes == list(bs)
    assert json.loads(rendered.release_files["launch.json"])["profile"]["cuda_graph_bs"] == list(bs)
    out = {**rendered.release_files, "argv.json": json.dumps(rendered.argv, indent=1) + "\n"}
    gdir = GOLDEN / (f"{inv_name}-{prof}" + (f"-b{budget}" if budget else "") + "-bs" + "-".join(map(str, bs)))
    if os.environ.get("OPSCTL_UPDATE_GOLDEN"):
        gdir.mkdir(parents=True, exist_ok=True)
        for name, text in out.items():
            (gdir / name).write_text(text)
    expected = {p.name: p.read_text() for p in gdir.iterdir()}
    assert set(expected) == set(out)
    for name in out:
        assert out[name] == expected[name], f"{name} differs from {gdir / name}"


def test_render_is_deterministic():
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    a = render(host, host.profile("ddtree", 16))
    b = render(host, host.profile("ddtree", 16))
    assert a.release_files == b.release_files and a.digest() == b.digest()


@pytest.mark.parametrize("budget", [3, 8, 16, 32, 64, 255])
def test_ddtree_verify_width_is_budget_plus_one_in_argv(budget):
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    # above the fused tree kernel's 64 a profile must opt in to the torch beam (opsctl.schedule.check_budget)
    prof = (host.profile("ddtree", budget) if budget <= 64 else
            resolve_profile("ddtree", budget, overrides={"ddtree": {"tree_torch_fallback": True}}))
    argv = render(host, prof).argv
    assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == str(budget + 1)


def test_profiles_differ_where_they_should():
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    tp8 = render(host, host.profile("ar-tp8")).argv
    ep8 = render(host, host.profile("ar-ep8")).argv
    dfl = render(host, host.profile("dflash")).argv
    assert "--speculative-algorithm" not in tp8 and "--ep-size" not in tp8
    assert ep8[ep8.index("--ep-size") + 1] == "8"
    assert dfl[dfl.index("--speculative-algorithm") + 1] == "DFLASH"
    assert dfl[dfl.index("--speculative-num-draft-tokens") + 1] == "8"


def test_ddtree_env_loads_the_plugin_and_baseline_does_not():
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    assert "SGLANG_PLUGINS=ddtree" in render(host, host.profile("ddtree", 16)).release_files["sglang.env"]
    assert "SGLANG_PLUGINS" not in render(host, host.profile("ar-tp8")).release_files["sglang.env"]


def test_unit_runs_as_service_user_and_restarts_slowly():
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    unit = render(host, host.profile("ddtree", 16)).release_files["sglang-k26.service"]
    assert "User=sglang" in unit
    assert "Restart=on-failure" in unit and "RestartSec=30" in unit
    assert "TimeoutStartSec=1800" in unit and "LimitNOFILE=1048576" in unit
    assert "EnvironmentFile=/opt/opsctl/current/sglang.env" in unit
