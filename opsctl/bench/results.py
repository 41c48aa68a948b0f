"""Bench results: models, JSON-lines I/O in `sglang.bench_serving` field names,
import of real bench_serving result files, and medians over repeats.

A run file (`*.jsonl`) holds an optional `{"record": "meta", ...}` line, one
line per (concurrency level, repeat) in bench_serving's `--output-file` field
names (so upstream tooling reads them), and optionally one `{"record": "canary"}`
line with the greedy canary. The level lines are exactly what
`opsctl/bench/loadgen.py --json` prints on the host.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field

from opsctl.errors import ConfigError

# Numeric fields that are medians when repeats are merged (bench_serving's names).
METRIC_FIELDS: tuple[str, ...] = (
    "duration", "request_throughput", "input_throughput", "output_throughput", "total_throughput",
    *[f"{s}_{m}_ms" for m in ("e2e_latency", "ttft", "tpot", "itl")
      for s in ("mean", "median", "std", "p90", "p95", "p99")],
    "concurrency", "max_output_tokens_per_s", "accept_length", "metrics_accept_length",
    "request_accept_length", "level_accept_length",
)
# Counts that are summed when repeats are merged.
COUNT_FIELDS: tuple[str, ...] = ("completed", "total_input_tokens", "total_output_tokens", "errors")
# bench_serving --output-details lists: dropped on import (they can be megabytes).
_DETAIL_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "text_chunks",
                  "cached_tokens", "cached_tokens_details", "server_info")


class BenchLevel(BaseModel):
    """One measurement of one concurrency level (one repeat), bench_serving's fields."""

    model_config = ConfigDict(extra="allow")

    max_concurrency: int | None = None     # the configured level
    concurrency: float = 0.0               # bench_serving's effective concurrency (sum E2E / duration)
    repeat: int = 0
    duration: float = 0.0
    completed: int = 0
    errors: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    request_throughput: float = 0.0
    input_throughput: float = 0.0
    output_throughput: float = 0.0
    total_throughput: float = 0.0
    mean_e2e_latency_ms: float = 0.0
    median_e2e_latency_ms: float = 0.0
    std_e2e_latency_ms: float = 0.0
    p90_e2e_latency_ms: float = 0.0
    p95_e2e_latency_ms: float = 0.0
    p99_e2e_latency_ms: float = 0.0
    mean_ttft_ms: float = 0.0
    median_ttft_ms: float = 0.0
    std_ttft_ms: float = 0.0
    p90_ttft_ms: float = 0.0
    p95_ttft_ms: float = 0.0
    p99_ttft_ms: float = 0.0
    mean_tpot_ms: float = 0.0
    median_tpot_ms: float = 0.0
    std_tpot_ms: float = 0.0
    p90_tpot_ms: float = 0.0
    p95_tpot_ms: float = 0.0
    p99_tpot_ms: float = 0.0
    mean_itl_ms: float = 0.0
    median_itl_ms: float = 0.0
    std_itl_ms: float = 0.0
    p90_itl_ms: float = 0.0
    p95_itl_ms: float = 0.0
    p99_itl_ms: float = 0.0
    max_output_tokens_per_s: float = 0.0
    accept_length: float | None = None           # /server_info avg_spec_accept_length (cumulative)
    metrics_accept_length: float | None = None   # /metrics, over the level
    request_accept_length: float | None = None   # meta_info of this level's requests
    level_accept_length: float | None = None     # best per-level value
    repeats_merged: int = 1                      # >1 on a median level
    output_throughput_spread: float = 0.0        # (max-min)/median over merged repeats

    @property
    def level(self) -> int:
        if self.max_concurrency is not None:
            return int(self.max_concurrency)
        return max(1, round(self.concurrency))

    @property
    def accept(self) -> float | None:
        """Per-level accept length: the best source available."""
        for v in (self.level_accept_length, self.request_accept_length, self.metrics_accept_length,
                  self.accept_length):
            if v is not None:
                return float(v)
        return None

    def record(self) -> dict[str, Any]:
        return {"record": "level", **self.model_dump(mode="json")}


class CanaryRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    seed: int = 0
    max_new_tokens: int = 0
    prompts: list[list[int]] = Field(default_factory=list)
    outputs: list[list[int]] | None = None
    error: str | None = None
    mismatch: dict | None = None
    compared: bool = False

    def record(self) -> dict[str, Any]:
        return {"record": "canary", **self.model_dump(mode="json")}

    def reference(self) -> dict[str, Any]:
        """The file `loadgen.py --canary-file` takes: prompts + the outputs to reproduce."""
        return {"seed": self.seed, "max_new_tokens": self.max_new_tokens, "prompts": self.prompts,
                "outputs": self.outputs}


class BenchRun(BaseModel):
    """Every level line of one bench (all repeats) plus the canary and metadata
    (release, profile, host, url, source...)."""

    meta: dict[str, Any] = Field(default_factory=dict)
    levels: list[BenchLevel] = Field(default_factory=list)
    canary: CanaryRecord | None = None

    def concurrencies(self) -> list[int]:
        return sorted({lv.level for lv in self.levels})

    def at(self, concurrency: int) -> list[BenchLevel]:
        return [lv for lv in self.levels if lv.level == concurrency]

    @property
    def repeats(self) -> int:
        return min((len(self.at(c)) for c in self.concurrencies()), default=0)

    def median(self) -> BenchRun:
        """One level per concurrency: medians of the metrics over repeats, sums of
        the counts (so `errors` is every error of every repeat)."""
        return BenchRun(meta=dict(self.meta), levels=[median_level(self.at(c)) for c in self.concurrencies()],
                        canary=self.canary)

    def merged(self, other: BenchRun) -> BenchRun:
        """Both runs' repeats together (a re-measure adds its repeats to the first)."""
        n = self.repeats
        extra = [lv.model_copy(update={"repeat": lv.repeat + n}) for lv in other.levels]
        return BenchRun(meta=dict(self.meta), levels=[*self.levels, *extra], canary=other.canary or self.canary)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def median_level(levels: list[BenchLevel]) -> BenchLevel:
    if not levels:
        raise ValueError("no levels to merge")
    if len(levels) == 1:
        return levels[0].model_copy()
    data = levels[0].model_dump()
    for f in METRIC_FIELDS:
        vals = [getattr(lv, f) for lv in levels if getattr(lv, f, None) is not None]
        data[f] = _median([float(v) for v in vals]) if vals else None
    for f in COUNT_FIELDS:
        data[f] = sum(int(getattr(lv, f) or 0) for lv in levels)
    tps = [lv.output_throughput for lv in levels]
    med = _median(tps)
    data["output_throughput_spread"] = (max(tps) - min(tps)) / med if med > 0 else 0.0
    data["repeats_merged"] = len(levels)
    data["repeat"] = 0
    return BenchLevel(**data)


# --------------------------------------------------------------------------- I/O
class _Line(dict):
    """A JSON record that remembers its line, for errors that say file:line."""

    lineno: int = 0


def from_records(records: Iterable[dict[str, Any]], meta: dict[str, Any] | None = None, *,
                 source: str | None = None) -> BenchRun:
    """Level/canary/meta records (as printed by `loadgen.py --json`) -> BenchRun."""
    from pydantic import ValidationError

    run = BenchRun(meta=dict(meta or {}))
    for n, rec in enumerate(records, 1):
        kind = rec.get("record")
        try:
            if kind == "meta":
                run.meta = {**{k: v for k, v in rec.items() if k != "record"}, **run.meta}
            elif kind == "canary":
                run.canary = CanaryRecord(**{k: v for k, v in rec.items() if k != "record"})
            elif kind == "level" or "output_throughput" in rec:
                run.levels.append(_level_from(rec))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = f"{source or 'bench results'}:{getattr(rec, 'lineno', 0) or n}"
            raise ConfigError(f"{where}: malformed {kind or 'level'} record: {'.'.join(map(str, err['loc']))}: "
                              f"{err['msg']} (got {err.get('input')!r})"[:300],
                              "pass a file written by `opsctl bench` or bench_serving, or fix that line") from None
    return run


