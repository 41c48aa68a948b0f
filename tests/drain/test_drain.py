"""The drain before every switch and the serving gap on the record (issue #35), without the lab:
the opsctl.drain settings, the deadline's default, SGLang 0.5.23's /v1/loads, the hooks, the gap
record, a drain on a scripted fake host (hook failure: nothing changed; the deadline: aborted
counted; Ctrl-C: back in the pool), the fleet's pool arithmetic and tune's restart plan."""
from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import pytest

from opsctl.brake import BRAKE, Interrupted
from opsctl.config import DrainSettings, load_inventory
from opsctl.drain import (Gap, Load, bench_p99_s, default_deadline_s, describe, max_out_of_pool, parse_loads,
                          serving_timeline)
from opsctl.errors import ConfigError, HostError
from opsctl.host import facts
from opsctl.host.connection import Result

REPO = Path(__file__).resolve().parents[2]

# what SGLang 0.5.23's GET /v1/loads answers (entrypoints/v1_loads.py, LoadSnapshot.to_dict), trimmed
LOADS_0523 = {"timestamp": 1767225600.0, "version": "0.5.23", "accelerator": "cuda", "num_accelerators": 8,
              "loads": [{"timestamp": 1767225600.0, "dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 2,
                         "num_waiting_uncached_tokens": 0, "num_used_tokens": 512, "num_total_tokens": 100000,
                         "max_running_requests": 64, "token_usage": 0.01, "gen_throughput": 120.0}]}


# --------------------------------------------------------------------------- settings


def _inventory(tmp_path: Path, drain_yaml: str) -> Path:
    import shutil

    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories" / "lab", inv)
    gv = inv / "group_vars" / "all.yml"
    text = gv.read_text()
    assert text.startswith("opsctl:\n")
    gv.write_text(text.rstrip("\n") + "\n" + textwrap.indent(drain_yaml, "  ") + "\n")   # last: they win
    return inv


def test_drain_is_on_by_default_and_the_unit_stops_later_than_any_drain():
    d = DrainSettings()
    assert d.enabled and d.deadline_s is None and d.hooks.out is None and d.hooks.in_ is None
    assert d.timeout_stop_sec > 600                       # above the derived deadline's cap
    assert DrainSettings(deadline_s=900).timeout_stop_sec > 900
    assert DrainSettings(enabled=False).timeout_stop_sec == 120


def test_hooks_load_from_the_inventory_with_in_and_out(tmp_path):
    inv = load_inventory(_inventory(tmp_path, "drain:\n  deadline_s: 45\n  poll_s: 0.5\n  hooks:\n"
                                    "    out: {command: 'lb-ctl disable $1'}\n"
                                    "    in: {url: 'https://lb.example/pool', method: PUT}\n"))
    d = next(iter(inv.hosts.values())).settings.drain
    assert d.deadline_s == 45 and d.poll_s == 0.5
    assert d.hooks.out.command == "lb-ctl disable $1" and d.hooks.in_.url == "https://lb.example/pool"
    from opsctl.render import render

    host = next(iter(inv.hosts.values()))
    unit = render(host, host.profile("ar-tp8")).release_files[host.unit_name]
    assert "TimeoutStopSec=120\n" in unit  # 45 + 60 is below the floor of 120


@pytest.mark.parametrize("bad, words", [
    ("drain:\n  hooks:\n    out: {command: x, url: 'http://a'}\n", "exactly one"),
    ("drain:\n  hooks:\n    out: {}\n", "exactly one"),
    ("drain:\n  hooks:\n    out: {url: 'ftp://a'}\n", "http"),
    ("drain:\n  deadline_s: 0\n", "deadline_s"),
    ("drain:\n  deadlin_s: 10\n", "did you mean 'deadline_s'"),
    ("drain:\n  hooks:\n    inn: {command: x}\n", "unknown key opsctl.drain.hooks.inn"),
    ("rollout:\n  max_unavailable: 0\n", "max_unavailable"),
])
def test_bad_drain_settings_are_refused_at_load(tmp_path, bad, words):
    with pytest.raises(ConfigError) as err:
        load_inventory(_inventory(tmp_path, bad))
    assert words in err.value.problem + (err.value.fix or "")


