"""Connection floods and slow clients against a real broker: max.connections,
max.connections.per.ip (and its overrides), connections.max.idle.ms. Loopback has a whole /8, so
a flood can come from 127.0.0.2 while a well-behaved client uses 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from riverbed import Consumer, Producer, TopicPartition
from riverbed.protocol import messages as m
from riverbed.protocol.connection import ClientConnection

from tests.support.broker import HOST, BrokerFactory

FLOOD_HOST: Final = "127.0.0.2"
TIMEOUT_S: Final = 30.0


def connect(port: int, source: str = HOST) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=5, source_address=(source, 0))
    sock.settimeout(5)
    return sock


def closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    """Whether the broker closes `sock` within `within_s` (EOF or reset)."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@contextmanager
def flood(port: int, count: int, source: str = FLOOD_HOST) -> Iterator[list[socket.socket]]:
    sockets = [connect(port, source) for _ in range(count)]
    try:
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


async def round_trip(bootstrap: str, topic: str, count: int) -> None:
    """Produce `count` records and read them back: the broker still serves this client."""
    async with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=0) as producer:
        for index in range(count):
            await producer.send(topic, str(index).encode(), partition=0)
        await producer.flush()
    async with Consumer(bootstrap_servers=bootstrap) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        seen = 0
        async with asyncio.timeout(TIMEOUT_S):
            while seen < count:
                batches = await consumer.getmany(timeout_ms=500)
                seen += sum(len(records) for records in batches.values())


