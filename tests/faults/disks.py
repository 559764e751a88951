"""Honest disk faults for a broker's log directory: a disk that fills up, and a disk that fails.

Both are real kernel filesystems mounted at a directory the test chooses, so every process
(brokers included) sees the same errors a real disk would give it, from the same system calls:

- `FullDisk`: a tmpfs of `size_bytes`. `fill()` takes the free room with a filler file, and
  writes then fail with ENOSPC; `free()` deletes the filler.
- `FailingDisk`: ext4 whose block device refuses writes on demand. `fail()` makes every write
  that reaches the device fail with EIO, so writeback fails and fsync() returns EIO; `heal()`
  takes writes again. Reads keep working: the disk's surface is readable, its writes are not.

How FailingDisk gets a real EIO without device-mapper (checked on kernel 6.18). The obvious
construction, a loop device on a sparse file whose tmpfs is then filled up, gives ENOSPC, not
EIO: the loop driver passes its backing file's errno up as the block status ("critical space
allocation error", BLK_STS_NOSPC), and ext4 hands that to fsync(). Marking a loop device
read-only does nothing either: the block layer only logs a warning for a write to a read-only
device. What does fail is the *file* interface of a read-only block device: its write_iter
returns EPERM, and the loop driver maps every errno it has no block status for to BLK_STS_IOERR,
which ext4 sees as EIO. So the disk is two loop devices stacked:

    ext4 (mounted at `directory`) -> loop "device" -> /dev/loop "medium" -> sparse image on tmpfs

and `fail()` / `heal()` flip the medium's read-only flag (ioctl BLKROSET). The image lives on a
tmpfs of its own so that it is bounded, kept in memory, and never runs out of room (a full
medium would give ENOSPC, which is FullDisk's fault, not this one's).

What a test sees while the disk fails:
- fsync()/fdatasync() of a file with dirty pages returns EIO within milliseconds of the call
  (2-6 ms here for 4 KiB to 8 MiB: the write round trip; fail() itself is one ioctl), and so
  does every later fsync() of it while the disk fails. Pages dirtied before fail() and not yet
  written back fail as well, and so does writeback the kernel started on its own (sync(),
  dirty expiry): the next fsync() reports it. fsync() of a file with nothing dirty returns 0:
  there is nothing to write, and the cache flush still succeeds.
- A buffered write() succeeds: it only dirties the page cache, and ext4 allocates the blocks at
  writeback. close() returns 0. An O_DIRECT write() fails at once with EIO, as does msync().
- Reads work, from the cache and from the device.
- `shut_down()` is the other fault the kernel offers: ext4's FS_IOC_SHUTDOWN (what xfstests'
  "godown" does). Every later call on the filesystem then fails with EIO, open() and a buffered
  write() included, as after a fatal filesystem error. It cannot be healed: only a fresh mount
  undoes it, so it lasts until close().

What healing means. The ext4 has no journal (`-O ^has_journal`): jbd2 aborts the journal at
its first failed write and ext4 then goes read-only whatever `errors=` says, and heal() could
not undo that. It is mounted `errors=continue`, so ext4 logs each failure and goes on. After
heal(), new files and new writes are persisted again. Pages whose writeback failed are lost, as
on a real disk: ext4 marks them clean, so the cache still shows their contents until it evicts
them, and the blocks read back as zeros after that (their extents stay "unwritten"). Writes to a
file's blocks whose writeback failed may be lost too even after heal(); a broker treats such a
directory as offline anyway (Kafka's KAFKA_STORAGE_ERROR), so a test should check new files.

Cleanup: exit unmounts, detaches and removes everything, even when the test failed. Kill the
processes that use the directory first: if one still holds a file there, the unmount is lazy
and the filesystem (and its loop devices, which then detach themselves) lives until that file
is closed. A run killed before its cleanup leaves mounts and loop devices behind; every name
they carry includes `rbf-disk-<pid>`, and `sweep_stale()` removes those of dead processes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

NAME_PREFIX: Final = "rbf-disk-"
WORK_ROOT: Final = Path("/tmp")
FILLER_NAME: Final = ".rbf-filler"  # a file: brokers load only <topic>-<partition> directories
FILL_CHUNK_BYTES: Final = 1 << 20
# tmpfs hands out and counts whole pages: a FullDisk can leave free room in pages only.
PAGE_BYTES: Final = os.sysconf("SC_PAGE_SIZE")
FAILING_DISK_SIZE_BYTES_DEFAULT: Final = 64 << 20
# mkfs.ext4 needs room for its group descriptors and inode tables; below this it refuses or
# leaves nothing to write into.
FAILING_DISK_SIZE_BYTES_MIN: Final = 8 << 20
# The medium's tmpfs is a little larger than its image, so the medium itself never fills up.
MEDIUM_SLACK_BYTES: Final = 1 << 20
EXT4_BLOCK_BYTES: Final = 4096  # what real disks use; mkfs picks 1 KiB for small devices
COMMAND_TIMEOUT_S: Final = 60.0
MOUNTINFO_PATH: Final = Path("/proc/self/mountinfo")
LOOP_CONTROL_PATH: Final = Path("/dev/loop-control")
SYS_BLOCK_PATH: Final = Path("/sys/block")

# ioctl numbers from linux/fs.h: BLKROSET = _IO(0x12, 93), BLKROGET = _IO(0x12, 94),
# FS_IOC_SHUTDOWN = _IOR('X', 125, __u32); EXT4_GOING_FLAGS_NOLOGFLUSH = 2 drops the dirty data
# as a dead disk would, instead of flushing it first.
_BLKROSET: Final = 0x125D
_BLKROGET: Final = 0x125E
_FS_IOC_SHUTDOWN: Final = 0x8004587D
_SHUTDOWN_NOLOGFLUSH: Final = 2

_OWNER_PATTERN: Final = re.compile(re.escape(NAME_PREFIX) + r"(\d+)")


class DiskFaultError(RuntimeError):
    """A disk fault could not be set up or undone (not root, a tool missing, a command failed)."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise DiskFaultError(
            "disk faults mount filesystems and attach loop devices, which needs root "
            "(`make test` runs as root)"
        )


