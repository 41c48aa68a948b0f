"""Fixtures for end-to-end tests on the lab host (helpers in tests/labtools.py)."""
from __future__ import annotations

import pytest
from labtools import Ops, host_snapshot, reset_host


@pytest.fixture(scope="module")
def clean_lab(lab_host):
    reset_host(lab_host)
    yield lab_host
    reset_host(lab_host)


@pytest.fixture
def ops(lab_host) -> Ops:
    return Ops(lab_host.inventory_dir)


@pytest.fixture
def snapshot():
    return host_snapshot
