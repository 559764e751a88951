"""Exponential backoff with jitter (Kafka's ExponentialBackoff), for every retry loop: the
client's requests and metadata refreshes, and the object-store calls of the cold tier."""

from __future__ import annotations

import random
from typing import Final

# Each wait is the previous one doubled, +-20% random jitter so that many clients retrying
# together spread out.
BACKOFF_MULTIPLIER: Final = 2
BACKOFF_JITTER: Final = 0.2
# Doublings before the cap is surely reached; keeps 2**attempts small.
BACKOFF_EXPONENT_MAX: Final = 32


def backoff_ms(attempts: int, base_ms: int, max_ms: int) -> float:
    """The wait before retry number `attempts` (1 = first retry): base * 2^(attempts-1), at most
    max_ms, with +-20% jitter."""
    if attempts <= 0 or base_ms <= 0:
        return 0.0
    exponent = min(attempts - 1, BACKOFF_EXPONENT_MAX)
    wait_ms = min(base_ms * BACKOFF_MULTIPLIER**exponent, max(max_ms, base_ms))
    return float(wait_ms * random.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER))
