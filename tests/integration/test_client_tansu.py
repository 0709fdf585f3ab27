"""Strom's client against Tansu, a Kafka-compatible broker written independently of Strom's.

The producer (idempotent by default), the consumer (assigned and as a group member) and the admin
client work against a broker that shares no code with Strom's, and records come back byte for byte
as they were sent: keys, values, nulls, headers (duplicate keys, null values) and timestamps.

Tansu's ListOffsets(latest) answers the base offset of the partition's last batch plus one, which is
the log end offset only when that batch holds one record; the offsets test ends with a one-record
batch so that Kafka's answer and Tansu's agree.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerproc import TansuProcess, tansu_binary
from strom.client.admin import AdminClient, NewTopic, OffsetSpec
from strom.client.cluster import TopicPartition
from strom.client.consumer import AsyncConsumer, Consumer, ConsumerRecord
from strom.client.producer import AsyncProducer, Producer, RecordMetadata

REPO = Path(__file__).resolve().parents[2]
NOW = int(time.time() * 1000)
Header = tuple[str, bytes | None]
# (key, value, headers, timestamp): everything a record can carry, nulls included.
RECORDS: list[tuple[bytes | None, bytes | None, tuple[Header, ...], int]] = [
    (b"key-0", b"value-0", (), NOW - 5000),
    (None, b"no key", (("trace", b"t-1"),), NOW - 4000),
    (b"tombstone", None, (), NOW - 3000),
    (b"\x00\xff binary", bytes(range(256)), (("dup", b"one"), ("dup", b"two"), ("null", None)), NOW - 2000),
    (b"", b"", (("empty", b""),), NOW - 1000),
    (b"big", b"x" * 100_000, (), NOW),
]


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = tansu_binary(REPO / ".cache" / "tansu")
    with TansuProcess(tmp_path_factory.mktemp("tansu"), binary) as proc:
        yield proc.bootstrap


@pytest.fixture(scope="module")
def admin(tansu: str) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": tansu}) as client:
        yield client


def new_topic(admin: AdminClient, partitions: int = 1) -> str:
    name = f"tansu-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    return name


def as_sent(record: ConsumerRecord) -> tuple[bytes | None, bytes | None, tuple[Header, ...], int]:
    return record.key, record.value, tuple(record.headers), record.timestamp


def produce_all(producer: Producer, topic: str, partition: int | None = 0) -> list[RecordMetadata]:
    futures = [
        producer.send(topic, value, key, partition=partition, timestamp=timestamp, headers=headers)
        for key, value, headers, timestamp in RECORDS
    ]
    producer.flush(30)
    return [future.get(10) for future in futures]


def poll_until(consumer: Consumer, count: int, timeout: float = 20.0) -> list[ConsumerRecord]:
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(records) < count:
        assert time.monotonic() < deadline, f"got {len(records)} of {count} records"
        records += consumer.poll(0.5)
    return records


def test_admin_topics(admin: AdminClient) -> None:
    topic = new_topic(admin, partitions=3)
    assert topic in admin.list_topics()
    described = admin.describe_topics([topic])[topic]
    assert described.name == topic and not described.is_internal
    assert sorted(p.partition for p in described.partitions) == [0, 1, 2]
    assert all(p.leader >= 0 and p.leader in p.replicas for p in described.partitions)


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_produce_then_assign_byte_identical(tansu: str, admin: AdminClient, compression: str) -> None:
    topic = new_topic(admin)
    # The defaults: acks=all and idempotence on.
    with Producer({"bootstrap.servers": tansu, "compression.type": compression}) as producer:
        metadata = produce_all(producer, topic)
    assert [m.offset for m in metadata] == list(range(len(RECORDS)))
    assert all(m.topic == topic and m.partition == 0 for m in metadata)
    assert [m.timestamp for m in metadata] == [timestamp for *_, timestamp in RECORDS]
    with Consumer({"bootstrap.servers": tansu, "enable.auto.commit": False}) as consumer:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning([partition])
        records = poll_until(consumer, len(RECORDS))
        assert consumer.position(partition) == len(RECORDS)
    assert [r.offset for r in records] == list(range(len(RECORDS)))
    assert [as_sent(r) for r in records] == RECORDS


def test_list_offsets(tansu: str, admin: AdminClient) -> None:
    topic = new_topic(admin)
    partition = TopicPartition(topic, 0)
    empty = admin.list_offsets({partition: OffsetSpec.latest()})[partition]
    assert empty.offset == 0
    with Producer({"bootstrap.servers": tansu, "linger.ms": 50}) as producer:
        produce_all(producer, topic)
        # A batch of one record last: see the module's docstring.
        producer.send(topic, b"last", partition=0).get(10)
    earliest = admin.list_offsets({partition: OffsetSpec.earliest()})[partition]
    latest = admin.list_offsets({partition: OffsetSpec.latest()})[partition]
    assert (earliest.offset, latest.offset) == (0, len(RECORDS) + 1)


def test_group_subscribe_commit_and_resume(tansu: str, admin: AdminClient) -> None:
    topic = new_topic(admin, partitions=2)
    group = f"tansu-group-{uuid.uuid4().hex[:6]}"
    with Producer({"bootstrap.servers": tansu}) as producer:
        for partition in (0, 1):
            produce_all(producer, topic, partition)
    config = {
        "bootstrap.servers": tansu,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        # Tansu answers a JoinGroup only after about half the session timeout: keep it short.
        "session.timeout.ms": 2000,
        "heartbeat.interval.ms": 500,
    }
    with Consumer(config) as consumer:
        consumer.subscribe([topic])
        records = poll_until(consumer, 2 * len(RECORDS))
        assert consumer.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        for partition in (0, 1):
            assert [as_sent(r) for r in records if r.partition == partition] == RECORDS
        consumer.commit_sync()
        committed = consumer.committed([TopicPartition(topic, p) for p in (0, 1)])
        assert {tp: c.offset if c else None for tp, c in committed.items()} == {
            TopicPartition(topic, 0): len(RECORDS),
            TopicPartition(topic, 1): len(RECORDS),
        }
    with Producer({"bootstrap.servers": tansu}) as producer:
        producer.send(topic, b"after the commit", b"k", partition=1).get(10)
    # A new member of the group resumes at the committed offsets: only the new record comes.
    with Consumer(config) as consumer:
        consumer.subscribe([topic])
        (record,) = poll_until(consumer, 1)
        assert (record.partition, record.offset, record.value) == (1, len(RECORDS), b"after the commit")
        assert consumer.poll(1.0) == []


def test_async_clients(tansu: str, admin: AdminClient) -> None:
    topic = new_topic(admin)

    async def roundtrip() -> list[ConsumerRecord]:
        async with AsyncProducer({"bootstrap.servers": tansu, "linger.ms": 1}) as producer:
            for key, value, headers, timestamp in RECORDS:
                await producer.send(topic, value, key, partition=0, timestamp=timestamp, headers=headers)
            await producer.flush()
        async with AsyncConsumer({"bootstrap.servers": tansu, "enable.auto.commit": False}) as consumer:
            partition = TopicPartition(topic, 0)
            consumer.assign([partition])
            consumer.seek_to_beginning([partition])
            records: list[ConsumerRecord] = []
            deadline = time.monotonic() + 20
            while len(records) < len(RECORDS):
                assert time.monotonic() < deadline, f"got {len(records)} of {len(RECORDS)} records"
                records += await consumer.poll(0.5)
            return records

    records = asyncio.run(roundtrip())
    assert [as_sent(r) for r in records] == RECORDS
