"""The disk faults against the real kernel: ENOSPC from a full tmpfs, EIO from a failing ext4,
and nothing left mounted or attached afterwards, even after a failed test or a killed run."""

from __future__ import annotations

import errno
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Final

import pytest

from tests.faults.disks import (
    PAGE_BYTES,
    SYS_BLOCK_PATH,
    FailingDisk,
    FullDisk,
    bound_loops,
    mounts,
    owner_name,
    sweep_stale,
)

pytestmark = pytest.mark.processes

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
FULL_DISK_SIZE_BYTES: Final = 1 << 20
# fail() is one ioctl and the next fsync() writes through two loop devices into memory: it took
# ~10 ms here. A second means the error did not come from that write.
EIO_LATENCY_S_MAX: Final = 1.0
LOOP_RELEASE_TIMEOUT_S: Final = 10.0
WRITE_BYTES: Final = 64 * 1024


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    yield
    assert leftovers() == [], "a disk fault left mounts or loop devices behind"


def leftovers(owner: str | None = None) -> list[str]:
    """Mounts and loop devices that carry `owner`'s name (this process's by default)."""
    name = owner or owner_name()
    loops = bound_loops()
    media = {loop for loop, backing in loops.items() if f"{name}-" in backing}
    ours = {loop for loop, backing in loops.items() if loop in media or backing in media}
    found = [f"mount {m.target}" for m in mounts() if name in m.source or m.source in ours]
    return found + [f"loop {loop}" for loop in sorted(ours)]


