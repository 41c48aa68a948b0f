"""opsctl watch status / pause / resume: the host-side watch of the live release."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from opsctl.cli import _common, _output


def _fmt(v, spec: str = "{:.2f}") -> str:
    if v is None:
        return "-"
    return spec.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _print_status(rep: dict) -> None:
    host = rep["host"]
    if not rep["installed"]:
        _output.info(f"[{host}] watch: not installed" + (" (enabled in the inventory: deploy to install it)"
                                                         if rep["enabled"] else " (opsctl.watch.enabled is false)"))
        return
    s, cfg, unit = rep["summary"], rep.get("config") or {}, rep.get("unit") or {}
    last = rep.get("last") or {}
    _output.info(f"[{host}] watch: {s['state']} (mode {cfg.get('mode')}, every {cfg.get('interval_s')}s, window "
                 f"{cfg.get('window_s')}s, min {cfg.get('min_samples')} decode samples; unit {unit.get('name')} "
                 f"{unit.get('ActiveState')}, pid {unit.get('MainPID')}, started {rep.get('watch_starts')}x)")
    _output.info(f"[{host}] release {last.get('release') or '-'} ({last.get('profile') or '-'}), last verdict "
                 f"{last.get('verdict') or '-'}")
    if rep.get("failing"):
        f = rep["failing"]
        _output.info(f"[{host}] FAILING: no tick has completed for {f['seconds']:.0f}s "
                     f"({f.get('error') or 'see journalctl -u ' + str(unit.get('name'))}); what follows is from the "
                     "last tick that did (a full disk? fix: free space on the host; the watch goes on by itself)")
    if rep.get("paused"):
        p = rep["paused"]
        _output.info(f"[{host}] PAUSED by {p.get('by')} at {p.get('ts')}: {p.get('reason')}")
    if rep.get("tripped"):
        t = rep["tripped"]
        _output.info(f"[{host}] TRIPPED ({t.get('kind')}) at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t['ts']))}"
                     f": {t.get('reason')} -- stays so until the next deploy")
    findings = last.get("findings") or []
    if findings:
        _output.table(f"{host}: rules over the last {cfg.get('window_s')}s", ["rule", "status", "observed", "threshold",
                                                                              "detail"],
                      [[f["rule"], f["status"], _fmt(f.get("observed")), _fmt(f.get("threshold")), f.get("detail", "")]
                       for f in findings])
    samples = rep.get("samples") or []
    if samples:
        _output.table(f"{host}: last samples", ["time", "status", "running", "queue", "gen tok/s", "baseline tok/s",
                                                "accept len", "finished", "aborted", "journal errors", "crashes"],
                      [[time.strftime("%H:%M:%S", time.gmtime(x["ts"])), x.get("status") + (" (decode)" if x.get("decode")
                                                                                             else ""),
                        _fmt(x.get("running"), "{:g}"), _fmt(x.get("queue"), "{:g}"), _fmt(x.get("gen_tps"), "{:.1f}"),
                        _fmt(x.get("expected_tps"), "{:.1f}"), _fmt(x.get("accept_len")), _fmt(x.get("finished"), "{:g}"),
                        _fmt(x.get("aborted"), "{:g}"),
                        _fmt((x["journal"]["cuda_errors"] + x["journal"]["tracebacks"]) if x.get("journal") else None,
                             "{:d}"),
                        _fmt(x["journal"]["crashes"] if x.get("journal") else None, "{:d}")] for x in samples])
    cost = rep.get("cost") or {}
    if cost:
        _output.info(f"[{host}] watch cost per interval: {cost.get('avg_cpu_ms')} ms CPU on average (max "
                     f"{cost.get('max_cpu_ms')}), RSS {cost.get('rss_kib')} KiB")


def register(app: typer.Typer) -> None:
    sub = typer.Typer(name="watch", no_args_is_help=True, rich_markup_mode=None,
                      help="The host-side watch of the live release: status, pause, resume.\n\n"
                           "Example: opsctl watch status -i inventories/lab")
    app.add_typer(sub)

    @sub.command("status")
    def status_cmd(inventory: Optional[Path] = _common.InventoryOpt, limit: Optional[str] = _common.LimitOpt,
                   json_out: bool = _common.JsonOpt) -> None:
        """Show the watch's state (healthy, idle, unknown, breach, paused, tripped), its rules with the
        numbers over the window, the last samples and its own cost.

        Example: opsctl watch status -i inventories/lab --json
        """
        from opsctl import watch as core

        _output.set_json(json_out)
        reps = core.status(_common.inventory(inventory), limit)
        if json_out:
            _output.emit_json(reps)
            return
        for rep in reps:
            _print_status(rep)

    @sub.command("pause")
    def pause_cmd(inventory: Optional[Path] = _common.InventoryOpt, limit: Optional[str] = _common.LimitOpt,
                  reason: Optional[str] = typer.Option(None, "--reason", help="Why, for the ledger."),
                  json_out: bool = _common.JsonOpt) -> None:
        """Stop the watch from acting (it keeps sampling); recorded in the ledger.

        Example: opsctl watch pause --reason "load test tonight" -i inventories/lab
        """
        from opsctl import watch as core

        _output.set_json(json_out)
        recs = core.set_paused(_common.inventory(inventory), True, limit=limit, reason=reason)
        if json_out:
            _output.emit_json({"ok": True, "records": recs})
            return
        for r in recs:
            _output.info(f"[{r['host']}] watch paused: {r['reason']}")

    @sub.command("resume")
    def resume_cmd(inventory: Optional[Path] = _common.InventoryOpt, limit: Optional[str] = _common.LimitOpt,
                   reason: Optional[str] = typer.Option(None, "--reason", help="Why, for the ledger."),
                   json_out: bool = _common.JsonOpt) -> None:
        """Let the watch act again; recorded in the ledger.

        Example: opsctl watch resume -i inventories/lab
        """
        from opsctl import watch as core

        _output.set_json(json_out)
        recs = core.set_paused(_common.inventory(inventory), False, limit=limit, reason=reason)
        if json_out:
            _output.emit_json({"ok": True, "records": recs})
            return
        for r in recs:
            _output.info(f"[{r['host']}] watch resumed: {r['reason']}")
