"""inspect: `opsctl status`, `opsctl history`, and a release's stored bench for `opsctl report`."""
from __future__ import annotations

from pathlib import Path

from opsctl import watch
from opsctl.config import Inventory
from opsctl.errors import ConfigError
from opsctl.flow.bench import has_baseline, load_baseline, run_from_text
from opsctl.flow.steps import as_inventory
from opsctl.host import facts
from opsctl.host.connection import connect
from opsctl.drain import last_switch
from opsctl.flow.switch import guard_unit
from opsctl.releases import ledger_lost_problem, read_state
from opsctl.startup import jit_outlook, last_start
from opsctl import serving
from opsctl.serving import ServingDDTree

# --------------------------------------------------------------------------- status / history


def status(inventory: str | Path | Inventory, *, limit: str | None = None) -> list[dict]:
    inv = as_inventory(inventory)
    out = []
    for host in inv.select(limit):
        conn = connect(host)
        try:
            with facts.cached(conn):  # each fact read once for this host
                state = read_state(conn, host)
                watch_state = watch.brief(conn, host)
                jit_cache = facts.get(conn, facts.JitCaches(str(host.install_root)), timeout=30)
                cur = state.current_release
                # what the DDTree runtime serves, from the runtime (issue #50 item 2)
                runtime = (facts.get(conn, ServingDDTree(str(host.host_python), host.http_port), timeout=30)
                           if cur is not None and cur.kind == "ddtree" and state.service.get("ActiveState") == "active"
                           else None)
                # the deploy guard's timer, as systemd has it: status says it reverts only while it is armed
                guard = facts.get(conn, facts.ServiceState(f"{guard_unit(host)}.timer", ("ActiveState",)))
        finally:
            conn.close()
        intent = serving.intended(cur, state.ledger)
        active = str(runtime["active"]) if runtime else None
        budget, schedule = serving.as_budget(active) if active else \
            ((cur.budget, cur.budget_schedule) if cur else (None, None))
        baseline = state.baseline(host.baseline_profile)
        verdict = state.verdict_for(state.current)  # the live release's own verdict, never another's
        unfinished = state.interrupted_deploy()
        not_ready = state.live_not_ready()  # a rollback (the guard's too) whose release did not start (item 5)
        out.append({
            "host": host.name, "release": state.current, "profile": cur.profile if cur else None,
            # what serves: the runtime's own word (/server_info) when it answers, else the release's
            "budget": budget, "budget_schedule": schedule,
            "serving": ({"active": active, "source": "/server_info", "intended": intent,
                         "matches": serving.same(active, intent), "trial_set": bool(runtime.get("trial_set")),
                         "last_refusal": runtime.get("last_refusal")} if runtime else None),
            "release_label": cur.label if cur else None,
            # the opsctl that built the live release, as its manifest.json records it
            "opsctl_version": cur.manifest.get("opsctl_version") if cur else None,
            "verify_width": cur.manifest.get("verify_width") if cur else None,
            "unit": host.unit_name,
            "service": state.service.get("ActiveState"), "sub_state": state.service.get("SubState"),
            "since": state.service.get("ActiveEnterTimestamp"), "restarts": state.service.get("NRestarts"),
            "judged": state.judged(state.current) if state.current else None,
            # why a live release no gate passed is not judged: --no-gate, a tune's trial, a killed deploy
            "never_judged": (state.never_judged_why(state.current)
                             if state.current and not state.passed_gate(state.current)
                             and state.gate_failed(state.current) is None and not state.ledger_lost else None),
            "last_verdict": ({"status": verdict.get("status"), "ts": verdict.get("ts"), "release": verdict.get("release")}
                             if verdict else None),
            "deploy_in_progress_or_interrupted": unfinished is not None,
            "guard_armed": guard.get("ActiveState") in ("active", "activating"),
            "unfinished_deploy": ({k: unfinished.get(k) for k in ("ts", "result", "step", "switched", "to_release",
                                                                  "from_release", "signal", "who")}
                                  if unfinished else None),
            "last_good": state.last_good(),
            "live_not_ready": ({k: not_ready.get(k) for k in ("ts", "from_release", "reason", "error", "who", "tried")
                                if not_ready.get(k) is not None} if not_ready else None),
            "ledger_problems": state.ledger_errors,
            # the ledger deleted (or emptied) with releases on disk: nothing can be judged from it (item 8)
            "ledger": {"path": str(host.install_root / "ledger.jsonl"), "exists": state.ledger_exists,
                       "records": len(state.ledger), "lost": state.ledger_lost,
                       "problem": ledger_lost_problem(host, state) if state.ledger_lost else None},
            "releases": sorted(state.releases), "baseline": baseline,
            # each release's last start that got ready (the ledger's switch records): total and phases
            "releases_on_disk": [{"id": r.id, "profile": r.label, "created_at": r.created_at,
                                  "opsctl_version": r.manifest.get("opsctl_version"),
                                  "live": r.id == state.current, "last_start": last_start(state.ledger, r.id)}
                                 for r in sorted(state.releases.values(), key=lambda r: r.created_at, reverse=True)],
            "last_start": last_start(state.ledger, state.current),
            # whether the next start finds the shared JIT caches warm (issue #51)
            "jit_cache": jit_outlook(jit_cache, state.ledger, str(host.install_root / "shared" / "cache")),
            "baseline_last_start": last_start(state.ledger, baseline),
            "watch": watch_state,
            "rollout": _live_rollout(state),
            "last_switch": last_switch(state.ledger),
            # the deploy guard's last resort put the live release back (issue #50 item 3)
            "last_resort": _last_resort(state),
        })
    return out


