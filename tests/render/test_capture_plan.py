"""The capture list chosen from the traffic (opsctl/capture_plan.py, issue #51): exact against a
brute force, the padding rule, the kept sizes, and on the saved journals of real lab runs."""
from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from opsctl import journal
from opsctl.capture_plan import (LinearForward, choose, default_graph_seconds, graph_seconds_from_journal,
                                 histogram_from_journal, histogram_from_running, pad, padding_cost)
from opsctl.onhost.capture import captured_batch_sizes

REPO = Path(__file__).resolve().parents[2]
JOURNALS = sorted(list((REPO / "tests/diagnose/data").glob("*.journal.txt"))
                  + list((REPO / "tests/validate/data/lab_journals").glob("*.journal.txt")))
DEFAULT = captured_batch_sizes(32)


def brute(hist, default, width, max_padding, required):
    """The fewest graphs (then the least padding) by enumeration."""
    top = max(required)
    cands = sorted({b for b in hist if b <= top} | set(required))
    rest = [c for c in cands if c not in required]
    f = LinearForward()
    for k in range(0, len(rest) + 1):
        best = None
        for extra in itertools.combinations(rest, k):
            cap = sorted(set(required) | set(extra))
            cost = padding_cost(hist, cap, width, f)
            if cost <= max_padding + 1e-12 and (best is None or cost < best[0]):
                best = (cost, cap)
        if best:
            return best[1]
    return cands


@pytest.mark.parametrize("seed", range(25))
def test_choose_is_the_fewest_graphs_within_the_padding_limit(seed):
    rng = random.Random(seed)
    hist = {rng.randint(1, 32): rng.choice([1, 5, 40, 200]) for _ in range(rng.randint(1, 9))}
    width = rng.choice([1, 5, 9, 17, 33])
    m = rng.choice([0.0, 0.01, 0.03, 0.1])
    plan = choose(hist, DEFAULT, width, max_padding=m)
    assert plan.padding_after <= m + 1e-12
    required = {max(hist)}
    assert required <= set(plan.chosen)
    want = brute(hist, DEFAULT, width, m, required)
    assert len(plan.chosen) == len(want), (hist, width, m, plan.chosen, want)
    assert plan.padding_after == pytest.approx(padding_cost(hist, want, width, LinearForward()), abs=1e-12)


def test_padding_is_the_share_of_decode_time_at_the_padded_batch():
    # 10 steps at bs 3 padded to 4 (width 17): 10 x 0.52 x 17 ms more than 10 x (9.68 + 0.52 x 51) ms
    f = LinearForward()
    hist = {3: 10, 4: 10}
    exact = 10 * f(3 * 17) + 10 * f(4 * 17)
    padded = 20 * f(4 * 17)
    assert padding_cost(hist, [4], 17, f) == pytest.approx((padded - exact) / padded)
    assert pad(3, [1, 2, 4]) == 4 and pad(5, [1, 2, 4]) is None


def test_a_loose_limit_drops_rare_sizes_a_tight_one_keeps_them():
    hist = {1: 1000, 2: 500, 3: 4, 8: 300}
    tight = choose(hist, DEFAULT, 17, max_padding=0.0)
    assert tight.chosen == [1, 2, 3, 8] and tight.padding_after == 0
    loose = choose(hist, DEFAULT, 17, max_padding=0.03)
    assert loose.chosen == [1, 2, 8]          # the 4 steps at bs 3 ride bs 8's graph
    assert 0 < loose.padding_after <= 0.03
    assert loose.graphs_before == 20 and loose.graphs_after == 3
    assert loose.capture_s_after == pytest.approx(3 * default_graph_seconds(17, True))


def test_levels_and_max_concurrency_stay_captured():
    hist = {1: 100, 2: 100}
    plan = choose(hist, DEFAULT, 17, levels=[1, 4, 16], max_concurrency=32)
    assert {1, 4, 16, 32} <= set(plan.chosen)
    assert plan.chosen[-1] == 32
    # traffic past the profile's largest graph: capped there, said so
    plan = choose({1: 10, 40: 10}, DEFAULT, 17)
    assert plan.chosen[-1] == 32 and any("without a graph" in n for n in plan.notes)


