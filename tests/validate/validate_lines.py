"""Shared helpers for the journal/validation tests: real-format SGLang 0.5.23 lines."""
from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent / "data"
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"

# the site's two decode lines, verbatim from context.md
SITE_LINES = (
    "May 30 00:27:32 dflash-train python[113022]: [2026-05-30 00:27:32 TP0] Decode batch, #running-req: 7, "
    "#token: 3971, token usage: 0.04, accept len: 1.51, accept rate: 0.07, cuda graph: True, "
    "gen throughput (token/s): 74.65, #queue-req: 0\n"
    "May 30 00:27:38 dflash-train python[113022]: [2026-05-30 00:27:38 TP0] Decode batch, #running-req: 5, "
    "#token: 3358, token usage: 0.03, accept len: 1.65, accept rate: 0.09, cuda graph: True, "
    "gen throughput (token/s): 69.59, #queue-req: 0\n"
)


def begin(kind: str, n: int, rank: str = "TP0", t: str = "00:21:00", avail: float = 16.88, extra: str = "") -> str:
    return (f"[2026-05-30 {t} {rank}] Capture {kind} CUDA graph begin. backend=full, "
            f"num_tokens_per_req={n}, {extra}avail mem={avail:.2f} GB")


def end(kind: str, bs=(1, 2, 4, 8, 16, 24, 32), rank: str = "TP0", t: str = "00:21:40", elapsed: float = 40.5,
        usage: float = 2.87, avail: float = 14.01) -> str:
    return (f"[2026-05-30 {t} {rank}] Capture {kind} CUDA graph end. bs={list(bs)}, elapsed={elapsed:.2f} s, "
            f"mem usage={usage:.2f} GB, avail mem={avail:.2f} GB.")


def decode_line(accept_len: float | None, accept_rate: float | None, *, reqs: int = 8, graph: bool = True,
                rank: str = "TP0", t: str = "00:22:00") -> str:
    spec = (f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
            if accept_len is not None else "")
    return (f"[2026-05-30 {t} {rank}] Decode batch, #running-req: {reqs}, #token: {reqs * 500}, token usage: 0.01, "
            f"{spec}cuda graph: {graph}, gen throughput (token/s): 301.20, #queue-req: 0")


def healthy(kind: str, n: int, ranks: int = 8, bs=(1, 2, 4, 8, 16, 24, 32)) -> list[str]:
    lines = [begin(kind, n, f"TP{r}") for r in range(ranks)]
    lines += [end(kind, bs, f"TP{r}") for r in reversed(range(ranks))]  # ends in another order: interleaved
    lines.append("[2026-05-30 00:21:50] The server is fired up and ready to roll!")
    return lines


