"""Strom's Kafka client: producer, consumer and admin, asyncio at the core with synchronous faces."""
