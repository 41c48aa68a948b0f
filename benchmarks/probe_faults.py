"""Issue #50's 13 kinds of fault, probed again: what was done, what an SRE expects, what was
observed, HOLDS or FAILS, and the tally.

Each kind is either a probe run right here on the host programs and parsers opsctl ships (the
ledger's appender under 8 writers at once, a tampered ledger and release tree, hostile inventory
values, a garbage control file, a corrupt Triton cache manifest), or the lab tests that do what
the issue's prober did to the lab host (kill -9 of the controller at a step, the guard with
failing fallbacks, the watch under each condition, two operators, a drain deadline ...): each
kind's tests run in a pytest session of their own, within one time budget for the lab in all, and
the kind is judged by its tests' results (junit XML). A lab kind whose tests did not run is `NOT RUN`, never
counted as holding.

    python benchmarks/probe_faults.py            # every kind (the lab tests take the lab's session lock)
    python benchmarks/probe_faults.py --quick    # only the kinds probed here (seconds, no lab)
    python benchmarks/probe_faults.py --kinds kill,drain --lab-budget 1800 [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "runtime" / "src"))

D = "tests/deploy/"


@dataclass
class Kind:
    name: str
    done: str
    expected: str
    probe: Callable[[], tuple[bool, str]] | None = None   # run here: (holds, observed)
    tests: list[str] = field(default_factory=list)         # lab tests (pytest node ids)
    result: str = "NOT RUN"
    observed: str = ""
    seconds: float = 0.0


# --------------------------------------------------------------------------- probes run here


def probe_ledger_races() -> tuple[bool, str]:
    """8 writers x 60 records at once through bin/opsctl-ledger-append, a torn last line waiting."""
    from hostdirs import install_programs

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        install_programs(root, ("opsctl-ledger-append",))
        ledger = root / "ledger.jsonl"
        ledger.write_text('{"ts": "x", "action": "promote", "result": "ok"}\n{"ts": "torn", "act')
        script = ("import json, subprocess, sys\n"
                  "for i in range(60):\n"
                  "    rec = {'ts': 't', 'action': 'race', 'writer': int(sys.argv[3]), 'i': i, 'pad': 'x' * 3000}\n"
                  "    subprocess.run([sys.argv[1], sys.argv[2]], input=json.dumps(rec) + '\\n', text=True, check=True)\n")
        procs = [subprocess.Popen([sys.executable, "-c", script, str(root / "bin/opsctl-ledger-append"), str(ledger),
                                   str(w)]) for w in range(8)]
        rcs = [p.wait(300) for p in procs]
        lines = ledger.read_text().splitlines()
        recs, bad = [], 0
        for line in lines:
            try:
                recs.append(json.loads(line))
            except ValueError:
                bad += 1
        races = [r for r in recs if r.get("action") == "race"]
        per_writer = {w: [r["i"] for r in races if r["writer"] == w] for w in range(8)}
        in_order = all(v == list(range(60)) for v in per_writer.values())
        torn = (root / "ledger.jsonl.torn").exists()
        ok = rcs == [0] * 8 and bad == 0 and len(races) == 480 and in_order and torn
        return ok, (f"{len(races)}/480 records whole, {bad} broken lines, each writer's in order: {in_order}, "
                    f"the torn line moved to ledger.jsonl.torn: {torn}")


def probe_tampering() -> tuple[bool, str]:
    """A foreign line and a torn line in the ledger; an edited file in a release's runtime tree."""
    from hostdirs import install_programs, release
    from opsctl.host import facts

    text = ('{"action": "promote", "result": "ok", "to_release": "a"}\nnot json at all\n[1, 2]\n'
            '{"action": "verdict", "status": "pass", "release": "a"}\n{"action": "depl')
    recs, problems = facts.LedgerRecords("/opt/opsctl").process(text)
    ledger_ok = len(recs) == 2 and [p.split(":")[0] for p in problems] == ["line 2", "line 3", "line 5"]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        install_programs(root, ("opsctl-verify",))
        release(root, "ar-tp8-aaaaaaaaaa", site={"sglang_ddtree/worker.py": b"print('real')\n"})
        clean = subprocess.run([sys.executable, str(root / "bin/opsctl-verify"), str(root), "ar-tp8-aaaaaaaaaa"],
                               capture_output=True, text=True, timeout=60)
        (root / "releases/ar-tp8-aaaaaaaaaa/site/sglang_ddtree/worker.py").write_text("print('edited')\n")
        edited = subprocess.run([sys.executable, str(root / "bin/opsctl-verify"), str(root), "ar-tp8-aaaaaaaaaa"],
                                capture_output=True, text=True, timeout=60)
    before = json.loads(clean.stdout.strip().splitlines()[-1]).get("problems") or []
    after = json.loads(edited.stdout.strip().splitlines()[-1]).get("problems") or []
    tree_ok = before == [] and any("worker.py" in p for p in after)
    return ledger_ok and tree_ok, (f"ledger: {len(recs)} records kept, skipped {'; '.join(problems)}; "
                                   f"opsctl-verify: clean {len(before)} problems, edited: {after[:1]}")


