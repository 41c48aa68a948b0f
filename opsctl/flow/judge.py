"""judge: bench the new release (opsctl/gate/measure.py) and decide against the stored
baseline (opsctl/gate/decide.py holds the pure decision); the verdict goes to the ledger."""
from __future__ import annotations

import shlex

import tempfile
from pathlib import Path
from typing import Any

from opsctl.config import HostConfig, Profile
from opsctl.flow.bench import (
    check_baseline_mix,
    has_baseline,
    load_baseline,
    run_summary,
    save_baseline,
    summary_line,
)
from opsctl.flow.steps import GateOutcome, Steps
from opsctl.gate.baseline import baseline_paths
from opsctl.gate.decide import judge_with_remeasure, level_table, verdict_summary
from opsctl.gate.measure import measure
from opsctl.host.connection import Connection
from opsctl.ledger import append_ledger


def bench_and_judge(conn: Connection, host: HostConfig, profile: Profile, release: str, steps: Steps) -> GateOutcome:
    """Bench the new release on the host and judge it by the profile's analysis against the
    stored baseline. A baseline profile benched on a host with no baseline becomes that baseline."""
    policy = host.gate_policy(profile)
    spec = host.analysis(profile, policy)   # the rules; the watch holds the release to the same after promotion
    t0 = steps.start("bench", f"levels {','.join(map(str, policy.concurrency))}, {policy.repeats} repeat(s)")
    meta = {"release": release, "profile": profile.label, "kind": profile.kind}
    is_baseline_kind = profile.kind == "autoregressive"
    if is_baseline_kind and profile.name == host.baseline_profile and not has_baseline(conn, host, policy):
        run = measure(conn, host, policy, make_canary=True, meta=meta)
        path = save_baseline(conn, host, profile.name, run, policy)
        store_release_bench(conn, host, release, run)
        steps.done("bench", t0, f"no baseline yet: stored this run as the {profile.name} baseline ({path})")
        rec = _verdict_record(conn, host, release, profile, "pass", [], [f"stored as the baseline ({path})"],
                              run_summary=run_summary(run))
        return GateOutcome(True, "", rec)
    _, canary_path = baseline_paths(host, host.baseline_profile, policy)
    baseline = load_baseline(conn, host, policy)
    check_baseline_mix(baseline.meta, policy, host)
    first = measure(conn, host, policy, canary_file=canary_path, meta=meta, baseline=baseline, spec=spec)
    steps.done("bench", t0, summary_line(first))
    t1 = steps.start("judge", f"against the {host.baseline_profile} baseline")
    verdict, run = judge_with_remeasure(
        lambda: measure(conn, host, policy, canary_file=canary_path, meta=meta, baseline=baseline, prior=first,
                        spec=spec),
        baseline, policy,
        profile_kind=profile.kind, canary_mismatch=first.canary.mismatch if first.canary else None,
        canary_ran=bool(first.canary and first.canary.compared), first=first, spec=spec)
    store_release_bench(conn, host, release, run)
    # every DDTree verdict keeps its diagnosis (its predictions are what `opsctl tune` checks later);
    # a failed one says why in its reasons
    diagnosis = _diagnosis(conn, host, profile, release, run, baseline)
    if diagnosis is not None and not verdict.ok:
        from opsctl.diagnose import reason_line

        verdict.reasons.append(reason_line(diagnosis).replace("RELEASE", release))
    cols, cells, lines = level_table(verdict.rows)
    steps.progress({"event": "verdict", "host": host.name, "status": verdict.status, "reasons": verdict.reasons,
                    "notes": verdict.notes, "rows": [_row(r) for r in verdict.rows],
                    "table": {"columns": cols, "rows": cells, "lines": lines}})
    rec = _verdict_record(conn, host, release, profile, verdict.status, verdict.reasons, verdict.notes,
                          rows=[r.model_dump(mode="json") for r in verdict.rows], canary=verdict.canary,
                          attempts=verdict.attempts, **({"diagnosis": diagnosis} if diagnosis else {}))
    if verdict.ok:

        steps.done("judge", t1, f"{verdict.status.upper()}: {verdict_summary(verdict)}")
        return GateOutcome(True, "", rec)
    steps.done("judge", t1, verdict.one_line(), status="fail")
    return GateOutcome(False, verdict.one_line(), rec)


