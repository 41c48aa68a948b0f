"""The host-side watch, seen from the controller.

The watch itself is `opsctl/onhost/watch_agent.py` (stdlib only, in the host-side archive
`<root>/bin/opsctl-onhost.pyz` every deploy stages, run by its own unit
`opsctl-watch-<service>.service`). This module renders what a deploy installs for it
(configuration JSON with each profile's analysis, unit file, playbook variables) from the
inventory, and reads / pauses / resumes it over a Connection. It never imports typer or rich.
"""
from __future__ import annotations

import json
import shlex
from pathlib import PurePosixPath
from typing import Any

from opsctl.config import DRAIN_DEADLINE_DEFAULT_S, BUILTIN_PROFILES, HostConfig, Inventory, profile_names, resolve_profile
from opsctl.errors import ConfigError, HostError
from opsctl.host.connection import Connection, connect

from opsctl.onhost import ARCHIVE_NAME
from opsctl.onhost import watch_agent as agent

STATE_DIR = PurePosixPath("/var/lib/opsctl-watch")
EVENT_SCHEMA = agent.EVENT_SCHEMA


def unit_name(host: HostConfig) -> str:
    return f"opsctl-watch-{host.service_name}.service"


def config_path(host: HostConfig) -> PurePosixPath:
    return host.install_root / "watch.json"


def program_path(host: HostConfig) -> PurePosixPath:
    return host.install_root / "bin" / ARCHIVE_NAME


def analysis_specs(host: HostConfig) -> dict[str, dict]:
    """The analysis of every profile the inventory knows (HostConfig.analysis), by name, as the
    host-side programs read it (the watch's and the metrics file's configuration)."""
    specs = {}
    for name in profile_names(host.settings.profiles):
        data = {**BUILTIN_PROFILES.get(name, {}), **host.settings.profiles.get(name, {})}
        # a ddtree profile without its own budget: any valid one stands in (the rules do not depend on it)
        prof = resolve_profile(name, 16 if data.get("kind") == "ddtree" and "budget" not in data
                               and "budget_schedule" not in data else None,
                               overrides=host.settings.profiles)
        specs[name] = host.analysis(prof).to_dict()
    return specs


def host_config(host: HostConfig) -> dict[str, Any]:
    """The watch's configuration as the host reads it (pure): with the analysis of every known
    profile, the spec its gate judges by (HostConfig.analysis), which the watch fits to the live
    release's manifest."""
    w = host.settings.watch
    policy = host.gate_policy()
    specs = analysis_specs(host)
    baseline = host.profile(host.baseline_profile)
    from opsctl.gate.baseline import baseline_paths  # the one name of the stored baseline bench (the gate's)

    return {
        "version": 1, "host": host.name, "service": host.service_name, "unit": host.unit_name,
        "root": str(host.install_root), "port": host.http_port, "state_dir": str(STATE_DIR),
        "mode": w.mode, "interval_s": w.interval_s, "window_s": w.window_s, "min_samples": w.min_samples,
        "scrape_timeout_s": w.scrape_timeout_s, "baseline_profile": host.baseline_profile,
        "model": host.model.name, "ready_timeout_s": baseline.readiness_timeout_s,
        "baseline_bench": baseline_paths(host, host.baseline_profile, policy)[0],
        "notify": w.notify.model_dump(mode="json"), "analysis": specs,
        "default_analysis": host.analysis(None).to_dict(),   # a profile the inventory does not name
        # the drain before the watch's switch (issue #35): the configured deadline (else the default), but
        # at most the watch's window: the release has been breaching for that long already, and with no
        # balancer hook on the host new requests keep coming (0.5.23 admits while it drains)
        "drain_deadline_s": min(host.settings.drain.deadline_s or DRAIN_DEADLINE_DEFAULT_S, w.window_s)
        if host.settings.drain.enabled else 0,
        "drain_poll_s": host.settings.drain.poll_s,
    }


def unit_text(host: HostConfig) -> str:
    from opsctl.render import _environment  # the one template environment (StrictUndefined)

    return _environment().get_template("opsctl-watch.service.j2").render(
        service_unit=host.unit_name, unit=unit_name(host), host_python=host.host_python,
        program=program_path(host), config=config_path(host))


