"""How `ledger.jsonl` is read, on the host (the watch, the metrics file) and by the controller
(opsctl.host.facts.LedgerRecords) alike: one reader, one fold (issues #50, #54).

  json_records     the complete lines of a JSONL text as dicts (a torn last line and non-records skipped)
  fold_switches    a switch recorded on the host with the figures of its controller `start` record

Standard library only (Python >= 3.8): this module runs on the host.
"""
from __future__ import annotations

import json
from typing import List


def json_records(data: bytes) -> List[dict]:
    """The records of JSONL `data` up to its last newline: a line still being appended is not
    read; a line that is not a JSON object is skipped (the controller's reader names them)."""
    out = []
    for line in data[:data.rfind(b"\n") + 1].decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def fold_switches(records: List[dict]) -> List[dict]:
    """The ledger as its readers take it: each switch recorded on the host (bin/opsctl-switch,
    `switch_id`) with the figures of its `start` record (the controller's, after the start) folded
    in, and that `start` record dropped. A switch whose start nobody recorded (the controller was
    lost) stays `result: switched`. Older ledgers (one `switch` record written by the controller
    after the start) read as they always did."""
    starts = {r.get("switch_id"): r for r in records if r.get("action") == "start" and r.get("switch_id")}
    switched = {r.get("switch_id") for r in records if r.get("action") == "switch" and r.get("switch_id")}
    out = []
    for rec in records:
        act = rec.get("action")
        if act == "start" and rec.get("switch_id") in switched:
            continue
        if act == "switch" and rec.get("switch_id") in starts:
            st = starts[rec["switch_id"]]
            rec = {**rec, **{k: v for k, v in st.items() if k not in ("action", "ts", "host", "who", "rollout",
                                                                    "switch_id", "to_release")},
                   "start_ts": st.get("ts")}
        out.append(rec)
    return out
