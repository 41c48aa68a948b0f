"""The watch program and the emulator's delayed faults, run locally (no lab, no systemd):
the emulator answers /metrics with SGLang 0.5.23's names, the faults start healthy and
degrade, and the watch's own loop sees it and alerts with the numbers."""
from __future__ import annotations

import http.server
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
from lab_emu import RE_DECODE, Emu  # noqa: E402

from opsctl.onhost import prometheus  # noqa: E402
from opsctl.onhost import watch_agent as agent  # noqa: E402
from watchspecs import spec_dict  # noqa: E402

DDTREE16 = ["--tp-size", "8", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
            "--speculative-num-draft-tokens", "17", "--cuda-graph-max-bs-decode", "64", "--enable-metrics",
            "--served-model-name", "kimi-k2.6", "--decode-log-interval", "5"]


def metrics(emu: Emu) -> dict:
    st, body = emu.get("/metrics")
    assert st == 200
    return prometheus.parse(body.decode())


def accept_lens(lines: list[str]) -> list[float]:
    return [float(m.group("accept_len")) for m in map(RE_DECODE.match, lines) if m and m.group("accept_len")]


def test_metrics_use_sglang_0_5_23_names_labels_and_count_finished_requests(tmp_path):
    with Emu(tmp_path, DDTREE16) as emu:
        emu.wait_ready()
        before = metrics(emu)
        assert before.total("sglang:num_requests_total") == 0   # warm-up requests are internal
        emu.load(3, 24)
        m = metrics(emu)
        assert m.total("sglang:num_requests_total") == 3
        assert m.total("sglang:generation_tokens_total") == 72
        assert m.total("sglang:num_aborted_requests_total") == 0
        assert {lbl["is_streaming"] for lbl, _ in m["sglang:num_requests_total"]} == {"true", "false"}
        assert m["sglang:spec_accept_length"][0][0]["moe_ep_rank"] == "0"
        # the scheduler's gauges are its last decode report, zeroed when it goes idle
        assert m.total("sglang:num_running_reqs") == 0 and m.total("sglang:gen_throughput") == 0


def test_accept_decay_starts_healthy_then_falls_to_the_target(tmp_path):
    """With onset_file the decay waits for that file (a test starts it when it wants, however long
    the start took on a busy machine), then falls to the target within over_s."""
    onset = tmp_path / "decay.onset"
    faults = {"accept_decay": {"onset_file": str(onset), "over_s": 1, "accept_len": 1.5}}
    with Emu(tmp_path, DDTREE16, faults=faults) as emu:
        emu.wait_ready()
        emu.load(2, 60)
        early = accept_lens(emu.lines)
        assert early and min(early) > 5.0, early
        onset.touch()
        time.sleep(1.7)   # over_s, plus the emulator's half-second look for the file
        n = len(emu.lines)
        emu.load(2, 60)
        late = accept_lens(emu.lines[n:])
        # (the first line after the idle gap still averages rounds from before it)
        assert late and max(late[1:]) < 1.8 and late[-1] == pytest.approx(1.5, abs=0.15), late


def test_error_burst_aborts_requests_with_http_500_and_counts_them(tmp_path):
    faults = {"error_burst": {"after_s": 0, "duration_s": 600, "rate": 1.0}}
    with Emu(tmp_path, DDTREE16, faults=faults) as emu:
        emu.wait_ready()
        st, body = emu.post("/generate", {"text": "a b c", "sampling_params": {"max_new_tokens": 8}})
        assert st == 500 and "aborted" in json.loads(body)["detail"]
        m = metrics(emu)
        assert m.total("sglang:num_aborted_requests_total") == 1
        assert m.total("sglang:num_requests_total") == 0


def test_crash_loop_first_start_after_delay_then_every_restart(tmp_path):
    faults = {"crash_loop": {"after_s": 2, "every_s": 0.5}}
    with Emu(tmp_path, ["--tp-size", "8"], faults=faults) as emu:
        emu.wait_ready()
        t0 = time.monotonic()
        assert emu.wait_exit(timeout=20) == 1
        assert time.monotonic() - t0 > 0.5
        assert "CUDA error: an illegal memory access was encountered" in emu.text()
    with Emu(tmp_path, ["--tp-size", "8"], faults=faults) as again:   # the same fault file: a restart
        again.wait_ready()
        t0 = time.monotonic()
        assert again.wait_exit(timeout=20) == 1
        assert time.monotonic() - t0 < 2.0


