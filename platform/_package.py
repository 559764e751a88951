"""Riverbed: a tiered-storage event streaming platform that speaks the Kafka wire protocol.

The asyncio client is importable from here:

    from riverbed import Producer, Consumer, Admin, TopicPartition

Consumer groups add `RebalanceListener` (the hooks `subscribe(..., listener=...)` runs),
`OffsetAndMetadata` (what `commit()` takes and `committed()` answers) and `MemberState` (the
member's place in its group: `Consumer.member_state`).

This file is installed as `riverbed/__init__.py` (see setup.py): the source folder `platform/`
cannot hold an `__init__.py` of its own.
"""

from riverbed.client.admin import Admin, OffsetAndMetadata
from riverbed.client.consumer import Consumer
from riverbed.client.group.listener import RebalanceListener
from riverbed.client.group.member import MemberState
from riverbed.client.producer import Producer
from riverbed.client.types import Record, RecordMetadata, TopicPartition

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "Consumer",
    "MemberState",
    "OffsetAndMetadata",
    "Producer",
    "RebalanceListener",
    "Record",
    "RecordMetadata",
    "TopicPartition",
]
