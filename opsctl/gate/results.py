"""Bench results: models, JSON-lines I/O in `sglang.bench_serving` field names,
import of what bench_serving leaves behind (its --output-file JSONL of any version, the first
JSON result format, its printed `Serving Benchmark Result` summary, pasted or cut short), and
medians over repeats. An imported result lists the fields it lacks (`BenchLevel.missing`):
they are written as null and shown as missing, never as 0.

A run file (`*.jsonl`) holds an optional `{"record": "meta", ...}` line, one
line per (concurrency level, repeat) in bench_serving's `--output-file` field
names (so upstream tooling reads them), and optionally one `{"record": "canary"}`
line with the greedy canary. The level lines are exactly what
`opsctl/onhost/loadgen.py --json` prints on the host.
"""
from __future__ import annotations

import json
import re
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
    # imported results (`opsctl bench import`): the format a result came from, its line in the
    # file, the fields it lacks (shown as missing, never as 0) and those derived from others
    source_format: str | None = None
    source_line: int | None = None
    missing: list[str] = Field(default_factory=list)
    derived: list[str] = Field(default_factory=list)

    @property
    def level(self) -> int:
        """The concurrency level: max_concurrency, else the effective concurrency; 0 when the
        result shows neither (an imported request-rate run cut before its latency lines)."""
        if self.max_concurrency is not None:
            return int(self.max_concurrency)
        if "concurrency" in self.missing:
            return 0
        return max(1, round(self.concurrency))

    def value(self, name: str) -> Any:
        """The field's value, or None when the result lacks it (an imported excerpt)."""
        return None if name in self.missing else getattr(self, name, None)

    @property
    def accept(self) -> float | None:
        """Per-level accept length: the best source available."""
        for v in (self.level_accept_length, self.request_accept_length, self.metrics_accept_length,
                  self.accept_length):
            if v is not None:
                return float(v)
        return None

    def record(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        for name in self.missing:  # a lacking field is written as null, never as the model's 0
            if name in data:
                data[name] = None
        return {"record": "level", **data}


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
    lacking = []
    for f in METRIC_FIELDS:
        vals = [lv.value(f) for lv in levels if lv.value(f) is not None]
        data[f] = _median([float(v) for v in vals]) if vals else None
        if not vals and all(f in lv.missing for lv in levels):
            lacking.append(f)
            data[f] = 0.0
    for f in COUNT_FIELDS:
        if all(f in lv.missing for lv in levels):
            lacking.append(f)
        data[f] = sum(int(lv.value(f) or 0) for lv in levels)
    data["missing"] = lacking
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


_OPTIONAL = ("accept_length", "metrics_accept_length", "request_accept_length", "level_accept_length",
             "max_concurrency", "source_format", "source_line")


def _level_from(rec: dict[str, Any]) -> BenchLevel:
    data = {k: v for k, v in rec.items() if k not in _DETAIL_FIELDS and k != "record"}
    lacking = list(data.get("missing") or [])
    for k in list(data):
        if data[k] is None and k in BenchLevel.model_fields and k not in _OPTIONAL and k != "missing":
            del data[k]  # written as null by record(): the result lacks it
            if k not in lacking:
                lacking.append(k)
    data["missing"] = lacking
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
    try:
        run = from_records(parse_jsonl_text(text, source=str(p)), source=str(p))
    except ConfigError:
        if not any(h in text for h in (SUMMARY_HEAD, '"output_token_throughput"')):
            raise
        run = BenchRun()
    if not run.levels:
        return import_results(p)  # bench_serving's JSONL, its console summary, the first JSON format
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


# ------------------------------------------------------------------------- import
SUMMARY_HEAD = "Serving Benchmark Result"
# the format names an imported result reports
FORMAT_JSONL = "bench_serving-jsonl"            # --output-file, one JSON object a line (any version's field set)
FORMAT_FIRST_JSON = "bench_serving-first-json"  # the first JSON result: output_token_throughput, median_ttft, ...
FORMAT_CONSOLE = "bench_serving-console"        # the `====== Serving Benchmark Result ======` summary
FORMAT_OPSCTL = "opsctl-jsonl"
FORMAT_TEXT = {FORMAT_JSONL: "bench_serving --output-file JSON line", FORMAT_FIRST_JSON: "bench_serving first JSON "
               "result format", FORMAT_CONSOLE: "bench_serving console summary", FORMAT_OPSCTL: "opsctl bench JSONL"}
# what a result is expected to show; a field it lacks is listed, never stored as 0
REPORTED_FIELDS: tuple[str, ...] = (
    "duration", "completed", "errors", "total_input_tokens", "total_output_tokens", "request_throughput", "input_throughput",
    "output_throughput", "total_throughput", "concurrency", "max_output_tokens_per_s",
    *[f"{s}_{m}_ms" for m in ("e2e_latency", "ttft", "tpot", "itl") for s in ("mean", "median", "std", "p90", "p95", "p99")],
)
# the first JSON format's names -> today's. Its first lines were `sglang.bench_rps`'s (July 2024:
# `{"request_rate", "ttft", "itl", "output_token_throughput"}`, `ttft`/`itl` the `Median TTFT`/
# `Median ITL` it read from bench_serving's summary, in ms); bench_serving's own `result = {...}`
# then named them `median_ttft`/`median_itl` beside `mean_e2e_latency`, `total_input`, ...
_FIRST_JSON = {"output_token_throughput": "output_throughput", "median_ttft": "median_ttft_ms",
               "median_itl": "median_itl_ms", "ttft": "median_ttft_ms", "itl": "median_itl_ms",
               "mean_e2e_latency": "mean_e2e_latency_ms",
               "median_e2e_latency": "median_e2e_latency_ms", "total_input": "total_input_tokens",
               "total_output": "total_output_tokens", "benchmark_duration": "duration"}
# console labels (lower case, units and the trailing colon dropped, `reqeuest` fixed) -> fields
_CONSOLE = {"successful requests": "completed", "benchmark duration": "duration",
            "total input tokens": "total_input_tokens", "total generated tokens": "total_output_tokens",
            "request throughput": "request_throughput", "input token throughput": "input_throughput",
            "output token throughput": "output_throughput", "total token throughput": "total_throughput",
            "total throughput": "total_throughput", "peak output token throughput": "max_output_tokens_per_s",
            "concurrency": "concurrency", "accept length": "accept_length", "failed requests": "errors",
            "max request concurrency": "max_concurrency", "maximum request concurrency": "max_concurrency",
            "traffic request rate": "request_rate", "backend": "backend"}
# the summary's banner, `============ Serving Benchmark Result ============` (also behind `# ` or `> `)
_BANNER = re.compile(r"^[#>\s]*={3,}\s*" + SUMMARY_HEAD + r"\s*={3,}")
_STAT = re.compile(r"^(mean|median|std|p\d+) (e2e latency|ttft|tpot|itl)$")
_LABEL = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 ()/.\-]*?):\s*(.*?)\s*$")
_RULE = re.compile(r"^\s*[-=]{3,}.*[-=]{3,}\s*$|^\s*[-=]{8,}\s*$")  # `-----Time per Output Token...------`


