"""opsctl watch: keeps judging a promoted release on the host, with no controller.

Runs on the GPU host as its own systemd unit (`opsctl-watch-<service>.service`),
with the host's python3 and its standard library only (the host-side package,
opsctl/onhost/, shipped as `<root>/bin/opsctl-onhost.pyz`; opsctl is not installed
there). Every `interval_s`:

1. reads SGLang 0.5.23's Prometheus `/metrics` (`--enable-metrics`): accept length,
   generation throughput, running and queued requests (the scheduler's gauges of its
   last decode report), finished and aborted requests (the tokenizer's counters);
2. reads the service's journal since the last read (cursor): CUDA errors,
   tracebacks, failed exits and restarts of the unit;
3. judges the window (`window_s`) by the live release's analysis, the rules the gate
   judged it by before promotion (analysis.py, shipped as JSON in the configuration):
   accept length below the floor, throughput at the observed concurrency below the
   baseline's stored bench curve by more than `throughput_fraction`, error/abort rate,
   journal errors, crashes. Metric rules need `min_samples` samples taken under decode
   traffic: an idle server never triggers, and metrics that cannot be read are
   `unknown` and never cause an action by themselves;
4. on a breach (`mode: rollback`): takes the deploy lock, switches to the host's
   baseline release with `<root>/bin/opsctl-switch`, waits for ready, appends the
   reason with the numbers to `<root>/ledger.jsonl`, notifies (command hook and/or
   HTTP POST of a JSON event, schema `opsctl.watch.event/1`), and stays tripped, so it
   never switches again, until a later deploy (a `promote` or an `unchanged` deploy
   record in the ledger) re-arms it. `mode: alert` notifies without switching.

After every interval it writes opsctl's node_exporter textfile again (metrics.py; its state and
last tick, docs/metrics.md).

Its state (window, counters, journal cursor, tripped) lives in
`/var/lib/opsctl-watch/<service>.json`, written atomically every interval, so a
killed watch restarted by systemd carries on where it was. `pause`/`resume` set a
flag file next to it (and a ledger record); a paused watch keeps sampling and acts on
nothing.

usage: opsctl-onhost.pyz watch --config FILE [run | status | pause | resume] [--who W] [--reason R]
"""
from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
# urllib.request (http.client, email, ssl) is imported where a request is made: the controller
# imports this module for `opsctl status` and `watch status` and never makes one
import urllib.error

from . import analysis, diagnosis, journal_lines, ledger_records, metrics, prometheus
from .journal_lines import READY_LINE

EVENT_SCHEMA = "opsctl.watch.event/1"
STATE_VERSION = 1
# bytes a switch needs free under the install root (its links, the ledger's records): the
# controller's opsctl.flow.switch.SWITCH_ROOM, kept here because this program is stdlib-only
SWITCH_ROOM = 16 << 20

# SGLang 0.5.23 metric names (srt/observability/metrics_collector.py)
M_ACCEPT = "sglang:spec_accept_length"
M_GEN_TPS = "sglang:gen_throughput"
M_RUNNING = "sglang:num_running_reqs"
M_QUEUE = "sglang:num_queue_reqs"
M_FINISHED = "sglang:num_requests_total"          # counted when a request finishes
M_ABORTED = "sglang:num_aborted_requests_total"
M_GEN_TOKENS = "sglang:generation_tokens_total"



# --------------------------------------------------------------------------- pure parts (unit-tested)


def counter_delta(now, before):
    """A counter's increase since the last read; a smaller value means the server restarted."""
    if now is None:
        return None
    if before is None:
        return 0.0
    return now - before if now >= before else now


def sample_from_metrics(parsed: prometheus.Metrics, prev: dict, ts: float) -> tuple[dict, dict]:
    """One sample from a /metrics scrape (prometheus.parse: counters summed over every series,
    gauges over their total series), and the counters to remember for the next one."""
    counters = {"finished": parsed.total(M_FINISHED), "aborted": parsed.total(M_ABORTED),
                "gen_tokens": parsed.total(M_GEN_TOKENS)}
    running = parsed.total(M_RUNNING)
    gen_tps = parsed.total(M_GEN_TPS)
    if running is None or gen_tps is None:
        return ({"ts": ts, "status": "unknown", "why": f"/metrics has no {M_RUNNING if running is None else M_GEN_TPS}"},
                counters)
    accept = parsed.mean(M_ACCEPT)
    s = {"ts": ts, "status": "ok", "running": running, "queue": parsed.total(M_QUEUE) or 0.0,
         "gen_tps": round(gen_tps, 2), "accept_len": round(accept, 3) if accept else None,
         "finished": counter_delta(counters["finished"], prev.get("finished")),
         "aborted": counter_delta(counters["aborted"], prev.get("aborted")) if counters["aborted"] is not None else 0.0,
         "gen_tokens": counter_delta(counters["gen_tokens"], prev.get("gen_tokens"))}
    # the gauges are the scheduler's last decode report; SGLang zeroes running and throughput when it
    # goes idle (also for a moment between requests) but keeps the accept length: tokens generated
    # since the last read are decode traffic too
    s["busy"] = running > 0 and gen_tps > 0
    s["decode"] = s["busy"] or bool(s["gen_tokens"])
    return s, counters