def _last_resort(state) -> dict | None:
    """The guard's last-resort record that made the live release serve (every fallback failed, so
    it started again the release that served when it began), while no later record switched."""
    for rec in reversed(state.ledger):
        if rec.get("to_release") != state.current or rec.get("switched") is False:
            continue
        if rec.get("action") in ("promote", "rollback") or (rec.get("action") == "deploy"
                                                            and rec.get("result") in ("started", "interrupted")):
            if rec.get("last_resort") and rec.get("result") == "ok":
                return {k: rec.get(k) for k in ("ts", "who", "tried", "reason", "from_release")}
            return None
    return None


def _live_rollout(state) -> str | None:
    """The rollout that put the live release in place (None for a single-host deploy)."""
    for rec in reversed(state.ledger):
        if rec.get("to_release") == state.current and rec.get("action") in ("promote", "rollback", "deploy"):
            return rec.get("rollout")
    return None


def history(inventory: str | Path | Inventory, *, limit: str | None = None, last: int | None = None,
            problems: list[str] | None = None, rollout: str | None = None) -> list[dict]:
    """The ledger records of each selected host (the last N of each; with `rollout`, only
    that rollout's); lines that are not records are skipped and, when `problems` is given,
    reported there with their line."""
    if last is not None and last < 1:
        raise ConfigError(f"--last {last}: the number of records must be at least 1", "e.g. --last 10, or leave it out for all")
    inv = as_inventory(inventory)
    out = []
    for host in inv.select(limit):
        conn = connect(host)
        try:
            state = read_state(conn, host)
        finally:
            conn.close()
        recs = [r for r in state.ledger if r.get("rollout") == rollout] if rollout else list(state.ledger)
        recs = recs[-last:] if last else recs
        out.extend(recs)
        if problems is not None:
            problems.extend(f"{host.name}: ledger {p} (skipped)" for p in state.ledger_errors)
    return out




def release_bench(inventory: str | Path | Inventory, release: str, *, limit: str | None = None):
    """(the release's stored bench run, the host's baseline run, the host's gate policy, the
    release's last start from the ledger or None) for `opsctl report RELEASE`."""

    inv = as_inventory(inventory)
    host = inv.single(limit)
    conn = connect(host)
    try:
        text = facts.get(conn, facts.TextFile(f"{host.install_root}/releases/{release}/bench.jsonl"))
        if text is None:
            raise ConfigError(f"no bench results for release {release!r} on {host.name}",
                              "pass a results file, or a release id from 'opsctl history' that was benchmarked")
        run = run_from_text(text, source=f"{host.name}:{release}/bench.jsonl")
        base = load_baseline(conn, host) if has_baseline(conn, host) else None
        ledger, _ = facts.get(conn, facts.LedgerRecords(str(host.install_root)))
    finally:
        conn.close()
    return run, base, host.gate_policy(), last_start(ledger, release)