def owner_name() -> str:
    """The name this process gives its mounts and work directories (`sweep_stale` reads it)."""
    return f"{NAME_PREFIX}{os.getpid()}"


class FullDisk:
    """A tmpfs of `size_bytes` mounted at `directory` (hiding what it held), to fill on demand.

    While filled, every write that needs a new page fails with ENOSPC, whichever process makes
    it; the filler is a file, `directory/.rbf-filler`, which a broker's log loading ignores.
    """

    def __init__(self, directory: Path, size_bytes: int) -> None:
        if size_bytes < PAGE_BYTES:
            raise ValueError(f"size_bytes must be at least one page ({PAGE_BYTES})")
        self.directory = directory
        self.size_bytes = size_bytes
        self._mounted = False

    @property
    def filler_path(self) -> Path:
        return self.directory / FILLER_NAME

    @property
    def free_bytes(self) -> int:
        stats = os.statvfs(self.directory)
        return stats.f_bavail * stats.f_frsize

    def __enter__(self) -> FullDisk:
        require_root()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory = self.directory.resolve()  # as the mount table names it
        options = f"size={self.size_bytes},mode=0755"
        _run("mount", "-t", "tmpfs", "-o", options, owner_name(), str(self.directory))
        self._mounted = True
        return self

    def fill(self, leave_bytes: int = 0) -> int:
        """Take the free room but at least `leave_bytes` (rounded up to whole pages) with the
        filler; return the bytes written. With 0, writes go on until ENOSPC."""
        if leave_bytes < 0:
            raise ValueError("leave_bytes must be >= 0")
        leave_pages = -(-leave_bytes // PAGE_BYTES)
        remaining_bytes = max(0, self.free_bytes - leave_pages * PAGE_BYTES)
        if leave_bytes == 0:
            # statvfs may lag the allocator by a page; a write past it finds ENOSPC, which is
            # the point.
            remaining_bytes += PAGE_BYTES
        chunk = bytes(FILL_CHUNK_BYTES)
        written_bytes = 0
        with self.filler_path.open("ab", buffering=0) as filler:
            while remaining_bytes > 0:
                try:
                    count = filler.write(chunk[: min(remaining_bytes, FILL_CHUNK_BYTES)])
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    break
                if count is None or count == 0:
                    break
                written_bytes += count
                remaining_bytes -= count
        return written_bytes

    def free(self) -> None:
        """Delete the filler: writes succeed again."""
        self.filler_path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._mounted:
            self._mounted = False
            _unmount(self.directory)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class FailingDisk:
    """An ext4 of `size_bytes` mounted at `directory`, whose writes fail with EIO while
    `failing` (see the module's docstring for the construction and what healing means)."""

    def __init__(self, directory: Path, size_bytes: int = FAILING_DISK_SIZE_BYTES_DEFAULT) -> None:
        if size_bytes < FAILING_DISK_SIZE_BYTES_MIN:
            raise ValueError(f"size_bytes must be at least {FAILING_DISK_SIZE_BYTES_MIN}")
        self.directory = directory
        self.size_bytes = size_bytes
        self.medium: str | None = None  # the loop device whose read-only flag is the fault
        self.device: str | None = None  # the loop device ext4 is on
        self._cleanup = contextlib.ExitStack()

    def __enter__(self) -> FailingDisk:
        require_root()
        if not LOOP_CONTROL_PATH.exists():
            raise DiskFaultError(f"no {LOOP_CONTROL_PATH}: this kernel has no loop devices")
        with contextlib.ExitStack() as undo:
            undo.callback(self._forget_devices)
            work = Path(tempfile.mkdtemp(prefix=f"{owner_name()}-", dir=WORK_ROOT))
            undo.callback(shutil.rmtree, work, ignore_errors=True)
            medium_dir = work / "medium"
            medium_dir.mkdir()
            options = f"size={self.size_bytes + MEDIUM_SLACK_BYTES}"
            _run("mount", "-t", "tmpfs", "-o", options, owner_name(), str(medium_dir))
            undo.callback(_unmount, medium_dir)
            image = medium_dir / "disk.img"
            with image.open("wb") as file:
                file.truncate(self.size_bytes)  # sparse: the tmpfs holds only written blocks
            self.medium = _attach_loop(str(image))
            undo.callback(_detach_loop, self.medium)
            self.device = _attach_loop(self.medium)
            undo.callback(_detach_loop, self.device)
            _make_ext4(self.device)
            self.directory.mkdir(parents=True, exist_ok=True)
            self.directory = self.directory.resolve()  # as the mount table names it
            _run("mount", "-t", "ext4", "-o", "errors=continue", self.device, str(self.directory))
            undo.callback(_unmount, self.directory)
            # Only fsck uses it, and a broker would log it as a stray directory in its log dir.
            (self.directory / "lost+found").rmdir()
            # Healed before unmounting, so the unmount's own writes succeed.
            undo.callback(self.heal)
            self._cleanup = undo.pop_all()
        return self

    @property
    def failing(self) -> bool:
        return _read_only(self._require_medium())

    def fail(self) -> None:
        """From now on every write reaching the disk fails with EIO (fsync() reports it)."""
        _set_read_only(self._require_medium(), True)

    def heal(self) -> None:
        """Writes reach the disk again; what failed to be written stays lost."""
        if self.medium is not None:
            _set_read_only(self.medium, False)

    def shut_down(self) -> None:
        """Shut the filesystem down: every later call on it fails with EIO, write() and open()
        included. heal() does not undo this; it lasts until close()."""
        # Checked first: the ioctl shuts down whatever filesystem holds the directory, and
        # without our mount that is the host's.
        device = self.device
        if device is None or not any(
            m.target == self.directory and m.source == device for m in mounts()
        ):
            raise RuntimeError(f"{self.directory} is not this FailingDisk's mount")
        descriptor = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(descriptor, _FS_IOC_SHUTDOWN, struct.pack("I", _SHUTDOWN_NOLOGFLUSH))
        finally:
            os.close(descriptor)

    def close(self) -> None:
        """Unmount, detach both loop devices and delete the image. Idempotent."""
        cleanup, self._cleanup = self._cleanup, contextlib.ExitStack()
        cleanup.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _forget_devices(self) -> None:
        self.medium = self.device = None

    def _require_medium(self) -> str:
        if self.medium is None:
            raise RuntimeError("the FailingDisk is not set up: use it as a context manager")
        return self.medium


def sweep_stale() -> list[str]:
    """Unmount, detach and delete what disks of processes that are gone left behind (a run
    killed before its cleanup); return what was swept. Disks of live processes, other pytest
    workers' included, are left alone."""
    swept: list[str] = []
    failures: list[str] = []

    def sweep(what: str, undo: Callable[[], object]) -> None:
        try:
            undo()
        except (DiskFaultError, OSError) as error:  # go on: sweep what can be swept
            failures.append(f"{what}: {error}")
        else:
            swept.append(what)

    loops = bound_loops()
    stale_media = {loop for loop, backing in loops.items() if _is_stale(backing)}
    stale_devices = {loop for loop, backing in loops.items() if backing in stale_media}
    for mount in mounts():
        if mount.source in stale_devices or _is_stale(mount.source):
            target = str(mount.target)
            sweep(f"mount {target}", functools.partial(_run, "umount", "--lazy", target))
    for loop in [*stale_devices, *stale_media]:  # the device holds its medium open
        # The read-only flag would outlive the detach (see _attach_loop).
        sweep(f"read-only flag of {loop}", functools.partial(_set_read_only, loop, False))
        sweep(f"loop {loop}", functools.partial(_detach_loop, loop))
    for work in WORK_ROOT.glob(f"{NAME_PREFIX}*"):
        if _is_stale(work.name):
            sweep(f"directory {work}", functools.partial(shutil.rmtree, work))
    if failures:
        raise DiskFaultError(f"swept {swept} but not: {'; '.join(failures)}")
    return swept


@dataclass(frozen=True)
class Mount:
    target: Path
    fstype: str
    source: str


def mounts() -> list[Mount]:
    """This process's mount table (/proc/self/mountinfo)."""
    found: list[Mount] = []
    for line in MOUNTINFO_PATH.read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        fstype, source = rest.split()[:2]
        found.append(Mount(Path(_unescape(fields.split()[4])), fstype, _unescape(source)))
    return found


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match[1], 8)), field)


