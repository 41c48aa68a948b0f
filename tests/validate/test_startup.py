"""opsctl.startup: the phases of one start read from its journal, and a start compared with the last.

Fixtures: tests/validate/data/startup/ (README.md there cites the public SGLang issue or pull
request each excerpt was copied from; the lab emulator's own output beside them)."""
from __future__ import annotations

from pathlib import Path

import pytest

from opsctl import startup
from startup_journals import clock_journal

DATA = Path(__file__).parent / "data" / "startup"


def _phases(name: str) -> dict:
    return {p.key: (p.seconds, p.source) for p in startup.parse((DATA / name).read_text()).phases}


# https://github.com/sgl-project/sglang/pull/17985 : `Load weight end. elapsed=6.21 s` behind `PP1 TP1`
def test_load_weight_elapsed_from_a_public_log():
    s = startup.parse((DATA / "sglang-17985-load-weight-pp2-tp2.txt").read_text())
    assert _phases("sglang-17985-load-weight-pp2-tp2.txt") == {"weight_load": (6.21, "line")}
    assert s.phase("weight_load").line == 13 and not s.ready and s.total_s is None


# https://github.com/sgl-project/sglang/issues/10088 : the <= 0.5.10 spelling, target and EAGLE draft
def test_legacy_capture_lines_from_a_public_log():
    assert _phases("sglang-10088-eagle-capture.txt") == {"capture": (12.11, "line"),
                                                          "draft_capture": (62.67, "line")}


# https://github.com/sgl-project/sglang/issues/4161 : 0.4.x, no elapsed, a capture that never ended
def test_old_lines_without_elapsed_give_no_number():
    s = startup.parse((DATA / "sglang-4161-load-weight-0.4.txt").read_text())
    assert _phases("sglang-4161-load-weight-0.4.txt") == {"weight_load": (None, "none"), "capture": (None, "line")}
    assert s.phase("capture").detail == {"complete": False}


def test_emulator_start_golden():
    s = startup.parse((DATA / "lab_emulator_ddtree_b16.log").read_text())
    assert s.ready and s.time_scale == 500.0 and s.total_source == "lab" and s.total_s == 465.35
    assert [p.as_dict() for p in s.phases] == [
        {"phase": "weight_load", "seconds": 36.76, "source": "line", "line": 18},
        {"phase": "capture target verify width 17", "seconds": 186.08, "source": "line", "line": 42,
         "kind": "target verify", "width": 17, "budget": 16, "bs": [1, 64], "graphs": 27},
        {"phase": "draft_capture width 8", "seconds": 27.57, "source": "line", "line": 58, "kind": "draft decode",
         "width": 8, "bs": [1, 64], "graphs": 27},
        {"phase": "compile budget 16", "seconds": 22.1, "source": "line", "line": 59, "budget": 16, "block": 8,
         "vocab_shard": 20480, "arch": "sm_120"},
        {"phase": "warmup", "seconds": 180.0, "source": "lab", "line": 78},
        {"phase": "other", "seconds": 12.84, "source": "rest"}]
    assert sum(p.seconds for p in s.phases) == pytest.approx(s.total_s, abs=0.05)


def test_emulator_start_with_a_filled_triton_cache_has_no_compile():
    s = startup.parse((DATA / "lab_emulator_ddtree_b16_cached.log").read_text())
    assert not [p for p in s.phases if p.key.startswith("compile")]
    assert s.phase("draft_capture width 8").seconds == 27.57 and s.total_s == 443.25



def test_clock_phases_of_a_real_start():
    s = startup.parse(clock_journal(36, 180))
    assert s.total_source == "clock" and s.total_s == 424.0 and s.time_scale is None
    assert {p.key: p.seconds for p in s.phases} == {"weight_load": 36.0, "capture target decode width 1": 200.0,
                                                     "warmup": 180.0, "other": 8.0}


def test_compare_names_the_slower_phase():
    prev = startup.parse(clock_journal(36, 180))
    cur = startup.parse(clock_journal(200, 180))     # +164 s of weight loading: 588 s, +39 %
    res = startup.compare(prev, cur, profile="ar-tp8")
    assert res.slower and res.phase == "weight_load" and res.deltas["weight_load"] == 164.0
    f = res.finding()
    assert not f.ok and f.check == "startup.slower" and f.severity == "warning" and f.warned and not f.failed
    assert f.diagnosis == ("this start took 9 min 48 s, 39 % more than the last start of ar-tp8 (7 min 4 s); "
                           "weight load grew most (36.0 s -> 3 min 20 s)")
    assert "multithread" in f.fix and f.one_line().startswith("WARN startup.slower: this start took 9 min 48 s")
    # under 30 %: a finding that passes; the emulator's compile phase appearing is named
    cached = startup.parse((DATA / "lab_emulator_ddtree_b16_cached.log").read_text())
    cold = startup.parse((DATA / "lab_emulator_ddtree_b16.log").read_text())
    res = startup.compare(cached, cold)
    assert not res.slower and res.phase == "compile budget 16" and res.finding().ok
    # exactly at the threshold counts; no previous start: nothing to say
    assert startup.compare(prev, startup.parse(clock_journal(36 + 128, 180))).slower       # 552 s >= 1.3 x 424
    assert not startup.compare(prev, startup.parse(clock_journal(36 + 127, 180))).slower   # 551 s < 551.2
    assert not startup.compare(None, cur).slower and startup.compare(None, cur).finding().ok


def test_last_start_of_a_journal_with_two():
    two = (("Dec 01 10:00:00 gpuhost systemd[1]: Started sglang-k26.service - SGLang.\n" + clock_journal(36, 180))
           + "\nDec 01 10:20:00 gpuhost systemd[1]: Stopping sglang-k26.service - SGLang...\n"
           + "Dec 01 10:20:01 gpuhost systemd[1]: Started sglang-k26.service - SGLang.\n"
           + clock_journal(50, 180).replace("10:", "11:"))
    s = startup.parse(two)
    assert s.phase("weight_load").seconds == 50.0


def test_core_imports_stay_stdlib():
    import ast

    tree = ast.parse(Path(startup.__file__).read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert top <= {"__future__", "re", "dataclasses", "typing", "opsctl"}, top
