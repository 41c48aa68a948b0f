"""The gates a deploy runs on a started release, and the checks it runs before
touching the host. Each gate reads the host through a Connection, decides with
pure code (validate.py, gates.py) and leaves a ledger record.
"""
from __future__ import annotations

import json
import re
import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from opsctl import journal, validate
from opsctl.config import HostConfig, Inventory, Profile
from opsctl.errors import CheckFailed, ConfigError, HostError
from opsctl.findings import Finding
from opsctl.hosts import Connection
from opsctl.releases import append_ledger

if TYPE_CHECKING:  # pragma: no cover
    from opsctl.deploy import GateOutcome, Steps


def _outcome(ok: bool, reason: str, record: dict) -> "GateOutcome":
    from opsctl.deploy import GateOutcome

    return GateOutcome(ok, reason, record)


# --------------------------------------------------------------------------- pre-deploy host checks


def _failed(report) -> list[Finding]:
    failed = [f for f in report.findings() if not f.ok]
    if not report.ok and not failed:  # pytest itself failed (collection error, no checks ran)
        failed = [Finding(check="checks.run", ok=False, diagnosis=report.summary(),
                          fix="run 'opsctl check' to see pytest's output")]
    return failed


def pre_checks(inv: Inventory, host: HostConfig, steps: "Steps", t0: float) -> None:
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


def post_checks(inv: Inventory, host: HostConfig, steps: "Steps") -> "GateOutcome":
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
        return _outcome(False, f"{failed[0].check}: {failed[0].diagnosis}", record)
    steps.done("post-checks", t0, f"{len(report.results)} checks passed")
    return _outcome(True, "", record)


# --------------------------------------------------------------------------- startup validation


PROBE_ROUNDS = 12


def probe_load_args(profile: Profile, round_no: int = 0) -> list[str]:
    """One round of a short probe load. SGLang prints a decode line every
    decode_log_interval forward steps, and a speculative step emits ~accept_len tokens,
    so the number of rounds needed depends on the (unknown) accept length: the caller
    repeats rounds until decode lines appear."""
    output_len = max(32, min(2 * profile.decode_log_interval * min(profile.verify_width, 4), 2048))
    return ["--concurrency", "2", "--requests-per-level", "2", "--repeats", "1", "--warmup", "0",
            "--input-len", "64", "--output-len", str(output_len), "--seed", str(7 + round_no)]


def run_probe(conn: Connection, host: HostConfig, profile: Profile, since: int | str):
    """Probe load in rounds until the journal holds at least two decode lines of the
    running server; returns the parsed journal."""
    parsed = None
    for round_no in range(PROBE_ROUNDS):
        run_loadgen(conn, host, probe_load_args(profile, round_no), timeout=600)
        parsed = journal.parse(journal.read_journal(conn, host.unit_name, since))
        if len(parsed.decodes_of()) >= 2:
            break
    return parsed


def run_loadgen(conn: Connection, host: HostConfig, args: list[str], *, timeout: float = 900) -> str:
    cmd = (f"{host.host_python} {host.install_root}/bin/opsctl-loadgen.py "
           f"--url http://127.0.0.1:{host.http_port} --json {' '.join(shlex.quote(a) for a in args)}")
    res = conn.run(cmd, check=False, timeout=timeout)
    if not res.ok:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [""]
        raise HostError(f"load generator on {host.name} failed (exit {res.rc}): {tail[0][:300]}",
                        "check the server answers on 127.0.0.1:%d" % host.http_port)
    return res.stdout


def validate_release(conn: Connection, host: HostConfig, profile: Profile, since: int, steps: "Steps") -> "GateOutcome":
    t0 = steps.start("validate", "CUDA-graph capture and decode lines from the journal")
    entries = journal.read_journal(conn, host.unit_name, since)
    findings = validate.validate_startup(journal.parse(entries), profile)
    if validate.all_ok(findings):
        findings = validate.validate(run_probe(conn, host, profile, since), profile, require_decode=True)
    return _finish_validation(conn, host, profile, findings, steps, t0)