def test_deadline_default_is_twice_the_stored_p99_capped_at_ten_minutes():
    assert default_deadline_s(None) == 300.0
    assert default_deadline_s(12.5) == 25.0
    assert default_deadline_s(400) == 600.0
    from types import SimpleNamespace as NS

    run = NS(levels=[NS(p99_e2e_latency_ms=800.0), NS(p99_e2e_latency_ms=2400.0)])
    assert bench_p99_s(run) == 2.4
    assert bench_p99_s(NS(levels=[])) is None


# --------------------------------------------------------------------------- /v1/loads


def test_v1_loads_of_0_5_23_is_running_plus_waiting_over_dp_ranks():
    assert parse_loads(json.dumps(LOADS_0523)) == Load(3, 2)
    two = {**LOADS_0523, "loads": [LOADS_0523["loads"][0], {**LOADS_0523["loads"][0], "dp_rank": 1,
                                                            "num_running_reqs": 1, "num_waiting_reqs": 0}]}
    assert parse_loads(json.dumps(two)).busy == 6
    assert parse_loads(json.dumps({**LOADS_0523, "loads": []})) == Load(0, 0)
    for bad in ("", "not json", "{}", '{"loads": [{"num_running_reqs": "x"}]}', '{"num_reqs": 3}'):
        assert parse_loads(bad) is None


def test_the_loads_fact_asks_v1_loads_never_get_load():
    f = facts.Loads("/usr/bin/python3", 30000)
    assert "/v1/loads" in f.command() and "get_load" not in f.command()
    assert f.process(json.dumps(LOADS_0523) + "\n") == Load(3, 2)
    assert f.process("\n") is None


def test_the_loads_fact_against_a_server(tmp_path):
    """The fact's command, run here against a small HTTP server answering like 0.5.23."""
    import http.server
    import subprocess
    import sys
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(LOADS_0523).encode() if self.path == "/v1/loads" else b"{}"
            self.send_response(200 if self.path == "/v1/loads" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        f = facts.Loads(sys.executable, srv.server_address[1])
        out = subprocess.run(["/bin/sh", "-c", f.command()], capture_output=True, text=True, timeout=30).stdout
        assert f.process(out) == Load(3, 2)
    finally:
        srv.shutdown()


# --------------------------------------------------------------------------- the gap record


def test_the_gap_record_carries_every_figure_and_the_site_scale():
    g = Gap("deploy", "ar-a", "ddtree-b", 60.0, hooks=True)
    g.out_at, g.stop_at, g.stopped_at, g.ready_at, g.in_at = 100.0, 102.5, 103.0, 107.1, 107.3
    g.inflight_at_start, g.time_scale = 4, 500.0
    rec = g.record()
    assert rec["action"] == "switch"
    for k in ("drain_s", "stop_s", "start_s", "gap_s", "inflight_at_start", "aborted", "pool_out_at", "pool_in_at"):
        assert k in rec
    assert (rec["drain_s"], rec["stop_s"], rec["start_s"], rec["gap_s"]) == (2.5, 0.5, 4.1, 4.6)
    assert rec["out_of_pool_s"] == 7.3 and rec["aborted"] == 0
    # no start-up phases read: the lab's start x the scale; the stop (a drain's end) as measured
    assert rec["site"] == {"drain_s": 2.5, "stop_s": 0.5, "start_s": 2050.0, "gap_s": 2050.5}
    line = describe(rec)
    # issue #49: each sum in the line, and what is scaled and what is not
    assert line.startswith("gap 4.6 s in the lab = stop 0.5 s + start 4.1 s (after a drain of 2.5 s that still "
                           "served); at the site 34 min 10 s = the stop as measured (0.5 s, real time: not scaled) "
                           "+ the start-up at the site's scale (34 min 10 s, the lab's 4.1 s x time scale 500)")
    g.startup = {"total_s": 391.0, "phases": []}   # the emulator's modelled start at the site's scale
    assert g.record()["site"] == {"drain_s": 2.5, "stop_s": 0.5, "start_s": 391.0, "gap_s": 391.5}
    assert describe(g.record()).startswith(
        "gap 4.6 s in the lab = stop 0.5 s + start 4.1 s (after a drain of 2.5 s that still served); at the site "
        "6 min 32 s = the stop as measured (0.5 s, real time: not scaled) + the start-up at the site's scale "
        "(6 min 31 s, the emulator's phases, not the lab's 4.1 s x 500)")
    assert "4 in flight" in line and "0 aborted" in line
    g2 = Gap("rollback", "x", "y", 10.0)
    g2.out_at, g2.stop_at, g2.stopped_at, g2.ready_at = 0.0, 10.0, 11.0, 13.0
    g2.deadline_hit, g2.aborted = True, 3
    assert "3 aborted (deadline 10 s reached)" in describe(g2.record())
    assert "at the site" not in describe(g2.record())


# --------------------------------------------------------------------------- the drain on a fake host


class FakeHost:
    """A scripted host: the unit's state, /v1/loads answers in turn (the last repeats), every command kept."""

    def __init__(self, loads: list, active: str = "active"):
        self.loads, self.active, self.commands, self.stdin = list(loads), active, [], []

    def run(self, command: str, *, check: bool = True, timeout: float | None = None, stdin: str | None = None,
            **_):
        self.commands.append(command)
        if stdin:
            self.stdin.append(stdin)
        if command.startswith("systemctl show"):
            return Result(command, 0, f"ActiveState={self.active}\n")
        if "/v1/loads" in command:
            n = self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]
            body = "" if n is None else json.dumps({"loads": [{"num_running_reqs": n, "num_waiting_reqs": 0}]})
            return Result(command, 0, body + "\n")
        if "health_generate" in command:
            return Result(command, 0, "200\n")
        return Result(command, 0, "")

    def sent(self, word: str) -> list[str]:
        return [c for c in self.commands if word in c]


