"""switch: flip `current` and restart; the guard timer that puts the last good release back
unless the deploy is confirmed in time."""
from __future__ import annotations

import shlex

from opsctl.config import HostConfig
from opsctl.errors import HostError
from opsctl.host import facts
from opsctl.host.connection import Connection


def host_epoch(conn: Connection) -> int:
    return facts.get(conn, facts.HostTime())


def guard_unit(host: HostConfig) -> str:
    return f"opsctl-guard-{host.service_name}"


GUARD_PROGRAM = "opsctl-guard"   # playbooks/files/opsctl-guard, installed in <root>/bin by every stage
SWITCH_ROOM = 16 << 20          # bytes a switch needs free under the install root: its links and the ledger
                                # records that follow it (the same number in playbooks/files/opsctl-switch)


def arm_guard(conn: Connection, host: HostConfig, fallbacks: str | list[str], seconds: int,
              expect: str | None = None) -> None:
    """A transient timer on the host that puts the first of `fallbacks` that becomes ready back
    unless disarmed (`<root>/bin/opsctl-guard`: it records `rollback ok` only once the release
    it switched to is ready, else `rollback failed`, and tries the next, issue #32 item 5)."""
    unit = guard_unit(host)
    root = host.install_root
    targets = [fallbacks] if isinstance(fallbacks, str) else [f for f in fallbacks if f]
    # it takes the host's deploy lock first (waits up to 15 min): a guard never switches inside
    # another deploy (that deploy stops it, or re-arms its own); it acts only if `expect` is
    # still live, and records itself under the inventory's host name
    argv = [str(host.host_python), f"{root}/bin/{GUARD_PROGRAM}", "--root", str(root), "--service",
            host.service_name, "--host", host.name, "--port", str(host.http_port), "--min-free", str(SWITCH_ROOM),
            "--expect", expect or "", "--", *targets]
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; systemctl reset-failed {unit}.timer "
             f"{unit}.service >/dev/null 2>&1; systemd-run --quiet --unit {unit} --on-active={seconds}s "
             f"--timer-property=AccuracySec=1s flock -w 900 {shlex.quote(f'{root}/.lock')} "
             + " ".join(shlex.quote(a) for a in argv), check=True)


def require_room(conn: Connection, host: HostConfig, need: int = SWITCH_ROOM, doing: str = "a switch") -> None:
    """Refuse before anything changes when the install root cannot take a switch and the ledger
    records after it: a switch whose record then fails leaves the live release and the ledger
    disagreeing (issue #32 item 7)."""
    root = host.install_root
    free = facts.get(conn, facts.DiskFree(str(root)))
    if free is None or free >= need:
        return  # (no df on the host: the pre-checks report disk space)
    raise HostError(f"{host.name}: {free / 2**20:.1f} MiB free under {root}, {doing} needs {need / 2**20:.0f} MiB "
                    f"(the switch and its ledger records); nothing was switched or recorded",
                    f"free space under {root} on the host (old releases under {root}/releases: 'opsctl status' "
                    f"names the live one), then run the same command again")


def disarm_guard(conn: Connection, host: HostConfig) -> None:
    unit = guard_unit(host)
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; "
             f"systemctl reset-failed {unit}.timer {unit}.service >/dev/null 2>&1; true", check=False)


def switch(conn: Connection, host: HostConfig, release: str) -> int:
    """Flip current to `release` and restart; returns the host's epoch just before. Refused
    (HostError, nothing changed) when the install root has no room for it (require_room)."""
    require_room(conn, host)
    since = host_epoch(conn)
    conn.run(f"{host.install_root}/bin/opsctl-switch {host.install_root} {host.service_name} {shlex.quote(release)}")
    return since


def stop_service(conn: Connection, host: HostConfig) -> None:
    """The host served nothing before this deploy: leave it that way."""
    conn.run(f"systemctl disable --now {host.unit_name} >/dev/null 2>&1; rm -f /etc/systemd/system/{host.unit_name} "
             f"{host.install_root}/current; systemctl daemon-reload; systemctl reset-failed {host.unit_name} "
             f">/dev/null 2>&1; true", check=False)

