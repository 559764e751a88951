"""Run `mypy --strict` on the `riverbed` package straight from `platform/`.

mypy must see the package under its import name, but `platform/` can hold no `__init__.py`; so
this builds a throwaway folder with `riverbed/__init__.py` (from platform/_package.py, as the
wheel does) and symlinks to everything else in platform/, and points mypy at it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def package_shim(target: Path) -> Path:
    package = target / "riverbed"
    package.mkdir()
    shutil.copy(REPO / "platform" / "_package.py", package / "__init__.py")
    for entry in (REPO / "platform").iterdir():
        if entry.name not in ("_package.py", "__pycache__"):
            (package / entry.name).symlink_to(entry)
    return target


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="riverbed-mypy-") as scratch:
        shim = package_shim(Path(scratch))
        command = [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(REPO / ".mypy_cache"),
            "-p",
            "riverbed",
        ]
        return subprocess.run(command, cwd=shim, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
