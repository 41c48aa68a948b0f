"""Server-argument conventions for DDTREE (no new CLI flag).

  --speculative-algorithm DDTREE
  --speculative-num-draft-tokens <budget + 1>   (verify tokens per request)
  --speculative-draft-model-path <dir>          (drafter; config.json "block_size", default 8)

The budget B counts the non-root tree nodes; the target verifies B + 1 tokens
per request (root = bonus token), which is also the width the target-verify
CUDA graph is captured with.  The drafter's block size (its forward width) is
read from the drafter's config.json; L = block_size - 1 draft positions.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

DEFAULT_BLOCK_SIZE = 8
MAX_BUDGET = 1024


def budget_from_num_draft_tokens(num_draft_tokens: Optional[int]) -> int:
    if num_draft_tokens is None:
        raise ValueError(
            "DDTREE needs --speculative-num-draft-tokens = budget + 1 "
            "(e.g. 33 for budget 32)."
        )
    n = int(num_draft_tokens)
    if n < 2:
        raise ValueError(f"DDTREE needs --speculative-num-draft-tokens >= 2 (budget + 1), got {n}.")
    if n - 1 > MAX_BUDGET:
        raise ValueError(f"DDTREE budget {n - 1} exceeds {MAX_BUDGET}.")
    return n - 1


def num_draft_tokens_for_budget(budget: int) -> int:
    return int(budget) + 1


def read_block_size(draft_model_path: Optional[str], default: int = DEFAULT_BLOCK_SIZE) -> int:
    """``block_size`` from ``<draft_model_path>/config.json`` (top level or a
    ``dflash_config`` sub-dict); ``default`` when absent or unreadable."""
    if not draft_model_path:
        return default
    path = os.path.join(draft_model_path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg: Any = json.load(f)
    except (OSError, ValueError):
        return default
    for src in (cfg, cfg.get("dflash_config") or {}):
        if isinstance(src, dict) and src.get("block_size") is not None:
            bs = int(src["block_size"])
            if bs < 2:
                raise ValueError(f"drafter block_size must be >= 2, got {bs} in {path}")
            return bs
    return default
