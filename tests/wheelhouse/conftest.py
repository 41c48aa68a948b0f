"""A small real wheelhouse, built once per session: the runtime wheel (built here, joined
without dependencies) and three packages downloaded from PyPI in the test: two pure-Python
ones and one binary manylinux wheel (MarkupSafe, manylinux_2_17), so tag checks have
something to refuse."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from whset import PLATFORM, PYTHON, REQUIREMENTS


@pytest.fixture(scope="session")
def runtime_wheel(tmp_path_factory) -> Path:
    from opsctl.buildwheel import build_runtime_wheel

    return build_runtime_wheel(tmp_path_factory.mktemp("runtime")).path


@pytest.fixture(scope="session")
def small_set(tmp_path_factory, runtime_wheel):
    """(directory, BuildResult of the first build). Treat the directory as read-only: copy it."""
    from opsctl import wheelhouse as wh

    out = tmp_path_factory.mktemp("wheelhouse") / "wh"
    res = wh.build(out, REQUIREMENTS, wh.Target(PYTHON, PLATFORM), add=[runtime_wheel])
    return out, res


@pytest.fixture
def wh_copy(small_set, tmp_path) -> Path:
    """A private copy of the small wheelhouse to break."""
    dst = tmp_path / "wh"
    shutil.copytree(small_set[0], dst)
    return dst
