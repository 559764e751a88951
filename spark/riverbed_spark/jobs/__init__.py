"""Historical jobs over Riverbed topics, runnable as `python -m riverbed_spark.jobs.<name>` or
with `spark-submit`."""
