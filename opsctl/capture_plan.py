"""A CUDA-graph capture list chosen from the traffic (issue #51, first bullet). Pure: no I/O.

SGLang 0.5.23 captures one decode graph per batch size of its list (`--cuda-graph-bs-decode`
names the list; by default opsctl.onhost.capture.captured_batch_sizes) and a running batch
without its own graph replays the next larger one: its forward runs at the padded batch's
tokens (padded x verify width). Every graph costs start-up time (~6 s a graph at the site), so a
list that holds only the sizes the traffic uses starts faster, at the cost of padding.

`choose()` takes a histogram of running batch sizes (decode steps per batch size, e.g. from the
journal's `Decode batch, #running-req: N` lines, each line `--decode-log-interval` steps), the
default list, the verify width, a forward model (ms per forward against tokens per forward) and
the seconds one graph costs, and returns the smallest list (fewest graphs: least capture time)
whose padding costs at most `max_padding` of the expected decode time on that traffic:

    padding cost = (T(list) - T(exact)) / T(list)

where T(list) is the traffic's decode time with each batch padded to its next captured size and
T(exact) the same with a graph for every batch size (no padding). Batches above the largest
graph run without one (eagerly) under every list and cost the same. The sizes in `keep` (the
largest batch the traffic, the gate's levels or the profile's max_concurrency need, and the
gate's levels themselves: the gate measures there) are always captured; the solution is exact
(a dynamic programme over the sizes the traffic uses, O(n^2 k)).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

MAX_PADDING = 0.03
# the site's TP8 target forward (opsctl/lab/emulator/sglang/lab/perf.py "tp"): 9.68 ms + 0.52 ms/token
SITE_FIXED_MS = 9.68
SITE_PER_TOKEN_MS = 0.52
# one decode graph at the site: 5.9 s + 0.05 s x verify width (the lab's start-up model); a
# speculative server's drafter captures one more graph per batch size (1.0 s)
CAPTURE_PER_GRAPH_S = 5.9
CAPTURE_PER_TOKEN_S = 0.05
DRAFT_CAPTURE_PER_GRAPH_S = 1.0


@dataclass(frozen=True)
class LinearForward:
    """Forward milliseconds = fixed + per_token x tokens (the site's TP8 model by default)."""

    fixed_ms: float = SITE_FIXED_MS
    per_token_ms: float = SITE_PER_TOKEN_MS

    def __call__(self, tokens: float) -> float:
        return self.fixed_ms + self.per_token_ms * tokens

    def describe(self) -> str:
        return f"{self.fixed_ms:g} ms + {self.per_token_ms:g} ms/token" + (
            "" if (self.fixed_ms, self.per_token_ms) == (SITE_FIXED_MS, SITE_PER_TOKEN_MS) else " (the baseline's bench)")


def forward_from_model(model) -> Callable[[float], float] | None:
    """A forward function from opsctl.onhost.diagnosis.ForwardModel (its estimate), None when it
    has no points."""
    if not getattr(model, "points", None):
        return None

    def ms(tokens: float) -> float:
        v, _ = model.estimate(tokens)
        return float(v) if v is not None else model.intercept + model.slope * tokens
    return ms


def forward_from_baseline(sides) -> LinearForward | None:
    """The forward line fitted (least squares, opsctl.onhost.diagnosis.ForwardModel) to the
    baseline's decode steps: an autoregressive step at concurrency C is one forward of C tokens.
    None with fewer than two levels or no positive slope (then the site's model serves)."""
    from opsctl.onhost.diagnosis import ForwardModel

    points = [(float(s.concurrency), float(s.step_ms), "baseline") for s in sides if s.step_ms and s.step_ms > 0]
    if len({p[0] for p in points}) < 2:
        return None
    model = ForwardModel(points)
    if model.slope <= 0 or model.intercept <= 0:
        return None
    return LinearForward(round(model.intercept, 3), round(model.slope, 4))


def default_graph_seconds(width: int, speculative: bool) -> float:
    """The model's seconds per captured batch size: the target graph at `width`, plus the
    drafter's graph for a speculative server."""
    return CAPTURE_PER_GRAPH_S + CAPTURE_PER_TOKEN_S * width + (DRAFT_CAPTURE_PER_GRAPH_S if speculative else 0.0)


def graph_seconds_from_captures(captures: Iterable[tuple[str, int | None, int, float | None]], width: int,
                                speculative: bool) -> tuple[float, str]:
    """Seconds per captured batch size from a start's capture lines: (kind, num_tokens_per_req,
    graphs, elapsed seconds) per graph set (`target verify`, `target decode`, `draft decode`,
    ...; the slowest rank's). A target set at another width is scaled by the model's width term.
    (seconds, source): source is `host` when the start had a target set, else `model`."""
    target = [(w, n, s) for kind, w, n, s in captures if kind.startswith("target") and n and s]
    draft = [(n, s) for kind, _, n, s in captures if kind.startswith("draft") and n and s]
    if not target:
        return default_graph_seconds(width, speculative), "model"
    same = [(n, s) for w, n, s in target if (w or 1) == width]
    if same:
        per = sum(s for _, s in same) / sum(n for n, _ in same)
    else:
        w, n, s = max(target, key=lambda t: t[1])
        w = w or 1
        per = s / n * (CAPTURE_PER_GRAPH_S + CAPTURE_PER_TOKEN_S * width) / (CAPTURE_PER_GRAPH_S + CAPTURE_PER_TOKEN_S * w)
    if speculative:
        per += (sum(s for _, s in draft) / sum(n for n, _ in draft)) if draft else DRAFT_CAPTURE_PER_GRAPH_S
    return per, "host"


def histogram_from_running(running: Iterable[int | None], interval: int = 1) -> dict[int, float]:
    """Decode steps per running batch size: one `Decode batch` line per `interval` steps."""
    out: dict[int, float] = {}
    for n in running:
        if n and n > 0:
            out[int(n)] = out.get(int(n), 0.0) + float(interval)
    return dict(sorted(out.items()))


def pad(batch: int, capture: Sequence[int]) -> int | None:
    """The captured size `batch` replays at; None past the largest graph (no graph: eager)."""
    i = bisect.bisect_left(capture, batch)
    return capture[i] if i < len(capture) else None


def decode_ms(histogram: Mapping[int, float], capture: Sequence[int] | None, width: int,
              forward: Callable[[float], float]) -> float:
    """Expected decode time (ms) of the traffic: each step at its padded batch's tokens
    (capture None: every batch at its own size)."""
    cs = sorted(set(capture)) if capture is not None else None
    total = 0.0
    for b, w in histogram.items():
        p = (pad(b, cs) or b) if cs is not None else b
        total += w * forward(p * width)
    return total


def padding_cost(histogram: Mapping[int, float], capture: Sequence[int], width: int,
                 forward: Callable[[float], float]) -> float:
    """The padded tokens' share of the traffic's expected decode time with `capture`."""
    t = decode_ms(histogram, capture, width, forward)
    return (t - decode_ms(histogram, None, width, forward)) / t if t > 0 else 0.0


@dataclass(frozen=True)
class CapturePlan:
    chosen: list[int]
    default: list[int]
    width: int
    graph_s: float
    graph_s_source: str              # host | model
    padding_before: float
    padding_after: float
    max_padding: float
    keep: list[int]
    steps: float                     # decode steps in the histogram
    forward: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def graphs_before(self) -> int:
        return len(self.default)

    @property
    def graphs_after(self) -> int:
        return len(self.chosen)

    @property
    def capture_s_before(self) -> float:
        return self.graphs_before * self.graph_s

    @property
    def capture_s_after(self) -> float:
        return self.graphs_after * self.graph_s

    def as_dict(self) -> dict:
        return {"chosen": list(self.chosen), "default": list(self.default), "width": self.width,
                "graphs_before": self.graphs_before, "graphs_after": self.graphs_after,
                "graph_s": round(self.graph_s, 3), "graph_s_source": self.graph_s_source,
                "capture_s_before": round(self.capture_s_before, 1), "capture_s_after": round(self.capture_s_after, 1),
                "padding_before": round(self.padding_before, 5), "padding_after": round(self.padding_after, 5),
                "max_padding": self.max_padding, "keep": list(self.keep), "steps": self.steps,
                "forward": self.forward, "notes": list(self.notes)}

    def describe(self) -> list[str]:
        return describe(self.as_dict())


def _mins(x: float) -> str:
    m, sec = divmod(int(round(x)), 60)
    return f"{m} min {sec:02d} s" if m else f"{x:.1f} s"


def describe(d: Mapping) -> list[str]:
    """A plan's before -> after (CapturePlan.as_dict()), one line each (render, deploy --dry-run)."""
    return [f"capture list from the traffic ({d['steps']:g} decode steps, padding at most {d['max_padding']:.1%}):",
            f"  graphs captured: {d['graphs_before']} -> {d['graphs_after']} (bs {' '.join(map(str, d['chosen']))})",
            f"  capture at the site's scale: {_mins(d['capture_s_before'])} -> {_mins(d['capture_s_after'])} "
            f"({d['graph_s']:.2f} s a graph, {'the host' + chr(39) + 's last start' if d['graph_s_source'] == 'host' else 'the model'})",
            f"  expected padding cost: {d['padding_before']:.2%} -> {d['padding_after']:.2%} of decode time"
            + (f" (forward {d['forward']})" if d.get("forward") else "")] + \
        [f"  note: {n}" for n in d.get("notes") or ()]


class CapturePlanError(ValueError):
    pass


def choose(histogram: Mapping[int, float], default: Sequence[int], width: int, *,
           forward: Callable[[float], float] | None = None, graph_s: float | None = None,
           graph_s_source: str = "model", speculative: bool = True, max_padding: float = MAX_PADDING,
           keep: Iterable[int] = (), levels: Iterable[int] = (), max_concurrency: int | None = None) -> CapturePlan:
    """The fewest batch sizes worth a graph on this traffic (see the module's doc).

    `keep`: sizes captured whatever the traffic; `levels` (the gate's bench levels) are kept too;
    the largest of the traffic's batches, `levels` and `max_concurrency` (clamped to the default
    list's largest) is always captured."""
    if not default:
        raise CapturePlanError("the default capture list is empty (CUDA graphs off): nothing to choose")
    if not 0 <= max_padding < 1:
        raise CapturePlanError(f"max padding {max_padding} is not a share in [0, 1)")
    forward = forward or LinearForward()
    graph_s = default_graph_seconds(width, speculative) if graph_s is None else graph_s
    dflt = sorted(set(int(b) for b in default))
    top_allowed = dflt[-1]
    hist = {int(b): float(w) for b, w in histogram.items() if w > 0 and b > 0}
    levels = sorted({int(x) for x in levels if int(x) > 0})
    notes: list[str] = []
    need = max(list(hist) + levels + ([max_concurrency] if max_concurrency else []) or [0])
    top = min(max(need, 1), top_allowed)
    if need > top_allowed:
        notes.append(f"batch {need} is needed but the largest graph the profile allows is {top_allowed}")
    over = sum(w for b, w in hist.items() if b > top_allowed)
    if over:
        notes.append(f"{over:g} decode steps above batch {top_allowed} run without a graph under either list")
    if not any(b <= top_allowed for b in hist):
        # nothing to choose from: the window saw no decode (a new host, a window too short) and the
        # traffic to come is unknown: SGLang's own list stays (no padding anywhere)
        notes.append("no decode steps in the window at a batch with a graph: SGLang's own list is kept")
        return CapturePlan(chosen=list(dflt), default=dflt, width=width, graph_s=graph_s, graph_s_source=graph_s_source,
                           padding_before=0.0, padding_after=0.0, max_padding=max_padding, keep=list(dflt),
                           steps=sum(hist.values()), forward=getattr(forward, "describe", lambda: "fitted")(),
                           notes=notes)
    required = sorted({top} | {min(int(k), top_allowed) for k in list(keep) + levels if int(k) > 0})
    required = [r for r in required if r <= top] or [top]

    # candidates: every size the traffic runs at (below the top) and the required ones
    cands = sorted({b for b in hist if b <= top} | set(required))
    n = len(cands)
    t_exact = decode_ms(hist, None, width, forward)
    limit = max_padding / (1.0 - max_padding) * t_exact   # extra <= m/(1-m) T(exact)  <=>  share <= m
    req = set(required)

    # seg[i][j]: extra ms of the batches in (cands[i-1], cands[j]] padded to cands[j] (i <= j)
    ws = [hist.get(c, 0.0) for c in cands]
    base = [ws[j] * forward(cands[j] * width) for j in range(n)]

    cw, cb = [0.0], [0.0]                          # prefix sums: steps, exact ms
    for j in range(n):
        cw.append(cw[-1] + ws[j])
        cb.append(cb[-1] + base[j])
    at = [forward(c * width) for c in cands]

    def seg(i: int, j: int) -> float:
        return at[j] * (cw[j] - cw[i]) - (cb[j] - cb[i])

    INF = float("inf")
    # best[k][j]: least extra covering cands[0..j] with k graphs, cands[j] captured
    best = [[INF] * n for _ in range(n + 1)]
    for j in range(n):
        if all(c not in req for c in cands[:j]):
            best[1][j] = seg(0, j)
    back: dict[tuple[int, int], int] = {}
    for k in range(2, n + 1):
        for j in range(k - 1, n):
            for i in range(j - 1, k - 3, -1):     # previous graph at cands[i]
                if best[k - 1][i] == INF:
                    if cands[i] in req:
                        break
                    continue
                v = best[k - 1][i] + seg(i + 1, j)
                if v < best[k][j]:
                    best[k][j] = v
                    back[(k, j)] = i
                if cands[i] in req:
                    break                          # a required size cannot be skipped
    last = n - 1
    k = next((k for k in range(1, n + 1) if best[k][last] <= limit * (1 + 1e-12)), n)
    chosen: list[int] = []
    j = last
    while True:
        chosen.append(cands[j])
        if k == 1:
            break
        j = back[(k, j)]
        k -= 1
    chosen.sort()
    return CapturePlan(chosen=chosen, default=dflt, width=width, graph_s=graph_s, graph_s_source=graph_s_source,
                       padding_before=padding_cost(hist, dflt, width, forward),
                       padding_after=padding_cost(hist, chosen, width, forward),
                       max_padding=max_padding, keep=required, steps=sum(hist.values()),
                       forward=getattr(forward, "describe", lambda: "fitted")(), notes=notes)


# --------------------------------------------------------------------------- from a journal (parsed)


def histogram_from_journal(parsed, interval: int | None = None) -> dict[int, float]:
    """Decode steps per running batch from a journal.ParsedJournal's `Decode batch` lines (the
    first rank that prints them), each line `interval` steps (else the server's own
    `decode_log_interval` from its server_args line, else SGLang's default 40)."""
    decodes = list(parsed.decodes)
    ranks = sorted({d.rank for d in decodes})
    rank = "TP0" if "TP0" in ranks else (ranks[0] if ranks else "")
    if interval is None:
        sa = parsed.latest_server_args
        interval = int((sa.args.get("decode_log_interval") if sa else None) or 40)
    return histogram_from_running((d.running_reqs for d in decodes if d.rank == rank), interval)


def graph_seconds_from_journal(parsed, width: int, speculative: bool) -> tuple[float, str]:
    """Seconds per captured batch size from the last start in a journal.ParsedJournal: each
    capture phase's seconds (opsctl.startup: the slowest rank, the drafter's less the runtime's
    compile) over its graphs (the capture line's bs list); the model's default without one."""
    from opsctl import journal, startup

    try:
        st = startup.parse(parsed)
        start = journal.starts(parsed)[-1]
    except (IndexError, ValueError):
        return default_graph_seconds(width, speculative), "model"
    counts: dict[tuple[str, int | None], int] = {}
    for c in start.captures:
        if c.bs:
            counts[(c.kind, c.num_tokens_per_req)] = len(c.bs)
    rows = []
    for p in st.phases:
        if p.kind and p.seconds and (p.kind, p.width) in counts:
            rows.append((p.kind, p.width, counts[(p.kind, p.width)], p.seconds))
    return graph_seconds_from_captures(rows, width, speculative)
