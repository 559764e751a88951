"""Facts about the machine and the code a result was measured on, stored next to the numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent


def machine_info(work_dir: Path) -> dict[str, Any]:
    uname = os.uname()
    return {
        "cpu_model": _cpu_model(),
        "cpu_logical_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)),
        "ram_bytes": _meminfo_bytes("MemTotal"),
        "kernel": f"{uname.sysname} {uname.release} {uname.machine}",
        "os": _os_release(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "riverbed": _riverbed_version(),
        "git": _git_state(),
        "work_dir_filesystem": _filesystem_of(work_dir),
    }


def package_version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    for line in _read_lines(Path("/proc/cpuinfo")):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _meminfo_bytes(key: str) -> int | None:
    for line in _read_lines(Path("/proc/meminfo")):
        name, _, rest = line.partition(":")
        if name == key:
            kib = rest.split()[0]
            return int(kib) * 1024
    return None


def _os_release() -> str:
    for line in _read_lines(Path("/etc/os-release")):
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return "unknown"


def _riverbed_version() -> dict[str, str]:
    import riverbed

    return {
        "version": str(getattr(riverbed, "__version__", "unknown")),
        "imported_from": str(Path(riverbed.__path__[0]).resolve()),
    }


def _git_state() -> dict[str, Any]:
    commit = _git("rev-parse", "HEAD")
    # Saved results are not the code measured: a run right after another benchmark (which
    # rewrote its *-latest.json) still measured a clean tree.
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results")
    return {
        # None before the first commit: the tree measured is then only the working copy.
        "commit": commit,
        "dirty": bool(status) if status is not None else None,
    }


def _git(*args: str) -> str | None:
    try:
        completed = subprocess.run(
            ["git", "-C", str(REPO_DIR), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip()


def _filesystem_of(path: Path) -> dict[str, str]:
    """The mount holding `path`: the longest mount point that is a prefix of it."""
    resolved = str(path.resolve())
    best = {"mount_point": "", "device": "unknown", "type": "unknown"}
    for line in _read_lines(Path("/proc/mounts")):
        fields = line.split()
        if len(fields) < 3:
            continue
        device, mount_point, fs_type = fields[0], fields[1], fields[2]
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best["mount_point"]):
            best = {"mount_point": mount_point, "device": device, "type": fs_type}
    return best


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []
