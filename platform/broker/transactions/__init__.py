"""The broker's transaction coordinator (KIP-98, with KIP-447's fencing).

- `state`: one transactional id's state and the transition table, without I/O.
- `log_store`: its records in `__transaction_state` (Kafka's formats), and replaying them.
- `markers`: `MarkerChannel`, WriteTxnMarkers to partition leaders, batched per broker.
- `coordinator`: `TransactionCoordinator`, the ids of the partitions this broker leads: loads and
  unloads them as leadership moves, runs each transaction to its end, times out and expires.
"""