def _console_field(label: str) -> str | None:
    key = re.sub(r"\s*\([^)]*\)", "", label.lower().replace("reqeuest", "request")).strip()
    if key in _CONSOLE:
        return _CONSOLE[key]
    m = _STAT.match(key)
    if m:
        stat = "median" if m.group(1) == "p50" else m.group(1)
        name = f"{stat}_{m.group(2).replace(' ', '_')}_ms"
        return name if name in BenchLevel.model_fields else None
    return None


def _console_value(raw: str) -> Any:
    raw = raw.strip()
    if raw in ("", "not set"):
        return None
    if raw == "inf":
        return float("inf")
    try:
        return int(raw) if re.fullmatch(r"-?\d+", raw) else float(raw)
    except ValueError:
        return raw


class _Result:
    """One result found in an imported file, before it becomes a BenchLevel."""

    def __init__(self, fmt: str, line: int, data: dict[str, Any]):
        self.fmt, self.line, self.data = fmt, line, data


def _scan(text: str) -> tuple[list[_Result], tuple[int, str] | None]:
    """Every result in a file: JSON objects (one a line, or one cut over lines by a paste) and
    console summaries (one per `Serving Benchmark Result` head, up to its closing `=====` rule or
    the first line that is not a summary line). Returns the results and the first line nothing
    could use (line number, text)."""
    lines = text.splitlines()
    results: list[_Result] = []
    first_bad: tuple[int, str] | None = None
    decoder = json.JSONDecoder()
    i = 0
    while i < len(lines):
        raw = lines[i]
        stripped = raw.strip()
        if not stripped or stripped.startswith("```"):
            i += 1
            continue
        if _BANNER.match(stripped):
            data: dict[str, Any] = {}
            start = i + 1
            i += 1
            while i < len(lines):
                ln = lines[i]
                if _BANNER.match(ln.strip()) or not ln.strip():
                    break
                if set(ln.strip()) == {"="}:
                    i += 1
                    break
                if _RULE.match(ln):
                    i += 1
                    continue
                m = _LABEL.match(ln)
                if not m:
                    break
                field_name = _console_field(m.group(1))
                value = _console_value(m.group(2))
                if field_name is not None and value is not None and field_name not in data:
                    data[field_name] = value
                i += 1
            if data:
                results.append(_Result(FORMAT_CONSOLE, start, data))
            elif first_bad is None:  # a banner with no summary line under it (prose quoting it)
                first_bad = (start, stripped)
            continue
        if stripped.startswith("{"):
            offset = sum(len(x) + 1 for x in lines[:i]) + raw.index("{")
            try:
                obj, end = decoder.raw_decode(text, offset)
            except ValueError:
                obj, end = None, offset
            if isinstance(obj, dict):
                if "output_throughput" in obj or obj.get("record") == "level":
                    results.append(_Result(FORMAT_OPSCTL if obj.get("record") == "level" else FORMAT_JSONL, i + 1, obj))
                elif "output_token_throughput" in obj:
                    results.append(_Result(FORMAT_FIRST_JSON, i + 1, obj))
                elif first_bad is None and obj.get("record") not in ("meta", "canary"):
                    first_bad = (i + 1, stripped)
                i = text.count("\n", 0, end) + 1
                continue
        if first_bad is None:
            first_bad = (i + 1, stripped)
        i += 1
    return results, first_bad


