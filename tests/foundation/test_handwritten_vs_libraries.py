"""What the host-side code writes by hand because the host has only python3, held to the well-kept
libraries that do the same (issue #53; dev dependencies only, pyproject's `dev` extra):

* gate/interval.py's Student-t (t_cdf, t_quantile: the speedup interval's quantile) against
  scipy.stats.t, over the degrees of freedom the gate's Welch interval produces;
* onhost/prometheus.py's text parser against prometheus_client's own parser, on the /metrics text
  of every sample the suite and the emulator read, and (marked sglang) on the exposition of SGLang
  0.5.23's own metric set: every `sglang:` gauge, counter and histogram its metrics_collector.py
  defines, registered in prometheus_client and rendered by its generate_latest, as a server does.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from scipy import stats

from opsctl.gate import interval
from opsctl.onhost import prometheus

REPO = Path(__file__).resolve().parents[2]

# Welch degrees of freedom: 1 (two samples a side) up to the large-sample end, and fractional values
DFS = [1.0, 1.37, 2.0, 2.5, 3.0, 4.2, 5.0, 7.77, 10.0, 15.5, 24.0, 30.0, 47.3, 60.0, 100.0, 250.0, 1000.0, 1e5]


@pytest.mark.parametrize("df", DFS)
def test_t_cdf_is_scipys(df):
    for t in (-40.0, -6.0, -2.5, -1.0, -0.1, 0.0, 0.3, 1.0, 1.96, 3.5, 8.0, 60.0):
        assert interval.t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), rel=1e-9, abs=1e-13), (t, df)


@pytest.mark.parametrize("df", DFS)
def test_t_quantile_is_scipys(df):
    """The two-sided confidences the gate uses, spread over up to ten looks (look_confidence)."""
    for confidence in (0.80, 0.90, 0.95, 0.99):
        for looks in (1, 2, 3, 5, 10):
            q = 1.0 - (1.0 - interval.look_confidence(confidence, looks)) / 2.0
            want = stats.t.ppf(q, round(df, 2))
            assert interval.t_quantile(q, df) == pytest.approx(want, rel=1e-8), (q, df)


def test_an_interval_is_the_one_scipy_gives():
    """A whole speedup interval, recomputed with scipy's quantile: Welch's log-t by the docstring."""
    cand = [101.0, 97.5, 104.2, 99.1, 102.7, 98.8]
    base = [90.2, 93.1, 88.7, 91.9, 90.0]
    got = interval.speedup_interval(cand, base, confidence=0.9, looks=3)
    mc, mb = sum(cand) / len(cand), sum(base) / len(base)
    vc = sum((x - mc) ** 2 for x in cand) / (len(cand) - 1) / mc ** 2
    vb = sum((x - mb) ** 2 for x in base) / (len(base) - 1) / mb ** 2
    a, b = vc / len(cand), vb / len(base)
    df = (a + b) ** 2 / (a * a / (len(cand) - 1) + b * b / (len(base) - 1))
    q = 1.0 - (1.0 - interval.look_confidence(0.9, 3)) / 2.0
    half = stats.t.ppf(q, round(df, 2)) * math.sqrt(a + b)
    assert got.low == pytest.approx(mc / mb * math.exp(-half), rel=1e-9)
    assert got.high == pytest.approx(mc / mb * math.exp(half), rel=1e-9)


# --------------------------------------------------------------------------- Prometheus text

def reference_samples(text: str) -> set:
    """(sample name, labels, value) of every sample prometheus_client's parser reads."""
    out = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.add((s.name, tuple(sorted(s.labels.items())), s.value))
    return out


def our_samples(text: str) -> set:
    parsed = prometheus.parse(text)
    return {(name, tuple(sorted(labels.items())), value) for name, series in parsed.items() for labels, value in series}


def reference_types(text: str) -> dict:
    """The type prometheus_client gives each sample name (a counter's _total and _created samples,
    a histogram's _bucket/_sum/_count under their family)."""
    return {s.name: family.type for family in text_string_to_metric_families(text) for s in family.samples}


