"""opsctl validate: prove the CUDA graphs were captured right, from a saved log or the live host."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from opsctl.cli import _common, _output
from opsctl.errors import CheckFailed, ConfigError

if TYPE_CHECKING:
    from opsctl.findings import Finding


def _status(f: Finding) -> str:
    if not f.ok:
        return "FAIL"
    return "unknown" if f.details.get("status") == "unknown" else "ok"


def _print_findings(findings: list[Finding], title: str) -> None:
    from rich.markup import escape

    # diagnoses quote log text ("[2026-05-30 ... TP0]", "[rank0]"): escape it so rich prints it as is
    rows = [[_status(f), f.check, escape(f.diagnosis), "" if f.ok else escape(f.fix)] for f in findings]
    _output.table(escape(title), ["", "check", "diagnosis", "fix"], rows)


def _finish(findings: list[Finding], title: str, json_out: bool, extra: Optional[dict] = None) -> None:
    ok = all(f.ok for f in findings)
    if json_out:
        _output.emit_json({"ok": ok, **(extra or {}), "findings": [f.model_dump() for f in findings]})
    else:
        _print_findings(findings, title)
        if ok:
            _output.info(f"validation passed: {len(findings)} checks")
    if not ok:
        failed = [f for f in findings if not f.ok]
        raise CheckFailed(f"validation failed: {len(failed)} of {len(findings)} checks "
                          f"({', '.join(f.check for f in failed)})", failed[0].fix or None,
                          details={"findings": [f.model_dump() for f in failed]})


def _pick_starts(parsed, start: str, from_file: Path) -> list[tuple[int, object]]:
    """(1-based number, parsed start) for `--start N|last|all`."""
    from opsctl import journal

    segs = journal.starts(parsed)
    if start == "all":
        return list(enumerate(segs, 1))
    if start == "last":
        return [(len(segs), segs[-1])]
    try:
        n = int(start)
    except ValueError:
        n = 0
    if not 1 <= n <= len(segs):
        raise ConfigError(f"--start {start}: {from_file} holds {len(segs)} start(s) of the service",
                          f"use --start 1..{len(segs)}, --start last (the default) or --start all")
    return [(n, segs[n - 1])]


def _offline(from_file: Path, profile_name: Optional[str], budget: Optional[int],
             max_concurrency: Optional[int], only: Optional[str], json_out: bool,
             budget_schedule: Optional[str] = None, start: str = "last") -> None:
    from opsctl import journal
    from opsctl.config import resolve_profile
    from opsctl.journal_findings import (expectations_from_log, validate, validate_decode, validate_excerpt,
                                 validate_startup)

    if profile_name is None and (budget is not None or budget_schedule is not None):
        raise ConfigError(f"{'--budget' if budget is not None else '--budget-schedule'} applies to --profile ddtree",
                          "add --profile ddtree, or drop --budget to take the expectations from the log's "
                          "server_args line")
    if not from_file.is_file():
        raise ConfigError(f"--from-file {from_file}: no such file",
                          "save the journal first: journalctl -u UNIT --since '<release start>' > FILE "
                          "(or -o json --all)")
    profile = None
    if profile_name is not None:
        overrides = {profile_name: {"max_concurrency": max_concurrency}} if max_concurrency else None
        profile = resolve_profile(profile_name, budget, overrides=overrides, budget_schedule=budget_schedule)
    whole = journal.load_file(from_file)
    if not whole.lines:
        raise ConfigError(f"{from_file} holds no log lines", "pass a saved journal or an SGLang log excerpt")
    seen = journal.recognise(whole)
    if not seen:
        at = f"{from_file}:{seen.first_unusable.line_no}: " if seen.first_unusable is not None else ""
        raise ConfigError(f"{at}{from_file} holds no SGLang server log lines (no SGLang log prefix, server_args line, "
                          f"traceback through sglang/, SGLang exception or SGLang message)"
                          + (f"; first unusable line: {seen.first_unusable.text.strip()[:120]!r}"
                             if seen.first_unusable is not None else "") + ": it is not a journal of the service",
                          "save one with: journalctl -u UNIT --since '<release start>' > FILE (or -o json --all), or "
                          "paste the SGLang lines of the ticket (traceback included) into a file of their own")
    picked = _pick_starts(whole, start, from_file)
    total = len(journal.starts(whole)) if start != "all" else len(picked)
    findings: list[Finding] = []
    extra: dict | None = None
    labels = []
    for n, parsed in picked:
        expect = profile
        if expect is None:
            # no --profile: check the log against what its own server_args line says it was launched with
            expect = expectations_from_log(parsed, max_concurrency=max_concurrency)
            if expect is None and parsed.failures and only != "decode":
                # a pasted excerpt (a traceback from a ticket): what it shows, and unknown for the rest
                _output.info(f"read as an SGLang log excerpt ({seen.how}); it has no server_args line, so what "
                             "needs the launch args is unknown")
                found = validate_excerpt(parsed)
                if len(picked) > 1:
                    found = [f.model_copy(update={"check": f"start{n}.{f.check}"}) for f in found]
                findings += found
                labels.append("excerpt")
                extra = {**(extra or {}), "excerpt": True, "recognised_by": seen.how}
                continue
            if expect is None and len(picked) > 1 and not parsed.server_args and not parsed.failures:
                # the tail of a start that began before the file (a `--since` window opens on the
                # previous server stopping): nothing of its launch to check it against
                _output.info(f"start {n} of {total} began before the file (no server_args line, no error): "
                             "not validated")
                labels.append("(began before the file)")
                continue
            if expect is None:
                raise ConfigError(f"{from_file} has no server_args line (SGLang prints it at start)"
                                  + (f" in start {n} of {total}" if total > 1 else "")
                                  + ", so the log does not say what to expect",
                                  "pass --profile P (and --budget N for ddtree), e.g. opsctl validate --from-file "
                                  f"{from_file} --profile ddtree --budget 16")
            _output.info(expect.describe())
            extra = {**(extra or {}), "expectations": expect.as_dict()}
        if only == "startup":
            found = validate_startup(parsed, expect)
        elif only == "decode":
            found = validate_decode(parsed, expect, require=True)
        else:
            # a saved log may stop before any load: decode lines are checked when present
            found = validate(parsed, expect, require_decode=False)
        if len(picked) > 1:
            found = [f.model_copy(update={"check": f"start{n}.{f.check}"}) for f in found]
        findings += found
        labels.append(getattr(expect, "label", expect.name))
    where = "" if total == 1 else (f" (all {total} starts)" if len(picked) > 1 else f" (start {picked[0][0]} of {total})")
    if total > 1:
        extra = {**(extra or {}), "starts": total, "validated_starts": [n for n, _ in picked]}
    _finish(findings, f"{from_file.name}{where}: {', '.join(dict.fromkeys(labels))}", json_out, extra)


def _live(inventory: Optional[Path], limit: Optional[str], json_out: bool) -> None:
    # --- live mode: the deploy module reads the journal of the live release ------------------
    from opsctl.flow.validate import validate_live

    findings = validate_live(inventory or Path("inventories/lab"), limit)
    _finish(list(findings), "live release", json_out)


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate_cmd(
        from_file: Optional[Path] = typer.Option(None, "--from-file", "-f", help="Saved journal or SGLang log "
                                                 "excerpt: journalctl text, 'journalctl -o json' export, raw "
                                                 "SGLang output, or a traceback pasted from a ticket. Without it, "
                                                 "validates the live release."),
        profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Profile the log was served with "
                                              "(offline mode): ar-tp8, ar-ep8, dflash, ddtree. Without it, the "
                                              "expectations come from the log's server_args line."),
        budget: Optional[int] = _common.BudgetOpt,
        budget_schedule: Optional[str] = _common.ScheduleOpt,
        max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", min=1, help="Concurrency the "
                                                      "graphs must cover (default: the profile's)."),
        only: Optional[str] = typer.Option(None, "--only", help="Run only the 'startup' or the 'decode' checks "
                                           "(offline mode)."),
        start: str = typer.Option("last", "--start", help="A file spanning several starts of the service "
                                  "(deploys, rollbacks): validate start N (1 = oldest), 'last' (default) or 'all'. "
                                  "A clean stop followed by a start is a new start, not a restart (offline mode)."),
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Check SGLang's journal: graphs captured on every rank with the profile's verify width (with a
        DDTree budget schedule: each band's width for its batch sizes) and batch sizes, no capture failure/OOM/restart, decode lines on CUDA graphs with the right
        draft tokens per round.

        Exit 0 when every check passes, 6 when one fails. With --json, prints {ok, findings} (and
        {expectations} when they come from the log). A field an older SGLang does not print is
        reported as unknown, not failed.

        Examples:

          opsctl validate --from-file journal.txt --profile ddtree --budget 16

          opsctl validate --from-file journal.txt --profile ddtree --budget-schedule 1:16,3:4,16:0

          opsctl validate --from-file journal.txt   # expectations from the log's server_args line

          opsctl validate --from-file whole-journal.txt --start all   # every start in a journal of several deploys

          opsctl validate -i inventories/lab
        """
        _output.set_json(json_out)
        if only not in (None, "startup", "decode"):
            raise ConfigError(f"--only {only!r} is not a check group", "use --only startup or --only decode")
        if from_file is not None:
            _offline(from_file, profile, budget, max_concurrency, only, json_out, budget_schedule, start)
            return
        if (profile is not None or budget is not None or budget_schedule is not None or only is not None
                or max_concurrency is not None or start != "last"):
            raise ConfigError("--profile/--budget/--budget-schedule/--max-concurrency/--only/--start apply to --from-file only; live "
                              "validation reads the profile from the live release",
                              "add --from-file LOG, or drop those options")
        _live(inventory, limit, json_out)
