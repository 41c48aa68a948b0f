"""bench: the smoke bench on the host itself, in rounds until each level's interval is
decided; the baselines it is compared with; `opsctl bench` on the live release."""
from __future__ import annotations

import json
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any, Callable

from opsctl.bench.baseline import baseline_paths, mix_slug
from opsctl.config import HostConfig, Inventory
from opsctl.errors import CheckFailed, ConfigError, HostError, OpsctlError
from opsctl.flow.steps import as_inventory
from opsctl.host.connection import Connection, connect
from opsctl.releases import append_ledger, read_state, release_profile

# --------------------------------------------------------------------------- benchmark gate


# the stored baseline's file names: one function for the gate and the watch (opsctl/bench/baseline.py)
_mix_slug = mix_slug


def has_baseline(conn: Connection, host: HostConfig, policy=None) -> bool:
    run_path, canary_path = baseline_paths(host, host.baseline_profile, policy)
    return conn.run(f"test -s {shlex.quote(run_path)} && test -s {shlex.quote(canary_path)}", check=False).ok


def require_baseline(conn: Connection, host: HostConfig, policy=None) -> None:
    """A speculative release is judged against the host's baseline, measured on the same
    workload mix: without one, stop before touching anything and say how to make it."""
    from opsctl.bench.workloads import mix_key

    policy = policy or host.gate_policy()
    if has_baseline(conn, host, policy):
        return
    base = f"{host.install_root}/baselines/{host.model.name}"
    others = conn.run(f"for f in {base}/{host.baseline_profile}*.jsonl; do [ -s \"$f\" ] && head -n 1 \"$f\"; done; "
                      f"true", check=False).stdout
    mixes = []
    for line in others.splitlines():
        try:
            meta = json.loads(line)
        except ValueError:
            continue
        if isinstance(meta, dict) and meta.get("record") == "meta":
            mixes.append(meta.get("workload_mix") or "random token ids")
    if mixes:
        raise ConfigError(f"the stored {host.baseline_profile} baseline on {host.name} was measured on "
                          f"{' and '.join(sorted(set(mixes)))}; the gate measures on {mix_key(policy.workloads)}: a "
                          "release is only compared on the same requests",
                          f"with {host.baseline_profile} live, run 'opsctl bench --save-baseline' with this inventory "
                          "(same workload mix as the gate policy), then deploy again")
    raise ConfigError(f"no {host.baseline_profile} baseline for {host.model.name} on {host.name}: a speculative "
                      "release is judged against the autoregressive baseline",
                      f"deploy the baseline first ('opsctl deploy {host.baseline_profile}' stores its numbers "
                      "the first time), or refresh it with 'opsctl bench --save-baseline' while it is live")


def check_baseline_mix(baseline_meta: dict, policy, host: HostConfig) -> None:
    from opsctl.bench.workloads import mix_key

    want = mix_key(policy.workloads)
    have = baseline_meta.get("workload_mix") or "random token ids"
    if have != want:
        raise ConfigError(f"the stored {host.baseline_profile} baseline on {host.name} was measured on {have}; the "
                          f"gate measures on {want}: a release is only compared on the same requests",
                          f"with {host.baseline_profile} live, run 'opsctl bench --save-baseline' (same workload mix "
                          f"as the gate policy), then deploy again")


_PROGRESS = re.compile(r"\[loadgen\] C=(\d+) repeat (\d+): (\d+)/(\d+) requests \((\d+) errors\)")
_LEVEL_END = re.compile(r"\[loadgen\] C=(\d+) repeat (\d+): ([\d.]+) tok/s")


