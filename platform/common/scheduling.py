"""The broker process's CPU scheduling policy (`process.scheduling.policy`): Linux's SCHED_BATCH
by default.

A broker that wakes another process (a follower waiting for records, a producer waiting for its
acknowledgement) makes it runnable at once; under SCHED_OTHER the woken process usually
preempts whatever runs on that core, often the waker in the middle of its response. When
brokers share cores with each other and with their clients, that preemption ping-pong is paid
on every request: on this project's 2-core benchmark machine, three brokers replicating acks=all
16 KiB batches and their client spent ~15% more CPU per record under SCHED_OTHER than with the
brokers under SCHED_BATCH, and produced ~20% fewer records per second (docs/replication.md).
SCHED_BATCH is SCHED_OTHER without wakeup preemption: same fairness and nice levels, and a woken
broker still runs at once on an idle core.

Threads inherit the policy from the thread that creates them, so this is set before the broker
starts any. A broker started under another policy (`chrt`) keeps it; `inherit` keeps SCHED_OTHER
too. Setting SCHED_BATCH needs no privilege.
"""

from __future__ import annotations

import logging
import os
from typing import Final

log = logging.getLogger(__name__)

BATCH: Final = "batch"
INHERIT: Final = "inherit"
POLICIES: Final = (BATCH, INHERIT)


def apply_scheduling_policy(policy: str) -> bool:
    """Give the calling thread (and the threads it starts later) `policy`; True if it changed."""
    if policy == INHERIT:
        return False
    if policy != BATCH:
        raise ValueError(f"unknown scheduling policy {policy!r}; expected one of {POLICIES}")
    if not hasattr(os, "SCHED_BATCH"):  # not Linux
        log.info("SCHED_BATCH is not available here: the broker keeps its scheduling policy")
        return False
    if os.sched_getscheduler(0) != os.SCHED_OTHER:
        return False  # the operator chose one (chrt)
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError as exc:  # a seccomp filter or a kernel without it: the broker runs as before
        log.warning("could not switch the broker to SCHED_BATCH: %s", exc)
        return False
    return True
