import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIME = os.path.dirname(HERE)
REPO = os.path.dirname(RUNTIME)
SRC = os.path.join(RUNTIME, "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

SGLANG_PY = os.environ.get("SGLANG_VENV_PYTHON", os.path.join(REPO, ".venv-sglang", "bin", "python"))

# the tensor tests run on the CPU with the pure torch path
os.environ.setdefault("SGLANG_DDTREE_DISABLE_TRITON", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "sglang: needs .venv-sglang (real sglang 0.5.23)")


@pytest.fixture
def sglang_python():
    if not os.path.exists(SGLANG_PY):
        pytest.skip(f"{SGLANG_PY} is absent: run scripts/sglang-venv first (CI does)")
    return SGLANG_PY