def _progress_relay(progress: Callable[[Any], None] | None, rnd: int = 0) -> Callable[[str], None] | None:
    """Turn loadgen's stderr lines (from the host) back into its ProgressEvents."""
    if progress is None:
        return None
    from opsctl.bench.loadgen import ProgressEvent

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
            progress: Callable[[Any], None] | None = None, meta: dict | None = None, baseline=None, prior=None):
    """Run the policy's bench on the host itself (network out of the numbers), on the
    policy's workload mix, level by level in rounds of max(C, requests_per_level) requests.

    With a `baseline`, a level stops as soon as its speedup interval clears the gate's
    threshold either way (`gates.throughput_decision`: the interval's confidence is spread over
    the level's planned looks, so stopping early costs no error), or at `max_requests`: a clear
    win or loss costs fewer requests than a close call. Without one (a baseline being measured)
    every level runs to `max_requests`, so later candidates have all of its samples.

    `prior`: the first measurement, when this is the gate's re-measure. Its rounds go on where
    the first stopped: each look counts the first's samples too, a level the first already
    decided is not measured again (its decision stands), and the round numbers continue (the
    requests are new ones)."""
    from opsctl import confidence as cf
    from opsctl.bench.results import from_records
    from opsctl.bench.workloads import WorkloadSet, mix_key
    from opsctl.gates import throughput_decision

    remote = f"{host.install_root}/bin/opsctl-loadgen.py"
    if not conn.run(f"test -f {remote}", check=False).ok:
        from opsctl.bench import LOADGEN_PATH

        conn.put(LOADGEN_PATH, remote, mode=0o755)
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
        if base_rates and before and throughput_decision(policy, level, before, base_rates)[1] != "inconclusive":
            stopped[level] = "decided by the first measurement"
            continue
        sent, rnd = 0, 0
        while sent < cap:
            reqs = ws.select(per_round, seed=policy.seed, level=level, repeat=first_rounds + rnd)
            body = "".join(json.dumps({"level": level, "repeat": 0, **r.payload(policy.output_len)}) + "\n"
                           for r in reqs)
            path = f"{workdir}/requests-c{level}-r{rnd}.jsonl"
            conn.run(f"cat > {path}", stdin=body)
            argv = [str(host.host_python), remote, "--url", url, "--concurrency", str(level), "--requests-file", path,
                    "--requests-per-level", str(per_round), "--repeats", "1", "--output-len", str(policy.output_len),
                    "--input-len", str(policy.input_len), "--seed", str(policy.seed),
                    "--warmup", str(policy.warmup if first else 0), "--json"]
            records += _run_loadgen(conn, host, argv, progress, rnd)
            first = False
            sent += per_round
            rnd += 1
            if base_rates is not None:
                cand = before + cf.rates(cf.samples_of(r for r in records if r.get("max_concurrency") == level))
                decision = throughput_decision(policy, level, cand, base_rates)[1]
                if decision != "inconclusive":
                    stopped[level] = (f"{decision} after {sent} requests (round {first_rounds + rnd}; "
                                      f"{policy.looks_at(level)} looks planned)")
                    break
        else:
            stopped[level] = f"cap of {sent} requests"
    conn.run(f"rm -rf {workdir}", check=False)
    if make_canary or canary_file:
        argv = [str(host.host_python), remote, "--url", url, "--canary-only", "--seed", str(policy.seed), "--json"]
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
    from opsctl.bench.results import parse_jsonl_text

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

    from opsctl.bench import loadgen
    from opsctl.bench.results import from_records
    from opsctl.host.connection import SSHConnection

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


def save_baseline(conn: Connection, host: HostConfig, profile_name: str, run, policy=None) -> str:
    from opsctl.bench.results import write_jsonl

    run_path, canary_path = baseline_paths(host, profile_name, policy)
    if run.canary is None or not run.canary.outputs:
        raise CheckFailed("the baseline bench produced no greedy canary outputs",
                          "check the server's /generate answers at temperature 0, then bench again")
    with tempfile.TemporaryDirectory() as tmp:
        local = write_jsonl(run, Path(tmp) / "baseline.jsonl")
        q = shlex.quote(run_path)
        conn.run(f"mkdir -p \"$(dirname {q})\" && cat > {q}.new && mv -f {q}.new {q}",
                 stdin=local.read_text())
    q = shlex.quote(canary_path)
    conn.run(f"cat > {q}.new && mv -f {q}.new {q}",
             stdin=json.dumps(run.canary.reference()) + "\n")
    return run_path


