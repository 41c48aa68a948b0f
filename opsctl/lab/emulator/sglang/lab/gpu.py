"""Registry of emulated GPU compute processes, read by the lab's emulated nvidia-smi.

One JSON file per process in $OPSCTL_LAB_RUN_DIR/gpu-procs (default
/run/opsctl-lab/gpu-procs): {"pid", "name", "used_memory_mib", "gpus"}.
nvidia-smi lists only entries whose PID is alive.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def registry_dir() -> Path:
    return Path(os.environ.get("OPSCTL_LAB_RUN_DIR", "/run/opsctl-lab")) / "gpu-procs"


def register(pid: int, used_memory_mib: int, num_gpus: int, name: str | None = None) -> None:
    try:
        d = registry_dir()
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{pid}.json").write_text(json.dumps({
            "pid": pid, "name": name or os.path.basename(sys.executable) or "python3",
            "used_memory_mib": used_memory_mib, "gpus": list(range(min(max(num_gpus, 1), 8)))}))
    except OSError:
        pass


def unregister(pid: int) -> None:
    try:
        (registry_dir() / f"{pid}.json").unlink()
    except OSError:
        pass
