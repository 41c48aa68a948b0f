"""`opsctl tune ddtree`: find the DDTree budget that wins at each concurrency, or prove
none does, on the host's own traffic, and leave the host as it was (or serving the winner).

**One restart** (the default, issue #37): one **trial release** captures every candidate at one
start — each budget of `--budgets` and every budget schedule the per-level winners could build
(`plausible_schedules`) — as the runtime's trial set (opsctl/trialset.py). It is deployed once (the
normal plan/stage/switch/ready/validate path, the guard armed); then, for each candidate in turn,
its control file names it, warm-up requests run until `/server_info` says it serves
(opsctl/trialswitch.py), and the same bench as a restart-per-trial tune measures it over the
concurrency sweep on the gate's workload mix against the stored baseline (opsctl/gate/measure.measure:
rounds until each level's speedup interval is decided, or the cap).

**One restart per trial** (`--restart-per-trial`, today's way, and the fallback when the trials
cannot share one server: `share_problem`): each budget is its own trial release.

Trials are marked `trial` in the ledger and never become "last good". Early stop: budgets are
tried in increasing order; once throughput fell from one budget to the next at every level, twice
in a row, larger budgets are skipped. Then the budget schedule built from the best budget per
level (`1:16,8:4,32:0`) is measured as one more trial (when it has more than one band and any band
speculates): switched to live when the trial release captured it, else on its own restart.

Afterwards (`TunePlan.after`): the release that served before is restored — always after an error,
a failed gate or Ctrl-C, and whenever nothing beats the baseline; `--apply` gates the
recommendation and, when it is live already (a candidate of the trial release), promotes the
release serving it with no restart: its control file, outside the release, keeps the winner across
later restarts, and the ledger records it (`ddtree_active`); `--apply --lean` deploys the
recommendation's own release (one restart, the trial set's memory back); `opsctl.tune.restore:
keep-trial` leaves the trial release serving the recommendation, unjudged.

Every restart is a switch record in the ledger (`gap_s`, and in the lab `time_scale`):
`RestartPlan` says before the start how many and what outage they project at the host's last
start-up time; the result counts them after.

Pure parts (best per level, the budget schedule, the plausible schedules, the recommendation, the
plan) work on plain data and are unit tested; `tune()` runs the decisions against a `TuneHost`
(`SshTuneHost`: the deploy flow over SSH; the tests' doubles measure nothing real).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from opsctl.brake import BRAKE, Interrupted
from opsctl.errors import ConfigError, DeployFailed, OpsctlError

ONE_RESTART = "one-restart"
RESTART_PER_TRIAL = "restart-per-trial"
# a trial set lists every plausible schedule (the runtime refuses a control file naming one it did
# not capture); they cost no graphs beyond width 1 (their bands reuse the budgets' widths), but the
# runtime's start-up lines list them all, and journald splits a line past 48 KiB (its LineMax): 1024
# schedules of up to ~26 characters stay under it. Past this many, the schedule takes its own restart
MAX_TRIAL_SCHEDULES = 1024
_MAX_SCHEDULE_MAPPINGS = 200_000   # (budgets + 1) ** levels best-per-level tables enumerated at most


@dataclass
class LevelResult:
    concurrency: int
    tok_s: float                 # mean output tok/s of the level's rounds
    speedup: float | None        # vs the baseline, ratio of mean per-request rates
    low: float | None            # confidence interval of the speedup
    high: float | None
    requests: int = 0
    # opsctl diagnose's numbers for this trial at this level (a single-budget trial with a baseline)
    accept: float | None = None
    step_ratio: float | None = None   # = the accept length needed to break even
    why: str | None = None            # a losing level's top cause and its share, e.g. "verify_compute 99 %"
    decode_tok_s: float | None = None  # decode throughput (C x accept / step), what diagnose predicts


@dataclass
class TrialResult:
    budget: int                  # a schedule trial: its largest band budget
    release: str | None
    status: str                  # measured | failed: <why> | skipped (early stop) | interrupted
    levels: dict[int, LevelResult] = field(default_factory=dict)
    deploy_s: float = 0.0        # its own restart: plan, stage, switch, ready, validate; switched live: the switch
    bench_s: float = 0.0
    schedule: str | None = None  # a budget-schedule trial ("1:16,8:4,32:0")
    gap: dict | None = None      # the serving gap of the restart this trial made (opsctl.drain.Gap.record)
    live_switch: dict | None = None  # switched to live on the shared trial release (opsctl.trialswitch.Switched)

    @property
    def label(self) -> str:
        return f"schedule {self.schedule}" if self.schedule else f"budget {self.budget}"

    @property
    def candidate(self) -> str:
        """The runtime's name of what this trial served: `16`, or the schedule."""
        return self.schedule or str(self.budget)

    def as_dict(self) -> dict:
        return {"budget": self.budget, "schedule": self.schedule, "release": self.release, "status": self.status,
                "deploy_s": round(self.deploy_s, 1), "bench_s": round(self.bench_s, 1),
                "levels": {str(c): vars(lv) for c, lv in self.levels.items()}, "gap": self.gap,
                "live_switch": self.live_switch}


def site_s(rec: dict) -> float | None:
    """A switch record's gap at the site's scale: the record's own `site` figures (the start as
    the lab's emulator modelled it, opsctl.drain.site_figures); a real host's gap is the site's."""
    if rec.get("site"):
        return rec["site"].get("gap_s")
    gap = rec.get("gap_s")
    return None if gap is None else gap * (rec.get("time_scale") or 1.0)


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
    restored: str | None = None  # what served before the tune, when it serves again
    restore_s: float = 0.0
    report: dict[str, str] = field(default_factory=dict)
    restore_gap: dict | None = None
    mode: str = ONE_RESTART
    after: str = "restored"      # restored | applied-live | deployed | kept-trial
    serving: str | None = None   # the release live at the end
    serving_candidate: str | None = None  # what a trial release serves at the end (its control file)
    applied: dict | None = None  # --apply's outcome (verdict, the deploy's outcome)
    switches: list[dict] = field(default_factory=list)  # every switch record the tune left in the ledger
    planned_restarts: int | None = None
    notes: list[str] = field(default_factory=list)
    # opsctl diagnose's recorded predictions against this tune's decode tok/s (prediction_check)
    prediction_check: dict | None = None

    @property
    def gaps(self) -> list[dict]:
        """Every switch (restart) the tune made: the ledger's switch records since it began; without
        them (a ledger not read) the trials' and the restore's."""
        if self.switches:
            return self.switches
        return [g for g in [*(t.gap for t in self.trials), self.restore_gap] if g]

    @property
    def restarts(self) -> int:
        return len(self.gaps)

    @property
    def outage_s(self) -> float:
        return round(sum(g.get("gap_s") or 0 for g in self.gaps), 2)

    @property
    def outage_site_s(self) -> float | None:
        """The outage at the site's scale; None on a real host (its seconds are the site's)."""
        if not any(g.get("time_scale") for g in self.gaps):
            return None
        return round(sum(site_s(g) or 0 for g in self.gaps), 1)

    def as_dict(self) -> dict:
        return {"host": self.host, "profile": self.profile, "mode": self.mode, "levels": self.levels,
                "baseline_tok_s": self.baseline_tok_s, "trials": [t.as_dict() for t in self.trials],
                "best": self.best, "schedule": self.schedule, "recommendation": self.recommendation,
                "recommended_schedule": self.recommended_schedule,
                "reason": self.reason, "after": self.after, "restored": self.restored,
                "serving": self.serving, "serving_candidate": self.serving_candidate, "applied": self.applied,
                "restore_s": round(self.restore_s, 1), "report": self.report, "restore_gap": self.restore_gap,
                "restarts": {"planned": self.planned_restarts, "measured": self.restarts,
                             "by_why": count_by_why(self.gaps)},
                "outage_s": self.outage_s, "outage_site_s": self.outage_site_s, "switches": self.gaps,
                "notes": self.notes, "prediction_check": self.prediction_check}


