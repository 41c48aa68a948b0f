"""The built-in deployment profiles and their resolution: a profile by name, with the inventory's
overrides and the command line's budget, budget schedule, trial set or capture list applied."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from opsctl import schedule as schedule_mod
from opsctl import trialset as trialset_mod
from opsctl.config.models import Profile, _first_error
from opsctl.errors import ConfigError

BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "ar-tp8": {"kind": "autoregressive", "tp_size": 8,
               "description": "autoregressive baseline, tensor parallel over 8 GPUs"},
    "ar-ep8": {"kind": "autoregressive", "tp_size": 8, "ep_size": 8,
               "description": "autoregressive baseline, expert parallel MoE over 8 GPUs (no MoE all-reduce)"},
    "dflash": {"kind": "dflash", "tp_size": 8, "block_size": 8,
               "description": "DFlash block-diffusion drafter, linear verify of block_size tokens"},
    "ddtree": {"kind": "ddtree", "tp_size": 8, "block_size": 8, "cuda_graph_max_bs": 32,
               "description": "DDTree: best-first draft tree of --budget nodes from the DFlash drafter, tree verify"},
}

def profile_names(overrides: dict[str, dict[str, Any]] | None = None) -> list[str]:
    return sorted({*BUILTIN_PROFILES, *(overrides or {})})


def resolve_profile(name: str, budget: int | None = None, *,
                    overrides: dict[str, dict[str, Any]] | None = None,
                    budget_schedule: str | None = None,
                    trial_set: list[str] | tuple[str, ...] | None = None,
                    cuda_graph_bs: list[int] | tuple[int, ...] | None = None,
                    trial_bs: list[int] | tuple[int, ...] | None = None) -> Profile:
    """Built-in profile `name`, with the inventory's overrides and the CLI budget (or
    budget schedule, or trial set: opsctl tune's candidates captured at one start) applied, and
    an explicit capture list (`cuda_graph_bs`: --capture-from-traffic's choice) over the profile's. A
    schedule is checked against the batch sizes the server will capture, so a band that could
    never run is refused here, before any host I/O."""
    overrides = overrides or {}
    cli_budget = budget
    if name not in BUILTIN_PROFILES and name not in overrides:
        import difflib

        known = profile_names(overrides)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        raise ConfigError(f"unknown profile {name!r}" + (f": did you mean {close[0]!r}?" if close else ""),
                          f"use one of: {', '.join(known)}")
    data: dict[str, Any] = {**BUILTIN_PROFILES.get(name, {}), **overrides.get(name, {}), "name": name}
    kind = data.get("kind")
    if budget is not None and budget_schedule is not None:
        raise ConfigError("--budget and --budget-schedule both given",
                          "use one: --budget N is the one-band schedule 1:N")
    if trial_set is not None and (budget is not None or budget_schedule is not None):
        raise ConfigError("--trial-set with --budget or --budget-schedule",
                          "use one: a trial set lists its budgets and schedules as candidates")
    for flag, value in (("--budget", budget), ("--budget-schedule", budget_schedule), ("--trial-set", trial_set)):
        if value is not None and kind != "ddtree":
            raise ConfigError(f"{flag} applies only to ddtree profiles, not {name!r} ({kind})",
                              f"drop {flag}, or deploy 'ddtree {flag} {value}'")
    if kind == "ddtree" and trial_set is not None:
        trial_set = tuple(trialset_mod.canonical(c) for c in trial_set)
        data["trial_set"] = trial_set
        if trial_bs is not None:
            data["trial_bs"] = tuple(sorted(set(int(b) for b in trial_bs)))
        data.pop("budget_schedule", None)
        budget = trialset_mod.max_budget(trial_set)
    elif kind == "ddtree":
        data.pop("trial_set", None)
        data.pop("trial_bs", None)
    if kind == "ddtree" and trial_set is None:
        sched_text = budget_schedule
        if sched_text is None and budget is None:
            sched_text = data.get("budget_schedule")
        if sched_text is not None:
            what = "--budget-schedule" if budget_schedule is not None else f"opsctl.profiles.{name}.budget_schedule"
            sched = schedule_mod.parse(str(sched_text), what=what,
                                       allow_torch_beam=bool(data.get("tree_torch_fallback")))
            data["budget_schedule"] = sched.text
            budget = sched.max_budget
        else:
            data.pop("budget_schedule", None)
        if budget is None:
            budget = data.get("budget")
        if budget is None:
            raise ConfigError(f"profile {name!r} needs --budget N or --budget-schedule (DDTree's node budget)",
                              f"e.g. 'opsctl deploy {name} --budget 16'")
    if kind == "ddtree":
        if data.get("trial_set") is None and not data.get("budget_schedule"):
            # --budget N (or the profile's budget): the one limit a schedule's band has too, checked
            # before the block-size rule so 100 and 100000 get the same line (issue #49)
            schedule_mod.check_budget(int(budget), allow_torch_beam=bool(data.get("tree_torch_fallback")),
                                      what=f"--budget {budget}" if cli_budget is not None
                                      else f"opsctl.profiles.{name}.budget {budget}")
        block = int(data.get("block_size") or 8)
        if block > 2 * (budget + 1):
            # the runtime's check (runtime worker.check_shapes): the drafter block and the verify window
            # share the 2 x (budget + 1) KV slots DFlash reserves per request and step
            what = (f"--budget-schedule {data['budget_schedule']}: its largest budget {budget}"
                    if data.get("budget_schedule") else f"--trial-set: its largest budget {budget}"
                    if data.get("trial_set") else f"--budget {budget}")
            raise ConfigError(f"{what} is too small for the drafter's block of {block}: the runtime reserves "
                              f"2 x (budget + 1) = {2 * (budget + 1)} KV slots per request and step and the "
                              f"block needs {block}", f"use a budget of at least {(block + 1) // 2 - 1}")
        data["budget"] = budget
    if cuda_graph_bs is not None:
        data["cuda_graph_bs"] = tuple(int(b) for b in cuda_graph_bs)
    try:
        prof = Profile(**data)
    except ValidationError as exc:
        raise ConfigError(f"profile {name!r}: {_first_error(exc)}",
                          "fix opsctl.profiles in the inventory's group_vars/host_vars") from None
    sched = prof.schedule
    if prof.trial_set is not None:  # every candidate as the runtime checks it at start
        trialset_mod.check_candidates(prof.trial_set, capture_bs=prof.captured_batch_sizes,
                                      allow_torch_beam=prof.tree_torch_fallback)
    elif sched is not None:
        schedule_mod.check_for_server(sched, capture_bs=prof.captured_batch_sizes,
                                      allow_torch_beam=prof.tree_torch_fallback,
                                      what="--budget-schedule" if budget_schedule is not None else "budget_schedule")
    elif prof.kind == "ddtree" and prof.budget is not None:  # --budget N: the one-band schedule 1:N, same limits
        schedule_mod.check_budget(prof.budget, allow_torch_beam=prof.tree_torch_fallback,
                                  what=f"--budget {prof.budget}" if cli_budget is not None
                                  else f"opsctl.profiles.{name}.budget {prof.budget}")
    return prof
