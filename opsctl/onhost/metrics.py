"""opsctl's host-side metrics: a node_exporter textfile-collector file, kept current on the host
with no controller (issue #54).

What opsctl knows of the host (the serving release, the last verdict, the switches and rollbacks
by cause, the last switch's drain / stop / start / gap, the last start's phases, the watch's
state and last tick, the guard's state) is read from the host's own files (the `current` link,
the releases' manifests, `ledger.jsonl`, the watch's state file, the guard's systemd units) and
written in Prometheus's text exposition format (0.0.4) to the textfile collector's directory
(Debian's default `/var/lib/prometheus/node-exporter/opsctl.prom`), atomically: a temporary
file in the same directory, fsynced, renamed over the old one, so node_exporter never reads
half a file.

Who writes it: every ledger append (`bin/opsctl-ledger-append`: the controller, the guard, the
switch script and the watch all append through it) and every tick of the watch. Its
configuration is `<root>/metrics.json` (written by the prepare playbook from the inventory's
`opsctl.metrics`; `textfile: null` turns the file off). Counters are counted from the ledger,
which only grows, so they never go down (a rewritten ledger reads as a counter reset).

docs/metrics.md names every metric and every label value. Standard library only (Python >= 3.8).

usage: opsctl-onhost.pyz metrics [--root ROOT] [--print]
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from . import analysis, ledger_records

CONFIG_NAME = "metrics.json"
TEXTFILE_DEFAULT = "/var/lib/prometheus/node-exporter/opsctl.prom"
STATE_DIR_DEFAULT = "/var/lib/opsctl-watch"

SWITCH_CAUSES = ("deploy", "trial", "rollback", "restore", "guard", "watch")
ROLLBACK_CAUSES = ("deploy", "operator", "guard", "watch")
RESULTS = ("ok", "failed")
WATCH_STATES = ("healthy", "idle", "unknown", "breach", "deploying", "tripped", "paused", "no-release")
GUARD_STATES = ("idle", "armed", "running", "failed")
SWITCH_PARTS = ("drain", "stop", "start", "gap")

Labels = Dict[str, str]


# --------------------------------------------------------------------------- the exposition format


class Exposition:
    """Metric families in Prometheus's text format 0.0.4, written by hand (the host has no
    prometheus_client): `# HELP`, `# TYPE`, then the samples, each family once."""

    def __init__(self) -> None:
        self._families: List[Tuple[str, str, str, List[Tuple[Labels, float]]]] = []
        self._index: Dict[str, int] = {}

    def add(self, name: str, kind: str, help_text: str, value: Optional[float], labels: Optional[Labels] = None) -> None:
        """One sample of `name` (declared on first use); None or NaN values are left out (a
        figure opsctl does not know is absent, not 0)."""
        if name not in self._index:
            self._index[name] = len(self._families)
            self._families.append((name, kind, help_text, []))
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        self._families[self._index[name]][3].append((dict(labels or {}), float(value)))

    def text(self) -> str:
        out = []
        for name, kind, help_text, samples in self._families:
            if not samples:
                continue
            out.append(f"# HELP {name} {_escape_help(help_text)}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lab = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
                out.append(f"{name}{{{lab}}} {_value(value)}" if lab else f"{name} {_value(value)}")
        return "\n".join(out) + "\n"


def _escape_help(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


# --------------------------------------------------------------------------- what the ledger says (pure)


def _num(v: Any) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _ts(iso: Any) -> Optional[float]:
    """`2026-12-05T09:35:01Z` (the ledger's stamps, UTC) as Unix seconds."""
    if not isinstance(iso, str):
        return None
    try:
        import calendar

        return float(calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def rollback_cause(rec: dict) -> str:
    """Who rolled back: the deploy guard (`opsctl-guard@`), the watch (`opsctl-watch@`), a deploy
    whose release failed (its gate, its start, an interrupt: `automatic`), else an operator
    (`opsctl rollback`)."""
    who = str(rec.get("who") or "")
    if rec.get("guard") or who.startswith("opsctl-guard@"):
        return "guard"
    if who.startswith("opsctl-watch@") or isinstance(rec.get("watch"), dict):
        return "watch"
    return "deploy" if rec.get("automatic") else "operator"


def _switched(rec: dict) -> bool:
    """A guard's or the watch's rollback record that switched (they leave no `switch` record)."""
    return rec.get("result") == "ok" or bool(rec.get("switched"))


def _start_of(rec: dict) -> Optional[dict]:
    """A switch record's start when it got ready and has a total (opsctl.startup._ready_start)."""
    st = rec.get("startup")
    if rec.get("action") != "switch" or rec.get("result") == "not-ready" or not isinstance(st, dict):
        return None
    return st if _num(st.get("total_s")) else None


def _phases(st: dict) -> List[Tuple[str, float]]:
    raw = st.get("phases") or []
    if isinstance(raw, dict):
        items = list(raw.items())
    else:
        items = [(p.get("phase"), p.get("seconds")) for p in raw if isinstance(p, dict)]
    return [(str(k), float(v)) for k, v in items if k and _num(v) is not None]


def ledger_summary(records: Iterable[dict]) -> dict:
    """Counters and last records of a ledger, oldest record first."""
    switches = {c: 0 for c in SWITCH_CAUSES}
    rollbacks = {(c, r): 0 for c in ROLLBACK_CAUSES for r in RESULTS}
    verdicts: Dict[str, dict] = {}
    last_verdict = last_switch = last_start = None
    starts: List[dict] = []
    for rec in records:
        action = rec.get("action")
        if action == "switch":
            cause = str(rec.get("why") or "deploy")
            switches[cause] = switches.get(cause, 0) + 1
            last_switch = rec
            if _start_of(rec) is not None:
                starts.append(rec)
        elif action == "rollback":
            cause = rollback_cause(rec)
            result = "ok" if rec.get("result") == "ok" else "failed"
            rollbacks[(cause, result)] = rollbacks.get((cause, result), 0) + 1
            if cause in ("guard", "watch") and _switched(rec):
                switches[cause] += 1
        elif action == "verdict":
            last_verdict = rec
            if rec.get("release"):
                verdicts[str(rec["release"])] = rec
    if starts:
        last = starts[-1]
        prof = last["startup"].get("profile")
        prev = next((r for r in reversed(starts[:-1]) if r["startup"].get("profile") == prof), None)
        last_start = {"record": last, "previous": prev}
    return {"switches": switches, "rollbacks": rollbacks, "verdicts": verdicts, "last_verdict": last_verdict,
            "last_switch": last_switch, "last_start": last_start}


# --------------------------------------------------------------------------- the host's state (I/O)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _json(path: str) -> Any:
    text = _read(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


_SUMMARY_CACHE: Dict[str, Tuple[tuple, dict]] = {}


def ledger_summary_of(root: str) -> dict:
    """The ledger's summary, read again only when the file changed (its inode, size or mtime): the
    watch writes the file every tick and the ledger changes with a record, not with a tick."""
    path = os.path.join(root, "ledger.jsonl")
    try:
        st = os.stat(path)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    hit = _SUMMARY_CACHE.get(path)
    if key is not None and hit is not None and hit[0] == key:
        return hit[1]
    summary = ledger_summary(read_ledger(root))
    if key is not None:
        _SUMMARY_CACHE[path] = (key, summary)
    return summary


def read_ledger(root: str) -> List[dict]:
    """The ledger as its readers take it: a switch with its start's figures (ledger_records)."""
    try:
        with open(os.path.join(root, "ledger.jsonl"), "rb") as f:
            return ledger_records.fold_switches(ledger_records.json_records(f.read()))
    except OSError:
        return []


def guard_state(unit: str, run=subprocess.run) -> Optional[str]:
    """The deploy guard's transient units (`<unit>.timer` armed by a switch, `<unit>.service` its
    revert): armed | running | failed | idle; None when systemctl cannot be asked."""
    try:
        res = run(["systemctl", "show", f"{unit}.timer", f"{unit}.service", "-p", "Id", "-p", "ActiveState"],
                  capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    states: Dict[str, str] = {}
    for block in res.stdout.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            states[props["Id"]] = props.get("ActiveState", "")
    svc, timer = states.get(f"{unit}.service", ""), states.get(f"{unit}.timer", "")
    if svc in ("active", "activating", "deactivating"):
        return "running"
    if svc == "failed":
        return "failed"
    if timer in ("active", "activating"):
        return "armed"
    return "idle"


def collect(root: str, cfg: Optional[dict] = None, now: Optional[float] = None, run=subprocess.run) -> dict:
    """Everything the file says, read from the host (`cfg`: metrics.json's content)."""
    cfg = cfg or {}
    now = time.time() if now is None else now
    try:
        current = os.path.basename(os.readlink(os.path.join(root, "current")))
    except OSError:
        current = None
    manifest = _json(os.path.join(root, "releases", current, "manifest.json")) if current else None
    watch_cfg = _json(cfg.get("watch_config") or os.path.join(root, "watch.json"))
    watch_state = None
    if isinstance(watch_cfg, dict) and watch_cfg.get("service"):
        state_dir = watch_cfg.get("state_dir") or STATE_DIR_DEFAULT
        watch_state = _json(os.path.join(state_dir, f"{watch_cfg['service']}.json"))
    guard = guard_state(cfg["guard_unit"], run=run) if cfg.get("guard_unit") else None
    return {"now": now, "current": current, "manifest": manifest if isinstance(manifest, dict) else None,
            "ledger": ledger_summary_of(root), "cfg": cfg,
            "watch_cfg": watch_cfg if isinstance(watch_cfg, dict) else None,
            "watch_state": watch_state if isinstance(watch_state, dict) else None, "guard": guard}


def _floor(cfg: dict, manifest: Optional[dict]) -> Optional[float]:
    """The live release's accept-length floor after promotion: its profile's analysis (the
    controller's spec, as the watch reads it) fitted to its manifest."""
    prof = (manifest or {}).get("profile") or {}
    data = (cfg.get("analysis") or {}).get(prof.get("name", "")) or cfg.get("default_analysis")
    if not data or not prof:
        return _num(prof.get("accept_len_floor")) if prof.get("kind") not in (None, "autoregressive") else None
    try:
        return analysis.AnalysisSpec.from_dict(data).for_release(prof).accept_length.watch_floor
    except (ValueError, KeyError, TypeError):
        return None


# --------------------------------------------------------------------------- the file's content (pure)


def exposition(snap: dict) -> str:
    e = Exposition()
    led = snap["ledger"]
    cur, man = snap["current"], snap["manifest"] or {}
    prof = man.get("profile") or {}
    wheel = man.get("runtime_wheel") or {}
    e.add("opsctl_release_info", "gauge",
          "The release the host serves (its current link): 1, with what it is as labels.",
          1 if cur else None,
          {"release": cur or "", "profile": str(prof.get("name") or ""), "kind": str(prof.get("kind") or ""),
           "budget": "" if prof.get("budget") is None else str(prof.get("budget")),
           "schedule": str(prof.get("budget_schedule") or ""),
           "runtime": str(wheel.get("sha256") or "")[:12], "opsctl_version": str(man.get("opsctl_version") or "")})
    judged = led["verdicts"].get(cur) if cur else None
    e.add("opsctl_release_judged", "gauge",
          "1 when the serving release has a verdict in the ledger (any status), 0 when it serves unjudged.",
          (1 if judged else 0) if cur else None)
    e.add("opsctl_release_verdict_pass", "gauge",
          "1 when the serving release's last verdict passed, 0 when it did not or it has none.",
          (1 if judged and judged.get("status") == "pass" else 0) if cur else None)
    floor = _floor(snap["cfg"], man) if cur else None
    e.add("opsctl_accept_length_floor", "gauge",
          "The serving release's accept-length floor after promotion (its profile's analysis); absent: none.",
          floor)

    v = led["last_verdict"]
    if v:
        e.add("opsctl_verdict_info", "gauge", "The last verdict recorded on the host: 1, with its release and status.",
              1, {"release": str(v.get("release") or ""), "profile": str(v.get("profile") or ""),
                  "status": str(v.get("status") or "")})
        e.add("opsctl_verdict_timestamp_seconds", "gauge", "When the last verdict was recorded (Unix seconds).",
              _ts(v.get("ts")))
        for row in v.get("rows") or []:
            if not isinstance(row, dict) or row.get("concurrency") is None:
                continue
            lab = {"concurrency": str(row["concurrency"])}
            d, lo, hi = _num(row.get("delta_pct")), _num(row.get("low_pct")), _num(row.get("high_pct"))
            e.add("opsctl_verdict_speedup_ratio", "gauge",
                  "The last verdict's judged throughput change against the baseline at a concurrency (0.05: +5 %).",
                  None if d is None else d / 100, lab)
            e.add("opsctl_verdict_speedup_low_ratio", "gauge",
                  "Lower bound of the last verdict's speedup interval at a concurrency (ratio).",
                  None if lo is None else lo / 100, lab)
            e.add("opsctl_verdict_speedup_high_ratio", "gauge",
                  "Upper bound of the last verdict's speedup interval at a concurrency (ratio; +Inf: one-sided).",
                  None if lo is None else (math.inf if hi is None else hi / 100), lab)

    for cause, n in sorted(led["switches"].items()):
        e.add("opsctl_switches_total", "counter",
              "Switches of the serving release recorded in the ledger, by cause.", n, {"cause": cause})
    for (cause, result), n in sorted(led["rollbacks"].items()):
        e.add("opsctl_rollbacks_total", "counter",
              "Rollbacks recorded in the ledger, by cause and result.", n, {"cause": cause, "result": result})

    sw = led["last_switch"]
    if sw:
        e.add("opsctl_last_switch_info", "gauge", "The last switch: 1, with its cause, releases and result.", 1,
              {"cause": str(sw.get("why") or ""), "from_release": str(sw.get("from_release") or ""),
               "to_release": str(sw.get("to_release") or ""), "result": str(sw.get("result") or "")})
        e.add("opsctl_last_switch_timestamp_seconds", "gauge", "When the last switch was recorded (Unix seconds).",
              _ts(sw.get("ts")))
        for part in SWITCH_PARTS:
            e.add(f"opsctl_last_switch_{part}_seconds", "gauge", {
                "drain": "The last switch's drain: waiting for in-flight requests before the stop.",
                "stop": "The last switch's stop: from the stop to the old server gone.",
                "start": "The last switch's start: from the old server gone to ready.",
                "gap": "The last switch's gap: no server answering, from the stop to ready."}[part],
                _num(sw.get(f"{part}_s")))

    ls = led["last_start"]
    if ls:
        rec, prev = ls["record"], ls["previous"]
        st = rec["startup"]
        e.add("opsctl_last_start_info", "gauge", "The last start that got ready: 1, with its release and profile.", 1,
              {"release": str(rec.get("to_release") or ""), "profile": str(st.get("profile") or "")})
        e.add("opsctl_last_start_seconds", "gauge",
              "The last start that got ready: first line to ready (at the site's scale in the lab).",
              _num(st.get("total_s")))
        e.add("opsctl_last_start_timestamp_seconds", "gauge", "When the last start was recorded (Unix seconds).",
              _ts(rec.get("ts")))
        for phase, s in _phases(st):
            e.add("opsctl_last_start_phase_seconds", "gauge", "The last start's phases (opsctl.startup's keys).",
                  s, {"phase": phase})
        if prev:
            e.add("opsctl_previous_start_seconds", "gauge",
                  "The start of the same profile before the last one (what the last is compared with).",
                  _num(prev["startup"].get("total_s")))

    wcfg, wst = snap["watch_cfg"], snap["watch_state"]
    e.add("opsctl_watch_enabled", "gauge", "1 when the host-side watch is configured (opsctl.watch.enabled).",
          1 if wcfg else 0)
    if wcfg:
        e.add("opsctl_watch_interval_seconds", "gauge", "The watch's tick interval.", _num(wcfg.get("interval_s")))
        last = (wst or {}).get("last") or {}
        state = last.get("state")
        for s in WATCH_STATES:
            e.add("opsctl_watch_state", "gauge", "The watch's state at its last completed tick: 1 for the state.",
                  (1 if s == state else 0) if state else None, {"state": s})
        e.add("opsctl_watch_last_tick_timestamp_seconds", "gauge",
              "When the watch last completed a tick (Unix seconds): time() - this is its silence.", _num(last.get("ts")))
        e.add("opsctl_watch_ticks_total", "counter", "Ticks the watch completed (its state file's count).",
              _num((wst or {}).get("ticks")))
    if snap["guard"] is not None:
        for s in GUARD_STATES:
            e.add("opsctl_guard_state", "gauge",
                  "The deploy guard: armed (a switched release awaits its verdict), running (reverting), failed, idle.",
                  1 if s == snap["guard"] else 0, {"state": s})
    e.add("opsctl_metrics_written_timestamp_seconds", "gauge", "When this file was written (Unix seconds).",
          round(snap["now"], 3))
    return e.text()


# --------------------------------------------------------------------------- writing it


def write_atomic(path: str, text: str) -> None:
    """tmp + fsync + rename in the same directory: node_exporter reads the old file or the new one."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")   # not *.prom: the collector skips it
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_config(root: str) -> Optional[dict]:
    cfg = _json(os.path.join(root, CONFIG_NAME))
    return cfg if isinstance(cfg, dict) else None


def update(root: str, now: Optional[float] = None) -> Optional[str]:
    """Write the file named by `<root>/metrics.json` (nothing without it, or with `textfile` null):
    the path written, or None."""
    cfg = load_config(root)
    if not cfg or not cfg.get("textfile"):
        return None
    write_atomic(cfg["textfile"], exposition(collect(root, cfg, now)))
    return cfg["textfile"]


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="opsctl-onhost.pyz metrics",
                                 description="Write opsctl's node_exporter textfile (docs/metrics.md).")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0]))),
                    help="the install root (default: the one this archive is in)")
    ap.add_argument("--print", action="store_true", help="print the file's content instead of writing it")
    a = ap.parse_args(argv)
    if a.print:
        sys.stdout.write(exposition(collect(a.root, load_config(a.root) or {})))
        return 0
    path = update(a.root)
    if path is None:
        print(f"opsctl-metrics: no {CONFIG_NAME} with a textfile under {a.root} (fix: deploy with opsctl.metrics "
              f"set)", file=sys.stderr)
        return 2
    print(path)
    return 0