def count_by_why(gaps: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in gaps:
        out[g.get("why") or "?"] = out.get(g.get("why") or "?", 0) + 1
    return out


def parse_budgets(text: str) -> list[int]:
    try:
        budgets = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"--budgets {text!r}: not a list of integers", "e.g. --budgets 4,8,16,32") from None
    if not budgets:
        raise ConfigError(f"--budgets {text!r}: no budgets", "e.g. --budgets 4,8,16,32")
    # the range is the profile's, checked by plan_tune with the line --budget N gets (issue #49)
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
    """The budget schedule the best budget per level makes (opsctl.schedule.schedule_from_best)."""
    from opsctl.schedule import schedule_from_best

    return schedule_from_best(best, capture_bs)


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


def _level_results(run, baseline, levels: list[int], confidence: float, *, budget: int | None = None,
                   reference: dict[int, float] | None = None) -> dict[int, LevelResult]:
    from opsctl.gate import interval as cf

    diag = _diagnosis_rows(run, baseline, budget, reference)
    out = {}
    for c in levels:
        lv = run.at(c)
        if not lv:
            continue
        iv = cf.speedup_interval(cf.rates(cf.samples_of(lv)), cf.rates(cf.samples_of(baseline.at(c))),
                                 confidence=confidence)
        out[c] = LevelResult(c, sum(x.output_throughput for x in lv) / len(lv), iv.ratio if iv else None,
                             iv.low if iv else None, iv.high if iv else None,
                             len(cf.samples_of(lv)), **diag.get(c, {}))
    return out


def _label_budget(label: str) -> int | None:
    """A single-budget trial's budget from its label (`budget 16`, or the candidate name `16`)."""
    text = str(label).removeprefix("budget ").strip()
    return int(text) if text.isdigit() else None


def _diagnosis_rows(run, baseline, budget: int | None, reference: dict[int, float] | None) -> dict[int, dict]:
    """Per level: accept, step ratio and a losing level's top cause (opsctl/diagnose.py)."""
    if not budget:
        return {}
    from opsctl import diagnose as dx

    try:
        d = dx.from_runs(run, baseline, budget=budget, reference=reference)
    except (OpsctlError, ValueError, ZeroDivisionError):
        return {}
    out = {}
    for r in d["levels"]:
        if "step_ratio" not in r:
            continue
        top = r["causes"][0] if r["causes"] else None
        out[r["concurrency"]] = {"accept": r["accept"], "step_ratio": r["step_ratio"],
                                 "why": f"{top['kind']} {top['share'] * 100:.0f} %" if top else None,
                                 "decode_tok_s": r["decode_tok_s"]}
    return out



def plausible_schedules(levels: list[int], budgets: list[int], capture_bs: list[int] | None, *,
                        allow_torch_beam: bool = False) -> list[str] | None:
    """Every schedule `schedule_text` can build from a best-per-level table over these levels and
    budgets (0 = the baseline wins there), worth a trial of its own (more than one band, some band
    speculates) and accepted by the server (each band holds a captured batch size), in a stable
    order. They use only the budgets' widths (plus width 1 for a budget-0 band), so capturing them
    beside the budgets costs no new width. None when there are more than MAX_TRIAL_SCHEDULES (or too
    many tables to enumerate): the built schedule then takes a restart of its own."""
    from opsctl import schedule as schedule_mod

    levels = sorted(set(levels))
    choices = [0, *sorted(set(budgets))]
    if len(choices) ** len(levels) > _MAX_SCHEDULE_MAPPINGS:
        return None
    out: list[str] = []
    seen: set[str] = set()
    for combo in itertools.product(choices, repeat=len(levels)):
        text = schedule_text(dict(zip(levels, combo)), capture_bs)
        if text in seen or not _worth_a_trial(text):
            continue
        seen.add(text)
        if capture_bs:
            try:
                schedule_mod.check_for_server(schedule_mod.parse(text), capture_bs=capture_bs,
                                              allow_torch_beam=allow_torch_beam)
            except ConfigError:
                continue
        out.append(text)
        if len(out) > MAX_TRIAL_SCHEDULES:
            return None
    return out


# fields of a profile that do not change the server a trial set can share: what differs between its candidates
_TRIAL_FIELDS = {"budget", "budget_schedule", "trial_set", "description"}


def share_problem(host, profiles: dict) -> str | None:
    """Why these one-budget trials cannot share one server (their trial release), or None. They must
    run the same server but for the budget (TP/EP/DP size, drafter block, attention backend, memory,
    graphs, SGLang flags, environment: one start); and nothing of the inventory may set what the
    trial release sets itself (the runtime refuses a schedule file beside a trial set, and the trial
    set's widest width is --speculative-num-draft-tokens)."""
    from opsctl import trialset
    from opsctl.schedule import SCHEDULE_ENV

    items = sorted(profiles.items())
    if not items:
        return None
    b0, p0 = items[0]
    base = p0.model_dump(mode="json", exclude=_TRIAL_FIELDS)
    for b, p in items[1:]:
        other = p.model_dump(mode="json", exclude=_TRIAL_FIELDS)
        for key in sorted(base):
            if base[key] != other.get(key):
                return (f"budget {b0} and budget {b} run different servers ({key}: {base[key]!r} vs "
                        f"{other.get(key)!r}), and one start captures one server")
    env = {**host.settings.extra_env, **p0.env}
    for key in (SCHEDULE_ENV, trialset.TRIAL_SET_ENV, trialset.CONTROL_ENV):
        if key in env:
            return (f"the inventory sets {key} (opsctl.extra_env or the profile's env), which a trial release "
                    "sets itself (the runtime refuses a schedule file beside a trial set)")
    for flag in ("--speculative-num-draft-tokens", "--speculative-algorithm"):
        if any(a == flag or a.startswith(flag + "=") for a in p0.extra_args):
            return (f"the profile's extra_args set {flag}, which a trial release sizes for its widest candidate "
                    "(the largest budget + 1)")
    return None


