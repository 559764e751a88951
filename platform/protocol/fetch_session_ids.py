"""What a Fetch request's session id and epoch mean (KIP-227, Kafka's FetchMetadata), shared by
the broker's session cache, the follower and the consumer."""

from __future__ import annotations

from typing import Final

from riverbed.protocol.errors import ErrorCode

# Session id 0: no session (a full fetch, or the leader granted none).
NO_SESSION_ID: Final = 0
# Epoch 0 opens a session with a full fetch; -1 fetches without one (closing the named one).
INITIAL_EPOCH: Final = 0
FINAL_EPOCH: Final = -1
EPOCH_MAX: Final = 2**31 - 1
# Top-level errors that end a session: the next request is a full fetch at INITIAL_EPOCH.
SESSION_ERRORS: Final = frozenset(
    {
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR,
    }
)


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch` (Kafka's FetchMetadata.nextEpoch): it wraps to 1, never 0."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == EPOCH_MAX else epoch + 1