def probe_hostile_strings() -> tuple[bool, str]:
    """A profile named `arx$(touch${IFS}PWNED)` and an install_root with a `;` in the inventory."""
    import shutil

    import yaml

    from opsctl.config import load_inventory
    from opsctl.errors import ConfigError

    seen = []
    for what in ("profile", "install_root"):
        with tempfile.TemporaryDirectory() as d:
            inv = Path(d) / "inv"
            shutil.copytree(REPO / "inventories/lab", inv)
            gv = inv / "group_vars/all.yml"
            doc = yaml.safe_load(gv.read_text())
            if what == "profile":
                profs = doc["opsctl"]["profiles"]
                profs["arx$(touch${IFS}PWNED)"] = profs.pop(next(iter(profs)))
            else:
                doc["opsctl"]["install_root"] = "/opt/opsctl; touch /tmp/PWNED"
            gv.write_text(yaml.safe_dump(doc))
            try:
                load_inventory(inv)
                seen.append(f"{what}: LOADED")
            except ConfigError as exc:
                seen.append(f"{what}: refused ({exc.problem[:70]})")
    return all("refused" in s for s in seen), "; ".join(seen)


def probe_garbage_control() -> tuple[bool, str]:
    """Garbage in the DDTree control file: the runtime's own parser (sglang_ddtree.trialset)."""
    parse_control = _runtime_module("trialset").parse_control

    garbage = ["", "\x00\xff garbage", '{"active": ', '["8"]', '{"active": "8", "rm -rf /": 1}', '{"active": 0}',
               '{"active": "1:8,1:4"}', '{"active": null}']
    refused = []
    for text in garbage:
        try:
            parse_control(text, "/run/ctl.json")
        except ValueError as exc:
            refused.append(str(exc).startswith("/run/ctl.json: "))
    good = parse_control('{"active": "1:16,3:4"}').name
    return all(refused) and len(refused) == len(garbage) and good == "1:16,3:4", (
        f"{sum(refused)}/{len(garbage)} garbage contents refused naming the file; a good one still reads ({good})")


def _runtime_module(name: str):
    """runtime/src/sglang_ddtree/<name>.py as the runtime ships it, without the package's __init__
    (it imports torch, which the controller does not have): its own stdlib modules only."""
    import importlib
    import types

    if "sglang_ddtree" not in sys.modules:
        pkg = types.ModuleType("sglang_ddtree")
        pkg.__path__ = [str(REPO / "runtime/src/sglang_ddtree")]
        sys.modules["sglang_ddtree"] = pkg
    return importlib.import_module(f"sglang_ddtree.{name}")


def probe_corrupt_triton() -> tuple[bool, str]:
    """The shared Triton cache's manifest corrupt (truncated JSON, a wrong type, entries without
    fields): read as no cache, so the deploy compiles or ships again instead of trusting it."""
    from opsctl import triton
    from opsctl.host import facts

    needs = triton.needs_from(arch="sm_90", runtime="a" * 64, budgets=[8], block=16, vocab_shard=20480, hidden=7168,
                              tp=8, max_bs=8)
    whole = {**needs.meta(None), "specialisations": [s.as_dict() for s in needs.specialisations]}
    control = triton.coverage(facts.JsonFile("/x/manifest.json").process(json.dumps(whole)), needs).covered
    seen = []
    for text in ['{"specialisations": [{"budget": 8', "[1, 2, 3]", '{"specialisations": [{"budget": "x"}, {}]}',
                 "\x00\x01\x02"]:
        doc = facts.JsonFile("/x/manifest.json").process(text)
        cov = triton.coverage(triton._as_written_for(doc if isinstance(doc, dict) else {}, "a" * 64), needs)
        seen.append(cov.covered)
    return control and not any(seen), (f"the whole manifest: covered {control}; {len(seen)} corrupt ones, covered: "
                                       f"{seen} (not covered: the cache is compiled or shipped again)")


# --------------------------------------------------------------------------- the kinds


