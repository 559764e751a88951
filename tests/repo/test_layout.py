"""The repository's promises about its own shape.

`platform/` is the source folder of the `riverbed` package, so it must never become an importable
`platform` package: from the repo root that would shadow the standard library module that pyspark,
boto and pytest itself rely on. And the wheel must carry every subpackage folder, and the Spark
source's jar built from spark/jvm.
"""

from __future__ import annotations

import importlib.metadata
import io
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_platform_folder_has_no_init() -> None:
    assert not (REPO / "platform" / "__init__.py").exists()


@pytest.mark.processes
def test_import_platform_from_repo_root_is_the_standard_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import platform; platform.system(); print(platform.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stdlib = sysconfig.get_paths()["stdlib"]
    assert out == str(Path(stdlib) / "platform.py")


def test_pytest_from_repo_root_sees_the_standard_library_platform() -> None:
    # This very test runs under pytest started from the repo root (see the Makefile); check the
    # module pytest and everything else imported.
    import platform

    assert Path(platform.__file__).parent == Path(sysconfig.get_paths()["stdlib"])
    assert platform.system() == "Linux"


@pytest.mark.processes
def test_wheel_contains_every_subpackage(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("riverbed-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"riverbed/__init__.py", "riverbed_spark/__init__.py"}
    for folder in (REPO / "platform").rglob("*"):
        if folder.is_dir() and folder.name != "__pycache__":
            for source in folder.iterdir():
                if source.suffix in (".py", ".spec"):
                    expected.add("riverbed/" + str(source.relative_to(REPO / "platform")))
    for source in (REPO / "platform").glob("*.py"):
        expected.add("riverbed/" + source.name)
    for source in (REPO / "spark" / "riverbed_spark").rglob("*.py"):
        expected.add("riverbed_spark/" + str(source.relative_to(REPO / "spark" / "riverbed_spark")))
    expected.add(JAR)
    missing = expected - names
    assert not missing, f"wheel lacks {sorted(missing)}"
    init = zipfile.ZipFile(wheel).read("riverbed/__init__.py").decode()
    assert "__version__" in init
    # The column pruning jar, compiled by the build from every source in spark/jvm, for the
    # pyspark it was built against.
    with zipfile.ZipFile(io.BytesIO(zipfile.ZipFile(wheel).read(JAR))) as jar:
        classes = {name for name in jar.namelist() if name.endswith(".class")}
        manifest = jar.read("META-INF/MANIFEST.MF").decode()
    for source in (REPO / "spark" / "jvm").rglob("*.java"):
        assert str(source.relative_to(REPO / "spark" / "jvm").with_suffix(".class")) in classes
    assert f"Spark-Version: {importlib.metadata.version('pyspark')}" in manifest.splitlines()


JAR = "riverbed_spark/jars/riverbed-spark-pruning.jar"
