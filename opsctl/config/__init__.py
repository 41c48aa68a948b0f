"""Typed configuration: the inventory (Ansible's layout), the hosts' settings, the deployment
profiles. `opsctl.config` is the public face; the package has one room per job:

  models.py    the typed settings (Profile, the host facts, watch/drain/tune/rollout settings,
               HostSettings, HostConfig, Inventory): every key under `opsctl:` is a field here
               (the gate policy is opsctl.gate.decide.GatePolicy); pure
  profiles.py  the built-in profiles and their resolution (overrides, the CLI's budget, budget
               schedule, trial set or capture list)
  located.py   inventory YAML that remembers the file:line of every key
  audit.py     the key audit: an unknown key, a wrong type or an out-of-range value is a
               ConfigError naming the file:line that set it
  loader.py    load_inventory: hosts.yml, group_vars/, host_vars/ in Ansible's own precedence
               (groups in sort_groups order; a variable set again, a mapping included, replaces
               the earlier value whole, as Ansible's default hash_behaviour=replace does:
               docs/inventory.md); SSH facts from the usual `ansible_*` variables beside `opsctl:`

One set of files drives both ansible-runner and opsctl.
"""
from __future__ import annotations

from opsctl.config.loader import _host_config, load_inventory
from opsctl.config.models import (DRAIN_DEADLINE_DEFAULT_S, DRAIN_DEADLINE_MAX_S, MAX_BUDGET, SAFE_ADDRESS,
                                  SAFE_MODEL_NAME, SAFE_NAME, SAFE_PATH, SAFE_USER, START_LIMIT_BURST, DrafterFacts,
                                  DrainHook, DrainHooks, DrainSettings, GPUFacts, HostConfig, HostSettings, Inventory,
                                  ModelFacts, Profile, ProfileKind, RolloutPolicy, RuntimeFacts, TuneSettings,
                                  WatchNotify, WatchRules, WatchSettings, watch_window_problem,
                                  METRICS_TEXTFILE_DEFAULT, MetricsSettings, inventory_schema)
from opsctl.config.profiles import BUILTIN_PROFILES, profile_names, resolve_profile
from opsctl.errors import ConfigError

__all__ = [
    "BUILTIN_PROFILES", "ConfigError", "DRAIN_DEADLINE_DEFAULT_S", "DRAIN_DEADLINE_MAX_S", "DrafterFacts", "DrainHook",
    "DrainHooks", "DrainSettings", "GPUFacts", "HostConfig", "HostSettings", "Inventory", "MAX_BUDGET", "ModelFacts",
    "Profile", "ProfileKind", "RolloutPolicy", "RuntimeFacts", "SAFE_ADDRESS", "SAFE_MODEL_NAME", "SAFE_NAME",
    "SAFE_PATH", "SAFE_USER", "START_LIMIT_BURST", "TuneSettings", "WatchNotify", "WatchRules", "WatchSettings",
    "METRICS_TEXTFILE_DEFAULT", "MetricsSettings", "inventory_schema", "load_inventory", "profile_names", "resolve_profile", "watch_window_problem",
]