def test_histogram_is_weighted_by_the_decode_log_interval():
    assert histogram_from_running([1, 1, 2, None, 0], 40) == {1: 80.0, 2: 40.0}


@pytest.mark.parametrize("path", JOURNALS, ids=lambda p: p.name)
def test_on_the_saved_lab_journals(path):
    parsed = journal.parse(path.read_text())
    hist = histogram_from_journal(parsed)
    running = [d.running_reqs for d in parsed.decodes if d.rank == "TP0"]
    assert sum(hist.values()) == 40 * len(running) and set(hist) == set(running)
    graph_s, source = graph_seconds_from_journal(parsed, 17, True)
    assert source == "host" and 6.0 < graph_s < 10.0
    plan = choose(hist, DEFAULT, 17, graph_s=graph_s, graph_s_source=source, levels=[1, 4, 16], max_concurrency=32)
    # these runs decode at bs 1, 2, 4 (and 8): every size the traffic uses keeps its graph (padding
    # any of them costs more than 3 %), the gate's levels and the profile's largest stay
    assert set(hist) <= set(plan.chosen)
    assert {1, 4, 16, 32} <= set(plan.chosen)
    assert plan.graphs_after <= 6 < plan.graphs_before == 20
    assert plan.padding_after <= 0.03
    assert plan.capture_s_after < plan.capture_s_before / 3


def test_every_consumer_of_the_capture_list_uses_the_chosen_one():
    from opsctl.config import ConfigError, load_inventory, resolve_profile
    from opsctl.onhost.analysis import undrafted_of
    from opsctl.render import render

    prof = resolve_profile("ddtree", budget_schedule="1:16,8:0", cuda_graph_bs=(1, 2, 6, 12, 32))
    assert prof.captured_batch_sizes == [1, 2, 6, 12, 32]
    # the schedule's bands by the chosen graphs: bs 7 replays the bs 12 graph, in the budget-0 band
    assert prof.schedule.band_for(7, prof.captured_batch_sizes).budget == 0
    # the host side reads the release's manifest (launch.json's profile): the same list, the same bands
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    import json
    doc = json.loads(render(host, host.profile("ddtree", budget_schedule="1:16,8:0",
                                               cuda_graph_bs=(1, 2, 6, 12, 32))).release_files["launch.json"])["profile"]
    assert undrafted_of(doc) == [[7, None]]
    assert undrafted_of({**doc, "cuda_graph_bs": None}) == [[8, None]]   # SGLang's list: bs 7 has its own graph
    # a band no chosen graph falls in is refused before any host I/O, as with SGLang's own list
    with pytest.raises(ConfigError):
        resolve_profile("ddtree", budget_schedule="1:16,3:8,8:0", cuda_graph_bs=(1, 2, 8, 32))
    with pytest.raises(ConfigError):
        resolve_profile("ddtree", 16, cuda_graph_bs=(4, 2))
    with pytest.raises(ConfigError):
        resolve_profile("ddtree", 16, cuda_graph_bs=(1, 64))


def test_the_flow_chooses_for_a_profile_from_a_journal_window():
    from opsctl.config import resolve_profile
    from opsctl.flow.traffic import band_starts, choose_for, journal_since

    assert journal_since("24h") == "-24h" and journal_since("2d") == "-2d"
    assert journal_since("2026-12-05 04:00") == "2026-12-05 04:00"
    parsed = journal.parse((REPO / "tests/validate/data/lab_journals/deploy-rollback-tune.journal.txt").read_text())
    plan = choose_for(resolve_profile("ddtree", 16), parsed, levels=[1, 4, 16])
    assert plan.chosen == [1, 2, 4, 16, 32] and plan.width == 17 and plan.graph_s_source == "host"
    # a schedule's bands each keep a graph (else the band never runs: the profile would be refused)
    sched = resolve_profile("ddtree", budget_schedule="1:16,3:8,12:0")
    assert band_starts(sched) == [1, 3, 12]
    plan = choose_for(sched, parsed, levels=[1])
    assert {1, 3, 12, 32} <= set(plan.chosen)
    assert resolve_profile("ddtree", budget_schedule="1:16,3:8,12:0", cuda_graph_bs=plan.chosen).captured_batch_sizes \
        == plan.chosen


