"""The DDTree runtime's own pure-Python modules, loaded from the installed runtime (the plugin).

The emulator models what the runtime's plugin does; where that is parsing and deciding (the
trial set's grammar and errors, the capture plan, the control file, the live switch), it runs
the runtime's code itself rather than a copy: `sglang_ddtree.trialset` (with the `config` and
`schedule` modules it imports) from the `sglang_ddtree` package that is installed beside the
emulator, as on a real host (the lab's wheelhouse ships the runtime wheel; tests put its source
on the path).

Those three modules are standard library only, but the package's `__init__` imports torch (the
tree builders), which the lab host does not have: the modules are loaded under a stand-in package
(`sglang.lab._sglang_ddtree`) whose path is the runtime package's directory, so their relative
imports (`from .schedule import ...`) resolve there and `sglang_ddtree/__init__.py` never runs.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types

RUNTIME_PACKAGE = "sglang_ddtree"
_ALIAS = "sglang.lab._sglang_ddtree"
PURE_MODULES = ("config", "schedule", "trialset")


def module(name: str):
    """`sglang_ddtree.<name>` (one of PURE_MODULES) from the installed runtime.
    ModuleNotFoundError when no runtime is installed (as importing the plugin would raise)."""
    if name not in PURE_MODULES:
        raise ValueError(f"{name}: the emulator loads only the runtime's pure modules {PURE_MODULES}")
    if _ALIAS not in sys.modules:
        # on sys.path, not sys.modules: finds the package without importing it (and past a
        # stand-in module of that name a test or a host may have registered)
        spec = importlib.machinery.PathFinder.find_spec(RUNTIME_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"No module named '{RUNTIME_PACKAGE}'", name=RUNTIME_PACKAGE)
        pkg = types.ModuleType(_ALIAS, f"stand-in for {RUNTIME_PACKAGE} (pure modules only)")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__package__ = _ALIAS
        sys.modules[_ALIAS] = pkg
    return importlib.import_module(f"{_ALIAS}.{name}")


def trialset():
    return module("trialset")
