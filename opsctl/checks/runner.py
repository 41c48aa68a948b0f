"""Run the host checks through pytest, programmatically, and collect one result per item.

    report = run_checks(load_inventory("inventories/lab"), "pre")
    report.ok, report.results, report.as_dict(), report.findings()

pytest runs in this process (`pytest.main([...], plugins=[collector, Preloaded(inventory)])`)
on the packaged suite (opsctl/checks/test_pre.py, test_post.py), isolated from any
pytest.ini/pyproject of the caller's directory; its terminal output is kept in
`CheckReport.output`. The plugin gets the Inventory object as loaded (its hosts' SSHSettings
included), not a path to read again.
Core module: no typer/rich.
"""
from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from opsctl.checks import catalog, logic
from opsctl.brake import BRAKE
from opsctl.config import Inventory
from opsctl.errors import ConfigError
from opsctl.findings import Finding

CHECKS_DIR = Path(__file__).resolve().parent
GROUP_FILES = {"pre": ["test_pre.py"], "post": ["test_post.py"], "all": ["test_pre.py", "test_post.py"]}


@dataclass
class CheckResult:
    host: str
    group: str      # pre | post
    check: str      # e.g. gpu_count, unit_file_matches_render
    ok: bool        # passed, or skipped (not applicable)
    outcome: str    # passed | failed | error | skipped
    message: str    # one line: what was found (pass) or what is wrong (fail)
    fix: str = ""
    nodeid: str = ""
    duration_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class CheckReport:
    inventory: str
    group: str
    limit: str | None
    hosts: list[str]
    results: list[CheckResult] = field(default_factory=list)
    pytest_exit_code: int = 0
    duration_s: float = 0.0
    output: str = ""  # pytest's terminal output, for debugging

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results) and self.pytest_exit_code in (0, 1)

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    def result(self, check: str, host: str | None = None) -> CheckResult | None:
        for r in self.results:
            if r.check == check and (host is None or r.host == host):
                return r
        return None

    def counts(self) -> dict[str, int]:
        out = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for r in self.results:
            out[r.outcome] = out.get(r.outcome, 0) + 1
        return out

    def as_dict(self) -> dict:
        return {"ok": self.ok, "inventory": self.inventory, "group": self.group, "limit": self.limit,
                "hosts": self.hosts, "counts": self.counts(), "duration_s": round(self.duration_s, 2),
                "results": [r.as_dict() for r in self.results]}

    def findings(self) -> list[Finding]:
        return [Finding(check=f"{r.group}.{r.check}", ok=r.ok, diagnosis=r.message, fix="" if r.ok else r.fix,
                        details={"host": r.host, "group": r.group, "outcome": r.outcome, "nodeid": r.nodeid})
                for r in self.results]

    def summary(self) -> str:
        c = self.counts()
        head = f"{self.group} checks on {', '.join(self.hosts)}: {c['passed']} passed, " \
               f"{c['failed'] + c['error']} failed, {c['skipped']} skipped"
        if self.failed:
            f = self.failed[0]
            head += f"; first failure: [{f.host}] {f.group}.{f.check}: {f.message}"
        return head


class _Collector:
    """pytest plugin: one CheckResult per test item, worst phase wins."""

    def __init__(self) -> None:
        self.items: dict[str, dict] = {}
        self.order: list[str] = []
        self.collect_errors: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001 - pytest's TestReport
        props = dict(report.user_properties)
        rec = self.items.get(report.nodeid)
        if rec is None:
            rec = {"nodeid": report.nodeid, "host": props.get("opsctl_host", "?"),
                   "group": props.get("opsctl_group", "?"), "check": props.get("opsctl_check", report.nodeid),
                   "outcome": "passed", "message": "", "duration_s": 0.0}
            self.items[report.nodeid] = rec
            self.order.append(report.nodeid)
        rec["duration_s"] += getattr(report, "duration", 0.0) or 0.0
        if "detail" in props and rec["outcome"] == "passed":
            rec["message"] = str(props["detail"])
        if report.failed:
            if rec["outcome"] not in ("failed", "error"):
                rec["outcome"] = "failed" if report.when == "call" else "error"
                rec["message"] = _failure_message(report)
        elif report.skipped and rec["outcome"] == "passed":
            rec["outcome"] = "skipped"
            rec["message"] = "skipped: " + _skip_reason(report)

    def pytest_collectreport(self, report) -> None:  # noqa: ANN001
        if report.failed:
            self.collect_errors.append((report.nodeid or "collection", _failure_message(report)))