@dataclass
class TunePlan:
    """What a tune will do, decided before it touches the host (every bad input fails here)."""

    host: Any                      # HostConfig
    profile_name: str
    budgets: list[int]
    policy: Any                    # the gate policy the trials are measured with (levels, workload mix)
    profiles: dict[int, Any]       # budget -> its one-budget Profile
    capture_bs: list[int]
    mode: str                      # ONE_RESTART | RESTART_PER_TRIAL
    mode_reason: str | None        # why one restart per trial: asked for, or the trials cannot share a server
    schedule_trial: bool
    schedules: list[str]           # what the built schedule can be (ONE_RESTART: captured by the trial release)
    schedule_restart_reason: str | None  # ONE_RESTART: why the built schedule takes its own restart
    trial_profile: Any | None      # ONE_RESTART: the trial release's Profile (its trial_set)
    after: str                     # restore | apply | apply-lean | keep-trial
    switch_timeout_s: float

    @property
    def levels(self) -> list[int]:
        return list(self.policy.concurrency)

    @property
    def candidates(self) -> tuple[str, ...]:
        return tuple(self.trial_profile.trial_set) if self.trial_profile is not None else ()

    @property
    def control_file(self) -> str | None:
        from opsctl.trialset import control_path

        return str(control_path(self.host.install_root, self.candidates)) if self.candidates else None

    @property
    def schedule_possible(self) -> bool:
        return self.schedule_trial and (bool(self.schedules) or self.schedule_restart_reason is not None)

    @property
    def trial_restarts(self) -> int:
        if self.mode == ONE_RESTART:
            return 1 + (1 if self.schedule_trial and self.schedule_restart_reason else 0)
        return len(self.budgets) + (1 if self.schedule_possible else 0)

    @property
    def after_restarts(self) -> int:
        """After the trials, when the recommendation is what `after` keeps (or the restore)."""
        if self.after == "restore" or self.after == "apply-lean":
            return 1
        # the winner is live on the trial release: --apply promotes it, keep-trial leaves it there; one
        # restart per trial leaves only the last trial live, so the winner is usually deployed (or restored)
        return 0 if self.mode == ONE_RESTART else 1

    @property
    def after_restarts_max(self) -> int:
        """At most: a restore when nothing wins or the gate fails (a failed deploy's own rollback too)."""
        if self.after == "restore":
            return 1
        return 2 if (self.after == "apply-lean" or (self.after == "apply" and self.mode != ONE_RESTART)) else 1

    def describe_trials(self) -> str:
        from opsctl import trialset

        if self.mode == ONE_RESTART:
            assert self.trial_profile is not None
            text = (f"one trial release captures {trialset.describe(self.candidates)} at one start and switches "
                    f"between them live")
            if self.schedule_trial and self.schedule_restart_reason:
                text += f"; the schedule built from the winners takes its own restart: {self.schedule_restart_reason}"
            return text
        return "one per budget" + (" and one for the schedule built from the winners" if self.schedule_possible
                                   else "")

    def describe_after(self) -> str:
        if self.after == "restore":
            return "to restore the release that served before"
        if self.after == "apply-lean":
            return "--apply --lean deploys the recommendation's own release (the trial set's memory back)"
        if self.after == "apply":
            return ("--apply gates the recommendation live on the trial release and promotes it" if
                    self.mode == ONE_RESTART else "--apply deploys the recommendation (none when it is the last trial, "
                                                  "still live)")
        return ("opsctl.tune.restore keep-trial leaves the trial release serving the recommendation" if
                self.mode == ONE_RESTART else "to restore (opsctl.tune.restore keep-trial keeps only a winner that "
                                              "is still live: the last trial)")

    def as_dict(self) -> dict:
        return {"mode": self.mode, "mode_reason": self.mode_reason, "budgets": self.budgets, "levels": self.levels,
                "candidates": list(self.candidates), "control_file": self.control_file,
                "schedules": len(self.schedules), "schedule_restart_reason": self.schedule_restart_reason,
                "after": self.after, "trial_restarts": self.trial_restarts, "after_restarts": self.after_restarts,
                "after_restarts_max": self.after_restarts_max}


def _widths(candidates) -> list[int]:
    from opsctl.trialset import budgets_of

    return sorted({b + 1 for c in candidates for b in budgets_of(c)}, reverse=True)


def plan_tune(inventory, budgets: list[int], *, concurrency: list[int] | None = None, workload: str | None = None,
              limit: str | None = None, profile_name: str = "ddtree", schedule_trial: bool = True,
              restart_per_trial: bool = False, apply: bool = False, lean: bool = False) -> TunePlan:
    """The tune's plan from the inventory and the flags; ConfigError (nothing touched) on bad input."""
    from opsctl.gate.workloads import WorkloadSet, parse_mix
    from opsctl.flow.steps import as_inventory

    if lean and not apply:
        raise ConfigError("--lean applies only with --apply", "add --apply, or drop --lean")
    if not budgets:
        raise ConfigError("no budgets to tune", "e.g. --budgets 4,8,16,32")
    inv = as_inventory(inventory)
    host = inv.single(limit)
    profiles = {}
    for b in budgets:  # bad budgets before any host I/O, refused with --budget N's own line
        try:
            profiles[b] = host.profile(profile_name, b)
        except ConfigError as exc:
            flag = f"--budget {b}:"
            if not exc.problem.startswith(flag):
                raise
            raise ConfigError(f"--budgets {','.join(map(str, budgets))}:" + exc.problem[len(flag):],
                              exc.fix) from None
    first = profiles[budgets[0]]
    # the graphs' batch sizes do not depend on the budget: where the schedule's bands may start
    capture_bs = first.captured_batch_sizes
    # the profile's accept-length floor (one per profile name, whatever the budget) judges every trial
    policy = host.gate_policy(first)
    update: dict[str, Any] = {}
    if concurrency:
        update["concurrency"] = sorted(set(concurrency))
    if workload:
        update["workloads"] = parse_mix(workload)
    policy = policy.model_copy(update=update)
    WorkloadSet.load(policy.workloads)
    levels = list(policy.concurrency)
    after = ("apply-lean" if lean else "apply" if apply else
             "keep-trial" if host.settings.tune.restore == "keep-trial" else "restore")
    schedules = plausible_schedules(levels, budgets, capture_bs, allow_torch_beam=first.tree_torch_fallback) \
        if schedule_trial else []
    sched_reason = None
    if schedules is None:
        sched_reason = (f"more than {MAX_TRIAL_SCHEDULES} schedules can be built from {len(budgets)} budget(s) at "
                        f"{len(levels)} levels, too many to capture beside them")
        schedules = []
    problem = None if restart_per_trial else share_problem(host, profiles)
    # one budget and no schedule to build: its own release is the one trial, a trial set would add nothing
    alone = len(budgets) == 1 and not schedules and not sched_reason
    mode = RESTART_PER_TRIAL if restart_per_trial or problem or alone else ONE_RESTART
    mode_reason = ("--restart-per-trial" if restart_per_trial else
                   f"the trials cannot share one server: {problem}" if problem else
                   f"one candidate (budget {budgets[0]}): its own release is the trial" if alone else None)
    trial_profile = None
    if mode == ONE_RESTART:
        # the candidates other than the first (active at start) capture only the batch sizes the levels reach
        trial_profile = host.profile(profile_name, trial_set=[str(b) for b in budgets] + schedules,
                                     trial_bs=levels)
    else:
        sched_reason = None   # each trial restarts anyway
    return TunePlan(host, profile_name, list(budgets), policy, profiles, capture_bs, mode, mode_reason, schedule_trial,
                    schedules, sched_reason, trial_profile, after, host.settings.tune.switch_timeout_s)


