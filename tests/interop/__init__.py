"""Riverbed driven by Kafka clients and tools written by others, over real sockets."""
