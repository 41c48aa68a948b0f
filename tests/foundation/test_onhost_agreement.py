"""Issue #34: one analysis, one Prometheus parser, one capture-size list, and what the controller
and the host compute from the same inputs agrees. The host's side is the archive every deploy
ships (opsctl/onhost/ as bin/opsctl-onhost.pyz), run here in a fresh `python -I -S` with the
archive as its only import path besides the standard library: no opsctl, no site-packages."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from opsctl import schedule, watch
from opsctl.config import load_inventory
from opsctl.onhost import ARCHIVE_NAME, PACKAGE, analysis, archive, capture, loadgen, prometheus, watch_agent

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "opsctl" / "lab" / "emulator"))
from sglang.lab.main import _capture_bs  # noqa: E402  (the emulator's copy of SGLang's list: SGLang's own)

OUTSIDE = ("import sys\n"
           "outside = sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names\n"
           f"                 and m.split('.')[0] not in ({PACKAGE!r}, '__main__'))\n")


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("host") / ARCHIVE_NAME
    path.write_bytes(archive())
    return path


def on_host(pyz: Path, code: str, payload: Any = None) -> Any:
    """Run `code` (which sets `result`) where only the archive and the standard library can be
    imported, with `payload` as `data`; returns `result`. Fails if anything else was imported."""
    prog = (f"import json, sys\nsys.path.insert(0, {str(pyz)!r})\ndata = json.loads(sys.stdin.read())\n"
            f"{code}\n{OUTSIDE}print(json.dumps({{'result': result, 'outside': outside}}))\n")
    p = subprocess.run([sys.executable, "-I", "-S", "-c", prog], input=json.dumps(payload), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["outside"] == [], out["outside"]
    return out["result"]


# --------------------------------------------------------------------------- the archive


def test_the_archive_is_the_package_and_runs_on_the_standard_library_alone(pyz):
    source = sorted(p.name for p in (REPO / "opsctl" / "onhost").glob("*.py"))
    with zipfile.ZipFile(pyz) as z:
        names = sorted(z.namelist())
    assert names == sorted(["__main__.py"] + [f"{PACKAGE}/{n}" for n in source])
    mods = [n[:-3] for n in source if n not in ("__init__.py", "__main__.py")]
    loaded = on_host(pyz, f"import importlib\nfor m in {mods!r}:\n    importlib.import_module({PACKAGE!r} + '.' + m)\n"
                          "result = sorted(m for m in sys.modules if m.startswith('opsctl_onhost.'))")
    assert loaded == sorted(f"{PACKAGE}.{m}" for m in mods)
    for args, rc, needle in ((["watch", "--help"], 0, "--config"), (["loadgen", "--help"], 0, "--concurrency"),
                             (["metrics", "--help"], 0, "--root"),
                             ([], 2, "usage: opsctl-onhost.pyz {watch|loadgen|metrics}")):
        p = subprocess.run([sys.executable, "-I", "-S", str(pyz), *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == rc and needle in p.stdout + p.stderr, (args, p.stdout, p.stderr)


def test_the_archive_is_the_same_bytes_for_the_same_sources():
    """A deploy that changes nothing changes nothing on the host (and does not restart the watch)."""
    assert archive() == archive()
    with zipfile.ZipFile(__import__("io").BytesIO(archive())) as z:
        assert {i.date_time for i in z.infolist()} == {(1980, 1, 1, 0, 0, 0)}


# --------------------------------------------------------------------------- one analysis

WATCH_RULES = ("  watch:\n    enabled: true\n    window_s: 90\n    min_samples: 3\n    rules:\n"
               "      ddtree: {accept_len_floor: 3.0, throughput_fraction: 0.25}\n"
               "      ar-tp8: {max_restarts: 2}\n")


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    inv = tmp_path_factory.mktemp("inv") / "inv"
    shutil.copytree(REPO / "inventories/lab", inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text() + WATCH_RULES)
    return load_inventory(inv).hosts["lab"]


def _profiles(host):
    return [host.profile("ddtree", 16), host.profile("ddtree", budget_schedule="1:16,8:4,32:0"),
            host.profile("dflash"), host.profile("ar-tp8")]


def _journal(crashes: int = 0, cuda: int = 0) -> dict:
    return {"cuda_errors": cuda, "tracebacks": 0, "crashes": crashes, "restarts": crashes, "examples": []}


def _sample(ts, accept=4.0, tps=400.0, expected=420.0, running=4, finished=3, aborted=0, journal=None) -> dict:
    return {"ts": ts, "status": "ok", "decode": True, "busy": True, "accept_len": accept, "gen_tps": tps,
            "expected_tps": expected, "running": running, "queue": 0, "finished": finished, "aborted": aborted,
            "journal": journal or _journal()}


WINDOWS = {
    "healthy": [_sample(1000 - 5 * i) for i in range(8)],
    "accept collapse": [_sample(1000 - 5 * i, accept=1.6) for i in range(8)],
    "collapse at batches the schedule does not draft": [_sample(1000 - 5 * i, accept=1.0, running=40)
                                                        for i in range(8)],
    "slow": [_sample(1000 - 5 * i, tps=302.0) for i in range(8)],     # 0.72 x the curve
    "aborts": [_sample(1000 - 5 * i, finished=2, aborted=2) for i in range(8)],
    "crash loop": [{"ts": 1000 - 5 * i, "status": "unknown", "journal": _journal(crashes=1)} for i in range(2)],
    "idle": [{**_sample(1000 - 5 * i), "decode": False, "busy": False, "finished": 0} for i in range(8)],
}
# what each window shows, by profile (ddtree: floor 3.0 and fraction 0.25 after promotion; sched: the
# same with 1:16,8:4,32:0; dflash: the defaults; ar-tp8: no floor, 2 restarts allowed)
EXPECT = {
    "healthy": {"ddtree": {"accept_length": "ok", "throughput": "ok", "errors": "ok", "restarts": "ok"}},
    "accept collapse": {"ddtree": {"accept_length": "breach"}, "ar-tp8": {"accept_length": "n/a"}},
    "collapse at batches the schedule does not draft": {"ddtree": {"accept_length": "breach"},
                                                        "sched": {"accept_length": "insufficient"}},
    "slow": {"ddtree": {"throughput": "breach"}, "dflash": {"throughput": "ok"}},
    "aborts": {"ddtree": {"errors": "breach"}},
    "crash loop": {"ddtree": {"restarts": "breach"}, "ar-tp8": {"restarts": "ok"}},
    "idle": {"ddtree": {"accept_length": "insufficient", "throughput": "insufficient", "errors": "insufficient"}},
}


def test_the_watch_judges_a_release_by_the_spec_its_gate_judged_it_by(host, pyz):
    """The controller's analysis of each profile (what its gate decides by) and the spec the host's
    watch builds from its configuration and the release's manifest are the same, on the host."""
    cfg = watch.host_config(host)
    manifests = {p.label: {"profile": p.model_dump(mode="json")} for p in _profiles(host)}
    manifests["a profile the inventory does not name"] = {"profile": {"name": "ddtree-x", "kind": "ddtree",
                                                                      "accept_len_floor": 2.5}}
    got = on_host(pyz, "from opsctl_onhost import watch_agent\n"
                       "w = watch_agent.Watch.__new__(watch_agent.Watch)\nw.cfg = data['cfg']\n"
                       "result = {k: w.analysis_for(m).to_dict() for k, m in data['manifests'].items()}",
                  {"cfg": json.loads(json.dumps(cfg)), "manifests": manifests})
    for p in _profiles(host):
        assert got[p.label] == host.analysis(p).to_dict(), p.label
    unnamed = analysis.AnalysisSpec.from_dict(got["a profile the inventory does not name"])
    assert unnamed.accept_length.watch_floor == 2.5            # the release's own floor, none configured
    spec = host.analysis(host.profile("ddtree", 16))
    assert spec.accept_length.floor == 2.0 and spec.accept_length.watch_floor == 3.0   # opsctl.watch's own floor
    assert spec.throughput.baseline_fraction == 0.25
    assert host.analysis(host.profile("ar-tp8")).restarts.max_restarts == 2
    assert host.analysis(host.profile("ar-tp8")).throughput.min_speedup == -host.gate_policy().max_regression


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_the_controller_and_the_host_evaluate_a_window_alike(host, pyz, window):
    samples = WINDOWS[window]
    cfg = watch.host_config(host)
    profiles = dict(zip(("ddtree", "sched", "dflash", "ar-tp8"), _profiles(host)))
    manifests = {k: {"profile": p.model_dump(mode="json")} for k, p in profiles.items()}
    got = on_host(pyz, "from opsctl_onhost import analysis, watch_agent\n"
                       "w = watch_agent.Watch.__new__(watch_agent.Watch)\nw.cfg = data['cfg']\n"
                       "result = {k: analysis.evaluate_window(data['samples'], w.analysis_for(m), 1000.0)\n"
                       "          for k, m in data['manifests'].items()}",
                  {"cfg": json.loads(json.dumps(cfg)), "manifests": manifests, "samples": samples})
    for k, p in profiles.items():
        mine = analysis.evaluate_window(samples, host.analysis(p), 1000.0)   # the window is the spec's
        assert got[k] == json.loads(json.dumps(mine)), (window, k)
        status = {f["rule"]: f["status"] for f in mine}
        for rule, want in EXPECT[window].get(k, {}).items():   # the windows mean what their names say
            assert status[rule] == want, (window, k, rule, mine)


