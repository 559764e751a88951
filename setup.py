"""Build hooks: generate `riverbed/__init__.py` from `platform/_package.py`, compile the record
codec and the broker's hot path.

`platform/` is the source folder of the `riverbed` package but must not contain an `__init__.py`
(from the repo root, `import platform` would find it instead of the standard library module).

`riverbed.protocol.records_fast` (the per-record loops of the client and the broker) and
`riverbed.tiering.records_columns` (the tiering's) are Cython with no pure-Python fallback: a
build without Cython or a C compiler fails rather than yield a slow client or broker.

`riverbed_spark/jars/riverbed-spark-pruning.jar` (column pruning for Spark: docs/spark.md) is
compiled from spark/jvm/ with javac against the jars of the pyspark in the build environment. A
build without a JDK or pyspark fails too, rather than yield a Spark source that reads every
column of every query.
"""

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

# The repository's tools/: setuptools.build_meta does not put the project's folder on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tools.typecheck import package_shim

# The compiled record loops; both cimport platform/protocol/kafka_varint.pxd (inline only).
COMPILED = [
    Extension(name, [source], extra_compile_args=["-O2"])
    for name, source in (
        ("riverbed.protocol.records_fast", "platform/protocol/records_fast.pyx"),
        ("riverbed.tiering.records_columns", "platform/tiering/records_columns.pyx"),
    )
]


# The broker's hot path (every produce, fetch and replica fetch runs through these modules),
# compiled with mypyc from the same typed sources: native classes with direct attribute access and
# calls instead of dictionary lookups and frames (docs/architecture.md). A build without mypy or a
# C compiler fails rather than yield a slower broker. tests/broker/test_compiled_hot_path.py checks
# that an installed broker runs these compiled.
HOT_PATH_MODULES = [
    "broker/network/connection_waits.py",
    "broker/dispatcher.py",
    "common/fileio.py",
    "hot/replication/fetch_watch.py",
    "hot/replication/followers.py",
    "broker/handlers/context.py",
    "broker/handlers/fetch.py",
    "broker/handlers/produce.py",
    "hot/storage/index.py",
    "hot/storage/leader_epoch.py",
    "hot/storage/log.py",
    "broker/metrics.py",
    "hot/replication/partitions.py",
    "hot/storage/producer_state.py",
    "hot/replication/replica_fetcher.py",
    "hot/replication/quota.py",
    "broker/network/response_queue.py",
    "hot/storage/segment.py",
    "broker/network/server.py",
    "broker/fetch_sessions.py",
]
MYPYC_SOURCE_TREE = Path("build") / "mypyc-source"

JAVA_SOURCES = Path(__file__).parent / "spark" / "jvm"
PRUNING_JAR = Path("riverbed_spark") / "jars" / "riverbed-spark-pruning.jar"
# The oldest Java that Spark 4 runs on; the classes must load in any JVM that runs Spark.
JAVA_RELEASE = "17"
# A zip entry's time is part of the jar's bytes: a fixed one makes builds reproducible.
JAR_ENTRY_TIME = (2024, 1, 1, 0, 0, 0)


class BuildPyWithPackageInit(build_py):
    def run(self) -> None:
        super().run()
        source = Path(__file__).parent / "platform" / "_package.py"
        target = Path(self.build_lib) / "riverbed" / "__init__.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text())
        build_pruning_jar(Path(self.build_lib) / PRUNING_JAR)


def build_pruning_jar(target: Path) -> None:
    """Compile spark/jvm/ against pyspark's jars; the manifest records that pyspark's version,
    which riverbed_spark/pruning.py checks against the running Spark before using the jar."""
    spark_jars, spark_version = _pyspark_jars()
    sources = sorted(str(p) for p in JAVA_SOURCES.rglob("*.java"))
    with tempfile.TemporaryDirectory(prefix="riverbed-javac-") as classes:
        subprocess.run(
            [
                _javac(),
                "--release",
                JAVA_RELEASE,
                "-Xlint:all,-path",
                "-Werror",
                "-encoding",
                "UTF-8",
                "-cp",
                str(spark_jars / "*"),
                "-d",
                classes,
                *sources,
            ],
            check=True,
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        manifest = f"Manifest-Version: 1.0\r\nSpark-Version: {spark_version}\r\n\r\n"
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr(zipfile.ZipInfo("META-INF/MANIFEST.MF", JAR_ENTRY_TIME), manifest)
            for path in sorted(Path(classes).rglob("*.class")):
                entry = zipfile.ZipInfo(str(path.relative_to(classes)), JAR_ENTRY_TIME)
                jar.writestr(entry, path.read_bytes(), zipfile.ZIP_DEFLATED)


def mypyc_extensions() -> list[Extension]:
    """The hot path's mypyc extensions. mypyc names a module after its path, so it compiles
    from the tree tools/typecheck checks, where `platform/` appears under its import name."""
    from mypyc.build import mypycify

    shutil.rmtree(MYPYC_SOURCE_TREE, ignore_errors=True)
    MYPYC_SOURCE_TREE.mkdir(parents=True)
    package = package_shim(MYPYC_SOURCE_TREE) / "riverbed"
    # Not the project's strict config: compiling needs the types, not the lint, and an isolated
    # build (`pip wheel .`) has no runtime dependencies installed, whose types become Any.
    options = ["--config-file", "", "--ignore-missing-imports", "--python-version", "3.11"]
    return mypycify([*options, *(str(package / m) for m in HOT_PATH_MODULES)], opt_level="3")


def _pyspark_jars() -> tuple[Path, str]:
    spec = importlib.util.find_spec("pyspark")  # found, not imported
    if spec is None or spec.origin is None:
        raise RuntimeError("building riverbed_spark's pruning jar needs pyspark installed")
    return Path(spec.origin).parent / "jars", importlib.metadata.version("pyspark")


def _javac() -> str:
    java_home = os.environ.get("JAVA_HOME")
    javac = str(Path(java_home) / "bin" / "javac") if java_home else shutil.which("javac")
    if javac is None or not Path(javac).exists():
        raise RuntimeError(
            "building riverbed_spark's pruning jar needs javac (JDK 17 or later): "
            "apt-get install openjdk-17-jdk-headless"
        )
    return javac


setup(
    cmdclass={"build_py": BuildPyWithPackageInit},
    # Cython's generated C is a build product: the wheel carries the compiled module only.
    exclude_package_data={
        "riverbed.protocol": ["*.c", "*.pyx", "*.pxd"],
        "riverbed.tiering": ["*.c", "*.pyx"],
    },
    ext_modules=[
        *cythonize(
            COMPILED,
            include_path=["platform/protocol"],
            compiler_directives={"language_level": "3"},
        ),
        *mypyc_extensions(),
    ],
)
