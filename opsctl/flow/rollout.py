"""rollout: the waves a deploy across several hosts goes in (`opsctl.rollout`).

The canary host(s) form the first wave on their own; the other hosts are cut into
batches by Ansible's `serial` rule (serial_batches, written here from Ansible's documented
behaviour: no private Ansible API), so `waves: [1, "25%", "100%"]` means here exactly what it
means in a play. A wave fails when more than `max_fail_percentage` of its hosts failed (Ansible's
rule: failed / batch size > percentage); the deploy flow (flow/deploy.py) stops there.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone

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


def serial_size(item: int | str, total: int) -> int:
    """One `serial` entry as a host count: an int as written; "P%" is P % of TOTAL (every host
    of the play, not those left), rounded down but at least 1 (Ansible: "No matter how small
    the percentage, the number of hosts per pass will always be 1 or greater")."""
    if isinstance(item, str) and item.strip().endswith("%"):
        return max(1, int(int(item.strip()[:-1]) / 100.0 * total))
    return int(item)


def serial_batches(names: list[str], serial: int | str | list[int | str]) -> list[list[str]]:
    """NAMES in batches as Ansible cuts a play's hosts for `serial: SERIAL` (docs: "Setting
    the batch size with serial"): an int, a percentage or a list of them, mixed; each entry
    is one batch, the last entry repeats until every host has had its batch, the last batch
    holds what is left. A size below 1 (or an empty list) means every host at once."""
    sizes = list(serial) if isinstance(serial, list) else [serial]
    hosts = list(names)
    if not sizes:
        return [hosts] if hosts else []
    batches: list[list[str]] = []
    i = 0
    while hosts:
        size = serial_size(sizes[min(i, len(sizes) - 1)], len(names))
        if size <= 0:
            batches.append(hosts)
            break
        batches.append(hosts[:size])
        hosts = hosts[size:]
        i += 1
    return batches


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