def _host(tmp_path, drain_yaml: str = ""):
    inv = load_inventory(_inventory(tmp_path, drain_yaml)) if drain_yaml else load_inventory(REPO / "inventories" / "lab")
    return next(iter(inv.hosts.values()))


def test_a_failing_out_hook_stops_before_anything_changes(tmp_path):
    from opsctl.flow.switch import drain_before_switch

    host = _host(tmp_path, "drain:\n  hooks:\n    out: {command: 'echo the pool said no >&2; exit 7'}\n")
    fake = FakeHost([2])
    with pytest.raises(HostError) as err:
        drain_before_switch(fake, host, why="deploy", from_release="a", to_release="b", deadline_s=5)
    assert err.value.exit_code == 3
    assert "drain 'out' hook failed (exit 7): the pool said no" in err.value.problem
    assert "\n" not in err.value.problem
    assert not fake.sent("systemctl kill") and not fake.sent("opsctl-switch")   # nothing live changed


def test_hooks_get_the_hosts_name_and_address_and_the_drain_waits_for_in_flight(tmp_path):
    from opsctl.flow.switch import back_in_pool, drain_before_switch, switch_drained

    log = tmp_path / "hooks.log"
    host = _host(tmp_path, "drain:\n  poll_s: 0.01\n  hooks:\n"
                           f"    out: {{command: 'echo out $1 $2 $OPSCTL_HOST $OPSCTL_ADDRESS $OPSCTL_DRAIN >> {log}'}}\n"
                           f"    in: {{command: 'echo in $1 $OPSCTL_DRAIN >> {log}'}}\n")
    fake = FakeHost([3, 3, 2, 1, 0, 0])
    gap = drain_before_switch(fake, host, why="deploy", from_release="a", to_release="b", deadline_s=30)
    assert gap.inflight_at_start == 3 and gap.aborted == 0 and not gap.deadline_hit
    assert fake.sent("--signal=SIGTERM")        # then SGLang's own drain: 503 on /health*
    assert log.read_text().split("\n")[0] == f"out {host.name} {host.ssh.address} {host.name} {host.ssh.address} out"
    on_host: list[dict] = []   # what bin/opsctl-switch appends on the host as it flips `current`
    switch_drained(fake, host, "b", gap, lambda conn, h, rel, record=None, disarm=False: on_host.append(record) or 0)
    assert not fake.sent("SIGKILL")             # nothing left to cut
    rec = back_in_pool(fake, host, gap, None)
    assert log.read_text().splitlines()[1] == f"in {host.name} in"
    assert rec["aborted"] == 0 and rec["pool_in_at"] >= rec["pool_out_at"]
    [sw] = on_host   # the switch's record travels with the switch (issue #50), never from the controller after it
    assert sw["action"] == "switch" and sw["why"] == "deploy" and sw["inflight_at_start"] == 3 and sw["aborted"] == 0
    assert not [x for x in fake.stdin if '"action": "switch"' in x]
    [line] = [json.loads(x) for x in fake.stdin if '"action": "start"' in x]
    assert line["switch_id"] == sw["switch_id"] and line["pool_in_at"] >= sw["pool_out_at"]
    assert facts.fold_switches([sw, line])[0]["pool_in_at"] == line["pool_in_at"]


