"""Keeps one broker contending for the controller role, as Kafka's ZooKeeper-mode brokers do.

Each contender watches /controller; whenever it is vacant (at start, after the controller's
session ends, or after our own new session) the contender runs ClusterMetadataStore's election
transaction. Exactly one wins, because /controller is created in the same transaction that bumps
/controller_epoch with a version check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from riverbed.coordination import layout
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.zk import ConnectionState, NodeStat, WatchHandle, ZkError

log = logging.getLogger(__name__)


class ControllerElection:
    """`is_controller` and `on_change(is_controller)` (on the loop) report the outcome."""

    def __init__(
        self,
        store: ClusterMetadataStore,
        broker_id: int,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.store = store
        self.broker_id = broker_id
        self.is_controller = False
        self._on_change = on_change
        self._handle: WatchHandle | None = None
        self._attempt: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Watch /controller; returns after the first election attempt (if it was vacant)."""
        self.store.zk.add_state_listener(self._on_state)
        self._handle = await self.store.zk.watch_data(layout.CONTROLLER_PATH, self._on_controller)
        if self._attempt is not None:
            await asyncio.shield(self._attempt)

    async def stop(self) -> None:
        self.store.zk.remove_state_listener(self._on_state)
        if self._handle is not None:
            self._handle.cancel()
        if self._attempt is not None:
            self._attempt.cancel()
            await asyncio.gather(self._attempt, return_exceptions=True)
        self._set(False)

    def _on_controller(self, data: bytes | None, stat: NodeStat | None) -> None:
        if data is None:
            self._set(False)
            self._try_to_elect()
        elif stat is not None and stat.ephemeral_owner != self.store.zk.session_id:
            self._set(False)
        elif not self.is_controller:
            # Ours, but we never heard that our election won (its answer was lost with the
            # connection): claim it, or the cluster would have a controller that never acts.
            self._try_to_elect()

    def _try_to_elect(self) -> None:
        if self._attempt is None or self._attempt.done():
            self._attempt = asyncio.get_running_loop().create_task(self._elect())

    def _on_state(self, state: ConnectionState) -> None:
        if state is ConnectionState.LOST:
            self._set(False)  # our /controller, if any, went with the session

    async def _elect(self) -> None:
        try:
            won = await self.store.elect_controller(self.broker_id)
        except ZkError:
            # Disconnected mid-election: the watch re-reads /controller when we are back.
            log.warning("controller election by broker %d failed", self.broker_id, exc_info=True)
            return
        self._set(won)

    def _set(self, is_controller: bool) -> None:
        if is_controller != self.is_controller:
            self.is_controller = is_controller
            if self._on_change is not None:
                self._on_change(is_controller)