@dataclass
class RestartPlan:
    """What a tune will cost in restarts, before it starts (issues #35, #37): the trials' restarts and
    those after them (the restore, a lean deploy), each projected at the last start's seconds (the
    journal, opsctl.startup)."""

    restarts: int                  # when the recommendation is what `after` keeps
    start_s: float | None          # the last start, at the site's scale in the lab (its emulator's figure)
    time_scale: float | None       # the lab's; None on a real host
    drain_deadline_s: float
    trial_restarts: int = 0
    after_restarts: int = 0
    restarts_max: int = 0          # with a restore when nothing wins or the gate fails
    mode: str = RESTART_PER_TRIAL
    mode_reason: str | None = None
    trials: str = ""               # TunePlan.describe_trials
    after: str = ""                # TunePlan.describe_after
    widths: list[int] = field(default_factory=list)  # the trial release's verify widths (ONE_RESTART)
    # each restart's projected start, in order (trials, then after them), from the phases of the
    # starts on record (project_start); empty: every restart is projected at the last start's start_s
    starts: list[float] = field(default_factory=list)
    stop_s: float = 0.0            # the last switch's stop (a process exit: real time, not scaled)
    projection: str = ""           # how the starts were projected, in words

    @property
    def projected_outage_s(self) -> float | None:
        if self.starts and len(self.starts) == self.restarts:
            return round(sum(self.starts) + self.restarts * self.stop_s, 1)
        return round(self.restarts * self.start_s, 1) if self.start_s is not None else None

    def as_dict(self) -> dict:
        lab = (round(self.projected_outage_s / self.time_scale, 2)
               if self.time_scale and self.projected_outage_s is not None else None)
        return {"restarts": self.restarts, "restarts_max": max(self.restarts_max, self.restarts),
                "trial_restarts": self.trial_restarts, "after_restarts": self.after_restarts, "mode": self.mode,
                "mode_reason": self.mode_reason, "start_s": self.start_s, "time_scale": self.time_scale,
                "projected_outage_s": self.projected_outage_s, "projected_outage_lab_s": lab,
                "projected_starts_s": self.starts, "projected_stop_s": self.stop_s, "projection": self.projection,
                "drain_deadline_s": self.drain_deadline_s, "trial_widths": self.widths}

    def describe(self) -> str:
        from opsctl.drain import human_s

        out = self.projected_outage_s
        if out is None:
            cost = "start time unknown (no start in the journal)"
        elif self.starts and len(self.starts) == self.restarts:
            each = " + ".join(human_s(x) for x in self.starts)
            lab = (f"; {human_s(out / self.time_scale)} in the lab, time scale {self.time_scale:g}"
                   if self.time_scale else "")
            where = " at the site's scale" if self.time_scale else ""
            cost = f"~{human_s(out)} of outage{where} (starts {each}, {self.projection}{lab})"
        elif self.time_scale:
            cost = (f"~{human_s(out)} of outage at the site's scale ({human_s(self.start_s)} per start; "
                    f"{human_s(out / self.time_scale)} in the lab, time scale {self.time_scale:g})")
        else:
            cost = f"~{human_s(out)} of outage ({human_s(self.start_s)} per start, the last start's)"
        parts = f"{self.trial_restarts} for the trials"
        if self.trials:
            parts += f" ({self.trials})"
        parts += f", {self.after_restarts} after them" + (f" ({self.after})" if self.after else "")
        line = (f"{self.restarts} restart(s) of SGLang — {parts}: {cost}, plus up to "
                f"{human_s(self.drain_deadline_s)} of drain before each")
        if self.restarts_max > self.restarts:
            line += (f"; up to {self.restarts_max} if nothing beats the baseline or the gate fails "
                     f"(the restore)")
        if self.widths and len(self.widths) > 1:
            line += (f". The trial release captures {len(self.widths)} verify widths "
                     f"({', '.join(map(str, self.widths))}): its start takes longer than a one-budget start")
        return line


def restart_plan(inventory, plan: TunePlan) -> RestartPlan:
    """How many restarts `tune` makes (TunePlan) and the projected outage from the last start's
    seconds in the host's journal."""
    from opsctl import startup
    from opsctl.flow.bench import drain_deadline_s
    from opsctl.host import facts
    from opsctl.host.connection import connect

    host = plan.host
    conn = connect(host)
    try:
        start_s = scale = None
        last = None
        began = facts.get(conn, facts.ServiceStartEpoch(host.unit_name))
        if began is not None:
            try:
                last = startup.parse(facts.get(conn, facts.JournalWindow(host.unit_name, began - 5)))
                start_s, scale = last.total_s, last.time_scale
            except (OpsctlError, IndexError, ValueError):
                pass
        try:
            records, _ = facts.get(conn, facts.LedgerRecords(str(host.install_root)))
        except OpsctlError:
            records = []
        deadline = drain_deadline_s(conn, host)
    finally:
        conn.close()
    rp = plan_restarts(plan, start_s, scale, deadline)
    return project_restarts(rp, plan, last, list(records or []))


def _known_starts(last, ledger: list[dict]) -> list:
    """Every start on record, newest first: the live release's last start (the journal), then the
    ledger's switch records' starts (ready, with phases)."""
    from opsctl import startup

    out = [last] if last is not None and last.total_s else []
    for rec in reversed(ledger):
        st = rec.get("startup") if rec.get("action") == "switch" and rec.get("result") != "not-ready" else None
        if isinstance(st, dict) and st.get("total_s") and isinstance(st.get("phases"), list):
            out.append(startup.Startup.from_dict(st))
    return out


def _startup_part(key: str) -> bool:
    return key.startswith(("capture", "draft_capture", "compile budget"))


def project_start(known: list, widths: list[int], draft_budgets: list[int], *,
                  width_share: dict[int, float] | None = None, draft_share: dict[int, float] | None = None,
                  full_graphs: int | None = None) -> float | None:
    """A start that captures target graphs of `widths` and the drafter's for `draft_budgets` (each
    with its Triton compile), projected from the starts on record (newest first, issue #49: a tune's
    plan projected every restart at the last start's seconds, and its trial release, which captures
    every candidate's width, took twice that). The newest DDTree start gives what every start pays
    (weight load, warm-up, the rest); each width's capture is the newest capture of that width on
    record, else the nearest width's (a capture's cost is mostly its batch sizes); each draft budget's
    capture likewise; a compile only for a budget no start on record compiled (the cache keeps the
    kernels), at the nearest compiled budget's seconds. `width_share` / `draft_share`: the share of the
    capture list a width's (a draft budget's) graphs hold (a trial set with `trial_bs` captures fewer
    for the candidates not active; a capture's cost is its graphs). None without a DDTree start on record."""
    def speculative(st) -> bool:   # a verify graph is a DDTree start (records read before --all: no server_args)
        return st.ddtree or any(p.kind == "target verify" for p in st.phases)

    ref = next((st for st in known if speculative(st) and any(p.kind == "target verify" for p in st.phases)), None)
    if ref is None or ref.total_s is None:
        return None
    base = ref.total_s - sum(p.seconds or 0.0 for p in ref.phases if _startup_part(p.key))
    caps: dict[int, float] = {}
    drafts: dict[int, float] = {}
    compiled: dict[int, float] = {}
    def full(p) -> float:
        """A capture's seconds for the whole list (`full_graphs`) when its record says how many graphs
        it held (a schedule's band or a trial width may have held a few), else as recorded."""
        n = p.detail.get("graphs") if isinstance(p.detail, dict) else None
        return p.seconds * full_graphs / n if full_graphs and isinstance(n, int) and n > 0 else p.seconds

    for st in reversed(known):   # oldest first: the newest value wins
        for p in st.phases:
            if p.seconds is None:
                continue
            if p.kind in ("target verify", "target decode") and p.width is not None and speculative(st):
                caps[p.width] = full(p)
            elif p.key.startswith("draft_capture budget") and p.budget is not None:
                drafts[p.budget] = full(p)
            elif p.key.startswith("draft_capture") and speculative(st):   # one drafter capture for every budget
                drafts[0] = full(p)
            elif p.key.startswith("compile budget") and p.budget is not None:
                compiled[p.budget] = p.seconds

    def nearest(table: dict[int, float], x: int) -> float:
        keys = [k for k in table if k > 0] or list(table)
        return table[min(keys, key=lambda k: (abs(k - x), -k))] if keys else 0.0

    def capture(w: int) -> float:
        if w in caps or len(caps) < 2:
            return caps.get(w, nearest(caps, w))
        # two widths or more on record: the line through the two nearest (a capture's cost grows a
        # little with its tokens per request)
        a, b = sorted(caps, key=lambda k: (abs(k - w), k))[:2]
        return max(0.0, caps[a] + (caps[b] - caps[a]) * (w - a) / (b - a))

    def compile_s(b: int) -> float:
        # the head's compile grows with its budget: the nearest compiled budget's seconds, in proportion
        near = [k for k in compiled if k > 0]
        if not near:
            return 0.0
        k = min(near, key=lambda k: (abs(k - b), -k))
        return compiled[k] * b / k

    ws, ds = width_share or {}, draft_share or {}
    total = base + sum(capture(w) * ws.get(w, 1.0) for w in widths)
    total += sum((drafts[b] if b in drafts else nearest(drafts, b)) * ds.get(b, 1.0) for b in draft_budgets)
    total += sum(compile_s(b) for b in draft_budgets if b not in compiled)
    return round(total, 1)