def test_a_controller_lost_after_the_drain_stopped_the_server_leaves_a_timer_that_starts_it_again(tmp_path):
    """The SIGTERM ends the live server once its requests finish; the switch that starts the next
    one is the controller's. A timer armed on the host before that SIGTERM restarts the old
    release unless the switch disarms it: a controller killed in between cannot leave the host dark."""
    from opsctl.flow.switch import drain_before_switch, drain_guard_unit, switch_drained

    host = _host(tmp_path, "drain:\n  poll_s: 0.01\n")
    fake = FakeHost([1, 0])
    gap = drain_before_switch(fake, host, why="deploy", from_release="a", to_release="b", deadline_s=30)
    unit = drain_guard_unit(host)
    arm = fake.sent(f"systemd-run --quiet --unit {unit} ")
    term = [i for i, c in enumerate(fake.commands) if "--signal=SIGTERM" in c]
    assert arm and term and fake.commands.index(arm[0]) < term[0]          # armed before the server is stopped
    assert "--on-active=45s" in arm[0] and f"systemctl restart --no-block {host.unit_name}" in arm[0]
    n = len(fake.commands)
    switch_drained(fake, host, "b", gap, lambda conn, h, rel, **kw: fake.commands.append("SWITCH") or 0)
    after = fake.commands[n:]
    assert any(c.startswith(f"systemctl stop {unit}.timer") for c in after[:after.index("SWITCH")])


def test_requests_running_at_the_deadline_are_counted_and_cut_by_the_switch(tmp_path):
    from opsctl.flow.switch import drain_before_switch, switch_drained

    host = _host(tmp_path, "drain:\n  poll_s: 0.01\n")
    fake = FakeHost([5, 4, 4])
    gap = drain_before_switch(fake, host, why="deploy", from_release="a", to_release="b", deadline_s=0.2)
    assert gap.deadline_hit and gap.aborted == 4
    switch_drained(fake, host, "b", gap, lambda conn, h, rel, **kw: 0)
    assert fake.sent("--signal=SIGKILL")
    assert gap.record()["aborted"] == 4


def test_nothing_to_drain_when_the_service_is_down_or_the_drain_is_off(tmp_path):
    from opsctl.flow.switch import drain_before_switch

    fake = FakeHost([3], active="failed")
    gap = drain_before_switch(fake, _host(tmp_path), why="rollback", from_release="a", to_release="b", deadline_s=9)
    assert not gap.drain and not fake.sent("systemctl kill")
    off = _host(tmp_path / "off", "drain:\n  enabled: false\n")
    fake = FakeHost([3])
    gap = drain_before_switch(fake, off, why="deploy", from_release="a", to_release="b", deadline_s=9)
    assert gap.inflight_at_start == 3 and not fake.sent("systemctl kill")


