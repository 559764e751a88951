"""Replication of the hot tier: a partition's leader and followers (Kafka's ReplicaManager side).

- `partitions`: `Partition` (a hosted replica: its log, its role, waiters on the high watermark)
  and `PartitionManager`, the partitions of one broker.
- `followers`: the leader's view of each follower's fetch state.
- `isr`: the ISR writes of the partitions this broker leads.
- `replica_fetcher`, `quota`, `inter_broker`: the follower's fetchers, their replication
  throttle, and the connections they dial to other brokers.
"""
