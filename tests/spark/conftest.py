"""Fixtures for the Spark tests: one real Spark (pyspark, local mode) per test run, bound to
127.0.0.1, with the `riverbed` data source registered; and `tiered_broker`, `moto_server` and
`s3_bucket` from tests/tiering.

Spark's Python workers are started with this interpreter (PYSPARK_PYTHON), so they import the
same riverbed and riverbed_spark as the tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from riverbed_spark.local import local_session

from tests.tiering.conftest import (  # noqa: F401 - fixtures, by their names
    moto_server,
    s3_bucket,
    tiered_broker,
)

SPARK_CORES = 2


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("riverbed-tests", SPARK_CORES, **{"spark.sql.session.timeZone": "UTC"})
    try:
        yield session
    finally:
        session.stop()