def bound_loops() -> dict[str, str]:
    """Every attached loop device and its backing file, from sysfs."""
    loops: dict[str, str] = {}
    for backing_path in SYS_BLOCK_PATH.glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):  # detached while we looked
            loops[f"/dev/{backing_path.parent.parent.name}"] = backing_path.read_text().strip()
    return loops


def _is_stale(name: str) -> bool:
    match = _OWNER_PATTERN.search(name)
    return match is not None and not _alive(int(match[1]))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_ext4(device: str) -> None:
    _run(
        "mkfs.ext4",
        "-q",
        "-b",
        str(EXT4_BLOCK_BYTES),
        "-m",
        "0",  # no blocks reserved for root: the test's processes are root anyway
        "-O",
        "^has_journal",  # see "What healing means"
        # nodiscard: the image is new and sparse. lazy_itable_init=0: else a kernel thread
        # zeroes the inode tables after mounting, and its writes would fail while failing.
        "-E",
        "nodiscard,lazy_itable_init=0",
        device,
    )


def _attach_loop(backing: str) -> str:
    loop = _run("losetup", "--find", "--show", backing).strip()
    if not loop.startswith("/dev/loop"):
        raise DiskFaultError(f"losetup answered {loop!r} for {backing}")
    # The read-only flag belongs to the loop device, not to what is attached: it outlives a
    # detach, so a FailingDisk killed while failing hands its medium on read-only.
    _set_read_only(loop, False)
    return loop


