"""opsctl deploy / rollback / status / history.

The flow is imported inside each command (opsctl.flow.deploy for deploy, .promote for rollback,
.inspect for status and history): a command pays at start only for the core it runs."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from opsctl.cli import _common, _output
from opsctl.errors import ConfigError

if TYPE_CHECKING:
    from opsctl.flow.plan import Plan


class _StepPrinter:
    """One line per step with its elapsed time; ansible tasks indented under 'prepare'.
    With --json every event is a JSON line on stdout."""

    def __init__(self, json_mode: bool, verbose: bool = False):
        self.json_mode, self.verbose = json_mode, verbose

    def __call__(self, ev: dict) -> None:
        if self.json_mode:
            ev = {k: v for k, v in ev.items() if k != "plan"}
            _output.STATE.stream = True
            _output.emit_json(ev)
            return
        kind = ev.get("event")
        if kind == "step":
            if ev["status"] == "start":
                _output.info(f"[{ev['host']}] {ev['step']:<10} ... {ev.get('detail', '')}".rstrip())
            else:
                mark = {"ok": "ok  ", "warn": "WARN"}.get(ev["status"], "FAIL")
                _output.info(f"[{ev['host']}] {ev['step']:<10} {mark} {ev.get('elapsed_s', 0):6.1f}s  {ev.get('detail', '')}")
        elif kind == "task" and (self.verbose or ev.get("status") in ("changed", "failed", "unreachable")):
            _output.info(f"[{ev['host']}]   - {ev['task']}: {ev['status']} ({ev['elapsed_s']:.1f}s)"
                         + (f" {ev['message']}" if ev.get("message") else ""))
        elif kind == "note":
            _output.info(f"[{ev['host']}]   {ev['message']}")
        elif kind == "rollout":
            pol = ev.get("policy") or {}
            _output.info(f"rollout {ev['rollout']}: " + "; ".join(f"{w['name']}: {', '.join(w['hosts'])}"
                                                               for w in ev.get("waves", []))
                         + f" (max_fail_percentage {pol.get('max_fail_percentage', 0):g} %, soak "
                           f"{pol.get('soak_s', 0)}s, on_failure {pol.get('on_failure')})")
        elif kind == "gap":
            from opsctl.drain import describe
            from opsctl.startup import describe as describe_start

            gap = ev.get("gap") or {}
            _output.info(f"[{ev['host']}]   {describe(gap)}")
            if gap.get("startup"):   # a start that got ready: its phases, and against the last start
                for line in describe_start(gap["startup"]):
                    _output.info(f"[{ev['host']}]   {line}")
        elif kind == "verdict":
            _print_verdict(ev)
        elif kind == "findings":
            for f in ev.get("findings", []):
                mark = "ok  " if f["ok"] else ("WARN" if f.get("severity") == "warning" else "FAIL")
                _output.info(f"[{ev['host']}]   {mark} {f['check']}: {f.get('diagnosis', '')}"
                             + (f" (fix: {f['fix']})" if not f["ok"] and f.get("fix") else ""))


def _print_verdict(ev: dict) -> None:
    """The verdict in 80 columns: a narrow table (opsctl.gate.decide.level_table), its legend and one
    line per level with the judged quantity, then the reasons and notes."""
    tab = ev.get("table")
    title = f"{ev['host']}: verdict {ev.get('status', '').upper()}"
    if tab and tab.get("rows"):
        _output.table(title, tab["columns"], tab["rows"], narrow=True)
        for line in tab.get("lines") or []:
            _output.info(f"  {line}")
    elif ev.get("rows"):  # an event from an older controller's stream
        cols = list(ev["rows"][0].keys())
        _output.table(title, cols, [[r.get(c) for c in cols] for r in ev["rows"]])
    for reason in ev.get("reasons", []):
        _output.info(f"[{ev['host']}]   {reason}")
    for note in ev.get("notes") or []:
        if "no baseline at this level" in note:
            _output.info(f"[{ev['host']}]   note: {note}")


def _print_plan(plan: dict) -> None:
    _output.info(f"plan for {plan['host']}: {plan['profile']}" + (f" --budget-schedule {plan['budget_schedule']}" if plan.get("budget_schedule") else
                                                                   f" --budget {plan['budget']}" if plan.get("budget") else "")
                 + f" (verify width {plan['verify_width']}) -> release {plan['release']}")
    for band in plan.get("schedule_bands") or []:
        _output.info(f"  band: {band}")
    for c in plan["changes"]:
        _output.info(f"  * {c}")
    _output.info(f"  bytes to send: {plan['bytes_to_send']:,}")
    if plan.get("unit_diff"):
        _output.info("  unit diff:")
        for line in plan["unit_diff"].splitlines():
            _output.info(f"    {line}")


def _verdict_cell(r: dict) -> str:
    """The status table's verdict: a live release that did not become ready after the switch to it
    says so, whatever verdict it earned before (issue #32 item 5); a lost ledger says so (item 8)."""
    if r.get("live_not_ready"):
        return "NOT READY (rollback failed)"
    if (r.get("ledger") or {}).get("lost"):
        return "unknown (ledger missing)" if not r["ledger"].get("exists") else "unknown (ledger empty)"
    return (r["last_verdict"] or {}).get("status") or ("never judged" if r.get("judged") is False else "-")


def _print_slower(host: str, start: dict | None) -> None:
    """The summary repeats a startup.slower warning (the block after ready may have scrolled away)."""
    f = ((start or {}).get("slower") or {}).get("finding") or {}
    if f and not f.get("ok"):
        _output.info(f"[{host}] WARN {f['check']}: {f.get('diagnosis', '')}")


def _start_cell(rec: dict) -> str:
    """history's start column: a switch record's start-up total at the site's scale, and against
    the last start of its profile (`SLOWER` at the startup.slower threshold); '-' elsewhere."""
    from opsctl.startup import human_s

    st = rec.get("startup") if rec.get("action") == "switch" else None
    if not isinstance(st, dict) or st.get("total_s") is None:
        return "-"
    cell = human_s(st["total_s"])
    cmp = st.get("slower") or {}
    if cmp.get("ratio"):
        cell += f", {(cmp['ratio'] - 1) * 100:+.0f} %" + (" SLOWER" if cmp.get("slower") else "")
    return cell


def _watch_cell(w: dict) -> str:
    state = w.get("state", "-")
    if w.get("mode") and state not in ("off", "not installed"):
        state += f" ({w['mode']})"
    if w.get("tripped"):
        state += f": {w['tripped'].get('kind')} of {w['tripped'].get('release')}"
    return state


def _why_cell(rec: dict) -> str:
    """history's why: a failed DDTree verdict's causes first (opsctl diagnose's shares), then the reason."""
    reason = rec.get("reason") or ""
    d = rec.get("diagnosis")
    if isinstance(d, dict) and d.get("causes"):
        causes = ", ".join(f"{c.get('kind')} {float(c.get('share') or 0) * 100:.0f} %" for c in d["causes"])
        reason = f"lost to {causes}; {reason}"
    return reason[:80]


def register(app: typer.Typer) -> None:
    @app.command("deploy")
    def deploy_cmd(
        profile: str = typer.Argument(..., metavar="PROFILE", help="Profile: ar-tp8, ar-ep8 (baselines), dflash, ddtree."),
        budget: Optional[int] = _common.BudgetOpt,
        budget_schedule: Optional[str] = _common.ScheduleOpt,
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (changes, unit diff, bytes to send); change nothing."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before changing the host."),
        no_gate: bool = typer.Option(False, "--no-gate", help="Skip validation and the benchmark gate (recorded in the ledger)."),
        skip_checks: bool = typer.Option(False, "--skip-checks", help="Skip the pre-deploy host checks."),
        verify_weights: bool = typer.Option(False, "--verify-weights", help="Check every byte of the drafter already on "
                                            "the host against its sha256 manifest (default: sizes and sampled "
                                            "hashes); files that differ are re-sent."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show every ansible task, not only changes."),
        capture_from_traffic: bool = _common.CaptureFromTrafficOpt,
        traffic_since: str = _common.TrafficSinceOpt,
        max_padding: float = _common.MaxPaddingOpt,
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Deploy PROFILE as a new release: plan, stage, switch, wait until ready, validate the
        CUDA graphs, benchmark against the baseline, then promote or roll back automatically.

        Several hosts go in the inventory's rollout waves (opsctl.rollout: canary host(s),
        then batches written as Ansible's serial, e.g. [1, "25%", "100%"]); by default one
        host after another. Each wave is staged in one ansible run, then switched and judged
        host by host. A wave past max_fail_percentage (default 0) stops the rollout; then
        every host that took the release goes back (on_failure: rollback_all, the default)
        or keeps it (hold). Every host is planned before any changes: an unreachable host
        stops the rollout with nothing changed (exit 3).
        Running the same deploy twice changes nothing the second time — unless the release
        is live but was never judged (its deploy was interrupted or killed): then it is
        restarted and judged again, never reported unchanged.

        A failure, Ctrl-C/SIGTERM after the switch, or the host's guard timer puts back the
        last good release (else the baseline), never an unjudged one. Ctrl-C before the
        switch stops with nothing live changed. Exit 130 on an interrupt.

        Examples:

          opsctl deploy ar-tp8 -i inventories/lab --yes

          opsctl deploy ddtree --budget 16 -i inventories/lab --dry-run

          opsctl deploy ddtree --budget-schedule 1:16,3:4,16:0 -i inventories/lab --yes

          opsctl deploy ddtree --budget 16 --capture-from-traffic --dry-run -i inventories/lab

          OPSCTL_INVENTORY=inventories/blackwell opsctl deploy ddtree --budget 16
        """
        from opsctl.flow import deploy as core

        _output.set_json(json_out)
        printer = _StepPrinter(json_out, verbose)

        def confirm(plan: Plan) -> bool:
            if yes:
                return True
            if json_out or not sys.stdin.isatty():
                # nobody can answer the question: a script must say --yes explicitly
                raise ConfigError("deploy needs confirmation and there is no terminal to ask on",
                                  "add --yes (or review the plan first with --dry-run)")
            _print_plan(plan.as_dict())
            return typer.confirm(f"apply this to {plan.host.name}?", default=False)

        outcomes = core.deploy(_common.inventory(inventory), profile, budget, budget_schedule=budget_schedule, limit=limit, dry_run=dry_run,
                               gates=not no_gate, pre_checks=not skip_checks, progress=printer, confirm=confirm,
                               verify_weights=verify_weights,
                               capture_from_traffic=_common.capture_options(capture_from_traffic, traffic_since,
                                                                            max_padding))
        if json_out:
            _output.emit_json({"ok": True, "outcomes": [o.as_dict() for o in outcomes]})
            return
        for o in outcomes:
            if o.details.get("capture_plan"):
                from opsctl.capture_plan import describe

                for line in describe(o.details["capture_plan"]):
                    _output.info(f"[{o.host}] {line}")
            if o.result == "dry-run":
                _print_plan(o.plan)
                if o.details.get("wave"):
                    _output.info(f"  rollout wave: {o.details['wave']}")
                _output.info("dry run: nothing was changed")
            else:
                wave = f" ({o.details['wave']} of rollout {o.details['rollout']})" if o.details.get("rollout") else ""
                fixed = o.details.get("repaired") or []
                _output.info(f"[{o.host}] {o.result}: {o.release}{wave}"
                             + (f" ({len(fixed)} file(s) repaired: {', '.join(fixed[:3])}{', ...' if len(fixed) > 3 else ''}"
                                + ("; restarted and judged again)" if o.result == "repaired" else ")") if fixed else ""))
                if o.details.get("gap"):
                    from opsctl.drain import describe

                    _output.info(f"[{o.host}] serving {describe(o.details['gap'])}")
                    _print_slower(o.host, o.details.get("startup"))
                elif o.result == "unchanged":
                    _output.info(f"[{o.host}] SGLang not restarted (its unit and runtime are unchanged)")

    @app.command("rollback")
    def rollback_cmd(
        to: Optional[str] = typer.Option(None, "--to", help="RELEASE id, 'previous' (default: the last good release, else the baseline) or 'baseline'."),
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        reason: str = typer.Option("manual rollback", "--reason", help="Why, for the ledger."),
        force: bool = typer.Option(False, "--force", help="Switch to a release whose gate verdict failed, or that no "
                                   "gate ever passed (a --no-gate deploy's, a tune's trial release); it serves, "
                                   "but the last good release stays the last one that passed its gate."),
        quick_verify: bool = typer.Option(False, "--quick-verify", help="Check the drafter by sampled hashes (start, "
                                          "middle and end of each file) instead of every byte before switching; "
                                          "the runtime tree and rendered files are always hashed in full."),
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Switch back to the previous good release (or the one named), wait until it is ready, record it.

        A release whose gate verdict failed is refused (exit 2) unless --force. Before anything
        changes: room on the host's disk for the switch and its records (exit 3), and the
        release's files (rendered files, runtime tree, drafter) against its manifest by full
        sha256 (exit 6 when they differ). A release that does not become ready is recorded as
        failed and the next good release (else the baseline) is tried; the command then exits 5
        naming what serves. With the host's ledger deleted, name the release: --to RELEASE
        ('opsctl status' lists those on disk).

        Examples:

          opsctl rollback -i inventories/lab

          opsctl rollback --to baseline -i inventories/lab
        """
        from opsctl.flow.promote import rollback

        _output.set_json(json_out)
        recs = rollback(_common.inventory(inventory), to, limit=limit, reason=reason,
                        progress=_StepPrinter(json_out), force=force, quick_verify=quick_verify)
        if json_out:
            _output.emit_json({"ok": True, "rollbacks": recs})
        else:
            for r in recs:
                _output.info(f"[{r['host']}] rolled back {r.get('from_release')} -> {r['to_release']} "
                             f"(ready in {r.get('ready_s')}s)"
                             + (f"; forced: it was never judged ({r.get('never_judged')}), so it is not last good"
                                if r.get("forced") and r.get("never_judged") else
                                f"; forced: its gate verdict was {r.get('verdict')}, so it is not last good"
                                if r.get("forced") else ""))
                if r.get("gap"):
                    from opsctl.drain import describe

                    _output.info(f"[{r['host']}] {describe(r['gap'])}")
                    _print_slower(r["host"], r.get("startup"))

    @app.command("status")
    def status_cmd(inventory: Optional[Path] = _common.InventoryOpt, limit: Optional[str] = _common.LimitOpt,
                   json_out: bool = _common.JsonOpt) -> None:
        """Show the live release, profile, budget, service state, since when, and the last gate verdict.

        Example: opsctl status -i inventories/lab
        """
        from opsctl import __version__
        from opsctl.flow.inspect import status

        _output.set_json(json_out)
        rows = status(_common.inventory(inventory), limit=limit)
        if json_out:
            _output.emit_json(rows)
            return
        fleet = any(r.get("rollout") for r in rows)
        _output.table("status", ["host", "release", "profile", "budget", "service", "since", "restarts", "verdict",
                                 "watch", *(["rollout"] if fleet else [])],
                      [[r["host"], r["release"] or "-", r["profile"] or "-",
                        r.get("budget_schedule") or r["budget"] or "-", f"{r['service']}/{r['sub_state']}", r["since"] or "-", r["restarts"],
                        _verdict_cell(r),
                        _watch_cell(r.get("watch") or {}), *([r.get("rollout") or "-"] if fleet else [])]
                       for r in rows])
        for r in rows:
            lost = (r.get("ledger") or {}).get("problem")
            if lost:
                _output.error(f"{r['host']}: {lost} (fix: 'opsctl rollback --to RELEASE' puts one of them live and "
                              "starts a new ledger; 'opsctl deploy PROFILE' judges a release again)")
            nr = r.get("live_not_ready")
            if nr:
                _output.error(f"{r['host']}: the live release {r['release']} did NOT become ready after the switch to it "
                              f"({nr.get('reason') or 'rollback'}, {nr.get('ts')}): {nr.get('error') or 'not ready'}"
                              + (f"; also tried: {', '.join(nr['tried'])}" if nr.get("tried") else "")
                              + f" (fix: see 'journalctl -u {r.get('unit') or 'UNIT'}' on the host, then 'opsctl "
                                f"rollback --to RELEASE' or deploy again)")
            u = r.get("unfinished_deploy")
            if u:
                if u.get("result") == "interrupted":
                    _output.info(f"[{r['host']}] note: the deploy of {u.get('to_release')} was interrupted "
                                 f"({u.get('signal')}) during {u.get('step')}"
                                 + (" after the switch" if u.get("switched") else ", before the switch"))
                else:
                    _output.info(f"[{r['host']}] note: the deploy of {u.get('to_release')} started {u.get('ts')} "
                                 "has not finished (running now, or its controller died; "
                                 + ("the host's guard timer reverts an unconfirmed release)" if r.get("guard_armed")
                                    else "no guard timer is armed on the host: nothing reverts it by itself)"))
            if nr or lost:
                pass  # said above
            elif r["release"] and r.get("judged") is False and ((r.get("last_verdict") or {}).get("status")
                                                                 not in (None, "pass")):
                _output.info(f"[{r['host']}] note: the live release {r['release']} failed its gate "
                             f"({r['last_verdict']['status']}); the last good release is {r.get('last_good') or 'none'}")
            elif r["release"] and r.get("judged") is False:
                _output.info(f"[{r['host']}] note: the live release {r['release']} was never judged"
                             + (f" ({r['never_judged']})" if r.get("never_judged") else "")
                             + f"; the last good release is {r.get('last_good') or 'none'}")
            lr = r.get("last_resort")
            if lr:
                _output.info(f"[{r['host']}] note: {r['release']} serves as the deploy guard's last resort "
                             f"({lr.get('ts')}): every fallback failed ({', '.join(lr.get('tried') or [])}), so the "
                             f"release that served when the guard began started again; it was never judged")
            built = r.get("opsctl_version")
            if r["release"] and built and built != __version__:
                _output.info(f"[{r['host']}] note: {r['release']} was built by opsctl {built}; this is opsctl "
                             f"{__version__}")
            jc = r.get("jit_cache")
            if jc:   # issue #51: will the next start find FlashInfer's and SGLang's JIT kernels built?
                word = {True: "warm", False: "COLD", None: "unknown"}[jc.get("warm")]
                _output.info(f"[{r['host']}] JIT caches for the next start: {word}: {jc.get('why')}")
            sv = r.get("serving")
            if sv:   # the runtime's own word on what serves (issue #50 item 2)
                _output.info(f"[{r['host']}] serving: DDTree {sv['active']} (the runtime's /server_info)"
                             + ("" if sv.get("matches") else
                                f"; NOT what {r['release']} means to serve ({sv.get('intended')})")
                             + (f"; the runtime refused a control file: {sv['last_refusal']}"
                                if sv.get("last_refusal") else ""))
            sw = r.get("last_switch")
            if sw:
                from opsctl.drain import describe

                _output.info(f"[{r['host']}] last switch ({sw.get('why')}, {sw.get('ts')}): {describe(sw)}")
            st = r.get("last_start")
            if st:
                from opsctl.startup import one_line

                _output.info(f"[{r['host']}] last start of {st['release']} ({st.get('why')}, {st.get('ts')}): "
                             + (f"{one_line(st)}" if st.get("recorded") is not False else
                                "its phases were not recorded (the switch is on the host's record; the controller "
                                "that switched did not record the start: it was lost, or waits for it now); "
                                f"the service is {r['service']}/{r['sub_state']} since {r['since'] or '?'}"))
            lv = r.get("last_verdict")
            if lv:
                _output.info(f"[{r['host']}] verdict of {lv['release']}: {lv['status']} ({lv['ts']})"
                             + ("; its gate then, it does not serve now" if nr else ""))
            for p in r.get("ledger_problems") or []:
                _output.error(f"{r['host']}: ledger {p} (skipped)")

    @app.command("history")
    def history_cmd(inventory: Optional[Path] = _common.InventoryOpt, limit: Optional[str] = _common.LimitOpt,
                    last: Optional[int] = typer.Option(None, "--last", "-n", help="Only the last N records (of each host)."),
                    rollout: Optional[str] = typer.Option(None, "--rollout", help="Only the records of this rollout "
                                                          "id (as 'opsctl status' and a fleet deploy print it)."),
                    json_out: bool = _common.JsonOpt) -> None:
        """Print each host's ledger: every deploy, rollback and gate verdict, with who, when, from, to
        and why; one table per host, with the rollout a record belonged to.

        Examples:

          opsctl history -i inventories/lab --last 10

          opsctl history -i inventories/lab-fleet --rollout r20261201T190000Z-1a2b
        """
        from opsctl.flow.inspect import history

        _output.set_json(json_out)
        problems: list[str] = []
        recs = history(_common.inventory(inventory), limit=limit, last=last, problems=problems, rollout=rollout)
        for p in problems:
            _output.error(p)
        if json_out:
            for r in recs:
                _output.emit_json(r)
            return
        by_host: dict[str, list[dict]] = {}
        for r in recs:
            by_host.setdefault(str(r.get("host")), []).append(r)
        fleet = any(r.get("rollout") for r in recs)
        for host_name, host_recs in by_host.items():
            _output.table(f"history: {host_name}", ["when", "action", "result", "from", "to", "start", "who", "why",
                                                    *(["rollout"] if fleet else [])],
                          [[r.get("ts"), r.get("action"), r.get("result") or r.get("status"),
                            r.get("from_release") or "-", r.get("to_release") or r.get("release") or "-",
                            _start_cell(r), r.get("who"), _why_cell(r),
                            *([r.get("rollout") or "-"] if fleet else [])]
                           for r in host_recs])
            sw = next((r for r in reversed(host_recs) if r.get("action") == "switch"), None)
            if sw:
                from opsctl.drain import describe

                _output.info(f"[{host_name}] last switch ({sw.get('why')}, {sw.get('ts')}): {describe(sw)}")
        if not recs:
            _output.info("no ledger records" + (f" of rollout {rollout}" if rollout else ""))
