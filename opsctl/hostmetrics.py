"""opsctl's host-side metrics, seen from the controller: the configuration a deploy ships as
`<root>/metrics.json` (pure), read on the host by `opsctl/onhost/metrics.py` (the ledger appender
and the watch write the node_exporter textfile it names; docs/metrics.md)."""
from __future__ import annotations

import json
from typing import Any

from opsctl.config import HostConfig
from opsctl.watch import analysis_specs, config_path


def host_config(host: HostConfig) -> dict[str, Any]:
    """What the host-side metrics writer reads: where the file goes (`opsctl.metrics.textfile`,
    None: no file), the guard's unit, the watch's configuration, and each profile's analysis (the
    accept-length floor of the live release is its profile's, fitted to its manifest)."""
    textfile = host.settings.metrics.textfile
    return {
        "version": 1, "host": host.name, "service": host.service_name, "root": str(host.install_root),
        "textfile": str(textfile) if textfile else None,
        # opsctl.flow.switch.guard_unit's name (the flow is above this module; a test holds them equal)
        "guard_unit": f"opsctl-guard-{host.service_name}",
        "watch_config": str(config_path(host)),   # its state_dir and service name the state file
        "analysis": analysis_specs(host), "default_analysis": host.analysis(None).to_dict(),
    }


def config_text(host: HostConfig) -> str:
    return json.dumps(host_config(host), indent=1, sort_keys=True) + "\n"
