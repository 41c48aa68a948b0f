"""Every call the CLI (and tune) makes into the flow binds to the function it calls: the
keyword names and the number of positional arguments fit its signature. A renamed
parameter would otherwise surface only when a user runs that command on a host."""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CALLERS = sorted((REPO / "opsctl" / "cli").glob("*.py")) + [REPO / "opsctl" / "tune.py"]


def flow_calls(path: Path) -> list[tuple[int, object, int, list[str]]]:
    """(line, function, positional count, keyword names) of each call into opsctl.flow."""
    tree = ast.parse(path.read_text())
    names: dict[str, object] = {}     # a function imported by name
    modules: dict[str, object] = {}   # a flow module imported under a name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opsctl.flow"):
            for alias in node.names:
                target = importlib.import_module(node.module)
                obj = getattr(target, alias.name, None)
                if obj is None or inspect.ismodule(obj):
                    modules[alias.asname or alias.name] = importlib.import_module(f"{node.module}.{alias.name}")
                else:
                    names[alias.asname or alias.name] = obj
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = None
        if isinstance(node.func, ast.Name) and node.func.id in names:
            fn = names[node.func.id]
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in modules:
            fn = getattr(modules[node.func.value.id], node.func.attr, None)
        if callable(fn) and not isinstance(fn, type):
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                continue  # *args / **kwargs: nothing to check statically
            calls.append((node.lineno, fn, len(node.args), [k.arg for k in node.keywords]))
    return calls


@pytest.mark.parametrize("path", CALLERS, ids=lambda p: p.name)
def test_calls_into_the_flow_bind_to_their_signatures(path):
    for line, fn, npos, keywords in flow_calls(path):
        sig = inspect.signature(fn)
        try:
            sig.bind(*([None] * npos), **{k: None for k in keywords})
        except TypeError as exc:
            pytest.fail(f"{path.relative_to(REPO)}:{line}: {fn.__module__}.{fn.__name__}{sig}: {exc}")


def test_the_check_sees_the_cli_calls():
    # the bench command's call into the flow is among those checked (the one a rename broke once)
    calls = flow_calls(REPO / "opsctl" / "cli" / "bench.py")
    assert any(fn.__name__ == "bench_live" and "save_baseline_run" in kw for _, fn, _, kw in calls)
    assert len([c for p in CALLERS for c in flow_calls(p)]) >= 8
