"""Issue #36: start-up phases on the record. After ready, a deploy, rollback or tune trial prints
every phase of the start (at the site's scale, and the lab's), stores them in the switch's ledger
record, and compares the start with the host's last start of the same profile and budget (the
`startup.slower` warning); status gives each release's last start, history a start column.

Journals: tests/validate/data/startup/ (the lab emulator's own output: a cold DDTree b16 start,
the same with a complete Triton cache, and the same with the `slow_start` fault)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hostdirs import host_config, make_current, read_ledger, release, write_ledger
from opsctl import startup
from startup_journals import clock_journal
from opsctl.config import Inventory
from opsctl.drain import Gap
from opsctl.flow import deploy, inspect
from opsctl.flow import validate as flow_validate
from opsctl.flow.steps import GateOutcome, Steps
from opsctl.flow.switch import back_in_pool
from opsctl.host.connection import LocalConnection, Result

DATA = Path(__file__).resolve().parents[1] / "validate" / "data" / "startup"
COLD = (DATA / "lab_emulator_ddtree_b16.log").read_text()            # 7 min 45 s, Triton compile 22.1 s
CACHED = (DATA / "lab_emulator_ddtree_b16_cached.log").read_text()   # no compile line
SLOW = (DATA / "lab_emulator_ddtree_b16_slow_start.log").read_text()  # slow_start: weight load 292 s, 11 min 55 s


def _record(text: str, profile: str = "ddtree-b16") -> dict:
    return startup.parse(text).as_record(profile)



# --------------------------------------------------------------------------- the block's wording


def test_the_block_names_every_phase_at_the_site_and_in_the_lab():
    lines = startup.describe(_record(COLD))
    assert lines == [
        "start-up 7 min 45 s at the site (the server's own 0.931 s in the lab x time scale 500, first line to ready), ddtree-b16: weight load 36.8 s · "
        "target verify graphs b16 (bs 1-64) 3 min 6 s · draft decode graphs (bs 1-64) 27.6 s · "
        "Triton compile b16 22.1 s · warm-up 3 min · other (process start, NCCL, KV cache) 12.8 s",
        "  in the lab: weight load 0.074 s · target verify graphs b16 (bs 1-64) 0.372 s · "
        "draft decode graphs (bs 1-64) 0.055 s · Triton compile b16 0.044 s · warm-up 0.360 s · "
        "other (process start, NCCL, KV cache) 0.026 s"]
    # every phase the parser found is in the site's line, in its order
    site = lines[0]
    labels = [startup.phase_label(p) for p in startup.parse(COLD).phases]
    assert len(labels) == 6 and [site.index(x) for x in labels] == sorted(site.index(x) for x in labels)


def test_a_ddtree_start_without_a_compile_line_says_the_cache_was_complete():
    site, lab = startup.describe(_record(CACHED))
    assert "draft decode graphs (bs 1-64) 27.6 s · no Triton compile (cache complete) · warm-up 3 min" in site
    assert "Triton" not in lab       # nothing compiled: no lab seconds to give
    assert "no Triton compile" not in startup.describe(_record(COLD))[0]


def test_a_real_start_is_at_the_site_scale_and_has_no_lab_line_nor_a_compile_to_miss():
    lines = startup.describe(_record(clock_journal(), "ar-tp8"))
    assert lines == ["start-up 7 min 4 s, ar-tp8: weight load 36.0 s · target decode graphs (bs 1-4) 3 min 20 s · "
                     "warm-up 3 min · other (process start, NCCL, KV cache) 8.0 s"]


def test_a_record_of_the_first_switch_records_still_reads():
    """Switch records written before this issue kept `{phase: seconds}` only."""
    old = {"total_s": 465.35, "phases": {"weight_load": 36.76, "capture target verify width 17": 186.08,
                                         "draft_capture width 8": 27.57, "warmup": 180.0}}
    assert startup.describe(old) == ["start-up 7 min 45 s: weight load 36.8 s · target verify graphs width 17 "
                                     "3 min 6 s · draft graphs 27.6 s · warm-up 3 min"]


# --------------------------------------------------------------------------- the switch record and the comparison


class JournalHost(LocalConnection):
    """This machine as the host (the ledger under a tmp install root, written by the real appender),
    with `journal` as what journalctl answers for the unit."""

    journal: str = ""

    def run(self, command, **kw):
        if command.startswith("journalctl"):
            body = "\n".join(json.dumps({"MESSAGE": line}) for line in self.journal.splitlines())
            return Result(command, 0, body + "\n#rc=0\n", "", 0.0, "lab")
        return super().run(command, **kw)


@pytest.fixture
def lab(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return SimpleNamespace(root=root, host=host_config(tmp_path, root), conn=JournalHost())


def _start(lab, release_id: str, journal: str, events: list | None = None) -> dict:
    lab.conn.journal = journal
    gap = Gap("deploy", None, release_id, 30.0, drain=False)
    gap.out_at = gap.stop_at = gap.stopped_at = gap.now()
    return back_in_pool(lab.conn, lab.host, gap, 1767000000, Steps(events.append if events is not None else None,
                                                                     "lab"))


def test_the_switch_record_keeps_every_phase_and_compares_with_the_last_start_of_the_same_profile(lab, capsys):
    first = _start(lab, "ddtree-b16-aaaaaaaaaa", COLD)
    st = first["startup"]
    assert st["profile"] == "ddtree-b16" and st["total_s"] == 465.35 and st["ddtree"] and st["time_scale"] == 500.0
    assert [p["phase"] for p in st["phases"]] == ["weight_load", "capture target verify width 17",
                                                  "draft_capture width 8", "compile budget 16", "warmup", "other"]
    assert "slower" not in st                       # the first start of its profile: nothing to compare with
    # a start of another budget, and of another profile, is compared with neither
    assert "slower" not in _start(lab, "ddtree-b8-bbbbbbbbbb", SLOW)["startup"]
    assert "slower" not in _start(lab, "ar-tp8-cccccccccc", SLOW)["startup"]
    # the next start of ddtree-b16 (another release of the same profile and budget) is 54 % slower
    events: list = []
    again = _start(lab, "ddtree-b16-dddddddddd", SLOW, events)["startup"]["slower"]
    assert again["slower"] and again["previous_release"] == "ddtree-b16-aaaaaaaaaa"
    assert (again["previous_s"], again["current_s"], again["phase"]) == (465.35, 715.35, "weight_load")
    f = again["finding"]
    assert f["check"] == "startup.slower" and f["severity"] == "warning" and f["ok"] is False
    assert f["diagnosis"] == ("this start took 11 min 55 s, 54 % more than the last start of ddtree-b16 "
                              "(7 min 45 s); weight load grew most (36.8 s -> 4 min 52 s)")
    # the ledger holds the four switches; the last carries its comparison
    switches = [r for r in read_ledger(lab.root) if r["action"] == "switch"]
    assert [r["to_release"] for r in switches] == ["ddtree-b16-aaaaaaaaaa", "ddtree-b8-bbbbbbbbbb",
                                                   "ar-tp8-cccccccccc", "ddtree-b16-dddddddddd"]
    assert switches[-1]["startup"]["slower"]["finding"]["diagnosis"] == f["diagnosis"]
    # what the deploy prints from the gap event: the gap, the start-up block, the warning
    from opsctl.cli.deploy import _StepPrinter

    [gap_event] = [e for e in events if e["event"] == "gap"]
    _StepPrinter(False)(gap_event)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[lab]   gap ")
    assert out[1].startswith("[lab]   start-up 11 min 55 s at the site (the server's own 1.43 s in the lab x time scale 500, first line to ready), "
                             "ddtree-b16: weight load 4 min 52 s · ")
    assert out[2].startswith("[lab]     in the lab: weight load 0.584 s · ")
    assert out[3].startswith("[lab]   WARN startup.slower: this start took 11 min 55 s, 54 % more than the last "
                             "start of ddtree-b16 (7 min 45 s); weight load grew most (36.8 s -> 4 min 52 s) (fix: "
                             "weights loaded slower")


def test_a_start_under_the_threshold_is_compared_and_passes(lab):
    _start(lab, "ddtree-b16-aaaaaaaaaa", CACHED)
    cmp = _start(lab, "ddtree-b16-aaaaaaaaaa", COLD)["startup"]["slower"]   # the compile came back: +5 %
    assert not cmp["slower"] and cmp["phase"] == "compile budget 16" and cmp["finding"]["ok"]
    assert cmp["finding"]["diagnosis"] == ("this start took 7 min 45 s, 5 % more than the last start of ddtree-b16 "
                                           "(7 min 23 s); Triton compile b16 grew most (none -> 22.1 s)")
    lines = startup.describe(_start(lab, "ddtree-b16-aaaaaaaaaa", COLD)["startup"])
    assert lines[-1] == ("ok   startup.slower: this start took 7 min 45 s, 0 % more than the last start of "
                         "ddtree-b16 (7 min 45 s)")


def test_a_start_that_did_not_get_ready_is_neither_read_nor_compared_with(lab):
    _start(lab, "ddtree-b16-aaaaaaaaaa", COLD)
    lab.conn.journal = SLOW
    gap = Gap("deploy", None, "ddtree-b16-bbbbbbbbbb", 30.0, drain=False)
    rec = back_in_pool(lab.conn, lab.host, gap, 1767000000, ready=False)
    assert rec["result"] == "not-ready" and "startup" not in rec
    write_ledger(lab.root, {"action": "switch", "result": "not-ready", "to_release": "ddtree-b16-cccccccccc",
                            "startup": _record(SLOW)})   # (even one with phases: it never served)
    assert _start(lab, "ddtree-b16-dddddddddd", CACHED)["startup"]["slower"]["previous_release"] == \
        "ddtree-b16-aaaaaaaaaa"


# --------------------------------------------------------------------------- the deploy's outcome and validation


def test_a_slower_start_is_a_warning_in_the_validation_and_the_deploy_still_promotes(monkeypatch, capsys):
    prev = {"action": "switch", "result": "ok", "to_release": "ddtree-b16-aaaaaaaaaa", "ts": "2026-12-01T10:00:00Z",
            "startup": _record(COLD)}
    cur = startup.parse(SLOW)
    cmp, _ = startup.compare_with_ledger(cur, "ddtree-b16", [prev])
    gap_rec = {"action": "switch", "result": "ok", "startup": {**cur.as_record("ddtree-b16"),
                                                               "slower": {**cmp.as_dict(),
                                                                          "finding": cmp.finding().model_dump()}}}
    ledger: list[dict] = []
    events: list[dict] = []
    for mod in (deploy, flow_validate):
        monkeypatch.setattr(mod, "append_ledger", lambda c, h, rec: ledger.append(rec) or rec)
    monkeypatch.setattr(deploy, "arm_guard", lambda *a, **k: None)
    monkeypatch.setattr(deploy, "switch", lambda c, h, rel, **kw: 0)
    monkeypatch.setattr(deploy, "wait_ready", lambda *a, **k: SimpleNamespace(seconds=2.0))
    monkeypatch.setattr(deploy, "back_in_pool", lambda *a, **k: gap_rec)
    monkeypatch.setattr(deploy, "disarm_guard", lambda c, h: None)
    monkeypatch.setattr(deploy, "prune", lambda c, h: [])
    monkeypatch.setattr(deploy, "require_room", lambda *a, **k: None)
    monkeypatch.setattr(deploy, "fallback_releases", lambda state, host, exclude: ["ar-tp8-base"])
    monkeypatch.setattr(deploy, "bench_and_judge", lambda *a: GateOutcome(True, "", {"status": "pass"}))

    def validate_release(conn, host, profile, since, steps, start=None):
        # the journal's checks passed; what the deploy hands over about the start is recorded with them
        t0 = steps.start("validate", "")
        ok = flow_validate.Finding(check="capture.complete", ok=True, diagnosis="every graph captured")
        return flow_validate._finish_validation(conn, host, profile, [ok], steps, t0, start)

    monkeypatch.setattr(deploy, "validate_release", validate_release)
    profile = SimpleNamespace(name="ddtree", budget=16, readiness_timeout_s=60)
    plan = SimpleNamespace(release="ddtree-b16-dddddddddd", previous="ar-tp8-base", is_live=False, repairs=[],
                           state=SimpleNamespace(judged=lambda r: False), profile=profile, as_dict=lambda: {},
                           triton_outcome=None)
    host = SimpleNamespace(name="lab", settings=SimpleNamespace(guard_s=None))
    out = deploy._apply(object(), None, host, profile, plan, Steps(events.append, "lab"), True,
                        staged=(SimpleNamespace(changed=0), SimpleNamespace(bytes_sent=0)), checks=False)
    assert out.result == "promoted"                                     # a warning fails nothing by itself
    doc = json.loads(json.dumps(out.as_dict()))                         # what --json prints of the outcome
    assert doc["startup"]["total_s"] == 715.35 and len(doc["startup"]["phases"]) == 6
    assert all({"phase", "seconds", "source"} <= set(p) for p in doc["startup"]["phases"])
    [warn] = [f for f in doc["validation"]["findings"] if f["check"] == "startup.slower"]
    assert warn["severity"] == "warning" and not warn["ok"] and doc["validation"]["ok"] is True
    [val] = [r for r in ledger if r["action"] == "validation"]
    assert val["result"] == "ok" and "WARN startup.slower: this start took 11 min 55 s" in val["reason"]
    assert [f["check"] for f in val["findings"]] == ["capture.complete", "startup.slower"]
    [done] = [e for e in events if e.get("step") == "validate" and e.get("status") not in (None, "start")]
    assert done["status"] == "warn" and "warning: startup.slower" in done["detail"]
    # the deploy's closing summary says it again
    from opsctl.cli.deploy import _print_slower

    _print_slower("lab", out.details["startup"])
    assert capsys.readouterr().out == ("[lab] WARN startup.slower: this start took 11 min 55 s, 54 % more than the last "
                                       "start of ddtree-b16 (7 min 45 s); weight load grew most (36.8 s -> 4 min 52 s)\n")


def test_the_validation_gets_the_starts_finding_only_when_there_was_a_start_to_compare_with():
    assert deploy.start_findings(None) == [] and deploy.start_findings(_record(COLD)) == []
    cmp = startup.compare(startup.parse(COLD), startup.parse(SLOW), profile="ddtree-b16")
    [f] = deploy.start_findings({**_record(SLOW), "slower": {"finding": cmp.finding().model_dump()}})
    assert f.check == "startup.slower" and f.warned and not f.failed


# --------------------------------------------------------------------------- status, history, report


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """The baseline and a ddtree release on disk, the ddtree one live; both started (the ddtree one
    twice: a cold start, then a slow one)."""
    root = tmp_path / "root"
    release(root, "ar-tp8-base000000", "ar-tp8", created="2026-12-01T00:00:00Z")
    release(root, "ddtree-b16-live000000", "ddtree", kind="ddtree", budget=16, created="2026-12-02T00:00:00Z")
    make_current(root, "ddtree-b16-live000000")
    slow = _record(SLOW)
    cmp, _ = startup.compare_with_ledger(startup.parse(SLOW), "ddtree-b16",
                                         [{"action": "switch", "result": "ok", "startup": _record(COLD)}])
    slow["slower"] = {**cmp.as_dict(), "finding": cmp.finding().model_dump()}
    write_ledger(root,
                 {"ts": "2026-12-01T00:10:00Z", "action": "switch", "result": "ok", "why": "deploy",
                  "to_release": "ar-tp8-base000000", "startup": _record(clock_journal(), "ar-tp8")},
                 {"ts": "2026-12-01T00:20:00Z", "action": "promote", "result": "ok", "to_release": "ar-tp8-base000000"},
                 {"ts": "2026-12-02T00:10:00Z", "action": "switch", "result": "ok", "why": "deploy",
                  "to_release": "ddtree-b16-live000000", "startup": _record(COLD)},
                 {"ts": "2026-12-02T00:30:00Z", "action": "switch", "result": "ok", "why": "rollback",
                  "to_release": "ddtree-b16-live000000", "startup": slow},
                 {"ts": "2026-12-02T00:40:00Z", "action": "promote", "result": "ok",
                  "to_release": "ddtree-b16-live000000"})
    host = host_config(tmp_path, root)
    monkeypatch.setattr(inspect, "connect", lambda h: LocalConnection())
    return SimpleNamespace(root=root, inv_dir=tmp_path / "inv",
                           inv=Inventory(path=Path("inv"), name="inv", hosts={"lab": host}, groups={}))


def test_status_gives_the_last_start_of_each_release(fleet):
    row = inspect.status(fleet.inv)[0]
    live, base = row["last_start"], row["baseline_last_start"]
    assert live["release"] == "ddtree-b16-live000000" and live["why"] == "rollback" and live["total_s"] == 715.35
    assert [p["phase"] for p in live["phases"]][0] == "weight_load" and live["slower"]["slower"] is True
    assert base["release"] == "ar-tp8-base000000" and base["total_s"] == 424.0 and base["time_scale"] is None
    on_disk = {r["id"]: r["last_start"] for r in row["releases_on_disk"]}
    assert on_disk["ddtree-b16-live000000"] == live and on_disk["ar-tp8-base000000"] == base


def _cli(monkeypatch, capsys, *args) -> str:
    from opsctl import cli

    monkeypatch.setattr(sys, "argv", ["opsctl", *args])
    try:
        cli.main()
    except SystemExit as exc:   # main() exits only on an error
        assert exc.code in (0, None)
    return capsys.readouterr().out


def test_status_prints_the_live_releases_last_start_in_one_line(fleet, monkeypatch, capsys):
    out = _cli(monkeypatch, capsys, "status", "-i", str(fleet.inv_dir))
    [line] = [ln for ln in out.splitlines() if "last start of" in ln]
    assert line == ("[lab] last start of ddtree-b16-live000000 (rollback, 2026-12-02T00:30:00Z): start-up 11 min 55 s "
                    "at the site (the server's own 1.43 s in the lab x time scale 500, first line to ready), ddtree-b16: weight load 4 min 52 s · "
                    "target verify graphs b16 (bs 1-64) 3 min 6 s · draft decode graphs (bs 1-64) 27.6 s · "
                    "Triton compile b16 22.1 s · warm-up 3 min · other (process start, NCCL, KV cache) 7.6 s")
    doc = json.loads(_cli(monkeypatch, capsys, "status", "-i", str(fleet.inv_dir), "--json"))
    assert doc[0]["last_start"]["total_s"] == 715.35 and doc[0]["baseline_last_start"]["total_s"] == 424.0


def test_history_has_a_start_column_for_switch_records(fleet, monkeypatch, capsys):
    out = _cli(monkeypatch, capsys, "history", "-i", str(fleet.inv_dir))
    rows = [ln for ln in out.splitlines() if "2026-12-0" in ln]
    assert "7 min 4 s" in rows[0] and "7 min 45 s" in rows[2] and "11 min 55 s, +54 % SLOWER" in rows[3]
    assert "min" not in rows[1] and "min" not in rows[4]       # promote records: no start of their own


def test_the_release_report_has_its_last_start(fleet):
    from opsctl.report import markdown, start_lines

    last = startup.last_start(read_ledger(fleet.root), "ddtree-b16-live000000")
    lines = start_lines(last)
    assert lines[0] == "Last start: 2026-12-02T00:30:00Z (rollback)" and lines[1].startswith("start-up 11 min 55 s")
    assert lines[-1].startswith("WARN startup.slower: this start took 11 min 55 s")
    from opsctl.gate.results import BenchRun

    md = markdown(BenchRun(meta={"release": "ddtree-b16-live000000"}, levels=[]), start=last)
    assert "## Start-up" in md and "- start-up 11 min 55 s at the site" in md and "- in the lab: weight load" in md
