"""The rebalance listener: the application's hooks into its consumer's group assignment.

The consumer awaits them inside `getmany()` (and `close()`), on the application's task, never in
the background, so records from a partition are not handed out after its revocation hook ran
and the hook may still commit the partition's offsets:

- `on_partitions_revoked(revoked)`: before the consumer gives partitions up in a rebalance (all
  of them with an eager assignor, before rejoining; with cooperative-sticky only the ones that
  move, after the rebalance told it so), and on `close()` / `unsubscribe()`. Not called with an
  empty set.
- `on_partitions_assigned(assigned)`: after each rebalance with the partitions newly assigned
  (all of them with an eager assignor; those added with cooperative-sticky; possibly none),
  before their positions are looked up, so a `seek()` here decides where reading starts.
- `on_partitions_lost(lost)`: the partitions were already taken away (the member's session or
  poll interval ran out, or the coordinator no longer knew its generation): other members may
  own them now, so committing them would fail. By default it calls `on_partitions_revoked`, as
  the Java client does.
"""

from __future__ import annotations

from riverbed.protocol.record_types import TopicPartition


class RebalanceListener:
    """Subclass and override the hooks you need; each default does nothing."""

    async def on_partitions_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        """Called before `revoked` stop being this consumer's."""

    async def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        """Called after a rebalance gave this consumer `assigned` (possibly none)."""

    async def on_partitions_lost(self, lost: frozenset[TopicPartition]) -> None:
        """Called when `lost` were taken away without a revocation."""
        await self.on_partitions_revoked(lost)