def _trial_shares(plan: TunePlan) -> dict:
    """Each width's and draft budget's share of the capture list in the trial release (its
    candidates other than the first capture only what the levels reach: `trial_bs`)."""
    from opsctl import schedule as schedule_mod

    prof = plan.trial_profile
    bs = list(prof.captured_batch_sizes or []) if prof is not None else []
    if prof is None or not prof.trial_bs or not bs:
        return {}
    tp = schedule_mod.trial_plan(list(prof.trial_set), bs, active=prof.trial_set[0], trial_bs=list(prof.trial_bs))
    return {"width_share": {u.key: len(u.bs) / len(bs) for u in tp.widths},
            "draft_share": {u.key: len(u.bs) / len(bs) for u in tp.drafts}, "full_graphs": len(bs)}


def project_restarts(rp: RestartPlan, plan: TunePlan, last, ledger: list[dict]) -> RestartPlan:
    """`rp` with each restart's start projected (project_start): the trial release's (or each
    budget's), and after them the release that served (its last start, less the compiles its
    kernels no longer need) or the winner. Unchanged where no DDTree start is on record."""
    from opsctl import trialset

    known = _known_starts(last, ledger)
    if plan.mode == ONE_RESTART:
        one = project_start(known, _widths(plan.candidates), trialset.draft_budgets(plan.candidates),
                            **_trial_shares(plan))
        trials = [one] * plan.trial_restarts
    else:
        trials = [project_start(known, [b + 1], [b]) for b in plan.budgets]
        if plan.schedule_possible:
            trials.append(max((t for t in trials if t is not None), default=None))
    after: list = []
    if plan.after_restarts:
        if plan.after == "restore" and last is not None and last.total_s:
            # the restored release starts as it last did, without the compiles its first start made
            after = [round(last.total_s - sum(p.seconds or 0.0 for p in last.phases
                                               if p.key.startswith("compile budget")), 1)]
        else:
            done = [t for t in trials if t is not None]
            after = [round(sum(done) / len(done), 1)] if done else [None]
    starts = trials + after
    if not starts or any(x is None for x in starts) or len(starts) != rp.restarts:
        return rp
    stop = 0.0
    for rec in reversed(ledger):
        if rec.get("action") == "switch" and rec.get("stop_s") is not None:
            stop = float(rec["stop_s"])
            break
    rp.starts, rp.stop_s = [float(x) for x in starts], round(stop, 2)
    rp.projection = ("each start projected from its graphs and the phases of the starts on record, the stop "
                     f"{stop:g} s as the last switch's")
    return rp


def plan_restarts(plan: TunePlan, start_s: float | None, time_scale: float | None,
                  drain_deadline_s: float) -> RestartPlan:
    restarts = plan.trial_restarts + plan.after_restarts
    return RestartPlan(restarts, start_s, time_scale, drain_deadline_s, plan.trial_restarts, plan.after_restarts,
                       plan.trial_restarts + plan.after_restarts_max, plan.mode, plan.mode_reason,
                       plan.describe_trials(), plan.describe_after(),
                       _widths(plan.candidates) if plan.candidates else [])


# --------------------------------------------------------------------------- the run


class TuneHost(Protocol):
    """What a tune does to its host. SshTuneHost is the real one (the deploy flow over SSH); the unit
    tests drive tune's decisions with a double that measures a model instead of a server."""

    def prepare(self) -> tuple[str, dict[int, float]]:
        """The release to come back to and the baseline's tok/s per level (nothing changes)."""

    def now(self) -> float:
        """The controller's epoch seconds (switch records carry them)."""

    def deploy_trial(self, profile, while_live: Callable[[str], dict]) -> tuple[str, dict | None, dict]:
        """One restart: the normal plan/stage/switch/ready/validate path with `trial=`; `while_live(release)`
        runs while the trial release serves (deploy lock held, guard armed) and its dict comes back with
        the release and the switch's gap record. OpsctlError: the trial failed and was rolled back."""

    def switch_live(self, candidate: str) -> dict:
        """Inside while_live: the trial release's control file names `candidate`; returns once it serves
        (opsctl.trialswitch.Switched.as_dict). OpsctlError: refused, or not within the timeout."""

    def measure(self, label: str) -> dict[int, LevelResult]:
        """Inside while_live: the trial bench against the stored baseline."""

    def serving(self) -> bool:
        """Inside while_live: the trial release still answers /health_generate."""

    def apply_live(self, release: str, candidate: str | None, gate_profile, from_release: str) -> dict:
        """The gate (bench and judge) on the live `release` serving `candidate`, then its promotion: no
        restart. DeployFailed when the gate fails (the caller restores)."""

    def deploy(self, profile) -> dict:
        """The normal gated deploy of `profile` (one restart; its own rollback when a gate fails)."""

    def keep(self, release: str, candidate: str | None) -> None:
        """Leave `release` serving `candidate` (its control file), unjudged, the guard disarmed."""

    def finish(self, restore: str | None, record: dict) -> tuple[dict | None, float]:
        """Under the deploy lock: `restore` serves again when given (its switch's gap record, seconds),
        and the tune's ledger record."""

    def switches_since(self, began: float) -> list[dict]:
        """The ledger's switch records since `began` (each one restart)."""


@dataclass
class _Outcome:
    after: str                   # applied-live | deployed | kept-trial
    release: str
    candidate: str | None        # what a trial release serves (its control file)
    applied: dict | None = None


