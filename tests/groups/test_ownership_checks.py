"""The interop group tests' overlap check (group_support.overlapping_ownership): a kcat member's
late-stamped revocation is forgiven up to KCAT_STAMP_SLACK_S, a real double ownership is not,
and members that stamp their own events get no slack at all."""

from __future__ import annotations

from pathlib import Path

from tests.groups.group_support import (
    KCAT_STAMP_SLACK_S,
    Event,
    MemberProcess,
    overlapping_ownership,
)


def member(name: str, client: str, owned_s: tuple[float, float], tmp_path: Path) -> MemberProcess:
    """A member that owned partition 0 from owned_s[0] to owned_s[1]."""
    process = MemberProcess(name, client, tmp_path / f"{name}.log")
    process.events = [
        Event("assigned", owned_s[0], {"partitions": [0]}),
        Event("revoked", owned_s[1], {"partitions": [0]}),
    ]
    process.ended_at = owned_s[1] + 10
    return process


def test_a_kcat_revocation_stamped_a_moment_late_is_not_an_overlap(tmp_path: Path) -> None:
    late_s = KCAT_STAMP_SLACK_S / 10
    a = member("A", "kcat", (0.0, 1.0 + late_s), tmp_path)
    b = member("B", "kcat", (1.0, 2.0), tmp_path)
    assert overlapping_ownership([a, b]) == []


def test_a_partition_kept_through_a_rebalance_is_an_overlap_for_kcat_too(tmp_path: Path) -> None:
    a = member("A", "kcat", (0.0, 1.0 + 4 * KCAT_STAMP_SLACK_S), tmp_path)
    b = member("B", "kcat", (1.0, 2.0), tmp_path)
    assert len(overlapping_ownership([a, b])) == 1


def test_members_that_stamp_their_own_events_get_no_slack(tmp_path: Path) -> None:
    a = member("A", "confluent-kafka", (0.0, 1.0 + KCAT_STAMP_SLACK_S / 10), tmp_path)
    b = member("B", "confluent-kafka", (1.0, 2.0), tmp_path)
    assert len(overlapping_ownership([a, b])) == 1
