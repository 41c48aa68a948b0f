"""measure: the gate's smoke bench on the host itself, in rounds until each level's speedup
interval is decided (`decide.throughput_decision`), through the load generator of the
host-side package (opsctl/onhost/loadgen.py, in `<root>/bin/opsctl-onhost.pyz`, run there
with the host's python3)."""
from __future__ import annotations

import json
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any, Callable

from opsctl.config import HostConfig
from opsctl.errors import HostError
from opsctl.gate import interval as cf
from opsctl.gate.decide import throughput_decision
from opsctl.gate.results import from_records, parse_jsonl_text
from opsctl.gate.workloads import WorkloadSet, mix_key
from opsctl.host.connection import Connection
from opsctl.onhost import ARCHIVE_NAME, archive
from opsctl.onhost.analysis import AnalysisSpec


def onhost_program(host: HostConfig) -> str:
    """Where the host-side package's archive lives on the host (staged by every deploy)."""
    return f"{host.install_root}/bin/{ARCHIVE_NAME}"


def ensure_onhost_program(conn: Connection, host: HostConfig) -> str:
    """The archive's path on the host, sent first when the host has none (a host benched
    before its first deploy staged it)."""
    remote = onhost_program(host)
    if not conn.run(f"test -f {shlex.quote(remote)}", check=False).ok:
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / ARCHIVE_NAME
            local.write_bytes(archive())
            conn.put(local, remote, mode=0o755)
    return remote


def loadgen_command(policy: Any, *, url: str, remote_path: str = f"/tmp/{ARCHIVE_NAME}", python: str = "python3",
                    make_canary: bool = False, canary_file: str | None = None, quiet: bool = False) -> str:
    """The shell command that runs the load generator of the host-side archive (at
    `remote_path`) on the host with a `GatePolicy`'s bench (JSON lines on stdout, progress on stderr)."""
    argv = [python, remote_path, "loadgen", "--url", url,
            *policy.loadgen_args(make_canary=make_canary, canary_file=canary_file), "--json"]
    if quiet:
        argv.append("--quiet")
    return shlex.join(argv)


_PROGRESS = re.compile(r"\[loadgen\] C=(\d+) repeat (\d+): (\d+)/(\d+) requests \((\d+) errors\)")
_LEVEL_END = re.compile(r"\[loadgen\] C=(\d+) repeat (\d+): ([\d.]+) tok/s")


def _progress_relay(progress: Callable[[Any], None] | None, rnd: int = 0) -> Callable[[str], None] | None:
    """Turn loadgen's stderr lines (from the host) back into its ProgressEvents."""
    if progress is None:
        return None
    from opsctl.onhost.loadgen import ProgressEvent

    totals: dict[tuple[int, int], int] = {}  # (level, repeat) -> requests, from its progress lines
    errors_of: dict[tuple[int, int], int] = {}

    def on_line(line: str) -> None:
        m = _PROGRESS.search(line)
        if m:
            c, rep, done, total, errors = (int(x) for x in m.groups())
            rep += rnd
            if (c, rep) not in totals:
                progress(ProgressEvent("level_start", c, rep - 1, 0, total, 0))
            totals[(c, rep)], errors_of[(c, rep)] = total, errors
            progress(ProgressEvent("request_done", c, rep - 1, done, total, errors))
            return
        m = _LEVEL_END.search(line)
        if m:
            c, rep = int(m.group(1)), int(m.group(2)) + rnd
            if (c, rep) not in totals:
                totals[(c, rep)] = 1  # no progress line came first: a level of unknown size, shown as 1/1
                progress(ProgressEvent("level_start", c, rep - 1, 0, 1, 0))
            total = totals[(c, rep)]  # the level ends at N/N, never at 1/N
            progress(ProgressEvent("level_end", c, rep - 1, total, total, errors_of.get((c, rep), 0)))

    return on_line


