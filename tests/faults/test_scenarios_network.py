"""Network faults: a leader, a follower or the controller cut off, a flapping link, slow and
lossy links. Each runs on a fresh cluster
in network namespaces (tests/faults/scenarios.py, docs/faults.md); one module per kind, so
that pytest-xdist runs the kinds side by side."""

from __future__ import annotations

import pytest

from tests.faults.scenarios import scenario_tests

pytestmark = pytest.mark.processes

test_scenario = scenario_tests(
    [
        "leader_cut_from_zookeeper_and_followers",
        "follower_cut_from_leader",
        "controller_isolated",
        "flapping_link",
        "slow_lossy_links",
    ]
)
