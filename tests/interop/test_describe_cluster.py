"""DescribeCluster (API 60) against three brokers on racks rack-1..rack-3 with the authorizer on,
through the admin clients' describe_cluster().

Which clients send API 60 is itself checked, on the wire (a RecordingProxy): kafka-python 3
sends DescribeCluster v2; librdkafka 2.16 (confluent-kafka) and aiokafka 0.14 send Metadata
instead (v10, the last version with the cluster's authorized operations, for librdkafka). So
kafka-python and Riverbed's own connection carry the API 60 checks, and the other two check
that Metadata tells the same cluster.

Clients log in over SASL_PLAINTEXT (SCRAM-SHA-512) as `admin` (a super user), `alice` (DESCRIBE
on the cluster only) or `bob` (no ACL); the brokers talk to each other on PLAINTEXT, as the
super user User:ANONYMOUS. Each answer is checked against ZooKeeper (the cluster id and the
controller) and the brokers' settings (SASL_PLAINTEXT ports and racks), and the brokers' request
counters (riverbed_requests_total) tell which API answered it.
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka.admin import AclOperation, AdminClient
from riverbed.client.connection import BrokerConnection
from riverbed.coordination import layout
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.security.acl import AclOperation as Op
from riverbed.security.client import ConnectionSecurity, SaslCredentials
from riverbed.security.session import SecurityProtocol

from tests.security.acl_support import AUTHORIZER, cluster_acl, zookeeper_acls
from tests.security.clients import User, add_user
from tests.support.broker import HOST, BrokerFactory, BrokerProcess
from tests.support.cluster import TestCluster, wait_for
from tests.support.metrics import WITH_METRICS, scrape
from tests.support.proxy import proxied_broker

with warnings.catch_warnings():  # kafka-python 3 loads its schemas with a deprecated API
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.admin

TIMEOUT_S: Final = 30.0
REQUEST_TIMEOUT_MS: Final = 20_000
SASL: Final = "SASL_PLAINTEXT"
MECHANISM: Final = "SCRAM-SHA-512"
ADMIN: Final[User] = ("admin", "admin-secret")
ALICE: Final[User] = ("alice", "alice-secret")
BOB: Final[User] = ("bob", "bob-secret")
BROKERS: Final = 3
RACKS: Final = {broker_id: f"rack-{broker_id}" for broker_id in range(1, BROKERS + 1)}
# Kafka's operations on the cluster resource, by the names both clients use.
EVERY_CLUSTER_OPERATION: Final = frozenset(
    {"CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
     "IDEMPOTENT_WRITE"}
)  # fmt: skip
DESCRIBE_CLUSTER: Final = m.DescribeClusterRequest.API_KEY
METADATA: Final = m.MetadataRequest.API_KEY


@dataclass(frozen=True)
class Secured:
    """The three brokers, and the cluster as ZooKeeper has it."""

    cluster: TestCluster
    cluster_id: str
    controller_id: int

    @property
    def sasl_bootstrap(self) -> str:
        return ",".join(b.address(SASL) for b in self.cluster.brokers.values())

    def expected_nodes(self) -> set[tuple[int, str, int, str]]:
        """(id, host, port, rack) of every broker on the SASL listener."""
        return {
            (broker_id, HOST, broker.ports[SASL], RACKS[broker_id])
            for broker_id, broker in self.cluster.brokers.items()
        }

    async def requests(self, api: str) -> float:
        """The requests of `api` ("DescribeCluster") the brokers have handled, all together."""
        brokers = list(self.cluster.brokers.values())
        counts = await asyncio.gather(*(asyncio.to_thread(_requests, b, api) for b in brokers))
        return sum(counts)


def _requests(broker: BrokerProcess, api: str) -> float:
    try:
        return scrape(broker).value("riverbed_requests_total", api=api)
    except KeyError:  # none handled yet: no sample
        return 0.0


@pytest.fixture(scope="module")
def secured(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Secured]:
    home: Path = tmp_path_factory.mktemp("describe-cluster")
    chroot = f"{zookeeper.connect_string}/describe-cluster-{uuid.uuid4().hex[:12]}"
    for user in (ADMIN, ALICE, BOB):
        add_user(chroot, user, MECHANISM)
    cluster = TestCluster(
        BROKERS,
        zk_connect=chroot,
        home=home,
        settings={
            **WITH_METRICS,
            "authorizer.class.name": AUTHORIZER,
            # The first listener, PLAINTEXT, is the brokers' own: they are User:ANONYMOUS there.
            "super.users": f"User:ANONYMOUS;User:{ADMIN[0]}",
            "sasl.enabled.mechanisms": MECHANISM,
        },
        broker_settings={broker_id: {"broker.rack": rack} for broker_id, rack in RACKS.items()},
        listeners=("PLAINTEXT", SASL),
    )
    try:
        asyncio.run(cluster.start())
        asyncio.run(_grant_alice(cluster))
        cluster_id, controller_id = asyncio.run(_from_zookeeper(chroot))
        yield Secured(cluster, cluster_id, controller_id)
    finally:
        cluster.kill_all()
        print(cluster.describe_logs())


async def _from_zookeeper(zk_connect: str) -> tuple[str, int]:
    async with AsyncZooKeeper(zk_connect) as zk:
        cluster_id, _ = await zk.get(layout.CLUSTER_ID_PATH)
        controller, _ = await zk.get(layout.CONTROLLER_PATH)
    return layout.decode_cluster_id(cluster_id), layout.decode_controller(controller)


async def _grant_alice(cluster: TestCluster) -> None:
    """DESCRIBE on the cluster for alice, once every broker shows it to her."""
    async with zookeeper_acls(cluster.zk_connect) as acls:
        await acls.add(*cluster_acl(Op.DESCRIBE, principal=f"User:{ALICE[0]}"))
    for broker in cluster.brokers.values():

        async def sees_the_grant(address: str = broker.address(SASL)) -> bool:
            answer = await riverbed_describe_cluster(address, ALICE, include_operations=True)
            return answer.cluster_authorized_operations == 1 << Op.DESCRIBE

        await wait_for(sees_the_grant, TIMEOUT_S, what="every broker to follow alice's ACL")


async def riverbed_describe_cluster(
    address: str,
    user: User,
    *,
    include_operations: bool,
    endpoint_type: int = 1,
    version: int | None = None,
) -> m.DescribeClusterResponse:
    """One DescribeCluster request on Riverbed's own connection (at `version`, else the highest
    both ends support)."""
    host, _, port = address.rpartition(":")
    security = ConnectionSecurity(
        SecurityProtocol.SASL_PLAINTEXT, sasl=SaslCredentials(MECHANISM, user[0], user[1])
    )
    connection = await BrokerConnection.open(host, int(port), security=security)
    try:
        if version is not None:
            connection._versions[DESCRIBE_CLUSTER] = version
        request = m.DescribeClusterRequest(
            include_cluster_authorized_operations=include_operations, endpoint_type=endpoint_type
        )
        return await connection.call(request, m.DescribeClusterResponse)
    finally:
        await connection.close()


# -- kafka-python: DescribeCluster -------------------------------------------------------------


def kafka_python_describe(bootstrap: str, user: User | None = None) -> dict[str, Any]:
    """kafka-python's describe_cluster(): DescribeCluster with the authorized operations and
    fenced brokers asked for (Metadata only on brokers without API 60)."""
    security: dict[str, Any] = {}
    if user is not None:
        security = {
            "security_protocol": SASL,
            "sasl_mechanism": MECHANISM,
            "sasl_plain_username": user[0],
            "sasl_plain_password": user[1],
        }
    admin = kafka.admin.KafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS, **security
    )
    try:
        described: dict[str, Any] = admin.describe_cluster()
        return described
    finally:
        admin.close()


async def test_kafka_python_describes_the_cluster_with_api_60(secured: Secured) -> None:
    before = await secured.requests("DescribeCluster")

    described = await asyncio.to_thread(kafka_python_describe, secured.sasl_bootstrap, ADMIN)

    assert await secured.requests("DescribeCluster") >= before + 1
    assert described["cluster_id"] == secured.cluster_id
    assert described["controller_id"] == secured.controller_id
    nodes = {(b["broker_id"], b["host"], b["port"], b["rack"]) for b in described["brokers"]}
    assert nodes == secured.expected_nodes()
    # Asked for (v2): no broker is fenced.
    assert [b["is_fenced"] for b in described["brokers"]] == [False] * BROKERS
    assert frozenset(described["authorized_operations"]) == EVERY_CLUSTER_OPERATION


async def test_kafka_python_sees_the_operations_its_user_may_do(secured: Secured) -> None:
    before = await secured.requests("DescribeCluster")

    alice = await asyncio.to_thread(kafka_python_describe, secured.sasl_bootstrap, ALICE)
    bob = await asyncio.to_thread(kafka_python_describe, secured.sasl_bootstrap, BOB)

    assert await secured.requests("DescribeCluster") >= before + 2
    assert alice["authorized_operations"] == ["DESCRIBE"]
    # No DESCRIBE on the cluster: the bitfield is 0, and the cluster is described all the same
    # (Kafka's brokers refuse nobody DescribeCluster).
    assert bob["authorized_operations"] == []
    assert bob["cluster_id"] == secured.cluster_id
    assert bob["controller_id"] == secured.controller_id
    nodes = {(b["broker_id"], b["host"], b["port"], b["rack"]) for b in bob["brokers"]}
    assert nodes == secured.expected_nodes()


# -- Riverbed's connection: every version, and what no client above sends ------------------------


async def test_every_version_describes_the_same_cluster(secured: Secured) -> None:
    for broker in secured.cluster.brokers.values():
        for version in (0, 1, 2):
            answer = await riverbed_describe_cluster(
                broker.address(SASL), ALICE, include_operations=True, version=version
            )
            assert answer.error_code == ErrorCode.NONE, (broker.broker_id, version)
            assert answer.cluster_id == secured.cluster_id
            assert answer.controller_id == secured.controller_id
            nodes = {(b.broker_id, b.host, b.port, b.rack) for b in answer.brokers}
            assert nodes == secured.expected_nodes()
            assert not any(b.is_fenced for b in answer.brokers)
            assert answer.cluster_authorized_operations == 1 << Op.DESCRIBE


async def test_a_broker_refuses_to_describe_controllers(secured: Secured) -> None:
    """KIP-919's controller endpoint type, sent to a broker: MISMATCHED_ENDPOINT_TYPE, as a Kafka
    broker answers; an unknown type: UNSUPPORTED_ENDPOINT_TYPE."""
    address = secured.cluster.brokers[1].address(SASL)
    controllers = await riverbed_describe_cluster(
        address, ADMIN, include_operations=False, endpoint_type=2
    )
    unknown = await riverbed_describe_cluster(
        address, ADMIN, include_operations=False, endpoint_type=3
    )
    assert controllers.error_code == ErrorCode.MISMATCHED_ENDPOINT_TYPE
    assert controllers.brokers == []
    assert unknown.error_code == ErrorCode.UNSUPPORTED_ENDPOINT_TYPE


# -- confluent-kafka and aiokafka: Metadata, telling the same cluster ----------------------------


def confluent_describe(bootstrap: str, user: User | None = None, **options: Any) -> Any:
    security = {}
    if user is not None:
        security = {
            "security.protocol": "sasl_plaintext",
            "sasl.mechanism": MECHANISM,
            "sasl.username": user[0],
            "sasl.password": user[1],
        }
    admin = AdminClient({"bootstrap.servers": bootstrap, **security})
    return admin.describe_cluster(request_timeout=TIMEOUT_S, **options).result(TIMEOUT_S)


def operation_names(operations: list[AclOperation] | None) -> frozenset[str] | None:
    return None if operations is None else frozenset(op.name for op in operations)


async def test_confluent_kafka_describes_the_same_cluster_through_metadata(
    secured: Secured,
) -> None:
    before = await secured.requests("DescribeCluster")
    bootstrap = secured.sasl_bootstrap

    admin = await asyncio.to_thread(
        confluent_describe, bootstrap, ADMIN, include_authorized_operations=True
    )
    alice = await asyncio.to_thread(
        confluent_describe, bootstrap, ALICE, include_authorized_operations=True
    )
    bob = await asyncio.to_thread(
        confluent_describe, bootstrap, BOB, include_authorized_operations=True
    )
    unasked = await asyncio.to_thread(confluent_describe, bootstrap, ADMIN)

    for result in (admin, alice, bob, unasked):
        assert result.cluster_id == secured.cluster_id
        assert {(n.id, n.host, n.port, n.rack) for n in result.nodes} == secured.expected_nodes()
        assert result.controller.id == secured.controller_id
    assert operation_names(admin.authorized_operations) == EVERY_CLUSTER_OPERATION
    assert operation_names(alice.authorized_operations) == frozenset({"DESCRIBE"})
    assert bob.authorized_operations is None  # 0: librdkafka lists nothing
    assert unasked.authorized_operations is None
    assert await secured.requests("DescribeCluster") == before


async def test_aiokafka_describes_the_same_cluster_through_metadata(secured: Secured) -> None:
    before = await secured.requests("DescribeCluster")
    admin = AIOKafkaAdminClient(
        bootstrap_servers=secured.sasl_bootstrap,
        security_protocol=SASL,
        sasl_mechanism=MECHANISM,
        sasl_plain_username=ADMIN[0],
        sasl_plain_password=ADMIN[1],
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )
    await admin.start()
    try:
        described = await admin.describe_cluster()
    finally:
        await admin.close()

    assert described["cluster_id"] == secured.cluster_id
    assert described["controller_id"] == secured.controller_id
    nodes = {(b["node_id"], b["host"], b["port"], b["rack"]) for b in described["brokers"]}
    assert nodes == secured.expected_nodes()
    assert await secured.requests("DescribeCluster") == before


# -- which clients send API 60, on the wire ------------------------------------------------------


async def test_which_clients_send_describe_cluster(broker_factory: BrokerFactory) -> None:
    """Each client's describe_cluster() through a proxy that records every request header:
    kafka-python sends DescribeCluster at the highest version (2); librdkafka asks Metadata v10
    for the authorized operations; aiokafka sends Metadata."""
    async with proxied_broker(broker_factory, settings={"broker.rack": "r1"}) as proxy:
        bootstrap = f"{HOST}:{proxy.port}"

        def sent_since(start: int) -> set[tuple[int, int]]:
            return {(h.api_key, h.api_version) for _, h in proxy.requests[start:]}

        start = len(proxy.requests)
        described = await asyncio.to_thread(kafka_python_describe, bootstrap)
        kafka_python = sent_since(start)
        assert [b["rack"] for b in described["brokers"]] == ["r1"]

        start = len(proxy.requests)
        result = await asyncio.to_thread(
            confluent_describe, bootstrap, include_authorized_operations=True
        )
        librdkafka = sent_since(start)
        assert operation_names(result.authorized_operations) == EVERY_CLUSTER_OPERATION

        start = len(proxy.requests)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.describe_cluster()
        finally:
            await admin.close()
        aiokafka = sent_since(start)

    assert (DESCRIBE_CLUSTER, 2) in kafka_python, kafka_python
    assert {key for key, _ in librdkafka} & {DESCRIBE_CLUSTER} == set(), librdkafka
    assert (METADATA, 10) in librdkafka, librdkafka
    assert {key for key, _ in aiokafka} & {DESCRIBE_CLUSTER} == set(), aiokafka
    assert METADATA in {key for key, _ in aiokafka}, aiokafka
