"""PySpark data source for Riverbed topics.

It reads the cold tier directly from the object store; it arrives with the Spark issue.
"""