def _detach_loop(loop: str) -> None:
    """Detach `loop`; if it is still open (a lazily unmounted filesystem, a stacked loop), the
    kernel detaches it when it is last closed."""
    _run("losetup", "--detach", loop)


def _unmount(target: Path) -> None:
    """Unmount `target`, lazily if a process still holds a file there."""
    if not any(mount.target == target for mount in mounts()):
        return
    busy = subprocess.run(
        ["umount", str(target)], capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if busy.returncode != 0:
        _run("umount", "--lazy", str(target))


def _set_read_only(loop: str, read_only: bool) -> None:
    descriptor = os.open(loop, os.O_RDONLY)
    try:
        fcntl.ioctl(descriptor, _BLKROSET, struct.pack("i", int(read_only)))
    finally:
        os.close(descriptor)


def _read_only(loop: str) -> bool:
    descriptor = os.open(loop, os.O_RDONLY)
    try:
        answer = bytearray(4)
        fcntl.ioctl(descriptor, _BLKROGET, answer)
    finally:
        os.close(descriptor)
    return int.from_bytes(answer, sys.byteorder) != 0


def _run(*argv: str) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except FileNotFoundError as error:
        raise DiskFaultError(
            f"{argv[0]} is not installed (util-linux, mount, e2fsprogs)"
        ) from error
    if done.returncode != 0:
        raise DiskFaultError(
            f"`{' '.join(argv)}` failed with code {done.returncode}: {done.stderr.strip()}"
        )
    return done.stdout
