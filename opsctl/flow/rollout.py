"""rollout: the waves a deploy across several hosts goes in (`opsctl.rollout`).

The canary host(s) form the first wave on their own; the other hosts are cut into
batches by Ansible's own `serial` code (PlaybookExecutor._get_serialized_batches with
its pct_to_int), so `waves: [1, "25%", "100%"]` means here exactly what it means in a
play. A wave fails when more than `max_fail_percentage` of its hosts failed (Ansible's
rule: failed / batch size > percentage); the deploy flow (flow/deploy.py) stops there.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from types import SimpleNamespace

from opsctl.config import HostConfig, RolloutPolicy
from opsctl.errors import ConfigError


@dataclass(frozen=True)
class Wave:
    index: int          # 0-based, in rollout order
    name: str           # "canary", "wave 1", ...
    hosts: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "hosts": list(self.hosts)}


def rollout_policy(hosts: list[HostConfig]) -> RolloutPolicy:
    """The selected hosts' `opsctl.rollout`; they must agree (a fleet has one policy)."""
    first = hosts[0]
    for h in hosts[1:]:
        if h.settings.rollout != first.settings.rollout:
            raise ConfigError(f"opsctl.rollout differs between hosts {first.name} and {h.name}",
                              "set opsctl.rollout once for the fleet, in group_vars/all.yml")
    return first.settings.rollout


def serial_batches(names: list[str], serial: list[int | str]) -> list[list[str]]:
    """NAMES in batches as Ansible cuts a play's hosts for `serial: SERIAL`."""
    from ansible.executor.playbook_executor import PlaybookExecutor

    if not names:
        return []
    inventory = SimpleNamespace(get_hosts=lambda pattern, order=None: list(names))
    executor = SimpleNamespace(_inventory=inventory)
    play = SimpleNamespace(hosts="all", order=None, serial=list(serial))
    return [list(b) for b in PlaybookExecutor._get_serialized_batches(executor, play)]


def plan_waves(hosts: list[HostConfig], policy: RolloutPolicy, inventory_hosts: list[str] | None = None) -> list[Wave]:
    """The waves for HOSTS (the selection). Canary names outside the selection (a `--limit`
    that leaves them out) are not part of this run; names the inventory lacks are an error."""
    names = [h.name for h in hosts]
    if isinstance(policy.canary, int):
        canary = names[:policy.canary]
    else:
        known = set(inventory_hosts if inventory_hosts is not None else names)
        unknown = [c for c in policy.canary if c not in known]
        if unknown:
            raise ConfigError(f"opsctl.rollout.canary names {', '.join(unknown)}, not a host of the inventory",
                              f"name hosts of the inventory: {', '.join(sorted(known))}")
        canary = [n for n in names if n in policy.canary]
    rest = [n for n in names if n not in canary]
    waves: list[Wave] = []
    if canary:
        waves.append(Wave(0, "canary", tuple(canary)))
    for batch in serial_batches(rest, policy.waves):
        waves.append(Wave(len(waves), f"wave {len(waves) + (0 if canary else 1)}", tuple(batch)))
    return waves


def wave_failed(failed: int, size: int, policy: RolloutPolicy) -> bool:
    """Ansible's max_fail_percentage rule for one batch."""
    return size > 0 and failed / size > policy.max_fail_percentage / 100.0


def new_rollout_id() -> str:
    return f"r{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(2)}"


def sleep_soak(seconds: float, note) -> None:
    """The soak between waves (the brake interrupts it like any step)."""
    end = time.monotonic() + seconds
    last_said = 0.0
    while (left := end - time.monotonic()) > 0:
        if time.monotonic() - last_said >= 30:
            note(f"soaking: {left:.0f}s before the next wave")
            last_said = time.monotonic()
        time.sleep(min(left, 0.5))
