"""(used by tests/deploy/conftest.py and tests/watch/conftest.py) The deploy flow's unit tests run on fake hosts and connections: the drain before each switch
(opsctl.flow.switch.drain_before_switch, issue #35) has its own tests (tests/drain/), so here it
is a no-op that returns an empty gap (the lab tests run the CLI in a subprocess: not affected)."""
from __future__ import annotations

import pytest


def _no_drain(conn, host, *, why, from_release, to_release, deadline_s, steps=None, readiness_timeout_s=1800):
    from opsctl.drain import Gap

    g = Gap(why, from_release, to_release, float(deadline_s), drain=False)
    g.out_at = g.now()
    g.inflight_at_start = 0
    return g


def _record_only(conn, host, gap, since, steps=None, *, ready=True):
    if ready:
        gap.ready_at = gap.in_at = gap.now()
    else:
        gap.result = "not-ready"
    return gap.record()


@pytest.fixture(autouse=True)
def no_drain(monkeypatch, request):
    if request.node.get_closest_marker("lab"):
        return
    from opsctl.flow import deploy, promote

    for mod in (deploy, promote):
        monkeypatch.setattr(mod, "drain_deadline_s", lambda conn, host: 300.0)
        monkeypatch.setattr(mod, "drain_before_switch", _no_drain)
        monkeypatch.setattr(mod, "back_in_pool", _record_only)