def classify_journal(entries: list[dict]) -> dict:
    """Counts in journal entries (journalctl -o json) of the service since the last read: the
    one classifier, journal_lines.classify (the controller's journal parser reads lines by it)."""
    return journal_lines.classify(entries)


def baseline_curve(text: str) -> list:
    """[(concurrency, median output tok/s)] from a stored baseline bench (JSON lines, bench_serving names)."""
    by_c: dict = {}
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("record") in ("meta", "canary") or "output_throughput" not in rec:
            continue
        c = rec.get("max_concurrency") or rec.get("concurrency")
        if not c:
            continue
        by_c.setdefault(int(round(float(c))), []).append(float(rec["output_throughput"]))
    return sorted((c, statistics.median(v)) for c, v in by_c.items() if v)


def expected_at(curve: list, concurrency: float):
    """The baseline's tok/s at this concurrency: linear between the benched levels, the
    nearest level outside them (above the last level that is a lower bound: it errs
    towards not switching)."""
    if not curve or concurrency <= 0:
        return None
    if concurrency <= curve[0][0]:
        return curve[0][1] * (concurrency / curve[0][0] if curve[0][0] > 1 else 1.0)
    for (c0, v0), (c1, v1) in zip(curve, curve[1:]):
        if c0 <= concurrency <= c1:
            return v0 + (v1 - v0) * (concurrency - c0) / (c1 - c0)
    return curve[-1][1]


def drain_server(unit, port, deadline_s, poll_s=1.0, _run=subprocess.run):
    """The drain before a host-side switch (issue #35; opsctl.drain, as the controller's): SIGTERM
    to the server (SGLang 0.5.23 answers 503 on /health* and finishes its requests), then GET
    /v1/loads until no request runs or waits, or `deadline_s`; requests still running then are
    counted and the server is killed (the switch that follows starts the next one). Returns the
    figures for the ledger record: drain_s, inflight_at_start, aborted. `deadline_s` 0: no drain."""
    import urllib.request

    def busy():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{int(port)}/v1/loads", timeout=10) as r:
                loads = json.loads(r.read()).get("loads") or []
            return sum(int(x.get("num_running_reqs", 0)) + int(x.get("num_waiting_reqs", 0)) for x in loads)
        except (urllib.error.URLError, OSError, ValueError, TypeError, AttributeError):
            return None
    if not deadline_s:
        return {"drain_s": 0.0, "inflight_at_start": 0, "aborted": 0, "drained": False}
    try:
        active = _run(["systemctl", "is-active", unit], capture_output=True, text=True).stdout.strip()
    except OSError:
        active = ""
    if active != "active":
        return {"drain_s": 0.0, "inflight_at_start": 0, "aborted": 0, "drained": False}
    t0 = time.monotonic()
    first = busy()
    _run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGTERM", unit], capture_output=True)
    left = first
    while left and time.monotonic() - t0 < deadline_s:
        time.sleep(poll_s)
        left = busy()
    aborted = left or 0
    if aborted:
        _run(["systemctl", "kill", "--signal=SIGKILL", unit], capture_output=True)
    return {"drain_s": round(time.monotonic() - t0, 2), "inflight_at_start": first or 0, "aborted": aborted,
            "drained": True}


# Records that end a deploy-like operation (issue #32 item 4): a promote or any rollback (the
# controller's, the guard's, the watch's), a tune's restore (`action: tune`, after its trials), a
# guard that found its release no longer live (`action: guard`), and a deploy that ended without
# a switch (unchanged, failed or interrupted before it). A trial (`deploy trial`) does not: the
# tune goes on to its next trial or its restore, and its guard stays armed until then.
ENDS_DEPLOY_ACTIONS = ("promote", "rollback", "tune", "guard")
ENDS_DEPLOY_RESULTS = ("unchanged", "failed")