def test_ctrl_c_during_the_drain_puts_the_host_back_in_the_pool_and_switches_nothing(tmp_path):
    from opsctl.flow.switch import drain_before_switch

    log = tmp_path / "hooks.log"
    host = _host(tmp_path, "drain:\n  poll_s: 0.01\n  hooks:\n"
                           f"    out: {{command: 'echo out >> {log}'}}\n    in: {{command: 'echo in >> {log}'}}\n")

    class Interrupting(FakeHost):
        def run(self, command, **kw):
            if "/v1/loads" in command and len(self.sent("/v1/loads")) == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return super().run(command, **kw)

    fake = Interrupting([2])
    try:
        with BRAKE.engaged():
            with pytest.raises(Interrupted) as err:
                drain_before_switch(fake, host, why="deploy", from_release="a", to_release="b", deadline_s=30)
    finally:
        BRAKE.reset()   # the brake is process-wide: the next test starts with no signal counted
    assert err.value.exit_code == 130 and err.value.details["switched"] is False
    assert "nothing live changed" in err.value.problem and "back in the pool" in err.value.problem
    assert log.read_text().split() == ["out", "in"]
    assert not fake.sent("systemctl kill") and not fake.sent("opsctl-switch")


# --------------------------------------------------------------------------- fleets


def _sw(host, out, back):
    return {"action": "switch", "host": host, "pool_out_at": out, "pool_in_at": back}


def test_pool_arithmetic_from_the_ledgers():
    one_at_a_time = [_sw("lab1", 0, 5), _sw("lab2", 5, 9), _sw("lab3", 9.5, 12)]
    assert max_out_of_pool(one_at_a_time) == 1
    assert serving_timeline(one_at_a_time, 3) == [(0, 2), (5, 3), (5, 2), (9, 3), (9.5, 2), (12, 3)]
    overlap = [_sw("lab1", 0, 5), _sw("lab2", 4, 9)]
    assert max_out_of_pool(overlap) == 2
    # a host left out by a failed start counts until its next switch brings it back
    stuck = [{"action": "switch", "host": "lab1", "pool_out_at": 0, "pool_in_at": None}, _sw("lab2", 3, 4),
             _sw("lab1", 6, 8)]
    assert max_out_of_pool(stuck) == 2


def test_max_unavailable_is_a_rollout_setting(tmp_path):
    inv = load_inventory(_inventory(tmp_path, "rollout:\n  waves: [2]\n  max_unavailable: 2\n"))
    assert next(iter(inv.hosts.values())).settings.rollout.max_unavailable == 2


def test_a_host_left_down_by_a_failed_wave_host_stops_the_next_switch(monkeypatch):
    """Within a wave (Ansible's serial), hosts switch one at a time; a failed host that serves
    nothing counts as out of the pool, so with max_unavailable 1 the next host is not drained."""
    from types import SimpleNamespace as NS

    from opsctl.flow import deploy
    from opsctl.errors import DeployFailed

    down = NS(name="lab1", conn=NS(), plan=NS(), error=DeployFailed("lab1: start failed"),
              host=NS(host_python="/usr/bin/python3", http_port=30000))
    served = NS(name="lab2", conn=NS(), plan=NS(), error=DeployFailed("lab2: gate failed"),
                host=NS(host_python="/usr/bin/python3", http_port=30001))
    monkeypatch.setattr(deploy.facts, "get", lambda conn, fact, timeout=60: 0 if fact.port == 30000 else 200)
    assert deploy._out_of_pool([down, served]) == ["lab1"]


# --------------------------------------------------------------------------- fewer restarts


def test_watch_and_gate_policy_are_not_part_of_the_release(tmp_path):
    """A deploy whose unit and runtime are unchanged but whose watch or gate policy changed names
    the same release: live and judged, it is `unchanged` and SGLang is not restarted (the watch's
    own unit restarts when its configuration changed)."""
    from opsctl.render import render

    a = _host(tmp_path / "a")
    b = _host(tmp_path / "b", "watch:\n  enabled: true\n  mode: alert\n  interval_s: 30\n  window_s: 400\n"
                              "gate:\n  max_requests: 7\n  concurrency: [1, 4, 8]\n")
    assert a.settings.watch != b.settings.watch
    assert render(a, a.profile("ddtree", 8)).digest() == render(b, b.profile("ddtree", 8)).digest()


