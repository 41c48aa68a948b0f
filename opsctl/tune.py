"""`opsctl tune ddtree`: find the DDTree budget that wins at each concurrency, or prove
none does, on the host's own traffic, and leave the host as it was.

Each budget is deployed as a **trial** (the normal plan/stage/switch/ready/validate path, the
guard armed), benchmarked over the concurrency sweep on the gate's workload mix against the
stored baseline (opsctl/gate/measure.measure: rounds until each level's speedup interval is
decided, or the cap), then the next one. Trials are marked `trial` in the ledger and never
become "last good". Afterwards — always: after a trial that fails to start or validate,
an error, or Ctrl-C — the release that served before is restored.

Early stop: budgets are tried in increasing order; once throughput fell from one budget to
the next at every level, twice in a row, larger budgets are skipped (more nodes only cost
more verify work after that).

Then the budget schedule built from the best budget per level (`1:16,8:4,32:0`) is deployed
and measured as one more trial (when it has more than one band and any band speculates), so
the table shows it beside the single budgets it was made from, on the same traffic.

Pure parts (best per level, the budget schedule, the recommendation) work on plain data and
are unit tested; `tune()` does the I/O.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from opsctl.brake import BRAKE, Interrupted
from opsctl.errors import ConfigError, OpsctlError

MAX_BUDGET = 256


@dataclass
class LevelResult:
    concurrency: int
    tok_s: float                 # mean output tok/s of the level's rounds
    speedup: float | None        # vs the baseline, ratio of mean per-request rates
    low: float | None            # confidence interval of the speedup
    high: float | None
    requests: int = 0


@dataclass
class TrialResult:
    budget: int                  # a schedule trial: its largest band budget
    release: str | None
    status: str                  # measured | failed: <why> | skipped (early stop) | interrupted
    levels: dict[int, LevelResult] = field(default_factory=dict)
    deploy_s: float = 0.0        # plan, stage, switch, ready, validate
    bench_s: float = 0.0
    schedule: str | None = None  # a budget-schedule trial ("1:16,8:4,32:0")
    gap: dict | None = None      # its switch's serving gap (opsctl.drain.Gap.record)

    @property
    def label(self) -> str:
        return f"schedule {self.schedule}" if self.schedule else f"budget {self.budget}"

    def as_dict(self) -> dict:
        return {"budget": self.budget, "schedule": self.schedule, "release": self.release, "status": self.status,
                "deploy_s": round(self.deploy_s, 1), "bench_s": round(self.bench_s, 1),
                "levels": {str(c): vars(lv) for c, lv in self.levels.items()}, "gap": self.gap}


@dataclass
class TuneResult:
    host: str
    profile: str
    levels: list[int]
    baseline_tok_s: dict[int, float]
    trials: list[TrialResult]
    best: dict[int, int]         # level -> budget (0 = the baseline wins)
    schedule: str                # "1:32,8:16,32:8,64:0"
    recommendation: int | None   # one budget for the objective, or None: keep the baseline (or the schedule)
    reason: str
    recommended_schedule: str | None = None  # the schedule trial, when it is the recommendation
    restored: str | None = None
    restore_s: float = 0.0
    report: dict[str, str] = field(default_factory=dict)
    restore_gap: dict | None = None

    @property
    def gaps(self) -> list[dict]:
        """Every switch the tune made (each trial's, the restore's)."""
        return [g for g in [*(t.gap for t in self.trials), self.restore_gap] if g]

    def as_dict(self) -> dict:
        return {"host": self.host, "profile": self.profile, "levels": self.levels,
                "baseline_tok_s": self.baseline_tok_s, "trials": [t.as_dict() for t in self.trials],
                "best": self.best, "schedule": self.schedule, "recommendation": self.recommendation,
                "recommended_schedule": self.recommended_schedule,
                "reason": self.reason, "restored": self.restored, "restore_s": round(self.restore_s, 1),
                "report": self.report, "restore_gap": self.restore_gap,
                "outage_s": round(sum(g.get("gap_s") or 0 for g in self.gaps), 2),
                "outage_site_s": (round(sum((g.get("site") or {}).get("gap_s") or 0 for g in self.gaps), 1)
                                  if any(g.get("site") for g in self.gaps) else None)}


def parse_budgets(text: str) -> list[int]:
    try:
        budgets = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"--budgets {text!r}: not a list of integers", "e.g. --budgets 4,8,16,32") from None
    if not budgets or budgets[0] < 1 or budgets[-1] > MAX_BUDGET:
        raise ConfigError(f"--budgets {text!r}: budgets must be 1..{MAX_BUDGET}", "e.g. --budgets 4,8,16,32")
    return budgets


def _fell_everywhere(prev: TrialResult, cur: TrialResult) -> bool:
    common = [c for c in cur.levels if c in prev.levels]
    return bool(common) and all(cur.levels[c].tok_s < prev.levels[c].tok_s for c in common)


def should_stop(trials: list[TrialResult]) -> bool:
    """Throughput fell at every level for two budgets in a row (the rule in --help)."""
    measured = [t for t in trials if t.status == "measured" and not t.schedule]
    return len(measured) >= 3 and _fell_everywhere(measured[-3], measured[-2]) and \
        _fell_everywhere(measured[-2], measured[-1])


def best_per_level(trials: list[TrialResult], levels: list[int], max_regression: float = 0.0) -> dict[int, int]:
    """The budget with the highest throughput at each level whose speedup interval is wholly
    above 1 (proven faster than the baseline); 0 where no budget is: the baseline wins."""
    best: dict[int, int] = {}
    for c in levels:
        cands = [(t.levels[c].tok_s, t.budget) for t in trials
                 if t.status == "measured" and not t.schedule and c in t.levels and t.levels[c].low is not None and t.levels[c].low > 1.0]
        best[c] = max(cands)[1] if cands else 0
    return best


def _worth_a_trial(schedule: str) -> bool:
    """A schedule that is more than one of the budgets already measured, and speculates somewhere."""
    from opsctl.schedule import parse

    try:
        return len(parse(schedule).bands) > 1
    except ConfigError:  # every band 0: the baseline, already measured
        return False


def schedule_text(best: dict[int, int], capture_bs: list[int] | None = None) -> str:
    """Bands of running batch size and their budget, `1:16,3:4,16:0` (the runtime's budget
    schedule) from the best budget per level. A load of C concurrent requests decodes in running
    batches a little under C (requests finish and are admitted between steps), so a level's band
    starts at the geometric middle between it and the level below, not at C itself; the first
    starts at 1. A start is moved up to a captured CUDA-graph batch size when those are given
    (a band must hold one). Neighbouring bands with the same budget merge."""
    import math

    from opsctl.schedule import pad_to_captured

    bands: list[tuple[int, int]] = []
    levels = sorted(best)
    for i, c in enumerate(levels):
        if bands and bands[-1][1] == best[c]:
            continue
        start = 1 if i == 0 else math.ceil(math.sqrt(levels[i - 1] * c) - 1e-9)
        if capture_bs and i > 0:
            start = pad_to_captured(start, capture_bs)
        if bands and start <= bands[-1][0]:
            continue  # two levels too close to split: the lower level's band keeps them
        bands.append((start, best[c]))
    return ",".join(f"{s}:{b}" for s, b in bands)


def recommend(trials: list[TrialResult], levels: list[int], baseline_tok_s: dict[int, float],
               weights: dict[int, float] | None = None) -> tuple[TrialResult | None, str]:
    """One configuration for the objective (a budget, or the schedule trial): the highest
    traffic-weighted throughput over the levels (equal weights unless given) among those with
    no level proven below the baseline (speedup interval wholly under 1); None with the
    numbers when none qualifies."""
    weights = weights or {c: 1.0 for c in levels}
    scored = []
    for t in trials:
        if t.status != "measured" or any(c not in t.levels for c in levels):
            continue
        below = [c for c in levels if t.levels[c].high is not None and t.levels[c].high < 1.0]
        score = sum(weights[c] * t.levels[c].tok_s for c in levels)
        scored.append((score, t, below))
    ok = [s for s in scored if not s[2]]
    base_score = sum(weights[c] * baseline_tok_s.get(c, 0.0) for c in levels)
    if ok:
        score, best, _ = max(ok, key=lambda s: s[0])
        return best, (f"{best.label}: traffic-weighted {score:.1f} tok/s vs the baseline's {base_score:.1f} "
                      f"({(score / base_score - 1) * 100:+.1f} %), no level proven below the baseline")
    losses = "; ".join(f"{t.label}: below the baseline at C={','.join(map(str, below))}" for _, t, below in
                       sorted(scored, key=lambda s: (s[1].schedule or "", s[1].budget)))
    return None, ("no budget beats the baseline at these levels: keep the baseline"
                  + (f" ({losses})" if losses else ""))


def _level_results(run, baseline, levels: list[int], confidence: float) -> dict[int, LevelResult]:
    from opsctl.gate import interval as cf

    out = {}
    for c in levels:
        lv = run.at(c)
        if not lv:
            continue
        iv = cf.speedup_interval(cf.rates(cf.samples_of(lv)), cf.rates(cf.samples_of(baseline.at(c))),
                                 confidence=confidence)
        out[c] = LevelResult(c, sum(x.output_throughput for x in lv) / len(lv), iv.ratio if iv else None,
                             iv.low if iv else None, iv.high if iv else None,
                             len(cf.samples_of(lv)))
    return out


@dataclass
class RestartPlan:
    """What a tune will cost in restarts, before it starts (issue #35): one per trial and one for
    the restore, each projected at the last start's seconds (the journal, opsctl.startup)."""

    restarts: int
    start_s: float | None          # the last start, at the site's scale in the lab (its emulator's figure)
    time_scale: float | None       # the lab's; None on a real host
    drain_deadline_s: float

    @property
    def projected_outage_s(self) -> float | None:
        return round(self.restarts * self.start_s, 1) if self.start_s is not None else None

    def as_dict(self) -> dict:
        lab = (round(self.projected_outage_s / self.time_scale, 2)
               if self.time_scale and self.projected_outage_s is not None else None)
        return {"restarts": self.restarts, "start_s": self.start_s, "time_scale": self.time_scale,
                "projected_outage_s": self.projected_outage_s, "projected_outage_lab_s": lab,
                "drain_deadline_s": self.drain_deadline_s}

    def describe(self) -> str:
        from opsctl.drain import human_s

        out = self.projected_outage_s
        if out is None:
            cost = "start time unknown (no start in the journal)"
        elif self.time_scale:
            cost = (f"~{human_s(out)} of outage at the site's scale ({human_s(self.start_s)} per start; "
                    f"{human_s(out / self.time_scale)} in the lab, time scale {self.time_scale:g})")
        else:
            cost = f"~{human_s(out)} of outage ({human_s(self.start_s)} per start, the last start's)"
        return (f"{self.restarts} restart(s) of SGLang (each trial and the restore): {cost}, plus up to "
                f"{human_s(self.drain_deadline_s)} of drain before each")


def restart_plan(inventory, budgets: list[int], *, schedule_trial: bool = True, limit: str | None = None) -> RestartPlan:
    """How many restarts `tune` makes (each budget, the schedule trial when it runs, the restore)
    and the projected outage from the last start's seconds in the host's journal."""
    from opsctl import startup
    from opsctl.flow.bench import drain_deadline_s
    from opsctl.flow.steps import as_inventory
    from opsctl.host import facts
    from opsctl.host.connection import connect

    inv = as_inventory(inventory)
    host = inv.single(limit)
    restarts = len(budgets) + (1 if schedule_trial and len(budgets) > 1 else 0) + 1
    conn = connect(host)
    try:
        start_s = scale = None
        began = facts.get(conn, facts.ServiceStartEpoch(host.unit_name))
        if began is not None:
            try:
                st = startup.parse(facts.get(conn, facts.JournalWindow(host.unit_name, began - 5)))
                start_s, scale = st.total_s, st.time_scale
            except (OpsctlError, IndexError, ValueError):
                pass
        deadline = drain_deadline_s(conn, host)
    finally:
        conn.close()
    return RestartPlan(restarts, start_s, scale, deadline)


def tune(inventory, budgets: list[int], *, concurrency: list[int] | None = None, workload: str | None = None,
         limit: str | None = None, profile_name: str = "ddtree", progress: Callable[[dict], None] | None = None,
         report_dir: Path | None = None, schedule_trial: bool = True) -> TuneResult:
    from opsctl.gate.workloads import WorkloadSet, parse_mix
    from opsctl.flow.bench import load_baseline, require_baseline
    from opsctl.gate.measure import measure
    from opsctl.flow.deploy import deploy_one
    from opsctl.flow.promote import fallback_release
    from opsctl.flow.ready import wait_ready
    from opsctl.flow.steps import Steps, as_inventory, noop
    from opsctl.flow.bench import drain_deadline_s
    from opsctl.flow.switch import back_in_pool, switch_drained, disarm_guard, drain_before_switch, switch
    from opsctl.host.connection import connect
    from opsctl.releases import read_state, release_profile
    from opsctl.ledger import append_ledger
    from opsctl.lock import HostLock

    inv = as_inventory(inventory)
    host = inv.single(limit)
    profiles = {b: host.profile(profile_name, b) for b in budgets}  # bad budgets before any host I/O
    # the graphs' batch sizes do not depend on the budget: where the schedule's bands may start
    capture_bs = next(iter(profiles.values())).captured_batch_sizes if profiles else None
    # the profile's accept-length floor (one per profile name, whatever the budget) judges every trial
    policy = host.gate_policy(next(iter(profiles.values()), None))
    update: dict[str, Any] = {}
    if concurrency:
        update["concurrency"] = sorted(set(concurrency))
    if workload:
        update["workloads"] = parse_mix(workload)
    policy = policy.model_copy(update=update)
    WorkloadSet.load(policy.workloads)
    emit = progress or noop
    steps = Steps(progress, host.name)
    levels = list(policy.concurrency)

    conn = connect(host)
    try:
        require_baseline(conn, host, policy)
        baseline = load_baseline(conn, host, policy)
        state = read_state(conn, host)
        restore = state.current if state.current and state.judged(state.current) else \
            fallback_release(state, host, exclude=None)
        if restore is None:
            raise ConfigError(f"{host.name} serves no judged release to come back to",
                              f"deploy the baseline first: opsctl deploy {host.baseline_profile}")
    finally:
        conn.close()
    base_tok = {c: sum(x.output_throughput for x in baseline.at(c)) / max(len(baseline.at(c)), 1) for c in levels}
    trials: list[TrialResult] = []
    interrupted: Interrupted | None = None
    restore_gap: dict | None = None

    def run_trial(profile, label: str, budget: int, schedule: str | None) -> None:
        timing = {"bench_s": 0.0}

        def bench(conn, host_, plan, steps_):
            tb = time.monotonic()
            t0 = steps_.start("bench", f"trial {label}: levels {','.join(map(str, levels))}")
            run = measure(conn, host_, policy, baseline=baseline, spec=host_.analysis(plan.profile, policy),
                          meta={"release": plan.release, "profile": plan.profile.label, "trial": True})
            res = _level_results(run, baseline, levels, policy.confidence)
            steps_.done("bench", t0, ", ".join(f"C={c}: {r.tok_s:.1f} tok/s" for c, r in res.items()))
            timing["bench_s"] = time.monotonic() - tb
            return {"levels": res, "summary": {str(c): round(r.tok_s, 1) for c, r in res.items()}}

        t_trial = time.monotonic()
        try:
            out = deploy_one(inv, host, profile, dry_run=False, gates=True, pre_checks=False,
                             progress=progress, confirm=None, trial=bench)
            trials.append(TrialResult(budget, out.release, "measured", out.details["trial"]["levels"],
                                      time.monotonic() - t_trial - timing["bench_s"], timing["bench_s"],
                                      schedule=schedule, gap=out.details.get("gap")))
        except Interrupted:
            raise
        except OpsctlError as exc:  # the trial rolled itself back; the tune goes on
            trials.append(TrialResult(budget, None, f"failed: {exc.problem}", deploy_s=time.monotonic() - t_trial,
                                      schedule=schedule))

    with BRAKE.engaged(on_note=lambda m: emit({"event": "note", "host": "opsctl", "message": m})):
        try:
            for b in budgets:
                if should_stop(trials):
                    trials.append(TrialResult(b, None, "skipped (throughput fell at every level for two budgets "
                                                       "in a row)"))
                    continue
                run_trial(profiles[b], f"budget {b}", b, None)
            sched = schedule_text(best_per_level(trials, levels), capture_bs)
            if schedule_trial and _worth_a_trial(sched):
                try:
                    sched_profile = host.profile(profile_name, budget_schedule=sched)
                except ConfigError as exc:  # e.g. a level that is not a captured batch size
                    trials.append(TrialResult(0, None, f"skipped: {exc.problem}", schedule=sched))
                else:
                    run_trial(sched_profile, f"schedule {sched}", sched_profile.budget or 0, sched)
        except Interrupted as exc:
            interrupted = exc
        finally:
            t_restore = time.monotonic()
            with BRAKE.shielded(f"restoring {restore}, which served before the tune"):
                conn = connect(host)
                try:
                    with HostLock(conn, host, "tune restore"):
                        now = read_state(conn, host)
                        disarm_guard(conn, host)
                        if now.current != restore or now.service.get("ActiveState") != "active":
                            gap = drain_before_switch(conn, host, why="restore", from_release=now.current,
                                                      to_release=restore, deadline_s=drain_deadline_s(conn, host),
                                                      steps=steps)
                            t0 = steps.start("restore", f"{now.current or 'none'} -> {restore}")
                            since = switch_drained(conn, host, restore, gap, switch)
                            wait_ready(conn, host, release_profile(now.releases.get(restore), host), since, steps)
                            restore_gap = back_in_pool(conn, host, gap, since, steps)
                            steps.done("restore", t0, f"{restore} serves again")
                        append_ledger(conn, host, {"action": "tune", "result": "interrupted" if interrupted else "ok",
                                                   "to_release": None, "restored": restore,
                                                   "budgets": budgets, "levels": levels,
                                                   "trials": [t.as_dict() for t in trials]})
                finally:
                    conn.close()
            restore_s = time.monotonic() - t_restore
    if interrupted is not None:
        raise Interrupted(f"{interrupted.problem} during the tune: {restore} (what served before) serves again",
                          "run the tune again when ready", signal_name=interrupted.signal_name)
    best = best_per_level(trials, levels)
    rec, reason = recommend(trials, levels, base_tok)
    result = TuneResult(host.name, profile_name, levels, base_tok, trials, best, schedule_text(best, capture_bs),
                        rec.budget if rec is not None and not rec.schedule else None, reason,
                        recommended_schedule=rec.schedule if rec is not None else None,
                        restored=restore, restore_s=restore_s, restore_gap=restore_gap)
    if report_dir is not None:
        result.report = write_tune_report(result, report_dir)
    return result


def write_tune_report(result: TuneResult, out_dir: Path) -> dict[str, str]:
    """tok/s against concurrency, one line per budget and the baseline, each budget with its
    confidence band (the speedup interval times the baseline), as a PNG; and the JSON."""
    import json

    import matplotlib
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    out_dir.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(9.0, 4.5), dpi=100)
    ax = fig.subplots()
    xs = result.levels
    ax.plot(xs, [result.baseline_tok_s.get(c, 0) for c in xs], "s--", color="0.4", label="baseline")
    for t in result.trials:
        if t.status != "measured":
            continue
        cs = [c for c in xs if c in t.levels]
        line = ax.plot(cs, [t.levels[c].tok_s for c in cs], "D-" if t.schedule else "o-", label=t.label)[0]
        lo = [result.baseline_tok_s.get(c, 0) * (t.levels[c].low or 0) for c in cs]
        hi = [result.baseline_tok_s.get(c, 0) * (t.levels[c].high or 0) for c in cs]
        ax.fill_between(cs, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(xs))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"tune {result.profile} on {result.host}: schedule {result.schedule}")
    fig.tight_layout()
    png = out_dir / "tune.png"
    fig.savefig(png, format="png")
    js = out_dir / "tune.json"
    js.write_text(json.dumps(result.as_dict(), indent=1, default=str) + "\n")
    return {"png": str(png), "json": str(js)}
