"""Fixtures for tests/validate."""
from __future__ import annotations

import pytest


@pytest.fixture
def profile():
    from opsctl.config import resolve_profile

    def make(name: str = "ddtree", budget: int | None = 16, **overrides):
        return resolve_profile(name, budget, overrides={name: overrides} if overrides else None)
    return make
