"""The client side of consumer groups (Kafka's classic group protocol).

- `consumer_protocol`: the Subscription / Assignment a member sends in JoinGroup metadata and the
  leader hands out through SyncGroup, and their bytes.
- `assignors`: the partition assignors the group leader runs (`range`, `roundrobin`,
  `cooperative-sticky`).
"""