async def test_a_flood_from_one_address_is_capped_and_others_are_served(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(
        {"max.connections.per.ip": "1000", "max.connections.per.ip.overrides": f"{FLOOD_HOST}:100"}
    )
    with flood(broker.port, 400) as sockets:
        kept = await asyncio.to_thread(which_served, sockets)
        assert sum(kept) == 100
        assert kept[:100] == [True] * 100  # the first ones in are the ones kept
        await round_trip(broker.bootstrap, "served", 500)
    # Once the flood's connections are gone, the address may connect again.
    with flood(broker.port, 100) as sockets:
        assert sum(await asyncio.to_thread(which_served, sockets)) == 100


def served(sock: socket.socket) -> bool:
    """Whether the broker answers an ApiVersions request on `sock` (it closes a refused one)."""
    _, request = ClientConnection(client_id="count").send_request(m.ApiVersionsRequest(), 0)
    try:
        sock.sendall(request)
        _receive_frame(sock)
    except (AssertionError, OSError):
        return False
    return True


def which_served(socks: list[socket.socket]) -> list[bool]:
    """Which of `socks` the broker serves: each is asked until it answers or is closed (a
    connection refused is closed once the broker gets to it, however late)."""
    return [served(sock) for sock in socks]


def last_place(port: int, attempts: int = 50) -> socket.socket:
    """A connection the broker serves. wait_ready's probe connection holds a place until the
    broker has seen it close; until then, a new connection in the last place is refused."""
    for _ in range(attempts):
        sock = connect(port, FLOOD_HOST)
        if served(sock):
            return sock
        sock.close()
        time.sleep(0.1)
    raise AssertionError(f"no connection was served in {attempts} attempts")


async def test_max_connections_counts_every_address(broker_factory: BrokerFactory) -> None:
    broker = broker_factory({"max.connections": "20"})
    with flood(broker.port, 19) as sockets:
        sockets.append(await asyncio.to_thread(last_place, broker.port))
        extra = connect(broker.port)
        assert closed_by_peer(extra, 5.0)
        extra.close()
    # Freed: a client connects and works.
    await round_trip(broker.bootstrap, "after-flood", 10)


async def test_idle_and_slow_loris_connections_are_closed(broker_factory: BrokerFactory) -> None:
    broker = broker_factory({"connections.max.idle.ms": "1500"})
    idle = connect(broker.port)
    loris = connect(broker.port)
    silent_ports = {idle.getsockname()[1], loris.getsockname()[1]}
    started = time.monotonic()
    # A frame announcing 1000 bytes, trickled one byte every 200 ms: never a complete request.
    frame_head = struct.pack(">i", 1000)

    def trickle() -> float:
        for byte in frame_head + b"\x00" * 20:
            try:
                loris.sendall(bytes([byte]))
            except OSError:
                return time.monotonic() - started
            if closed_by_peer(loris, 0.2):
                return time.monotonic() - started
        return float("inf")

    loris_closed_s = await asyncio.to_thread(trickle)
    assert 1.0 <= loris_closed_s <= 4.5
    assert await asyncio.to_thread(closed_by_peer, idle, 3.0)
    idle.close()
    loris.close()
    # A consumer long-polling (requests every fetch.max.wait.ms) is never idle.
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all") as producer:
        await producer.send("quiet", b"early", partition=0)
        await producer.flush()
        async with Consumer(bootstrap_servers=broker.bootstrap, fetch_max_wait_ms=400) as consumer:
            consumer.assign([TopicPartition("quiet", 0)])
            await consumer.seek_to_end()
            assert await consumer.getmany(timeout_ms=4000) == {}  # 10 polls, nothing new
            await producer.send("quiet", b"late", partition=0)
            got: list[bytes | None] = []
            async with asyncio.timeout(TIMEOUT_S):
                while not got:
                    batches = await consumer.getmany(timeout_ms=500)
                    got = [r.value for records in batches.values() for r in records]
            assert got == [b"late"]
    # The two silent connections were logged as closed for idleness. (The clients' spare
    # connections idle for 4 s were closed too, as Kafka does; clients reconnect on demand.)
    idle_lines = [line for line in broker.log_tail(400).splitlines() if "connection_idle" in line]
    assert all(any(f", {port})" in line for line in idle_lines) for port in silent_ports)


def _receive_frame(sock: socket.socket) -> bytes:
    head = sock.recv(4, socket.MSG_WAITALL)
    assert len(head) == 4, "the broker closed the connection"
    (size,) = struct.unpack(">i", head)
    body = sock.recv(size, socket.MSG_WAITALL)
    assert len(body) == size, "the broker closed the connection"
    return body


async def test_a_long_poll_longer_than_the_idle_time_is_not_idleness(
    broker_factory: BrokerFactory,
) -> None:
    """A fetch parked for longer than connections.max.idle.ms keeps its connection (and the
    broker does not spin on the idle clock meanwhile); answered and then silent, the
    connection is closed the idle time after the answer, not at once (the clock had been
    running from the request: the connection was closed as soon as the answer was written)."""
    broker = broker_factory({"connections.max.idle.ms": "1000"})
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all") as producer:
        await producer.send_and_wait("parked", b"only", partition=0)
    parked_ms = 2500
    fetch = m.FetchRequest(
        max_wait_ms=parked_ms,
        min_bytes=1,
        max_bytes=1024 * 1024,
        topics=[
            m.FetchRequest.FetchTopic(
                topic="parked",
                partitions=[
                    m.FetchRequest.FetchPartition(
                        partition=0, fetch_offset=1, partition_max_bytes=1024 * 1024
                    )
                ],
            )
        ],
    )
    _, request = ClientConnection(client_id="long-poll").send_request(fetch, 4)
    sock = connect(broker.port)
    try:
        cpu_before_s = broker.cpu_seconds()
        started = time.monotonic()
        sock.sendall(request)
        sock.settimeout(parked_ms / 1000 + 10)
        await asyncio.to_thread(_receive_frame, sock)  # the empty answer, after the long poll
        assert parked_ms / 1000 - 0.2 <= time.monotonic() - started < parked_ms / 1000 + 3
        # An idle check spinning on a deadline already past would burn the whole wait.
        assert broker.cpu_seconds() - cpu_before_s < 1.0
        answered = time.monotonic()
        assert await asyncio.to_thread(closed_by_peer, sock, 5.0)
        assert 0.8 <= time.monotonic() - answered < 4.0
    finally:
        sock.close()
