"""gpu_decode.py's import-time stand-ins: top-level packages SGLang's own files
import at module level that the device image lacks become stub modules
(``_StubFinder``, last on ``sys.meta_path``); each is named in the report."""

from __future__ import annotations

import os
import sys
import types

import torch

from gd_common import on_cuda


# top-level packages a missing import of which must stay an ImportError (probed
# for availability; a stub would select their code paths)
_STUB_DENY = frozenset("""sgl_kernel_npu flashinfer deep_gemm deep_ep flash_attn flash_mla vllm aiter
triton_kernels xgrammar llguidance outlines torch_memory_saver cutlass quack tilelang humming mooncake nixl torch_npu
intel_extension_for_pytorch habana_frameworks mindspore ktransformers kt_kernel nvshmem cupy jax tensorrt_llm lmcache
hip sglang sglang_ddtree torch triton tvm_ffi transformers numpy IPython cuda pynvml fa3 sgl_flash_mla
flash_attn_interface decord torchao modelopt petit_kernel mamba_ssm causal_conv1d fla torchcodec av soundfile
librosa pyav cv2 timm torchvision torchaudio""".split()) - frozenset(
    os.environ.get("DDTREE_HARNESS_ALSO_STUB", "").replace(",", " ").split())  # the CPU dry run (--dry-cpu)
STUBBED = set()
_FINDER_OPEN = [True]


class _StubBase:
    """What a class deriving from a stubbed name derives from."""

    def __init_subclass__(cls, **kw):
        pass

    def __init__(self, *a, **k):
        pass

    def __class_getitem__(cls, item):
        return cls


class _StubAttr:
    """Any attribute of a stubbed module: attribute access, calls (decorators pass
    the function through), subclassing and iteration all succeed."""

    def __init__(self, name):
        self._n = name

    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return _StubAttr(f"{self._n}.{k}")

    def __call__(self, *a, **k):
        if self._n.startswith("sgl_kernel."):
            raise RuntimeError(f"{self._n} called: sgl_kernel is an import-time stub here (sglang-kernel is "
                               f"not carryable), so this path cannot run")
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return _StubAttr(self._n + "()")

    def __mro_entries__(self, bases):
        return (_StubBase,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class _StubModule(types.ModuleType):
    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return _StubAttr(f"{self.__name__}.{k}")


class _StubFinder:
    """Last on ``sys.meta_path`` while SGLang is imported: a top-level package
    that is not on the device and that the modules we run only import at module
    level (e.g. server / tokenizer / notebook dependencies) becomes a stub module;
    every stubbed name is reported."""

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        top = fullname.split(".")[0]
        if top in _STUB_DENY or top.startswith("_"):
            return None
        if top not in STUBBED and not _FINDER_OPEN[0]:
            return None  # after the import phase: only submodules of what was stubbed then
        if top not in STUBBED:  # only a module-level import in SGLang's own files (not others' optional ones)
            f = sys._getframe(1)
            while f is not None and f.f_code.co_filename.startswith("<frozen"):
                f = f.f_back
            if f is None or f"{os.sep}sglang{os.sep}" not in f.f_code.co_filename:
                return None
        STUBBED.add(top)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        if spec.name == "sgl_kernel.utils":  # read at import by the Triton backend (its PDL switch)
            m.is_arch_support_pdl = lambda: on_cuda() and torch.cuda.get_device_capability()[0] >= 9
        return m

    def exec_module(self, module):
        pass
