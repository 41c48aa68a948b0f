"""stage: ship the wheelhouse and the drafter, then the prepare playbook builds the release
under releases/.staging-<id> and renames it into place, on one host or a whole wave at once;
then, for a ddtree release, its Triton cache is completed (the `triton` step). Nothing live
changes."""
from __future__ import annotations

import base64
import json
import shlex
import time

from opsctl import hostmetrics, watch
from opsctl.artifacts import SyncResult, sync_drafter
from opsctl.onhost import archive as onhost_archive
from opsctl.config import Inventory
from opsctl.flow.plan import Plan
from opsctl.flow.steps import Steps
from opsctl.host.connection import Connection
from opsctl.errors import HostError
from opsctl.playbook import PlayResult, raise_for, run_playbook_hosts
from opsctl.render import env_python


def stage_wave(inv: Inventory, items: list[tuple[Connection, Plan, Steps]]
               ) -> dict[str, tuple[PlayResult | None, SyncResult | None, HostError | None]]:
    """Stage a wave: each host's wheelhouse and drafter by content (rsync over its own SSH),
    then ONE prepare playbook run over every host of the wave (Ansible's forks stage them in
    parallel), each host with its own release variables. Per host: (play, drafter sync, the
    HostError that stopped its staging, or None)."""
    out: dict[str, tuple[PlayResult | None, SyncResult | None, HostError | None]] = {}
    variables: dict[str, dict] = {}
    ready: list[tuple[Connection, Plan, Steps]] = []
    for conn, plan, steps in items:
        try:
            sync, env_wheelhouse = _ship(conn, plan, steps)
        except HostError as exc:
            if len(items) == 1:
                raise
            out[plan.host.name] = (None, None, exc)
            continue
        variables[plan.host.name] = _release_vars(plan, env_wheelhouse)
        out[plan.host.name] = (None, sync, None)
        ready.append((conn, plan, steps))
    if not ready:
        return out
    hosts = [plan.host for _, plan, _ in ready]
    t0 = {}
    for _, plan, steps in ready:
        t0[plan.host.name] = steps.start("prepare", "ansible playbook prepare.yml"
                                         + (f" (with {len(ready) - 1} more host(s) of this wave)"
                                            if len(ready) > 1 else ""))
    plays = run_playbook_hosts(inv, hosts, "prepare.yml", variables,
                               progress={plan.host.name: steps.task for _, plan, steps in ready})
    for _, plan, steps in ready:
        name = plan.host.name
        play = plays[name]
        try:
            raise_for(play, plan.host)
        except HostError as exc:
            if len(items) == 1:
                raise
            steps.done("prepare", t0[name], exc.problem, status="fail")
            out[name] = (play, out[name][1], exc)
            continue
        window = ({"started_at": play.window[0], "ended_at": play.window[1]} if play.window else {})
        steps.done("prepare", t0[name], f"changed={play.changed} ok={play.ok}", changed=play.changed, **window)
        out[name] = (play, out[name][1], None)
    for conn, plan, steps in ready:
        name = plan.host.name
        if out[name][2] is not None or plan.triton is None:
            continue
        try:
            plan.triton_outcome = triton_step(conn, plan, steps)
        except HostError as exc:
            if len(items) == 1:
                raise
            out[name] = (out[name][0], out[name][1], exc)
    return out


def triton_step(conn: Connection, plan: Plan, steps: Steps) -> dict:
    """The release's Triton cache before the switch (issue #36): complete already, or shipped from
    the controller's cache, or compiled on the host (no GPU, niced), or left to the first start
    (a note with the cost and the fix). Returns the outcome the deploy records."""
    from opsctl import triton  # a ddtree release only

    host = plan.host
    assert plan.triton is not None and plan.runtime_sha is not None
    view = triton.read_host(conn, host, plan.runtime_sha)   # fresh: the prepare play made the environment
    d = triton.decide(plan.triton.needs, view, host)
    plan.triton = d
    n, arch = d.count, d.needs.arch
    missing = len(d.coverage.missing)
    if d.action == "complete":
        t0 = steps.start("triton", f"{n} specialisation(s) for {arch}")
        outcome = d.outcome("complete", time.monotonic() - t0)
        steps.done("triton", t0, f"cache complete ({n} specialisations), no compile at start", triton=outcome)
        return outcome
    if d.action == "ship":
        t0 = steps.start("triton", f"ship the controller's cache for {arch}: {missing} missing specialisation(s)")
        sent = triton.ship_cache(conn, host, d)
        outcome = d.outcome("shipped", time.monotonic() - t0, **sent)
        steps.done("triton", t0, f"shipped {sent['files']} file(s), {sent['bytes_sent']} bytes: cache complete "
                   f"({n} specialisations), no compile at start", triton=outcome)
        return outcome
    if d.action == "compile":
        t0 = steps.start("triton", f"compiling {missing} specialisation(s) for {arch} on the host (no GPU, niced): "
                         f"a long step, about {triton.CPU_S_PER_SPECIALISATION} s of CPU each")
        res = triton.compile_on_host(conn, host, d, plan.release, view,
                                     on_line=lambda line: steps.note(f"triton: {line}") if line.strip() else None)
        if res["ok"]:
            outcome = d.outcome("compiled", time.monotonic() - t0, kernels=res.get("kernels"))
            steps.done("triton", t0, f"compiled {res.get('kernels')} kernel(s): cache complete ({n} specialisations), "
                       "no compile at start", triton=outcome)
            return outcome
        # a failed fill costs the start its compile, not the deploy
        line = f"compile failed ({res['error']}); " + d.missing_line()
        outcome = d.outcome("missing", time.monotonic() - t0, compiled_at_start=missing, error=res["error"])
        steps.done("triton", t0, line, status="warn", triton=outcome)
        return outcome
    t0 = steps.start("triton", f"{n} specialisation(s) for {arch}")
    outcome = d.outcome("missing", time.monotonic() - t0, compiled_at_start=missing)
    steps.done("triton", t0, d.missing_line(), status="warn", triton=outcome)
    return outcome


