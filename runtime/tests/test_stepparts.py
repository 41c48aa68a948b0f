"""The step-parts sampler (``sglang_ddtree.stepparts``, issue #48): the line's
exact format, medians per (bs, budget), the sampling cadence, off at EVERY=0,
no line from non-zero TP ranks, never blocking on incomplete marks -- on a fake
clock (CPU)."""

import re

import pytest

from sglang_ddtree.stepparts import (NO_STEP, PARTS, CudaClock, PerfClock, StepParts, format_line, median, parse_line)

LINE_RE = re.compile(
    r"^DDTree step parts: bs=(\d+) budget=(\d+) sampled=(\d+) of=(\d+) drafter_ms=(\d+\.\d{3}) tree_ms=(\d+\.\d{3}) "
    r"prep_ms=(\d+\.\d{3}) target_ms=(\d+\.\d{3}) commit_ms=(\d+\.\d{3}) step_ms=(\d+\.\d{3})$")


class FakeClock:
    """Marks carry the fake time (ms) at which they are taken; ``ready`` is
    False for marks taken while ``hold`` is set, until ``complete()``; every
    ``ready`` / ``elapsed_ms`` call is counted (elapsed only on ready marks)."""

    def __init__(self):
        self.t = 0.0
        self.hold = False
        self.held = []
        self.queries = 0

    class M:
        def __init__(self, t, ready):
            self.t, self.done = t, ready

    def mark(self):
        m = self.M(self.t, not self.hold)
        if self.hold:
            self.held.append(m)
        return m

    def ready(self, m):
        self.queries += 1
        return m.done

    def elapsed_ms(self, a, b):
        assert a.done and b.done, "read a mark that is not complete"
        return b.t - a.t

    def complete(self):
        for m in self.held:
            m.done = True
        self.held = []


def run_step(p, clk, bs, budget, d=(0.3, 0.04, 1.1, 18.5, 0.1), win=0.02, gap=0.01):
    """One decode step with the worker's marks (part durations ``d`` in ms:
    drafter, tree, prep (without the window), target, commit (two halves))."""
    drafter, tree, prep, target, commit = d
    s = p.begin()
    clk.t += gap
    s.mark("win0"); clk.t += win; s.mark("win1")
    clk.t += gap
    if budget > 0:
        s.mark("draft0"); clk.t += drafter; s.mark("draft1"); clk.t += tree; s.mark("tree1")
    clk.t += gap
    s.mark("prep0"); clk.t += prep; s.mark("prep1")
    clk.t += target; s.mark("target1")
    s.mark("commit0"); clk.t += commit / 2; s.mark("commit1")
    clk.t += gap
    s.mark("commit2"); clk.t += commit / 2; s.mark("commit3")
    s.done(bs, budget)
    clk.t += gap
    p.end()


def test_format_exact():
    ln = format_line(8, 16, 10, 200, dict(drafter=0.334, tree=0.041, prep=1.162, target=18.52, commit=0.111,
                                         step=21.004))
    assert ln == ("DDTree step parts: bs=8 budget=16 sampled=10 of=200 drafter_ms=0.334 tree_ms=0.041 prep_ms=1.162 "
                  "target_ms=18.520 commit_ms=0.111 step_ms=21.004")
    assert LINE_RE.match(ln)
    assert parse_line("[2026-12-05 04:00:00 TP0] " + ln) == dict(
        bs=8, budget=16, sampled=10, of=200, drafter_ms=0.334, tree_ms=0.041, prep_ms=1.162, target_ms=18.52,
        commit_ms=0.111, step_ms=21.004)
    assert parse_line("something else") is None
    assert PARTS == ("drafter", "tree", "prep", "target", "commit", "step")


