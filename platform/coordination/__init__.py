"""Cluster metadata in ZooKeeper (through kazoo): brokers, topics, partition state, configs.

- `embedded_zk`: a real standalone ZooKeeper child process (Debian's package) for dev and tests.
- `zk`: `AsyncZooKeeper`, kazoo bridged into asyncio (awaitable calls, watches on the loop).
- `layout`: the znode tree (Kafka's pre-KRaft layout) and the one JSON codec for it.
- `assignment`: replica placement for new topics.
- `metadata`: `ClusterMetadataStore`, the writes (registration, election, topics, configs).
- `controller_election`: keeps a broker contending for /controller.
- `controller`: the elected controller: partition leaders and ISRs on broker loss, restart and
  controlled shutdown.
- `partition_election`: the pure election rules the controller applies.
- `metadata_cache`: `MetadataCache` (no I/O) fed by `MetadataWatcher` (owns the watches).
"""
