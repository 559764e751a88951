"""Kafka's text form of a UUID (topic ids): what `Uuid.toString()` prints and `Uuid.fromString`
reads. Shared by ZooKeeper's znodes and the `partition.metadata` file beside each local log."""

from __future__ import annotations

import base64
import uuid

UUID_TEXT_CHARS = 22  # 16 bytes in base64 without the two padding characters


def encode_uuid(value: uuid.UUID) -> str:
    """URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")


def decode_uuid(text: str) -> uuid.UUID:
    if len(text) != UUID_TEXT_CHARS:
        raise ValueError(f"a topic id is {UUID_TEXT_CHARS} base64url characters, got {text!r}")
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))
    except (ValueError, TypeError) as error:
        raise ValueError(f"{text!r} is not a base64url UUID") from error