def _failure_message(report) -> str:  # noqa: ANN001
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        text = crash.message
    else:
        text = str(getattr(report, "longreprtext", "") or report.longrepr or "failed")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        e_lines = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
        text = e_lines[0] if e_lines else (lines[-1] if lines else "failed")
    first = text.strip().splitlines()[0] if text.strip() else "failed"
    for prefix in ("AssertionError: ", "Failed: ", "RuntimeError: "):
        if first.startswith(prefix):
            first = first[len(prefix):]
    return logic.one_line(first)


def _skip_reason(report) -> str:  # noqa: ANN001
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        reason = str(lr[2])
    else:
        reason = str(lr or "")
    return logic.one_line(reason.removeprefix("Skipped: "))


def run_checks(inventory: Inventory, group: str = "all", limit: str | None = None, *,
               extra_args: list[str] | None = None) -> CheckReport:
    """Run the `pre`, `post` or `all` host checks against the inventory's hosts (narrowed by
    `limit`). Returns a CheckReport; never raises for failing checks (see `.ok`)."""
    import pytest

    from opsctl.checks import plugin

    if group not in GROUP_FILES:
        raise ConfigError(f"unknown check group {group!r}", "use pre, post or all")
    hosts = inventory.select(limit)  # a bad --limit is a ConfigError before anything runs
    collector = _Collector()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="opsctl-check-run-") as tmp:
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n")  # keep the caller's pytest.ini/pyproject (addopts...) out
        args = ["-c", str(ini), "--rootdir", str(CHECKS_DIR), "-p", "no:cacheprovider", "-p", "testinfra.plugin", "-p", "opsctl.checks.plugin",
                "-q", "-o", "console_output_style=classic",
                "--inventory", str(inventory.path),
                *(["--limit", limit] if limit else []),
                *(extra_args or []),
                *[str(CHECKS_DIR / f) for f in GROUP_FILES[group]]]
        out = io.StringIO()
        # pytest.main changes os.environ (PYTEST_CURRENT_TEST, PYTEST_VERSION); when run_checks is
        # itself called from a test, the outer session needs its own values back
        env_backup = dict(os.environ)
        try:
            os.environ.pop("OPSCTL_LIMIT", None)
            # only the plugins the checks need (testinfra's, opsctl's): whatever else is installed
            # beside them (xdist, anyio, ...) neither changes the checks nor costs a second per run
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
            # an interrupt must not be reported by pytest as a failing check: held until it ends
            with BRAKE.held(), contextlib.redirect_stdout(out):
                # the plugin takes this inventory as loaded (no second read from disk)
                code = int(pytest.main(args, plugins=[collector, plugin.Preloaded(inventory)]))
        finally:
            os.environ.clear()
            os.environ.update(env_backup)
    report = CheckReport(inventory=str(inventory.path), group=group, limit=limit, hosts=[h.name for h in hosts],
                         pytest_exit_code=code, duration_s=time.monotonic() - t0, output=out.getvalue())
    for nodeid in collector.order:
        rec = collector.items[nodeid]
        ok = rec["outcome"] in ("passed", "skipped")
        unit = hosts[0].unit_name if len(hosts) == 1 else None
        port = hosts[0].http_port if len(hosts) == 1 else None
        for h in hosts:
            if h.name == rec["host"]:
                unit, port = h.unit_name, h.http_port
        report.results.append(CheckResult(
            host=rec["host"], group=rec["group"], check=rec["check"], ok=ok, outcome=rec["outcome"],
            message=rec["message"] or ("ok" if ok else "failed"),
            fix="" if ok else catalog.fix_for("ssh_reachable" if rec["message"].startswith("host unreachable")
                                              else rec["check"], unit, port), nodeid=nodeid,
            duration_s=round(rec["duration_s"], 3)))
    for where, msg in collector.collect_errors:
        report.results.append(CheckResult(host="-", group=group, check="collection", ok=False, outcome="error",
                                          message=f"{where}: {msg}", fix="see CheckReport.output", nodeid=where))
    if code not in (0, 1) and not collector.collect_errors:
        tail = [ln for ln in report.output.splitlines() if ln.strip()][-1:] or [f"exit {code}"]
        report.results.append(CheckResult(host="-", group=group, check="pytest", ok=False, outcome="error",
                                          message=f"pytest exited {code}: {logic.one_line(tail[0])}",
                                          fix="see CheckReport.output"))
    return report
