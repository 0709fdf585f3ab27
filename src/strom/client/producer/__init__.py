"""Strom's Kafka producer: Kafka's accumulator/sender design, a synchronous and an asyncio face."""

from strom.client.producer.accumulator import FutureRecordMetadata, RecordMetadata
from strom.client.producer.producer import AsyncFutureRecordMetadata, AsyncProducer, Producer

__all__ = ["AsyncFutureRecordMetadata", "AsyncProducer", "FutureRecordMetadata", "Producer", "RecordMetadata"]
