"""Strom's Kafka client: producer, consumer and admin, asyncio at the core with synchronous faces.

It speaks the Kafka protocol to any broker (Strom, Kafka, Tansu, ...) and takes the
Java client's config names::

    from strom.client import Consumer, Producer

    with Producer({"bootstrap.servers": "127.0.0.1:9092"}) as producer:
        producer.send("pageloads", b"load 1", key=b"user-1").get()
"""

from strom.client.admin import (
    AdminClient,
    AlterConfigOp,
    AsyncAdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)
from strom.client.cluster import TopicPartition
from strom.client.consumer import (
    AsyncConsumer,
    Consumer,
    ConsumerGroupMetadata,
    ConsumerRebalanceListener,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
)
from strom.client.errors import (
    CommitFailedError,
    ConfigException,
    KafkaException,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionFatalError,
)
from strom.client.producer import (
    AsyncFutureRecordMetadata,
    AsyncProducer,
    FutureRecordMetadata,
    Producer,
    RecordMetadata,
)

__all__ = [
    "AdminClient",
    "AlterConfigOp",
    "AsyncAdminClient",
    "AsyncConsumer",
    "AsyncFutureRecordMetadata",
    "AsyncProducer",
    "CommitFailedError",
    "ConfigException",
    "ConfigResource",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "FutureRecordMetadata",
    "KafkaException",
    "KafkaTimeoutError",
    "NewPartitions",
    "NewTopic",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "OffsetSpec",
    "Producer",
    "ProducerFencedError",
    "RecordMetadata",
    "TopicPartition",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TransactionFatalError",
]