def _diagnosis(conn: Connection, host: HostConfig, profile: Profile, release: str, run, baseline) -> dict | None:
    """Why a DDTree release failed its gate (opsctl/diagnose.py), for the verdict's reasons and
    record; None for other kinds, or when the bench cannot say (a diagnosis never fails a deploy)."""
    if profile.kind != "ddtree" or not profile.budget:
        return None
    from opsctl import diagnose as dx
    from opsctl.errors import OpsctlError
    from opsctl.host import facts

    try:
        ledger, _ = facts.get(conn, facts.LedgerRecords(str(host.install_root)))
    except OpsctlError:
        ledger = []
    try:
        return dx.from_runs(run, baseline, budget=profile.budget, reference=host.drafter.reference_accept,
                            history=dx.history_points(ledger, exclude=release),
                            source={"host": host.name, "release": release, "profile": profile.label,
                                    "baseline": host.baseline_profile})
    except (OpsctlError, ValueError, ZeroDivisionError):
        return None


def _row(r) -> dict:
    def f(v, fmt):
        return "-" if v is None else fmt % v

    return {"C": r.concurrency, "baseline tok/s": f(r.baseline_tok_s, "%.1f"), "release tok/s": f(r.candidate_tok_s, "%.1f"),
            "aggregate delta": f(r.aggregate_delta_pct, "%+.1f%%"), "judged on": r.judged_on,
            "baseline per-request tok/s": f(r.baseline_req_tok_s, "%.1f"),
            "release per-request tok/s": f(r.candidate_req_tok_s, "%.1f"),
            "delta": f(r.delta_pct, "%+.1f%%"), "ITL p50 base": f(r.baseline_itl_p50_ms, "%.2f ms"),
            "ITL p50 rel": f(r.candidate_itl_p50_ms, "%.2f ms"), "accept": f(r.accept_length, "%.2f"),
            "errors": r.errors,
            "CI": _ci_text(r),
            "status": r.why or r.status}


def _ci_text(r) -> str:
    """The judged interval with what it rests on: `[+3.1, +22.0] % (90 % over 6 looks, log-t, 16 vs 48 requests)`."""
    if r.low_pct is None:
        return "-"
    hi = "+inf" if r.high_pct is None else f"{r.high_pct:+.1f}"
    looks = f" over {r.looks} looks" if r.looks and r.looks > 1 else ""
    conf = f"{r.confidence_pct:.0f} %{looks}, " if r.confidence_pct is not None else ""
    return (f"[{r.low_pct:+.1f}, {hi}] % ({conf}{r.method or 'interval'}, {r.samples} vs "
            f"{r.baseline_samples if r.baseline_samples is not None else '?'} requests)")


def store_release_bench(conn: Connection, host: HostConfig, release: str, run) -> None:
    from opsctl.gate.results import write_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        local = write_jsonl(run, Path(tmp) / "bench.jsonl")
        rdir = shlex.quote(str(host.install_root / "releases" / release))
        conn.run(f"test -d {rdir} && cat > {rdir}/bench.jsonl", stdin=local.read_text(), check=False)


def _verdict_record(conn: Connection, host: HostConfig, release: str, profile: Profile, status: str,
                    reasons: list[str], notes: list[str], **extra: Any) -> dict:
    rec = {"action": "verdict", "status": status, "result": "ok" if status == "pass" else "failed",
           "release": release, "to_release": release, "profile": profile.name, "budget": profile.budget,
           "reason": "; ".join(reasons) if reasons else "; ".join(notes), "reasons": reasons, "notes": notes, **extra}
    return append_ledger(conn, host, rec)