class _Run:
    """One tune's trials and what it leaves serving, decided here; the host work is the TuneHost's."""

    def __init__(self, ops: TuneHost, plan: TunePlan, note: Callable[[str], None]):
        self.ops, self.plan, self.note = ops, plan, note
        self.trials: list[TrialResult] = []
        self.notes: list[str] = []
        self.live: tuple[str, bool] | None = None   # (release, shared trial release) the last trial left live

    def say(self, message: str) -> None:
        self.notes.append(message)
        self.note(message)

    # -- the trials ----------------------------------------------------------
    def run_trials(self) -> None:
        if self.plan.mode == ONE_RESTART:
            self._shared()
        else:
            for b in self.plan.budgets:
                if self._stop_early(b):
                    continue
                self._own_restart(self.plan.profiles[b], b, None)
            sched = self._built_schedule()
            if sched is not None:
                self._schedule_own_restart(sched)

    def _stop_early(self, budget: int) -> bool:
        if should_stop(self.trials):
            self.trials.append(TrialResult(budget, None, "skipped (throughput fell at every level for two budgets "
                                                         "in a row)"))
            return True
        return False

    def _built_schedule(self) -> str | None:
        """The schedule from the best budget per level, when it is worth a trial and the server takes it."""
        from opsctl import schedule as schedule_mod

        if not self.plan.schedule_trial:
            return None
        sched = schedule_text(best_per_level(self.trials, self.plan.levels), self.plan.capture_bs)
        if not _worth_a_trial(sched):
            return None
        first = self.plan.profiles[self.plan.budgets[0]]
        try:  # e.g. a level that is not a captured batch size
            schedule_mod.check_for_server(schedule_mod.parse(sched), capture_bs=self.plan.capture_bs,
                                          allow_torch_beam=first.tree_torch_fallback)
        except ConfigError as exc:
            self.trials.append(TrialResult(0, None, f"skipped: {exc.problem}", schedule=sched))
            return None
        return sched

    def _schedule_own_restart(self, sched: str) -> None:
        try:
            profile = self.plan.host.profile(self.plan.profile_name, budget_schedule=sched)
        except ConfigError as exc:
            self.trials.append(TrialResult(0, None, f"skipped: {exc.problem}", schedule=sched))
            return
        self._own_restart(profile, profile.budget or 0, sched)

    def _own_restart(self, profile, budget: int, schedule: str | None) -> None:
        """A trial on its own release (one restart), measured while it serves."""
        label = f"schedule {schedule}" if schedule else f"budget {budget}"
        timing = {"bench_s": 0.0}

        def while_live(release: str) -> dict:
            tb = time.monotonic()
            levels = self.ops.measure(label)
            timing["bench_s"] = time.monotonic() - tb
            return {"levels": levels, "summary": {str(c): round(r.tok_s, 1) for c, r in levels.items()}}

        t = time.monotonic()
        try:
            release, gap, out = self.ops.deploy_trial(profile, while_live)
        except Interrupted:
            raise
        except OpsctlError as exc:  # the trial rolled itself back; the tune goes on
            self.live = None
            self.trials.append(TrialResult(budget, None, f"failed: {exc.problem}", deploy_s=time.monotonic() - t,
                                           schedule=schedule))
            return
        self.live = (release, False)
        self.trials.append(TrialResult(budget, release, "measured", out["levels"],
                                       time.monotonic() - t - timing["bench_s"], timing["bench_s"], schedule=schedule,
                                       gap=gap))

    def _shared(self) -> None:
        """ONE_RESTART: one deploy of the trial release; every candidate switched to live and measured."""
        from opsctl import schedule as schedule_mod

        plan = self.plan
        pending: list[str] = []
        mine: list[TrialResult] = []
        t_deploy = time.monotonic()

        def while_live(release: str) -> dict:
            self.live = (release, True)
            up_s = time.monotonic() - t_deploy   # plan, stage, switch, ready, validate: the first trial's
            for b in plan.budgets:
                if self._stop_early(b):
                    continue
                mine.append(self._switched(release, str(b), b, None, up_s if not mine else 0.0))
            sched = self._built_schedule()
            if sched is not None and sched in plan.candidates:
                mine.append(self._switched(release, sched, schedule_mod.parse(sched).max_budget, sched, 0.0))
            elif sched is not None:
                pending.append(sched)
            return {"summary": {t.candidate: ({str(c): round(r.tok_s, 1) for c, r in t.levels.items()}
                                              if t.status == "measured" else t.status) for t in mine}}

        try:
            release, gap, _ = self.ops.deploy_trial(plan.trial_profile, while_live)
        except Interrupted:
            raise
        except OpsctlError as exc:  # did not start or validate, or stopped serving: rolled back
            self.live = None
            done = {t.candidate for t in self.trials}
            for b in plan.budgets:
                if str(b) not in done:
                    self.trials.append(TrialResult(b, None, f"failed: {exc.problem}",
                                                   deploy_s=time.monotonic() - t_deploy))
            if not any(t.status == "measured" for t in self.trials):
                self.say("no candidate was measured on the trial release; 'opsctl tune --restart-per-trial' tries "
                         "each budget on a release of its own (less memory per start)")
            return
        if mine:
            mine[0].gap = gap   # the restart every candidate of the trial release shares
        for sched in pending:
            self.say(f"schedule {sched} is not among the trial release's candidates "
                     f"({plan.schedule_restart_reason or 'not captured'}): its trial takes its own restart")
            self._schedule_own_restart(sched)

    def _switched(self, release: str, candidate: str, budget: int, schedule: str | None, up_s: float) -> TrialResult:
        """One candidate of the live trial release: switch to it, then the trial bench."""
        label = f"schedule {schedule}" if schedule else f"budget {budget}"
        t = time.monotonic()
        try:
            sw = self.ops.switch_live(candidate)
        except Interrupted:
            raise
        except OpsctlError as exc:
            res = TrialResult(budget, release, f"failed: {exc.problem}", deploy_s=up_s + time.monotonic() - t,
                              schedule=schedule)
            self.trials.append(res)
            self._still_serving(label)
            return res
        tb = time.monotonic()
        try:
            levels = self.ops.measure(label)
        except Interrupted:
            raise
        except OpsctlError as exc:
            res = TrialResult(budget, release, f"failed: {exc.problem}", deploy_s=up_s + tb - t,
                              bench_s=time.monotonic() - tb, schedule=schedule, live_switch=sw)
            self.trials.append(res)
            self._still_serving(label)
            return res
        res = TrialResult(budget, release, "measured", levels, up_s + tb - t, time.monotonic() - tb,
                          schedule=schedule, live_switch=sw)
        self.trials.append(res)
        return res

    def _still_serving(self, label: str) -> None:
        """A candidate failed: the next ones go on unless the server itself is gone (then the trial
        release is rolled back, as a trial that fails to start)."""
        if not self.ops.serving():
            raise DeployFailed(f"the trial release stopped serving during the trial of {label}",
                               "see the server's journal ('opsctl status', journalctl -u the service)")

    # -- after the trials ----------------------------------------------------
    def gate_profile(self, rec: TrialResult):
        host, name = self.plan.host, self.plan.profile_name
        return host.profile(name, budget_schedule=rec.schedule) if rec.schedule else host.profile(name, rec.budget)

    def keep_or_apply(self, rec: TrialResult | None, restore: str) -> _Outcome | None:
        """What serves after the trials when it is not the restore (None: restore)."""
        after = self.plan.after
        if after == "restore":
            return None
        if rec is None:
            self.say(f"nothing beats the baseline: {restore} (what served before) serves again")
            return None
        live = self.live is not None and rec.release == self.live[0] and rec.status == "measured"
        shared = live and rec.live_switch is not None
        candidate = rec.candidate if shared else None
        if after == "keep-trial":
            if not live:
                self.say(f"opsctl.tune.restore is keep-trial, but {rec.label} is not live any more (only the last "
                         f"trial of a restart-per-trial tune is): {restore} serves again")
                return None
            try:
                self.ops.keep(rec.release, candidate)
            except Interrupted:
                raise
            except OpsctlError as exc:
                self.say(f"keeping {rec.release} serving {rec.label} failed: {exc.problem}: restoring {restore}")
                return None
            return _Outcome("kept-trial", rec.release, candidate)
        try:
            gate_profile = self.gate_profile(rec)
        except ConfigError as exc:
            self.say(f"--apply: {exc.problem}: restoring {restore}")
            return None
        if live and not (after == "apply-lean" and shared):
            # the recommendation serves already: the gate on it as it runs, then its promotion, no restart
            try:
                applied = self.ops.apply_live(rec.release, candidate, gate_profile, restore)
            except Interrupted:
                raise
            except OpsctlError as exc:
                self.say(f"--apply: {exc.problem}: restoring {restore}")
                return None
            return _Outcome("applied-live", rec.release, candidate, applied)
        try:
            out = self.ops.deploy(gate_profile)
        except Interrupted:
            raise
        except OpsctlError as exc:
            self.say(f"--apply: the deploy of {gate_profile.label} failed: {exc.problem}")
            return None
        return _Outcome("deployed", out.get("release") or "?", None, out)