def kinds() -> list[Kind]:
    return [
        Kind("kill -9 at every step", "kill -9 of `opsctl deploy` at plan/stage (before the switch), at ready, "
             "validate and bench (after it)", "before: nothing live changes, no orphan; after: status says "
             "unjudged + unfinished, the guard puts the last good back and records `ok` once ready",
             tests=[D + "test_truth_releases_lab.py::test_controller_killed_before_the_switch_leaves_no_orphan_and_nothing_live_changed",
                    D + "test_truth_interrupts_lab.py::test_controller_killed_after_the_switch"]),
        Kind("kill -9 during the automatic rollback", "gate FAIL (accept collapse), kill -9 at the rollback's "
             "first line, and once the rollback's switch is made", "the previous release serves; the switch is "
             "on the host's record; no `guard unchanged`; status's every line matches the host",
             tests=[D + "test_twice_lab.py::test_controller_killed_during_the_automatic_rollback_leaves_the_baseline_serving",
                    D + "test_truth_rollback_kill_lab.py"]),
        Kind("kill -9 during the drain's SIGTERM", "kill -9 after the drain's SIGTERM, before the switch",
             "the drain guard starts the old release again and its restart is in the ledger",
             tests=[D + "test_drain_lab.py::test_a_controller_killed_during_the_drain_leaves_the_drain_guards_restart_in_the_ledger"]),
        Kind("the guard with failing fallbacks", "kill -9 at ready, then every DDTree start fails (capture)",
             "each fallback that does not start is `rollback failed`; the baseline or, when all fail, the "
             "release that served (last resort) serves and is recorded",
             tests=[D + "test_truth_guard_lab.py::test_the_guard_records_a_fallback_that_does_not_start_as_failed_and_goes_on_to_the_baseline",
                    D + "test_truth_guard_lab.py::test_every_fallback_failing_the_guard_restarts_the_release_that_served_and_says_so"]),
        Kind("the watch (collapse, slow decode, idle, racing deploy, tune, crash loop, full disk)",
             "the watch agent on the host under each condition", "it trips on collapse / throughput alone / a "
             "crash loop, never when idle, re-arms after a deploy or a tune, acts once the disk has room",
             # in the module's order (pytest runs node ids in the order given): its tests share one
             # lab host and the watch's state; the re-arm test re-arms the trip the decay test left
             tests=["tests/watch/test_watch_lab.py::" + t for t in (
                 "test_decayed_ddtree_is_switched_back_to_the_baseline_by_the_host_alone",
                 "test_a_new_deploy_rearms_the_watch", "test_idle_release_is_never_switched",
                 "test_crash_loop_is_rolled_back", "test_the_watch_judges_the_live_release_again_after_a_tune",
                 "test_a_release_below_the_baseline_curve_is_switched_back_on_throughput_alone",
                 "test_a_breach_on_a_full_disk_is_shown_failing_and_acted_on_once_there_is_room")]),
        Kind("ledger races", "8 writers x 60 records (3 KB each) at once through bin/opsctl-ledger-append, a "
             "torn last line already there", "every record whole, each writer's in order, the torn line moved "
             "aside", probe=probe_ledger_races),
        Kind("tampering", "a foreign and a torn ledger line; a file edited in a release's runtime tree",
             "bad lines reported with their number and skipped, the rest read; opsctl-verify names the file",
             probe=probe_tampering),
        Kind("hostile strings", "a profile named arx$(touch${IFS}PWNED), an install_root with `; touch`",
             "refused when the inventory loads (exit 2), nothing runs", probe=probe_hostile_strings),
        Kind("tune kills", "a tune's trials that fail to start, and an interrupt mid-tune",
             "the live release is restored and serves; the trial release is never good",
             tests=["tests/tune/test_tune_lab.py::test_tune_restores_after_trials_that_fail_to_start_and_after_an_interrupt",
                    D + "test_truth_guard_lab.py::test_a_no_gate_release_is_never_good_and_neither_rollback_nor_the_guard_goes_to_it"]),
        Kind("a garbage control file", "empty, binary, truncated JSON, a list, an unknown key, budget 0, a bad "
             "schedule, null written as the DDTree control file", "the runtime refuses each, naming the file; "
             "a good one still reads", probe=probe_garbage_control),
        Kind("a corrupt Triton cache", "the shared cache's manifest truncated, of the wrong type, with broken "
             "entries, binary", "read as no cache: not covered, so the deploy compiles/ships it again",
             probe=probe_corrupt_triton),
        Kind("two operators at once", "two `opsctl deploy` of the same host at once",
             "one gets the lock, the other a clean lock error naming the holder (exit 4)",
             tests=[D + "test_deploy_lab.py::test_concurrent_deploys_one_fails_naming_the_lock_holder"]),
        Kind("a drain deadline", "a drain deadline shorter than the requests in flight",
             "the requests cut at the deadline counted exactly in the switch record",
             tests=[D + "test_drain_lab.py::test_a_deadline_shorter_than_the_requests_records_exactly_the_aborted_count"]),
    ]