def write_and_fsync(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def failing(disk: FailingDisk) -> bool:
    """disk.failing, read afresh: mypy would keep an assertion's narrowing of the property
    across fail() and heal() (python/mypy#11969)."""
    return disk.failing


def test_a_full_disk_refuses_writes_until_freed(tmp_path: Path) -> None:
    directory = tmp_path / "full"
    with FullDisk(directory, FULL_DISK_SIZE_BYTES) as disk:
        assert os.path.ismount(directory)
        assert disk.fill() > 0
        assert disk.free_bytes == 0
        with pytest.raises(OSError, match="No space left") as raised:
            write_and_fsync(directory / "segment", b"x" * PAGE_BYTES)
        assert raised.value.errno == errno.ENOSPC
        # Any process, not just this one.
        child = subprocess.run(
            [sys.executable, "-c", f"open({str(directory / 'other')!r}, 'wb').write(b'x' * 9999)"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert "No space left on device" in child.stderr
        disk.free()
        write_and_fsync(directory / "segment", b"x" * PAGE_BYTES)
    assert not os.path.ismount(directory)


def test_fill_leaves_the_room_asked_for(tmp_path: Path) -> None:
    with FullDisk(tmp_path / "full", FULL_DISK_SIZE_BYTES) as disk:
        leave_bytes = 3 * PAGE_BYTES + 1  # tmpfs counts pages: four are left
        disk.fill(leave_bytes=leave_bytes)
        assert disk.free_bytes == 4 * PAGE_BYTES
        write_and_fsync(tmp_path / "full" / "fits", b"x" * leave_bytes)
        with pytest.raises(OSError, match="No space left") as raised:
            write_and_fsync(tmp_path / "full" / "does-not-fit", b"x" * 2 * PAGE_BYTES)
        assert raised.value.errno == errno.ENOSPC


def test_a_failing_disk_fails_fsync_with_eio_until_healed(tmp_path: Path) -> None:
    directory = tmp_path / "failing"
    with FailingDisk(directory) as disk:
        assert os.path.ismount(directory)
        assert list(directory.iterdir()) == []  # a fresh log dir: no lost+found
        write_and_fsync(directory / "before", b"b" * WRITE_BYTES)

        disk.fail()
        assert failing(disk)
        started = time.monotonic()
        descriptor = os.open(directory / "during", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            assert os.write(descriptor, b"d" * WRITE_BYTES) == WRITE_BYTES  # the page cache
            with pytest.raises(OSError, match="Input/output error") as raised:
                os.fsync(descriptor)
        finally:
            os.close(descriptor)
        assert raised.value.errno == errno.EIO
        assert time.monotonic() - started < EIO_LATENCY_S_MAX
        # Another process gets it too.
        child = subprocess.run(
            [sys.executable, "-c", fsync_program(directory / "child")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert child.stdout.strip() == "EIO", child.stderr
        # Reads work: the file written before is still there.
        assert (directory / "before").read_bytes() == b"b" * WRITE_BYTES

        disk.heal()
        assert not failing(disk)
        write_and_fsync(directory / "after", b"a" * WRITE_BYTES)
        child = subprocess.run(
            [sys.executable, "-c", fsync_program(directory / "child-after")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert child.stdout.strip() == "ok", child.stderr
        assert (directory / "after").read_bytes() == b"a" * WRITE_BYTES
    assert not os.path.ismount(directory)


def fsync_program(path: Path) -> str:
    return textwrap.dedent(
        f"""
        import errno, os
        fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"c" * 4096)
        try:
            os.fsync(fd)
            print("ok")
        except OSError as error:
            print(errno.errorcode[error.errno])
        """
    )


def test_a_direct_write_fails_at_once(tmp_path: Path) -> None:
    with FailingDisk(tmp_path / "failing") as disk:
        disk.fail()
        flags = os.O_WRONLY | os.O_CREAT | os.O_DIRECT
        descriptor = os.open(tmp_path / "failing" / "direct", flags, 0o644)
        aligned = mmap.mmap(-1, PAGE_BYTES)  # O_DIRECT wants an aligned buffer
        try:
            with pytest.raises(OSError, match="Input/output error") as raised:
                os.write(descriptor, aligned)
        finally:
            aligned.close()
            os.close(descriptor)
        assert raised.value.errno == errno.EIO


def test_a_shut_down_disk_fails_write_itself(tmp_path: Path) -> None:
    directory = tmp_path / "failing"
    with FailingDisk(directory) as disk:
        write_and_fsync(directory / "segment", b"x" * WRITE_BYTES)
        with (directory / "segment").open("ab", buffering=0) as segment:
            disk.shut_down()
            with pytest.raises(OSError, match="Input/output error") as raised:
                segment.write(b"y")
        assert raised.value.errno == errno.EIO
        with pytest.raises(OSError, match="Input/output error") as raised:
            (directory / "new").write_bytes(b"z")
        assert raised.value.errno == errno.EIO


def test_shut_down_refuses_a_directory_that_is_not_its_mount(tmp_path: Path) -> None:
    # Else the ioctl would shut down the filesystem holding tmp_path: the host's.
    with pytest.raises(RuntimeError, match="not this FailingDisk's mount"):
        FailingDisk(tmp_path).shut_down()


def fail_holding_a_file(disk: FailingDisk, held: list[IO[bytes]]) -> None:
    """A test that fails while failing the disk, with a file of it still open."""
    with disk:
        held.append((disk.directory / "held").open("wb"))
        disk.fail()
        raise RuntimeError("the test failed")


def test_exit_cleans_up_after_a_failed_test_with_a_file_still_open(tmp_path: Path) -> None:
    directory = tmp_path / "failing"
    held: list[IO[bytes]] = []
    with pytest.raises(RuntimeError, match="the test failed"):
        fail_holding_a_file(FailingDisk(directory), held)
    # Unmounted lazily: the filesystem lives on until the file is closed.
    assert not os.path.ismount(directory)
    held[0].close()
    # The loop devices detach themselves once the filesystem is released.
    deadline = time.monotonic() + LOOP_RELEASE_TIMEOUT_S
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers() == []


KILLED_RUN: Final = """
import os, signal, sys
from pathlib import Path
from tests.faults.disks import FailingDisk, FullDisk
root = Path(sys.argv[1])
FullDisk(root / "full", 1 << 20).__enter__().fill()
FailingDisk(root / "failing").__enter__().fail()
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sweep_stale_removes_what_a_killed_run_left(tmp_path: Path) -> None:
    with FullDisk(tmp_path / "mine", FULL_DISK_SIZE_BYTES):
        child = subprocess.run(
            [sys.executable, "-c", KILLED_RUN, str(tmp_path)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        killed_owner = f"rbf-disk-{int(child.stdout)}"
        # Two tmpfs, the ext4 on the device loop, and the two loop devices.
        assert len(leftovers(killed_owner)) == 5, leftovers(killed_owner)
        killed_loops = [entry.split()[1] for entry in leftovers(killed_owner) if "loop " in entry]
        swept = sweep_stale()
        assert any("full" in entry for entry in swept)
        deadline = time.monotonic() + LOOP_RELEASE_TIMEOUT_S
        while leftovers(killed_owner) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert leftovers(killed_owner) == []
        assert not os.path.ismount(tmp_path / "failing")
        # The killed run's medium was failing: the next disk to get its loop must not.
        for loop in killed_loops:
            assert (SYS_BLOCK_PATH / Path(loop).name / "ro").read_text().strip() == "0"
        # A live process's disk is not stale.
        assert os.path.ismount(tmp_path / "mine")
