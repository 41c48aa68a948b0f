"""opsctl tune ddtree: the budget that wins at each concurrency, on the host's traffic."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from opsctl.cli import _common, _output
from opsctl.errors import ConfigError

TUNE_HELP = """Find the DDTree budget that wins at each concurrency on this host and its traffic, or
prove none does. The host is left serving what it served.

Each budget is deployed as a trial release (stage, switch, ready, validate: the normal path,
guard armed), benchmarked over the concurrency levels on the gate's workload mix against the
stored baseline (each level until its 90 % speedup interval is decided, or the cap), then the
next. Trials are marked `trial` in the ledger and never become the last good release.
Afterwards — also after a trial that fails to start or validate, an error or Ctrl-C — the
release that served before is restored.

Early stop: budgets run in increasing order; once throughput fell from one budget to the next
at every level twice in a row, larger budgets are skipped.

Output: a table (tok/s and speedup interval per budget and level), the best budget per level
(0 where the baseline wins) and the budget schedule built from it, `1:16,8:4,32:0` (bands of
running batch size: each level starts a band). That schedule is then deployed and measured as
one more trial (--no-schedule-trial skips it), so it is judged on the same traffic as the single
budgets. The recommendation is the budget or schedule with the highest traffic-weighted
throughput over the levels and no level proven below the baseline (speedup interval wholly
under 1) — or "keep the baseline" with the numbers. A PNG (tok/s against concurrency, one line
per trial with its confidence band, and the baseline) and tune.json go to --out. --apply
deploys the recommendation (a budget, or the schedule) through the normal gated deploy.

Examples:

  opsctl tune ddtree --budgets 4,8,16,32 -i inventories/lab --yes

  opsctl tune ddtree --budgets 8,16 --concurrency 1,8,32 --workload file:site.jsonl --out tune/ --yes

  opsctl tune ddtree --budgets 4,8,16,32 --apply --yes
"""


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
        apply: bool = typer.Option(False, "--apply", help="Deploy the recommendation, a budget or the schedule "
                                   "(normal gated deploy)."),
        no_schedule_trial: bool = typer.Option(False, "--no-schedule-trial", help="Do not deploy and measure the "
                                               "budget schedule built from the best budget per level."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before changing the host."),
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        json_out: bool = _common.JsonOpt,
    ) -> None:
        from opsctl.flow import deploy as deploy_core
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
        cost = core.restart_plan(inv, bl, schedule_trial=not no_schedule_trial, limit=limit)
        if json_out:
            _output.STATE.stream = True
            _output.emit_json({"event": "restart_plan", **cost.as_dict()})
        else:
            _output.info(f"tune will make {cost.describe()}")
        if not yes:
            if json_out or not sys.stdin.isatty():
                raise ConfigError("tune deploys trial releases and needs confirmation; there is no terminal to ask on",
                                  "add --yes")
            if not typer.confirm(f"deploy {len(bl)} trial release(s) (budgets {budgets}), {cost.restarts} restart(s), "
                                 f"and restore the live one?", default=False):
                raise ConfigError("tune not confirmed", "re-run with --yes")
        res = core.tune(inv, bl, concurrency=levels, workload=workload, limit=limit,
                        progress=_StepPrinter(json_out), report_dir=out, schedule_trial=not no_schedule_trial)
        applied = None
        if apply and (res.recommendation is not None or res.recommended_schedule):
            outcomes = deploy_core.deploy(inv, "ddtree", res.recommendation, budget_schedule=res.recommended_schedule,
                                          limit=limit, progress=_StepPrinter(json_out))
            applied = [o.as_dict() for o in outcomes]
        if json_out:
            _output.emit_json({"ok": True, **res.as_dict(), "applied": applied})
            return
        cols = ["trial", "status"] + [f"C={c}" for c in res.levels]
        rows = [["baseline", "stored"] + [f"{res.baseline_tok_s.get(c, 0):.1f}" for c in res.levels]]
        for t in res.trials:
            cells = []
            for c in res.levels:
                lv = t.levels.get(c)
                cells.append("-" if lv is None else f"{lv.tok_s:.1f} ({(lv.speedup - 1) * 100:+.0f} % "
                             f"[{(lv.low - 1) * 100:+.0f}, {(lv.high - 1) * 100:+.0f}])" if lv.speedup is not None
                             else f"{lv.tok_s:.1f}")
            rows.append([t.label, t.status[:60]] + cells)
        _output.table(f"tune {res.profile} on {res.host}: output tok/s (speedup vs baseline, 90 % CI)", cols, rows)
        _output.info("best budget per level: " + ", ".join(f"C={c}: {b or 'baseline'}" for c, b in res.best.items()))
        _output.info(f"budget schedule: {res.schedule}")
        _output.info(f"recommendation: {res.reason}")
        _output.info(f"restored: {res.restored} serves as before the tune")
        from opsctl.drain import describe

        for t in res.trials:
            if t.gap:
                _output.info(f"{t.label}: {describe(t.gap)}")
        if res.restore_gap:
            _output.info(f"restore: {describe(res.restore_gap)}")
        from opsctl.startup import human_s

        summary = res.as_dict()
        _output.info(f"outage over the tune: {human_s(summary['outage_s'])}"
                     + (f" in the lab = {human_s(summary['outage_site_s'])} at the site"
                        if summary.get("outage_site_s") is not None else ""))
        for k, p in res.report.items():
            _output.info(f"wrote {k}: {p}")
        if applied:
            _output.info(f"applied: {applied[0]['result']} {applied[0]['release']}")
