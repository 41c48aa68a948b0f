"""Where a host keeps its stored baseline bench: one function names the files, for the gate
(opsctl/flow/bench.py writes them, opsctl/gate/ judges against them) and the watch (opsctl/watch, which
reads the curve on the host) alike (issue #32 item 3: they used to disagree)."""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from opsctl.config import HostConfig


def mix_slug(policy) -> str:
    """A short stable name of the gate policy's workload mix."""
    from opsctl.gate.workloads import mix_key

    return hashlib.sha256(mix_key(policy.workloads).encode()).hexdigest()[:10]


def baseline_paths(host: "HostConfig", profile_name: str, policy=None) -> tuple[str, str]:
    """(the bench run, the greedy canary) of the baseline profile. Runs are stored per
    workload mix (a candidate is compared on the same requests); the canary is per profile."""
    base = f"{host.install_root}/baselines/{host.model.name}"
    policy = policy or host.gate_policy()
    return f"{base}/{profile_name}.{mix_slug(policy)}.jsonl", f"{base}/{profile_name}.canary.json"
