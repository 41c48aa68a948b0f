#!/usr/bin/env python3
"""Deploy timings and drafter transfer rate on the lab host, in one run.

Prints a table: wall time of a fresh deploy, a no-change re-deploy and a rollback
(gates off, so the numbers are the deploy machinery's), and the transfer of a
2 GiB drafter by opsctl's content sync against a plain `scp` of the same file.

    .venv/bin/opsctl lab up && .venv/bin/python benchmarks/deploy_lab.py [--size-mib 2048]

Needs root and the lab; it leaves the lab up and removes what it wrote there.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from opsctl.artifacts import drafter_manifest, ssh_command, sync_drafter  # noqa: E402
from opsctl.config import load_inventory  # noqa: E402
from opsctl.host.connection import connect  # noqa: E402


def timed(label: str, fn, rows: list) -> object:
    t0 = time.monotonic()
    out = fn()
    rows.append((label, time.monotonic() - t0))
    return out


def opsctl(*args: str) -> None:
    subprocess.run([str(REPO / ".venv/bin/opsctl"), *args, "-i", "inventories/lab"], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--skip-deploy", action="store_true")
    a = ap.parse_args()
    inv = load_inventory(REPO / "inventories/lab")
    host = inv.hosts["lab"]
    rows: list[tuple[str, float]] = []
    if not a.skip_deploy:
        conn = connect(host)
        conn.run(f"systemctl stop {host.unit_name} 2>/dev/null; rm -rf {host.install_root} "
                 f"/etc/systemd/system/{host.unit_name}; systemctl daemon-reload", check=False)
        conn.close()
        timed("fresh deploy ar-tp8 (empty host)", lambda: opsctl("deploy", "ar-tp8", "--yes", "--no-gate", "--skip-checks"), rows)
        timed("fresh deploy ddtree --budget 16", lambda: opsctl("deploy", "ddtree", "--budget", "16", "--yes", "--no-gate", "--skip-checks"), rows)
        timed("no-change re-deploy ddtree --budget 16", lambda: opsctl("deploy", "ddtree", "--budget", "16", "--yes", "--no-gate", "--skip-checks"), rows)
        timed("rollback (to ar-tp8)", lambda: opsctl("rollback"), rows)

    src = Path(tempfile.mkdtemp(prefix="opsctl-bench-drafter-"))
    try:
        (src / "config.json").write_text('{"block_size": 8}\n')
        with (src / "model.safetensors").open("wb") as f:
            chunk = os.urandom(16 << 20)
            for i in range(a.size_mib // 16):
                f.write(chunk[:-8] + i.to_bytes(8, "little"))  # distinct chunks: no dedup shortcuts
        size = (src / "model.safetensors").stat().st_size
        manifest = timed("hash drafter (local sha256 manifest)", lambda: drafter_manifest(src), rows)
        conn = connect(host)
        res = timed(f"opsctl drafter sync, {size >> 20} MiB, fresh", lambda: sync_drafter(conn, host, src, manifest), rows)
        rate_sync = size / rows[-1][1] / 2**20
        timed("opsctl drafter sync again (0 bytes expected)", lambda: sync_drafter(conn, host, src, manifest), rows)
        again = sync_drafter(conn, host, src, manifest)
        ssh = ssh_command(host)
        scp = ["scp", "-q", *[x for x in ssh[1:] if x != "-p" and x != str(host.ssh.port)], "-P", str(host.ssh.port),
               str(src / "model.safetensors"), f"{host.ssh.user}@{host.ssh.address}:/tmp/opsctl-scp-bench"]
        timed(f"plain scp, {size >> 20} MiB", lambda: subprocess.run(scp, check=True), rows)
        rate_scp = size / rows[-1][1] / 2**20
        conn.run(f"rm -rf /tmp/opsctl-scp-bench {host.install_root}/shared/drafters/{manifest.digest}", check=False)
        conn.close()
    finally:
        shutil.rmtree(src, ignore_errors=True)
    print(f"\n{'step':<48} {'wall s':>8}")
    for label, secs in rows:
        print(f"{label:<48} {secs:8.2f}")
    wire = size / max(1e-9, res.duration_s - res.verify_s) / 2**20
    print(f"\ndrafter transfer: opsctl sync {rate_sync:.0f} MiB/s end to end (incl. {res.verify_s:.1f} s sha256 "
          f"verification on the host), {wire:.0f} MiB/s on the wire, vs plain scp {rate_scp:.0f} MiB/s; "
          f"first sync sent {res.bytes_sent:,} bytes, re-sync sent {again.bytes_sent:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
