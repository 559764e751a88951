"""Riverbed: a tiered-storage event streaming platform that speaks the Kafka wire protocol.

The asyncio client is importable from here:

    from riverbed import Producer, Consumer, Admin, TopicPartition

ACLs (`Admin.create_acls`, `describe_acls`, `delete_acls`) are `AclBinding`s, selected by
`AclBindingFilter`s, made of `ResourceType`, `PatternType`, `AclOperation` and
`AclPermissionType` (Kafka's values).

Consumer groups add `RebalanceListener` (the hooks `subscribe(..., listener=...)` runs),
`OffsetAndMetadata` (what `commit()` takes and `committed()` answers) and `MemberState` (the
member's place in its group: `Consumer.member_state`).

This file is installed as `riverbed/__init__.py` (see setup.py): the source folder `platform/`
cannot hold an `__init__.py` of its own.
"""

from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.group.listener import RebalanceListener
from riverbed.client.group.member import MemberState
from riverbed.client.producer import Producer
from riverbed.client.types import OffsetAndMetadata, Record, RecordMetadata, TopicPartition
from riverbed.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

__version__ = "0.1.0"

__all__ = [
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "Admin",
    "Consumer",
    "MemberState",
    "OffsetAndMetadata",
    "PatternType",
    "Producer",
    "RebalanceListener",
    "Record",
    "RecordMetadata",
    "ResourceType",
    "TopicPartition",
]