def playbook_vars(host: HostConfig) -> dict[str, Any]:
    """Extra variables of prepare.yml: the watch is (re)installed, or removed, by every deploy."""
    w = host.settings.watch
    return {"opsctl_watch_enabled": w.enabled, "opsctl_watch_unit": unit_name(host),
            "opsctl_watch_unit_text": unit_text(host) if w.enabled else "",
            "opsctl_watch_config_path": str(config_path(host)),
            "opsctl_watch_config": json.dumps(host_config(host), indent=1, sort_keys=True) + "\n" if w.enabled else ""}


# --------------------------------------------------------------------------- reading and steering it


def _agent(conn: Connection, host: HostConfig, command: str, *args: str) -> dict | None:
    cfg = config_path(host)
    # no archive: a host an older opsctl staged (its watch was a single file), not installed as this one runs it
    cmd = (f"test -f {cfg} && test -f {program_path(host)} || {{ echo NOT-INSTALLED; exit 0; }}; "
           f"{host.host_python} {program_path(host)} watch --config {cfg} {command} "
           + " ".join(shlex.quote(a) for a in args))
    res = conn.run(cmd, check=False, timeout=60)
    out = res.stdout.strip()
    if out == "NOT-INSTALLED":
        return None
    if not res.ok:
        raise HostError(f"opsctl-watch {command} on {host.name} failed (exit {res.rc}): "
                        f"{(res.stderr.strip() or out).splitlines()[-1:] or ['']}"[:300],
                        f"check 'systemctl status {unit_name(host)}' on the host")
    try:
        rep = json.loads(out.splitlines()[-1])
    except (ValueError, IndexError):
        raise HostError(f"opsctl-watch {command} on {host.name} printed no JSON",
                        "redeploy to reinstall the watch program") from None
    shown = rep.get("config") if isinstance(rep, dict) else None
    if isinstance(shown, dict) and shown.get("notify"):  # an older agent printed its notify URL whole
        shown["notify"] = agent.redacted_notify(shown["notify"])
    return rep


def brief(conn: Connection, host: HostConfig) -> dict:
    """The watch's state in one word plus a few numbers (for `opsctl status`)."""
    rep = _agent(conn, host, "status")
    if rep is None:
        return {"state": "not installed" if host.settings.watch.enabled else "off"}
    return summary(rep)


def summary(rep: dict) -> dict:
    unit = rep.get("unit") or {}
    last = rep.get("last") or {}
    if unit.get("ActiveState") not in ("active", "activating", "reloading"):
        state = f"down ({unit.get('ActiveState') or 'no unit'})"
    elif rep.get("failing"):
        state = "failing"   # its ticks fail: the last state it saved is not what it sees now
    else:
        state = last.get("state") or "starting"
    tripped = rep.get("tripped") or None
    return {"state": state, "mode": (rep.get("config") or {}).get("mode"), "verdict": last.get("verdict"),
            "paused": bool(rep.get("paused")), "tripped": tripped and {k: tripped.get(k) for k in
                                                                       ("kind", "release", "to_release", "reason", "ts")},
            "release": last.get("release")}


def status(inv: Inventory, limit: str | None = None) -> list[dict]:
    out = []
    for host in inv.select(limit):
        conn = connect(host)
        try:
            rep = _agent(conn, host, "status")
        finally:
            conn.close()
        if rep is None:
            out.append({"host": host.name, "installed": False, "enabled": host.settings.watch.enabled})
            continue
        out.append({"host": host.name, "installed": True, "enabled": host.settings.watch.enabled,
                    "summary": summary(rep), **rep})
    return out


def set_paused(inv: Inventory, paused: bool, *, limit: str | None = None, reason: str | None = None) -> list[dict]:
    from opsctl.ledger import who

    out = []
    for host in inv.select(limit):
        conn = connect(host)
        try:
            rec = _agent(conn, host, "pause" if paused else "resume", "--who", who(),
                         "--reason", reason or ("paused" if paused else "resumed"))
        finally:
            conn.close()
        if rec is None:
            raise ConfigError(f"no watch is installed on {host.name}",
                              "set opsctl.watch.enabled: true in the inventory and deploy")
        out.append(rec)
    return out