def test_median():
    assert median([]) == 0.0
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_one_line_per_window_with_the_parts():
    clk, got = FakeClock(), []
    p = StepParts(every=20, sample=5, clock=clk, log=got.append)
    for _ in range(20):
        run_step(p, clk, 8, 16)
    assert len(got) == 1
    m = LINE_RE.match(got[0])
    assert m, got[0]
    f = parse_line(got[0])
    assert (f["bs"], f["budget"], f["sampled"], f["of"]) == (8, 16, 4, 20)
    assert f["drafter_ms"] == 0.3 and f["tree_ms"] == 0.04 and f["target_ms"] == 18.5
    assert f["prep_ms"] == pytest.approx(1.12, abs=1e-9)  # window + verify input / prepare
    assert f["commit_ms"] == pytest.approx(0.1, abs=1e-9)
    # start .. end: every part plus the gaps between them
    assert f["step_ms"] == pytest.approx(0.3 + 0.04 + 1.1 + 0.02 + 18.5 + 0.1 + 5 * 0.01, abs=1e-6)
    assert p.lines == got


def test_medians_per_bs_budget_and_budget0():
    clk, got = FakeClock(), []
    p = StepParts(every=12, sample=1, clock=clk, log=got.append)
    targets = [10.0, 30.0, 20.0, 99.0, 1.0, 50.0]
    for i, t in enumerate(targets):  # bs 8 / budget 16: targets 10, 20, 1 (even steps); bs 64 / budget 0: 30, 99, 50
        if i % 2 == 0:
            run_step(p, clk, 8, 16, d=(0.3, 0.04, 1.0, t, 0.1))
        else:
            run_step(p, clk, 64, 0, d=(0.3, 0.04, 1.0, t, 0.1))
    for _ in range(6):
        run_step(p, clk, 1, 32, d=(0.5, 0.05, 1.0, 2.0, 0.1))
    assert len(got) == 3
    rows = {(f["bs"], f["budget"]): f for f in map(parse_line, got)}
    assert set(rows) == {(1, 32), (8, 16), (64, 0)}
    assert [parse_line(x)["bs"] for x in got] == [1, 8, 64]  # sorted by (bs, budget)
    assert rows[(8, 16)]["target_ms"] == 10.0 and rows[(8, 16)]["sampled"] == 3
    assert rows[(64, 0)]["target_ms"] == 50.0
    assert rows[(64, 0)]["drafter_ms"] == 0.0 and rows[(64, 0)]["tree_ms"] == 0.0
    assert rows[(1, 32)]["sampled"] == 6 and rows[(1, 32)]["drafter_ms"] == 0.5
    assert all(f["of"] == 12 for f in rows.values())


def test_sampling_cadence_and_windows():
    clk, got = FakeClock(), []
    p = StepParts(every=200, sample=10, clock=clk, log=got.append)
    sampled = []
    for i in range(600):
        s = p.begin()
        sampled.append(s is not NO_STEP)
        s.mark("win0")
        s.done(4, 8)
        clk.t += 1.0
        p.end()
    assert [i for i, x in enumerate(sampled) if x] == list(range(0, 600, 10))
    assert len(got) == 3 and all(parse_line(x)["sampled"] == 20 and parse_line(x)["of"] == 200 for x in got)
    assert all(parse_line(x)["step_ms"] == 1.0 for x in got)


def test_env_defaults_and_off(monkeypatch):
    monkeypatch.delenv("SGLANG_DDTREE_STEP_PARTS_EVERY", raising=False)
    monkeypatch.delenv("SGLANG_DDTREE_STEP_PARTS_SAMPLE", raising=False)
    p = StepParts.from_env(clock=FakeClock())
    assert (p.every, p.sample, p.enabled) == (200, 10, True)
    monkeypatch.setenv("SGLANG_DDTREE_STEP_PARTS_EVERY", "0")
    clk, got = FakeClock(), []
    p = StepParts.from_env(clock=clk, log=got.append)
    assert not p.enabled
    for _ in range(500):
        run_step(p, clk, 8, 16)
    assert got == [] and p.pending == [] and clk.queries == 0
    monkeypatch.setenv("SGLANG_DDTREE_STEP_PARTS_EVERY", "50")
    monkeypatch.setenv("SGLANG_DDTREE_STEP_PARTS_SAMPLE", "5")
    p = StepParts.from_env(clock=clk, log=got.append)
    assert (p.every, p.sample) == (50, 5)


