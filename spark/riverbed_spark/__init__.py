"""PySpark data source for Riverbed topics (reads the cold tier directly; arrives in a later issue)."""
