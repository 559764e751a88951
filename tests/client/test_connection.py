"""BrokerConnection against a real broker: requests written at once, answered in order, and
timed out as Kafka's clients time them out (the late request fails, the connection shuts)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from riverbed.client.connection import BrokerConnection, ConnectionClosedError
from riverbed.protocol import messages as m

from tests.support.broker import BrokerProcess


async def _open(broker: BrokerProcess) -> BrokerConnection:
    host, port = broker.bootstrap.rsplit(":", 1)
    return await BrokerConnection.open(host, int(port))


async def test_send_nowait_answers_every_request_in_order(broker: BrokerProcess) -> None:
    connection = await _open(broker)
    try:
        futures = [
            connection.send_nowait(m.MetadataRequest(topics=[]), timeout_ms=5_000)
            for _ in range(20)
        ]
        assert connection.in_flight_count == 20  # all written, none awaited yet
        responses = await asyncio.gather(*futures)
        assert all(isinstance(r, m.MetadataResponse) for r in responses)
        assert connection.in_flight_count == 0
    finally:
        await connection.close()


async def test_a_late_answer_times_out_its_request_and_shuts_the_connection(
    broker: BrokerProcess,
) -> None:
    connection = await _open(broker)
    os.kill(broker.pid, signal.SIGSTOP)  # takes the bytes, answers nothing
    try:
        first = connection.send_nowait(m.MetadataRequest(topics=[]), timeout_ms=300)
        second = connection.send_nowait(m.MetadataRequest(topics=[]), timeout_ms=60_000)
        with pytest.raises(TimeoutError, match="no response to MetadataRequest within 300 ms"):
            await asyncio.wait_for(first, timeout=5)
        # The stream's state is unknown after a missing answer: the others fail with it.
        with pytest.raises(ConnectionClosedError):
            await second
        assert connection.closed
        with pytest.raises(ConnectionClosedError):
            connection.send_nowait(m.MetadataRequest(topics=[]), timeout_ms=300)
    finally:
        os.kill(broker.pid, signal.SIGCONT)
        await connection.close()


async def test_request_still_times_out_with_timeout_error(broker: BrokerProcess) -> None:
    connection = await _open(broker)
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                connection.request(m.MetadataRequest(topics=[]), timeout_ms=300), timeout=5
            )
        assert connection.closed
    finally:
        os.kill(broker.pid, signal.SIGCONT)
        await connection.close()


async def test_a_cancelled_request_leaves_the_connection_usable(broker: BrokerProcess) -> None:
    connection = await _open(broker)
    try:
        waiting = asyncio.ensure_future(
            connection.request(m.MetadataRequest(topics=[]), timeout_ms=5_000)
        )
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        response = await connection.request(m.MetadataRequest(topics=[]), timeout_ms=5_000)
        assert isinstance(response, m.MetadataResponse)
        assert connection.in_flight_count == 0
    finally:
        await connection.close()