def _to_level(res: _Result) -> BenchLevel:
    data = dict(res.data)
    if res.fmt == FORMAT_FIRST_JSON:
        data = {_FIRST_JSON.get(k, k): v for k, v in data.items()}
    data = {k: v for k, v in data.items() if k not in _DETAIL_FIELDS and k != "record"}
    if isinstance(data.get("errors"), list):
        data["errors"] = sum(1 for e in data["errors"] if e)
    present = {k for k, v in data.items() if v is not None and not (isinstance(v, float) and v != v)}
    lacking = [f for f in REPORTED_FIELDS if f not in present]
    derived = []
    if ("concurrency" in lacking and {"mean_e2e_latency_ms", "completed", "duration"} <= present
            and data["duration"]):
        # bench_serving's own definition: the sum of E2E latencies over the duration
        data["concurrency"] = data["mean_e2e_latency_ms"] / 1000.0 * data["completed"] / data["duration"]
        lacking.remove("concurrency")
        derived.append("concurrency")
    rec = {k: v for k, v in data.items() if k in present or k in derived}
    rec.update(missing=lacking, derived=derived, source_format=res.fmt, source_line=res.line)
    return _level_from(rec)


def import_results(path: str | Path) -> BenchRun:
    """Every bench_serving result in a file -> BenchRun: today's `--output-file` JSONL (any
    version's field set), the console summary (any version's labels, typos included; a summary
    cut short lacks the fields of its missing lines), the first JSON result format, several
    results in one file. Each level says its format (`source_format`), its line, the fields it
    lacks (`missing`) and those derived (`derived`: the effective concurrency from mean E2E x
    completed / duration, bench_serving's definition). Results at the same level become
    repeats in file order."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"bench_serving result file not found: {p}")
    raw = p.read_bytes()
    if b"\0" in raw[:65536]:
        line = raw[:raw.index(b"\0")].count(b"\n") + 1
        raise ConfigError(f"{p}:{line}: not a text file (it holds NUL bytes)",
                          "pass the file given to bench_serving's --output-file, or its printed summary")
    text = raw.decode("utf-8", "replace")
    results, first_bad = _scan(text)
    levels: list[BenchLevel] = []
    seen: dict[int, int] = {}
    for res in results:
        try:
            lv = _to_level(res)
        except Exception as exc:  # noqa: BLE001 - a malformed value: name the line
            raise ConfigError(f"{p}:{res.line}: malformed {FORMAT_TEXT[res.fmt]}: {str(exc).splitlines()[0][:200]}",
                              "fix that line, or drop it") from None
        if lv.max_concurrency is None and "concurrency" not in lv.missing:
            lv.max_concurrency = lv.level
        lv.repeat = seen.get(lv.level, 0)
        seen[lv.level] = lv.repeat + 1
        levels.append(lv)
    if not levels:
        where = f"{p}:{first_bad[0]}: " if first_bad else f"{p}: "
        what = f"first unusable line: {first_bad[1][:120]!r}; " if first_bad else "the file is empty; "
        raise ConfigError(f"{where}no bench_serving result in it ({what}neither a JSON result line with "
                          "`output_throughput`/`output_token_throughput` nor a 'Serving Benchmark Result' summary)",
                          "pass the file given to bench_serving's --output-file, or paste its printed summary "
                          "from the '==== Serving Benchmark Result ====' line on")
    first = results[0].data
    meta = {"source": str(p), "imported_from": "sglang.bench_serving", "imported_at": time.time(),
            "formats": sorted({lv.source_format for lv in levels if lv.source_format}),
            "backend": first.get("backend"), "dataset_name": first.get("dataset_name"),
            "random_input_len": first.get("random_input_len"), "random_output_len": first.get("random_output_len")}
    return BenchRun(meta=meta, levels=levels)


def import_bench_serving(path: str | Path) -> BenchRun:
    """The earlier name of `import_results`."""
    return import_results(path)
