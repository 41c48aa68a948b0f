"""Test helper: exact shortcuts in Triton's CPU interpreter (TRITON_INTERPRET=1).

The kernels run unchanged; three pieces of interpreter bookkeeping that
dominated the interpreter tests' time (Triton 3.6, profiled) are done faster,
with the same results:

1. ``tl.xor_sum``: the interpreter runs a ``tl.reduce`` whose combine function
   it does not know element by element in Python (``ReduceOps.generic_reduce``),
   and every ``tl.sort`` / ``tl.topk`` compare-and-swap stage calls ``xor_sum``
   over the whole tensor (about half of the time).  Here an ``xor_sum`` over an
   axis is ``numpy.bitwise_xor.reduce`` (the same integers: XOR is exact and
   order-free; same dtype, shape and keep_dims handling as the generic path).
2. ``_patch_builtin``: every call of a ``@triton.jit`` device function (each
   sort stage, each helper) re-patches the language modules, scanning every
   member of ``tl``, ``tl.core``, ``tl.tensor``, ``tl.math`` with
   ``inspect.getmembers`` for builtins.  Here the scan looks only at the names
   that can be builtins: those that were builtins, or already-patched builtins,
   at the first scan of that module (no code adds builtins to these modules
   later); for those names it does exactly what the original does.
3. ``_patch_lang`` for a device function whose language modules were already
   patched during the same kernel launch is skipped: those patches stay in
   place until the launch ends (only the launch's own scope is ever restored,
   at its end), so repeating them only re-installed equivalent wrappers.

``test_interp_fast.py`` checks them against the interpreter's own code (kernel
outputs bit for bit, the names patched).

Off with DDTREE_TEST_INTERP_FASTPATH=0; a Triton without these internals is
left alone (the tests are then only slower).
"""

import inspect
import os


def install() -> bool:
    """Install the fast path (idempotent); True when it is active."""
    if os.environ.get("DDTREE_TEST_INTERP_FASTPATH", "1") == "0":
        return False
    try:
        import numpy as np
        import triton.language as tl
        import triton.runtime.interpreter as interp

        ops = interp.ReduceOps
        xor_combine = tl.standard._xor_combine
        orig = ops.apply_impl
        orig_patch = interp._patch_builtin
        patch_attr = interp._patch_attr
        is_builtin = tl.core.is_builtin
        orig_lang = interp._patch_lang
        scope_cls = interp._LangPatchScope
        grid_cls = interp.GridExecutor
        orig_grid_call = grid_cls.__call__
    except (ImportError, AttributeError):
        return False
    if getattr(orig, "_ddtree_fast", False):
        return True

    def apply_impl(self, input):
        if self.combine_fn == xor_combine and len(input) == 1 and self.axis is not None:
            x = input[0]
            data = np.bitwise_xor.reduce(x.handle.data, axis=self.axis, keepdims=bool(self.keep_dims))
            return self.to_tensor(data, x.dtype)
        return orig(self, input)

    names = {}  # id(pkg) -> (pkg, names that are or were builtins)
    missing = object()

    def patch_builtin(pkg, builder, scope):
        ent = names.get(id(pkg))
        if ent is None or ent[0] is not pkg:
            cand = tuple(n for n, m in inspect.getmembers(pkg) if is_builtin(m) or _patched(m))
            ent = names[id(pkg)] = (pkg, cand)
        for name in ent[1]:
            member = getattr(pkg, name, missing)
            if member is not missing and is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    launch = {"done": set()}  # _patch_lang keys (language modules) done in the current launch
    langs_of = (tl, tl.core)

    def patch_lang(fn):
        key = tuple(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs_of)
        if key in launch["done"]:
            return scope_cls()  # already patched in this launch: nothing restores it before its end
        launch["done"].add(key)
        return orig_lang(fn)

    def grid_call(self, *args, **kwargs):
        launch["done"] = set()
        try:
            return orig_grid_call(self, *args, **kwargs)
        finally:
            launch["done"] = set()

    patch_lang._ddtree_orig = orig_lang
    grid_call._ddtree_orig = orig_grid_call
    patch_builtin._ddtree_orig = orig_patch
    apply_impl._ddtree_fast = True
    apply_impl._ddtree_orig = orig
    ops.apply_impl = apply_impl
    interp._patch_builtin = patch_builtin
    interp._patch_lang = patch_lang
    grid_cls.__call__ = grid_call
    return True


def _patched(member) -> bool:
    """A builtin the interpreter has already replaced (``_patch_attr``'s lambda)."""
    return getattr(member, "__qualname__", "") == "_patch_attr.<locals>.<lambda>"


def uninstall() -> None:
    import triton.runtime.interpreter as interp

    cur = interp.ReduceOps.apply_impl
    if getattr(cur, "_ddtree_fast", False):
        interp.ReduceOps.apply_impl = cur._ddtree_orig
        interp._patch_builtin = interp._patch_builtin._ddtree_orig
        interp._patch_lang = interp._patch_lang._ddtree_orig
        interp.GridExecutor.__call__ = interp.GridExecutor.__call__._ddtree_orig
