"""Benchmarks that put Riverbed and a baseline side by side in one run (`python -m bench.run`)."""
