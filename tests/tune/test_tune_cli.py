"""`opsctl tune` as a user sees it, before and after (issue #37): the restarts it will make and their
projected outage, the table, what serves afterwards and the restarts it made, in human text and
--json. The host is the test double of test_tune_onerestart (the CLI and the core are the real ones;
only the journal read of the last start and the host's work are stood in for)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import opsctl.tune as core
from opsctl.cli import _output, app
from test_tune_onerestart import BASE_RELEASE, FakeHost, inventory


@pytest.fixture
def cli(tmp_path, monkeypatch):
    inv = inventory(tmp_path)
    fakes: list[FakeHost] = []
    real_tune = core.tune

    def fake_tune(inventory_, plan, **kw):
        fakes.append(FakeHost(plan))
        return real_tune(inventory_, plan, ops=fakes[-1], **kw)

    # the last start in the host's journal: 7 min at the site, the lab 10x faster
    monkeypatch.setattr(core, "restart_plan", lambda inventory_, plan: core.plan_restarts(plan, 420.0, 10.0, 30.0))
    monkeypatch.setattr(core, "tune", fake_tune)

    def invoke(*args: str):
        result = CliRunner().invoke(app, ["tune", "ddtree", "--budgets", "4,8,16", "-c", "1,8,32", "--yes",
                                          "--out", str(tmp_path / "out"), "-i", str(inv), *args])
        _output.set_json(False)
        _output.STATE.stream = False
        return result, fakes[-1] if fakes else None

    return invoke


def test_human_output_says_the_restarts_before_and_counts_them_after(cli):
    result, fake = cli()
    assert result.exit_code == 0, result.output
    out = result.output
    before = out.index("tune will make 2 restart(s) of SGLang — 1 for the trials (one trial release captures "
                       "budgets 4, 8, 16 and ")
    assert "1 after them (to restore the release that served before): ~14 min of outage at the site's scale (7 min " \
           "per start; 1 min 24 s in the lab, time scale 10)" in out
    after = out.index("restarts: 2 made (trial 1, restore 1), 2 planned; outage 6.0 s in the lab = 1 min at the "
                      "site's scale")
    assert before < out.index("best budget per level: C=1: 16, C=8: 8, C=32: baseline") < after
    assert "budget schedule: 1:16,3:8,16:0" in out and f"restored: {BASE_RELEASE} serves as before the tune" in out
    assert "schedule 1:16,3:8,16:0" in out
    assert [s["why"] for s in fake.switches] == ["trial", "restore"]


def test_json_output_streams_the_plan_first_and_the_result_last(cli):
    result, fake = cli("--apply", "--json")
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    plan = lines[0]
    assert plan["event"] == "restart_plan" and plan["restarts"] == 1 and plan["restarts_max"] == 2
    assert plan["plan"]["mode"] == "one-restart" and plan["plan"]["after"] == "apply"
    assert plan["plan"]["control_file"].startswith("/opt/opsctl/shared/control/ddtree-active-")
    res = lines[-1]
    assert res["ok"] is True and res["after"] == "applied-live" and res["serving_candidate"] == "1:16,3:8,16:0"
    assert res["restarts"] == {"planned": 1, "measured": 1, "by_why": {"trial": 1}}
    assert res["outage_s"] == 3.0 and res["outage_site_s"] == 30.0 and res["restored"] is None


def test_the_fallback_to_a_restart_per_trial_is_said_before_the_start(cli, tmp_path):
    inv = inventory(tmp_path, "  extra_env:\n    SGLANG_DDTREE_SCHEDULE_FILE: /etc/site/schedule.json\n")
    result, _ = cli("-i", str(inv))
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.index("one restart per trial: the trials cannot share one server: the inventory sets "
                     "SGLANG_DDTREE_SCHEDULE_FILE") < out.index("tune will make 5 restart(s)")
