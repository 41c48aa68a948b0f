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
    return _imports_of(open(path).read())


def _imports_of(source):
    """The package modules SOURCE depends on, in every spelling: `from .x import y`, `from . import x`,
    `from sglang_ddtree.x import y`, `from sglang_ddtree import x` (a module, or a name of the package's
    __init__), `import sglang_ddtree.x` and `import sglang_ddtree` (its __init__)."""
    modules = {f[:-3] for f in os.listdir(SRC) if f.endswith(".py")}
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                out.add(node.module.split(".")[0])
            elif node.level == 1:
                out.update(a.name if a.name in modules else "__init__" for a in node.names)
            elif node.level == 0 and node.module and node.module.startswith("sglang_ddtree."):
                out.add(node.module.split(".")[1])
            elif node.level == 0 and node.module == "sglang_ddtree":
                out.update(a.name if a.name in modules else "__init__" for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("sglang_ddtree."):
                    out.add(a.name.split(".")[1])
                elif a.name == "sglang_ddtree":
                    out.add("__init__")
    return out


def test_every_import_form_is_seen():
    # issue #53: `from sglang_ddtree import x` went unseen, so a circle written that way passed
    forms = {
        "from .tree import build": {"tree"},
        "from . import tree, verify": {"tree", "verify"},
        "from sglang_ddtree.tree import build": {"tree"},
        "from sglang_ddtree import tree": {"tree"},
        "from sglang_ddtree import worker as w, schedule": {"worker", "schedule"},
        "from sglang_ddtree import SomeName": {"__init__"},
        "import sglang_ddtree.head": {"head"},
        "import sglang_ddtree": {"__init__"},
        "def f():\n    from sglang_ddtree import plugin\n": {"plugin"},   # lazy imports too
        "import torch\nfrom sglang.srt import server_args": set(),
    }
    for source, want in forms.items():
        assert _imports_of(source) == want, source


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
