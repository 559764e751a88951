"""Helpers every layer may use; they import nothing else of Riverbed.

- `fileio`: positioned reads, fsync of files and directories (the hot log, checkpoints and the
  file:// object store).
- `backoff`: exponential backoff with jitter (client retries, object-store retries).
- `throttle`: the bytes-per-second pace of background jobs (hot and cold compaction).
- `log_events`: structured log events (`event(...)`), one vocabulary for every layer.
- `scheduling`, `allocator`: the broker process's CPU scheduling policy and malloc thresholds.
"""
