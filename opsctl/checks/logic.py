"""Pure helpers behind the host checks: parsing what the host prints and deciding.

No I/O here (the test modules run the commands); everything is unit-tested in
tests/checks/test_logic.py.
"""
from __future__ import annotations

import difflib
import re
from typing import Iterable

from opsctl.host.facts import GPU, ComputeApp

# what the checks ask nvidia-smi (fields a real nvidia-smi and the lab's emulation both know)


# --------------------------------------------------------------------------- versions


def parse_version(text: str) -> tuple[int, ...]:
    """'580.95.05' -> (580, 95, 5). Raises ValueError on anything that is not dotted numbers."""
    text = text.strip()
    if not re.fullmatch(r"\d+(\.\d+)*", text):
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(p) for p in text.split("."))


def driver_in_range(version: str, vmin: str | None, vmax: str | None) -> bool:
    """Inclusive range check, compared at each bound's precision: with max '599.99',
    '599.99.01' is in range (it is a 599.99 driver) and '600.0' is not."""
    v = parse_version(version)
    if vmin:
        lo = parse_version(vmin)
        if v[:len(lo)] < lo:
            return False
    if vmax:
        hi = parse_version(vmax)
        if v[:len(hi)] > hi:
            return False
    return True


# --------------------------------------------------------------------------- nvidia-smi
# the GPU facts and their parsers live in opsctl.host.facts (Gpus, GpuProcesses)


def owned_pids(proc_cgroups: str, unit_name: str) -> set[int]:
    """PIDs whose cgroup is `unit_name`'s, from the output of
    `for p in PIDS; do echo "== $p"; cat /proc/$p/cgroup; done`."""
    owned: set[int] = set()
    pid = None
    for line in proc_cgroups.splitlines():
        if line.startswith("== "):
            tail = line[3:].strip()
            pid = int(tail) if tail.isdigit() else None
            continue
        if pid is None:
            continue
        path = line.split(":", 2)[-1].strip()
        if path.rstrip("/").endswith("/" + unit_name) or f"/{unit_name}/" in path:
            owned.add(pid)
    return owned


def foreign_apps(apps: Iterable[ComputeApp], own: set[int]) -> list[ComputeApp]:
    return [a for a in apps if a.pid not in own]


def effective_free_mib(gpus: list[GPU], apps: list[ComputeApp], own: set[int]) -> dict[int, tuple[int, int]]:
    """GPU index -> (free MiB once our own service's memory is given back, MiB our service holds).
    Memory our unit holds does not count as used: the deploy restarts it."""
    ours_by_uuid: dict[str, int] = {}
    for a in apps:
        if a.pid in own:
            ours_by_uuid[a.gpu_uuid] = ours_by_uuid.get(a.gpu_uuid, 0) + a.used_mib
    out = {}
    for g in gpus:
        ours = min(ours_by_uuid.get(g.uuid, 0), g.used_mib)
        out[g.index] = (g.total_mib - (g.used_mib - ours), ours)
    return out


# --------------------------------------------------------------------------- sockets, disk


def ss_pids(text: str) -> set[int]:
    """PIDs in `ss -Hltnp` output (users:(("python3",pid=123,fd=5),...))."""
    return {int(m) for m in re.findall(r"pid=(\d+)", text)}


def df_avail_bytes(text: str) -> tuple[int, str]:
    """(available bytes, mount point) from `df -P -k PATH`."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        raise ValueError(f"unexpected df output: {text!r}")
    fields = lines[-1].split()
    return int(fields[3]) * 1024, fields[-1]


# --------------------------------------------------------------------------- unit drift


def unit_drift(expected: str, actual: str) -> list[str]:
    """The lines where the unit file on disk differs from the render, one message each:
    'line N: expected 'X', found 'Y'', 'line N: missing 'X'', 'line N: unexpected 'Y''.
    Line numbers are the file on disk's (for missing lines: where they should be)."""
    exp, act = expected.splitlines(), actual.splitlines()
    out: list[str] = []
    sm = difflib.SequenceMatcher(a=exp, b=act, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        pairs = min(i2 - i1, j2 - j1) if tag == "replace" else 0
        for k in range(pairs):
            out.append(f"line {j1 + k + 1}: expected {exp[i1 + k]!r}, found {act[j1 + k]!r}")
        for k in range(i1 + pairs, i2):
            out.append(f"line {j1 + pairs + 1}: missing {exp[k]!r}")
        for k in range(j1 + pairs, j2):
            out.append(f"line {k + 1}: unexpected {act[k]!r}")
    if not out and expected != actual:
        out.append("trailing newline differs")
    return out


# --------------------------------------------------------------------------- ledger


SWITCHING_ACTIONS = ("deploy", "promote", "rollback", "switch")   # switch: bin/opsctl-switch's own record


def last_switch_record(ledger: list[dict]) -> dict | None:
    """The newest ledger record that says which release should be current (a record that says it
    did not switch, `switched: false`, does not: a deploy that failed before its switch, a rollback
    target whose files were damaged)."""
    for rec in reversed(ledger):
        if rec.get("action") in SWITCHING_ACTIONS and "to_release" in rec and rec.get("switched") is not False:
            return rec
    return None


# --------------------------------------------------------------------------- messages


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summarize(items: list[str], limit: int = 3) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")
