"""opsctl render: show or write every file a deploy would install."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from opsctl.cli import _common, _output


def register(app: typer.Typer) -> None:
    @app.command("render")
    def render_cmd(
        profile: str = typer.Argument(..., metavar="PROFILE", help="Profile: ar-tp8, ar-ep8, dflash, ddtree (or one the inventory defines)."),
        budget: Optional[int] = _common.BudgetOpt,
        budget_schedule: Optional[str] = _common.ScheduleOpt,
        trial_set: Optional[str] = typer.Option(None, "--trial-set", metavar="CANDIDATES",
                                                help="DDTree trial release (what 'opsctl tune' deploys): budgets "
                                                "comma-separated and each schedule as its own space-separated part, "
                                                "e.g. \"4,8,16 1:16,6:0\"; all captured at one start, switched "
                                                "live by a control file under <install_root>/shared/control/.",
                                                show_default=False),
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        capture_from_traffic: bool = _common.CaptureFromTrafficOpt,
        traffic_since: str = _common.TrafficSinceOpt,
        max_padding: float = _common.MaxPaddingOpt,
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the files under DIR (host paths kept "
                                           "relative) instead of printing them."),
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Render the systemd unit, environment file and launch config for PROFILE, without touching any host.

        Output is deterministic byte for byte. With --json, prints {host, profile, argv, files, links, digest}.

        Examples:

          opsctl render ddtree --budget 16 -i inventories/blackwell --out /tmp/render

          opsctl render ddtree --trial-set "4,8,16 1:16,6:0" -i inventories/lab

          opsctl render ddtree --budget 16 --capture-from-traffic --traffic-since 2d -i inventories/lab
          (reads the host's journal: the only render that does)
        """
        from opsctl.render import render as render_release
        from opsctl.trialset import parse_cli
        from opsctl.writeout import write_rendered

        _output.set_json(json_out)
        candidates = parse_cli(trial_set) if trial_set is not None else None
        inv = _common.inventory(inventory)
        results, plans = [], {}
        for host in inv.select(limit):
            prof = host.profile(profile, budget, budget_schedule, trial_set=candidates)
            if capture_from_traffic:
                from opsctl.flow.traffic import capture_from_host

                prof, plans[host.name] = capture_from_host(host, prof, since=traffic_since, max_padding=max_padding)
            rendered = render_release(host, prof)
            results.append(rendered)
            if out is not None:
                base = out / host.name if len(inv.select(limit)) > 1 else out
                written = write_rendered(rendered, base)
                if not json_out:
                    for p in written:
                        _output.info(f"wrote {p}")
        if not json_out:
            from opsctl.capture_plan import describe

            for name, plan in plans.items():
                for line in describe(plan.as_dict()):
                    _output.info(f"[{name}] {line}")
        if json_out:
            data = [{**r.as_dict(), **({"capture_plan": plans[r.host].as_dict()} if r.host in plans else {})}
                    for r in results]
            _output.emit_json(data[0] if len(data) == 1 else data)
        elif out is None:
            for r in results:
                for path, text in r.files.items():
                    _output.console.rule(f"{r.host}: {path}")
                    _output.console.out(text, end="", highlight=False)
                _output.console.rule(f"{r.host}: argv")
                _output.console.out(" ".join(r.argv), highlight=False)
