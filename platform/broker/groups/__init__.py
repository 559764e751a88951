"""The broker's group coordinator: consumer groups (Kafka's classic protocol) and their offsets.

- `offsets_topic`: `__consumer_offsets` — which partition holds a group (Kafka's hash), creating
  the topic on first use.
- `log_store`: the coordinator's records in that topic (Kafka's formats): appending them as the
  leader and waiting for the ISR, replaying a partition's log on load.
- `offsets`: `OffsetStore`, the committed offsets in memory: commits, fetches, expiry.
- `group_values`: what a group takes and gives (calls, results, effects, stored records).
- `group`: one group's membership state machine, without I/O.
- `membership`: `GroupMembership`, every group of the loaded partitions: calls, timers, persistence.
- `coordinator`: `GroupCoordinator`, which composes membership and offsets for the partitions this
  broker leads, loads and unloads them as leadership moves, and routes requests.
"""