def _finish_validation(conn: Connection, host: HostConfig, profile: Profile, findings: list[Finding],
                       steps: "Steps", t0: float) -> "GateOutcome":
    ok = validate.all_ok(findings)
    failed = [f for f in findings if not f.ok]
    steps.progress({"event": "findings", "host": host.name, "step": "validate",
                    "findings": [f.model_dump() for f in (failed or findings)]})
    record = {"ok": ok, "findings": [f.model_dump() for f in findings]}
    append_ledger(conn, host, {"action": "validation", "result": "ok" if ok else "failed",
                               "profile": profile.name, "budget": profile.budget,
                               "reason": "all checks passed" if ok else failed[0].one_line(),
                               "findings": [f.model_dump() for f in failed] if failed else
                               [f.model_dump() for f in findings if f.check.startswith("capture.")]})
    if ok:
        steps.done("validate", t0, f"{len(findings)} checks passed")
        return _outcome(True, "", record)
    steps.done("validate", t0, failed[0].one_line(), status="fail")
    return _outcome(False, f"{failed[0].check}: {failed[0].diagnosis}", record)


def validate_live(inv: Inventory, limit: str | None) -> list[Finding]:
    """`opsctl validate` against the live release: its journal since the service's
    current start, checked for the live release's profile, under a short probe load."""
    from opsctl.deploy import _release_profile
    from opsctl.hosts import connect
    from opsctl.releases import read_state

    out: list[Finding] = []
    for host in inv.select(limit):
        conn = connect(host)
        try:
            state = read_state(conn, host)
            if state.current_release is None:
                raise ConfigError(f"no live release on {host.name}", "deploy one first: opsctl deploy ar-tp8")
            profile = _release_profile(state.current_release, host)
            started = conn.run(f"t=$(systemctl show {host.unit_name} -p ExecMainStartTimestamp --value); "
                               f"[ -n \"$t\" ] && [ \"$t\" != n/a ] && date -d \"$t\" +%s", check=False)
            if not started.ok or not started.stdout.strip().isdigit():
                raise CheckFailed(f"{host.unit_name} is not running on {host.name}",
                                  f"start it (systemctl start {host.unit_name}) or roll back")
            since_arg = int(started.stdout.strip())
            findings = validate.validate(run_probe(conn, host, profile, since_arg), profile, require_decode=True)
            out.extend(f.model_copy(update={"details": {**f.details, "host": host.name}}) for f in findings)
        finally:
            conn.close()
    return out


# --------------------------------------------------------------------------- benchmark gate


def _mix_slug(policy) -> str:
    import hashlib

    from opsctl.bench.workloads import mix_key

    return hashlib.sha256(mix_key(policy.workloads).encode()).hexdigest()[:10]


def baseline_paths(host: HostConfig, profile_name: str, policy=None) -> tuple[str, str]:
    """(the bench run, the greedy canary) of the baseline profile. Runs are stored per
    workload mix (a candidate is compared on the same requests); the canary is per profile."""
    base = f"{host.install_root}/baselines/{host.model.name}"
    policy = policy or host.gate_policy()
    return f"{base}/{profile_name}.{_mix_slug(policy)}.jsonl", f"{base}/{profile_name}.canary.json"


def has_baseline(conn: Connection, host: HostConfig, policy=None) -> bool:
    run_path, canary_path = baseline_paths(host, host.baseline_profile, policy)
    return conn.run(f"test -s {run_path} && test -s {canary_path}", check=False).ok


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

    started: set[tuple[int, int]] = set()

    def on_line(line: str) -> None:
        m = _PROGRESS.search(line)
        if m:
            c, rep, done, total, errors = (int(x) for x in m.groups())
            rep += rnd
            if (c, rep) not in started:
                started.add((c, rep))
                progress(ProgressEvent("level_start", c, rep - 1, 0, total, 0))
            progress(ProgressEvent("request_done", c, rep - 1, done, total, errors))
            return
        m = _LEVEL_END.search(line)
        if m:
            c, rep = int(m.group(1)), int(m.group(2)) + rnd
            if (c, rep) not in started:
                started.add((c, rep))
                progress(ProgressEvent("level_start", c, rep - 1, 0, 1, 0))
            progress(ProgressEvent("level_end", c, rep - 1, 1, 1, 0))

    return on_line


