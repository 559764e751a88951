"""Fixtures for the Spark tests: one real Spark (pyspark, local mode) per test run, bound to
127.0.0.1, with the `riverbed` data source registered; and `tiered_broker`, `moto_server` and
`s3_bucket` from tests/tiering.

Spark's Python workers are started with this interpreter (PYSPARK_PYTHON), so they import the
same riverbed and riverbed_spark as the tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from riverbed_spark import RiverbedDataSource

from tests.tiering.conftest import (  # noqa: F401 - fixtures, by their names
    moto_server,
    s3_bucket,
    tiered_broker,
)

SPARK_CORES = 2


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only
    session = (
        SparkSession.builder.master(f"local[{SPARK_CORES}]")
        .appName("riverbed-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(SPARK_CORES))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(RiverbedDataSource)
    try:
        yield session
    finally:
        session.stop()
