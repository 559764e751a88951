"""Crash safety of the cleaner's segment swap: a crash at any step of a pass leaves a log that,
once opened again, reads exactly as before the pass or exactly as after it.

In-process: every file-system step of the swap (riverbed.hot.storage.cleaner_swap) in turn raises a
`Crash` that nothing catches, the log object is abandoned without closing, and the directory is
opened afresh (with recovery, as after an unclean shutdown). Then one real crash: a child
process SIGKILLs itself right after the swap marker is written."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from riverbed.hot.storage import cleaner_swap
from riverbed.hot.storage.cleaner import clean_log
from riverbed.protocol.compression import CompressionType

from tests.hot.test_compaction import (
    NOW_MS,
    UNLIMITED,
    KeyedRecord,
    Model,
    as_model,
    compacted,
    open_log,
    read_all,
    write,
)


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler on the way catches it."""


def build_log(directory: Path) -> dict[int, KeyedRecord]:
    """A log of several segments where most records are overwritten; returns what it reads."""
    log = open_log(directory)
    model = Model()
    for round_ in range(25):
        records: list[KeyedRecord] = [
            (b"k%d" % (i % 5), b"round %d value %d" % (round_, i), NOW_MS) for i in range(5)
        ]
        write(log, model, records, CompressionType.ZSTD if round_ % 2 else CompressionType.NONE)
    contents = as_model(read_all(log))
    log.close()
    return contents


def cleaned_copy(source: Path, target: Path) -> dict[int, KeyedRecord]:
    shutil.copytree(source, target)
    log = open_log(target)
    result = clean_log(log, compacted(), UNLIMITED, now_ms=NOW_MS)
    assert result is not None, "the pass must swap several groups"
    assert len(result.groups) >= 2, "the pass must swap several groups"
    contents = as_model(read_all(log))
    log.close()
    return contents


class StepCounter:
    """Wraps the swap's file-system calls; the `crash_at`-th call raises Crash instead."""

    def __init__(self, crash_at: int) -> None:
        self.crash_at = crash_at
        self.calls = 0

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.crash_at:
                raise Crash
            return function(*args, **kwargs)

        return step


def test_a_crash_at_any_step_of_the_swap_leaves_the_log_before_or_after_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = tmp_path / "original" / "topic-0"
    before = build_log(original)
    after = cleaned_copy(original, tmp_path / "clean" / "topic-0")
    assert before != after

    seen = {"before": 0, "after": 0}
    crash_at = 1
    while True:
        directory = tmp_path / f"crash-{crash_at}" / "topic-0"
        shutil.copytree(original, directory)
        counter = StepCounter(crash_at)
        log = open_log(directory)
        with monkeypatch.context() as patch:
            for name in ("write_atomically", "fsync_dir"):
                patch.setattr(cleaner_swap, name, counter.wrap(getattr(cleaner_swap, name)))
            patch.setattr(os, "replace", counter.wrap(os.replace))
            patch.setattr(Path, "unlink", counter.wrap(Path.unlink))
            try:
                clean_log(log, compacted(), UNLIMITED, now_ms=NOW_MS)
                crashed = False
            except Crash:
                crashed = True
        # The crashed log object is abandoned as a dead process would leave it.
        reopened = open_log(directory)
        contents = as_model(read_all(reopened))
        reopened.close()
        assert contents in (before, after), f"crash at step {crash_at}: a mix of old and new"
        seen["before" if contents == before else "after"] += 1
        assert not (directory / cleaner_swap.SWAP_MARKER).exists()
        assert not cleaner_swap.cleaned_dir(directory).exists()
        if not crashed:
            break
        crash_at += 1
    # Steps before the first marker leave the old log, every step after it the new one.
    assert seen["before"] >= 1, seen
    assert seen["after"] >= 5, seen


CHILD = """
import os, signal, sys
from pathlib import Path
from riverbed.hot.storage import cleaner_swap
from riverbed.hot.storage.cleaner import clean_log
from tests.hot.test_compaction import NOW_MS, UNLIMITED, compacted, open_log

real_write = cleaner_swap.write_atomically

def write_then_die(path, data):
    real_write(path, data)
    os.kill(os.getpid(), signal.SIGKILL)

cleaner_swap.write_atomically = write_then_die
log = open_log(Path(sys.argv[1]))
clean_log(log, compacted(), UNLIMITED, now_ms=NOW_MS)
"""


@pytest.mark.processes
def test_a_process_killed_right_after_the_swap_marker_reopens_with_the_new_segments(
    tmp_path: Path,
) -> None:
    original = tmp_path / "original" / "topic-0"
    build_log(original)
    after = cleaned_copy(original, tmp_path / "clean" / "topic-0")
    directory = tmp_path / "killed" / "topic-0"
    shutil.copytree(original, directory)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    assert (directory / cleaner_swap.SWAP_MARKER).exists()
    reopened = open_log(directory)
    assert as_model(read_all(reopened)) == after
    reopened.close()
