"""Fixtures for the interop tests: unique topic names (`broker`, `broker_factory` and
`zk_connect` come from tests/conftest.py)."""

from __future__ import annotations

import re
import uuid
import warnings

import pytest

# kafka-python 3.0 loads its protocol schemas with importlib.resources.open_text (deprecated since
# Python 3.11) while its modules are imported. The warning is attributed to importlib, so the
# "ignore::DeprecationWarning:kafka.*" filter in pyproject.toml misses it and "error" turns it into
# a collection error. Importing kafka once here, with that warning silenced, caches every schema.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "open_text is deprecated", DeprecationWarning)
    import kafka  # noqa: F401

TOPIC_NAME_BYTES_MAX = 120  # Kafka allows 249; leave room for a partition suffix on disk


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses: the test's name plus a random suffix."""
    stem = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name).strip("-")
    return f"{stem[: TOPIC_NAME_BYTES_MAX - 9]}-{uuid.uuid4().hex[:8]}"
