"""A release laid out on the lab host by hand (the ARCHITECTURE.md host layout), for when
`opsctl.deploy.deploy` cannot run on the lab yet. Uses opsctl's own pieces (plan, render,
drafter manifest, opsctl-switch, wait_ready) but no playbook and no lock. Files go up with
SFTP (`put`): SSHConnection.run(stdin=...) costs ~10 ms per byte through fabric/invoke."""
from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

from opsctl.config import HostConfig, Inventory
from opsctl.hosts import SSHConnection

REPO = Path(__file__).resolve().parents[2]


def _write(conn: SSHConnection, path: str, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".opsctl-test") as f:
        f.write(text)
        f.flush()
        conn.put(f.name, path)


def _ledger(conn: SSHConnection, host: HostConfig, record: dict) -> None:
    from opsctl.releases import now_iso, who

    line = json.dumps({"ts": now_iso(), "host": host.name, "who": who(), **record})
    conn.run(f"echo {shlex.quote(line)} >> {host.install_root}/ledger.jsonl")


def handmade_release(inventory: Inventory, host_name: str, profile_name: str) -> str:
    from opsctl import deploy as D

    host: HostConfig = inventory.hosts[host_name]
    profile = host.profile(profile_name)
    conn = SSHConnection(host)
    try:
        plan = D.make_plan(conn, host, profile)
        root = host.install_root
        q = shlex.quote
        env = D.env_python(host).parent.parent
        conn.run(f"mkdir -p {root}/releases {root}/bin {root}/baselines {root}/shared/envs {root}/shared/drafters "
                 f"{root}/shared/home {root}/shared/cache {root}/shared/wheelhouse")
        if not conn.run(f"test -f {env}/.opsctl-complete", check=False).ok:
            for wheel in sorted(host.runtime.wheelhouse.glob("*.whl")):
                conn.put(wheel, f"{root}/shared/wheelhouse/{wheel.name}")
            reqs = " ".join(q(r) for r in host.runtime.base_requirements)
            conn.run(f"rm -rf {env} && {host.host_python} -m venv {env} && {env}/bin/python -m pip install -q "
                     f"--no-index --find-links {root}/shared/wheelhouse {reqs} && touch {env}/.opsctl-complete",
                     timeout=300)
        if plan.drafter is not None:
            ddir = f"{root}/shared/drafters/{plan.drafter.digest}"
            if not conn.run(f"test -f {ddir}/manifest.json", check=False).ok:
                conn.run(f"rm -rf {ddir}.incoming && mkdir -p {ddir}.incoming")
                for rel in plan.drafter.files:
                    conn.run(f"mkdir -p $(dirname {q(ddir + '.incoming/' + rel)})")
                    conn.put(host.drafter.source / rel, f"{ddir}.incoming/{rel}")
                _write(conn, f"{ddir}.incoming/manifest.json", plan.drafter.to_json())
                conn.run(f"mv -T {ddir}.incoming {ddir}")
        rdir = f"{root}/releases/{plan.release}"
        if not conn.run(f"test -f {rdir}/manifest.json", check=False).ok:
            stage = f"{root}/releases/.staging-{plan.release}"
            conn.run(f"rm -rf {stage} && mkdir -p {stage}/site")
            for name, text in plan.rendered.release_files.items():
                _write(conn, f"{stage}/{name}", text)
            if plan.drafter is not None:
                conn.run(f"ln -sfn ../../shared/drafters/{plan.drafter.digest} {stage}/drafter")
            _write(conn, f"{stage}/manifest.json", json.dumps(plan.manifest(), indent=1, sort_keys=True) + "\n")
            conn.run(f"mv -T {stage} {rdir}")
        conn.put(REPO / "playbooks" / "files" / "opsctl-switch", f"{root}/bin/opsctl-switch", mode=0o755)
        if plan.is_live:
            return plan.release
        _ledger(conn, host, {"action": "deploy", "result": "started", "from_release": plan.previous,
                                   "to_release": plan.release, "profile": profile.name, "budget": profile.budget,
                                   "reason": "tests/checks handmade release"})
        since = D.switch(conn, host, plan.release)
        D.wait_ready(conn, host, profile, since, D.Steps(None, host.name))
        _ledger(conn, host, {"action": "promote", "result": "ok", "from_release": plan.previous,
                                   "to_release": plan.release, "profile": profile.name, "budget": profile.budget,
                                   "reason": "gates skipped (tests/checks handmade release)"})
        return plan.release
    finally:
        conn.close()
