"""A member's timers (Kafka's `Heartbeat`), without I/O: when the next heartbeat is due, and whether
the session or the poll interval ran out. Times are the event loop's clock, in seconds.

- heartbeats go out every `heartbeat_interval_ms` (sooner after a failure: `retry_backoff_ms`);
- the session: no successful heartbeat for `session_timeout_ms` means the coordinator is probably
  gone (the member looks it up again; the coordinator has likely removed the member already);
- the poll interval: the application must call `getmany()` at least every
  `max_poll_interval_ms`; time spent inside `getmany()` counts as polling. Past that, the member
  leaves the group so that others take its partitions, as the Java client does.
"""

from __future__ import annotations


class HeartbeatTimers:
    def __init__(
        self,
        *,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        max_poll_interval_ms: int,
        retry_backoff_ms: int,
        now: float,
    ) -> None:
        self._session_timeout_s = session_timeout_ms / 1000
        self._interval_s = heartbeat_interval_ms / 1000
        self._max_poll_interval_s = max_poll_interval_ms / 1000
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._session_deadline = now + self._session_timeout_s
        self._next_heartbeat_at = now + self._interval_s
        self._last_poll_at = now
        self._polls_in_progress = 0

    # -- heartbeats -----------------------------------------------------------------------
    def reset(self, now: float) -> None:
        """A new generation: the session starts now, the first heartbeat is one interval away."""
        self._session_deadline = now + self._session_timeout_s
        self._next_heartbeat_at = now + self._interval_s

    def sent(self, now: float) -> None:
        self._next_heartbeat_at = now + self._interval_s

    def received(self, now: float) -> None:
        self._session_deadline = now + self._session_timeout_s

    def failed(self, now: float) -> None:
        self._next_heartbeat_at = now + self._retry_backoff_s

    def until_next_heartbeat_s(self, now: float) -> float:
        return max(0.0, self._next_heartbeat_at - now)

    def session_expired(self, now: float) -> bool:
        return now > self._session_deadline

    # -- polls ----------------------------------------------------------------------------
    def poll_started(self, now: float) -> None:
        self._polls_in_progress += 1
        self._last_poll_at = now

    def poll_ended(self, now: float) -> None:
        self._polls_in_progress -= 1
        self._last_poll_at = now

    def until_poll_expiry_s(self, now: float) -> float | None:
        """Time left before the poll interval runs out; None while a poll is in progress."""
        if self._polls_in_progress:
            return None
        return self._last_poll_at + self._max_poll_interval_s - now

    def poll_expired(self, now: float) -> bool:
        left = self.until_poll_expiry_s(now)
        return left is not None and left < 0
