"""A Spark of one's own on this machine: local mode, bound to 127.0.0.1, with the `riverbed`
data source registered, and Python workers that run this interpreter (which has
riverbed_spark, whatever `python3` comes first on the PATH)."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from riverbed_spark.source import RiverbedDataSource


def local_session(app_name: str, cores: int, **config: str) -> SparkSession:
    """`config`: more Spark settings (`spark.driver.memory`, ...), applied at startup."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
    )
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(RiverbedDataSource)
    return session
