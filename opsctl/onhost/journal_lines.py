"""How a journal entry of the service is classified, for the controller's journal parser
(opsctl/journal.py) and the watch on the host (watch_agent.py) alike: one classifier (issue #53).

  message_text      a journald MESSAGE as text (non-UTF-8 messages come as byte arrays)
  identifier        who wrote an entry (SYSLOG_IDENTIFIER, else _COMM; PID 1 with neither: systemd)
  unit_event        what systemd's line about the unit says: started, stopping, stopped, exited,
                    failed (a crash: `Failed with result`), restart_scheduled
  CUDA_ERROR, TRACEBACK, READY_LINE   the server's own lines the watch's rules count
  classify          the watch's counts over the entries since its last read

Standard library only (Python >= 3.8): this module runs on the host.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

READY_LINE = "The server is fired up and ready to roll!"
CUDA_ERROR = re.compile(r"CUDA error|CUDA out of memory|NCCL error|cudaError")
TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
UNIT_EVENTS: List[Tuple["re.Pattern[str]", str]] = [
    (re.compile(r"^Started "), "started"),
    (re.compile(r"^Stopping "), "stopping"),
    # `systemctl kill` (opsctl's drain and switch stop the server so, issue #49): a requested stop
    # that prints no `Stopping` line, only this one and `Deactivated successfully`
    (re.compile(r"Sent signal \w+ to main process \d+.* on client request"), "stopping"),
    (re.compile(r"^Stopped "), "stopped"),
    (re.compile(r"Main process exited"), "exited"),
    (re.compile(r"Failed with result"), "failed"),
    (re.compile(r"Scheduled restart job"), "restart_scheduled"),
]


def message_text(value: Any) -> str:
    if isinstance(value, list):  # journald exports non-UTF-8 messages as byte arrays
        try:
            return bytes(value).decode("utf-8", "replace")
        except (TypeError, ValueError):
            return ""
    return "" if value is None else str(value)


def entry_pid(entry: Dict[str, Any]) -> Optional[int]:
    raw = entry.get("_PID") or entry.get("SYSLOG_PID")
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


def identifier(entry: Dict[str, Any]) -> Optional[str]:
    """Who wrote the entry: SYSLOG_IDENTIFIER, else _COMM; PID 1 naming neither is systemd."""
    ident = entry.get("SYSLOG_IDENTIFIER") or entry.get("_COMM")
    if not ident and entry_pid(entry) == 1:
        return "systemd"
    return ident


def unit_event(text: str) -> Optional[str]:
    """The kind of systemd's line about the unit, or None."""
    for pat, kind in UNIT_EVENTS:
        if pat.search(text):
            return kind
    return None


def classify(entries: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    """Counts in the service's journal entries (journalctl -o json) since the last read: the
    server's CUDA errors and tracebacks, systemd's crashes (`failed`) and restarts, ready lines."""
    counts: Dict[str, Any] = {"cuda_errors": 0, "tracebacks": 0, "crashes": 0, "restarts": 0, "ready": 0, "lines": 0,
                              "examples": []}
    for e in entries:
        msg = message_text(e.get("MESSAGE"))
        counts["lines"] += 1
        if identifier(e) == "systemd":
            kind = unit_event(msg)
            if kind == "failed":
                counts["crashes"] += 1
                _example(counts, msg)
            elif kind == "restart_scheduled":
                counts["restarts"] += 1
            continue
        if TRACEBACK.search(msg):
            counts["tracebacks"] += 1
        if CUDA_ERROR.search(msg):
            counts["cuda_errors"] += 1
            _example(counts, msg)
        if READY_LINE in msg:
            counts["ready"] += 1
    return counts


def _example(counts: Dict[str, Any], msg: str) -> None:
    if len(counts["examples"]) < 3:
        counts["examples"].append(msg.strip()[:240])