def test_an_autoregressive_profile_starts_from_sglangs_non_speculative_list():
    from opsctl.config import resolve_profile
    from opsctl.flow.traffic import choose_for

    parsed = journal.parse((REPO / "tests/validate/data/lab_journals/deploy-rollback-tune.journal.txt").read_text())
    plan = choose_for(resolve_profile("ar-tp8"), parsed, levels=[1, 4, 8])
    assert plan.default == [1, 2, 4, 8, 12, 16, 24, 32]      # the lab's AR capture lines: bs=[1, 2, 4, 8, 12, 16, 24, 32]
    assert plan.width == 1 and plan.chosen == [1, 2, 4, 8, 32]
    # the journal's last start (ar-tp8): its 8 target decode graphs in 48.6 s on the slowest rank, no drafter
    assert plan.graph_s == pytest.approx(48.6 / 8) and plan.graph_s_source == "host"


def test_a_forward_fitted_to_the_baseline_bench():
    from opsctl.capture_plan import forward_from_baseline
    from opsctl.onhost.diagnosis import Side

    # the lab's ar-tp8 steps: 9.68 + 0.52 x C ms (and a little noise)
    sides = [Side(1, 10.25), Side(4, 11.74), Side(8, 13.85), Side(32, 26.3)]
    f = forward_from_baseline(sides)
    assert f is not None and f.fixed_ms == pytest.approx(9.68, abs=0.3) and f.per_token_ms == pytest.approx(0.52, abs=0.02)
    assert "baseline" in f.describe()
    assert forward_from_baseline([Side(1, 10.2)]) is None                 # one level: no line
    assert forward_from_baseline([Side(1, 12.0), Side(8, 11.0)]) is None  # no positive slope
    # a slower-per-token host pads more expensively: a tighter list at the same limit
    hist = {1: 1000, 2: 500, 3: 60, 8: 300}
    cheap = choose(hist, DEFAULT, 17, forward=LinearForward(30.0, 0.1))
    dear = choose(hist, DEFAULT, 17, forward=LinearForward(5.0, 1.0))
    assert cheap.chosen == [1, 2, 8] and dear.chosen == [1, 2, 3, 8]


def test_a_window_without_decode_steps_keeps_sglangs_list():
    plan = choose({}, DEFAULT, 17, levels=[1, 4, 8], max_concurrency=32)
    assert plan.chosen == DEFAULT and plan.graphs_after == plan.graphs_before == 20
    assert plan.padding_after == 0 and "SGLang's own list is kept" in plan.notes[-1]


class _Scripted:
    """A Connection answering journalctl with a saved `-o json` journal; no baseline on the host."""

    name = "lab"

    def __init__(self, journal_json: str):
        self.journal_json, self.commands = journal_json, []

    def run(self, command, *, check=True, timeout=None, stdin=None, on_stderr_line=None):
        from opsctl.host.connection import Result

        self.commands.append(command)
        if command.startswith("journalctl"):
            return Result(command, 0, self.journal_json + "\n#rc=0\n")
        return Result(command, 1)      # `test -s <baseline>`: none

    def close(self):
        pass


def test_the_flow_reads_the_window_and_returns_the_profile_with_its_list():
    import gzip

    from opsctl.config import load_inventory
    from opsctl.flow.traffic import capture_from_traffic

    host = load_inventory(REPO / "inventories/lab").hosts["lab"]
    text = gzip.decompress((REPO / "tests/validate/data/lab_journals/deploy-rollback-tune.journal.json.gz")
                           .read_bytes()).decode()
    conn = _Scripted(text)
    prof, plan = capture_from_traffic(conn, host, host.profile("ddtree", 16), since="2d", max_padding=0.01)
    assert any("--since -2d" in c for c in conn.commands)
    assert plan.chosen == [1, 2, 4, 8, 32] and plan.max_padding == 0.01       # the lab's levels 1, 4, 8
    assert prof.cuda_graph_bs == (1, 2, 4, 8, 32) and prof.budget == 16
    assert plan.forward == "9.68 ms + 0.52 ms/token"                          # no baseline: the site's model
    # an empty window: nothing chosen, the profile as it was
    prof, plan = capture_from_traffic(_Scripted(""), host, host.profile("ddtree", 16))
    assert prof.cuda_graph_bs is None and plan.chosen == plan.default
