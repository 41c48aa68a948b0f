"""Issue #50: the host-side drain guard's restart of the drained release is in the ledger. Its
script (opsctl.flow.switch.drain_guard_script) run with the host's commands stubbed: systemctl
records its call, bin/opsctl-ledger-append appends what it reads."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from opsctl.flow.switch import drain_guard_script


def test_the_drain_guard_restarts_the_drained_release_and_records_it(tmp_path):
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "releases" / "ar-tp8-abc").mkdir(parents=True)
    os.symlink("releases/ar-tp8-abc", root / "current")
    shim = tmp_path / "shim"
    shim.mkdir()
    calls = tmp_path / "calls"
    (shim / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (root / "bin" / "opsctl-ledger-append").write_text("#!/bin/sh\ncat >> \"$1\"\n")
    for p in (shim / "systemctl", root / "bin" / "opsctl-ledger-append"):
        p.chmod(0o755)
    host = SimpleNamespace(install_root=Path(root), name="blackwell", unit_name="sglang-k26.service")
    script = drain_guard_script(host, 30)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    subprocess.run(["/bin/sh", "-c", script], env=env, check=True, timeout=30)
    assert calls.read_text().split() == ["restart", "--no-block", "sglang-k26.service"]
    (rec,) = [json.loads(line) for line in (root / "ledger.jsonl").read_text().splitlines()]
    assert rec["action"] == "restart" and rec["result"] == "ok" and rec["release"] == "ar-tp8-abc"
    assert rec["who"] == "opsctl-drain-guard@blackwell" and rec["host"] == "blackwell" and rec["automatic"] is True
    assert "drain's deadline (30 s) + 15 s" in rec["reason"] and rec["ts"].endswith("Z")
    assert "to_release" not in rec   # not a switch: what served before serves again
