"""The follower replication throttle (Kafka's follower quota, KIP-73): the bytes per second this
broker copies for *throttled replicas* stay under `follower.replication.throttled.rate`.

A replica is throttled when its topic's `follower.replication.throttled.replicas` lists it as
`partition:broker` for this broker, or is `*`; `riverbed partitions reassign --throttle` sets
both configs for the replicas a move adds, so catching up a new replica does not starve the
leaders' disks and network, and removes them when the move is done. Both configs are read from
the metadata cache at each fetch, so a change applies at once.

As in Kafka, the quota is checked before a fetch: while the bytes copied for throttled replicas
in the last `QUOTA_WINDOW_S`, plus what the next fetch may bring, exceed rate * window, those
replicas are left out of fetches until enough of the window has passed (the others are fetched
as usual). A throttled replica's fetch asks for at most one window's worth of bytes, so the rate
holds to within one batch (a fetch returns at least one whole batch, KIP-74).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from riverbed.configs import (
    FOLLOWER_RATE_CONFIG,
    FOLLOWER_REPLICAS_CONFIG,
    ConfigError,
    dynamic_broker_config,
)
from riverbed.coordination.metadata_cache import MetadataCache

log = logging.getLogger(__name__)

QUOTA_WINDOW_S: Final = 1.0
# Samples kept at most (one per fetch response): bounds memory whatever the fetch rate.
SAMPLES_MAX: Final = 4096


class ReplicationQuota:
    """This broker's follower quota, shared by its fetchers (one per leader)."""

    def __init__(
        self, broker_id: int, cache: MetadataCache, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._broker_id = broker_id
        self._cache = cache
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque(maxlen=SAMPLES_MAX)  # (time s, bytes)

    def throttled(self, topic: str, partition: int) -> bool:
        metadata = self._cache.topic(topic)
        if metadata is None:
            return False
        listed = metadata.configs.get(FOLLOWER_REPLICAS_CONFIG, "")
        entries = {item.strip() for item in listed.split(",")}
        return "*" in entries or f"{partition}:{self._broker_id}" in entries

    def throttles_topic(self, topic: str) -> bool:
        """Whether any replica of `topic` may be throttled (a quick check per topic, for the
        fetchers that then look no further)."""
        metadata = self._cache.topic(topic)
        return metadata is not None and bool(metadata.configs.get(FOLLOWER_REPLICAS_CONFIG))

    def rate_bytes_per_s(self) -> int:
        try:
            return dynamic_broker_config(self._cache.broker_default_configs)[FOLLOWER_RATE_CONFIG]
        except ConfigError as error:  # only a hand-edited znode: validated on every write
            log.warning("ignoring the dynamic broker configs: %s", error)
            return dynamic_broker_config({})[FOLLOWER_RATE_CONFIG]

    def fetch_max_bytes(self, default_max_bytes: int) -> int:
        """What one fetch may ask for the throttled replicas together: a window's worth at most."""
        return max(1, min(default_max_bytes, int(self.rate_bytes_per_s() * QUOTA_WINDOW_S)))

    def record(self, nbytes: int) -> None:
        """Bytes copied for throttled replicas just now."""
        if nbytes > 0:
            self._samples.append((self._clock(), nbytes))

    def delay_s(self, next_fetch_bytes: int) -> float:
        """How long throttled replicas must wait before a fetch of up to `next_fetch_bytes`
        (0: fetch now): until the window's bytes plus that fetch fit the window's allowance."""
        now = self._clock()
        while self._samples and self._samples[0][0] <= now - QUOTA_WINDOW_S:
            self._samples.popleft()
        room = self.rate_bytes_per_s() * QUOTA_WINDOW_S - next_fetch_bytes
        total = sum(nbytes for _, nbytes in self._samples)
        if total <= room:
            return 0.0
        # The window must forget its oldest samples until the rest leaves room.
        for sampled_s, nbytes in self._samples:
            total -= nbytes
            if total <= room:
                return max(sampled_s + QUOTA_WINDOW_S - now, 0.0)
        raise AssertionError("room >= 0 as next_fetch_bytes <= the rate: the loop returns")
