"""bench: the baselines the gate compares with (stored on the host), and `opsctl bench` on
the live release; the measuring itself is opsctl/gate/measure.py."""
from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path
from typing import Any, Callable

from opsctl.config import HostConfig, Inventory
from opsctl.errors import CheckFailed, ConfigError, OpsctlError
from opsctl.flow.steps import as_inventory
from opsctl.gate.baseline import baseline_paths
from opsctl.host import facts
from opsctl.host.connection import Connection, connect
from opsctl.ledger import append_ledger
from opsctl.releases import read_state, release_profile

# the stored baseline's file names: one function for the gate and the watch (opsctl/gate/baseline.py)


def has_baseline(conn: Connection, host: HostConfig, policy=None) -> bool:
    run_path, canary_path = baseline_paths(host, host.baseline_profile, policy)
    return facts.get(conn, facts.NonEmptyFiles((run_path, canary_path)))


def require_baseline(conn: Connection, host: HostConfig, policy=None) -> None:
    """A speculative release is judged against the host's baseline, measured on the same
    workload mix: without one, stop before touching anything and say how to make it."""
    from opsctl.gate.workloads import mix_key

    policy = policy or host.gate_policy()
    if has_baseline(conn, host, policy):
        return
    base = f"{host.install_root}/baselines/{host.model.name}"
    mixes = []
    for line in facts.get(conn, facts.FirstLines(base, host.baseline_profile, ".jsonl")):
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
    from opsctl.gate.workloads import mix_key

    want = mix_key(policy.workloads)
    have = baseline_meta.get("workload_mix") or "random token ids"
    if have != want:
        raise ConfigError(f"the stored {host.baseline_profile} baseline on {host.name} was measured on {have}; the "
                          f"gate measures on {want}: a release is only compared on the same requests",
                          f"with {host.baseline_profile} live, run 'opsctl bench --save-baseline' (same workload mix "
                          f"as the gate policy), then deploy again")


def save_baseline(conn: Connection, host: HostConfig, profile_name: str, run, policy=None) -> str:
    from opsctl.gate.results import write_jsonl

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
    text = facts.get(conn, facts.TextFile(run_path))
    if text is None:
        require_baseline(conn, host, policy)
    return run_from_text(text or "", source=f"{host.name}:{run_path}")


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
    from opsctl.gate.results import from_records, parse_jsonl_text

    records = parse_jsonl_text(text, source=source)
    meta = next((r for r in records if r.get("record") == "meta"), {})
    return from_records([r for r in records if r.get("record") != "meta"], meta=meta)



def bench_live(inventory: str | Path | Inventory, *, limit: str | None = None, overrides: dict | None = None,
               prompt_file: Path | None = None, save_baseline_run: bool = False, on_host: bool = True,
               progress: Callable[[Any], None] | None = None) -> dict:
    # the load generator and the interval arithmetic: status, history and rollback import this
    # module for the stored baseline and do not load them
    from opsctl.gate.measure import measure, measure_via_tunnel

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
