"""A capture list from the host's own traffic (issue #51): the journal's `Decode batch` lines over a
window (`--traffic-since`, default the last day), the gate's bench levels and the profile's
max_concurrency, chosen by opsctl.capture_plan; the profile comes back with that list
(`cuda_graph_bs`), rendered as `--cuda-graph-bs-decode`. Reads only (one journalctl)."""
from __future__ import annotations

import re

from opsctl import capture_plan
from opsctl import schedule as schedule_mod
from opsctl import trialset as trialset_mod
from opsctl.config import HostConfig, Profile
from opsctl.errors import ConfigError
from opsctl.flow.bench import has_baseline, load_baseline
from opsctl.host import facts
from opsctl.host.connection import Connection
from opsctl.onhost.capture import autoregressive_decode_batch_sizes, captured_batch_sizes

DEFAULT_SINCE = "24h"
_RELATIVE = re.compile(r"^(\d+)\s*(s|m|min|h|d|w)$")


def journal_since(since: str) -> str:
    """`24h`, `90m`, `2d` -> journalctl's relative `-24h`; anything else (a timestamp,
    `yesterday`, `-3h`) as given."""
    m = _RELATIVE.match(since.strip())
    return f"-{m[1]}{m[2]}" if m else since.strip()


def band_starts(profile: Profile) -> list[int]:
    """The smallest batch of every band of the profile's schedule (or of its trial set's
    schedules): a band must keep a graph of its own or it never runs (schedule.check_for_server)."""
    texts = [profile.budget_schedule] if profile.budget_schedule else []
    texts += [c for c in profile.trial_set or () if trialset_mod.is_schedule(c)]
    return sorted({b.min_bs for t in texts for b in schedule_mod.parse(t).bands})


def choose_for(profile: Profile, parsed, *, levels: list[int], max_padding: float = capture_plan.MAX_PADDING,
               interval: int | None = None, forward=None) -> capture_plan.CapturePlan:
    """The plan for `profile` from a parsed journal window (pure: the CLI's and the tests' core)."""
    if profile.speculative:
        default = Profile.model_validate({**profile.model_dump(), "cuda_graph_bs": None}).captured_batch_sizes
    else:   # SGLang's list without speculation is sparser (1, 2, 4, 8, 12, 16, 24, 32, ...)
        default = captured_batch_sizes(profile.cuda_graph_max_bs, profile.max_running_requests,
                                       explicit=autoregressive_decode_batch_sizes(profile.cuda_graph_max_bs))
    width = profile.verify_width
    hist = capture_plan.histogram_from_journal(parsed, interval or profile.decode_log_interval)
    graph_s, source = capture_plan.graph_seconds_from_journal(parsed, width, profile.speculative)
    plan = capture_plan.choose(hist, default, width, graph_s=graph_s, graph_s_source=source,
                               speculative=profile.speculative, max_padding=max_padding, levels=levels,
                               forward=forward,
                               keep=band_starts(profile), max_concurrency=profile.effective_max_concurrency)
    if profile.budget_schedule or profile.trial_set:
        plan.notes.append(f"capture seconds at the widest verify width ({width}); the bands' own widths capture less")
    return plan


def capture_from_traffic(conn: Connection, host: HostConfig, profile: Profile, *, since: str = DEFAULT_SINCE,
                         max_padding: float = capture_plan.MAX_PADDING) -> tuple[Profile, capture_plan.CapturePlan]:
    """`profile` with the capture list the host's traffic since `since` asks for, and the plan."""
    from opsctl import journal

    entries = facts.get(conn, facts.JournalWindow(host.unit_name, journal_since(since)))
    parsed = journal.parse(entries)
    policy = host.gate_policy(profile)
    levels = list(policy.concurrency)
    forward = None
    if has_baseline(conn, host, policy):   # the host's own forward, fitted to the baseline's decode steps
        from opsctl.diagnose import sides_from_run

        forward = capture_plan.forward_from_baseline(sides_from_run(load_baseline(conn, host, policy)))
    try:
        plan = choose_for(profile, parsed, levels=levels, max_padding=max_padding, forward=forward)
    except capture_plan.CapturePlanError as exc:
        raise ConfigError(f"--capture-from-traffic: {exc}", "deploy without --capture-from-traffic") from None
    if plan.chosen == plan.default:   # nothing to leave out: the release stays as it renders without the option
        return profile, plan
    chosen = host.profile(profile.name, None if (profile.budget_schedule or profile.trial_set) else profile.budget,
                          profile.budget_schedule, trial_set=profile.trial_set, cuda_graph_bs=plan.chosen) \
        if profile.kind == "ddtree" else host.profile(profile.name, cuda_graph_bs=plan.chosen)
    return chosen, plan


def capture_from_host(host: HostConfig, profile: Profile, *, since: str = DEFAULT_SINCE,
                      max_padding: float = capture_plan.MAX_PADDING) -> tuple[Profile, capture_plan.CapturePlan]:
    """capture_from_traffic over a connection of its own (opsctl render)."""
    from opsctl.host.connection import connect

    conn = connect(host)
    try:
        return capture_from_traffic(conn, host, profile, since=since, max_padding=max_padding)
    finally:
        conn.close()
