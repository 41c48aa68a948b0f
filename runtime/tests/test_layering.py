"""The package's modules import only downward (no import circles), lazy
(function-level) imports included: each module may import only modules listed
before it in ``ORDER``."""

import ast
import os

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src", "sglang_ddtree")

# bottom first
ORDER = ["config", "stepparts", "ddtrees", "reference", "sglang_rules", "schedule", "trialset", "triton_kernels", "tree", "shards", "verify", "head", "aot",
         "bands", "worker", "plugin", "__init__"]


def _imports(path):
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                out.add(node.module.split(".")[0])
            elif node.level == 1:
                out.update(a.name for a in node.names)
            elif node.level == 0 and node.module and node.module.startswith("sglang_ddtree."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("sglang_ddtree."):
                    out.add(a.name.split(".")[1])
    return out


def test_every_module_is_placed():
    mods = sorted(f[:-3] for f in os.listdir(SRC) if f.endswith(".py"))
    assert sorted(ORDER) == mods


def test_imports_only_downward():
    bad = []
    for i, m in enumerate(ORDER):
        for dep in _imports(os.path.join(SRC, m + ".py")):
            if dep not in ORDER[:i]:
                bad.append(f"{m} -> {dep}")
    assert not bad, "upward / circular imports: " + ", ".join(bad)
