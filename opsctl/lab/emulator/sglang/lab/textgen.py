"""Toy tokenizer and the emulated target model's greedy output.

Greedy output is a pure function of the prompt's token ids (and the position),
so it is deterministic per prompt and identical across parallelism and
speculative profiles (speculation is lossless). The `wrong_output` fault
perturbs it after a number of tokens, as a broken verify would.
"""
from __future__ import annotations

import hashlib
import random

WORDS = (
    "the of and to in is was for on that with as by at from it an be this which or are his "
    "her have not had first one their its new after but who they has two been other were all "
    "time when into more only years there during most than year may later three over so made "
    "would city where some can about up under world these such out between then both school "
    "war used team well while united second could known through him part name series state "
    "like also many game season four found film being since until because early people "
    "national american several each including another best five same both within river "
    "music north around public although area south number work high major group several life "
    "based family university several west great before long still against home called "
    "system house john government million became both end following became her point small"
).split()
VOCAB_SIZE = 163840          # Kimi K2's vocabulary size (ids above len(WORDS) are hashed words)
EOS_ID = 163585
# Where the model ends an answer (emits EOS) unless the request sets ignore_eos: a natural length
# per prompt (greedy: a hash of the prompt; sampled: drawn per request), long enough that short
# test requests never meet it. SGLang stops there with finish_reason {"type": "stop", "matched": EOS}.
NATURAL_MIN, NATURAL_SPAN = 256, 768


def _word_id(word: str) -> int:
    try:
        return WORDS.index(word)
    except ValueError:
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big")
        return len(WORDS) + h % (VOCAB_SIZE - len(WORDS) - 1000)


def encode(text: str) -> list[int]:
    return [_word_id(w) for w in text.split()] or [0]


def decode(ids: list[int]) -> str:
    # skip_special_tokens (SGLang's default): EOS is in output_ids, not in the text
    return "".join(" " + (WORDS[i] if 0 <= i < len(WORDS) else f"<{i}>") for i in ids if i != EOS_ID)


def prompt_key(input_ids: list[int]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for i in input_ids:
        h.update(i.to_bytes(4, "little", signed=False) if i >= 0 else b"\xff\xff\xff\xff")
    return h.digest()


def greedy_token(key: bytes, position: int) -> int:
    d = hashlib.blake2b(key + position.to_bytes(4, "little"), digest_size=4).digest()
    return int.from_bytes(d, "little") % len(WORDS)


class Generator:
    """Produces one request's output tokens, position by position."""

    def __init__(self, input_ids: list[int], temperature: float, wrong_after: int | None,
                 seed: int | None = None):
        self.key = prompt_key(input_ids)
        self.greedy = temperature <= 0.0
        self.rng = random.Random(seed)
        self.wrong_after = wrong_after
        self.seed = seed

    def eos_position(self) -> int:
        """The output length at which this answer ends on its own (its last token is EOS)."""
        if self.greedy:
            h = int.from_bytes(hashlib.blake2b(self.key + b"eos", digest_size=4).digest(), "little")
        else:
            h = (random.Random(self.key + str(self.seed).encode()) if self.seed is not None
                 else random.Random()).getrandbits(32)
        return NATURAL_MIN + h % NATURAL_SPAN

    def token(self, position: int) -> int:
        if not self.greedy:
            return self.rng.randrange(len(WORDS))
        tok = greedy_token(self.key, position)
        if self.wrong_after is not None and position >= self.wrong_after:
            tok = (tok + 1 + position % 7) % len(WORDS)
        return tok
