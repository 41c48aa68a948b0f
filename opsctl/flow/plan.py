"""plan: what a deploy would change (rendered files, release id, bytes to send, the unit's
diff, room on the host). Reads the host, writes nothing."""
from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl import __version__
from opsctl.artifacts import DrafterManifest, drafter_manifest, plan_drafter, runtime_wheel, sha256_file
from opsctl.config import HostConfig, Profile
from opsctl.errors import ConfigError, HostError
from opsctl.host import facts
from opsctl.host.connection import Connection
from opsctl.integrity import site_files, verify_release
from opsctl.releases import HostState, read_state, release_id
from opsctl.ledger import now_iso, who
from opsctl.render import Rendered, env_python, render

# opsctl.triton (a ddtree release) and opsctl.wheelhouse (a host without its base environment) are
# imported in make_plan where a plan needs them: a deploy that needs neither does not load them
# (packaging, urllib.request, ssl)
if TYPE_CHECKING:
    from opsctl import triton

# --------------------------------------------------------------------------- plan


@dataclass
class Plan:
    host: HostConfig
    profile: Profile
    rendered: Rendered
    release: str
    state: HostState
    runtime_wheel: Path | None
    runtime_sha: str | None
    drafter: DrafterManifest | None
    drafter_plan: dict | None
    unit_diff: str
    changes: list[str] = field(default_factory=list)
    bytes_to_send: int = 0
    verify_weights: bool = False
    restage: list[str] = field(default_factory=list)  # what differs in the staged release: restage it (item 9)
    base_env: dict | None = None  # the wheelhouse to ship and install from, when the host lacks the base env
    triton: triton.Decision | None = None  # ddtree: what the stage's triton step would do (issue #36)
    triton_outcome: dict | None = None     # ddtree: what it did (set by the stage step)

    @property
    def previous(self) -> str | None:
        return self.state.current

    @property
    def release_exists(self) -> bool:
        return self.release in self.state.releases

    @property
    def is_live(self) -> bool:
        return self.state.current == self.release and self.state.service.get("ActiveState") == "active"

    @property
    def repairs(self) -> list[str]:
        """What this deploy repairs in a release already on the host: damaged drafter files (re-sent)
        and the release's own files (restaged). A live release with repairs restarts and is judged
        again: the server loaded the damaged files (issue #32 item 9)."""
        return [f"drafter/{r}" for r in (self.drafter_plan or {}).get("repair") or []] + self.restage

    def manifest(self) -> dict:
        return {
            "id": self.release, "profile": self.profile.model_dump(mode="json"),
            "verify_width": self.profile.verify_width, "rendered_digest": self.rendered.digest(),
            "files": {n: _sha(t) for n, t in sorted(self.rendered.release_files.items())},
            "secrets": self.host.settings.secrets_file is not None,  # never their values or hash
            "runtime_wheel": ({"name": self.runtime_wheel.name, "sha256": self.runtime_sha}
                              if self.runtime_wheel else None),
            # what the runtime wheel puts under site/, by full sha256: 'check post' and every rollback
            # check the tree against it (opsctl/integrity.py, issue #32 item 9)
            "site_files": site_files(self.runtime_wheel) if self.runtime_wheel else None,
            "drafter": ({"digest": self.drafter.digest, "bytes": self.drafter.total_bytes} if self.drafter else None),
            # ddtree: what the release needs of its Triton cache (the `triton` link), for a later check
            **({"triton": self._triton_needs()} if self.triton else {}),
            "created_at": now_iso(), "created_by": who(), "opsctl_version": __version__,
        }

    def _triton_needs(self) -> dict:
        n = self.triton.needs
        return {"arch": n.arch, "cache": str(self.triton.host_dir), "hidden": n.hidden, "tp": n.tp,
                "capture_bs": list(n.capture_bs), "specialisations": [s.as_dict() for s in n.specialisations]}

    def as_dict(self) -> dict:
        return {"host": self.host.name, "profile": self.profile.name, "budget": self.profile.budget,
                "budget_schedule": self.profile.budget_schedule,
                "schedule_bands": self.profile.schedule_bands,
                "verify_width": self.profile.verify_width, "release": self.release,
                "current": self.state.current, "release_exists": self.release_exists, "live": self.is_live,
                "changes": self.changes, "unit_diff": self.unit_diff, "bytes_to_send": self.bytes_to_send,
                "drafter": self.drafter_plan, "base_env": self.base_env, "argv": self.rendered.argv,
                "repairs": self.repairs, "triton": self.triton.as_dict() if self.triton else None}


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def secrets_digest(host: HostConfig) -> str | None:
    """sha256 of the configured secrets file (None when none is configured). A missing file,
    or one that group/others can read, is refused before anything touches the host."""
    path = host.settings.secrets_file
    if path is None:
        return None
    import stat

    try:
        st = path.stat()
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"secrets_file {path} (host {host.name}) does not exist",
                          "create it (KEY=VALUE lines, chmod 600) or remove secrets_file from the inventory") from None
    except OSError as exc:
        raise ConfigError(f"secrets_file {path} cannot be read: {exc.strerror}", "check its owner and mode") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) and not host.settings.secrets_mode_ok:
        raise ConfigError(f"secrets_file {path} is readable by group/others (mode {stat.S_IMODE(st.st_mode):04o})",
                          f"chmod 600 {path} (or set secrets_mode_ok: true to accept it)")
    return hashlib.sha256(data).hexdigest()