def _ship(conn: Connection, plan: Plan, steps: Steps) -> tuple[SyncResult | None, str]:
    host = plan.host
    sync = None
    env_wheelhouse = ""
    if plan.base_env is not None:
        from opsctl import wheelhouse  # a host without its base environment only

        t0 = steps.start("wheelhouse", f"{plan.base_env['bytes_total'] / 2**20:.1f} MiB")
        remote, wsync = wheelhouse.ship(conn, host, progress=steps.note)
        env_wheelhouse = str(remote)
        steps.done("wheelhouse", t0, f"{wsync.bytes_sent} bytes sent, {wsync.files_sent} file(s) sent, "
                   f"{wsync.files_linked} reused", bytes_sent=wsync.bytes_sent)
    if plan.drafter is not None:
        t0 = steps.start("drafter", f"{plan.drafter.total_bytes / 2**20:.1f} MiB")
        sync = sync_drafter(conn, host, host.drafter.source, plan.drafter, progress=steps.note,
                            full_verify=plan.verify_weights)
        steps.done("drafter", t0, f"{sync.bytes_sent} bytes sent, {sync.files_sent} file(s) sent, "
                   f"{sync.files_linked} reused", bytes_sent=sync.bytes_sent)
    if plan.runtime_wheel is not None:
        _ship_runtime_wheel(conn, plan)
    return sync, env_wheelhouse


def _ship_runtime_wheel(conn: Connection, plan: Plan) -> None:
    """The runtime wheel into <root>/shared/wheels by content (sent only when the host's copy differs),
    over the deploy's own SSH connection: an Ansible `copy` costs two remote Python runs for one file."""
    wheels = f"{plan.host.install_root}/shared/wheels"
    dest = f"{wheels}/{plan.runtime_wheel.name}"
    have = conn.run(f"sha256sum {shlex.quote(dest)} 2>/dev/null || true", check=False).stdout.split()
    if have[:1] == [plan.runtime_sha]:
        return
    tmp = f"{wheels}/.{plan.runtime_wheel.name}.part"
    conn.run(f"mkdir -p {shlex.quote(wheels)}")
    conn.put(plan.runtime_wheel, tmp, mode=0o644)
    conn.run(f"mv -f {shlex.quote(tmp)} {shlex.quote(dest)}")


def _release_vars(plan: Plan, env_wheelhouse: str) -> dict:
    """The prepare playbook's variables for one host: its rendered release files and manifest
    (written on the host by one opsctl_tree call), and where things go on the host."""
    host = plan.host
    existing = plan.state.releases.get(plan.release)
    manifest = existing.manifest if existing else plan.manifest()
    if existing and plan.restage:  # staged again: the manifest as this opsctl writes it, its first date kept
        manifest = {**plan.manifest(), "created_at": existing.created_at or plan.manifest()["created_at"]}
    files = {**plan.rendered.release_files, "manifest.json": json.dumps(manifest, indent=1, sort_keys=True) + "\n"}
    s = host.settings
    return {
        "opsctl_root": str(host.install_root), "opsctl_release_id": plan.release,
        "opsctl_restage": bool(plan.restage),   # the release on the host differs from its manifest: replace it
        # base64: extra vars are templated by Ansible, and a rendered file may hold "{{" or "{#"
        "opsctl_release_files": [{"path": name, "content_b64": base64.b64encode(text.encode()).decode(), "mode": "0644"}
                                 for name, text in sorted(files.items())],
        "opsctl_env_dir": str(env_python(host).parent.parent),
        "opsctl_sglang_version": host.runtime.sglang_version,
        "opsctl_wheelhouse_dir": env_wheelhouse, "opsctl_base_requirements": list(host.runtime.base_requirements),
        "opsctl_host_python": str(host.host_python), "opsctl_service_user": s.service_user or "",
        "opsctl_runtime_wheel": str(plan.runtime_wheel) if plan.runtime_wheel else "",
        "opsctl_drafter_digest": plan.drafter.digest if plan.drafter else "",
        # ddtree: the release's `triton` link to its runtime wheel's cache (shared/cache/triton/<sha12>)
        "opsctl_triton_cache_id": (_triton_cache_id(plan.runtime_sha)
                                   if plan.profile.kind == "ddtree" and plan.runtime_sha else ""),
        # the host-side package (load generator, watch agent) as one archive: bin/opsctl-onhost.pyz
        "opsctl_onhost_b64": base64.b64encode(onhost_archive()).decode(),
        # its metrics file's configuration (docs/metrics.md): <root>/metrics.json, read by every ledger append
        "opsctl_metrics_b64": base64.b64encode(hostmetrics.config_text(host).encode()).decode(),
        "opsctl_secrets_file": str(s.secrets_file) if s.secrets_file else "",
        **watch.playbook_vars(host),   # the host-side watch: installed (or removed) with every stage
    }


def _triton_cache_id(runtime_sha: str) -> str:
    from opsctl import triton

    return triton.cache_id(runtime_sha)
