"""The shared JIT caches (issue #51): what `opsctl status` reads of them on the host (facts.JitCaches,
its command run on a cache laid out as SGLang 0.5.23 and FlashInfer 0.7.2 lay it out, here by the
lab emulator's own writer) and whether the next start finds them warm (startup.jit_outlook, from the
last ready start's `jit` phase)."""
from __future__ import annotations

import subprocess
import sys

from opsctl import startup
from opsctl.host import facts

sys.path.insert(0, "opsctl/lab/emulator")
from sglang.lab import startup as emu_startup  # noqa: E402


def _fill(root, environ):
    dirs = emu_startup.cache_dirs(environ)
    emu_startup.record_built([emu_startup.module_path(lib, name, dirs) for lib, name, _ in emu_startup.JIT_MODULES])
    emu_startup.record_built_inductor(environ)


def _read(root) -> dict:
    fact = facts.JitCaches(str(root))
    out = subprocess.run(["bash", "-c", fact.command()], capture_output=True, text=True, check=True).stdout
    return fact.process(out)


def _switch(release: str, jit_modules: list[str] | None) -> dict:
    phases = [{"phase": "weight_load", "seconds": 36.8, "source": "line"}]
    if jit_modules is not None:
        phases.append({"phase": "jit", "seconds": 150.0, "source": "lab", "flashinfer_modules": jit_modules})
    return {"action": "switch", "to_release": release, "ts": "2026-12-05T10:00:00Z",
            "startup": {"total_s": 300.0, "phases": phases}}


def test_status_reads_the_rendered_cache_dirs_and_calls_them_warm_after_a_ready_start(tmp_path):
    root = tmp_path / "opt"
    # the unit's environment as render.server_env writes it
    env = {"SGLANG_CACHE_DIR": str(root / "shared/cache/sglang"), "SGLANG_JIT_CACHE_DIR": str(root / "shared/cache/sglang-jit")}
    empty = _read(root)
    assert empty == {"flashinfer": {}, "sglang_jit": [], "inductor_files": 0}
    cold = startup.jit_outlook(empty, [], "/opt/opsctl/shared/cache")
    assert cold["warm"] is False and cold["why"].startswith("empty")

    _fill(root, env)
    got = _read(root)
    fi = sorted(n for lib, n, _ in emu_startup.JIT_MODULES if lib == "flashinfer")
    assert got["flashinfer"] == {"0.7.2/120": fi}
    assert got["sglang_jit"] == ["sm_120/moe_fused_gate", "sm_120/per_token_group_quant_8bit"]
    assert got["inductor_files"] == 1
    # the last ready start built them: warm
    warm = startup.jit_outlook(got, [_switch("ddtree-b16-aaa", fi)], "/c")
    assert warm["warm"] is True and "3 FlashInfer build(s) are there" in warm["why"]
    # a later start that found them built: still warm
    assert startup.jit_outlook(got, [_switch("a", fi), _switch("b", None)], "/c")["warm"] is True
    # one module the last start built is gone: cold, named
    (root / "shared/cache/sglang/.cache/flashinfer/0.7.2/120/cached_ops/sampling/sampling.so").unlink()
    gone = startup.jit_outlook(_read(root), [_switch("ddtree-b16-aaa", fi)], "/c")
    assert gone["warm"] is False and "sampling" in gone["why"]
    # modules there but no ready start on record: unknown, not warm
    assert startup.jit_outlook(_read(root), [], "/c")["warm"] is None
