"""opsctl tune ddtree: the budget that wins at each concurrency, on the host's traffic."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from opsctl.cli import _common, _output
from opsctl.errors import ConfigError

TUNE_HELP = """Find the DDTree budget that wins at each concurrency on this host and its traffic, or
prove none does, in one restart of SGLang. The host is left serving what it served (or, with
--apply, the winner).

One trial release captures every candidate at one start: each budget of --budgets and every
budget schedule the per-level winners could build (the runtime's trial set; the verify width is
the largest budget + 1). It is deployed once (stage, switch, ready, validate: the normal path,
guard armed). Then for each candidate: its control file (<install_root>/shared/control/, outside
the release) names it, warm-up requests run until /server_info says it serves, and it is
benchmarked over the concurrency levels on the gate's workload mix against the stored baseline
(each level until its 90 % speedup interval is decided, or the cap). Trials are marked `trial` in
the ledger and never become the last good release.

--restart-per-trial deploys each budget as a release of its own instead (one restart each, as
before issue #37). Trials that cannot share one server (different TP/EP, drafter or SGLang flags)
do that by themselves; tune says so before it starts.

Early stop: budgets run in increasing order; once throughput fell from one budget to the next
at every level twice in a row, larger budgets are skipped.

Output: a table (tok/s and speedup interval per budget and level), the best budget per level
(0 where the baseline wins) and the budget schedule built from it, `1:16,8:4,32:0` (bands of
running batch size: each level starts a band). That schedule is measured as one more trial
(--no-schedule-trial skips it): switched to live, or on its own restart when too many schedules
were possible to capture them all (tune says so before it starts). The recommendation is the
budget or schedule with the highest traffic-weighted throughput over the levels and no level
proven below the baseline (speedup interval wholly under 1) — or "keep the baseline" with the
numbers. A PNG and tune.json go to --out.

Afterwards, by default, the release that served before is restored: one restart.

--apply gates the recommendation (bench and judge, the deploy's gate) while it serves on the
trial release, then promotes that release: no restart. Its control file keeps the winner across
later restarts; the ledger records it (ddtree_active).

--apply --lean deploys the recommendation's own release instead (the normal gated deploy: one
restart; the memory of the other candidates comes back).

opsctl.tune.restore: keep-trial (inventory) leaves the trial release serving the recommendation,
unjudged: no restart.

After an error, a failed gate, Ctrl-C, or when nothing beats the baseline, the release that
served before is restored whatever was asked. Before it starts, tune prints how many restarts it
will make and the outage they project at the host's last start-up time; after it ends, the
restarts it made and their outage (the ledger's switch records).

Examples:

  opsctl tune ddtree --budgets 4,8,16,32 -i inventories/lab --yes

  opsctl tune ddtree --budgets 8,16 --concurrency 1,8,32 --workload file:site.jsonl --out tune/ --yes

  opsctl tune ddtree --budgets 4,8,16,32 --apply --yes

  opsctl tune ddtree --budgets 4,8,16 --restart-per-trial --yes
"""


def _cell(lv) -> str:
    if lv is None:
        return "-"
    if lv.speedup is None:
        return f"{lv.tok_s:.1f}"
    cell = (f"{lv.tok_s:.1f} ({(lv.speedup - 1) * 100:+.0f} % [{(lv.low - 1) * 100:+.0f}, "
            f"{(lv.high - 1) * 100:+.0f}])")
    if getattr(lv, "step_ratio", None) is not None and lv.accept is not None:
        # opsctl diagnose's arithmetic: the accept length this level needs, and why a losing level lost
        cell += f" accept {lv.accept:.2f} / needs {lv.step_ratio:.2f}" + (f" ({lv.why})" if lv.why else "")
    return cell


def register(app: typer.Typer) -> None:
    @app.command("tune", help=TUNE_HELP)
    def tune_cmd(
        profile: str = typer.Argument(..., metavar="PROFILE", help="The speculative profile to tune: ddtree."),
        budgets: str = typer.Option("4,8,16,32", "--budgets", help="Budgets to try, comma-separated."),
        concurrency: Optional[str] = typer.Option(None, "--concurrency", "-c",
                                                  help="Levels, e.g. 1,8,32 (default: the gate policy's)."),
        workload: Optional[str] = typer.Option(None, "--workload", "-w", help="Workload mix (default: the gate "
                                               "policy's), as for 'opsctl bench --workload'."),
        out: Path = typer.Option(Path("tune"), "--out", help="Directory for tune.png and tune.json."),
        apply: bool = typer.Option(False, "--apply", help="Gate the recommendation, a budget or the schedule, and "
                                   "leave it serving: promoted live on the trial release (no restart), or deployed."),
        lean: bool = typer.Option(False, "--lean", help="With --apply: deploy the recommendation's own release "
                                  "(one restart) instead of keeping the trial release with every candidate."),
        restart_per_trial: bool = typer.Option(False, "--restart-per-trial", help="One release and one restart per "
                                               "trial (the way before one-restart trial sets)."),
        no_schedule_trial: bool = typer.Option(False, "--no-schedule-trial", help="Do not measure the budget "
                                               "schedule built from the best budget per level."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before changing the host."),
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        json_out: bool = _common.JsonOpt,
    ) -> None:
        from opsctl import tune as core
        from opsctl.cli.deploy import _StepPrinter

        _output.set_json(json_out)
        if profile != "ddtree":
            raise ConfigError(f"tune takes the ddtree profile (got {profile!r})", "opsctl tune ddtree --budgets 4,8,16")
        levels = None
        if concurrency:
            try:
                levels = [int(x) for x in concurrency.split(",") if x.strip()]
            except ValueError:
                raise ConfigError(f"--concurrency {concurrency!r}: not a list of integers", "e.g. --concurrency 1,8,32") from None
            if not levels or min(levels) < 1:
                raise ConfigError(f"--concurrency {concurrency!r}: levels must be >= 1", "e.g. --concurrency 1,8,32")
        bl = core.parse_budgets(budgets)
        inv = _common.inventory(inventory)
        plan = core.plan_tune(inv, bl, concurrency=levels, workload=workload, limit=limit,
                              schedule_trial=not no_schedule_trial, restart_per_trial=restart_per_trial,
                              apply=apply, lean=lean)
        cost = core.restart_plan(inv, plan)
        if json_out:
            _output.STATE.stream = True
            _output.emit_json({"event": "restart_plan", **cost.as_dict(), "plan": plan.as_dict()})
        else:
            if plan.mode_reason and not restart_per_trial:
                _output.info(f"one restart per trial: {plan.mode_reason}")
            _output.info(f"tune will make {cost.describe()}")
        if not yes:
            if json_out or not sys.stdin.isatty():
                raise ConfigError("tune deploys trial releases and needs confirmation; there is no terminal to ask on",
                                  "add --yes")
            what = ("1 trial release with every candidate" if plan.mode == core.ONE_RESTART
                    else f"{len(bl)} trial release(s)")
            if not typer.confirm(f"deploy {what} (budgets {budgets}), {cost.restarts} restart(s), "
                                 f"then {plan.after.replace('-', ' ')}?", default=False):
                raise ConfigError("tune not confirmed", "re-run with --yes")
        res = core.tune(inv, plan, progress=_StepPrinter(json_out), report_dir=out)
        if json_out:
            _output.emit_json({"ok": True, **res.as_dict()})
            return
        _print_result(res, plan)



def _print_result(res, plan) -> None:
    from opsctl import tune as core
    from opsctl.drain import describe, human_s

    cols = ["trial", "status"] + [f"C={c}" for c in res.levels]
    rows = [["baseline", "stored"] + [f"{res.baseline_tok_s.get(c, 0):.1f}" for c in res.levels]]
    for t in res.trials:
        rows.append([t.label, t.status[:60]] + [_cell(t.levels.get(c)) for c in res.levels])
    _output.table(f"tune {res.profile} on {res.host}: output tok/s (speedup vs baseline, 90 % CI)", cols, rows)
    _output.info("best budget per level: " + ", ".join(f"C={c}: {b or 'baseline'}" for c, b in res.best.items()))
    _output.info(f"budget schedule: {res.schedule}")
    _output.info(f"recommendation: {res.reason}")
    if res.after == "restored":
        _output.info(f"restored: {res.restored} serves as before the tune")
    elif res.after == "applied-live":
        _output.info(f"applied: {res.serving} promoted, serving {res.serving_candidate or 'its configuration'} "
                     f"(gate passed; no restart)" + (f"; its control file {plan.control_file} keeps it across "
                                                     f"restarts" if res.serving_candidate else ""))
    elif res.after == "deployed":
        _output.info(f"applied: {res.serving} deployed ({(res.applied or {}).get('result', '?')})")
    elif res.after == "kept-trial":
        _output.info(f"kept: {res.serving} serves {res.serving_candidate or 'its configuration'}, unjudged "
                     f"(opsctl.tune.restore: keep-trial)")
    for g in res.gaps:
        _output.info(f"{g.get('why', '?')} -> {g.get('to_release')}: {describe(g)}")
    site = res.outage_site_s
    by_why = ", ".join(f"{why} {n}" for why, n in core.count_by_why(res.gaps).items())
    _output.info(f"restarts: {res.restarts} made ({by_why or 'none'}), {res.planned_restarts} planned; outage "
                 f"{human_s(res.outage_s)}" + (f" in the lab = {human_s(site)} at the site's scale" if site is not None
                                               else ""))
    check = (res.prediction_check or {}).get("levels") or []
    if check:
        _output.info(f"opsctl diagnose's predictions ({res.prediction_check['release']}, {res.prediction_check['ts']}) "
                     "against this tune's decode tok/s: " + "; ".join(
                         f"budget {x['budget']} C={x['concurrency']}: predicted {x['predicted_tok_s']:.0f}, "
                         f"measured {x['measured_tok_s']:.0f} ({x['error_pct']:+.0f} %)" for x in check))
    for k, p in res.report.items():
        _output.info(f"wrote {k}: {p}")
