"""Greedy losslessness canary.

Speculative decoding is lossless: at temperature 0 a speculative release must
emit exactly the baseline's tokens. A fixed set of prompts (token ids,
deterministic from a seed) is decoded greedily with the baseline and stored
with it; every speculative release must reproduce it token for token. A tree
mask, position or graph-padding bug shows up here before it shows in the
accept length.

The decoding itself lives in `loadgen.py` (it runs on the host from that one
file: `loadgen.py --canary-prompts N` for the baseline, `--canary-file F` with
the stored reference for a candidate); this module is the controller-side API.
"""
from __future__ import annotations

from typing import Sequence

from pydantic import BaseModel

from opsctl.onhost import loadgen

DEFAULT_PROMPTS = 8
DEFAULT_INPUT_LEN = 64
DEFAULT_OUTPUT_LEN = 32


class CanaryMismatch(BaseModel):
    prompt: int           # index of the first diverging prompt
    position: int         # first diverging output token position in it
    expected: int | None  # the baseline's token there (None: baseline ended)
    got: int | None       # the candidate's token there (None: candidate ended)
    reason: str = "token differs"

    def one_line(self) -> str:
        return (f"greedy output differs from the baseline at prompt {self.prompt}, token {self.position} "
                f"(expected {self.expected}, got {self.got}; {self.reason})")


def make_prompts(seed: int = 0, n: int = DEFAULT_PROMPTS, input_len: int = DEFAULT_INPUT_LEN) -> list[list[int]]:
    return loadgen.canary_prompts(seed, n, input_len)


def run(url: str, prompts: Sequence[Sequence[int]], max_new_tokens: int = DEFAULT_OUTPUT_LEN,
        timeout: float = 120.0) -> list[list[int]]:
    """Decode each prompt at temperature 0 against `url` (e.g. through a tunnel)."""
    return loadgen.run_canary(url, prompts, max_new_tokens, timeout)


def compare(baseline: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> CanaryMismatch | None:
    """None when identical, else the first diverging prompt index and token position."""
    m = loadgen.compare_canary(baseline, candidate)
    return None if m is None else CanaryMismatch(**m)