def assert_same_reading(text: str):
    assert our_samples(text) == reference_samples(text)
    parsed = prometheus.parse(text)
    for name, kind in reference_types(text).items():
        if name.endswith("_total") and kind == "counter":
            assert parsed.is_counter(name), name
        elif kind == "gauge":
            assert not parsed.is_counter(name), name


def suite_texts() -> dict:
    """The /metrics texts the suite's parsers are tested on, and the emulator's own exposition."""
    sys.path.insert(0, str(REPO / "tests" / "watch"))
    sys.path.insert(0, str(REPO / "tests" / "foundation"))
    import test_onhost_agreement
    import test_watch_rules
    return {"test_onhost_agreement.METRICS": test_onhost_agreement.METRICS,
            "test_onhost_agreement.BEFORE": test_onhost_agreement.BEFORE,
            "test_watch_rules.METRICS": test_watch_rules.METRICS}


@pytest.mark.parametrize("name", sorted(suite_texts()))
def test_the_parser_reads_the_suites_texts_as_prometheus_client_does(name):
    assert_same_reading(suite_texts()[name])


def test_the_parser_reads_prometheus_clients_exposition():
    """Escapes, +Inf/NaN, a histogram and a counter's _created, as prometheus_client writes them."""
    reg = CollectorRegistry()
    g = Gauge("sglang:num_running_reqs", "The number of running requests.", ["model_name", "priority"], registry=reg)
    g.labels(model_name='k"2\\6\nx', priority="").set(6)
    g.labels(model_name="k", priority="1").set(float("inf"))
    Counter("sglang:num_requests_total", "Requests.", ["model_name"], registry=reg).labels(model_name="k").inc(42)
    h = Histogram("sglang:e2e_request_latency_seconds", "Latency.", ["model_name"], buckets=[0.1, 1, 10], registry=reg)
    for v in (0.05, 0.5, 5, 50):
        h.labels(model_name="k").observe(v)
    text = generate_latest(reg).decode()
    assert_same_reading(text)
    assert prometheus.parse(text).total("sglang:num_requests_total") == 42.0


SITE = sorted((REPO / ".venv-sglang" / "lib").glob("python3*/site-packages/sglang"))
COLLECTOR = "srt/observability/metrics_collector.py"
# the collector's own labels (SchedulerMetricsCollector / TokenizerMetricsCollector `labels`), with
# --enable-priority-scheduling's priority
SCHEDULER_LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "priority"]
TOKENIZER_LABELS = ["model_name", "engine_type", "priority", "is_streaming"]


@pytest.mark.sglang
@pytest.mark.skipif(not SITE, reason="no .venv-sglang: run scripts/sglang-venv")
def test_the_parser_reads_sglangs_own_metric_set_as_prometheus_client_does():
    src = (SITE[0] / COLLECTOR).read_text()
    defs = re.findall(r'\b(Gauge|Counter|Histogram)\(\s*name="(sglang:[^"]+)"', src)
    assert len(defs) > 100, "SGLang's collector defines its metrics elsewhere now: re-read " + COLLECTOR
    reg = CollectorRegistry()
    kinds = {"Gauge": Gauge, "Counter": Counter, "Histogram": Histogram}
    for i, (kind, name) in enumerate(sorted(set(defs), key=lambda d: d[1])):
        labels = TOKENIZER_LABELS if kind != "Gauge" else SCHEDULER_LABELS
        try:
            metric = kinds[kind](name, f"SGLang's {name}", labels, registry=reg)
        except ValueError:        # a name two collectors define (or a _total twin): registered once
            continue
        for rank, prio in ((0, ""), (0, "1"), (1, "")):
            values = dict(model_name="kimi-k2.6", engine_type="unified", priority=prio)
            values.update({"tp_rank": str(rank), "pp_rank": "0", "moe_ep_rank": "0"} if kind == "Gauge"
                          else {"is_streaming": "true" if rank else "false"})
            child = metric.labels(**values)
            if kind == "Gauge":
                child.set(i + 0.25 * rank)
            elif kind == "Counter":
                child.inc(i + rank)
            else:
                child.observe(0.01 * (i + 1))
    text = generate_latest(reg).decode()
    assert "sglang:num_running_reqs{" in text and "sglang:spec_accept_length{" in text
    assert_same_reading(text)