def ends_deploy(rec: dict) -> bool:
    act, res = rec.get("action"), rec.get("result")
    if act in ENDS_DEPLOY_ACTIONS:
        return True
    if act == "switch" and rec.get("why") == "rollback":
        # the rollback's switch, recorded on the host as it happens (bin/opsctl-switch): the deploy's
        # release no longer serves, also when its controller dies before `rollback ok` (issue #50)
        return True
    if act == "deploy":
        # interrupted after the switch: the rollback that follows ends it
        return res in ENDS_DEPLOY_RESULTS or (res == "interrupted" and not rec.get("switched"))
    return False


def ledger_view(records: list, deploying: bool = False) -> dict:
    """What the ledger says: a deploy in progress (started, not yet ended; see ends_deploy).
    `records` are the records since the last read, `deploying` what the earlier ones said."""
    for rec in records:
        if rec.get("action") == "deploy" and rec.get("result") == "started":
            deploying = True
        elif ends_deploy(rec):
            deploying = False
    return {"deploying": deploying}


def rearmed_after(records: list, position: int) -> dict | None:
    """The first deploy record after `position` that re-arms a tripped watch."""
    for rec in records[position:]:
        act, res = rec.get("action"), rec.get("result")
        if (act == "promote" and res == "ok") or (act == "deploy" and res == "unchanged"):
            return rec
    return None


def baseline_release(releases: dict, records: list, baseline_profile: str):
    """As opsctl's HostState.baseline: the newest release of the baseline profile, preferring
    one that has served (a `to_release` of an ok record)."""
    cands = [(m.get("created_at", ""), rid) for rid, m in releases.items()
             if (m.get("profile") or {}).get("name") == baseline_profile]
    cands.sort()
    good = {r.get("to_release") for r in records if r.get("result") == "ok"}
    preferred = [rid for _, rid in cands if rid in good]
    pool = preferred or [rid for _, rid in cands]
    return pool[-1] if pool else None


def event(kind: str, cfg: dict, **fields) -> dict:
    """The JSON a notify hook receives (schema opsctl.watch.event/1, see docs/watch.md)."""
    return {"schema": EVENT_SCHEMA, "event": kind, "ts": _iso(time.time()), "host": cfg.get("host"),
            "service": cfg.get("service"), "mode": cfg.get("mode"), **fields}


def reason_line(breaches: list) -> str:
    return "; ".join(f"{b['rule']}: {b['detail']}" for b in breaches)


def why_line(samples: list) -> str | None:
    """The trip notice's `why:` (opsctl diagnose's arithmetic, diagnosis.window_line): the window's
    median accept length against the accept its step ratio to the baseline needs, from the
    drafting decode samples that have a baseline figure at their running batch."""
    dec = [s for s in samples if s.get("busy") and s.get("accept_len") and s.get("gen_tps") and s.get("expected_tps")
           and s.get("running")]
    if not dec:
        return None
    med = statistics.median
    return diagnosis.window_line(med([s["accept_len"] for s in dec]), med([s["gen_tps"] for s in dec]),
                                 med([s["running"] for s in dec]), med([s["expected_tps"] for s in dec]))


# --------------------------------------------------------------------------- host I/O


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _read(path: str, default: str = "") -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return default


def _write_atomic(path: str, text: str) -> None:
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _run(argv: list, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 124, "", str(exc))


def http_get(url: str, timeout: float) -> tuple[int, str]:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (OSError, ValueError):
        return 0, ""


def read_ledger(root: str, pos: int = 0) -> tuple:
    """Complete records appended since byte `pos`, and the new position; the whole ledger
    again (from 0) when it shrank (rewritten). Returns (records, new_pos, reread)."""
    path = os.path.join(root, "ledger.jsonl")
    try:
        size = os.path.getsize(path)
    except OSError:
        return [], 0, pos > 0
    reread = size < pos
    if reread:
        pos = 0
    with open(path, "rb") as f:
        f.seek(pos)
        data = f.read()
    end = data.rfind(b"\n") + 1
    return ledger_records.json_records(data[:end]), pos + end, reread


def append_ledger(root: str, record: dict) -> dict:
    """Through the host's ledger appender (`<root>/bin/opsctl-ledger-append`: one whole-line
    write under an flock, fsynced, a torn last line set aside), the one write path every
    writer of the ledger uses; a host staged before it existed gets the same under an flock here."""
    rec = {"ts": _iso(time.time()), **record}
    line = json.dumps(rec, default=str) + "\n"
    path = os.path.join(root, "ledger.jsonl")
    appender = os.path.join(root, "bin", "opsctl-ledger-append")
    if os.access(appender, os.X_OK):
        res = _run([appender, path], timeout=60, input=line)
        if res.returncode != 0:
            raise OSError(f"ledger append failed (exit {res.returncode}): {res.stderr.strip()[-200:]}")
        return rec
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line.encode())   # one write on an O_APPEND file: lines never interleave
        os.fsync(fd)
    finally:
        os.close(fd)
    return rec