def tune(inventory, plan: TunePlan, *, progress: Callable[[dict], None] | None = None,
         report_dir: Path | None = None, ops: TuneHost | None = None) -> TuneResult:
    from opsctl.flow.steps import as_inventory, noop

    emit = progress or noop
    inv = as_inventory(inventory)
    ops = ops or SshTuneHost(inv, plan, progress)

    def note(message: str) -> None:
        emit({"event": "note", "host": "opsctl", "message": message})

    restore, base_tok = ops.prepare()
    began = ops.now()
    run = _Run(ops, plan, note)
    levels = plan.levels
    interrupted: Interrupted | None = None
    outcome: _Outcome | None = None
    rec: TrialResult | None = None
    reason = ""
    restore_gap: dict | None = None
    restore_s = 0.0
    with BRAKE.engaged(on_note=note):
        try:
            try:
                run.run_trials()
            except Interrupted as exc:
                interrupted = exc
            if interrupted is None:
                rec, reason = recommend(run.trials, levels, base_tok)
                outcome = run.keep_or_apply(rec, restore)
        except Interrupted as exc:
            interrupted = exc
        finally:
            record = {"action": "tune", "result": "interrupted" if interrupted else "ok", "mode": plan.mode,
                      "to_release": outcome.release if outcome else None,
                      "restored": None if outcome else restore,
                      "after": outcome.after if outcome else "restored",
                      **({"ddtree_active": outcome.candidate} if outcome and outcome.candidate else {}),
                      "budgets": plan.budgets, "levels": levels, "trials": [t.as_dict() for t in run.trials]}
            with BRAKE.shielded(f"restoring {restore}, which served before the tune" if outcome is None
                                else "recording the tune"):
                restore_gap, restore_s = ops.finish(None if outcome else restore, record)
            restore_s = restore_s if outcome is None else 0.0
    if interrupted is not None:
        raise Interrupted(f"{interrupted.problem} during the tune: {restore} (what served before) serves again",
                          "run the tune again when ready", signal_name=interrupted.signal_name)
    best = best_per_level(run.trials, levels)
    try:
        switches = ops.switches_since(began)
    except OpsctlError as exc:  # the tune is done; its count falls back to the gaps it saw
        run.say(f"could not read the switch records back: {exc.problem}")
        switches = []
    result = TuneResult(plan.host.name, plan.profile_name, levels, base_tok, run.trials, best,
                        schedule_text(best, plan.capture_bs),
                        rec.budget if rec is not None and not rec.schedule else None, reason,
                        recommended_schedule=rec.schedule if rec is not None else None,
                        restored=None if outcome else restore, restore_s=restore_s, restore_gap=restore_gap,
                        mode=plan.mode, after=outcome.after if outcome else "restored",
                        serving=outcome.release if outcome else restore,
                        serving_candidate=outcome.candidate if outcome else None,
                        applied=outcome.applied if outcome else None, switches=switches,
                        planned_restarts=plan.trial_restarts + plan.after_restarts, notes=run.notes)
    recorded = getattr(ops, "recorded", None)
    result.prediction_check = {"release": (recorded or {}).get("release"), "ts": (recorded or {}).get("ts"),
                               "levels": prediction_check(recorded, run.trials)}
    if report_dir is not None:
        result.report = write_tune_report(result, report_dir)
    return result


# --------------------------------------------------------------------------- the host, over SSH


def recorded_active(ledger: list[dict], release: str) -> str | None:
    """The candidate the ledger last recorded as served by trial release `release` (its promotion by
    `tune --apply`, or a tune that kept it): what its control file must name when it serves again."""
    for rec in reversed(ledger):
        if rec.get("to_release") == release and rec.get("ddtree_active"):
            return str(rec["ddtree_active"])
    return None


@dataclass
class _Live:
    """The trial release while it serves (inside the deploy's trial callback)."""

    conn: Any
    plan: Any                    # the deploy's Plan
    steps: Any
    fallbacks: list[str]
    drain_s: float | None


