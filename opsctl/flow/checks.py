"""The host checks (testinfra) a deploy runs before touching the host and on the new
release before promoting it."""
from __future__ import annotations

from opsctl.config import HostConfig, Inventory
from opsctl.errors import CheckFailed
from opsctl.findings import Finding
from opsctl.flow.steps import GateOutcome, Steps

# --------------------------------------------------------------------------- pre-deploy host checks


def _failed(report) -> list[Finding]:
    failed = [f for f in report.findings() if not f.ok]
    if not report.ok and not failed:  # pytest itself failed (collection error, no checks ran)
        failed = [Finding(check="checks.run", ok=False, diagnosis=report.summary(),
                          fix="run 'opsctl check' to see pytest's output")]
    return failed


def run_pre_checks(inv: Inventory, host: HostConfig, steps: Steps, t0: float) -> None:
    from opsctl.checks.runner import run_checks

    report = run_checks(inv, "pre", host.name)
    failed = _failed(report)
    steps.progress({"event": "findings", "host": host.name, "step": "pre-checks",
                    "findings": [f.model_dump() for f in failed]})
    if failed:
        steps.done("pre-checks", t0, f"{len(failed)} check(s) failed: nothing was changed", status="fail")
        raise CheckFailed(f"{host.name}: pre-deploy check failed: {failed[0].check}: {failed[0].diagnosis}"
                          + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""),
                          (failed[0].fix or "see 'opsctl check pre'") + "; nothing on the host was changed",
                          details={"findings": [f.model_dump() for f in failed]})
    steps.done("pre-checks", t0, f"{len(report.results)} checks passed")


def run_post_checks(inv: Inventory, host: HostConfig, steps: Steps) -> GateOutcome:
    """The post-deploy host checks, run on the new release before it is promoted."""
    from opsctl.checks.runner import run_checks

    t0 = steps.start("post-checks", "host checks on the new release")
    report = run_checks(inv, "post", host.name)
    failed = _failed(report)
    record = {"ok": not failed, "counts": report.counts(), "failed": [f.model_dump() for f in failed]}
    if failed:
        steps.progress({"event": "findings", "host": host.name, "step": "post-checks",
                        "findings": [f.model_dump() for f in failed]})
        steps.done("post-checks", t0, f"{len(failed)} check(s) failed", status="fail")
        return GateOutcome(False, f"{failed[0].check}: {failed[0].diagnosis}", record)
    steps.done("post-checks", t0, f"{len(report.results)} checks passed")
    return GateOutcome(True, "", record)

