"""The checker's rules on small hand-made histories, the history file's round trip, and the
workload's pure helpers. No broker, no process: every history here is written out by hand."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.faults.checker import (
    EXAMPLES_MAX,
    ChangedMeaning,
    Duplicated,
    Lost,
    Misplaced,
    Position,
    Verdict,
    check,
)
from tests.faults.history import (
    ERROR_CHARS_MAX,
    NO_OFFSET,
    Ack,
    Event,
    Fail,
    Fault,
    Header,
    HistoryWriter,
    Served,
    from_line,
    of_kind,
    read_history,
    to_line,
)
from tests.faults.workload import (
    Workload,
    as_text,
    client_kind,
    load_final_log,
    write_final_log,
)

T = 1_700_000_000_000  # any wall-clock time, in ms


def ack(value: str, partition: int, offset: int, producer: str = "rb-0") -> Ack:
    return Ack(producer, partition, offset, value, T)


def fail(value: str, producer: str = "ck-0") -> Fail:
    return Fail(producer, value, "KafkaError{_MSG_TIMED_OUT}", T)


def served(value: str, partition: int, offset: int, consumer: str = "c-0") -> Served:
    return Served(consumer, partition, offset, value, T)


# Two partitions; rb-0 and ck-0 each wrote two acknowledged records.
ACKS: Sequence[Event] = (
    ack("rb-0:000000", 0, 0),
    ack("ck-0:000000", 1, 0, producer="ck-0"),
    ack("rb-0:000001", 1, 1),
    ack("ck-0:000001", 0, 1, producer="ck-0"),
)
LOG = {0: [(0, "rb-0:000000"), (1, "ck-0:000001")], 1: [(0, "ck-0:000000"), (1, "rb-0:000001")]}


def test_a_log_holding_exactly_the_acknowledged_records_is_ok() -> None:
    history = [Header("clean", 7, T), *ACKS, served("rb-0:000000", 0, 0), Fault("kill", "b1", T)]
    verdict = check(history, LOG)
    assert verdict.ok
    assert verdict == Verdict(
        acknowledged=4,
        failed=0,
        unacknowledged_present=0,
        served=1,
        acknowledged_by_producer={"rb-0": 2, "ck-0": 2},
    )


def test_an_acknowledged_value_missing_from_the_log_is_lost() -> None:
    log = {0: [(0, "rb-0:000000")], 1: LOG[1]}
    verdict = check(ACKS, log)
    assert not verdict.ok
    assert verdict.lost == (Lost("ck-0:000001", Position(0, 1)),)
    assert (verdict.duplicated, verdict.misplaced, verdict.changed_meaning) == ((), (), ())


def test_an_unacknowledged_value_in_the_log_is_allowed_and_counted() -> None:
    """Failed (timed out: unknown outcome) or in flight when the run stopped: either may have
    been written."""
    history = [*ACKS, fail("ck-0:000002"), fail("ck-0:000003")]
    log = {0: [*LOG[0], (2, "ck-0:000002"), (3, "rb-0:000002")], 1: LOG[1]}
    verdict = check(history, log)
    assert verdict.ok
    assert verdict.unacknowledged_present == 2  # ck-0:000002 failed, rb-0:000002 in flight
    assert verdict.failed == 2
    assert verdict.acknowledged == 4


def test_a_failed_value_absent_from_the_log_is_fine() -> None:
    verdict = check([*ACKS, fail("ck-0:000002")], LOG)
    assert verdict.ok
    assert (verdict.failed, verdict.unacknowledged_present) == (1, 0)


def test_a_value_both_failed_and_acknowledged_counts_as_acknowledged() -> None:
    verdict = check([*ACKS, fail("rb-0:000001", producer="rb-0")], LOG)
    assert verdict.ok
    assert (verdict.acknowledged, verdict.failed) == (4, 0)


def test_an_acknowledged_value_twice_in_the_log_is_duplicated() -> None:
    log = {0: [*LOG[0], (2, "rb-0:000000")], 1: LOG[1]}
    verdict = check(ACKS, log)
    assert verdict.duplicated == (
        Duplicated("rb-0:000000", (Position(0, 0), Position(0, 2)), acknowledged=True),
    )
    assert verdict.misplaced == ()  # one copy is where it was acknowledged
    assert not verdict.ok


def test_a_duplicate_of_an_unacknowledged_value_is_still_a_duplicate() -> None:
    """A retry the broker failed to de-duplicate, whether or not its producer heard back."""
    log = {0: [*LOG[0], (2, "ck-0:000002")], 1: [*LOG[1], (2, "ck-0:000002")]}
    verdict = check([*ACKS, fail("ck-0:000002")], log)
    assert verdict.duplicated == (
        Duplicated("ck-0:000002", (Position(0, 2), Position(1, 2)), acknowledged=False),
    )
    assert verdict.unacknowledged_present == 1
    assert not verdict.ok


def test_acknowledged_values_at_other_offsets_are_misplaced() -> None:
    """Both present, but in the other order than acknowledged."""
    log = {0: [(0, "ck-0:000001"), (1, "rb-0:000000")], 1: LOG[1]}
    verdict = check(ACKS, log)
    assert verdict.misplaced == (
        Misplaced("ck-0:000001", Position(0, 1), (Position(0, 0),)),
        Misplaced("rb-0:000000", Position(0, 0), (Position(0, 1),)),
    )
    assert verdict.lost == ()
    assert not verdict.ok


def test_an_acknowledged_value_on_another_partition_is_misplaced() -> None:
    log = {0: [(0, "rb-0:000000"), (1, "ck-0:000001")], 1: [(0, "ck-0:000000")], 2: []}
    log[1].append((1, "x"))
    log[2].append((0, "rb-0:000001"))
    verdict = check(ACKS, log)
    assert verdict.misplaced == (Misplaced("rb-0:000001", Position(1, 1), (Position(2, 0),)),)
    assert verdict.unacknowledged_present == 1  # "x"


def test_a_value_acknowledged_without_an_offset_is_judged_by_its_partition() -> None:
    """librdkafka acknowledges records of an earlier in-flight request without an offset once a
    later one succeeded: present once in its partition is fine, absent is lost, twice is a
    duplicate, on another partition is misplaced."""
    implicit = [ack("ck-0:000007", 1, NO_OFFSET, "ck-0")]
    assert check(implicit, {1: [(0, "ck-0:000007")]}).ok
    assert [x.value for x in check(implicit, {1: []}).lost] == ["ck-0:000007"]
    twice = check(implicit, {1: [(0, "ck-0:000007"), (1, "ck-0:000007")]})
    assert [x.value for x in twice.duplicated] == ["ck-0:000007"]
    assert twice.misplaced == ()
    elsewhere = check(implicit, {0: [(0, "ck-0:000007")], 1: []})
    assert [x.value for x in elsewhere.misplaced] == ["ck-0:000007"]


def test_a_duplicate_with_no_copy_at_its_acknowledged_offset_is_also_misplaced() -> None:
    log = {0: [(0, "x"), (1, "ck-0:000001"), (2, "rb-0:000000"), (3, "rb-0:000000")], 1: LOG[1]}
    verdict = check(ACKS, log)
    assert [d.value for d in verdict.duplicated] == ["rb-0:000000"]
    assert [m.value for m in verdict.misplaced] == ["rb-0:000000"]


def test_a_served_offset_holding_another_value_now_changed_meaning() -> None:
    history = [*ACKS, served("rb-0:000000", 0, 0), served("lost-in-a-truncation", 0, 1)]
    verdict = check(history, LOG)
    assert verdict.changed_meaning == (
        ChangedMeaning("c-0", Position(0, 1), "lost-in-a-truncation", "ck-0:000001"),
    )
    assert not verdict.ok


def test_a_served_offset_no_longer_in_the_log_changed_meaning() -> None:
    """Served above a high watermark that a new leader then truncated."""
    history = [*ACKS, served("rb-0:000009", 1, 2), served("rb-0:000009", 1, 2, consumer="c-1")]
    verdict = check(history, LOG)
    assert verdict.changed_meaning == (ChangedMeaning("c-0", Position(1, 2), "rb-0:000009", None),)
    assert verdict.served == 2


def test_records_served_again_as_they_are_in_the_log_are_fine() -> None:
    history = [*ACKS, *(served(v, p, o) for p, rs in LOG.items() for o, v in rs)] * 2
    verdict = check(history, LOG)
    assert verdict.ok
    assert verdict.served == 8


def test_a_final_log_whose_offsets_do_not_rise_is_refused() -> None:
    """That is the reader's bug, not the broker's: it must not pass for a duplicate."""
    with pytest.raises(ValueError, match="offset 0 after 0"):
        check(ACKS, {0: [(0, "a"), (0, "a")]})


def test_the_report_shows_the_findings_the_seed_and_the_fault_schedule() -> None:
    values = [f"rb-0:{i:06d}" for i in range(EXAMPLES_MAX + 3)]
    history = [ack(value, 0, offset) for offset, value in enumerate(values)]
    schedule = [Fault("partition", "b1 | b2,b3", T), Fault("heal", "all", T + 2_500)]
    verdict = check([*history, *schedule], {0: []})
    report = verdict.report(of_kind([*history, *schedule], Fault), seed=424242)
    assert report.startswith("FAILED: lost 13, duplicated 0, misplaced 0, changed meaning 0;")
    assert "acknowledged 13 (rb-0 13)" in report
    assert f"lost ({EXAMPLES_MAX + 3}):" in report
    assert "rb-0:000009: acknowledged at p0@9, not in the log" in report
    assert "rb-0:000010" not in report  # past EXAMPLES_MAX
    assert "... and 3 more" in report
    assert "seed: 424242" in report
    assert "+   0.000 s  partition  b1 | b2,b3" in report
    assert "+   2.500 s  heal  all" in report


def test_an_ok_report_still_names_the_seed() -> None:
    report = check(ACKS, LOG).report([], seed=1)
    assert report.startswith("ok:")
    assert "seed: 1" in report
    assert "fault schedule (0 events):" in report


# -- the history file -------------------------------------------------------------------------


def test_every_event_round_trips_through_its_line() -> None:
    events: list[Event] = [
        Header("s", -3, T),
        *ACKS,
        fail("ck-0:000009"),
        Fail("ck-0", "v", "e", T, partition=2),
        served("v", 1, 5),
        Fault("kill", "", T),
    ]
    for event in events:
        line = to_line(event)
        assert line.endswith("\n")
        assert line.startswith(f'{{"kind":"{event.KIND}"')
        assert from_line(line) == event


@pytest.mark.parametrize(
    "line",
    [
        '{"kind":"ack","producer":"rb-0","partition":-1,"offset":0,"value":"v","t_ms":1}',
        '{"kind":"ack","producer":"rb-0","partition":0,"offset":0,"value":"","t_ms":1}',
        '{"kind":"served","consumer":"c-0","partition":0,"value":"v","t_ms":1}',
        '{"kind":"ack","producer":"rb-0","partition":0,"offset":0,"value":"v","t_ms":1,"x":1}',
        '{"kind":"nope","t_ms":1}',
        "[1, 2]",
        "not json",
    ],
)
def test_a_bad_line_is_refused(line: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the messages differ: the kind is the promise
        from_line(line)


def test_a_long_error_is_cut() -> None:
    assert len(Fail("p", "v", "x" * 10_000, T).error) == ERROR_CHARS_MAX + 3


def test_writers_in_several_threads_and_two_files_read_back_in_time_order(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    faults = tmp_path / "faults.jsonl"
    threads_max, events_each = 4, 500

    with HistoryWriter(path) as writer, HistoryWriter(faults) as fault_writer:
        fault_writer.write(Fault("partition", "b1", T + 1))

        def write(thread: int) -> None:
            for offset in range(events_each):
                writer.write(Ack(f"p-{thread}", 0, offset, f"p-{thread}:{offset}", T + 2 * offset))

        workers = [threading.Thread(target=write, args=(i,)) for i in range(threads_max)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    events = read_history(path, faults)
    assert len(events) == threads_max * events_each + 1
    assert [e.t_ms for e in events] == sorted(e.t_ms for e in events)
    assert events[threads_max] == Fault("partition", "b1", T + 1)  # after the T + 0 acks
    for thread in range(threads_max):  # each thread's events in the order written
        offsets = [e.offset for e in of_kind(events, Ack) if e.producer == f"p-{thread}"]
        assert offsets == list(range(events_each))


def test_a_torn_last_line_is_skipped_and_a_bad_line_elsewhere_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.write(ACKS[0])
        writer.write(ACKS[1])
    with path.open("a") as file:
        file.write(to_line(ACKS[2])[:20])  # a kill in the middle of a write
    assert read_history(path) == list(ACKS[:2])
    with path.open("a") as file:
        file.write("\n" + to_line(ACKS[3]))
    with pytest.raises(ValueError, match=r"history.jsonl:3:"):
        read_history(path)


def test_a_closed_writer_refuses_events_and_closes_once(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path / "history.jsonl")
    writer.close()
    writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.write(ACKS[0])


# -- the workload's pure parts ------------------------------------------------------------------


def test_a_final_log_round_trips_through_its_json_file(tmp_path: Path) -> None:
    path = tmp_path / "final-log.json"
    write_final_log(LOG, path)
    assert load_final_log(path) == LOG


@pytest.mark.parametrize(
    ("name", "kind"), [("rb-0", "rb"), ("ck-12", "ck"), ("c-1", "c"), ("run-2-rb-3", "rb")]
)
def test_a_client_name_tells_its_kind_with_or_without_a_tag(name: str, kind: str) -> None:
    assert client_kind(name) == kind


def test_a_value_is_never_empty_in_the_history() -> None:
    assert [as_text(None), as_text(b""), as_text(b"rb-0:1"), as_text(b"\xff")] == [
        "<null>",
        "<empty>",
        "rb-0:1",
        "\ufffd",
    ]


def test_a_workload_needs_a_producer() -> None:
    with pytest.raises(ValueError, match="at least one producer"):
        Workload("127.0.0.1:1", "t", "h", seed=1, producers_riverbed=0, producers_confluent=0)
