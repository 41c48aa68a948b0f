"""SGLang's CUDA-graph capture list, asked of SGLang itself (issue #53): opsctl's copy
(opsctl/onhost/capture.py), the lab emulator's and the runtime's are held to the function in the
real SGLang 0.5.23 wheel (.venv-sglang), not only to each other.

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


def sglang_function(relpath: str, name: str, namespace: dict):
    """`name` as SGLang 0.5.23's source defines it, compiled alone in `namespace`."""
    path = SITE[0] / relpath
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    mod = ast.Module(body=[node], type_ignores=[])
    exec(compile(mod, str(path), "exec"), namespace)
    return namespace[name]


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
