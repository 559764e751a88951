"""What authorization costs a request, measured in-process with timeit (no broker, no network).

- **off** (no `authorizer.class.name`, the default): what every Produce and Fetch now does in
  addition to before: `BrokerContext.access()` returning the shared ALLOW_ALL, and the
  handler's batched check of the request's topics (an empty answer at once).
- **on**: one ACL decision (`AclAccess.allows`, as a handler makes it once per topic of a
  request) against snapshots of 10 to 100,000 bindings (--quick: 10,000), for a literal ALLOW,
  a prefixed ALLOW (the topic is covered by prefixes of ten lengths), a refusal (no ACL names
  the topic) and a super user; each both "cold" (the authorizer's first decision of its kind
  on a snapshot: the index walked) and as repeated requests get it (remembered); and the whole
  per-request work of a one-topic Produce (Access made, topics checked).

Each figure is the best of `REPEATS` timeit runs of `LOOPS` calls, in microseconds per call.
"""

from __future__ import annotations

import logging
import timeit
from typing import Any, Final

from riverbed.broker.handlers import fetch as fetch_handler
from riverbed.broker.handlers import produce as produce_handler
from riverbed.broker.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.security.access import AclAccess
from riverbed.security.acl import (
    AclEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from riverbed.security.acl_snapshot import AclSnapshot
from riverbed.security.authorizer import Authorizer, AuthorizerSettings
from riverbed.security.session import KafkaPrincipal, Session

from bench.options import BenchOptions, BenchResult, Headline, Ratio

NAME = "authorizer"
SIZES_FULL: Final = (10, 1_000, 100_000)
SIZES_QUICK: Final = (10, 1_000, 10_000)
LOOPS: Final = 20_000
REPEATS: Final = 5
TOPIC: Final = "orders-42"
SESSION: Final = Session(KafkaPrincipal("User", "alice"), "10.0.0.1")
ADMIN: Final = "User:admin"


def snapshot(size: int) -> AclSnapshot:
    """`size` bindings over many topics and principals: alice may WRITE and READ `TOPIC`, the
    prefix "orders-" is ALLOWed to bob, and the rest name other topics and users."""
    acls: dict[ResourcePattern, set[AclEntry]] = {}

    def add(pattern: ResourcePattern, principal: str, operation: AclOperation) -> None:
        entry = AclEntry(principal, "*", operation, AclPermissionType.ALLOW)
        acls.setdefault(pattern, set()).add(entry)

    add(ResourcePattern(ResourceType.TOPIC, TOPIC), "User:alice", AclOperation.WRITE)
    add(ResourcePattern(ResourceType.TOPIC, TOPIC), "User:alice", AclOperation.READ)
    for length in range(1, 11):
        prefix = "orders-42"[:length] if length <= 9 else "orders-42x"
        add(ResourcePattern(ResourceType.TOPIC, prefix, PatternType.PREFIXED), "User:bob",
            AclOperation.WRITE)  # fmt: skip
    index = 0
    while sum(len(e) for e in acls.values()) < size:
        add(ResourcePattern(ResourceType.TOPIC, f"topic-{index}"), f"User:u{index % 97}",
            AclOperation.READ)  # fmt: skip
        index += 1
    return AclSnapshot({pattern: frozenset(entries) for pattern, entries in acls.items()})


def per_call_us(statement: Any) -> float:
    best_s = min(timeit.repeat(statement, number=LOOPS, repeat=REPEATS))
    return best_s / LOOPS * 1e6


def produce_request() -> m.ProduceRequest:
    partition = m.ProduceRequest.PartitionProduceData(index=0, records=b"")
    return m.ProduceRequest(
        acks=1, topic_data=[m.ProduceRequest.TopicProduceData(TOPIC, [partition])]
    )


def fetch_request() -> m.FetchRequest:
    partition = m.FetchRequest.FetchPartition(partition=0)
    return m.FetchRequest(topics=[m.FetchRequest.FetchTopic(topic=TOPIC, partitions=[partition])])


def bare_context(authorizer: Authorizer | None) -> BrokerContext:
    """A BrokerContext holding only its authorizer: `access()` reads nothing else, nor does a
    handler's topic check when access is not enforced. A real one (BrokerContext is compiled
    with mypyc, so a stand-in object is refused) without the broker it normally describes."""
    ctx = BrokerContext.__new__(BrokerContext)
    ctx.authorizer = authorizer
    return ctx


def measure_off() -> dict[str, float]:
    ctx = bare_context(None)
    produce, fetch = produce_request(), fetch_request()

    def produce_work() -> None:
        access = BrokerContext.access(ctx, SESSION, "ProduceRequest")
        denied = produce_handler._denied_topics(produce, access)
        for topic in produce.topic_data:
            denied.get(topic.name)

    def fetch_work() -> None:
        access = BrokerContext.access(ctx, SESSION, "FetchRequest")
        wanted = fetch_handler._requested(fetch, None)
        denied = fetch_handler._denied_topics(ctx, wanted, False, -1, access)
        assert TOPIC not in denied

    return {
        "produce_request_us": per_call_us(produce_work),
        "fetch_request_us": per_call_us(fetch_work),
    }


def measure_on(size: int) -> dict[str, float]:
    acls = snapshot(size)
    authorizer = Authorizer(AuthorizerSettings(super_users=frozenset({ADMIN})), lambda: acls)
    alice = AclAccess(authorizer, SESSION, "Produce")
    bob = AclAccess(authorizer, Session(KafkaPrincipal("User", "bob"), "10.0.0.1"), "Produce")
    carol = AclAccess(authorizer, Session(KafkaPrincipal("User", "carol"), "10.0.0.1"), "Produce")
    admin = AclAccess(authorizer, Session(KafkaPrincipal("User", "admin"), "10.0.0.1"), "Produce")
    write, topic = AclOperation.WRITE, ResourceType.TOPIC
    assert alice.allows(write, topic, TOPIC)
    assert bob.allows(write, topic, TOPIC)
    assert not carol.allows(write, topic, "unnamed", log_denied=False)
    ctx = bare_context(authorizer)
    produce = produce_request()

    def produce_work() -> None:
        access = BrokerContext.access(ctx, SESSION, "ProduceRequest")
        denied = produce_handler._denied_topics(produce, access)
        for item in produce.topic_data:
            denied.get(item.name)

    def cold(principal: str, name: str) -> float:
        """A decision not remembered yet (the first of its kind on a snapshot)."""
        return per_call_us(
            lambda: authorizer._decide(acls, principal, "10.0.0.1", write, topic, name)
        )

    return {
        "literal_allow_cold_us": cold("User:alice", TOPIC),
        "prefixed_allow_cold_us": cold("User:bob", TOPIC),
        "refused_cold_us": cold("User:carol", "unnamed"),
        "literal_allow_us": per_call_us(lambda: alice.allows(write, topic, TOPIC)),
        "prefixed_allow_us": per_call_us(lambda: bob.allows(write, topic, TOPIC)),
        "refused_us": per_call_us(lambda: carol.allows(write, topic, "unnamed", log_denied=False)),
        "super_user_us": per_call_us(lambda: admin.allows(write, topic, TOPIC)),
        "produce_request_us": per_call_us(produce_work),
    }


def run(options: BenchOptions) -> BenchResult:
    logging.getLogger("riverbed.security.authorizer").setLevel(logging.INFO)
    sizes = SIZES_QUICK if options.quick else SIZES_FULL
    off = measure_off()
    on = {size: measure_on(size) for size in sizes}
    largest = on[sizes[-1]]
    headlines: list[Headline] = [
        {"label": "authorizer off: added work per Produce", "value": off["produce_request_us"],
         "unit": "us"},
        {"label": "authorizer off: added work per Fetch", "value": off["fetch_request_us"],
         "unit": "us"},
        {"label": f"one ACL check, repeated, {sizes[-1]:,} bindings",
         "value": largest["literal_allow_us"], "unit": "us"},
        {"label": f"one ACL check, first of its kind, literal ALLOW, {sizes[-1]:,} bindings",
         "value": largest["literal_allow_cold_us"], "unit": "us"},
        {"label": f"one ACL check, first of its kind, prefixed ALLOW, {sizes[-1]:,} bindings",
         "value": largest["prefixed_allow_cold_us"], "unit": "us"},
        {"label": f"one-topic Produce's authorization, {sizes[-1]:,} bindings",
         "value": largest["produce_request_us"], "unit": "us"},
    ]  # fmt: skip
    ratios: list[Ratio] = []
    return {
        "parameters": {"sizes": list(sizes), "loops": LOOPS, "repeats": REPEATS},
        "tools": {},
        "measurements": {"off": off, "on": {str(size): found for size, found in on.items()}},
        "headlines": headlines,
        "ratios": ratios,
    }


if __name__ == "__main__":
    import json
    from pathlib import Path

    result = run(BenchOptions(quick=False, work_dir=Path(".")))
    print(json.dumps(result["measurements"], indent=2))
