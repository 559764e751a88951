"""What a consumer subscribes to: topic names, or a pattern matched against the cluster's topics.

A pattern must match a whole topic name (Java's `Pattern.matcher(topic).matches()`) and never
matches Kafka's internal topics. Its topics are re-evaluated whenever the consumer refreshes the
cluster's topic list (every `metadata_max_age_ms`); a change makes the member rejoin with them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

# Kafka's Topic.INTERNAL_TOPICS: never part of a pattern subscription.
INTERNAL_TOPICS: Final = frozenset({"__consumer_offsets", "__transaction_state"})


class TopicSubscription:
    """The subscribed topic names; for a pattern, the ones it matched at the last evaluation."""

    def __init__(self, topics: Iterable[str] = (), pattern: re.Pattern[str] | None = None) -> None:
        names = frozenset(topics)
        if pattern is None and not names:
            raise ValueError("subscribe() needs topics or a pattern")
        if pattern is not None and names:
            raise ValueError("subscribe() takes topics or a pattern, not both")
        if any(not isinstance(name, str) or not name for name in names):
            raise ValueError(
                f"subscribe(): topic names must be non-empty strings, not {sorted(names)!r}"
            )
        self.pattern = pattern
        self.topics: frozenset[str] = names

    def match(self, cluster_topics: Iterable[str]) -> bool:
        """Re-evaluate a pattern against the cluster's topics; True if its topics changed."""
        if self.pattern is None:
            return False
        matched = frozenset(
            topic
            for topic in cluster_topics
            if topic not in INTERNAL_TOPICS and self.pattern.fullmatch(topic)
        )
        changed = matched != self.topics
        self.topics = matched
        return changed

    def __repr__(self) -> str:
        if self.pattern is not None:
            return f"pattern {self.pattern.pattern!r} ({', '.join(sorted(self.topics))})"
        return ", ".join(sorted(self.topics))