class SshTuneHost:
    """TuneHost on a real (or lab) host: the deploy flow over SSH."""

    def __init__(self, inv, plan: TunePlan, progress: Callable[[dict], None] | None):
        from opsctl.flow.steps import Steps

        self.inv, self.plan, self.progress = inv, plan, progress
        self.host = plan.host
        self.steps = Steps(progress, self.host.name)
        self.baseline = None
        self._live: _Live | None = None

    def now(self) -> float:
        return time.time()

    def prepare(self) -> tuple[str, dict[int, float]]:
        from opsctl.flow.bench import load_baseline, require_baseline
        from opsctl.flow.promote import fallback_release
        from opsctl.host.connection import connect
        from opsctl.releases import read_state

        host, policy = self.host, self.plan.policy
        conn = connect(host)
        try:
            require_baseline(conn, host, policy)
            self.baseline = load_baseline(conn, host, policy)
            state = read_state(conn, host)
            from opsctl.diagnose import recorded_predictions

            self.recorded = recorded_predictions(state.ledger)   # diagnose's predictions, checked by this tune
            restore = state.current if state.current and state.judged(state.current) else \
                fallback_release(state, host, exclude=None)
            if restore is None:
                raise ConfigError(f"{host.name} serves no judged release to come back to",
                                  f"deploy the baseline first: opsctl deploy {host.baseline_profile}")
        finally:
            conn.close()
        base_tok = {c: sum(x.output_throughput for x in self.baseline.at(c)) / max(len(self.baseline.at(c)), 1)
                    for c in self.plan.levels}
        return restore, base_tok

    def deploy_trial(self, profile, while_live: Callable[[str], dict]) -> tuple[str, dict | None, dict]:
        from opsctl.flow.bench import drain_deadline_s
        from opsctl.flow.deploy import deploy_one
        from opsctl.flow.promote import fallback_releases

        def bench(conn, host_, plan_, steps_):
            drain_s = drain_deadline_s(conn, host_) if host_.settings.drain.enabled else None
            self._live = _Live(conn, plan_, steps_, fallback_releases(plan_.state, host_, exclude=plan_.release),
                               drain_s)
            try:
                return while_live(plan_.release)
            finally:
                self._live = None

        if profile.trial_set:
            # the trial set's first candidate from the start, validation included: a control file left by an
            # earlier tune of the same candidates would switch the new server at its first check (a live
            # release that reads it too is being replaced; a restore writes its own choice back)
            from opsctl import trialswitch
            from opsctl.host.connection import connect
            from opsctl.lock import HostLock
            from opsctl.trialset import control_path

            conn = connect(self.host)
            try:
                with HostLock(conn, self.host, "tune: the trial release's control file"):  # never under another run
                    trialswitch.write_control(conn, control_path(self.host.install_root, profile.trial_set),
                                              profile.trial_set[0])
            finally:
                conn.close()
        out = deploy_one(self.inv, self.host, profile, dry_run=False, gates=True, pre_checks=False,
                         progress=self.progress, confirm=None, trial=bench)
        return out.release, out.details.get("gap"), out.details["trial"]

    def _guard_s(self, profile) -> int:
        return self.host.settings.guard_s or profile.readiness_timeout_s + 1800

    def switch_live(self, candidate: str) -> dict:
        from opsctl import trialswitch
        from opsctl.flow.switch import arm_guard

        live = self._live
        assert live is not None and self.plan.control_file, "switch_live runs while the trial release serves"
        if live.fallbacks:
            # the guard of the trial's deploy, armed again per candidate: a tune of many candidates on one
            # start outlives one guard period, and the guard must not revert the trial in the middle of it
            arm_guard(live.conn, self.host, live.fallbacks, self._guard_s(live.plan.profile),
                      expect=live.plan.release, drain_s=live.drain_s)
        what = f"schedule {candidate}" if ":" in candidate else f"budget {candidate}"
        t0 = live.steps.start("activate", f"{what}: control file {self.plan.control_file}")
        try:
            sw = trialswitch.switch_live(live.conn, self.host, self.plan.control_file, candidate,
                                         timeout_s=self.plan.switch_timeout_s)
        except OpsctlError as exc:
            live.steps.done("activate", t0, exc.problem, status="fail")
            raise
        since = f" since decode step {sw.since_step}" if sw.since_step is not None else ""
        live.steps.done("activate", t0, f"serving {what}{since} ({sw.warmup_requests} warm-up request(s))")
        return sw.as_dict()

    def measure(self, label: str) -> dict[int, LevelResult]:
        from opsctl.gate.measure import measure

        live = self._live
        assert live is not None, "measure runs while a trial release serves"
        policy, levels = self.plan.policy, self.plan.levels
        t0 = live.steps.start("bench", f"trial {label}: levels {','.join(map(str, levels))}")
        run = measure(live.conn, self.host, policy, baseline=self.baseline,
                      spec=self.host.analysis(live.plan.profile, policy),
                      meta={"release": live.plan.release, "profile": live.plan.profile.label, "trial": True,
                            "candidate": label})
        res = _level_results(run, self.baseline, levels, policy.confidence,
                             budget=_label_budget(label),
                             reference=self.host.drafter.reference_accept)
        live.steps.done("bench", t0, ", ".join(f"C={c}: {r.tok_s:.1f} tok/s" for c, r in res.items()))
        return res

    def serving(self) -> bool:
        from opsctl.host import facts

        live = self._live
        if live is None:
            return False
        try:
            return facts.get(live.conn, facts.HealthCode(str(self.host.host_python), self.host.http_port),
                             timeout=60) == 200
        except OpsctlError:
            return False

    def _live_release(self, conn, release: str):
        from opsctl.releases import read_state

        state = read_state(conn, self.host)
        if state.current != release or state.service.get("ActiveState") != "active":
            raise DeployFailed(f"{self.host.name}: {release} no longer serves (live: {state.current or 'none'}, "
                               f"service {state.service.get('ActiveState') or 'unknown'})",
                               "'opsctl status' shows what serves")
        return state

    def apply_live(self, release: str, candidate: str | None, gate_profile, from_release: str) -> dict:
        from opsctl import trialswitch
        from opsctl.flow.judge import bench_and_judge
        from opsctl.flow.promote import fallback_releases, prune
        from opsctl.flow.switch import arm_guard, disarm_guard
        from opsctl.host.connection import connect
        from opsctl.ledger import append_ledger
        from opsctl.lock import HostLock
        from opsctl.releases import release_profile

        host, steps = self.host, self.steps
        conn = connect(host)
        try:
            with HostLock(conn, host, f"tune --apply {gate_profile.label}"):
                state = self._live_release(conn, release)
                live_profile = release_profile(state.releases.get(release), host)
                fallbacks = fallback_releases(state, host, exclude=release)
                if fallbacks:  # judged as a deploy is: guarded until it passes
                    arm_guard(conn, host, fallbacks, self._guard_s(live_profile), expect=release)
                switched = None
                if candidate is not None:
                    t0 = steps.start("activate", f"{gate_profile.label} on {release}")
                    sw = trialswitch.switch_live(conn, host, self.plan.control_file, candidate,
                                                 timeout_s=self.plan.switch_timeout_s)
                    steps.done("activate", t0, f"serving {candidate}")
                    switched = sw.as_dict()
                outcome = bench_and_judge(conn, host, gate_profile, release, steps)
                if not outcome.ok:
                    raise DeployFailed(f"{host.name}: gate failed for {gate_profile.label} on {release}: "
                                       f"{outcome.reason}", "see the verdict table above",
                                       details={"verdict": outcome.record})
                disarm_guard(conn, host)
                append_ledger(conn, host, {
                    "action": "promote", "result": "ok", "from_release": from_release, "to_release": release,
                    "profile": gate_profile.name, "budget": gate_profile.budget,
                    **({"budget_schedule": gate_profile.budget_schedule} if gate_profile.budget_schedule else {}),
                    **({"ddtree_active": candidate, "trial_set": list(live_profile.trial_set or ()),
                        "control_file": self.plan.control_file} if candidate is not None else {}),
                    "restart": False,
                    "reason": "tune --apply: gates passed on the live release, no restart"
                              + (f" (its control file names {candidate}, also after a restart)" if candidate else "")})
                prune(conn, host)
        finally:
            conn.close()
        return {"release": release, "candidate": candidate, "live_switch": switched, "verdict": outcome.record,
                "restart": False}

    def deploy(self, profile) -> dict:
        from opsctl.flow.deploy import deploy_one

        out = deploy_one(self.inv, self.host, profile, dry_run=False, gates=True, pre_checks=True,
                         progress=self.progress, confirm=None)
        return out.as_dict()

    def keep(self, release: str, candidate: str | None) -> None:
        from opsctl import trialswitch
        from opsctl.flow.switch import disarm_guard
        from opsctl.host.connection import connect
        from opsctl.lock import HostLock

        host, steps = self.host, self.steps
        conn = connect(host)
        try:
            with HostLock(conn, host, "tune keep-trial"):
                self._live_release(conn, release)
                if candidate is not None:
                    t0 = steps.start("activate", f"{candidate} on {release} (opsctl.tune.restore: keep-trial)")
                    trialswitch.switch_live(conn, host, self.plan.control_file, candidate,
                                            timeout_s=self.plan.switch_timeout_s)
                    steps.done("activate", t0, f"serving {candidate}")
                # kept on purpose: the guard would put the last good release back in the middle of the day
                disarm_guard(conn, host)
                steps.note(f"{release} keeps serving (opsctl.tune.restore: keep-trial), unjudged: it never becomes "
                           "the last good release; 'opsctl tune --apply' gates and promotes a winner")
        finally:
            conn.close()

    def finish(self, restore: str | None, record: dict) -> tuple[dict | None, float]:
        from opsctl import trialswitch
        from opsctl.flow.bench import drain_deadline_s
        from opsctl.flow.ready import wait_ready
        from opsctl.flow.switch import back_in_pool, disarm_guard, drain_before_switch, switch, switch_drained
        from opsctl.host.connection import connect
        from opsctl.ledger import append_ledger
        from opsctl.lock import HostLock
        from opsctl.releases import read_state, release_profile
        from opsctl.trialset import control_path

        host, steps = self.host, self.steps
        t0 = time.monotonic()
        gap = None
        conn = connect(host)
        try:
            with HostLock(conn, host, "tune restore" if restore else "tune record"):
                if restore is not None:
                    now = read_state(conn, host)
                    disarm_guard(conn, host)
                    info = now.releases.get(restore)
                    if info is not None and info.trial_set:
                        # a trial release serves what its control file names: the choice recorded for it,
                        # else its trial set's first (a trial of this tune may have named another)
                        want = recorded_active(now.ledger, restore) or info.trial_set[0]
                        trialswitch.write_control(conn, control_path(host.install_root, info.trial_set), want)
                        record["restored_active"] = want
                    if now.current != restore or now.service.get("ActiveState") != "active":
                        g = drain_before_switch(conn, host, why="restore", from_release=now.current,
                                                to_release=restore, deadline_s=drain_deadline_s(conn, host),
                                                steps=steps)
                        t1 = steps.start("restore", f"{now.current or 'none'} -> {restore}")
                        since = switch_drained(conn, host, restore, g, switch)
                        wait_ready(conn, host, release_profile(info, host), since, steps)
                        gap = back_in_pool(conn, host, g, since, steps)
                        steps.done("restore", t1, f"{restore} serves again")
                append_ledger(conn, host, record)
        finally:
            conn.close()
        return gap, time.monotonic() - t0

    def switches_since(self, began: float) -> list[dict]:
        from opsctl.host import facts
        from opsctl.host.connection import connect

        conn = connect(self.host)
        try:
            records, _ = facts.get(conn, facts.LedgerRecords(str(self.host.install_root)))
        finally:
            conn.close()
        return [r for r in records if r.get("action") == "switch" and (r.get("pool_out_at") or 0) >= began - 1]


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


def prediction_check(recorded: dict | None, trials: list[TrialResult]) -> list[dict]:
    """What `opsctl diagnose` predicted on record (opsctl.diagnose.recorded_predictions) against
    what the trials measured: per single-budget trial and level, both decode tok/s and the error."""
    if not recorded:
        return []
    pred = {(p["budget"], p["concurrency"]): p for p in recorded.get("predictions") or []}
    out = []
    for t in trials:
        if t.status != "measured" or t.schedule:
            continue
        for c, lv in sorted(t.levels.items()):
            p = pred.get((t.budget, c))
            if p is None or lv.decode_tok_s is None:
                continue
            out.append({"budget": t.budget, "concurrency": c, "predicted_tok_s": p["tok_s"],
                        "measured_tok_s": round(lv.decode_tok_s, 1),
                        "error_pct": round((p["tok_s"] / lv.decode_tok_s - 1) * 100, 1),
                        "accept_source": p.get("accept_source")})
    return out
