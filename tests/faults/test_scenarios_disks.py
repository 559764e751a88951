"""Disk faults: a follower's or a leader's disk full, a leader's disk failing fsync. Each runs
on a fresh cluster in network namespaces (tests/faults/scenarios.py, docs/faults.md); one
module per kind, so that pytest-xdist runs the kinds side by side."""

from __future__ import annotations

import pytest

from tests.faults.scenarios import scenario_tests

pytestmark = pytest.mark.processes

test_scenario = scenario_tests(
    [
        "full_disk_on_a_follower",
        "full_disk_on_a_leader",
        "fsync_failure_on_the_leader",
    ]
)