def measure(conn: Connection, host: HostConfig, policy, *, make_canary: bool = False, canary_file: str | None = None,
            progress: Callable[[Any], None] | None = None, meta: dict | None = None, baseline=None):
    """Run the policy's bench on the host itself (network out of the numbers), on the
    policy's workload mix, level by level in rounds of max(C, requests_per_level) requests.

    With a `baseline`, a level stops as soon as its speedup interval clears the gate's
    threshold either way (opsctl/confidence.py), or at `max_requests`: a clear win or loss
    costs fewer requests than a close call. Without one (a baseline being measured) every
    level runs to `max_requests`, so later candidates have all of its samples."""
    from opsctl import confidence as cf
    from opsctl.bench.results import from_records, parse_jsonl_text
    from opsctl.bench.workloads import WorkloadSet, mix_key

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
        thr = (1 + policy.min_speedup) if level == policy.speedup_concurrency else (1 - policy.max_regression)
        sent, rnd = 0, 0
        while sent < cap:
            reqs = ws.select(per_round, seed=policy.seed, level=level, repeat=rnd)
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
                cand = cf.rates(cf.samples_of(r for r in records if r.get("max_concurrency") == level))
                iv = cf.speedup_interval(cand, base_rates, confidence=policy.confidence, seed=level)
                decision = cf.decide(iv, thr, policy.min_requests)
                if decision != "inconclusive":
                    stopped[level] = f"{decision} after {sent} requests"
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
    if not run.levels:
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
    from opsctl.hosts import SSHConnection

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
        conn.run(f"mkdir -p $(dirname {run_path}) && cat > {run_path}.new && mv -f {run_path}.new {run_path}",
                 stdin=local.read_text())
    conn.run(f"cat > {canary_path}.new && mv -f {canary_path}.new {canary_path}",
             stdin=json.dumps(run.canary.reference()) + "\n")
    return run_path


def load_baseline(conn: Connection, host: HostConfig, policy=None):
    run_path, _ = baseline_paths(host, host.baseline_profile, policy)
    res = conn.run(f"cat {run_path}", check=False)
    if not res.ok:
        require_baseline(conn, host, policy)
    return run_from_text(res.stdout, source=f"{host.name}:{run_path}")


def run_from_text(text: str, *, source: str):
    """A BenchRun from the JSON lines `write_jsonl` stored on a host."""
    from opsctl.bench.results import from_records, parse_jsonl_text

    records = parse_jsonl_text(text, source=source)
    meta = next((r for r in records if r.get("record") == "meta"), {})
    return from_records([r for r in records if r.get("record") != "meta"], meta=meta)


def bench_and_judge(conn: Connection, host: HostConfig, profile: Profile, release: str, steps: "Steps") -> "GateOutcome":
    """Bench the new release on the host and judge it against the stored baseline.
    A baseline profile benched on a host with no baseline becomes that baseline."""
    from opsctl.gates import judge_with_remeasure

    policy = host.gate_policy(profile)
    t0 = steps.start("bench", f"levels {','.join(map(str, policy.concurrency))}, {policy.repeats} repeat(s)")
    meta = {"release": release, "profile": profile.label, "kind": profile.kind}
    is_baseline_kind = profile.kind == "autoregressive"
    if is_baseline_kind and profile.name == host.baseline_profile and not has_baseline(conn, host, policy):
        run = measure(conn, host, policy, make_canary=True, meta=meta)
        path = save_baseline(conn, host, profile.name, run, policy)
        _store_release_bench(conn, host, release, run)
        steps.done("bench", t0, f"no baseline yet: stored this run as the {profile.name} baseline ({path})")
        rec = _verdict_record(conn, host, release, profile, "pass", [], [f"stored as the baseline ({path})"],
                              run_summary=_summary(run))
        return _outcome(True, "", rec)
    _, canary_path = baseline_paths(host, host.baseline_profile, policy)
    baseline = load_baseline(conn, host, policy)
    check_baseline_mix(baseline.meta, policy, host)
    if is_baseline_kind:
        # a baseline-kind release is held to "no regression", not to a speedup
        policy = policy.model_copy(update={"min_speedup": -policy.max_regression})
    first = measure(conn, host, policy, canary_file=canary_path, meta=meta, baseline=baseline)
    steps.done("bench", t0, _summary_line(first))
    t1 = steps.start("judge", f"against the {host.baseline_profile} baseline")
    verdict, run = judge_with_remeasure(
        lambda: measure(conn, host, policy, canary_file=canary_path, meta=meta, baseline=baseline), baseline, policy,
        profile_kind=profile.kind, canary_mismatch=first.canary.mismatch if first.canary else None,
        canary_ran=bool(first.canary and first.canary.compared), first=first)
    _store_release_bench(conn, host, release, run)
    steps.progress({"event": "verdict", "host": host.name, "status": verdict.status, "reasons": verdict.reasons,
                    "rows": [_row(r) for r in verdict.rows]})
    rec = _verdict_record(conn, host, release, profile, verdict.status, verdict.reasons, verdict.notes,
                          rows=[r.model_dump(mode="json") for r in verdict.rows], canary=verdict.canary,
                          attempts=verdict.attempts)
    if verdict.ok:
        from opsctl.gates import verdict_summary

        steps.done("judge", t1, f"{verdict.status.upper()}: {verdict_summary(verdict)}")
        return _outcome(True, "", rec)
    steps.done("judge", t1, verdict.one_line(), status="fail")
    return _outcome(False, verdict.one_line(), rec)


