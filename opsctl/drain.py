"""The drain before a switch and the serving gap it leaves (issue #35), the parts below the flow:
SGLang 0.5.23's load snapshot (`GET /v1/loads`, entrypoints/v1_loads.py: `loads[]` with
`num_running_reqs` and `num_waiting_reqs`; 0.5.23 has no `/get_load`), the deadline's default,
the load balancer's hooks (a command on the controller or an HTTP call), and `Gap`: when the host
left the pool, when the old server stopped, when the new one was ready, when it was back — the
figures every switch's ledger record carries. The flow (opsctl/flow/switch.py) does the I/O on the
host; nothing here imports the flow.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from opsctl.config import DRAIN_DEADLINE_DEFAULT_S, DRAIN_DEADLINE_MAX_S, DrainHook, DrainSettings, HostConfig
from opsctl.errors import HostError
from opsctl.startup import human_s  # noqa: F401 (one wording of seconds; tune imports it from here)

LOADS_PATH = "/v1/loads"
LAB_TIME_SCALE_FILE = "/etc/opsctl-lab/time_scale"   # the emulator's, in the lab's guest


@dataclass(frozen=True)
class Load:
    running: int
    waiting: int

    @property
    def busy(self) -> int:
        return self.running + self.waiting


def parse_loads(text: str) -> Load | None:
    """0.5.23's `GET /v1/loads` body (`LoadSnapshot.to_dict`): the sum over its `loads` (one per DP
    rank) of `num_running_reqs` and `num_waiting_reqs`. None: no answer, or not that shape (the
    server is gone or not up)."""
    try:
        doc = json.loads(text)
    except (ValueError, TypeError):
        return None
    loads = doc.get("loads") if isinstance(doc, dict) else None
    if not isinstance(loads, list):
        return None
    running = waiting = 0
    for item in loads:
        if not isinstance(item, dict):
            return None
        r, w = item.get("num_running_reqs", 0), item.get("num_waiting_reqs", 0)
        if not isinstance(r, int) or not isinstance(w, int):
            return None
        running, waiting = running + r, waiting + w
    return Load(running, waiting)


def default_deadline_s(p99_request_s: float | None) -> float:
    """The stored bench's p99 request time x 2, at most 10 min; 300 s when none is known."""
    if p99_request_s is None or p99_request_s <= 0:
        return float(DRAIN_DEADLINE_DEFAULT_S)
    return float(min(DRAIN_DEADLINE_MAX_S, round(p99_request_s * 2, 1)))


def deadline_s(settings: DrainSettings, p99_request_s: float | None) -> float:
    return float(settings.deadline_s) if settings.deadline_s is not None else default_deadline_s(p99_request_s)


def bench_p99_s(run: Any) -> float | None:
    """The slowest level's p99 end-to-end request time of a stored bench run, in seconds."""
    vals = [getattr(lv, "p99_e2e_latency_ms", 0.0) or 0.0 for lv in getattr(run, "levels", []) or []]
    best = max(vals, default=0.0)
    return best / 1000.0 if best > 0 else None


# --------------------------------------------------------------------------- hooks


def hook_env(host: HostConfig, direction: str) -> dict[str, str]:
    return {"OPSCTL_HOST": host.name, "OPSCTL_ADDRESS": host.ssh.address, "OPSCTL_PORT": str(host.http_port),
            "OPSCTL_DRAIN": direction}


