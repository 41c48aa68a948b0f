"""SGLang's rules, asked of SGLang itself (issue #53): the CUDA-graph capture list and the band
routing, as opsctl (opsctl/onhost/sglang_rules.py, the one definition, and its users capture.py and
schedule.py), the lab emulator and the runtime (their generated copies, each loaded from its own
file) compute them, are held to the functions in the real SGLang 0.5.23 wheel (.venv-sglang) for
every --cuda-graph-max-bs-decode a profile can render (1..1024: the profile's field has no upper
bound; 1024 is the runtime's largest budget and past every site's request pool), not only to each
other. An edit to any copy fails here (and in test_sglang_rules_copies.py, without the wheel).

The wheel's package cannot be imported without its GPU stack (sglang.srt.arg_groups pulls in
safetensors, torch kernels ...), so the test takes `generate_decode_cuda_graph_batch_sizes` and
`get_batch_sizes_to_capture`'s clamp out of the installed source files and runs them as written."""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from opsctl.onhost import capture

REPO = Path(__file__).resolve().parents[2]
SITE = sorted((REPO / ".venv-sglang" / "lib").glob("python3*/site-packages/sglang"))

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(not SITE, reason="no .venv-sglang: run scripts/sglang-venv")]

MAX_BS = [1, 2, 7, 8, 9, 16, 31, 32, 33, 48, 64, 65, 100, 256, 257, 272, 300, 512, 513]
EVERY_MAX_BS = range(1, 1025)


def sglang_function(relpath: str, name: str, namespace: dict):
    """`name` as SGLang 0.5.23's source defines it, compiled alone in `namespace`."""
    path = SITE[0] / relpath
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    mod = ast.Module(body=[node], type_ignores=[])
    exec(compile(mod, str(path), "exec"), namespace)
    return namespace[name]


