"""switch: flip `current` and restart; the guard timer that puts the last good release back
unless the deploy is confirmed in time."""
from __future__ import annotations

import shlex

from opsctl.config import HostConfig
from opsctl.host import facts
from opsctl.host.connection import Connection


def host_epoch(conn: Connection) -> int:
    return facts.get(conn, facts.HostTime())


def guard_unit(host: HostConfig) -> str:
    return f"opsctl-guard-{host.service_name}"


def arm_guard(conn: Connection, host: HostConfig, previous: str, seconds: int, expect: str | None = None) -> None:
    """A transient timer on the host that switches back to `previous` unless disarmed."""
    unit = guard_unit(host)
    root = host.install_root
    # it takes the host's deploy lock first (waits up to 15 min): a guard never switches inside
    # another deploy (that deploy stops it, or re-arms its own); it acts only if `expect` is
    # still live, and records itself under the inventory's host name
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; systemctl reset-failed {unit}.timer "
             f"{unit}.service >/dev/null 2>&1; systemd-run --quiet --unit {unit} --on-active={seconds}s "
             f"--timer-property=AccuracySec=1s flock -w 900 {root}/.lock {root}/bin/opsctl-switch {root} "
             f"{host.service_name} {shlex.quote(previous)} guard-timeout {shlex.quote(host.name)} "
             f"{shlex.quote(expect or '')}", check=True)


def disarm_guard(conn: Connection, host: HostConfig) -> None:
    unit = guard_unit(host)
    conn.run(f"systemctl stop {unit}.timer {unit}.service >/dev/null 2>&1; "
             f"systemctl reset-failed {unit}.timer {unit}.service >/dev/null 2>&1; true", check=False)


def switch(conn: Connection, host: HostConfig, release: str) -> int:
    """Flip current to `release` and restart; returns the host's epoch just before."""
    since = host_epoch(conn)
    conn.run(f"{host.install_root}/bin/opsctl-switch {host.install_root} {host.service_name} {shlex.quote(release)}")
    return since


def stop_service(conn: Connection, host: HostConfig) -> None:
    """The host served nothing before this deploy: leave it that way."""
    conn.run(f"systemctl disable --now {host.unit_name} >/dev/null 2>&1; rm -f /etc/systemd/system/{host.unit_name} "
             f"{host.install_root}/current; systemctl daemon-reload; systemctl reset-failed {host.unit_name} "
             f">/dev/null 2>&1; true", check=False)