def test_tune_states_its_restarts_and_projected_outage():
    from opsctl.tune import RestartPlan

    p = RestartPlan(restarts=4, start_s=465.0, time_scale=500.0, drain_deadline_s=20.0)
    assert p.projected_outage_s == 1860.0
    assert p.as_dict()["projected_outage_lab_s"] == 3.72
    text = p.describe()
    assert text.startswith("4 restart(s) of SGLang") and "31 min" in text and "time scale 500" in text
    assert "unknown" in RestartPlan(3, None, None, 300.0).describe()


# --------------------------------------------------------------------------- the host side (guard, watch)


def _host_drain_fn():
    """drain_server as the guard ships it (playbooks/files/opsctl-guard, stdlib) and as the watch has it."""
    import importlib.machinery
    import importlib.util

    from opsctl.onhost import watch_agent as agent

    loader = importlib.machinery.SourceFileLoader("opsctl_guard", str(REPO / "playbooks/files/opsctl-guard"))
    spec = importlib.util.spec_from_loader("opsctl_guard", loader)
    guard = importlib.util.module_from_spec(spec)
    loader.exec_module(guard)
    return guard.drain_server, agent.drain_server


@pytest.mark.parametrize("which", [0, 1])
def test_the_guard_and_the_watch_drain_on_v1_loads_up_to_their_deadline(which, monkeypatch):
    import http.server
    import threading

    drain_server = _host_drain_fn()[which]
    counts = [2, 1, 0]

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            n = counts.pop(0) if len(counts) > 1 else counts[0]
            body = json.dumps({"loads": [{"num_running_reqs": n, "num_waiting_reqs": 0}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    calls = []

    def fake_run(argv, **kw):
        calls.append(argv)
        from types import SimpleNamespace

        return SimpleNamespace(stdout="active\n", returncode=0)

    try:
        port = srv.server_address[1]
        d = drain_server("sglang-k26.service", port, 5, 0.01, _run=fake_run)
        assert d["inflight_at_start"] == 2 and d["aborted"] == 0 and d["drained"]
        assert ["systemctl", "kill", "--kill-whom=main", "--signal=SIGTERM", "sglang-k26.service"] in calls
        assert not any("--signal=SIGKILL" in a for a in calls)
        counts[:] = [3]
        calls.clear()
        d = drain_server("sglang-k26.service", port, 0.1, 0.02, _run=fake_run)
        assert d["aborted"] == 3 and any("--signal=SIGKILL" in a for a in calls)
        assert drain_server("u", port, 0, _run=fake_run)["drained"] is False
    finally:
        srv.shutdown()


def test_the_drain_step_reports_the_records_drain_and_the_wait_after_sigterm_apart(tmp_path):
    """Issue #49: the drain step said "drained in 0.2 s" beside the gap line's "drain 0.1 s": the
    step spanned the drain and the wait for the last request after SIGTERM, which the record
    counts in the stop. It reports the record's drain, and the wait after SIGTERM as such."""
    from opsctl.flow.steps import Steps
    from opsctl.flow.switch import drain_before_switch

    host = _host(tmp_path, "drain:\n  poll_s: 0.01\n")
    events: list[dict] = []
    gap = drain_before_switch(FakeHost([2, 1, 0, 0]), host, why="deploy", from_release="a", to_release="b",
                              deadline_s=30, steps=Steps(events.append, host.name))
    (done,) = [e for e in events if e.get("step") == "drain" and e.get("status") == "ok"]
    assert done["detail"].startswith(f"drained in {gap.drain_s:.1f} s, then SIGTERM: idle "), done["detail"]
    assert done["detail"].endswith(" s later (part of the stop)"), done["detail"]
