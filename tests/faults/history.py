"""A fault test's history: what its clients were told and served, and what was done to the cluster.

The history is a JSON-lines file, one event per line, `kind` first:

    {"kind":"header","scenario":"partition-leader","seed":7,"t_ms":1700000000000}
    {"kind":"ack","producer":"rb-0","partition":2,"offset":17,"value":"rb-0:000123","t_ms":...}
    {"kind":"fail","producer":"ck-0","value":"ck-0:000050","error":"...","partition":1,"t_ms":...}
    {"kind":"served","consumer":"c-0","partition":2,"offset":17,"value":"rb-0:000123","t_ms":...}
    {"kind":"fault","name":"partition","detail":"broker 1 | brokers 2,3","t_ms":...}

A `fail` is a record whose producer gave up on it: definitely not written, or of unknown outcome
(a timeout); either way it may or may not be in the log. `t_ms` is the wall clock, so events of
processes in different network namespaces of one host line up.

Each event reaches the kernel (os.write on an O_APPEND descriptor) as soon as the writer's thread
takes it, so a SIGKILLed run keeps every event it had handed over but the few still queued. A
line is written whole in one write, so a workload process and the test process may append to the
same file. No fsync: the faults kill processes and break networks and broker disks, not this
machine, and the history must live off any disk a test breaks.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Final, Self, TypeVar

# Events handed to the writer and not yet written. The workload makes a few hundred a second and
# the writer thread keeps up unless the disk stalls; past this bound `write()` blocks (back
# pressure on the clients) instead of growing memory or dropping an event, which would make the
# checker judge a shorter history than the clients saw.
EVENTS_QUEUED_MAX: Final = 10_000
# Lines joined into one os.write: few enough that a write stays small (other writers' lines are
# not held up behind it), enough that a burst of events costs few system calls.
LINES_PER_WRITE_MAX: Final = 256
# An error message longer than this is cut: librdkafka's can list every broker it tried.
ERROR_CHARS_MAX: Final = 500


def now_ms() -> int:
    """The wall clock in ms: shared by every process of the host, whatever its namespace."""
    return time.time_ns() // 1_000_000


def _check_name(field: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field} must be a non-empty string, got {value!r}")


NO_OFFSET: Final = -1


def _check_index(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be an int >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Header:
    """What run this is: replaying a failure needs its scenario and seed."""

    KIND: ClassVar[str] = "header"
    scenario: str
    seed: int
    t_ms: int

    def __post_init__(self) -> None:
        _check_name("scenario", self.scenario)
        _check_index("t_ms", self.t_ms)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")


@dataclass(frozen=True, slots=True)
class Ack:
    """A producer was told `value` is at `partition`@`offset` (acks=all). `offset` is
    NO_OFFSET when the client acknowledged it without one: librdkafka does so for records of an
    earlier in-flight request once a later one of the same producer succeeded (the broker's
    sequence check proves they are in the log)."""

    KIND: ClassVar[str] = "ack"
    producer: str
    partition: int
    offset: int
    value: str
    t_ms: int

    def __post_init__(self) -> None:
        _check_name("producer", self.producer)
        _check_index("partition", self.partition)
        if self.offset != NO_OFFSET:
            _check_index("offset", self.offset)
        _check_name("value", self.value)
        _check_index("t_ms", self.t_ms)


@dataclass(frozen=True, slots=True)
class Fail:
    """A producer gave up on `value`; it may still be in the log (outcome unknown). `partition`
    is where it was sent, when the client says."""

    KIND: ClassVar[str] = "fail"
    producer: str
    value: str
    error: str
    t_ms: int
    partition: int | None = None

    def __post_init__(self) -> None:
        _check_name("producer", self.producer)
        _check_name("value", self.value)
        _check_index("t_ms", self.t_ms)
        if self.partition is not None:
            _check_index("partition", self.partition)
        if not isinstance(self.error, str):
            raise ValueError(f"error must be a string, got {self.error!r}")
        if len(self.error) > ERROR_CHARS_MAX:
            object.__setattr__(self, "error", self.error[:ERROR_CHARS_MAX] + "...")


@dataclass(frozen=True, slots=True)
class Served:
    """A live consumer was handed `value` at `partition`@`offset`."""

    KIND: ClassVar[str] = "served"
    consumer: str
    partition: int
    offset: int
    value: str
    t_ms: int

    def __post_init__(self) -> None:
        _check_name("consumer", self.consumer)
        _check_index("partition", self.partition)
        _check_index("offset", self.offset)
        _check_name("value", self.value)
        _check_index("t_ms", self.t_ms)


@dataclass(frozen=True, slots=True)
class Fault:
    """The fault schedule did something: `name` (partition, heal, kill, ...) and its target."""

    KIND: ClassVar[str] = "fault"
    name: str
    detail: str
    t_ms: int

    def __post_init__(self) -> None:
        _check_name("name", self.name)
        _check_index("t_ms", self.t_ms)


Event = Header | Ack | Fail | Served | Fault

E = TypeVar("E", Header, Ack, Fail, Served, Fault)

_KINDS: Final[Mapping[str, type[Event]]] = {
    cls.KIND: cls for cls in (Header, Ack, Fail, Served, Fault)
}


def to_line(event: Event) -> str:
    """One JSON line, newline included, `kind` first."""
    return json.dumps({"kind": event.KIND, **asdict(event)}, separators=(",", ":")) + "\n"


def from_line(line: str) -> Event:
    """The event of one JSON line; ValueError for an unknown kind or a bad field."""
    fields: Any = json.loads(line)
    if not isinstance(fields, dict):
        raise ValueError(f"an event is a JSON object, got {line!r}")
    cls = _KINDS.get(fields.pop("kind", None))
    if cls is None:
        raise ValueError(f"an event of unknown kind: {line!r}")
    try:
        return cls(**fields)
    except TypeError as error:  # a field missing or unknown
        raise ValueError(f"{error}: {line!r}") from None


class HistoryWriter:
    """Appends events to a history file from any thread; a thread of its own writes them.

    `write()` queues (blocking only past EVENTS_QUEUED_MAX) and the thread writes each event as
    soon as it takes it. `close()` writes what is queued and stops; it is idempotent.
    """

    _CLOSE: Final = object()

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=EVENTS_QUEUED_MAX)
        self._closed = False
        self._close_lock = threading.Lock()
        self.error: BaseException | None = None  # why the thread stopped writing, if it did
        self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
        self._thread.start()

    def write(self, event: Event) -> None:
        if self._closed:
            raise RuntimeError(f"the history {self.path} is closed")
        if self.error is not None:
            raise RuntimeError(f"writing the history {self.path} failed") from self.error
        self._queue.put(event)

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(self._CLOSE)
        self._thread.join()
        os.close(self._fd)
        if self.error is not None:
            raise RuntimeError(f"writing the history {self.path} failed") from self.error

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self) -> None:
        done = False
        while not done:
            lines: list[str] = []
            item = self._queue.get()
            while True:
                if item is self._CLOSE:
                    done = True
                    break
                assert isinstance(item, Header | Ack | Fail | Served | Fault)
                lines.append(to_line(item))
                if len(lines) >= LINES_PER_WRITE_MAX:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if lines and self.error is None:
                try:
                    _write_all(self._fd, "".join(lines).encode())
                except OSError as error:  # a full disk: write() says so to the next caller
                    self.error = error


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def read_history(*paths: Path | str) -> list[Event]:
    """Every event of the history files, by time (stable: a file's own order is kept for equal
    times). A last line without its newline was torn by a kill and is skipped; a bad line
    elsewhere is a ValueError naming it."""
    events: list[Event] = []
    for path in paths:
        events.extend(_read_one(Path(path)))
    if len(paths) > 1:
        events.sort(key=lambda event: event.t_ms)
    return events


def _read_one(path: Path) -> Iterator[Event]:
    text = path.read_text()
    lines = text.split("\n")
    # split leaves "" after a final newline, or the torn tail of a killed writer.
    for number, line in enumerate(lines[:-1], start=1):
        if not line:
            continue
        try:
            yield from_line(line)
        except ValueError as error:  # JSONDecodeError is one
            raise ValueError(f"{path}:{number}: {error}") from None


def of_kind(events: Iterable[Event], kind: type[E]) -> list[E]:
    """The events of one kind, in order: `of_kind(events, Fault)` is the fault schedule."""
    return [event for event in events if isinstance(event, kind)]
