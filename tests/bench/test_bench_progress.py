"""Bench progress: counts end at N/N and never go backwards, from the host's loadgen lines
(gate.measure._progress_relay) to the bars (cli.bench._LevelProgress)."""
from __future__ import annotations

import io

from rich.console import Console

from opsctl.onhost.loadgen import ProgressEvent
from opsctl.cli import _output
from opsctl.cli.bench import _LevelProgress
from opsctl.gate.measure import _progress_relay


def relayed(lines: list[str]) -> list[ProgressEvent]:
    got: list[ProgressEvent] = []
    on_line = _progress_relay(got.append)
    for line in lines:
        on_line(line)
    return got


def test_a_level_relayed_from_the_host_ends_at_n_of_n():
    evs = relayed(["[loadgen] C=8 repeat 1: 0/8 requests (0 errors)",
                   "[loadgen] C=8 repeat 1: 5/8 requests (0 errors)",
                   "[loadgen] C=8 repeat 1: 8/8 requests (1 errors)",
                   "[loadgen] C=8 repeat 1: 545.9 tok/s, TTFT p50 40.0 ms, ITL p50 10.00 ms, errors 1"])
    assert [e.kind for e in evs] == ["level_start", "request_done", "request_done", "request_done", "level_end"]
    end = evs[-1]
    assert (end.concurrency, end.repeat, end.done, end.total, end.errors) == (8, 0, 8, 8, 1)
    # a level whose progress lines were not seen still ends complete (1/1)
    (start, end) = relayed(["[loadgen] C=4 repeat 2: 300.0 tok/s, TTFT p50 40.0 ms"])
    assert (start.kind, end.kind, end.done, end.total, end.repeat) == ("level_start", "level_end", 1, 1, 1)


def completed_after_each(events: list[ProgressEvent], monkeypatch) -> list[tuple[int, int]]:
    monkeypatch.setattr(_output, "err_console", Console(file=io.StringIO(), width=80))
    seen = []
    with _LevelProgress(3) as prog:
        for ev in events:
            prog(ev)
            (task,) = prog.progress.tasks
            seen.append((int(task.completed), int(task.total)))
    return seen


def test_the_bar_never_goes_backwards_and_ends_at_n_of_n(monkeypatch):
    # as a terminal showed it: 0/8 -> 5/8 -> 1/8 (an out-of-order count, then an end event of 1/1)
    evs = [ProgressEvent("level_start", 8, 0, 0, 8), ProgressEvent("request_done", 8, 0, 5, 8),
           ProgressEvent("request_done", 8, 0, 3, 8), ProgressEvent("level_end", 8, 0, 1, 1)]
    seen = completed_after_each(evs, monkeypatch)
    assert seen == [(0, 8), (5, 8), (5, 8), (8, 8)]
    done = [c for c, _ in seen]
    assert done == sorted(done)


def test_relayed_events_drive_the_bar_to_n_of_n(monkeypatch):
    evs = relayed(["[loadgen] C=8 repeat 1: 5/8 requests (0 errors)",
                   "[loadgen] C=8 repeat 1: 545.9 tok/s, TTFT p50 40.0 ms"])
    assert completed_after_each(evs, monkeypatch)[-1] == (8, 8)
