"""Start-up phases and the Triton cache on the lab host (issue #36), the CLI as a user runs it.

One sequence on one host: a ddtree deploy prints each phase of its start, with the runtime's
Triton compile when the host's cache lacks the budget (and the stage says so before the switch);
`opsctl runtime build --triton-arch sm_120` compiles the cache on the controller (real Triton from
.venv-sglang, no GPU); the next deploy's stage ships it and that start has no compile phase; a
start 30 % slower than the last start of the same profile is the `startup.slower` warning (the
deploy still succeeds). The controller's cache is the test's own (`OPSCTL_CACHE_DIR`): other tests
never see the compiled cache."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from labtools import Ops

REPO = Path(__file__).resolve().parents[2]
SGLANG_PY = REPO / ".venv-sglang" / "bin" / "python"
HOST_CACHE = "/opt/opsctl/shared/cache/triton"
FAST = ("--yes", "--no-gate", "--skip-checks")

pytestmark = pytest.mark.lab


@pytest.fixture
def served(baselined, lab_host):
    """The judged ar-tp8 baseline live and no Triton cache on the host (restored after the test)."""
    baselined.restore(lab_host)
    lab_host.run(f"rm -rf {HOST_CACHE}/*", check=False)
    yield baselined
    lab_host.clear_faults()
    lab_host.run(f"rm -rf {HOST_CACHE}/*", check=False)
    baselined.restore(lab_host)


def _phases(outcome: dict) -> list[str]:
    return [p["phase"] for p in (outcome.get("startup") or {}).get("phases") or []]


def test_phases_a_controller_built_cache_and_a_slower_start(served, lab_host, tmp_path):
    assert SGLANG_PY.is_file(), "scripts/test builds .venv-sglang before the lab tier"
    ops = Ops(served.inventory_dir)
    env = {"OPSCTL_CACHE_DIR": str(tmp_path / "controller-cache")}

    # 1. no cache anywhere: the stage names what the first start compiles; the start prints it
    p = ops("deploy", "ddtree", "--budget", "16", *FAST, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no Triton cache for sm_120 on lab: the first start compiles 1 specialisation(s)" in p.stdout
    assert "opsctl runtime build --triton-arch sm_120" in p.stdout
    block = [line for line in p.stdout.splitlines() if "start-up " in line and " at the site (" in line]
    assert block, p.stdout
    for phase in ("weight load ", "target verify graphs b16 (bs 1-", "draft decode graphs (bs 1-",
                  "Triton compile b16 ", "warm-up "):
        assert phase in block[0], block[0]
    assert "in the lab x time scale 500, first line to ready), ddtree-b16:" in block[0]

    # 2. the cache built on the controller for the lab's GPUs (compute capability 12.0), no GPU here
    dist = tmp_path / "dist"
    p = ops("runtime", "build", "--triton-arch", "sm_120", "--budgets", "16", "--vocab-size", "163840",
            "--hidden", "7168", "--python", str(SGLANG_PY), "--out", str(dist), "--json", env=env, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    built = [d for d in dist.iterdir() if d.name.startswith("triton-sm_120-")]
    assert len(built) == 1
    manifest = json.loads((built[0] / "opsctl-triton-manifest.json").read_text())
    assert {"budget": 16, "block": 8, "vocab_shard": 20480, "arch": "sm_120"} in manifest["specialisations"]

    # 3. away and back, the host's cache emptied: the stage ships the built cache, no compile at start
    assert ops("rollback", "--to", "baseline", env=env).returncode == 0
    lab_host.run(f"rm -rf {HOST_CACHE}/*", check=True)
    rc, out, err = ops.json("deploy", "ddtree", "--budget", "16", *FAST, env=env)
    assert rc == 0, err
    shipped = out["outcomes"][0]
    assert shipped["triton"]["state"] == "shipped", shipped["triton"]
    phases = _phases(shipped)
    assert "weight_load" in phases and not [k for k in phases if k.startswith("compile")], phases
    on_host = json.loads(lab_host.run(f"cat {HOST_CACHE}/*/opsctl-triton-manifest.json", check=True).stdout)
    assert on_host["specialisations"] == manifest["specialisations"]

    # 4. the same release again under a weight load 500 s slower at the site's scale: a warning
    assert ops("rollback", "--to", "baseline", env=env).returncode == 0
    with lab_host.fault("slow_start", load_s=1, algorithm="DDTREE"):
        rc, out, err = ops.json("deploy", "ddtree", "--budget", "16", *FAST, env=env)
    assert rc == 0, err
    slow = out["outcomes"][0]
    assert slow["triton"]["state"] == "complete" and slow["release"] == shipped["release"]
    cmp = slow["startup"]["slower"]
    assert cmp["slower"] is True and cmp["ratio"] >= 1.3 and cmp["phase"] == "weight_load", cmp
    assert cmp["finding"]["severity"] == "warning" and cmp["finding"]["check"] == "startup.slower"
    hist = ops("history", env=env)
    assert hist.returncode == 0 and " SLOWER" in hist.stdout
    st = json.loads(ops("status", "--json", env=env).stdout.strip().splitlines()[-1])
    assert st[0]["last_start"]["total_s"] == pytest.approx(slow["startup"]["total_s"], rel=0.01)