def test_metrics_off_answers_404(tmp_path):
    with Emu(tmp_path, DDTREE16, faults={"metrics_off": {}}) as emu:
        emu.wait_ready()
        assert emu.get("/metrics")[0] == 404


# --------------------------------------------------------------------------- the watch loop against it


class _Receiver(http.server.BaseHTTPRequestHandler):
    events: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).events.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


def _host_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    rel = root / "releases" / "ddtree-b16-abc"
    rel.mkdir(parents=True)
    (rel / "manifest.json").write_text(json.dumps({"id": "ddtree-b16-abc", "created_at": "2026-12-01T00:00:00Z",
                                                   "profile": {"name": "ddtree", "kind": "ddtree", "budget": 16}}))
    os.symlink("releases/ddtree-b16-abc", root / "current")
    (root / "ledger.jsonl").write_text(json.dumps({"action": "promote", "result": "ok",
                                                   "to_release": "ddtree-b16-abc"}) + "\n")
    return root


def test_watch_loop_sees_the_decay_and_alerts_with_numbers(tmp_path):
    root = _host_root(tmp_path)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.events = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    hook_out = tmp_path / "hook.json"
    faults = {"accept_decay": {"after_s": 5, "over_s": 1, "accept_len": 1.5}}
    with Emu(tmp_path / "emu", DDTREE16, faults=faults) as emu:
        emu.wait_ready()
        cfg = {"host": "local", "service": "sglang-k26", "unit": "sglang-k26-test.service", "root": str(root),
               "port": emu.port, "state_dir": str(tmp_path / "state"), "mode": "alert", "interval_s": 1,
               "window_s": 4, "min_samples": 3, "baseline_profile": "ar-tp8", "model": "kimi-k2.6",
               "notify": {"url": f"http://127.0.0.1:{srv.server_port}/hook", "command": f"cat > {hook_out}",
                          "timeout_s": 5},
               "analysis": {"ddtree": spec_dict({"accept_len_floor": 2.0, "throughput_fraction": 0.3,
                                                 "max_error_rate": 0.05, "min_requests": 10, "max_journal_errors": 4,
                                                 "max_restarts": 1})}}
        stop = threading.Event()

        def load():
            while not stop.is_set():
                try:
                    emu.load(3, 40)
                except (AssertionError, OSError, urllib.error.URLError):
                    time.sleep(0.2)

        threading.Thread(target=load, daemon=True).start()
        w = agent.Watch(cfg)
        verdicts = []
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline and not w.state.get("tripped"):
                verdicts.append(w.tick()["verdict"])
                time.sleep(1)
        finally:
            stop.set()
    srv.shutdown()
    assert "healthy" in verdicts, verdicts                 # healthy first: the fault starts healthy
    tripped = w.state["tripped"]
    assert tripped and tripped["kind"] == "alert", verdicts
    acc = next(b for b in tripped["breaches"] if b["rule"] == "accept_length")
    assert acc["observed"] < 2.0 and acc["threshold"] == 2.0 and acc["samples"] >= 3
    ledger = [json.loads(x) for x in (root / "ledger.jsonl").read_text().splitlines()]
    assert ledger[-1]["action"] == "watch" and ledger[-1]["result"] == "alert"
    assert "accept_length: median accept length" in ledger[-1]["reason"]
    assert os.readlink(root / "current") == "releases/ddtree-b16-abc"   # alert mode never switches
    assert len(_Receiver.events) == 1 and _Receiver.events[0]["schema"] == "opsctl.watch.event/1"
    assert _Receiver.events[0]["event"] == "alert" and _Receiver.events[0]["breaches"][0]["observed"] < 2.0
    assert json.loads(hook_out.read_text())["event"] == "alert"
    # a restarted watch reads the same state back
    again = agent.Watch(cfg)
    assert again.state["tripped"]["ts"] == tripped["ts"] and again.state["ticks"] == w.state["ticks"]
