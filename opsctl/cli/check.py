"""opsctl check: run the host checks (testinfra, through pytest) against the inventory's hosts."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from opsctl.cli import _common, _output
from opsctl.errors import CheckFailed, ConfigError

GROUPS = ("pre", "post", "all")


def register(app: typer.Typer) -> None:
    @app.command("check")
    def check_cmd(
        group: str = typer.Argument("all", help="Which checks: 'pre' (can the host take a release?), 'post' "
                                    "(is the live release what opsctl deployed, and does it serve?) or 'all'."),
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Check the GPU host before (pre) or after (post) a deploy and print one row per check.

        \b
        pre: SSH, GPU count/model/driver, no leftover GPU processes, free GPU memory, disk space
        under the install root, model path, CUDA toolkit, service port free (or ours), time sync.

        \b
        post: unit active/enabled/not restarted, unit file matches the render (drift names the
        lines), current matches the ledger, drafter checksums, port listening, /health_generate,
        journal ready line and no graph-capture failure.

        Exit 0 when every check passes, 6 when one fails. With --json, prints
        {ok, group, hosts, counts, results: [{host, group, check, ok, outcome, message, fix}]}.
        The same suite runs under plain pytest: see docs/checks.md.

        Examples:

          opsctl check pre -i inventories/lab

          opsctl check post -i inventories/lab --json
        """
        from opsctl.checks.runner import run_checks

        _output.set_json(json_out)
        if group not in GROUPS:
            raise ConfigError(f"unknown check group {group!r}", "use one of: pre, post, all")
        report = run_checks(_common.inventory(inventory), group, limit)
        if json_out:
            _output.emit_json(report.as_dict())
        else:
            rows = [[r.host, r.group, r.check, "ok" if r.outcome == "passed" else
                     ("skip" if r.outcome == "skipped" else "FAIL"), r.message] for r in report.results]
            _output.table(f"{group} checks ({report.duration_s:.1f}s)", ["host", "group", "check", "", "result"], rows)
            shown: set[str] = set()
            for r in report.failed:
                if r.fix and r.fix not in shown:
                    shown.add(r.fix)
                    _output.info(f"fix {r.check} [{r.host}]: {r.fix}")
        if not report.ok:
            if json_out:
                # stdout already holds the report; keep the error handler from printing a second object
                _output.set_json(False)
            failed = report.failed
            first = failed[0] if failed else None
            raise CheckFailed(
                f"{len(failed)} of {len(report.results)} {group} check(s) failed"
                + (f" ({first.host}: {first.check}: {first.message})" if first else
                   f" (pytest exit {report.pytest_exit_code})"),
                first.fix if first and first.fix else None,
                details={"failed": [r.as_dict() for r in failed]})
