"""Riverbed: a tiered-storage event streaming platform that speaks the Kafka wire protocol.

This file is installed as `riverbed/__init__.py` (see setup.py): the source folder `platform/`
cannot hold an `__init__.py` of its own.
"""

__version__ = "0.1.0"