# --------------------------------------------------------------------------- running


def run_probe(k: Kind) -> None:
    t0 = time.monotonic()
    try:
        ok, k.observed = k.probe()
        k.result = "HOLDS" if ok else "FAILS"
    except Exception as exc:  # noqa: BLE001 - a probe that breaks is a failure, said as such
        k.result, k.observed = "FAILS", f"the probe raised {type(exc).__name__}: {exc}"
    k.seconds = time.monotonic() - t0


def run_lab(selected: list[Kind], budget_s: float) -> None:
    """Each kind's lab tests in a pytest session of its own (a kind cut short by the budget keeps
    the others' results); a kind not reached within the budget stays NOT RUN."""
    end = time.monotonic() + budget_s
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    # the longest (the watch's seven conditions, a tune) last: a short budget reaches the others
    for k in sorted(selected, key=lambda k: ("watch" in k.name, "tune" in k.name)):
        left = end - time.monotonic()
        if not k.tests or left < 60:
            if k.tests:
                k.observed = f"not reached within the lab budget ({budget_s:.0f} s)"
            continue
        xml = Path(tempfile.mkdtemp()) / "lab.xml"
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "lab",
                                   f"--junitxml={xml}", *k.tests], cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=left)
            tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout else []
        except subprocess.TimeoutExpired:
            tail = [f"cut at the lab budget after {time.monotonic() - t0:.0f} s"]
        k.seconds = time.monotonic() - t0
        cases = []
        if xml.exists():
            for tc in ET.parse(xml).getroot().iter("testcase"):
                bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
                msg = " ".join((bad.get("message") or "").split())[:200] if bad is not None else ""
                cases.append((tc.get("name", ""), "fail" if bad is not None else
                              "skip" if tc.find("skipped") is not None else "pass", msg))
        passed = [c for c in cases if c[1] == "pass"]
        failed = [c for c in cases if c[1] == "fail"]
        if failed:
            k.result = "FAILS"
            k.observed = f"{len(passed)}/{len(cases)} lab tests passed; " + "; ".join(f"{c[0]}: {c[2]}" for c in failed)
        elif passed and len(passed) == len(cases):
            k.result = "HOLDS"
            k.observed = f"{len(passed)}/{len(cases)} lab tests passed ({', '.join(c[0] for c in passed)})"
        else:
            k.observed = f"its lab tests did not run ({'; '.join(tail) or 'no result'})"
        print(f"[{k.name}] {k.result}: {k.observed[:300]} ({k.seconds:.0f} s)", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the kinds probed here (no lab)")
    ap.add_argument("--kinds", default="", help="comma-separated substrings of kind names")
    ap.add_argument("--lab-budget", type=float, default=5400.0, help="seconds for the lab tests in all")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ks = kinds()
    if a.kinds:
        ks = [k for k in ks if any(s.strip().lower() in k.name.lower() for s in a.kinds.split(","))]
    for k in ks:
        if k.probe is not None:
            run_probe(k)
    if not a.quick:
        run_lab([k for k in ks if k.tests], a.lab_budget)
    if a.json:
        print(json.dumps([{"kind": k.name, "done": k.done, "expected": k.expected, "observed": k.observed,
                           "result": k.result, "how": "probe here" if k.probe else "lab tests",
                           "seconds": round(k.seconds, 1)} for k in ks], indent=1))
    else:
        print(f"{'kind':<34} {'result':<8} {'s':>6}  how")
        for k in ks:
            print(f"{k.name[:34]:<34} {k.result:<8} {k.seconds:>6.1f}  {'probe here' if k.probe else 'lab tests'}")
            print(f"    done:     {k.done}")
            print(f"    expected: {k.expected}")
            print(f"    observed: {k.observed}")
    tally = {r: sum(k.result == r for k in ks) for r in ("HOLDS", "FAILS", "NOT RUN")}
    print(f"tally: {tally['HOLDS']} hold, {tally['FAILS']} fail, {tally['NOT RUN']} not run, of {len(ks)} kinds")
    return 1 if tally["FAILS"] else 0


if __name__ == "__main__":
    sys.exit(main())
