"""opsctl tune in one restart (issue #37) on the lab: one trial release captures the budgets and the
schedules the winners could build, the emulator switches between them on the control file, and the
tune reaches the decisions the restart-per-trial tune reaches on the same lab (test_tune_lab.py; both
side by side: benchmarks/tune_restarts.py), with one restart for its trials; restored afterwards, or
with --apply the winner kept serving without a restart, also after the service restarts (its control
file outlives the process)."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]
ROOT = "/opt/opsctl"


def opsctl(*args: str, inv: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([*OPSCTL, *args, "-i", str(inv)], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def tune_json(*args: str, inv: Path) -> tuple[dict, dict, float]:
    """The restart plan (first JSON line), the result (last) and when the run began (the controller's clock)."""
    began = time.time()
    p = opsctl("tune", "ddtree", *args, "--yes", "--json", inv=inv)
    assert p.returncode == 0, p.stderr
    docs = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return docs[0], docs[-1], began


def current(lab) -> str:
    return lab.run(f"readlink {ROOT}/current", check=False).stdout.strip().split("/")[-1]


def ledger(lab) -> list[dict]:
    return [json.loads(x) for x in lab.run(f"cat {ROOT}/ledger.jsonl", check=False).stdout.splitlines() if x.strip()]


def switches_since(lab, began: float) -> list[dict]:
    """The restarts made since `began`: one switch record each (drain, stop, start, ready)."""
    return [r for r in ledger(lab) if r.get("action") == "switch" and (r.get("pool_out_at") or 0) >= began - 1]


def ddtree_active(lab, warm_s: float = 90) -> str | None:
    """/server_info's DDTree candidate once decode steps ran (a control file applies at a step)."""
    py = ("import json, time, urllib.request as u\n"
          "def call(path, body=None):\n"
          "    req = u.Request('http://127.0.0.1:30000' + path, None if body is None else json.dumps(body).encode(),\n"
          "                    {'Content-Type': 'application/json'})\n"
          "    return json.loads(u.urlopen(req, timeout=60).read())\n"
          "for _ in range(8):\n"
          "    call('/generate', {'input_ids': list(range(1000, 1032)), 'sampling_params': {'temperature': 0,\n"
          "                       'max_new_tokens': 64, 'ignore_eos': True}})\n"
          "print(json.dumps(call('/server_info')['internal_states'][0].get('ddtree')))\n")
    out = lab.run(f"python3 -c {shlex.quote(py)}", check=False, timeout=warm_s).stdout.strip().splitlines()
    doc = json.loads(out[-1]) if out else None
    return (doc or {}).get("active")


def wait_healthy(lab, timeout_s: float = 180) -> None:
    from labtools import HEALTH

    deadline = time.monotonic() + timeout_s
    while lab.run(HEALTH, check=False).stdout.strip() != "200":
        assert time.monotonic() < deadline, "the service did not become healthy again"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def tuned_lab(clean_lab, baselined, tmp_path_factory):
    """ar-tp8 live, the gate's levels 1 and 32 (DDTree wins at 1, loses at 32 in the model), graphs up to 64."""
    inv = tmp_path_factory.mktemp("tune1r") / "inv"
    shutil.copytree(clean_lab.inventory_dir, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("concurrency: [1, 4, 8]", "concurrency: [1, 32]")
                  .replace("max_concurrency: 32", "max_concurrency: 64").replace("cuda_graph_max_bs: 32",
                                                                                 "cuda_graph_max_bs: 64"))
    baselined.restore(clean_lab)
    clean_lab.inv = inv
    clean_lab.baseline = current(clean_lab)
    return clean_lab


def test_one_restart_tune_reaches_the_restart_per_trial_decisions_with_one_restart_and_restores(tuned_lab, tmp_path):
    # the restart-per-trial tune on the same lab and levels decides best {1: 16, 32: 0} and the schedule
    # 1:16,6:0 (test_tune_lab.py); benchmarks/tune_restarts.py runs both modes side by side
    lab, inv = tuned_lab, tuned_lab.inv
    plan, one, began = tune_json("--budgets", "4,8,16", "--out", str(tmp_path / "one"), inv=inv)
    one_switches = switches_since(lab, began)

    # before: one restart for the trials, one for the restore; after: exactly those
    assert plan["event"] == "restart_plan" and plan["plan"]["mode"] == "one-restart"
    assert plan["trial_restarts"] == 1 and plan["restarts"] == 2
    assert [s["why"] for s in one_switches] == ["trial", "restore"], one_switches
    assert one["restarts"]["measured"] == 2 and one["restarts"]["by_why"] == {"trial": 1, "restore": 1}

    # every candidate measured on the one trial release, switched to live (the runtime's status said so)
    measured = [t for t in one["trials"] if t["status"] == "measured"]
    assert [t["budget"] for t in one["trials"][:3]] == [4, 8, 16] and one["trials"][3]["schedule"], one["trials"]
    assert len(measured) == len(one["trials"]) and len({t["release"] for t in measured}) == 1
    assert measured[0]["release"].startswith("ddtree-t4-8-16-s")
    assert all(t["live_switch"]["candidate"] == (t["schedule"] or str(t["budget"])) for t in measured)

    # the decisions of one restart per trial (the emulator's model decides them). At C=1 the model puts
    # budgets 8 and 16 within 4 % of each other (about 274 and 284 tok/s): the measured best is either;
    # nothing beats the baseline at C=32, and the schedule is built from the per-level best
    assert one["best"]["32"] == 0 and one["best"]["1"] in (8, 16), one["best"]
    assert one["schedule"] == f"1:{one['best']['1']},6:0"
    assert one["recommendation"] is None

    assert current(lab) == lab.baseline and one["restored"] == lab.baseline
    st = json.loads(opsctl("status", "--json", inv=inv).stdout)[0]
    assert st["last_good"] == lab.baseline   # a trial never becomes the last good release


def test_apply_keeps_the_winner_serving_without_a_restart_and_across_a_service_restart(tuned_lab, tmp_path):
    lab = tuned_lab
    inv = tmp_path / "inv"
    shutil.copytree(lab.inv, inv)
    gv = inv / "group_vars/all.yml"
    # the gate and the tune at C=1, where DDTree wins in the model: --apply has a winner to gate
    gv.write_text(gv.read_text().replace("concurrency: [1, 32]", "concurrency: [1]"))
    plan, res, began = tune_json("--budgets", "4,8,16", "--apply", "--out", str(tmp_path / "t"), inv=inv)
    assert plan["restarts"] == 1 and plan["plan"]["after"] == "apply"
    winner = str(res["recommendation"])
    assert res["recommendation"] is not None and res["after"] == "applied-live", res["reason"]
    trial_release = res["trials"][0]["release"]
    assert res["serving"] == trial_release and res["serving_candidate"] == winner
    # no restart after the trials: the one switch is the trial release's
    assert [s["why"] for s in switches_since(lab, began)] == ["trial"]
    assert current(lab) == trial_release
    promote = [r for r in ledger(lab) if r.get("action") == "promote" and r.get("to_release") == trial_release][-1]
    assert promote["ddtree_active"] == winner and promote["restart"] is False
    verdict = [r for r in ledger(lab) if r.get("action") == "verdict" and r.get("release") == trial_release][-1]
    assert verdict["status"] == "pass"
    st = json.loads(opsctl("status", "--json", inv=inv).stdout)[0]
    assert st["last_good"] == trial_release
    control = lab.run(f"cat {plan['plan']['control_file']}", check=False).stdout
    assert json.loads(control) == {"active": winner}
    assert ddtree_active(lab) == winner

    # a restart of the release comes back with the winner: the control file outlives the process
    lab.run("systemctl restart sglang-k26", check=True, timeout=120)
    wait_healthy(lab)
    assert ddtree_active(lab) == winner

    # status names what the runtime serves (its /server_info), and check post compares it with what the
    # release means: the winner its promote record names (issue #50 item 2)
    from opsctl.serving import as_budget

    st = json.loads(opsctl("status", "--json", inv=inv).stdout)[0]
    assert st["serving"]["active"] == winner and st["serving"]["matches"] is True, st["serving"]
    assert (st["budget"], st["budget_schedule"]) == as_budget(winner)
    assert opsctl("check", "post", inv=inv).returncode == 0
    control_file = plan["plan"]["control_file"]

    def write_control(candidate: str) -> None:
        lab.run(f"printf '%s' {shlex.quote(json.dumps({'active': candidate}))} > {control_file}.t && "
                f"mv {control_file}.t {control_file}", check=True)

    try:
        # a candidate the runtime did not capture: refused, it keeps serving the winner; status says both
        write_control("31")
        assert ddtree_active(lab) == winner
        st = json.loads(opsctl("status", "--json", inv=inv).stdout)[0]
        assert st["serving"]["active"] == winner and "31" in (st["serving"]["last_refusal"] or ""), st["serving"]
        text = opsctl("status", inv=inv).stdout
        assert f"serving: DDTree {winner} (the runtime's /server_info)" in text and "refused a control file" in text
        # another captured candidate: it serves, status names it, check post fails naming both
        other = "4" if winner != "4" else "8"
        write_control(other)
        assert ddtree_active(lab) == other
        st = json.loads(opsctl("status", "--json", inv=inv).stdout)[0]
        assert st["serving"]["active"] == other and st["serving"]["intended"] == winner
        assert st["serving"]["matches"] is False and st["budget"] == int(other)
        p = opsctl("check", "post", inv=inv)
        assert p.returncode != 0 and "ddtree_serves_what_the_release_means" in p.stdout + p.stderr, p.stdout
        assert f"the runtime serves DDTree {other}" in p.stdout + p.stderr and f"means {winner}" in p.stdout + p.stderr
    finally:
        write_control(winner)
    assert ddtree_active(lab) == winner
