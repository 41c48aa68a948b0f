"""The watch's decisions as pure functions over plain data (no host, no lab)."""
from __future__ import annotations

import json
import shutil

import pytest

from opsctl.config import load_inventory
from opsctl.errors import ConfigError
from opsctl.gate.decide import GatePolicy
from opsctl.onhost import analysis, prometheus
from opsctl.onhost import watch_agent as agent
from opsctl.watch import host_config
from watchspecs import spec_dict, spec_with

REPO_INV = "inventories/lab"

METRICS = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="kimi-k2.6",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 4.0
sglang:num_queue_reqs{model_name="kimi-k2.6",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 1.0
sglang:gen_throughput{model_name="kimi-k2.6",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 420.5
sglang:spec_accept_length{model_name="kimi-k2.6",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 5.8
sglang:num_requests_total{model_name="kimi-k2.6",is_streaming="false"} 30.0
sglang:num_requests_total{model_name="kimi-k2.6",is_streaming="true"} 10.0
sglang:num_aborted_requests_total{model_name="kimi-k2.6"} 2.0
sglang:generation_tokens_total{model_name="kimi-k2.6",is_streaming="false"} 3000.0
"""


def decode_sample(ts, accept=5.8, tps=420.0, running=4, finished=5, aborted=0, expected=300.0):
    return {"ts": ts, "status": "ok", "decode": True, "accept_len": accept, "gen_tps": tps, "running": running,
            "queue": 0, "finished": finished, "aborted": aborted, "expected_tps": expected,
            "journal": {"cuda_errors": 0, "tracebacks": 0, "crashes": 0, "restarts": 0, "examples": []}}


def idle_sample(ts):
    return {"ts": ts, "status": "ok", "decode": False, "accept_len": 1.4, "gen_tps": 0.0, "running": 0, "queue": 0,
            "finished": 0, "aborted": 0, "journal": {"cuda_errors": 0, "tracebacks": 0, "crashes": 0, "restarts": 0,
                                                    "examples": []}}


RULES = {"accept_len_floor": 2.0, "throughput_fraction": 0.3, "max_error_rate": 0.05, "min_requests": 10,
         "max_journal_errors": 4, "max_restarts": 1}


def by_rule(findings):
    return {f["rule"]: f for f in findings}


def test_metrics_sample_reads_sglang_names_and_counter_deltas():
    parsed = prometheus.parse(METRICS)
    s, counters = agent.sample_from_metrics(parsed, {"finished": 35.0, "aborted": 1.0}, 100.0)
    assert s["status"] == "ok" and s["decode"] and s["running"] == 4 and s["gen_tps"] == 420.5
    assert s["accept_len"] == 5.8 and s["finished"] == 5.0 and s["aborted"] == 1.0   # 30 + 10 streaming - 35
    assert counters["finished"] == 40.0
    # a restarted server's counters start again from zero: the delta is the new value
    s2, _ = agent.sample_from_metrics(parsed, {"finished": 100.0, "aborted": 5.0}, 110.0)
    assert s2["finished"] == 40.0 and s2["aborted"] == 2.0


def test_metrics_without_the_gauges_are_unknown_not_idle():
    s, _ = agent.sample_from_metrics(prometheus.parse("# nothing here\n"), {}, 1.0)
    assert s["status"] == "unknown"


def test_accept_length_below_floor_breaches_only_with_min_decode_samples():
    now = 1000.0
    few = [decode_sample(now - 10 * i, accept=1.5) for i in range(3)]
    f = by_rule(analysis.evaluate_window(few, spec_with(RULES, min_samples=4, window_s=60), now))
    assert f["accept_length"]["status"] == "insufficient"
    enough = [decode_sample(now - 10 * i, accept=1.5) for i in range(5)]
    f = by_rule(analysis.evaluate_window(enough, spec_with(RULES, min_samples=4, window_s=60), now))
    assert f["accept_length"]["status"] == "breach"
    assert f["accept_length"]["observed"] == 1.5 and f["accept_length"]["threshold"] == 2.0
    assert "1.50 < floor 2.00" in f["accept_length"]["detail"]
    healthy = [decode_sample(now - 10 * i) for i in range(5)]
    assert by_rule(analysis.evaluate_window(healthy, spec_with(RULES, min_samples=4, window_s=60), now))["accept_length"]["status"] == "ok"


def test_samples_outside_the_window_do_not_count():
    now = 1000.0
    old = [decode_sample(now - 100 - i, accept=1.2) for i in range(10)]
    f = by_rule(analysis.evaluate_window(old, spec_with(RULES, min_samples=4, window_s=60), now))
    assert f["accept_length"]["status"] == "insufficient"


def test_idle_never_breaches_even_with_a_stale_low_gauge():
    now = 1000.0
    samples = [idle_sample(now - 5 * i) for i in range(20)]
    findings = analysis.evaluate_window(samples, spec_with(RULES, min_samples=4, window_s=60), now)
    assert not [f for f in findings if f["status"] == "breach"]
    assert analysis.summarise(findings, samples, spec_with(RULES, window_s=60), now) == "idle"


def test_unreadable_metrics_are_unknown_and_never_breach():
    now = 1000.0
    samples = [{"ts": now - 5 * i, "status": "unknown", "why": "GET /metrics: HTTP 404", "journal": None}
               for i in range(20)]
    findings = analysis.evaluate_window(samples, spec_with(RULES, min_samples=4, window_s=60), now)
    assert not [f for f in findings if f["status"] == "breach"]
    assert analysis.summarise(findings, samples, spec_with(RULES, window_s=60), now) == "unknown"


def test_throughput_below_the_baseline_curve_by_more_than_the_fraction():
    now = 1000.0
    slow = [decode_sample(now - 5 * i, tps=150.0, expected=300.0) for i in range(5)]
    f = by_rule(analysis.evaluate_window(slow, spec_with(RULES, min_samples=4, window_s=60), now))["throughput"]
    assert f["status"] == "breach" and f["observed"] == 0.5 and f["threshold"] == 0.7
    near = [decode_sample(now - 5 * i, tps=250.0, expected=300.0) for i in range(5)]
    assert by_rule(analysis.evaluate_window(near, spec_with(RULES, min_samples=4, window_s=60), now))["throughput"]["status"] == "ok"
    no_curve = [decode_sample(now - 5 * i, expected=None) for i in range(5)]
    f = by_rule(analysis.evaluate_window(no_curve, spec_with(RULES, min_samples=4, window_s=60), now))
    assert f["throughput"]["status"] == "unknown"


def test_baseline_curve_from_a_stored_bench_and_interpolation():
    lines = [json.dumps({"record": "meta", "release": "ar-tp8-x"})]
    for c, vals in ((1, [90.0, 94.0, 92.0]), (4, [300.0, 310.0]), (8, [500.0])):
        lines += [json.dumps({"record": "level", "max_concurrency": c, "output_throughput": v, "repeat": i})
                  for i, v in enumerate(vals)]
    lines.append(json.dumps({"record": "canary", "outputs": []}))
    curve = agent.baseline_curve("\n".join(lines))
    assert curve == [(1, 92.0), (4, 305.0), (8, 500.0)]
    assert agent.expected_at(curve, 1) == 92.0
    assert agent.expected_at(curve, 6) == pytest.approx(402.5)
    assert agent.expected_at(curve, 32) == 500.0    # above the benched levels: the last level, a lower bound
    assert agent.expected_at(curve, 0) is None


def test_abort_rate_and_journal_errors():
    now = 1000.0
    bursty = [decode_sample(now - 5 * i, finished=4, aborted=2) for i in range(5)]
    f = by_rule(analysis.evaluate_window(bursty, spec_with(RULES, min_samples=4, window_s=60), now))["errors"]
    assert f["status"] == "breach" and f["aborted"] == 10 and f["requests"] == 30
    few = [decode_sample(now - 5 * i, finished=1, aborted=1) for i in range(3)]
    assert by_rule(analysis.evaluate_window(few, spec_with(RULES, min_samples=4, window_s=60), now))["errors"]["status"] == "insufficient"
    noisy = [decode_sample(now - 5 * i) for i in range(5)]
    noisy[0]["journal"] = {"cuda_errors": 3, "tracebacks": 2, "crashes": 0, "restarts": 0, "examples": ["CUDA error"]}
    assert by_rule(analysis.evaluate_window(noisy, spec_with(RULES, min_samples=4, window_s=60), now))["errors"]["status"] == "breach"


def test_crash_loop_breaches_on_failed_exits_even_without_metrics():
    entries = [
        {"MESSAGE": "[2026-12-01 05:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):"},
        {"MESSAGE": "RuntimeError: CUDA error: an illegal memory access was encountered"},
        {"MESSAGE": "sglang-k26.service: Main process exited, code=exited, status=1/FAILURE", "_PID": "1"},
        {"MESSAGE": "sglang-k26.service: Failed with result 'exit-code'.", "_PID": "1"},
        {"MESSAGE": "sglang-k26.service: Scheduled restart job, restart counter is at 1.", "_PID": "1"},
    ]
    j = agent.classify_journal(entries)
    assert j == {**j, "cuda_errors": 1, "tracebacks": 1, "crashes": 1, "restarts": 1}
    now = 1000.0
    one = [{"ts": now - 20, "status": "unknown", "journal": j}]
    assert by_rule(analysis.evaluate_window(one, spec_with(RULES, min_samples=4, window_s=60), now))["restarts"]["status"] == "ok"
    two = one + [{"ts": now - 5, "status": "unknown", "journal": j}]
    f = by_rule(analysis.evaluate_window(two, spec_with(RULES, min_samples=4, window_s=60), now))["restarts"]
    assert f["status"] == "breach" and f["observed"] == 2
    # a clean stop (a deploy's restart) is not a crash
    clean = agent.classify_journal([{"MESSAGE": "sglang-k26.service: Deactivated successfully.", "_PID": "1"}])
    assert clean["crashes"] == 0


def test_autoregressive_profiles_have_no_accept_floor():
    # even with a floor configured: the profile's analysis has none after promotion
    spec = analysis.build_spec({"name": "ar-tp8", "kind": "autoregressive"}, GatePolicy().model_dump(),
                               {**RULES, "accept_len_floor": 2.0, "window_s": 120, "min_samples": 4})
    assert spec.accept_length.watch_floor is None and spec.watch_rules()["accept_len_floor"] is None
    assert spec.window == analysis.WindowRule(window_s=120, min_samples=4)   # the rule's window is the spec's
    f = by_rule(analysis.evaluate_window([decode_sample(1000.0 - i, accept=None) for i in range(5)], spec, 1000.0))
    assert f["accept_length"]["status"] == "n/a"


def test_ledger_deploy_in_progress_and_rearming():
    recs = [{"action": "promote", "result": "ok", "to_release": "ddtree-b16-a"},
            {"action": "rollback", "result": "ok", "to_release": "ar-tp8-b", "who": "opsctl-watch@gpuhost"}]
    assert agent.ledger_view(recs) == {"deploying": False}
    assert agent.rearmed_after(recs, 2) is None
    recs.append({"action": "deploy", "result": "started", "to_release": "ddtree-b16-a"})
    assert agent.ledger_view(recs)["deploying"] is True
    assert agent.ledger_view([{"action": "verdict", "result": "ok"}], deploying=True)["deploying"] is True
    recs.append({"action": "promote", "result": "ok", "to_release": "ddtree-b16-a"})
    assert agent.ledger_view(recs)["deploying"] is False
    assert agent.rearmed_after(recs, 2)["action"] == "promote"
    assert agent.rearmed_after([{"action": "deploy", "result": "unchanged"}], 0) is not None


def test_baseline_release_prefers_one_that_served():
    manifests = {"ar-tp8-old": {"profile": {"name": "ar-tp8"}, "created_at": "2026-11-01T00:00:00Z"},
                 "ar-tp8-new": {"profile": {"name": "ar-tp8"}, "created_at": "2026-11-02T00:00:00Z"},
                 "ddtree-b16-a": {"profile": {"name": "ddtree"}, "created_at": "2026-11-03T00:00:00Z"}}
    served = [{"action": "promote", "result": "ok", "to_release": "ar-tp8-old"}]
    assert agent.baseline_release(manifests, served, "ar-tp8") == "ar-tp8-old"
    assert agent.baseline_release(manifests, [], "ar-tp8") == "ar-tp8-new"
    assert agent.baseline_release(manifests, [], "ar-ep8") is None


def test_event_schema():
    ev = agent.event("rollback", {"host": "lab", "service": "sglang-k26", "mode": "rollback"},
                     release={"from": "a", "to": "b"}, breaches=[{"rule": "accept_length", "observed": 1.5}])
    assert ev["schema"] == "opsctl.watch.event/1" and ev["event"] == "rollback" and ev["host"] == "lab"
    assert ev["ts"].endswith("Z") and ev["release"] == {"from": "a", "to": "b"}


# --------------------------------------------------------------------------- configuration


def _inv(tmp_path, watch_yaml: str):
    inv = tmp_path / "inv"
    shutil.copytree(REPO_INV, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text() + watch_yaml)
    return inv


def test_watch_settings_from_the_inventory(tmp_path):
    inv = _inv(tmp_path, "  restart_sec: 20\n  watch:\n    enabled: true\n    interval_s: 5\n    window_s: 30\n"
                         "    min_samples: 3\n"
                         "    notify: {url: 'http://10.203.9.1:8099/hook'}\n"
                         "    rules:\n      ddtree: {accept_len_floor: 3.0}\n")
    host = load_inventory(inv).hosts["lab"]
    cfg = host_config(host)
    assert cfg["interval_s"] == 5 and cfg["window_s"] == 30 and cfg["notify"]["url"] == "http://10.203.9.1:8099/hook"
    watch_floor = {name: analysis.AnalysisSpec.from_dict(d).accept_length.watch_floor
                   for name, d in cfg["analysis"].items()}
    assert watch_floor["ddtree"] == 3.0
    assert watch_floor["dflash"] == 2.0        # the gate's floor for the kind
    assert watch_floor["ar-tp8"] is None       # autoregressive: no floor
    # the gate's floor for ddtree stays its own: the watch's rule sets the watch's only
    assert analysis.AnalysisSpec.from_dict(cfg["analysis"]["ddtree"]).accept_length.floor == 2.0


@pytest.mark.parametrize("yaml_text,needle", [
    ("  watch:\n    interval_s: 30\n    window_s: 60\n    min_samples: 4\n", "cannot hold min_samples 4"),
    ("  watch:\n    mode: panic\n", "watch.mode"),
    ("  watch:\n    notify: {url: 'ftp://x/y'}\n", "not an http:// or https:// URL"),
    ("  watch:\n    rules:\n      nope: {max_restarts: 1}\n", "unknown profile(s) nope"),
    ("  watch:\n    rules:\n      ddtree: {throughput_fraction: 2}\n", "rules.ddtree"),
    ("  watch:\n    bogus: 1\n", "watch.bogus"),
])
def test_bad_watch_settings_fail_at_load_time(tmp_path, yaml_text, needle):
    inv = _inv(tmp_path, yaml_text)
    with pytest.raises(ConfigError) as exc:
        load_inventory(inv)
    assert needle in exc.value.one_line() and "fix:" in exc.value.one_line()


def test_ledger_is_read_incrementally_and_again_when_rewritten(tmp_path):
    led = tmp_path / "ledger.jsonl"
    led.write_text(json.dumps({"action": "promote", "result": "ok"}) + "\n" + '{"action": "depl')  # a torn last line
    recs, pos, reread = agent.read_ledger(str(tmp_path), 0)
    assert [r["action"] for r in recs] == ["promote"] and not reread
    with led.open("a") as f:
        f.write('oy", "result": "started"}\n')
    recs, pos2, _ = agent.read_ledger(str(tmp_path), pos)
    assert [(r["action"], r["result"]) for r in recs] == [("deploy", "started")] and pos2 > pos
    assert agent.read_ledger(str(tmp_path), pos2)[0] == []
    led.write_text(json.dumps({"action": "rollback", "result": "ok"}) + "\n")   # reset (shorter): read from 0
    recs, _, reread = agent.read_ledger(str(tmp_path), pos2)
    assert reread and [r["action"] for r in recs] == ["rollback"]


def undrafted(schedule: str, max_bs: int) -> list:
    return analysis.undrafted_of({"budget_schedule": schedule, "cuda_graph_max_bs": max_bs})


def test_a_budget_schedules_undrafted_batches_do_not_count_against_the_accept_floor():
    assert undrafted("1:16,8:4,32:0", 32) == [[31, None]]   # 31 replays at the graph for 32
    assert undrafted("1:0,8:16", 32) == [[1, 7]]
    assert undrafted("1:16,64:0", 32) == [[64, None]]       # 33-63 run eagerly in the 1:16 band
    rules = {**RULES, "undrafted_batches": undrafted("1:16,8:4,32:0", 32)}
    busy = [decode_sample(100 + i, accept=1.0, running=32) for i in range(6)]
    low = [decode_sample(200 + i, accept=4.8, running=2) for i in range(6)]
    f = by_rule(analysis.evaluate_window(busy + low, spec_with(rules, min_samples=3, window_s=600), 300))
    assert f["accept_length"]["status"] == "ok" and f["accept_length"]["samples"] == 6
    # without the schedule: the busy samples drag it
    f = by_rule(analysis.evaluate_window(busy + low, spec_with(RULES, min_samples=3, window_s=600), 300))
    assert f["accept_length"]["observed"] < 4.8
    collapsed = [decode_sample(200 + i, accept=1.3, running=2) for i in range(6)]
    f = by_rule(analysis.evaluate_window(busy + collapsed, spec_with(rules, min_samples=3, window_s=600), 300))
    assert f["accept_length"]["status"] == "breach"


def test_rules_for_a_schedule_release_come_from_its_manifest(tmp_path):
    a = agent.Watch.__new__(agent.Watch)
    a.cfg = {"analysis": {}, "default_analysis": spec_dict(RULES)}
    rules = a.analysis_for({"profile": {"name": "ddtree", "kind": "ddtree", "budget_schedule": "1:16,8:4,32:0",
                                        "cuda_graph_max_bs": 32}}).watch_rules()
    assert rules["undrafted_batches"] == [[31, None]]
    drafts_everywhere = a.analysis_for({"profile": {"name": "ddtree", "kind": "ddtree",
                                                    "budget_schedule": "1:16,8:4", "cuda_graph_max_bs": 32}})
    assert drafts_everywhere.watch_rules()["undrafted_batches"] == []
    plain = a.analysis_for({"profile": {"name": "ddtree", "kind": "ddtree", "budget": 16}}).watch_rules()
    assert "undrafted_batches" not in plain
    # the profile's own spec (the one its gate judged by) comes before the defaults
    a.cfg["analysis"]["ddtree"] = spec_dict({**RULES, "accept_len_floor": 3.5})
    assert a.analysis_for({"profile": {"name": "ddtree", "kind": "ddtree", "budget": 16}}).watch_rules()[
        "accept_len_floor"] == 3.5
    # no analysis at all (a configuration an older opsctl wrote): said, not judged by guesses
    a.cfg = {"rules": {}, "default_rules": dict(RULES)}
    with pytest.raises(ValueError, match="redeploy"):
        a.analysis_for({"profile": {"name": "ddtree", "kind": "ddtree"}})


def test_throughput_words_name_the_judged_ratio_beside_medians_that_need_not_divide_to_it():
    # as seen on the lab: the median of per-sample ratios below 0.7 while median tok/s / median
    # baseline tok/s is above it; the words must say which number was judged
    now = 1000.0
    pairs = [(135.0, 150.0), (195.0, 300.0), (150.0, 300.0), (150.0, 150.0), (50.0, 100.0)]
    dec = [decode_sample(now - 5 * i, tps=t, expected=e) for i, (t, e) in enumerate(pairs)]
    f = by_rule(analysis.evaluate_window(dec, spec_with(RULES, min_samples=4, window_s=60), now))["throughput"]
    assert f["status"] == "breach" and f["observed"] < 0.7 < f["gen_tps"] / f["baseline_tps"]
    assert f["detail"].startswith(f"median per-sample ratio {f['observed']:.2f} x the baseline (below the 0.70 limit")
    assert f"median {f['gen_tps']:.1f} tok/s" in f["detail"] and f"baseline's {f['baseline_tps']:.1f}" in f["detail"]
