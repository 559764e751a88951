"""The identity of a data directory: which cluster and broker its logs belong to.

Like Kafka's `meta.properties`: a data dir written by broker 1 of cluster A must never be served
by broker 2, or by a broker pointed at another cluster (a wrong ZooKeeper chroot would otherwise
make every local log look like a deleted topic and get removed).
"""

from __future__ import annotations

from pathlib import Path

from riverbed.common.fileio import write_atomically

META_FILE = "meta.properties"


class DataDirMismatchError(ValueError):
    """The data dir belongs to another cluster or broker; the message says which."""


def check_data_dir_identity(data_dir: Path, *, cluster_id: str, broker_id: int) -> None:
    """Write meta.properties on first use; afterwards refuse a different cluster or broker id."""
    path = data_dir / META_FILE
    if not path.exists():
        write_atomically(
            path, f"version=0\ncluster.id={cluster_id}\nbroker.id={broker_id}\n".encode()
        )
        return
    props = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    if props.get("cluster.id") != cluster_id:
        raise DataDirMismatchError(
            f"{data_dir} belongs to cluster {props.get('cluster.id')!r}, but ZooKeeper holds "
            f"cluster {cluster_id!r}: wrong --zookeeper address or chroot?"
        )
    if props.get("broker.id") != str(broker_id):
        raise DataDirMismatchError(
            f"{data_dir} belongs to broker {props.get('broker.id')}, not broker {broker_id}"
        )
