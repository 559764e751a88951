"""Column pruning for reads of the `riverbed` source: `df.select("value")` reads only `value`.

Spark 4.3 tells a Python data source nothing of the columns a query uses (its scan builder
has no SupportsPushDownRequiredColumns), so the reader would be created with the whole schema
and read every column from the objects. A Catalyst rule in Java (spark/jvm/riverbed/spark,
compiled into jars/riverbed-spark-pruning.jar by setup.py) gives the scan a schema of only the
columns the query references, before Spark creates the reader; docs/spark.md has the details.

The rule goes into the session's `experimental().extraOptimizations`, which a live session
accepts, from a class loader of its own: nothing needs to be on the driver's class path when
Spark starts. `spark.dataSource.register(RiverbedDataSource)` installs it (through
`RiverbedDataSource.name()`, the only code of ours that runs on the driver then) into the
driver's active and default sessions; `install(spark)` does it for any other session.

It runs on the driver only: executors never load the jar.
"""

from __future__ import annotations

import logging
import threading
import zipfile
from pathlib import Path
from typing import Any, Final

from pyspark import SparkContext
from pyspark.sql import SparkSession

JAR: Final = Path(__file__).parent / "jars" / "riverbed-spark-pruning.jar"
INSTALLER_CLASS: Final = "riverbed.spark.Installer"
SOURCE_NAME: Final = "riverbed"

log = logging.getLogger(__name__)
_lock = threading.Lock()
# One class loader (and installer) per JVM: every load of the jar would be new classes.
_installers: dict[int, Any] = {}


def install(spark: SparkSession) -> bool:
    """Add the rule to `spark` (once). False, with a warning saying why, where it cannot be."""
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is None:
        log.warning("riverbed column pruning: not on Spark Connect; queries read every column")
        return False
    installer = _installer(spark.sparkContext)
    if installer is None:
        return False
    installer.install(jsession, SOURCE_NAME)
    return True


def install_on_driver() -> None:
    """Into the JVM's active and default sessions, if this process is a classic Spark driver
    (not a Python worker, not a Spark Connect client). Never raises: pruning is an
    optimization, and this runs inside `spark.dataSource.register`."""
    context = SparkContext._active_spark_context
    if context is None:
        return
    try:
        installer = _installer(context)
        if installer is not None:
            installer.installIntoActiveAndDefault(SOURCE_NAME)
    except Exception:
        log.warning(
            "riverbed column pruning not installed; queries read every column", exc_info=True
        )


def _installer(context: SparkContext) -> Any:
    with _lock:
        key = id(context._gateway)
        if key not in _installers:
            built_for = _built_for()
            if built_for is None or _minor(built_for) != _minor(context.version):
                log.warning(
                    "riverbed column pruning: %s was built for Spark %s, this is Spark %s; "
                    "queries read every column (reinstall riverbed to rebuild it)",
                    JAR,
                    built_for,
                    context.version,
                )
                return None
            _installers[key] = _load(context)
        return _installers[key]


def _load(context: SparkContext) -> Any:
    """An Installer from the jar, in a class loader whose parent is the one that has Spark."""
    gateway, jvm = context._gateway, context._jvm
    assert gateway is not None and jvm is not None and context._jsc is not None
    urls = gateway.new_array(jvm.java.net.URL, 1)
    urls[0] = jvm.java.io.File(str(JAR)).toURI().toURL()
    loader = jvm.java.net.URLClassLoader(urls, context._jsc.getClass().getClassLoader())
    no_types = gateway.new_array(jvm.java.lang.Class, 0)
    no_args = gateway.new_array(jvm.java.lang.Object, 0)
    return loader.loadClass(INSTALLER_CLASS).getConstructor(no_types).newInstance(no_args)


def _built_for() -> str | None:
    """The pyspark version the jar was compiled against (its manifest's Spark-Version)."""
    try:
        with zipfile.ZipFile(JAR) as jar:
            manifest = jar.read("META-INF/MANIFEST.MF").decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    for line in manifest.splitlines():
        name, _, value = line.partition(":")
        if name == "Spark-Version":
            return value.strip()
    return None


def _minor(version: str) -> tuple[str, ...]:
    """4.3.0 -> ("4", "3"): the Spark classes the rule uses change between minor releases."""
    return tuple(version.split(".")[:2])