def test_no_line_from_non_zero_ranks():
    clk, got = FakeClock(), []
    p = StepParts(every=10, sample=1, clock=clk, log=got.append, enabled=False)
    for _ in range(50):
        run_step(p, clk, 8, 16)
    assert got == [] and p.lines == [] and clk.queries == 0


def test_never_blocks_on_incomplete_marks():
    """Marks not complete are never read: left pending at the next sampled step,
    read once complete, dropped (not waited for) at the window's end."""
    clk, got = FakeClock(), []
    p = StepParts(every=10, sample=2, clock=clk, log=got.append)
    clk.hold = True
    run_step(p, clk, 8, 16)  # step 0 sampled, its marks incomplete
    clk.hold = False
    run_step(p, clk, 8, 16)
    run_step(p, clk, 8, 16)  # step 2 sampled: step 0 still pending (not read, no wait)
    assert len(p.pending) == 1 + 1
    clk.complete()
    for _ in range(5):
        run_step(p, clk, 8, 16)
    clk.hold = True
    run_step(p, clk, 8, 16)  # step 8 sampled, incomplete at the window's end (step 10)
    run_step(p, clk, 8, 16)
    assert len(got) == 1
    f = parse_line(got[0])
    assert f["sampled"] == 4 and f["of"] == 10  # steps 0, 2, 4, 6; 8 dropped
    assert p.dropped == 1 and p.pending == []


def test_no_marks_while_capturing():
    class Capturing(FakeClock):
        def capturing(self):
            return True

    clk, got = Capturing(), []
    p = StepParts(every=5, sample=1, clock=clk, log=got.append)
    for _ in range(10):
        run_step(p, clk, 8, 16)
    assert got == []


def test_perf_clock_and_cuda_clock_interface():
    c = PerfClock()
    a = c.mark()
    b = c.mark()
    assert c.ready(a) and c.elapsed_ms(a, b) >= 0.0
    for name in ("mark", "ready", "elapsed_ms", "capturing"):
        assert callable(getattr(CudaClock, name))


def test_sampling_cost_per_step_host():
    """The host cost of the sampler on the perf clock: an unsampled step is a
    few method calls; the average over a window is printed (README)."""
    import time

    p = StepParts(every=200, sample=10, clock=PerfClock(), log=lambda s: None)
    names = ("win0", "win1", "draft0", "draft1", "tree1", "prep0", "prep1", "target1", "commit0", "commit1", "commit2",
             "commit3")
    n = 4000
    t0 = time.perf_counter()
    for _ in range(n):
        s = p.begin()
        for k in names:
            s.mark(k)
        s.done(8, 16)
        p.end()
    per = (time.perf_counter() - t0) / n * 1e6
    print(f"sampler host cost: {per:.2f} us per step (1 in 10 sampled)")
    assert per < 200.0  # generous (shared CI box); typical: a few us


def test_marks_released_only_once_read():
    """A clock with ``release`` (CudaClock reuses its events) gets back every
    mark of a step once that step is read, never one still pending or dropped."""
    class Pool(FakeClock):
        def __init__(self):
            super().__init__()
            self.released = []

        def release(self, m):
            assert m.done
            self.released.append(m)

    clk, got = Pool(), []
    p = StepParts(every=4, sample=2, clock=clk, log=got.append)
    run_step(p, clk, 8, 16)
    run_step(p, clk, 8, 16)
    assert clk.released == []
    clk.hold = True
    run_step(p, clk, 8, 16)  # step 2: read at step 0's harvest? no: step 0 is read here, step 2 stays pending
    n0 = len(clk.released)
    assert n0 == 14  # start, win0/1, draft0/1, tree1, prep0/1, target1, commit0..3, end
    run_step(p, clk, 8, 16)  # window end: step 2 incomplete -> dropped, not released
    assert len(clk.released) == n0 and p.dropped == 1
    assert parse_line(got[0])["sampled"] == 1
