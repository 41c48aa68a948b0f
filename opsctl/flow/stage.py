"""stage: ship the wheelhouse and the drafter, then the prepare playbook builds the release
under releases/.staging-<id> and renames it into place. Nothing live changes."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from opsctl import watch, wheelhouse
from opsctl.artifacts import SyncResult, sync_drafter
from opsctl.bench import LOADGEN_PATH
from opsctl.config import Inventory
from opsctl.flow.plan import Plan
from opsctl.flow.steps import Steps
from opsctl.host.connection import Connection
from opsctl.playbook import PlayResult, run_playbook
from opsctl.render import env_python


def stage(conn: Connection, inv: Inventory, plan: Plan, steps: Steps) -> tuple[PlayResult, SyncResult | None]:
    host = plan.host
    sync = None
    env_wheelhouse = ""
    if plan.base_env is not None:
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
    with tempfile.TemporaryDirectory(prefix="opsctl-stage-") as tmp:
        stage_dir = Path(tmp) / "release"
        stage_dir.mkdir()
        for name, text in plan.rendered.release_files.items():
            (stage_dir / name).write_text(text)
        existing = plan.state.releases.get(plan.release)
        manifest = existing.manifest if existing else plan.manifest()
        (stage_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        s = host.settings
        extravars = {
            "opsctl_root": str(host.install_root), "opsctl_release_id": plan.release,
            "opsctl_stage_local": str(stage_dir), "opsctl_env_dir": str(env_python(host).parent.parent),
            "opsctl_sglang_version": host.runtime.sglang_version,
            "opsctl_wheelhouse_dir": env_wheelhouse, "opsctl_base_requirements": list(host.runtime.base_requirements),
            "opsctl_host_python": str(host.host_python), "opsctl_service_user": s.service_user or "",
            "opsctl_runtime_wheel": str(plan.runtime_wheel) if plan.runtime_wheel else "",
            "opsctl_drafter_digest": plan.drafter.digest if plan.drafter else "",
            "opsctl_loadgen_src": str(LOADGEN_PATH),
            "opsctl_secrets_file": str(s.secrets_file) if s.secrets_file else "",
            **watch.playbook_vars(host),   # the host-side watch: installed (or removed) with every stage
        }
        t0 = steps.start("prepare", "ansible playbook prepare.yml")
        play = run_playbook(inv, host, "prepare.yml", extravars, progress=steps.task)
        steps.done("prepare", t0, f"changed={play.changed} ok={play.ok}", changed=play.changed)
    return play, sync

