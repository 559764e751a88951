"""Test fixtures shared across test packages (import them into a conftest.py to use them)."""
