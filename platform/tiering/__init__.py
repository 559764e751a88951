"""Tiered storage: sealed segments offloaded to an object store as Parquet, read back."""