def make_plan(conn: Connection, host: HostConfig, profile: Profile, *, verify_weights: bool = False) -> Plan:
    """Work out what a deploy would change. Reads the host, writes nothing: each fact once
    (facts.cached, the run's cache)."""
    with facts.cached(conn):
        return _make_plan(conn, host, profile, verify_weights=verify_weights)


def _make_plan(conn: Connection, host: HostConfig, profile: Profile, *, verify_weights: bool) -> Plan:
    rendered = render(host, profile)
    wheel = runtime_wheel(host) if profile.kind == "ddtree" else None
    wheel_sha = sha256_file(wheel) if wheel else None
    manifest = drafter_manifest(host.drafter.source) if profile.speculative else None
    secrets_sha = secrets_digest(host)
    rid = release_id(profile.slug, rendered.digest(), wheel_sha, manifest.digest if manifest else None, secrets_sha)
    state = read_state(conn, host)
    current_unit = ""
    if state.current:
        current_unit = facts.get(conn, facts.TextFile(f"{host.install_root}/current/{host.unit_name}")) or ""
    new_unit = rendered.release_files[host.unit_name]
    diff = "".join(difflib.unified_diff(current_unit.splitlines(True), new_unit.splitlines(True),
                                        fromfile=f"live ({state.current or 'none'})", tofile=f"new ({rid})"))
    dplan = plan_drafter(conn, host, manifest, source=host.drafter.source, full_verify=verify_weights) \
        if manifest else None
    plan = Plan(host, profile, rendered, rid, state, wheel, wheel_sha, manifest, dplan, diff,
                verify_weights=verify_weights)
    env_ready = facts.get(conn, facts.IsFile(f"{env_python(host).parent.parent}/.opsctl-complete"))
    if wheel_sha is not None:  # ddtree: the draft head's Triton kernels (read only; compiled, if at all, in stage)
        from opsctl import triton

        plan.triton = triton.plan_release(conn, host, profile, wheel_sha, env_ready=env_ready)
    changes: list[str] = []
    send = 0
    if not env_ready:
        # the wheelhouse matches its lock and every wheel fits the host's Python and glibc, or nothing ships
        from opsctl import wheelhouse

        plan.base_env = wheelhouse.plan_base_env(conn, host)
        be = plan.base_env
        changes.append(f"create base environment sglang-{host.runtime.sglang_version} from {be['packages']} "
                       f"wheels ({be['bytes_total'] / 2**20:.1f} MiB; send {be['send']} file(s), "
                       f"{be['bytes_to_send'] / 2**20:.1f} MiB, reuse {be['link']})")
        send += be["bytes_to_send"]
    if plan.release_exists:
        # the staged release's own files (rendered files, runtime tree) by full sha256: a damaged one is
        # staged again, not reused (the drafter is checked with the other drafter files below)
        check = verify_release(conn, host, rid, drafter="none")
        plan.restage = check.problems
    if plan.restage:
        changes.append(f"release {rid} on the host differs from its manifest ({check.summary()}): stage it again"
                       + (" and restart it" if state.current == rid else ""))
        send += sum(len(t.encode()) for t in rendered.release_files.values())
    elif plan.release_exists:
        if state.current == rid:
            changes.append(f"release {rid} is already live" + ("" if plan.is_live else
                           f" but the service is {state.service.get('ActiveState', 'unknown')}: restart it"))
        else:
            changes.append(f"release {rid} is already staged: switch to it")
    else:
        changes.append(f"stage release {rid}: {', '.join(sorted(rendered.release_files))}"
                       + (f", runtime {wheel.name}" if wheel else ""))
        send += sum(len(t.encode()) for t in rendered.release_files.values()) + (wheel.stat().st_size if wheel else 0)
    if dplan is not None:
        if dplan["present"]:
            changes.append(f"drafter {manifest.digest[:12]} already on the host, content checked "
                           f"({'every byte' if verify_weights else 'sizes and sampled hashes'}; 0 bytes)")
        elif dplan.get("repair"):
            changes.append(f"drafter {manifest.digest[:12]} on the host differs in {len(dplan['repair'])} file(s) "
                           f"({', '.join(dplan['repair'][:3])}): re-send them ({dplan['bytes_to_send'] / 2**20:.1f} MiB)")
            send += dplan["bytes_to_send"]
        else:
            changes.append(f"drafter {manifest.digest[:12]}: send {len(dplan['send'])} file(s) "
                           f"({dplan['bytes_to_send'] / 2**20:.1f} MiB), reuse {len(dplan['link'])}")
            send += dplan["bytes_to_send"]
    if plan.triton is not None:
        changes.append(plan.triton.describe())
    if not plan.is_live:
        changes.append(f"switch current: {state.current or 'none'} -> {rid}; restart {host.unit_name}")
    plan.changes = changes
    plan.bytes_to_send = send
    _check_room(conn, host, send)
    return plan


LEDGER_ROOM = 64 << 20  # the ledger, the guard's records, manifests and bench files


def _check_room(conn: Connection, host: HostConfig, bytes_to_send: int) -> None:
    """Refuse before anything changes when the install root cannot take the release, the
    ledger and the guard's records (a full disk mid-deploy tears records and releases)."""
    root = host.install_root
    free = facts.get(conn, facts.DiskFree(str(root)))
    if free is None:
        return  # no df on the host: the pre-checks report disk space
    need = bytes_to_send + LEDGER_ROOM
    if free < need:
        raise HostError(f"{host.name}: {free / 2**20:.0f} MiB free under {root}, this deploy needs "
                        f"{need / 2**20:.0f} MiB (release {bytes_to_send / 2**20:.0f} MiB + 64 MiB for the ledger "
                        f"and the guard); nothing was changed", f"free space under {root} on the host, then deploy again")

