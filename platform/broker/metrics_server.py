"""Serves the broker's Prometheus metrics over HTTP (`GET /metrics`) on the event loop.

Not prometheus_client's own server: that one runs in a thread, and the scrape-time collector
(riverbed.broker.metrics_state) reads broker state that only the event loop may touch. Every
connection answers one request and closes; a request head is bounded in size and time, so a
slow or hostile client holds one connection, never the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

REQUEST_HEAD_BYTES_MAX: Final = 8 * 1024
REQUEST_TIMEOUT_S: Final = 10.0
METRICS_PATH: Final = "/metrics"


class MetricsServer:
    """Owned by the broker: `start()` binds, `stop()` closes the listener and its connections."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one the kernel chose for 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self._host, self._port, reuse_address=True, limit=REQUEST_HEAD_BYTES_MAX
        )
        log.info("metrics on http://%s:%d%s", self._host, self.port, METRICS_PATH)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
                status, content_type, body = self._answer(head)
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError) as error:
            log.debug("metrics connection ended: %r", error)
        except asyncio.LimitOverrunError:
            log.debug("metrics request head over %d bytes", REQUEST_HEAD_BYTES_MAX)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _answer(self, head: bytes) -> tuple[str, str, bytes]:
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or parts[0] != "GET":
            return "405 Method Not Allowed", "text/plain", b"GET /metrics\n"
        if parts[1].split("?", 1)[0] != METRICS_PATH:
            return "404 Not Found", "text/plain", b"GET /metrics\n"
        return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
