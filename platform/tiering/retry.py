"""Bounded retries for object store calls: a timeout on every attempt, exponential backoff with
full jitter between attempts, and a fixed number of retries, so a call's total duration has a
known upper bound (`RetryPolicy.duration_ms_max`) whatever the store does.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from riverbed.common.backoff import backoff_ms

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    retries_max: int  # retries after the first attempt
    backoff_ms: int  # the ceiling of the first wait, doubled per retry ...
    backoff_max_ms: int  # ... up to this
    attempt_timeout_ms: int  # every attempt, including reading the whole response

    def __post_init__(self) -> None:
        if self.retries_max < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries_max}")
        if self.backoff_ms < 0 or self.backoff_max_ms < self.backoff_ms:
            raise ValueError(
                f"retry backoff must satisfy 0 <= retry.backoff.ms ({self.backoff_ms}) <= "
                f"retry.backoff.max.ms ({self.backoff_max_ms})"
            )
        if self.attempt_timeout_ms <= 0:
            raise ValueError(f"request timeout must be > 0 ms, got {self.attempt_timeout_ms}")

    @property
    def duration_ms_max(self) -> int:
        """The longest a call can take: every attempt timing out, every wait at its cap."""
        return (
            self.retries_max + 1
        ) * self.attempt_timeout_ms + self.retries_max * self.backoff_max_ms

    def wait_ms(self, retry: int) -> float:
        """The wait before retry number `retry` (1 = first): uniform in [0, ceiling] ("full
        jitter"), so brokers that failed together (a store outage, a conditional write lost to
        each other) spread their retries over the whole window instead of retrying in step. The
        ceiling is Kafka's exponential backoff (the client's), never above backoff_max_ms."""
        ceiling_ms = min(
            backoff_ms(retry, self.backoff_ms, self.backoff_max_ms), self.backoff_max_ms
        )
        return random.uniform(0.0, ceiling_ms)


class RetriesExhaustedError(Exception):
    """Every attempt failed with a retriable error; `last` is the final one."""

    def __init__(self, attempts: int, last: Exception) -> None:
        super().__init__(f"{attempts} attempts, last: {last}")
        self.attempts = attempts
        self.last = last


async def call_with_retries(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    retriable: Callable[[Exception], bool],
    what: str,
) -> T:
    """`attempt()` under the policy's timeout, again after a backoff while it fails with an
    error `retriable` accepts (a timed-out attempt raises TimeoutError). A non-retriable error is
    raised as it is; RetriesExhaustedError once the retries are used up. `what` names the call in
    debug logs."""
    retries = 0
    while True:
        try:
            async with asyncio.timeout(policy.attempt_timeout_ms / 1000):
                return await attempt()
        except Exception as error:
            if not retriable(error):
                raise
            if retries >= policy.retries_max:
                raise RetriesExhaustedError(retries + 1, error) from error
            retries += 1
            wait_ms = policy.wait_ms(retries)
            log.debug("%s failed (%r); retry %d in %.0f ms", what, error, retries, wait_ms)
            await asyncio.sleep(wait_ms / 1000)
