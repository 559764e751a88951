"""What the consumer's parts report, recorded: a `ConsumerEvents` for testing a part alone."""

from __future__ import annotations

from collections import Counter


class RecordedEvents:
    """Counts each event a fetch driver or offset resetter sends, and keeps their errors."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.failures: list[BaseException] = []
        self.crashes: list[BaseException] = []

    def readable(self) -> None:
        self.counts["readable"] += 1

    def fetch_due(self) -> None:
        self.counts["fetch_due"] += 1

    def reset_due(self) -> None:
        self.counts["reset_due"] += 1

    def failed(self, error: BaseException) -> None:
        self.failures.append(error)

    def crashed(self, error: BaseException) -> None:
        self.crashes.append(error)
