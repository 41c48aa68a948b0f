"""Performance model of the site (8 x RTX PRO 6000 Blackwell over PCIe, Kimi K2.6).

One decode step (one forward of the target over the whole running batch):

    step_ms(B, W) = fixed_ms[par] + per_token_ms[par] * B * W          (target forward)
                  + (draft_fixed_ms + draft_per_req_ms * B   if speculative)
                  + (cpu_tree_ms_per_req * B                 if the accept-collapse fault)

    B = running requests, W = verify width (tokens per request per forward):
        autoregressive 1; DFLASH num_draft_tokens (= block size);
        DDTREE num_draft_tokens (= budget + 1).
    par = "ep" when --ep-size > 1, else "tp".

Each request commits `accept_len` tokens per step on average (1 for
autoregressive), so output throughput at concurrency C is
C * accept_len / step_s.

Constants, seeded from context.md:
    tp: fixed 9.68 ms, 0.52 ms/token   -> AR TP8 C=1: 98 tok/s
    ep: fixed 15.13 ms, 0.25 ms/token  -> AR EP8 C=1: 65 tok/s (scales better at high C)
    drafter: 2.0 ms + 0.05 ms/request per step
    accept-collapse fault (the site's broken DDTree): accept_len 1.58 and a
        serial CPU tree build of 1.0 ms/request/step
    host-overhead fault: host work per speculative step (verify preparation), ms per step
        + ms per request (a runtime that syncs with the host, issue #48's overhead case)
        -> DDTree budget 32 TP8: ~53 tok/s at C=1, ~86 at C=128.
Accept length:
    DDTREE (healthy): 1 + 5.697 * (1 - exp(-budget / 8.397)), capped at the
        drafter's block size: 4.50 @ 8, 5.85 @ 16, 6.57 @ 32, 6.70 @ 64 (flattening)
    DFLASH: 1 + 3.2 * (1 - exp(-(W - 1) / 5)), capped at W: 3.41 @ block 8
    other speculative algorithms: 1 + 2.0 * (1 - exp(-(W - 1) / 3))
So healthy DDTree wins at low concurrency (budget 16, C=1: ~284 vs 98 tok/s)
and loses at high concurrency (C=128: ~652 vs ~1680 tok/s).
Greedy output does not depend on any of this (speculation is lossless).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

PARALLEL = {
    "tp": {"fixed_ms": 9.68, "per_token_ms": 0.52},
    "ep": {"fixed_ms": 15.13, "per_token_ms": 0.25},
}
DRAFT_FIXED_MS = 2.0
DRAFT_PER_REQ_MS = 0.05
COLLAPSE_ACCEPT_LEN = 1.58
COLLAPSE_CPU_TREE_MS_PER_REQ = 1.0
PREFILL_PER_TOKEN_MS = 0.02


# Acceptance depends on what is asked (production-speculation.md: DFlash accept length 5.3 on
# GSM8K vs 3.7 on MT-Bench; DDTree's speedup is highest on HumanEval): the model's accept
# length minus one (drafts accepted per round) is scaled by the prompt's domain.
DOMAIN_FACTOR = {"code": 1.2, "math": 1.05, "chat": 0.9, "ids": 0.45}
_CODE = ("def ", "return ", "import ", "```", "class ", "print(", "=>", "function ", "#include", "{\n")
_MATH = ("solve", "compute", "calculate", "probability", "integral", "derivative", "equation", "how many",
         "how much", "sum of", "find the", "prove", "evaluate", "simplify", "%", "^")


def domain_of(text: str | None) -> str:
    """What a prompt is, from its text (token ids without text: 'ids')."""
    if text is None:
        return "ids"
    t = text.lower()
    if any(k in text for k in _CODE):
        return "code"
    digits = sum(ch.isdigit() for ch in t)
    if any(k in t for k in _MATH) or digits >= 4:
        return "math"
    return "chat"


def ddtree_accept_len(budget: int, block_size: int = 8) -> float:
    return min(float(block_size), 1.0 + 5.697 * (1.0 - math.exp(-budget / 8.397)))


def dflash_accept_len(width: int) -> float:
    return min(float(width), 1.0 + 3.2 * (1.0 - math.exp(-(width - 1) / 5.0)))


def generic_accept_len(width: int) -> float:
    return min(float(max(width, 1)), 1.0 + 2.0 * (1.0 - math.exp(-(max(width, 1) - 1) / 3.0)))


@dataclass(frozen=True)
class Model:
    parallel: str = "tp"            # "tp" | "ep"
    algorithm: str | None = None    # None | "DFLASH" | "DDTREE" | other
    width: int = 1                  # verify width (tokens per request per forward)
    block_size: int = 8             # drafter block size (caps DDTree depth)
    accept_override: float | None = None   # accept-collapse fault
    cpu_tree_ms_per_req: float = 0.0       # accept-collapse fault
    host_ms_per_step: float = 0.0          # host-overhead fault
    host_ms_per_req: float = 0.0

    @property
    def speculative(self) -> bool:
        return self.algorithm is not None

    def accept_len(self) -> float:
        if self.accept_override is not None:
            return self.accept_override
        if not self.speculative:
            return 1.0
        if self.algorithm == "DDTREE":
            return ddtree_accept_len(self.width - 1, self.block_size)
        if self.algorithm == "DFLASH":
            return dflash_accept_len(self.width)
        return generic_accept_len(self.width)

    def accept_len_for(self, domain: str) -> float:
        """Accept length for prompts of one domain (the emulator's per-request mean)."""
        base = self.accept_len()
        if not self.speculative or self.accept_override is not None:
            return base
        return 1.0 + min((base - 1.0) * DOMAIN_FACTOR.get(domain, 1.0), float(self.width - 1))

    def throughput_for(self, concurrency: int, domain: str) -> float:
        return concurrency * self.accept_len_for(domain) / (self.step_ms(concurrency) / 1000.0)

    def step_parts(self, batch: int, width: int | None = None, drafting: bool | None = None) -> dict[str, float]:
        """One decode step's parts, in the runtime's step line's names (ms): the target's forward
        over batch x width tokens, the drafter's forward, the tree build and the host's work."""
        p = PARALLEL[self.parallel]
        drafts = self.speculative if drafting is None else drafting
        return {"drafter_ms": (DRAFT_FIXED_MS + DRAFT_PER_REQ_MS * batch) if drafts else 0.0,
                "tree_ms": self.cpu_tree_ms_per_req * batch if drafts else 0.0,
                "prep_ms": (self.host_ms_per_step + self.host_ms_per_req * batch) if drafts else 0.0,
                "target_ms": p["fixed_ms"] + p["per_token_ms"] * batch * (self.width if width is None else width),
                "commit_ms": 0.0}

    def step_ms(self, batch: int, width: int | None = None, drafting: bool | None = None) -> float:
        """One decode step; `width`/`drafting` override the server's for a DDTree budget
        schedule's band (budget 0: width 1 and no drafter forward)."""
        return sum(self.step_parts(batch, width, drafting).values())

    def prefill_ms(self, tokens: int) -> float:
        return PARALLEL[self.parallel]["fixed_ms"] + PREFILL_PER_TOKEN_MS * tokens

    def throughput(self, concurrency: int) -> float:
        """Output tokens/s at a steady concurrency (decode only)."""
        return concurrency * self.accept_len() / (self.step_ms(concurrency) / 1000.0)


def table() -> list[dict]:
    """The model's headline numbers (docs/lab.md lists them)."""
    rows = []
    cases = [("AR TP8", Model("tp")), ("AR EP8", Model("ep")),
             ("DFLASH block 8 TP8", Model("tp", "DFLASH", 8)),
             ("DDTREE budget 8 TP8", Model("tp", "DDTREE", 9)),
             ("DDTREE budget 16 TP8", Model("tp", "DDTREE", 17)),
             ("DDTREE budget 32 TP8", Model("tp", "DDTREE", 33)),
             ("DDTREE budget 32 TP8 + accept-collapse", Model("tp", "DDTREE", 33, 8, COLLAPSE_ACCEPT_LEN,
                                                              COLLAPSE_CPU_TREE_MS_PER_REQ))]
    for name, m in cases:
        rows.append({"config": name, "accept_len": round(m.accept_len(), 2),
                     **{f"C={c}": round(m.throughput(c), 1) for c in (1, 8, 32, 64, 128)}})
    return rows
