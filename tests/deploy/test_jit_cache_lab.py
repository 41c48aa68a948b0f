"""The JIT caches across releases, end to end on the lab (issue #51): the first start with empty
caches builds FlashInfer's and SGLang's JIT kernels in its warm-up (a `jit` phase, FlashInfer's own
`Building JIT module` lines); `opsctl status` then says the next start finds them warm; a second
deploy (another release: another budget) starts with no JIT phase and a warm-up of seconds."""
from __future__ import annotations

import json

import pytest
from labtools import ledger

pytestmark = pytest.mark.lab

CACHES = "/opt/opsctl/shared/cache/sglang /opt/opsctl/shared/cache/sglang-jit"
FAST = ("--yes", "--no-gate", "--skip-checks")


def _start_of(lab, release: str) -> dict:
    recs = [r for r in ledger(lab) if r.get("action") == "switch" and r.get("to_release") == release]
    assert recs, release
    return {p["phase"]: p for p in recs[-1]["startup"]["phases"]}


def _built_lines(lab, since: str) -> list[str]:
    return [line for line in lab.run(f"journalctl -u sglang-k26 -o cat --no-pager --since '{since}'").stdout
            .splitlines() if "flashinfer.jit: Building JIT module" in line]


def test_a_second_deploy_with_warm_jit_caches_has_no_jit_phase(clean_lab, baselined, ops):
    baselined.restore(clean_lab)
    env = clean_lab.run("cat /opt/opsctl/current/sglang.env").stdout
    assert "SGLANG_CACHE_DIR=/opt/opsctl/shared/cache/sglang" in env
    clean_lab.run(f"rm -rf {CACHES}")
    rc, st, err = ops.json("status")
    assert rc == 0, err[-2000:]
    assert st[0]["jit_cache"]["warm"] is False and st[0]["jit_cache"]["why"].startswith("empty")

    t1 = clean_lab.run("date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    rc, out, err = ops.json("deploy", "ddtree", "--budget", "16", *FAST)
    assert rc == 0, err[-3000:]
    first = out["outcomes"][0]["release"]
    phases = _start_of(clean_lab, first)
    assert phases["jit"]["seconds"] == pytest.approx(150.0, abs=0.5)
    assert len(phases["jit"]["flashinfer_modules"]) == 3
    assert len(_built_lines(clean_lab, t1)) == 3
    human = ops("status")
    assert "JIT caches for the next start: warm" in human.stdout + human.stderr, human.stdout[-2000:]
    rc, st, _ = ops.json("status")
    cache = st[0]["jit_cache"]
    assert cache["warm"] is True and sum(len(v) for v in cache["flashinfer"].values()) == 3
    assert cache["sglang_jit"] == 2

    t2 = clean_lab.run("date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    rc, out, err = ops.json("deploy", "ddtree", "--budget", "8", *FAST)
    assert rc == 0, err[-3000:]
    second = out["outcomes"][0]["release"]
    assert second != first
    phases = _start_of(clean_lab, second)
    assert "jit" not in phases, json.dumps(phases)[:2000]
    assert phases["warmup"]["seconds"] <= 15.0          # the request and MoonViT's trace, no builds
    assert _built_lines(clean_lab, t2) == []
