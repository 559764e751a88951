"""Metadata's description of each topic, built once per version of the topic.

A Metadata request names every partition of the topics it asks about: at 4,000 partitions that
is 4,000 response objects, rebuilt for every request although the topic rarely changes (clients
poll Metadata while they wait for leaders, and librdkafka refreshes it after every error). The
cache replaces a topic's TopicMetadata object whenever any of its partitions changes (copy on
write), so that object's identity, with the set of live brokers, says whether a description
built earlier still holds. Descriptions are shared between responses and never mutated.
"""

from __future__ import annotations

from collections.abc import Collection

from riverbed.coordination.metadata_cache import TopicMetadata
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

Topic = m.MetadataResponse.MetadataResponseTopic
Partition = m.MetadataResponse.MetadataResponsePartition


class TopicDescriptions:
    """The last description built of each topic, with what it was built from."""

    def __init__(self) -> None:
        self._built: dict[str, tuple[TopicMetadata, frozenset[int], Topic]] = {}

    def describe(self, metadata: TopicMetadata, live: frozenset[int]) -> Topic:
        """The topic as Metadata answers it, the live brokers being `live` (shared: do not
        mutate it; `dataclasses.replace` it to add a field)."""
        built = self._built.get(metadata.name)
        if built is not None and built[0] is metadata and built[1] == live:
            return built[2]
        topic = _build(metadata, live)
        self._built[metadata.name] = (metadata, live, topic)
        return topic

    def keep_only(self, names: Collection[str]) -> None:
        """Forget the topics not in `names` (every topic there is, after a full listing)."""
        for gone in self._built.keys() - set(names):
            del self._built[gone]


def _build(metadata: TopicMetadata, live: frozenset[int]) -> Topic:
    partitions = []
    for index, state in sorted(metadata.partitions.items()):
        leader_live = state.leader in live
        partitions.append(
            Partition(
                error_code=ErrorCode.NONE if leader_live else ErrorCode.LEADER_NOT_AVAILABLE,
                partition_index=index,
                leader_id=state.leader if leader_live else -1,
                leader_epoch=state.leader_epoch,
                replica_nodes=list(state.replicas),
                isr_nodes=list(state.isr),
                offline_replicas=[r for r in state.replicas if r not in live],
            )
        )
    return Topic(
        error_code=ErrorCode.NONE,
        name=metadata.name,
        topic_id=metadata.topic_id,
        is_internal=metadata.name.startswith("__"),
        partitions=partitions,
    )
