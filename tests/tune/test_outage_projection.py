"""Issue #49: tune's projected outage within 10 % of what it then reports. The plan projected
every restart at the last start's seconds; a trial release captures every candidate's width and
its start took about twice that. Each restart is now projected from the graphs it captures and the
phases of the starts on record (tune.project_start). Checked here on real starts of the lab
(tests/validate/data/lab_journals/: a ddtree budget 16 start, the baseline's, a budget 4 start)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opsctl import journal, startup
from opsctl.config import load_inventory
from opsctl.tune import ONE_RESTART, RESTART_PER_TRIAL, plan_restarts, plan_tune, project_restarts, project_start

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "tests/validate/data/lab_journals/deploy-rollback-tune.journal.txt"


@pytest.fixture(scope="module")
def lab_starts() -> dict[str, startup.Startup]:
    segs = journal.starts(journal.load_file(LAB))
    b16, ar, b4 = (startup.parse(s) for s in segs[1:4])
    assert (b16.ddtree, ar.ddtree, b4.ddtree) == (True, False, True)
    return {"b16": b16, "ar": ar, "b4": b4}


def _record(st: startup.Startup, release: str, stop_s: float = 0.5) -> dict:
    return {"action": "switch", "result": "ok", "to_release": release, "stop_s": stop_s,
            "startup": st.as_record(release.rsplit("-", 1)[0])}


def test_a_start_of_another_budget_is_projected_within_10_percent_of_the_real_one(lab_starts):
    b16, ar, b4 = lab_starts["b16"], lab_starts["ar"], lab_starts["b4"]
    got = project_start([ar, b16], [5], [4])          # budget 4 from the budget 16 start
    assert abs(got - b4.total_s) / b4.total_s < 0.10, (got, b4.total_s)
    got = project_start([b4], [17], [16])             # and back
    assert abs(got - b16.total_s) / b16.total_s < 0.10, (got, b16.total_s)
    # the old projection, the last start's seconds: the baseline's 282 s for a 384 s start
    assert abs(ar.total_s - b4.total_s) / b4.total_s > 0.25
    assert project_start([ar], [5], [4]) is None      # no DDTree start on record: not projected


def test_a_trial_release_is_projected_from_its_widths_and_the_restore_without_its_compiles(lab_starts, tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories/lab", inv)
    plan = plan_tune(load_inventory(inv), [4, 8], concurrency=[1])
    assert plan.mode == ONE_RESTART and plan.trial_restarts == 1 and plan.after_restarts == 1
    b16 = lab_starts["b16"]
    ledger = [_record(lab_starts["ar"], "ar-tp8-1"), _record(b16, "ddtree-b16-1", stop_s=0.6)]
    rp = project_restarts(plan_restarts(plan, b16.total_s, 500.0, 10.0), plan, b16, ledger)
    trial, restore = rp.starts
    widths = rp.widths
    assert widths and min(widths) >= 1 and len(widths) >= 2       # every candidate's width is captured
    assert trial > b16.total_s                                     # more graphs than one budget's start
    compile16 = b16.phase("compile budget 16").seconds
    assert restore == pytest.approx(b16.total_s - compile16)       # its kernels are cached now
    assert rp.stop_s == 0.6 and rp.projected_outage_s == pytest.approx(trial + restore + 2 * 0.6, abs=0.1)
    text = rp.describe()
    assert "starts " in text and "projected from its graphs" in text, text
    # one restart per trial: one projected start per budget, each its own width
    per = plan_tune(load_inventory(inv), [4, 8], concurrency=[1], restart_per_trial=True, schedule_trial=False)
    assert per.mode == RESTART_PER_TRIAL
    rp = project_restarts(plan_restarts(per, b16.total_s, 500.0, 10.0), per, b16, ledger)
    assert len(rp.starts) == rp.restarts == 3 and rp.starts[0] < rp.starts[1] < b16.total_s + 1


def test_without_a_ddtree_start_on_record_the_plan_stays_the_last_starts(lab_starts, tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories/lab", inv)
    plan = plan_tune(load_inventory(inv), [4, 8], concurrency=[1])
    ar = lab_starts["ar"]
    rp = project_restarts(plan_restarts(plan, ar.total_s, 500.0, 10.0), plan, ar, [_record(ar, "ar-tp8-1")])
    assert rp.starts == [] and rp.projected_outage_s == round(2 * ar.total_s, 1)


def test_a_trial_release_with_the_levels_bs_is_projected_per_graph():
    """Issue #51: a capture's seconds are its graphs'. A width recorded from a schedule's band (7
    graphs) stands for the whole list (27) when the trial release's active candidate captures it in
    full; a width the levels reach with 4 graphs costs 4/27 of its full capture."""
    P = startup.Phase
    st = startup.Startup([P("weight_load", 36.8, "line"),
                          P("capture target verify width 5", 43.0, "line", kind="target verify", width=5,
                            detail={"graphs": 7}),
                          P("capture target verify width 9", 171.0, "line", kind="target verify", width=9,
                            detail={"graphs": 27}),
                          P("draft_capture budget 4", 7.0, "line", kind="draft decode", budget=4,
                            detail={"graphs": 7}),
                          P("warmup", 12.0, "lab"), P("other", 14.0, "rest")],
                         True, 36.8 + 43 + 171 + 7 + 12 + 14, "lab", ddtree=True)
    base = 36.8 + 12 + 14
    got = project_start([st], [9, 5], [4], width_share={9: 4 / 27, 5: 1.0}, draft_share={4: 1.0}, full_graphs=27)
    assert got == pytest.approx(base + 171.0 * 4 / 27 + 43.0 / 7 * 27 + 7.0 / 7 * 27, abs=0.2)
    # records without a graph count (older ledgers) are taken as they are
    old = startup.Startup([P(p.key, p.seconds, p.source, kind=p.kind, width=p.width, budget=p.budget)
                           for p in st.phases], True, st.total_s, "lab", ddtree=True)
    assert project_start([old], [5], [4], full_graphs=27) == pytest.approx(base + 43.0 + 7.0, abs=0.2)