def current_release(root: str):
    try:
        return os.path.basename(os.readlink(os.path.join(root, "current")))
    except OSError:
        return None


def release_manifests(root: str) -> dict:
    out = {}
    rel = os.path.join(root, "releases")
    try:
        names = os.listdir(rel)
    except OSError:
        return out
    for name in names:
        if name.startswith("."):
            continue
        try:
            out[name] = json.loads(_read(os.path.join(rel, name, "manifest.json")))
        except ValueError:
            continue
    return out


def watch_who(cfg: dict) -> str:
    """How the watch signs its records and the lock: `opsctl-watch@<host>`, the inventory's name of
    the host (as the guard signs `opsctl-guard@<host>`, and `opsctl status` names it), not the
    machine's hostname (issue #50)."""
    return f"opsctl-watch@{cfg.get('host') or socket.gethostname()}"


class HostLock:
    """The deploy lock (`<root>/.lock`, flock): a watch rollback never runs beside a deploy,
    and a deploy started meanwhile is refused naming the watch."""

    def __init__(self, root: str, action: str, who: str | None = None):
        self.root, self.action, self.fd = root, action, None
        self.who = who or f"opsctl-watch@{socket.gethostname()}"

    def acquire(self, wait_s: float) -> bool:
        """True with the lock held (release() it in a finally), False when another holds it.
        No path out of here leaves the lock held without returning True: any error after the
        flock closes the descriptor first (issue #32: a full disk used to leak it for good)."""
        self.fd = os.open(os.path.join(self.root, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                        self.release()
                        return False
                    time.sleep(0.2)
            self._write_holder()
        except BaseException:
            self.release()
            raise
        return True

    def _write_holder(self) -> None:
        """Who holds the lock, for a refused deploy's message. Best effort: with the disk
        full the rollback still goes ahead (a stale holder is removed, never left naming
        someone else)."""
        holder = {"who": self.who, "pid": os.getpid(), "action": self.action,
                  "since": _iso(time.time()), "host_pid": os.getpid()}
        path = os.path.join(self.root, ".lock.holder")
        try:
            _write_atomic(path, json.dumps(holder))
        except OSError as exc:
            print(f"opsctl-watch: could not write {path}: {exc}; holding the lock without it",
                  file=sys.stderr, flush=True)
            for stale in (path, f"{path}.tmp.{os.getpid()}"):
                try:
                    os.unlink(stale)
                except OSError:
                    pass

    def release(self) -> None:
        if self.fd is None:
            return
        path = os.path.join(self.root, ".lock.holder")
        try:  # clear our own holder record while still holding the lock (never another's)
            if (json.loads(_read(path) or "{}") or {}).get("pid") == os.getpid():
                os.unlink(path)
        except (OSError, ValueError, AttributeError):
            pass
        finally:
            os.close(self.fd)
            self.fd = None


class Watch:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.root = cfg["root"]
        self.unit = cfg["unit"]
        self.state_path = os.path.join(cfg["state_dir"], f"{cfg['service']}.json")
        self.pause_path = os.path.join(cfg["state_dir"], f"{cfg['service']}.paused")
        self.metrics_url = f"http://127.0.0.1:{cfg['port']}/metrics"
        self.state = self.load_state()

    # ---------------------------------------------------------------- state
    def load_state(self) -> dict:
        try:
            st = json.loads(_read(self.state_path))
        except ValueError:
            st = {}
        if not isinstance(st, dict) or st.get("version") != STATE_VERSION:
            st = {}
        st.setdefault("version", STATE_VERSION)
        st.setdefault("samples", [])
        st.setdefault("counters", {})
        st.setdefault("tripped", None)
        st.setdefault("release", None)
        st.setdefault("journal_cursor", None)
        st.setdefault("journal_since", int(time.time()))
        st.setdefault("watch_starts", 0)
        st.setdefault("ticks", 0)
        st.setdefault("cost", {})
        return st

    def save_state(self) -> None:
        _write_atomic(self.state_path, json.dumps(self.state, sort_keys=True))

    def paused(self):
        text = _read(self.pause_path, None)
        if text is None:
            return None
        try:
            return json.loads(text) or {"paused": True}
        except ValueError:
            return {"paused": True}

    # ---------------------------------------------------------------- reading the host
    def read_journal(self) -> dict | None:
        argv = ["journalctl", "-u", self.unit, "-o", "json", "--all", "--no-pager",  # --all: long fields whole, not null
                "--output-fields=MESSAGE,_PID,SYSLOG_IDENTIFIER"]
        cursor = self.state.get("journal_cursor")
        argv += [f"--after-cursor={cursor}"] if cursor else [f"--since=@{self.state['journal_since']}"]
        res = _run(argv, timeout=30)
        if res.returncode != 0:
            return None
        entries = []
        for line in res.stdout.splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
        if entries and entries[-1].get("__CURSOR"):
            self.state["journal_cursor"] = entries[-1]["__CURSOR"]
        return classify_journal(entries)

    def curve(self) -> list:
        """The baseline's bench curve from the file the gate stored it in: its path is named
        on the controller by the gate's own function (opsctl.gate.baseline.baseline_paths, per
        workload mix) and written into this configuration as `baseline_bench`."""
        path = self.cfg.get("baseline_bench")
        return baseline_curve(_read(path)) if path else []

    def analysis_for(self, manifest: dict | None) -> analysis.AnalysisSpec:
        """The live release's analysis: its profile's spec as the controller built it (the gate
        judged the release by the same), else the inventory's defaults, fitted to the release's
        own manifest (its kind, floor and budget schedule)."""
        prof = (manifest or {}).get("profile") or {}
        data = (self.cfg.get("analysis") or {}).get(prof.get("name", "")) or self.cfg.get("default_analysis")
        if not data:
            raise ValueError("the configuration holds no analysis (written by an older opsctl): redeploy")
        return analysis.AnalysisSpec.from_dict(data).for_release(prof)

    # ---------------------------------------------------------------- one interval
    def tick(self) -> dict:
        cpu0, ch0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        now = time.time()
        st = self.state
        st["ticks"] += 1
        st["last_tick"] = now
        cur = current_release(self.root)
        manifests = release_manifests(self.root)
        lg = st.setdefault("ledger", {"pos": 0, "deploying": False, "served": []})
        new, lg["pos"], reread = read_ledger(self.root, int(lg.get("pos", 0)))
        if reread:
            lg.update(deploying=False, served=[])
        view = ledger_view(new, bool(lg.get("deploying")))
        lg["deploying"] = view["deploying"]
        lg["served"] = sorted(set(lg.get("served", [])) | {r.get("to_release") for r in new
                                                           if r.get("result") == "ok" and r.get("to_release")})
        served = [{"to_release": r, "result": "ok"} for r in lg["served"]]
        if cur != st.get("release"):
            st["release"], st["samples"], st["counters"] = cur, [], {}
            st["release_since"] = now
        tripped = st.get("tripped")
        if tripped:
            rec = rearmed_after(new, 0)   # a deploy recorded after the trip
            if rec is not None:
                st["tripped"] = None
                st["rearmed"] = {"ts": rec.get("ts"), "by": rec.get("who"), "release": rec.get("to_release")}
                st["samples"], st["counters"] = [], {}
        # sample
        status, body = http_get(self.metrics_url, timeout=float(self.cfg.get("scrape_timeout_s", 5)))
        if status == 200:
            sample, st["counters"] = sample_from_metrics(prometheus.parse(body), st.get("counters", {}), now)
        else:
            sample = {"ts": now, "status": "unknown",
                      "why": f"GET /metrics: {'HTTP ' + str(status) if status else 'no answer'}"}
        manifest = manifests.get(cur) if cur else None
        if sample.get("busy"):   # throughput needs a live decode report: running requests and their tok/s
            exp = expected_at(self.curve(), sample["running"])
            sample["expected_tps"] = round(exp, 2) if exp else None
        sample["journal"] = self.read_journal()
        if view["deploying"]:
            sample["deploying"] = True
        st["samples"] = [s for s in st["samples"] if s["ts"] > now - self.cfg["window_s"] - self.cfg["interval_s"]]
        st["samples"].append(sample)
        if view["deploying"]:
            # the deploy judges its own release; the window starts over when it is done
            st["samples"] = [sample]
        spec = self.analysis_for(manifest)
        rules = spec.watch_rules()
        findings = analysis.evaluate_window(st["samples"], spec, now)
        verdict = analysis.summarise(findings, st["samples"], spec, now)
        paused = self.paused()
        state = ("no-release" if cur is None else "deploying" if view["deploying"] else
                 "tripped" if st.get("tripped") else "paused" if paused else verdict)
        st["last"] = {"ts": now, "release": cur, "profile": ((manifest or {}).get("profile") or {}).get("name"),
                      "verdict": verdict, "state": state, "findings": findings, "rules": rules}
        breaches = [f for f in findings if f["status"] == "breach"]
        if breaches and cur and not view["deploying"] and not st.get("tripped") and not paused:
            self.act(cur, manifest, manifests, served, breaches, now)
        # the watch's own cost, per interval
        ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_ms = (time.process_time() - cpu0) * 1000
        child_ms = ((ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)) * 1000
        cost = st["cost"]
        n = cost.get("n", 0) + 1
        total = cpu_ms + child_ms
        cost.update({"n": n, "last_cpu_ms": round(cpu_ms, 2), "last_children_cpu_ms": round(child_ms, 2),
                     "avg_cpu_ms": round((cost.get("avg_cpu_ms", 0.0) * (n - 1) + total) / n, 2),
                     "max_cpu_ms": round(max(cost.get("max_cpu_ms", 0.0), total), 2),
                     "last_wall_ms": round((time.monotonic() - t0) * 1000, 1), "rss_kib": _rss_kib(),
                     "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
        self.save_state()
        self.write_metrics()
        return st["last"]

    def write_metrics(self) -> None:
        """opsctl's node_exporter textfile after each tick (its state and last tick; issue #54)."""
        try:
            metrics.update(self.root)
        except Exception as exc:  # noqa: BLE001 - the tick is done; the metrics file is a view of it
            print(f"opsctl-watch: metrics file not written: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    # ---------------------------------------------------------------- acting on a breach
    def act(self, cur: str, manifest, manifests: dict, ledger: list, breaches: list, t_breach: float) -> None:
        cfg = self.cfg
        prof = (manifest or {}).get("profile") or {}
        numbers = [{k: v for k, v in b.items() if k != "status"} for b in breaches]
        reason = "watch: " + reason_line(breaches)
        why = why_line(self.state.get("samples") or [])
        if why:
            reason += "; " + why
        base = baseline_release(manifests, ledger, cfg["baseline_profile"])
        common = {"host": cfg["host"], "who": watch_who(cfg), "profile": prof.get("name"),
                  "budget": prof.get("budget"), "automatic": True, "watch": {"breaches": numbers,
                  "window_s": cfg["window_s"], "interval_s": cfg["interval_s"], "mode": cfg["mode"]}}
        if cfg["mode"] != "rollback" or base is None or base == cur:
            why = ("mode alert" if cfg["mode"] != "rollback" else
                   "no baseline release on the host" if base is None else "the baseline is already live")
            rec = append_ledger(self.root, {"action": "watch", "result": "alert", "release": cur,
                                            "reason": f"{reason} (no switch: {why})", **common})
            self.state["tripped"] = {"ts": t_breach, "kind": "alert", "release": cur, "reason": rec["reason"],
                                     "breaches": numbers}
            self.save_state()
            self.state["tripped"]["notify"] = self.notify(event("alert", cfg, release={"live": cur}, reason=rec["reason"],
                                                                profile=prof.get("name"), budget=prof.get("budget"),
                                                                breaches=numbers, switched=False, ledger=rec))
            self.save_state()
            return
        # no room: no drain and no switch (a drained server whose switch then fails on a full disk
        # would leave the watch tripped on a failed rollback); the tick fails, the next one retries
        free = os.statvfs(self.root).f_bavail * os.statvfs(self.root).f_frsize
        if free < SWITCH_ROOM:
            self.state["last"]["note"] = (f"breach, but {free >> 20} MiB free under {self.root}: no switch without "
                                          f"{SWITCH_ROOM >> 20} MiB of room")
            raise OSError(errno.ENOSPC, f"{self.state['last']['note']} (No space left on device)")
        lock = HostLock(self.root, "watch rollback", who=watch_who(cfg))
        if not lock.acquire(wait_s=2.0):
            self.state["last"]["note"] = "breach, but the deploy lock is held (a deploy or rollback is running)"
            return
        try:
            drained = drain_server(cfg["unit"], cfg["port"], float(cfg.get("drain_deadline_s") or 0),
                                   float(cfg.get("drain_poll_s") or 1.0))
            t_switch = time.time()
            res = _run([os.path.join(self.root, "bin", "opsctl-switch"), self.root, cfg["service"], base],
                       timeout=120)
            ready_s, err = None, None
            if res.returncode != 0:
                err = f"opsctl-switch failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()[-300:]}"
            else:
                bprof = (manifests.get(base) or {}).get("profile") or {}
                ready_s, err = self.wait_ready(int(t_switch), float(bprof.get("readiness_timeout_s")
                                                                    or cfg.get("ready_timeout_s", 1800)))
            t_ready = time.time()
            common.update({k: drained[k] for k in ("drain_s", "inflight_at_start", "aborted")})
            common["watch"].update({"breach_at": round(t_breach, 3), "switched_at": round(t_switch, 3),
                                    "serving_at": round(t_ready, 3) if err is None else None})
            rec = append_ledger(self.root, {
                "action": "rollback", "result": "ok" if err is None else "failed", "from_release": cur,
                "to_release": base, "reason": reason, **common,
                "ready_s": round(ready_s, 2) if ready_s is not None else None,
                "breach_to_serving_s": round(t_ready - t_breach, 2) if err is None else None,
                **({"error": err} if err else {})})
        finally:
            lock.release()
        self.state["tripped"] = {"ts": t_breach, "kind": "rollback", "release": cur, "to_release": base,
                                 "reason": reason, "breaches": numbers,
                                 "result": rec["result"], "breach_to_serving_s": rec.get("breach_to_serving_s")}
        self.state["samples"], self.state["counters"] = [], {}
        self.save_state()
        self.state["tripped"]["notify"] = self.notify(event(
            "rollback" if err is None else "rollback_failed", cfg, release={"from": cur, "to": base},
            reason=reason, profile=prof.get("name"), budget=prof.get("budget"), breaches=numbers, switched=True,
            ready_s=rec.get("ready_s"), breach_to_serving_s=rec.get("breach_to_serving_s"), error=err, ledger=rec))
        self.save_state()

    def wait_ready(self, since: int, timeout: float) -> tuple:
        """The ready line in the journal since the switch and a 200 from /health_generate."""
        t0 = time.monotonic()
        url = f"http://127.0.0.1:{self.cfg['port']}/health_generate"
        while time.monotonic() - t0 < timeout:
            res = _run(["journalctl", "-u", self.unit, f"--since=@{since}", "-o", "cat", "--no-pager"], timeout=30)
            if READY_LINE in res.stdout and http_get(url, timeout=25)[0] == 200:
                return time.monotonic() - t0, None
            show = _run(["systemctl", "show", self.unit, "-p", "ActiveState", "-p", "SubState", "-p", "NRestarts"],
                        timeout=10).stdout
            props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
            # a start that fails is known at once (issue #32 item 5), not after the readiness timeout
            if props.get("ActiveState") == "failed":
                return None, f"{self.unit} failed while starting the baseline"
            restarts = props.get("NRestarts", "0")
            if props.get("SubState") == "auto-restart" or (restarts.isdigit() and int(restarts) > 0):
                return None, (f"{self.unit} exited while starting the baseline and systemd scheduled a restart "
                              f"({props.get('ActiveState')}/{props.get('SubState')}, NRestarts "
                              f"{restarts})")
            time.sleep(0.5)
        return None, f"the baseline was not ready after {timeout:.0f} s"

    def notify(self, ev: dict) -> dict:
        """Command hook (the event on stdin, OPSCTL_WATCH_EVENT in the environment) and/or an
        HTTP POST of the event as JSON; a failed hook is recorded, never retried forever."""
        out = {}
        body = json.dumps(ev, default=str)
        note = self.cfg.get("notify") or {}
        timeout = float(note.get("timeout_s", 5))
        if note.get("command"):
            res = _run(["/bin/sh", "-c", note["command"]], timeout=max(timeout, 30), input=body,
                       env={**os.environ, "OPSCTL_WATCH_EVENT": ev["event"]})
            out["command"] = {"rc": res.returncode, "stderr": res.stderr.strip()[-300:]}
        if note.get("url"):
            import urllib.request

            err = None
            for attempt in range(3):
                try:
                    req = urllib.request.Request(note["url"], data=body.encode(), method="POST",
                                                 headers={"Content-Type": "application/json",
                                                          "User-Agent": "opsctl-watch"})
                    with urllib.request.urlopen(req, timeout=timeout) as r:
                        out["url"] = {"status": r.status, "attempts": attempt + 1}
                        err = None
                        break
                except (OSError, ValueError) as exc:
                    err = str(exc).replace(note["url"], redact_url(note["url"]))   # recorded, shown by status
                    time.sleep(1.0)
            if err:
                out["url"] = {"error": err[:300], "attempts": 3}
        return out

    # ---------------------------------------------------------------- loop
    def run(self) -> None:
        self.state["watch_starts"] = self.state.get("watch_starts", 0) + 1
        self.state["pid"] = os.getpid()
        self.state["started_at"] = time.time()
        self.save_state()
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        interval = float(self.cfg["interval_s"])
        next_t = time.monotonic()
        while not stop:
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - one bad interval must not stop the watch
                print(f"opsctl-watch: tick failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            next_t += interval
            delay = next_t - time.monotonic()
            if delay < 0:
                next_t, delay = time.monotonic(), 0
            end = time.monotonic() + delay
            while not stop and time.monotonic() < end:
                time.sleep(min(0.5, end - time.monotonic()))
        self.save_state()


def _rss_kib() -> int:
    for line in _read("/proc/self/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --------------------------------------------------------------------------- commands


def redact_url(url):
    """What `status` shows of a notify URL: its scheme and host, never its path or query (a
    webhook's token lives there) nor credentials in it."""
    if not url:
        return url
    m = re.match(r"(https?)://(?:[^@/\s]*@)?([^/\s?#]+)", str(url))
    return f"{m.group(1)}://{m.group(2)}/<redacted>" if m else "<redacted>"


def redacted_notify(notify) -> dict:
    note = dict(notify or {})
    if note.get("url"):
        note["url"] = redact_url(note["url"])
    return note


def _failing(cfg: dict, st: dict, props: dict, now: float | None = None) -> dict | None:
    """The watch runs but its ticks fail (a full disk: its state cannot be saved, so the state file
    still shows the last tick that worked): how long since that tick and the journal's last
    `tick failed` line (issue #32 item 1: `watch status` said `idle` meanwhile). None: ticking."""
    last_ts = (st.get("last") or {}).get("ts")
    now = time.time() if now is None else now
    if props.get("ActiveState") != "active" or not last_ts or now - float(last_ts) <= 3 * float(cfg["interval_s"]) + 5:
        return None
    unit = f"opsctl-watch-{cfg['service']}.service"
    text = _run(["journalctl", "-u", unit, "-n", "40", "-o", "cat", "--no-pager"], timeout=10).stdout
    errors = [line.strip() for line in text.splitlines() if "tick failed" in line]
    return {"since": last_ts, "seconds": round(now - float(last_ts), 1), "error": errors[-1] if errors else None}


def status_report(cfg: dict) -> dict:
    w = Watch(cfg)
    st = w.state
    unit = f"opsctl-watch-{cfg['service']}.service"
    show = _run(["systemctl", "show", unit, "-p", "ActiveState", "-p", "SubState", "-p", "MainPID",
                 "-p", "NRestarts"], timeout=10).stdout
    props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
    config = {k: cfg.get(k) for k in ("mode", "interval_s", "window_s", "min_samples", "baseline_profile")}
    return {"config": {**config, "notify": redacted_notify(cfg.get("notify"))}, "failing": _failing(cfg, st, props),
            "unit": {"name": unit, **props}, "paused": w.paused(), "tripped": st.get("tripped"),
            "rearmed": st.get("rearmed"), "last": st.get("last"), "samples": st.get("samples", [])[-12:],
            "watch_starts": st.get("watch_starts"), "ticks": st.get("ticks"), "pid": st.get("pid"),
            "cost": st.get("cost"), "release": st.get("release")}


def set_paused(cfg: dict, paused: bool, who: str, reason: str) -> dict:
    w = Watch(cfg)
    if paused:
        _write_atomic(w.pause_path, json.dumps({"paused": True, "by": who, "reason": reason, "ts": _iso(time.time())}))
    else:
        try:
            os.unlink(w.pause_path)
        except FileNotFoundError:
            pass
    return append_ledger(cfg["root"], {"action": "watch", "result": "paused" if paused else "resumed",
                                       "host": cfg["host"], "who": who, "release": current_release(cfg["root"]),
                                       "reason": reason})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="opsctl-onhost.pyz watch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("command", nargs="?", default="run", choices=["run", "status", "pause", "resume", "tick"])
    ap.add_argument("--who", default=f"root@{socket.gethostname()}")
    ap.add_argument("--reason", default="")
    a = ap.parse_args(argv)
    try:
        cfg = json.loads(_read(a.config))
    except ValueError:
        cfg = None
    if not isinstance(cfg, dict):
        print(f"opsctl-watch: no readable configuration at {a.config} (fix: deploy with opsctl.watch set)",
              file=sys.stderr)
        return 2
    if a.command == "run":
        Watch(cfg).run()
    elif a.command == "tick":
        print(json.dumps(Watch(cfg).tick(), default=str))
    elif a.command == "status":
        print(json.dumps(status_report(cfg), default=str))
    else:
        print(json.dumps(set_paused(cfg, a.command == "pause", a.who, a.reason or f"{a.command} by {a.who}")))
    return 0