def sglang_method(relpath: str, cls: str, name: str, namespace: dict):
    """A method of `cls` as SGLang 0.5.23's source defines it, compiled alone (self is any object)."""
    path = SITE[0] / relpath
    tree = ast.parse(path.read_text())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    node = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def load_file(name: str, path: Path):
    """A module from its file, under its own name (the copies are loaded as what they are)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sglang_generate():
    fn = sglang_function("srt/arg_groups/cuda_graph_hook.py", "generate_decode_cuda_graph_batch_sizes",
                         {"Any": object, "resolving_view": lambda server_args: server_args})

    def generate(max_bs: int, speculative: bool, disable_padding: bool) -> list[int]:
        args = SimpleNamespace(disable_cuda_graph_padding=disable_padding,
                               speculative_algorithm="DDTREE" if speculative else None)
        return fn(args, max_bs)

    return generate


@pytest.fixture(scope="module")
def rule_copies():
    """sglang_rules as opsctl has it and as each generated copy has it, each from its file."""
    from opsctl.onhost import sglang_rules
    return {"opsctl": sglang_rules, **{rel: load_file(f"_copy{i}", REPO / rel) for i, rel in enumerate(sglang_rules.COPIES)}}


def test_every_copy_of_the_list_is_sglangs_for_every_max_bs(sglang_generate, rule_copies):
    for max_bs in EVERY_MAX_BS:
        for speculative, disable in ((True, False), (False, False), (True, True)):
            want = sglang_generate(max_bs, speculative, disable)
            for where, rules in rule_copies.items():
                got = rules.decode_cuda_graph_batch_sizes(max_bs, speculative=speculative, disable_padding=disable)
                assert got == want, (where, max_bs, speculative, disable)


@pytest.fixture(scope="module")
def sglang_route():
    """AdaptiveSpeculativeParams._route's index: _pad_to_cuda_graph_bs then _find_closest_bs, run
    as SGLang's source writes them on a stand-in holding the slots' lower bounds and the graphs."""
    rel = "srt/speculative/adaptive_spec_params.py"
    ns = {"bisect": __import__("bisect")}
    pad = sglang_method(rel, "AdaptiveSpeculativeParams", "_pad_to_cuda_graph_bs", dict(ns))
    closest = sglang_method(rel, "AdaptiveSpeculativeParams", "_find_closest_bs", dict(ns))
    setter = sglang_method(rel, "AdaptiveSpeculativeParams", "set_cuda_graph_bs", dict(ns))

    def route(lows: list[int], batch: int, capture_bs: list[int] | None) -> int:
        me = SimpleNamespace(_bs_list=sorted(lows))
        setter(me, capture_bs)
        return lows.index(closest(me, pad(me, batch)))

    return route


def profile_schedules() -> list[str]:
    """Budget schedules a profile renders: the documented example, the inventories' own, and a
    spread of band bounds on and off the captured sizes."""
    from opsctl import schedule
    found = {schedule.EXAMPLE, "1:32", "1:16,64:0", "1:32,8:16,32:8,64:0", "1:8,2:4,3:0", "1:32,9:16,33:8,65:0",
             "1:64,100:32,300:0", "1:24,5:0,17:8"}
    for p in REPO.glob("inventories/**/*.yml"):
        for line in p.read_text().splitlines():
            if "budget_schedule:" in line:
                found.add(line.split(":", 1)[1].strip().strip("'\""))
    return sorted(t for t in found if t)


def test_every_copy_of_the_band_routing_is_sglangs(sglang_route, rule_copies):
    """Which band serves a running batch, by each of the four routers: opsctl's schedule, the host's
    capture.band_index, the runtime's BudgetSchedule and the emulator's Schedule (each on its copy)."""
    sys.path.insert(0, str(REPO / "opsctl" / "lab" / "emulator"))
    sys.path.insert(0, str(REPO / "runtime" / "src"))
    from opsctl import schedule as ops_schedule
    from opsctl.onhost import capture
    from sglang.lab import ddtree_runtime
    from sglang.lab import schedule as emu_schedule

    rt = ddtree_runtime.module("schedule")
    for text in profile_schedules():
        sched = ops_schedule.parse(text)
        lows = [b.min_bs for b in sched.bands]
        bands = [(b.min_bs, b.budget) for b in sched.bands]
        for max_bs in (1, 8, 16, 32, 33, 64, 100, 256, 300):
            for running in (None, 20):
                cs = capture.captured_batch_sizes(max_bs, running)
                for graphs in (cs, None):
                    rts = rt.BudgetSchedule([rt.Band(lo, b) for lo, b in bands])
                    rts.set_cuda_graph_bs(graphs)
                    emu = emu_schedule.Schedule(bands, graphs or [])
                    for batch in range(1, max(cs) + 20):
                        want = sglang_route(lows, batch, graphs)
                        where = (text, max_bs, running, graphs is not None, batch)
                        assert sched.band_index(batch, graphs) == want, ("opsctl.schedule",) + where
                        assert capture.band_index(bands, batch, graphs) == want, ("onhost.capture",) + where
                        assert rts.band_index(batch) == want, ("runtime",) + where
                        assert emu.index(batch) == want, ("emulator",) + where
                        for name, rules in rule_copies.items():
                            assert rules.route(lows, batch, graphs) == want, (name,) + where


@pytest.fixture(scope="module")
def sglang_decode_bs():
    fn = sglang_function("srt/arg_groups/cuda_graph_hook.py", "generate_decode_cuda_graph_batch_sizes",
                         {"Any": object, "resolving_view": lambda server_args: server_args})

    def speculative(max_bs: int) -> list[int]:
        return fn(SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm="DDTREE"), max_bs)

    return speculative


def test_opsctls_list_is_sglangs(sglang_decode_bs):
    for max_bs in MAX_BS:
        assert capture.speculative_decode_batch_sizes(max_bs) == sglang_decode_bs(max_bs), max_bs


def test_the_emulators_and_the_runtimes_lists_are_sglangs(sglang_decode_bs):
    sys.path.insert(0, str(REPO / "opsctl" / "lab" / "emulator"))
    sys.path.insert(0, str(REPO / "runtime" / "src"))
    from sglang.lab import ddtree_runtime
    from sglang.lab.main import _capture_bs

    rt = ddtree_runtime.module("schedule")   # the runtime's own module, loaded as the emulator loads it
    for max_bs in MAX_BS:
        want = sglang_decode_bs(max_bs)
        args = SimpleNamespace(cuda_graph_bs_decode=None, cuda_graph_max_bs_decode=max_bs, max_running_requests=None,
                               disable_cuda_graph_padding=False)
        assert _capture_bs(args, True) == want, max_bs
        assert rt.sglang_capture_bs(max_bs) == sorted(set(want)), max_bs


def test_the_clamp_to_max_running_requests_is_sglangs(sglang_decode_bs):
    """get_batch_sizes_to_capture: a list past the request pool gets the pool's size and is cut there
    (attention-TP alignment 1, as on the site's TP8 without DP attention)."""
    src = (SITE[0] / "srt/model_executor/runner/base_cuda_graph_runner.py").read_text()
    assert "capture_bs += [num_max_requests]" in src and "bs <= num_max_requests" in src
    for max_bs in MAX_BS:
        for running in (1, 5, 20, 64, 300):
            bs = list(sglang_decode_bs(max_bs))
            if max(bs) > running:        # SGLang's clamp, step by step as the source above does it
                bs += [running]
            bs = sorted(set(b for b in bs if b <= running))
            assert capture.captured_batch_sizes(max_bs, running) == bs, (max_bs, running)
