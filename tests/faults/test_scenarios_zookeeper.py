"""ZooKeeper faults: a minority or a majority of the ensemble cut off, and every member wiped
and restarted in turn under running brokers. Each runs on a fresh cluster
in network namespaces (tests/faults/scenarios.py, docs/faults.md); one module per kind, so
that pytest-xdist runs the kinds side by side."""

from __future__ import annotations

import pytest

from tests.faults.scenarios import scenario_tests

pytestmark = pytest.mark.processes

test_scenario = scenario_tests(
    [
        "zookeeper_minority_isolated",
        "zookeeper_majority_isolated",
        "zookeeper_members_wiped_one_by_one",
    ]
)
