"""The `riverbed` command (`python -m riverbed.cli`, or the `riverbed` script).

- `main`: the parser, `riverbed broker`, `riverbed topics`, produce and consume.
- one module per command group: `acls`, `describe` (cluster and topic views), `groups`,
  `partitions` (reassignment, leader election), `truncate`, `users`;
- `local_cluster`: `riverbed cluster up`, a local ZooKeeper and brokers under one supervisor;
- `env_config`: broker settings from `RIVERBED_*` variables; `connect`: the admin commands'
  connection flags; `render`: tables and progress bars.
"""