def _row(r) -> dict:
    def f(v, fmt):
        return "-" if v is None else fmt % v

    return {"C": r.concurrency, "baseline tok/s": f(r.baseline_tok_s, "%.1f"), "release tok/s": f(r.candidate_tok_s, "%.1f"),
            "delta": f(r.delta_pct, "%+.1f%%"), "ITL p50 base": f(r.baseline_itl_p50_ms, "%.2f ms"),
            "ITL p50 rel": f(r.candidate_itl_p50_ms, "%.2f ms"), "accept": f(r.accept_length, "%.2f"),
            "errors": r.errors,
            "CI": (f"[{r.low_pct:+.1f}, {r.high_pct:+.1f}] % n={r.samples}" if r.low_pct is not None else "-"),
            "status": r.why or r.status}


def _summary(run) -> list[dict]:
    return [{"C": lv.level, "output_tok_s": round(lv.output_throughput, 1), "itl_p50_ms": round(lv.median_itl_ms, 2),
             "accept_length": lv.accept, "errors": lv.errors} for lv in run.median().levels]


def _summary_line(run) -> str:
    return ", ".join(f"C={s['C']}: {s['output_tok_s']} tok/s" for s in _summary(run))


def _store_release_bench(conn: Connection, host: HostConfig, release: str, run) -> None:
    from opsctl.bench.results import write_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        local = write_jsonl(run, Path(tmp) / "bench.jsonl")
        conn.run(f"test -d {host.install_root}/releases/{release} && cat > {host.install_root}/releases/{release}/bench.jsonl",
                 stdin=local.read_text(), check=False)


def _verdict_record(conn: Connection, host: HostConfig, release: str, profile: Profile, status: str,
                    reasons: list[str], notes: list[str], **extra: Any) -> dict:
    rec = {"action": "verdict", "status": status, "result": "ok" if status == "pass" else "failed",
           "release": release, "to_release": release, "profile": profile.name, "budget": profile.budget,
           "reason": "; ".join(reasons) if reasons else "; ".join(notes), "reasons": reasons, "notes": notes, **extra}
    return append_ledger(conn, host, rec)


def bench_live(inv: Inventory, *, limit: str | None = None, overrides: dict | None = None,
               prompt_file: Path | None = None, save_baseline_run: bool = False, on_host: bool = True,
               progress: Callable[[Any], None] | None = None) -> dict:
    from opsctl.deploy import _release_profile
    from opsctl.hosts import connect
    from opsctl.releases import read_state

    if prompt_file is not None:
        raise ConfigError("--prompt-file is supported with --url only for now",
                          "copy the prompts to the host and run its loadgen, or bench through a tunnel with --url")
    runs = {}
    for host in inv.select(limit):
        conn = connect(host)
        try:
            state = read_state(conn, host)
            cur = state.current_release
            if cur is None:
                raise ConfigError(f"no live release on {host.name} to benchmark", "deploy one first: opsctl deploy ar-tp8")
            profile = _release_profile(cur, host)
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
                                           "summary": _summary(run)})
            elif on_host:
                run = measure(conn, host, policy, progress=progress, meta=meta)
            else:
                run = measure_via_tunnel(host, policy, progress=progress, meta=meta)
            runs[host.name] = run
        finally:
            conn.close()
    return runs
