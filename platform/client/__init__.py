"""The asyncio client: producer, consumer and admin."""
