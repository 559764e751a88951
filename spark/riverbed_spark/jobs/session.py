"""What every job in riverbed_spark.jobs starts with: its Spark session, and progress lines."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def job_session(app_name: str, master: str | None) -> SparkSession:
    """`master`: None for whatever spark-submit or the environment chose."""
    # Spark's Python workers must import riverbed_spark: by default the interpreter running
    # this job (which has it), not whatever `python3` is first on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "true")
    if master:
        builder = builder.master(master)
    return builder.getOrCreate()


def progress(job: str, message: str) -> None:
    """One line on stderr, beside Spark's own progress bar; stdout stays the job's output."""
    print(f"{job}: {message}", file=sys.stderr, flush=True)