def run_hook(hook: DrainHook, host: HostConfig, direction: str) -> None:
    """Run one hook; HostError (exit 3) when it fails, naming it."""
    env = hook_env(host, direction)
    if hook.command is not None:
        try:
            p = subprocess.run(["/bin/sh", "-c", hook.command, "opsctl-drain-hook", host.name, host.ssh.address],
                               env={**os.environ, **env}, capture_output=True, text=True, timeout=hook.timeout_s,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HostError(f"{host.name}: the drain '{direction}' hook did not finish within {hook.timeout_s:g} s",
                            f"fix opsctl.drain.hooks.{direction} (it runs on the controller)") from None
        if p.returncode != 0:
            tail = ((p.stderr or p.stdout).strip().splitlines() or [""])[-1][:200]
            raise HostError(f"{host.name}: the drain '{direction}' hook failed (exit {p.returncode})"
                            + (f": {tail}" if tail else ""),
                            f"fix opsctl.drain.hooks.{direction} or the load balancer it calls, then run again")
        return
    import urllib.error
    import urllib.request

    body = json.dumps({"host": host.name, "address": host.ssh.address, "port": host.http_port,
                       "drain": direction}).encode()
    req = urllib.request.Request(hook.url or "", data=None if hook.method == "GET" else body, method=hook.method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=hook.timeout_s) as resp:
            resp.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HostError(f"{host.name}: the drain '{direction}' hook ({hook.method} {_scheme_host(hook.url)}) "
                        f"failed: {getattr(exc, 'code', None) or getattr(exc, 'reason', None) or exc}",
                        f"fix opsctl.drain.hooks.{direction} or the load balancer it calls, then run again") from None


def _scheme_host(url: str | None) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url or "")
    return f"{parts.scheme}://{parts.hostname or ''}"


# --------------------------------------------------------------------------- the gap


@dataclass
class Gap:
    """One switch's serving gap. Times are the controller's wall clock (epoch seconds), the
    same clock for every host of a rollout, so a fleet's ledgers can be compared."""

    why: str                         # deploy | trial | rollback | restore | ...
    from_release: str | None
    to_release: str | None
    deadline_s: float
    drain: bool = True               # False: nothing was drained (the drain is off, or nothing served)
    enabled: bool = True             # opsctl.drain.enabled
    hooks: bool = False
    out_at: float | None = None      # left the pool (the out hook ran; else the drain began)
    stop_at: float | None = None     # SIGTERM: /health turns 503, no further request is waited for
    stopped_at: float | None = None  # the old server was gone, the new one forked
    ready_at: float | None = None
    in_at: float | None = None       # back in the pool (the in hook ran; else ready)
    inflight_at_start: int | None = None
    aborted: int = 0                 # requests still running at the deadline, cut by the stop
    deadline_hit: bool = False
    result: str = "ok"
    time_scale: float | None = None  # the lab's (its emulator's journal line): site = lab x scale
    startup: dict = field(default_factory=dict)   # the start's phases at the site's scale, and the comparison
                                                  # with the last start of its profile (Startup.as_record)
    # the switch's record is written on the host by bin/opsctl-switch (switch_record, issue #50); the
    # controller's record after the start (start_record) names it by this id
    switch_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    recorded_on_host: bool = False   # bin/opsctl-switch appended switch_record

    @staticmethod
    def now() -> float:
        return time.time()

    def _span(self, a: float | None, b: float | None) -> float | None:
        return round(b - a, 2) if a is not None and b is not None else None

    @property
    def drain_s(self) -> float | None:
        return self._span(self.out_at, self.stopped_at if self.stop_at is None else self.stop_at)

    @property
    def stop_s(self) -> float | None:
        return self._span(self.stop_at, self.stopped_at)

    @property
    def start_s(self) -> float | None:
        return self._span(self.stopped_at, self.ready_at)

    @property
    def gap_s(self) -> float | None:
        """No server answering requests: from the stop (503) to ready."""
        return self._span(self.stop_at, self.ready_at)

    @property
    def out_of_pool_s(self) -> float | None:
        return self._span(self.out_at, self.in_at)

    def record(self) -> dict:
        rec: dict[str, Any] = {
            "action": "switch", "result": self.result, "switch_id": self.switch_id, "why": self.why,
            "from_release": self.from_release,
            "to_release": self.to_release, "drain": self.drain, "hooks": self.hooks, "deadline_s": self.deadline_s,
            "drain_s": self.drain_s, "stop_s": self.stop_s, "start_s": self.start_s, "gap_s": self.gap_s,
            "out_of_pool_s": self.out_of_pool_s, "inflight_at_start": self.inflight_at_start,
            "aborted": self.aborted, "deadline_hit": self.deadline_hit,
            "pool_out_at": self.out_at, "stop_at": self.stop_at, "stopped_at": self.stopped_at,
            "ready_at": self.ready_at, "pool_in_at": self.in_at}
        if self.time_scale:
            rec["time_scale"] = self.time_scale
            rec["site"] = site_figures(self.drain_s, self.stop_s, self.start_s, self.time_scale,
                                       (self.startup or {}).get("total_s"))
        if self.startup:
            rec["startup"] = self.startup
        return rec


    def switch_record(self) -> dict:
        """What bin/opsctl-switch records on the host as it flips `current` (issue #50: a switch is on
        record from the step that makes it, so a controller killed right after it leaves the truth):
        the drain's figures, known before the switch; the host adds ts, switched_at and from_release."""
        return {"action": "switch", "result": "switched", "switch_id": self.switch_id, "why": self.why,
                "from_release": self.from_release, "to_release": self.to_release, "drain": self.drain,
                "hooks": self.hooks, "deadline_s": self.deadline_s,
                "drain_s": self._span(self.out_at, self.stop_at) if self.stop_at is not None else None,
                "inflight_at_start": self.inflight_at_start, "aborted": self.aborted,
                "deadline_hit": self.deadline_hit, "pool_out_at": self.out_at, "stop_at": self.stop_at}

    def start_record(self) -> dict:
        """The controller's record once the start that followed the switch is ready (or not): the
        figures only it knows (the stop, the start, back in the pool, the start-up's phases), naming
        the host's switch record by `switch_id`. Readers see the two as one switch record
        (opsctl.onhost.ledger_records.fold_switches); no second `switch` record."""
        full = self.record()
        keep = ("result", "to_release", "drain_s", "stop_s", "start_s", "gap_s", "out_of_pool_s", "stopped_at",
                "ready_at", "pool_in_at", "time_scale", "site", "startup")
        return {"action": "start", "switch_id": self.switch_id, **{k: full[k] for k in keep if k in full}}