def measure(conn: Connection, host: HostConfig, policy, *, make_canary: bool = False, canary_file: str | None = None,
            progress: Callable[[Any], None] | None = None, meta: dict | None = None, baseline=None, prior=None,
            spec: AnalysisSpec | None = None):
    """Run the policy's bench on the host itself (network out of the numbers), on the
    policy's workload mix, level by level in rounds of max(C, requests_per_level) requests.

    With a `baseline` (and the release's analysis `spec`: its thresholds), a level stops as
    soon as its speedup interval clears the gate's threshold either way
    (`decide.throughput_decision`: the interval's confidence is spread over the level's
    planned looks, so stopping early costs no error), or at `max_requests`: a clear
    win or loss costs fewer requests than a close call. Without one (a baseline being measured)
    every level runs to `max_requests`, so later candidates have all of its samples.

    `prior`: the first measurement, when this is the gate's re-measure. Its rounds go on where
    the first stopped: each look counts the first's samples too, a level the first already
    decided is not measured again (its decision stands), and the round numbers continue (the
    requests are new ones)."""
    if baseline is not None and spec is None:
        raise ValueError("measuring against a baseline stops on the analysis' thresholds: pass spec")
    remote = ensure_onhost_program(conn, host)
    url = f"http://127.0.0.1:{host.http_port}"
    workdir = f"{host.install_root}/.bench"
    conn.run(f"mkdir -p {workdir}")
    ws = WorkloadSet.load(policy.workloads, input_len=policy.input_len)
    records: list[dict] = []
    first = True
    stopped: dict[int, str] = {}
    for level in policy.concurrency:
        per_round = max(int(level), policy.requests_per_level)
        cap = max(policy.max_requests, per_round)
        base_rates = cf.rates(cf.samples_of(baseline.at(level))) if baseline is not None else None
        before = cf.rates(cf.samples_of(prior.at(level))) if prior is not None else []
        first_rounds = policy.rounds_at(level) if prior is not None else 0
        if base_rates and before and throughput_decision(policy, level, before, base_rates, spec)[1] != "inconclusive":
            stopped[level] = "decided by the first measurement"
            continue
        sent, rnd = 0, 0
        while sent < cap:
            reqs = ws.select(per_round, seed=policy.seed, level=level, repeat=first_rounds + rnd)
            body = "".join(json.dumps({"level": level, "repeat": 0, **r.payload(policy.output_len)}) + "\n"
                           for r in reqs)
            path = f"{workdir}/requests-c{level}-r{rnd}.jsonl"
            conn.run(f"cat > {path}", stdin=body)
            argv = [str(host.host_python), remote, "loadgen", "--url", url, "--concurrency", str(level),
                    "--requests-file", path,
                    "--requests-per-level", str(per_round), "--repeats", "1", "--output-len", str(policy.output_len),
                    "--input-len", str(policy.input_len), "--seed", str(policy.seed),
                    "--warmup", str(policy.warmup if first else 0), "--json"]
            records += _run_loadgen(conn, host, argv, progress, rnd)
            first = False
            sent += per_round
            rnd += 1
            if base_rates is not None:
                cand = before + cf.rates(cf.samples_of(r for r in records if r.get("max_concurrency") == level))
                decision = throughput_decision(policy, level, cand, base_rates, spec)[1]
                if decision != "inconclusive":
                    stopped[level] = (f"{decision} after {sent} requests (round {first_rounds + rnd}; "
                                      f"{policy.looks_at(level)} looks planned)")
                    break
        else:
            stopped[level] = f"cap of {sent} requests"
    conn.run(f"rm -rf {workdir}", check=False)
    if make_canary or canary_file:
        argv = [str(host.host_python), remote, "loadgen", "--url", url, "--canary-only", "--seed", str(policy.seed),
                "--json"]
        argv += (["--canary-file", canary_file] if canary_file else
                 ["--canary-prompts", str(policy.canary_prompts), "--canary-input-len", str(policy.canary_input_len),
                  "--canary-output-len", str(policy.canary_output_len)])
        records += _run_loadgen(conn, host, argv, progress, 0)
    run = from_records(records, meta={"host": host.name, "workload_mix": mix_key(policy.workloads),
                                      "seed": policy.seed, "output_len": policy.output_len,
                                      "stopped": {str(k): v for k, v in stopped.items()}, **(meta or {})})
    if not run.levels and not (prior is not None and len(stopped) == len(policy.concurrency)
                               and all(v.startswith("decided by") for v in stopped.values())):
        raise HostError(f"bench on {host.name} produced no level results", "run opsctl bench by hand and read its output")
    return run


def _run_loadgen(conn: Connection, host: HostConfig, argv: list[str], progress, rnd: int) -> list[dict]:
    res = conn.run(shlex.join(argv), check=False, timeout=3600, on_stderr_line=_progress_relay(progress, rnd))
    if not res.ok:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [""]
        raise HostError(f"bench on {host.name} failed (exit {res.rc}): {tail[0][:300]}",
                        f"check that the server answers on 127.0.0.1:{host.http_port} on the host")
    out = []
    for rec in parse_jsonl_text(res.stdout, source="loadgen output"):
        if rec.get("record") == "level":
            rec = {**rec, "repeat": rnd}
        out.append(rec)
    return out


def measure_via_tunnel(host: HostConfig, policy, *, progress=None, meta: dict | None = None):
    """Run the bench from this machine through an SSH tunnel to the host's port."""
    import socket

    from opsctl.host.connection import SSHConnection
    from opsctl.onhost import loadgen

    conn = SSHConnection(host)
    fab = conn._connection()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local_port = s.getsockname()[1]
    try:
        with fab.forward_local(local_port, remote_port=host.http_port, remote_host="127.0.0.1"):
            spec = loadgen.LoadSpec(url=f"http://127.0.0.1:{local_port}", concurrency=list(policy.concurrency),
                                    input_len=policy.input_len, output_len=policy.output_len,
                                    requests_per_level=policy.requests_per_level, repeats=policy.repeats,
                                    warmup=policy.warmup, seed=policy.seed)
            records = loadgen.run(spec, progress)
    finally:
        conn.close()
    return from_records(records, meta={"host": host.name, "via": "ssh-tunnel", **(meta or {})})