def test_the_gates_undrafted_levels_are_the_schedules_budget_0_bands():
    """The spec's undrafted batches (capture.py, the watch's too) are the levels the schedule
    serves without a tree by the controller's own band rule (schedule.py)."""
    for text in ("1:16,8:4,32:0", "1:0,8:16", "1:16,64:0", "1:32,8:16,32:8,64:0", "1:16"):
        for max_bs, max_running in ((32, None), (64, None), (160, None), (64, 20)):
            sched = schedule.parse(text)
            cap = schedule.captured_batch_sizes(max_bs, max_running)
            ranges = analysis.undrafted_of({"budget_schedule": text, "cuda_graph_max_bs": max_bs,
                                            "max_running_requests": max_running})
            assert [b for b in range(1, 400) if capture.in_ranges(b, ranges)] == \
                [b for b in range(1, 400) if sched.band_for(b, cap).budget == 0], (text, max_bs, max_running)


# --------------------------------------------------------------------------- one parser

METRICS = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="k",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 6.0
sglang:num_running_reqs{model_name="k",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="0"} 4.0
sglang:num_running_reqs{model_name="k",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="1"} 2.0
sglang:num_queue_reqs{model_name="k",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 1.0
sglang:num_queue_reqs{model_name="k",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="1"} 1.0
sglang:gen_throughput{model_name="k",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 512.5
sglang:spec_accept_length{model_name="k",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 4.2
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="k",engine_type="unified",priority="0",is_streaming="false"} 30.0
sglang:num_requests_total{model_name="k",engine_type="unified",priority="1",is_streaming="true"} 12.0
sglang:num_requests_total{model_name="k",engine_type="unified",priority="",is_streaming="false"} 3.0
sglang:num_aborted_requests_total{model_name="k",engine_type="unified",priority="1"} 2.0
sglang:generation_tokens_total{model_name="k",engine_type="unified",priority="0",is_streaming="false"} 3000.0
sglang:generation_tokens_total{model_name="k",engine_type="unified",priority="1",is_streaming="true"} 1200.0
sglang:spec_verify_calls_total{model_name="k",engine_type="unified",priority="0"} 700.0
sglang:spec_verify_calls_total{model_name="k",engine_type="unified",priority="1"} 300.0
"""
BEFORE = METRICS.replace("} 3000.0", "} 1000.0").replace("} 700.0", "} 200.0")


def _read_both(parse, watch_sample, loadgen_accept):
    after, before = parse(METRICS), parse(BEFORE)
    sample, counters = watch_sample(after, {"finished": 40.0, "aborted": 1.0, "gen_tokens": 3000.0}, 1.0)
    return {"running": sample["running"], "queue": sample["queue"], "gen_tps": sample["gen_tps"],
            "accept_len": sample["accept_len"], "finished": sample["finished"], "aborted": sample["aborted"],
            "gen_tokens": sample["gen_tokens"], "counters": counters,
            "loadgen_accept": loadgen_accept(before, after), "loadgen_gauge_accept": loadgen_accept(None, after)}


def test_one_parser_reads_sglangs_labels_one_way_for_the_watch_and_the_load_generator(pyz):
    """SGLang 0.5.23 with --enable-priority-scheduling: a gauge's total is its `priority=""` series
    and the per-priority series repeat it; a counter's requests are split over their own
    priorities and its total is the sum. The watch and the load generator read both the same way,
    on the controller and on the host."""
    assert watch_agent.prometheus is loadgen.prometheus is prometheus
    here = _read_both(prometheus.parse, watch_agent.sample_from_metrics, loadgen._metrics_accept)
    there = on_host(pyz, "from opsctl_onhost import loadgen, prometheus, watch_agent\n"
                         f"exec({json.dumps(_source_of_read_both())})\n"
                         "result = _read_both(prometheus.parse, watch_agent.sample_from_metrics,\n"
                         "                    loadgen._metrics_accept)\n"
                         "result = json.loads(json.dumps(result))",
                    {"METRICS": METRICS, "BEFORE": BEFORE})
    assert there == json.loads(json.dumps(here))
    assert here["running"] == 6.0 and here["queue"] == 1.0 and here["gen_tps"] == 512.5   # totals, not doubled
    assert here["counters"] == {"finished": 45.0, "aborted": 2.0, "gen_tokens": 4200.0}    # every request counted
    assert here["finished"] == 5.0 and here["aborted"] == 1.0 and here["gen_tokens"] == 1200.0
    assert here["loadgen_accept"] == pytest.approx(3200.0 / 800.0)   # delta of all series: tokens / verify calls
    assert here["loadgen_gauge_accept"] == 4.2 and here["accept_len"] == 4.2


def _source_of_read_both() -> str:
    import inspect

    return ("METRICS, BEFORE = data['METRICS'], data['BEFORE']\n" + inspect.getsource(_read_both))


def test_a_metric_with_no_type_line_is_a_counter_by_its_name():
    m = prometheus.parse('x_total{priority="1"} 2\nx_total{priority=""} 3\ny{priority="1"} 2\ny{priority=""} 3\n'
                         '# TYPE z counter\nz_total{priority="1"} 4\n')
    assert m.total("x_total") == 5.0 and m.total("y") == 3.0 and m.total("z_total") == 4.0
    assert m.total("absent") is None and m.mean("absent") is None


# --------------------------------------------------------------------------- one capture list


def test_the_capture_list_is_one_list_on_the_controller_and_the_host_and_the_emulators_agrees(pyz):
    assert schedule.captured_batch_sizes is capture.captured_batch_sizes
    cases = [(bs, run) for bs in (1, 7, 8, 9, 16, 31, 32, 48, 64, 100, 256, 257, 300, 512) for run in (None, 20, 64)]
    there = on_host(pyz, "from opsctl_onhost import capture\n"
                         "result = [capture.captured_batch_sizes(bs, run) for bs, run in data]", cases)
    assert there == [capture.captured_batch_sizes(bs, run) for bs, run in cases]
    # the lab's SGLang emulator keeps SGLang's own copy (it runs on the guest without opsctl)
    for max_bs in range(1, 600):
        args = SimpleNamespace(cuda_graph_bs_decode=None, cuda_graph_max_bs_decode=max_bs, max_running_requests=None,
                               disable_cuda_graph_padding=False)
        assert _capture_bs(args, True) == capture.speculative_decode_batch_sizes(max_bs), max_bs