def _level_from(rec: dict[str, Any]) -> BenchLevel:
    data = {k: v for k, v in rec.items() if k not in _DETAIL_FIELDS and k != "record"}
    if isinstance(data.get("errors"), list):          # bench_serving --output-details: per-request errors
        data["errors"] = sum(1 for e in data["errors"] if e)
    for k in list(data):
        if isinstance(data[k], float) and data[k] != data[k]:   # NaN (bench_serving with no completions)
            data[k] = 0.0 if k in BenchLevel.model_fields and k not in (
                "accept_length", "metrics_accept_length", "request_accept_length", "level_accept_length") else None
    return BenchLevel(**data)


def parse_jsonl_text(text: str, *, source: str = "<text>") -> list[dict[str, Any]]:
    out = []
    for i, line in enumerate(text.splitlines()):
        line = line.strip()
        if not line or not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{source}:{i + 1}: not a JSON line ({e})",
                              "pass a file written by `opsctl bench`, `loadgen.py --json` or bench_serving") from e
        if isinstance(obj, dict):
            rec = _Line(obj)
            rec.lineno = i + 1
            out.append(rec)
    return out


def parse_loadgen_output(stdout: str, meta: dict[str, Any] | None = None) -> BenchRun:
    """stdout of `python3 loadgen.py ... --json` (run on the host) -> BenchRun."""
    run = from_records(parse_jsonl_text(stdout, source="loadgen output"), meta)
    if not run.levels:
        raise ConfigError("the load generator printed no level results",
                          "run loadgen.py by hand on the host with the same flags and read its stderr")
    return run


def read_jsonl(path: str | Path) -> BenchRun:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"bench results file not found: {p}", "pass a .jsonl written by `opsctl bench --out`")
    try:
        text = p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"{p}: not a bench results file ({exc.__class__.__name__})",
                          "pass a .jsonl written by `opsctl bench --out` or bench_serving") from None
    run = from_records(parse_jsonl_text(text, source=str(p)), source=str(p))
    if not run.levels:
        raise ConfigError(f"{p}: no bench level lines", "pass a file written by `opsctl bench` or bench_serving")
    run.meta.setdefault("source", str(p))
    return run


def write_jsonl(run: BenchRun, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"record": "meta", **run.meta})]
    lines += [json.dumps(lv.record()) for lv in run.levels]
    if run.canary is not None:
        lines.append(json.dumps(run.canary.record()))
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(p)
    return p


def import_bench_serving(path: str | Path) -> BenchRun:
    """A `sglang.bench_serving --output-file` file (one JSON object per appended
    run) -> BenchRun. The level is each line's `max_concurrency`; lines at the same
    level become repeats in file order. Per-request detail lists are dropped."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"bench_serving result file not found: {p}")
    recs = parse_jsonl_text(p.read_text(encoding="utf-8"), source=str(p))
    levels: list[BenchLevel] = []
    seen: dict[int, int] = {}
    for i, rec in enumerate(recs):
        if "output_throughput" not in rec:
            continue
        lv = _level_from(rec)
        if lv.max_concurrency is None and rec.get("max_concurrency") is None:
            lv.max_concurrency = lv.level
        lv.repeat = seen.get(lv.level, 0)
        seen[lv.level] = lv.repeat + 1
        levels.append(lv)
    if not levels:
        raise ConfigError(f"{p}: no bench_serving result lines (no `output_throughput`)",
                          "pass the file given to bench_serving's --output-file")
    first = recs[0]
    meta = {"source": str(p), "imported_from": "sglang.bench_serving", "imported_at": time.time(),
            "backend": first.get("backend"), "dataset_name": first.get("dataset_name"),
            "random_input_len": first.get("random_input_len"), "random_output_len": first.get("random_output_len")}
    return BenchRun(meta=meta, levels=levels)
