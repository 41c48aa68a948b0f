"""Issue #32 item 6: a watch window shorter than what its restarts rule needs is refused when the
inventory loads, in one line naming the fix. A crash loop fails at most once per RestartSec
(`opsctl.restart_sec`, 30 s by default); with a 20 s window its 2nd failure never shared a
window with the 1st, so 4 crashes ended at the unit's start limit and the watch said `unknown`."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opsctl.config import START_LIMIT_BURST, load_inventory
from opsctl.errors import ConfigError
from opsctl.onhost import analysis
from watchspecs import spec_with

REPO = Path(__file__).resolve().parents[2]


def _inv(tmp_path: Path, text: str) -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories/lab", inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text() + text)
    return inv


WATCH = "  watch:\n    enabled: true\n    interval_s: 5\n    window_s: {w}\n    min_samples: 3\n"


def test_a_window_shorter_than_restart_sec_is_refused_in_one_line_naming_the_fix(tmp_path):
    inv = _inv(tmp_path, WATCH.format(w=20))
    with pytest.raises(ConfigError) as exc:
        load_inventory(inv)
    line = exc.value.one_line()
    assert exc.value.exit_code == 2 and "\n" not in line
    assert "group_vars/all.yml:" in line and "opsctl.watch.window_s 20 is shorter than the restarts rule needs" in line
    assert "restart_sec 30s" in line and "needs window_s >= 40" in line
    assert "(fix: raise opsctl.watch.window_s to 40, or lower opsctl.restart_sec to 10)" in line


def test_the_window_that_holds_the_rule_loads(tmp_path):
    assert load_inventory(_inv(tmp_path, WATCH.format(w=40))).hosts["lab"].settings.watch.window_s == 40
    # or the unit restarts sooner
    assert load_inventory(_inv(tmp_path / "b", "  restart_sec: 10\n" + WATCH.format(w=20)))
    # or the rule trips at the first failure
    assert load_inventory(_inv(tmp_path / "c", WATCH.format(w=20) + "    defaults: {max_restarts: 0}\n"))


def test_a_watch_that_is_off_is_not_held_to_it(tmp_path):
    load_inventory(_inv(tmp_path, "  watch:\n    enabled: false\n    interval_s: 5\n    window_s: 20\n"
                                  "    min_samples: 3\n"))


def test_a_profile_rule_allowing_more_failures_needs_a_longer_window(tmp_path):
    text = "  restart_sec: 10\n" + WATCH.format(w=20) + "    rules:\n      ddtree: {max_restarts: 2}\n"
    with pytest.raises(ConfigError) as exc:
        load_inventory(_inv(tmp_path, text))
    line = exc.value.one_line()
    assert "opsctl.watch.rules.ddtree.max_restarts 2 trips at failure 3" in line and "needs window_s >= 30" in line
    assert "(fix: raise opsctl.watch.window_s to 30, or lower opsctl.restart_sec to 5)" in line


def test_a_rule_needing_more_failures_than_the_start_limit_allows_is_refused(tmp_path):
    text = WATCH.format(w=300) + f"    defaults:\n      max_restarts: {START_LIMIT_BURST}\n"
    with pytest.raises(ConfigError) as exc:
        load_inventory(_inv(tmp_path, text))
    line = exc.value.one_line()
    assert f"needs {START_LIMIT_BURST + 1} failures" in line and "StartLimitBurst" in line
    assert f"(fix: set opsctl.watch.defaults.max_restarts to {START_LIMIT_BURST - 1} or less)" in line


def test_the_start_limit_is_the_units():
    unit = (REPO / "templates/sglang.service.j2").read_text()
    assert f"StartLimitBurst={START_LIMIT_BURST}\n" in unit


def _crash_loop_verdicts(window: float, restart: float, interval: float) -> set[str]:
    """The restarts rule's verdicts over every phase of the watch's ticks against a crash loop
    (failures `restart` s apart, each counted at the first tick after it)."""
    out = set()
    for phase in [interval * k / 20 for k in range(20)]:
        ticks = [phase + interval * i for i in range(int((restart * 3) / interval) + 3)]
        crashes = [0.01, 0.01 + restart]
        seen = [next(t for t in ticks if t >= c) for c in crashes]
        now = seen[-1]
        samples = [{"ts": t, "status": "unknown",
                    "journal": {"cuda_errors": 0, "tracebacks": 0, "crashes": seen.count(t), "restarts": 0,
                                "examples": []}} for t in ticks if t <= now]
        rules = {"max_restarts": 1, "accept_len_floor": None, "throughput_fraction": None}
        found = {f["rule"]: f for f in analysis.evaluate_window(samples, spec_with(rules, min_samples=3, window_s=window), now)}
        out.add(found["restarts"]["status"])
    return out


def test_the_shortest_window_allowed_sees_a_crash_loop_at_any_phase_and_a_shorter_one_may_not():
    restart, interval = 30, 5
    assert _crash_loop_verdicts(restart + 2 * interval, restart, interval) == {"breach"}
    assert _crash_loop_verdicts(20, restart, interval) == {"ok"}    # the window: never a breach
