"""Analysis specs for the watch's unit tests: built as the controller builds them
(opsctl/onhost/analysis.build_spec over the config models' own defaults), then given the
watch thresholds a test names, in the flat form `AnalysisSpec.watch_rules()` shows."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from opsctl.config import WatchRules, WatchSettings
from opsctl.gate.decide import GatePolicy
from opsctl.onhost.analysis import AnalysisSpec, build_spec

WATCH_FIELDS = set(WatchRules.model_fields)


def spec_with(rules: Mapping[str, Any], *, name: str = "ddtree", kind: str = "ddtree", window_s: int | None = None,
              min_samples: int | None = None) -> AnalysisSpec:
    """`rules`: WatchRules fields (an `accept_len_floor` of None: no floor after promotion) and
    optionally `undrafted_batches`; the window (`window_s`, `min_samples`) WatchSettings' defaults
    unless given."""
    watch = WatchRules(**{k: v for k, v in rules.items() if k in WATCH_FIELDS}).model_dump(mode="json")
    defaults = WatchSettings()
    watch.update(window_s=window_s or defaults.window_s, min_samples=min_samples or defaults.min_samples)
    spec = build_spec({"name": name, "kind": kind}, GatePolicy().model_dump(mode="json"), watch)
    ranges = rules.get("undrafted_batches")
    acc = replace(spec.accept_length, watch_floor=rules.get("accept_len_floor"),
                  undrafted=None if ranges is None else [list(r) for r in ranges])
    return replace(spec, accept_length=acc)


def spec_dict(rules: Mapping[str, Any], **kw) -> dict:
    """The same as a watch configuration carries it."""
    return spec_with(rules, **kw).to_dict()