def site_figures(drain_s: float | None, stop_s: float | None, start_s: float | None, time_scale: float,
                 modelled_start_s: float | None) -> dict:
    """A lab switch at the site's scale. Only the start is modelled at the site's scale (the
    emulator's phases, `modelled_start_s` from its journal; else the lab's start x the scale);
    the drain waits on requests that run in real time, and the stop is the drain's end and a
    process exit: both as measured."""
    start = (modelled_start_s if modelled_start_s is not None
             else (start_s * time_scale if start_s is not None else None))
    # the gap is the dark time, as in the lab: the stop and the start (the drain still serves)
    return {"drain_s": drain_s, "stop_s": stop_s, "start_s": round(start, 1) if start is not None else None,
            "gap_s": round((stop_s or 0.0) + start, 1) if start is not None else None}


def describe(rec: dict) -> str:
    """One line for a switch record, each figure saying what it adds up to and, in the lab, what is
    scaled and what is not (issue #49: "gap 1.8 s in the lab = 6 min 52 s at the site (drain 0.1 s,
    stop 0.6 s, start 1.2 s)" read as 1.8 x 500, and the drain is not part of the gap):

        gap 4.6 s = stop 0.5 s + start 4.1 s (after a drain of 2.5 s that still served), 4 in flight ...
        gap 1.8 s in the lab = stop 0.6 s + start 1.2 s (after a drain of 0.1 s that still served); at the
        site 6 min 52 s = the stop as measured (0.6 s, real time: not scaled) + the start-up at the site's
        scale (6 min 51 s, the emulator's phases, not the lab's 1.2 s x 500), 0 in flight ...
    """
    if not rec:
        return "no switch recorded"
    if rec.get("result") == "switched":
        # recorded on the host by the switch itself (bin/opsctl-switch); no controller recorded its start
        return (f"{rec.get('from_release') or 'none'} -> {rec.get('to_release')}, recorded on the host by the switch "
                f"itself; its start was not recorded (the controller that switched was lost, or waits for it now)"
                + (f", {rec.get('inflight_at_start') or 0} in flight at the drain's start, "
                   f"{rec.get('aborted') or 0} aborted" if rec.get("drain") else ""))
    gap = rec.get("gap_s")
    site = (rec.get("site") or {}) if rec.get("time_scale") else {}
    where = " in the lab" if site.get("gap_s") is not None else ""
    line = (f"gap {human_s(gap)}{where} = stop {human_s(rec.get('stop_s'))} + start {human_s(rec.get('start_s'))} "
            f"(after a drain of {human_s(rec.get('drain_s'))} that still served)")
    if site.get("gap_s") is not None:
        modelled = bool((rec.get("startup") or {}).get("total_s"))
        how = (f"the emulator's phases, not the lab's {human_s(rec.get('start_s'))} x {rec['time_scale']:g}"
               if modelled else f"the lab's {human_s(rec.get('start_s'))} x time scale {rec['time_scale']:g}")
        line += (f"; at the site {human_s(site['gap_s'])} = the stop as measured ({human_s(site.get('stop_s'))}, "
                 f"real time: not scaled) + the start-up at the site's scale ({human_s(site.get('start_s'))}, {how})")
    line += f", {rec.get('inflight_at_start') or 0} in flight at the drain's start, {rec.get('aborted') or 0} aborted"
    if rec.get("deadline_hit"):
        line += f" (deadline {rec.get('deadline_s'):g} s reached)"
    return line


