"""Strom's Kafka producer: Kafka's accumulator/sender design, a synchronous and an asyncio face."""

from strom.client.producer.accumulator import FutureRecordMetadata, RecordMetadata
from strom.client.producer.end_txn import OpenTransaction, end_transactions
from strom.client.producer.producer import AsyncFutureRecordMetadata, AsyncProducer, Producer

__all__ = [
    "AsyncFutureRecordMetadata",
    "AsyncProducer",
    "FutureRecordMetadata",
    "OpenTransaction",
    "Producer",
    "RecordMetadata",
    "end_transactions",
]
