"""The one reader of SGLang's Prometheus text (`/metrics`, `--enable-metrics`): the watch's
samples and the load generator's accept length both read it here, so a label means the same
to both.

SGLang 0.5.23 labels its series in two ways that matter for a total
(srt/observability/metrics_collector.py):

* the scheduler's gauges (num_running_reqs, num_queue_reqs, gen_throughput,
  spec_accept_length, ...) carry the total under the collector's own labels (with
  --enable-priority-scheduling: `priority=""`) and, for the queue counts, a breakdown per
  priority under `priority="<n>"`. The breakdown repeats the total: summing every series
  counts those requests twice. A gauge's total is its series without a priority value.
* the tokenizer's counters (num_requests_total, generation_tokens_total,
  spec_verify_calls_total, num_aborted_requests_total, ...) count each request under its own
  labels (its `priority`, `is_streaming`, custom labels): the series partition the requests
  and the total is their sum, whatever the labels.

A metric is a counter when its `# TYPE` line says so, or (no TYPE line) when its name ends in
`_total`, as counters are exposed; anything else is read as a gauge. Several gauge series with
no priority value (one per DP rank) are summed by `total` and averaged by `mean`.

Standard library only (Python >= 3.8): this module runs on the host.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

Series = Tuple[Dict[str, str], float]

MAX_LINES = 200_000   # a scrape larger than this is cut there (a runaway label set must not stall a reader)
BREAKDOWN_LABEL = "priority"
_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r'\\(.)')
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"'}
_TYPE = re.compile(r'^#\s*TYPE\s+([A-Za-z_:][A-Za-z0-9_:]*)\s+(\w+)')


class Metrics(dict):
    """{name: [(labels, value), ...]} of one scrape, with each metric's declared type."""

    def __init__(self) -> None:
        super().__init__()
        self.types: Dict[str, str] = {}

    def is_counter(self, name: str) -> bool:
        declared = self.types.get(name)
        if declared is None and name.endswith("_total"):
            declared = self.types.get(name[:-len("_total")])   # a TYPE line naming the family
        return declared == "counter" if declared is not None else name.endswith("_total")

    def total_series(self, name: str) -> List[float]:
        """The values that add up to the metric's total (see the module's docstring)."""
        series = self.get(name) or []
        if self.is_counter(name):
            return [v for _, v in series]
        return [v for labels, v in series if labels.get(BREAKDOWN_LABEL, "") == ""]

    def total(self, name: str) -> Optional[float]:
        """A counter's total, or the sum of a gauge's total series; None when the metric is absent."""
        if not self.get(name):
            return None
        return sum(self.total_series(name))

    def mean(self, name: str) -> Optional[float]:
        """The mean of the metric's total series (a gauge reported per rank), or None."""
        vals = self.total_series(name)
        return sum(vals) / len(vals) if vals else None


def _unescape(value: str) -> str:
    """A label value as the exposition format escapes it: \\\\, \\" and \\n (anything else kept)."""
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), "\\" + m.group(1)), value)


def parse(text: str) -> Metrics:
    """Prometheus text exposition -> Metrics (comments other than TYPE skipped, unparseable
    lines ignored)."""
    out = Metrics()
    for line in text.splitlines()[:MAX_LINES]:
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _TYPE.match(line)
            if m:
                out.types[m.group(1)] = m.group(2)
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(3) or "")}
        out.setdefault(m.group(1), []).append((labels, value))
    return out