def last_switch(ledger: list[dict]) -> dict | None:
    for rec in reversed(ledger):
        if rec.get("action") == "switch":
            return rec
    return None


# --------------------------------------------------------------------------- a fleet's pool


def pool_intervals(records: list[dict]) -> list[tuple[float, float, str]]:
    """(left, back, host) for every switch record that took its host out of the pool; a host
    that never came back (a start that failed, its rollback not yet recorded) counts as out
    until the host's next switch record brings it back, else until now."""
    out: list[tuple[float, float, str]] = []
    for rec in records:
        if rec.get("action") != "switch" or rec.get("pool_out_at") is None:
            continue
        back = rec.get("pool_in_at")
        out.append((float(rec["pool_out_at"]), float(back) if back is not None else float("inf"),
                    str(rec.get("host") or "?")))
    # a host left out by a failed start is back at its next switch's return to the pool
    by_host: dict[str, list[tuple[float, float, str]]] = {}
    for iv in sorted(out):
        by_host.setdefault(iv[2], []).append(iv)
    fixed = []
    for ivs in by_host.values():
        for i, (a, b, h) in enumerate(ivs):
            if b == float("inf") and i + 1 < len(ivs):
                b = ivs[i + 1][1]
            fixed.append((a, b, h))
    return sorted(fixed)


def serving_timeline(records: list[dict], hosts: int) -> list[tuple[float, int]]:
    """(moment, hosts in the pool) at every change, from the ledgers' switch records."""
    events = []
    for a, b, _ in pool_intervals(records):
        events.append((a, -1))
        if b != float("inf"):
            events.append((b, +1))
    serving, line = hosts, []
    for t, d in sorted(events, key=lambda e: (e[0], -e[1])):   # back before out at the same instant
        serving += d
        line.append((t, serving))
    return line


def max_out_of_pool(records: list[dict]) -> int:
    """The most hosts out of the pool at any one moment."""
    return max([0, *_out_counts(records)])


def _out_counts(records: list[dict]) -> list[int]:
    events = []
    for a, b, _ in pool_intervals(records):
        events += [(a, 1), (b, -1)]
    n, counts = 0, []
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):   # back before out at the same instant
        n += d
        counts.append(n)
    return counts
