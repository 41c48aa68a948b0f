"""What each host check means and how to fix a failure (shown by `opsctl check`, docs/checks.md)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckInfo:
    name: str
    group: str  # pre | post
    title: str
    fix: str


_PRE = [
    ("ssh_reachable", "SSH to the host works with the inventory's address, user, key and host key",
     "check ansible_host/ansible_user/ansible_ssh_private_key_file and known_hosts in the inventory; "
     "for the lab run 'opsctl lab up'"),
    ("gpu_count", "nvidia-smi sees as many GPUs as the inventory's opsctl.gpu.count",
     "a GPU fell off the bus or the driver is not loaded: check 'nvidia-smi' and dmesg on the host, "
     "or fix opsctl.gpu.count"),
    ("gpu_model", "every GPU is the inventory's opsctl.gpu.model (and memory_mib when set)",
     "fix opsctl.gpu.model/memory_mib in the inventory, or point the inventory at the right host"),
    ("gpu_driver", "the NVIDIA driver version is within opsctl.gpu.driver_min..driver_max",
     "install a supported driver, or widen driver_min/driver_max once that driver is validated"),
    ("gpu_no_leftover_processes", "no GPU compute process is running that our own service does not own",
     "a crashed server still holds GPU memory: find it with 'nvidia-smi --query-compute-apps=pid,"
     "process_name,used_memory --format=csv' and stop it (kill PID)"),
    ("gpu_free_memory", "each GPU has at least opsctl.gpu.min_free_mib free, not counting our own service",
     "free the GPUs (stop whatever else runs on them: 'nvidia-smi'), or lower opsctl.gpu.min_free_mib"),
    ("disk_space", "the filesystem under the install root has at least opsctl.min_free_disk_gib free",
     "free space under the install root (old releases: 'opsctl history', keep_releases; caches in "
     "<root>/shared/cache), or grow the filesystem"),
    ("model_path", "the target model directory exists, is readable (by the service user) and has config.json",
     "mount/copy the model to opsctl.model.path on the host, or fix the path in the inventory"),
    ("cuda_toolkit", "the CUDA toolkit SGLang's JIT needs is present (nvcc)",
     "install the CUDA toolkit on the host (nvcc under /usr/local/cuda/bin)"),
    ("service_port", "the service's HTTP port is free, or held by our own service",
     "another process listens on the port: find it with 'ss -ltnp sport = :PORT' and stop it, "
     "or change opsctl.http_port"),
    ("time_sync", "the host's clock is synchronized (NTP) or, in a container, agrees with the controller",
     "enable time sync on the host: 'timedatectl set-ntp true' (systemd-timesyncd) or chrony"),
]

_POST = [
    ("unit_active", "the service unit is active (running)",
     "see why it stopped: 'journalctl -u UNIT -n 100'; restart it with 'systemctl restart UNIT' or "
     "'opsctl rollback'"),
    ("unit_enabled", "the service unit is enabled (starts at boot)",
     "'systemctl enable UNIT' (a deploy does this)"),
    ("unit_no_restarts", "the unit has not restarted since the release started (NRestarts == 0)",
     "the server crashed and systemd restarted it: read 'journalctl -u UNIT', then redeploy or roll back"),
    ("unit_file_matches_render", "the unit file on disk is exactly what opsctl renders for the live release",
     "someone edited the unit on the host: put the change in the inventory/profile and redeploy "
     "('opsctl deploy ...'), which rewrites it"),
    ("current_matches_ledger", "<root>/current points at the release the ledger recorded last",
     "a switch happened outside opsctl or a deploy was interrupted: 'opsctl status', then "
     "'opsctl rollback --to RELEASE' to make it consistent"),
    ("drafter_checksums", "the live release's drafter weights match their manifest's sizes and sha256",
     "the weights on the host were changed or truncated: remove <root>/shared/drafters/DIGEST and redeploy "
     "(the drafter is sent again)"),
    ("release_files_checksums", "the live release's rendered files and runtime tree (site/) match the sha256 in "
     "its manifest, and site/ holds no other file",
     "a file of the release was edited on the host: redeploy its profile ('opsctl deploy ...' stages it again and "
     "restarts it), or 'opsctl rollback' to another release"),
    ("port_listening", "the service listens on its HTTP port (and the listener is the service)",
     "the server is not up yet or failed: 'journalctl -u UNIT'"),
    ("health_generate", "GET /health_generate on the host answers 200",
     "the server is up but cannot generate: 'journalctl -u UNIT', then roll back"),
    ("journal_ready", "this start of the unit logged SGLang's ready line",
     "the server never finished starting: 'journalctl -u UNIT', or 'opsctl validate'"),
    ("journal_no_capture_failure", "this start of the unit logged no 'Capture cuda graph failed'",
     "CUDA-graph capture failed (usually memory: mem_fraction_static, cuda_graph_max_bs): "
     "'opsctl validate' shows the details; roll back"),
    ("ddtree_serves_what_the_release_means", "the DDTree candidate the runtime serves (its /server_info) is the "
     "live release's budget or schedule (a trial release: the candidate its ledger records)",
     "a control file names another candidate, or the runtime refused one ('DDTree control refused' in "
     "'journalctl -u UNIT'): 'opsctl tune --apply' or a deploy sets what serves; 'opsctl status' names it"),
]

CHECKS: dict[str, CheckInfo] = {
    **{n: CheckInfo(n, "pre", t, f) for n, t, f in _PRE},
    **{n: CheckInfo(n, "post", t, f) for n, t, f in _POST},
}


def names(group: str) -> list[str]:
    return [c.name for c in CHECKS.values() if group in ("all", c.group)]


def fix_for(name: str, unit: str | None = None, port: int | None = None) -> str:
    info = CHECKS.get(name)
    if info is None:
        return ""
    text = info.fix
    if unit:
        text = text.replace("UNIT", unit)
    if port:
        text = text.replace("PORT", str(port))
    return text
