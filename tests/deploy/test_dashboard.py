"""deploy/grafana/riverbed-brokers.json against the metrics the broker declares: every query names
a metric that exists, with the sample suffix its type has, and every metric is on the dashboard.
(No Grafana here: the queries were never run by one; tests/broker/test_metrics.py and the tiering
tests check the metrics themselves on real brokers.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

from riverbed.broker.metrics import BrokerMetrics

REPO: Final = Path(__file__).resolve().parents[2]
DASHBOARD: Final = REPO / "deploy" / "grafana" / "riverbed-brokers.json"
METRIC_NAME: Final = re.compile(r"\briverbed_[a-z_]+")
# Families collected at scrape time, declared in this file by their string literals.
STATE_SOURCE: Final = REPO / "platform" / "broker" / "metrics_state.py"


def declared_families() -> dict[str, str]:
    """Family name -> type ("counter", "gauge", "histogram")."""
    families = {metric.name: metric.type for metric in BrokerMetrics().registry.collect()}
    source = STATE_SOURCE.read_text()
    for kind, name in re.findall(r"(Counter|Gauge)MetricFamily\(\s*\"(riverbed_[a-z_]+)\"", source):
        families[name] = kind.lower()
    return families


def sample_names(families: dict[str, str]) -> set[str]:
    """The sample names Prometheus stores for each family."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}
    return {name + suffix for name, kind in families.items() for suffix in suffixes[kind]}


def queries() -> list[str]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_every_query_names_a_sample_the_broker_exposes() -> None:
    exposed = sample_names(declared_families())
    for expr in queries():
        used = set(METRIC_NAME.findall(expr))
        assert used, expr
        assert used <= exposed, f"{expr}: {sorted(used - exposed)} not exposed"


def test_every_metric_is_on_the_dashboard() -> None:
    families = declared_families()
    assert len(families) >= 20  # the collector's literals were found
    used = {name for expr in queries() for name in METRIC_NAME.findall(expr)}
    shown = {
        family
        for family in families
        if any(name == family or name.startswith(family + "_") for name in used)
    }
    assert shown == set(families), sorted(set(families) - shown)
