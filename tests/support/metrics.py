"""Scraping a broker process's Prometheus endpoint (`metrics.port`) the way Prometheus does.

broker = broker_factory({**with_metrics_port()})
metrics = scrape(broker)
assert metrics.value("riverbed_topic_records_in_total", topic="orders") == 1000
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from tests.support.broker import HOST, BrokerProcess

SCRAPE_TIMEOUT_S: Final = 10.0
WITH_METRICS: Final = {"metrics.port": "0"}
ENDPOINT_LINE: Final = re.compile(r"metrics on http://[^:]+:(\d+)/metrics")
# The broker's last start-up event, logged once its metrics endpoint (if any) is up.
STARTED_EVENT: Final = "broker.started"
STARTED_WAIT_S: Final = 30.0
LOG_POLL_S: Final = 0.02


def metrics_port(broker: BrokerProcess) -> int:
    """The port the broker's current start logged for its endpoint; LookupError if none.

    A broker accepts connections before its metrics endpoint is up (the endpoint starts last,
    just before the `broker.started` event), so this reads the log until that event is in it.
    """
    deadline = time.monotonic() + STARTED_WAIT_S
    while True:
        text = broker.log_path.read_text()
        found = ENDPOINT_LINE.findall(text)
        if found:
            return int(found[-1])
        if STARTED_EVENT in text or time.monotonic() > deadline:
            raise LookupError(f"broker {broker.broker_id} logged no metrics endpoint")
        time.sleep(LOG_POLL_S)


def metrics_url(broker: BrokerProcess, path: str = "/metrics") -> str:
    return f"http://{HOST}:{metrics_port(broker)}{path}"


@dataclass(frozen=True)
class Scrape:
    """Every sample of one scrape: (sample name, sorted labels) -> value."""

    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]

    def value(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels; KeyError naming it if there is none."""
        key = (name, tuple(sorted(labels.items())))
        if key not in self.samples:
            raise KeyError(f"no sample {name}{labels} in the scrape")
        return self.samples[key]


def scrape(broker: BrokerProcess) -> Scrape:
    with urllib.request.urlopen(metrics_url(broker), timeout=SCRAPE_TIMEOUT_S) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return Scrape(samples)
