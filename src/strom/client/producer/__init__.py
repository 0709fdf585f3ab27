"""Strom's Kafka producer: Kafka's accumulator/sender design, a synchronous and an asyncio face."""

from strom.client.producer.accumulator import FutureRecordMetadata, RecordMetadata
from strom.client.producer.producer import AsyncProducer, Producer

__all__ = ["AsyncProducer", "FutureRecordMetadata", "Producer", "RecordMetadata"]
