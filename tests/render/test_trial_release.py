"""The trial release `opsctl tune` deploys (issue #37), as pure render output: the trial-set file in
the release, the control file outside it, the server sized for the widest candidate, and every
candidate checked as the runtime checks it at start (its goldens: tests/foundation/golden/*-trial-*)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from opsctl import trialset
from opsctl.config import load_inventory
from opsctl.errors import ConfigError
from opsctl.render import render
from opsctl.triton import needs_for

REPO = Path(__file__).resolve().parents[2]
CANDS = ("4", "8", "16", "1:16,6:0")


@pytest.fixture(scope="module")
def host():
    return load_inventory(REPO / "inventories/lab").hosts["lab"]


def test_the_release_carries_the_trial_set_and_names_a_control_file_outside_it(host):
    r = render(host, host.profile("ddtree", trial_set=list(CANDS)))
    assert json.loads(r.release_files["ddtree-trialset.json"]) == {"candidates": list(CANDS), "active": "4"}
    env = r.env
    assert env["SGLANG_DDTREE_TRIAL_SET_FILE"] == "/opt/opsctl/current/ddtree-trialset.json"
    control = PurePosixPath(env["SGLANG_DDTREE_CONTROL_FILE"])
    assert control.parent == PurePosixPath("/opt/opsctl/shared/control")   # a switch changes no release file
    assert control == trialset.control_path(host.install_root, CANDS)
    assert "SGLANG_DDTREE_SCHEDULE_FILE" not in env and "ddtree-schedule.json" not in r.release_files
    # the widest width any candidate needs is the server's verify width
    assert r.argv[r.argv.index("--speculative-num-draft-tokens") + 1] == "17"
    assert r.profile.slug == "ddtree-t4-8-16-s1" and r.profile.budget == 16
    assert r.profile.label == "ddtree --trial-set budgets 4, 8, 16 and schedule 1:16,6:0"


def test_one_control_file_per_candidate_list(host):
    a = trialset.control_path(host.install_root, CANDS)
    assert a == trialset.control_path(host.install_root, list(CANDS))
    assert a != trialset.control_path(host.install_root, ("4", "8", "16"))


def test_a_single_budget_release_is_unchanged_by_the_trial_set_field(host):
    r = render(host, host.profile("ddtree", 16))
    assert "trial_set" not in json.loads(r.release_files["launch.json"])["profile"]
    assert "SGLANG_DDTREE_CONTROL_FILE" not in r.env


def test_candidate_names_are_the_runtimes(host):
    assert trialset.parse_cli("4,8 16  1:16,6:0;1:32") == ["4", "8", "16", "1:16,6:0", "32"]
    assert host.profile("ddtree", trial_set=["1:8", "16"]).trial_set == ("8", "16")
    for bad, message in ((["8", "1:8"], "candidate 8 is listed twice"),
                         (["0"], "budget 0 alone drafts nothing"),
                         (["8", "1:8,9:4,10:0"], "holds no captured batch size"),
                         (["8", "96"], "above the fused tree kernel's 64")):
        with pytest.raises(ConfigError, match=message):
            host.profile("ddtree", trial_set=bad)
    with pytest.raises(ConfigError, match="--trial-set with --budget"):
        host.profile("ddtree", 8, trial_set=["8", "16"])
    with pytest.raises(ConfigError, match="--trial-set applies only to ddtree profiles"):
        host.profile("ar-tp8", trial_set=["8"])


def test_the_triton_cache_covers_every_draft_budget_of_the_candidates(host):
    from opsctl.triton import ModelShape

    prof = host.profile("ddtree", trial_set=["4", "16", "1:16,3:8,16:0"])
    needs = needs_for(prof, ModelShape(163840, 7168), arch="sm_120", runtime="0" * 64)
    assert needs.tree_budgets == (4, 8, 16) and needs.schedule is None


def test_the_inventory_cannot_set_a_trial_set(tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories/lab", inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("      readiness_timeout_s: 120\n    ar-tp8",
                                         "      readiness_timeout_s: 120\n      trial_set: ['4', '8']\n    ar-tp8", 1))
    with pytest.raises(ConfigError) as exc:
        load_inventory(inv)
    assert "opsctl.profiles.ddtree.trial_set is set by 'opsctl tune'" in exc.value.problem
    assert "all.yml:" in exc.value.problem


def test_render_cli_shows_a_trial_release_and_refuses_a_bad_list():
    run = [sys.executable, "-m", "opsctl", "render", "ddtree", "-i", str(REPO / "inventories/lab"), "--json"]
    p = subprocess.run([*run, "--trial-set", "4,8 1:8,6:0"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["trial_set"] == ["4", "8", "1:8,6:0"] and doc["verify_width"] == 9
    assert "/opt/opsctl/current/ddtree-trialset.json" in doc["files"]
    p = subprocess.run([*run, "--trial-set", "4,eight"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "'eight' is neither a budget nor a schedule" in p.stderr


def test_the_tunes_levels_go_into_the_trial_set_and_the_plan_matches_the_runtimes(host):
    """`trial_bs` (opsctl tune's levels): in the trial-set file, a release of its own (another id), and
    opsctl's trial plan (what validate holds the start to) is the runtime's: the first candidate
    (active at start) keeps every graph, the others capture the graphs the levels pad to."""
    plain = render(host, host.profile("ddtree", trial_set=list(CANDS)))
    r = render(host, host.profile("ddtree", trial_set=list(CANDS), trial_bs=[8, 1, 4]))
    assert json.loads(r.release_files["ddtree-trialset.json"]) == {"candidates": list(CANDS), "active": "4",
                                                                   "trial_bs": [1, 4, 8]}
    assert r.digest() != plain.digest()
    from opsctl import schedule

    bs = r.profile.captured_batch_sizes
    tp = schedule.trial_plan(list(CANDS), bs, active="4", trial_bs=[1, 4, 8])
    assert tp.width_bs(5) == tuple(bs)                     # budget 4 is active: all of them
    assert tp.width_bs(9) == (1, 4, 8, bs[-1])             # budget 8: the levels' graphs and the largest
    sys.path[:0] = [str(REPO / "opsctl/lab/emulator"), str(REPO / "runtime/src")]
    from sglang.lab import ddtree_runtime

    rt = ddtree_runtime.trialset().TrialSet.from_json(json.loads(r.release_files["ddtree-trialset.json"]))
    rt.set_cuda_graph_bs(bs)
    assert [(w, tuple(b)) for w, b, _ in rt.verify_plan()] == [(u.key, u.bs) for u in tp.widths]
    assert [(b, tuple(s)) for b, s, _ in rt.draft_plan() if s] == [(u.key, u.bs) for u in tp.drafts]
