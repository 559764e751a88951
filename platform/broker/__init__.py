"""The broker process: the request path from the socket to the hot tier, and its coordinators.

- `network`: the asyncio server (`server`), per-connection answer ordering (`response_queue`)
  and idle timers (`connection_waits`): the only place the broker touches sockets.
- `dispatcher`: decoded requests to their handlers, with authentication and authorization.
- `handlers`: one module per Kafka API; they read the broker through `BrokerContext`.
- `groups`: the group coordinator (consumer groups and their committed offsets).
- `broker`: `Broker`, which wires storage, replication, tiering, coordination and security
  together and owns every task; `controlled_shutdown`; `metrics*`: Prometheus metrics.
"""
