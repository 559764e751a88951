"""The local log of one partition on disk, and the jobs that keep it (Kafka's `storage` module).

- `segment`, `index`: one segment's .log file and its offset and time indexes.
- `log`: `PartitionLog`, the segments of a partition: append, read, roll, recover, truncate.
- `log_manager`, `data_dir`, `checkpoint`: the logs of a data directory, its lock and identity,
  and the recovery-point and high-watermark checkpoint files.
- `producer_state`, `leader_epoch`: idempotent producers' state and the leader epoch cache, kept
  beside the segments.
- `cleaner`, `cleaner_swap`, `compaction`: log compaction (the cleaner task, its atomic segment
  swap, and the pure rule of which records stay).
- `retention`: deletion of segments past `retention.ms` / `retention.bytes`.
"""
