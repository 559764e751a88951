"""`process.scheduling.policy`: a real broker process and every thread it starts run under
SCHED_BATCH by default, under what they were started with on `inherit`; a broker started under
another policy keeps it; an unknown policy is refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from riverbed.configs import BrokerConfig, ConfigError

from tests.support.broker import BrokerFactory, BrokerProcess


def thread_policies(pid: int) -> dict[int, int]:
    return {int(tid): os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_the_broker_and_all_its_threads_run_under_sched_batch(broker: BrokerProcess) -> None:
    policies = thread_policies(broker.pid)
    # The broker's own threads (ZooKeeper's, the executor's) were started after the switch.
    assert len(policies) > 1
    assert set(policies.values()) == {os.SCHED_BATCH}, policies


def test_inherit_keeps_the_policy_the_broker_was_started_with(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory({"process.scheduling.policy": "inherit"})
    assert set(thread_policies(broker.pid).values()) == {os.SCHED_OTHER}


STARTED_UNDER_IDLE = r"""
import os
from riverbed.common.scheduling import apply_scheduling_policy
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
print(apply_scheduling_policy("batch"), os.sched_getscheduler(0) == os.SCHED_IDLE)
"""


@pytest.mark.processes
def test_a_broker_started_under_another_policy_keeps_it(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", STARTED_UNDER_IDLE],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.split()
    assert out == ["False", "True"]


def test_an_unknown_policy_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"process\.scheduling\.policy.*batch, inherit"):
        BrokerConfig.from_mapping(
            {"zookeeper.connect": "127.0.0.1:2181", "process.scheduling.policy": "fifo"}
        )
