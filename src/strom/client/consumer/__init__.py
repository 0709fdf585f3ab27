"""Strom's Kafka consumer: subscriptions and groups, fetching, offsets (Kafka's KafkaConsumer design)."""

from __future__ import annotations

from strom.client.consumer.assignors import (
    ConsumerPartitionAssignor,
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
)
from strom.client.consumer.consumer import AsyncConsumer, Consumer
from strom.client.consumer.structs import (
    ConsumerGroupMetadata,
    ConsumerRebalanceListener,
    LogTruncationError,
    NoOffsetForPartitionError,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    OffsetOutOfRangeError,
)
from strom.records.reader import ConsumerRecord, FetchedBatch

__all__ = [
    "AsyncConsumer",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerPartitionAssignor",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "CooperativeStickyAssignor",
    "FetchedBatch",
    "LogTruncationError",
    "NoOffsetForPartitionError",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "OffsetOutOfRangeError",
    "RangeAssignor",
    "RoundRobinAssignor",
]
