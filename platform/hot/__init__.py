"""The hot tier: each partition's recent log on this broker's disk, and its replication.

- `storage`: the local log and what maintains it — segments, indexes, recovery, checkpoints,
  producer state, leader epochs, compaction and retention. Knows nothing of replicas.
- `replication`: hosted partitions with their leader/follower role, the ISR, the follower's
  replica fetcher and its quota. Built on `storage`.
- `local_log`: what layers above (the cold tier) may see of a partition's local log: Protocols
  and the values they return, so they never depend on the classes behind them.
"""
