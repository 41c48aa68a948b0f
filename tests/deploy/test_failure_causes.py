"""Start failures name what happened: the first cause line of the unit's log, most
specific first (port in use, capture failure, OOM, the CUDA crash line, an exception)."""
from __future__ import annotations

from opsctl.journal import first_cause

PORT = [
    "INFO:     Started server process [4242]",
    "INFO:     Waiting for application startup.",
    "WARNING: some RuntimeError: ignored while warming up",
    "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use",
    "INFO:     Application shutdown complete.",
]

CRASH = [
    "[2026-11-28 10:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "sglang/srt/managers/scheduler.py", line 3480, in run_scheduler_process',
    "    scheduler.event_loop_overlap()",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "[2026-11-28 10:00:02] Received sigquit from a child process. It usually means the child failed.",
]


def test_port_in_use_is_named_before_any_other_error_line():
    kind, line = first_cause(PORT)
    assert kind == "port in use" and "[Errno 98]" in line and "address already in use" in line


def test_a_crash_is_named_by_its_cuda_error_line_not_the_traceback_header():
    kind, line = first_cause(CRASH)
    assert kind == "CUDA error" and line == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_capture_failure_outranks_the_exception_it_raises():
    lines = ["RuntimeError: boom", "Capture cuda graph failed: CUDA error: out of memory"]
    assert first_cause(lines)[0] == "CUDA-graph capture failed"


def test_a_healthy_start_has_no_cause():
    assert first_cause(["INFO:     Application startup complete.",
                        "The server is fired up and ready to roll!"]) is None
