"""The hot tier: local append-only log segments, the broker server and request handlers."""
