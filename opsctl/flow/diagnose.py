"""diagnose: a release on its host, explained (opsctl/diagnose.py): its stored bench against the
host's baseline, the runtime's step lines since the release's last start, the accept lengths
this host measured at other budgets and the drafter's reference. Reads only."""
from __future__ import annotations

import shlex
from datetime import datetime
from pathlib import Path
from typing import Any

from opsctl import diagnose as dx
from opsctl.config import HostConfig, Inventory
from opsctl.errors import ConfigError, HostError
from opsctl.flow.bench import has_baseline, load_baseline, run_from_text
from opsctl.flow.steps import as_inventory
from opsctl.host import facts
from opsctl.host.connection import Connection, connect
from opsctl.releases import read_state
from opsctl.startup import last_start


def release_diagnosis(inventory: str | Path | Inventory, release: str | None = None, *, limit: str | None = None,
                      reference: dict[int, float] | None = None, baseline_file: Path | None = None,
                      journal_file: Path | None = None) -> dict[str, Any]:
    """`opsctl diagnose [RELEASE]` on the inventory's host (default: the live release)."""
    inv = as_inventory(inventory)
    host = inv.single(limit)
    conn = connect(host)
    try:
        state = read_state(conn, host)
        release = release or state.current
        if not release:
            raise ConfigError(f"nothing is live on {host.name} and no release was named",
                              "name one: opsctl diagnose RELEASE (ids in 'opsctl history')")
        info = state.releases.get(release)
        if info is None:
            raise ConfigError(f"no release {release!r} on {host.name}",
                              "pick a release id from 'opsctl history' or 'opsctl status --json'")
        if info.kind != "ddtree":
            raise ConfigError(f"{release} is a {info.kind} release: diagnose explains a DDTree release against "
                              "the autoregressive baseline", "name a ddtree release (ids in 'opsctl history')")
        run = _release_bench(conn, host, release)
        if baseline_file is not None:
            base = dx.load_input(baseline_file).run
        elif has_baseline(conn, host):
            base = load_baseline(conn, host)
        else:
            raise ConfigError(f"no {host.baseline_profile} baseline stored on {host.name}",
                              f"deploy {host.baseline_profile} first, or pass --baseline FILE")
        parsed = dx.load_input(journal_file).journal if journal_file is not None else \
            _journal_since_start(conn, host, state.ledger, release)
        other, other_label = _other_baseline(conn, host, state)
    finally:
        conn.close()
    ref = dict(host.drafter.reference_accept)
    ref.update(reference or {})
    schedule = info.budget_schedule or (",".join(info.trial_set) if info.trial_set else None)
    d = dx.from_runs(run, base, budget=info.budget, reference=ref,
                     history=dx.history_points(state.ledger, exclude=release), journal=parsed,
                     other=other, other_label=other_label,
                     source={"host": host.name, "release": release, "profile": info.label,
                             "baseline": host.baseline_profile, "journal": "since the release's last start"
                             if parsed is not None else None})
    if schedule:
        d["notes"].append(f"{release} serves {schedule}: diagnosed at its largest budget {info.budget}")
    return d


def _release_bench(conn: Connection, host: HostConfig, release: str):
    res = conn.run(f"cat {host.install_root}/releases/{shlex.quote(release)}/bench.jsonl", check=False)
    if not res.ok:
        raise ConfigError(f"release {release} on {host.name} has no stored bench (deployed with --no-gate, or its "
                          "deploy stopped before the bench)", "bench it live ('opsctl bench --json > run.jsonl') and "
                          "pass the file: opsctl diagnose run.jsonl --baseline BASELINE.jsonl")
    return run_from_text(res.stdout, source=f"{host.name}:{release}/bench.jsonl")


def _journal_since_start(conn: Connection, host: HostConfig, ledger: list[dict], release: str):
    from opsctl import journal

    start = last_start(ledger, release)
    if not start or not start.get("ts"):
        return None
    try:
        since = datetime.fromisoformat(str(start["ts"]).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    try:
        entries = facts.get(conn, facts.JournalWindow(host.unit_name, int(since) - 5))
    except HostError:
        return None
    return journal.parse(entries)


def _other_baseline(conn: Connection, host: HostConfig, state) -> tuple[Any, str]:
    """The newest judged bench of the other autoregressive profile (TP vs EP), if the host has one."""
    for rec in reversed(state.ledger):
        rel = rec.get("release")
        info = state.releases.get(rel) if rel else None
        if rec.get("action") != "verdict" or info is None or info.kind != "autoregressive" \
                or info.profile == host.baseline_profile:
            continue
        res = conn.run(f"cat {host.install_root}/releases/{shlex.quote(rel)}/bench.jsonl", check=False)
        if res.ok:
            return run_from_text(res.stdout, source=f"{host.name}:{rel}/bench.jsonl"), info.profile
    return None, ""