def load_baseline(conn: Connection, host: HostConfig, policy=None):
    run_path, _ = baseline_paths(host, host.baseline_profile, policy)
    res = conn.run(f"cat {shlex.quote(run_path)}", check=False)
    if not res.ok:
        require_baseline(conn, host, policy)
    return run_from_text(res.stdout, source=f"{host.name}:{run_path}")


def drain_deadline_s(conn: Connection, host: HostConfig) -> float:
    """`opsctl.drain.deadline_s`, else the stored baseline bench's p99 request time x 2 (at most
    600 s), else 300 s (opsctl.drain.default_deadline_s)."""
    from opsctl.drain import bench_p99_s, deadline_s

    cfg = host.settings.drain
    if cfg.deadline_s is not None or not cfg.enabled:
        return deadline_s(cfg, None)
    try:
        p99 = bench_p99_s(load_baseline(conn, host, host.gate_policy()))
    except (OpsctlError, ValueError):
        p99 = None
    return deadline_s(cfg, p99)


def run_from_text(text: str, *, source: str):
    """A BenchRun from the JSON lines `write_jsonl` stored on a host."""
    from opsctl.bench.results import from_records, parse_jsonl_text

    records = parse_jsonl_text(text, source=source)
    meta = next((r for r in records if r.get("record") == "meta"), {})
    return from_records([r for r in records if r.get("record") != "meta"], meta=meta)



def bench_live(inventory: str | Path | Inventory, *, limit: str | None = None, overrides: dict | None = None,
               prompt_file: Path | None = None, save_baseline_run: bool = False, on_host: bool = True,
               progress: Callable[[Any], None] | None = None) -> dict:

    if prompt_file is not None:
        raise ConfigError("--prompt-file is supported with --url only for now",
                          "copy the prompts to the host and run its loadgen, or bench through a tunnel with --url")
    inv = as_inventory(inventory)
    runs = {}
    for host in inv.select(limit):
        conn = connect(host)
        try:
            state = read_state(conn, host)
            cur = state.current_release
            if cur is None:
                raise ConfigError(f"no live release on {host.name} to benchmark", "deploy one first: opsctl deploy ar-tp8")
            profile = release_profile(cur, host)
            try:
                policy = host.gate_policy().model_copy(update=overrides or {})
            except Exception as exc:  # noqa: BLE001 - pydantic validation of overrides
                raise ConfigError(f"bad bench option: {exc}", "see opsctl bench --help") from None
            meta = {"release": cur.id, "profile": profile.label, "kind": profile.kind}
            if save_baseline_run:
                if profile.name != host.baseline_profile:
                    raise ConfigError(f"the live release on {host.name} is {profile.label}, not the baseline profile "
                                      f"{host.baseline_profile}", f"deploy {host.baseline_profile} first, then "
                                      "run 'opsctl bench --save-baseline'")
                run = measure(conn, host, policy, make_canary=True, progress=progress, meta=meta)
                path = save_baseline(conn, host, profile.name, run, policy)
                append_ledger(conn, host, {"action": "baseline", "result": "ok", "release": cur.id,
                                           "profile": profile.name, "reason": f"baseline saved to {path}",
                                           "summary": run_summary(run)})
            elif on_host:
                run = measure(conn, host, policy, progress=progress, meta=meta)
            else:
                run = measure_via_tunnel(host, policy, progress=progress, meta=meta)
            runs[host.name] = run
        finally:
            conn.close()
    return runs


def run_summary(run) -> list[dict]:
    return [{"C": lv.level, "output_tok_s": round(lv.output_throughput, 1), "itl_p50_ms": round(lv.median_itl_ms, 2),
             "accept_length": lv.accept, "errors": lv.errors} for lv in run.median().levels]


def summary_line(run) -> str:
    return ", ".join(f"C={s['C']}: {s['output_tok_s']} tok/s" for s in run_summary(run))
