"""What the DDTree runtime serves, from the runtime itself, against what the live release means it
to serve (issue #50 item 2).

The runtime says which candidate serves in `/server_info`'s `internal_states[0]["ddtree"]`
(`{"active": "1:16,2:8", "trial_set": true, "last_refusal": ...}`; sglang_ddtree's
`ddtree_status`, the lab emulator's the same) and in its `DDTree active:` journal line. A release
means: its budget, or its schedule (`candidate_name`: a one-band schedule is its budget); a trial
release (opsctl tune) the candidate its ledger records (`tune --apply`, keep-trial, a tune's
restore) else its trial set's first. A control file the runtime refused (`DDTree control refused:
budget 31 was not captured`) changes nothing it serves: `status` names what serves, and
`opsctl check post` fails when that differs from what the release means.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from opsctl.host.facts import Fact, loopback_get_py

# GET /server_info with the host's python3; print its ddtree state (or null)
_ON_ANSWER = ("states = (json.loads(body).get('internal_states') or []) if ok else []; "
              "print(json.dumps((states[0] or {}).get('ddtree') if states else None))")


@dataclass(frozen=True)
class ServingDDTree(Fact["dict | None"]):
    """The runtime's DDTree state from `/server_info` on the host's loopback: `{"active": ...,
    "trial_set": ..., "last_refusal": ...}`; None: no answer, or not a DDTree server."""

    python: str
    port: int
    timeout_s: float = 10

    def command(self) -> str:
        py = loopback_get_py(self.port, "/server_info", self.timeout_s, _ON_ANSWER, "print('null')")
        return f"{shlex.quote(self.python)} -c {shlex.quote(py)}"

    def process(self, stdout: str) -> dict | None:
        lines = stdout.strip().splitlines()
        try:
            doc = json.loads(lines[-1]) if lines else None
        except ValueError:
            return None
        return doc if isinstance(doc, dict) and doc.get("active") is not None else None


def recorded_active(ledger: list[dict], release: str) -> str | None:
    """The candidate the ledger last recorded for trial release `release` (its promotion by `tune
    --apply`, a tune that kept it, a tune's restore of it)."""
    for rec in reversed(ledger):
        if rec.get("to_release") == release and rec.get("ddtree_active"):
            return str(rec["ddtree_active"])
        if rec.get("action") == "tune" and rec.get("restored_active") and rec.get("restored") == release:
            return str(rec["restored_active"])
    return None


def intended(info, ledger: list[dict]) -> str | None:
    """The candidate release `info` (a ReleaseInfo) means to serve, in the runtime's words; None for
    a release that is not DDTree."""
    from opsctl.schedule import candidate_name

    if info is None or info.kind != "ddtree":
        return None
    try:
        if info.trial_set:
            return candidate_name(recorded_active(ledger, info.id) or info.trial_set[0])
        if info.budget_schedule:
            return candidate_name(info.budget_schedule)
    except Exception:  # noqa: BLE001 - a name the parser refuses is compared as written
        return str(recorded_active(ledger, info.id) or (info.trial_set or [None])[0] or info.budget_schedule)
    return str(info.budget) if info.budget is not None else None


def same(a: str | None, b: str | None) -> bool:
    """Two candidate names that mean the same (`16` and `1:16`)."""
    from opsctl.schedule import candidate_name

    if a is None or b is None:
        return a == b
    try:
        return candidate_name(a) == candidate_name(b)
    except Exception:  # noqa: BLE001
        return str(a) == str(b)


def as_budget(active: str) -> tuple[int | None, str | None]:
    """(budget, budget_schedule) of a candidate name: `16` -> (16, None), `1:16,2:8` -> (None, '1:16,2:8')."""
    return (int(active), None) if str(active).isdigit() else (None, str(active))
