"""Run mypy on everything that ships and everything that tests it, straight from the source tree.

Checked: `riverbed` (platform/) and `riverbed_spark` (spark/riverbed_spark/), strict; `tests`,
`bench` and `tools`, with the overrides of pyproject.toml's [tool.mypy] sections. One mypy run
checks them all, so the packages are analysed once and shared through the cache (.mypy_cache).

mypy must see each package under its import name, but `platform/` can hold no `__init__.py`; so
this builds a throwaway folder with `riverbed/__init__.py` (from platform/_package.py, as the
wheel does) and symlinks to everything else in platform/, beside symlinks to the other packages,
and runs mypy from there: the folder mypy starts in comes first in its search path, so their
imports resolve to the source tree ahead of the copies installed in site-packages.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Import name: the folder holding it. Every Python file of the repository (setup.py aside) is in
# one of them (tests/repo/test_code_quality.py checks).
PACKAGES = {
    "riverbed": "platform",
    "riverbed_spark": "spark/riverbed_spark",
    "tests": "tests",
    "bench": "bench",
    "tools": "tools",
}


def package_shim(target: Path) -> Path:
    """`target/riverbed`: platform/ under its import name (setup.py compiles mypyc from it)."""
    package = target / "riverbed"
    package.mkdir()
    shutil.copy(REPO / "platform" / "_package.py", package / "__init__.py")
    for entry in (REPO / "platform").iterdir():
        if entry.name not in ("_package.py", "__pycache__"):
            (package / entry.name).symlink_to(entry)
    return target


def checked_tree(target: Path) -> Path:
    """`target` holding every package of PACKAGES under its import name."""
    package_shim(target)
    for name, folder in PACKAGES.items():
        if name != "riverbed":
            (target / name).symlink_to(REPO / folder, target_is_directory=True)
    return target


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="riverbed-mypy-") as scratch:
        tree = checked_tree(Path(scratch))
        command = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(REPO / ".mypy_cache"),
        ]
        for name in PACKAGES:
            command += ["-p", name]
        return subprocess.run(command, cwd=tree, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
