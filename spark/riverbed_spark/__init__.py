"""PySpark data source for Riverbed topics (`spark.read.format("riverbed")`).

It reads the cold tier directly from the object store and only the hot tail through the broker
(source.py); docs/spark.md has the options, columns and guarantees.
"""

from riverbed_spark.source import RiverbedDataSource

__all__ = ["RiverbedDataSource"]
