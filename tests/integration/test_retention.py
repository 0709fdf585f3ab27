"""Retention by time and size, DeleteRecords, and what fetches outside the log's range get.

Segments are 1 MiB (the smallest segment.bytes Kafka 4 accepts) filled with ~100 kB batches, so
a few MB make several segments. The conftest broker checks retention every 300 ms.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from kafka_wire import EARLIEST, LATEST, KafkaWire
from strom.records.codec import RecordSpec, decode_batches, encode_batch

SEGMENT_BYTES = 1024 * 1024
# About ten of these fill a segment.
BIG_VALUE = b"r" * 100_000
HOUR_MS = 3_600_000


@pytest.fixture()
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as conn:
        yield conn


def segment_sizes(broker: BrokerProcess, topic: str) -> dict[int, int]:
    """Base offset -> bytes of each live segment (Kafka renames deleted ones to *.log.deleted)."""
    files = (broker.data_dir / f"{topic}-0").glob("*.log")
    return {int(p.name.removesuffix(".log")): p.stat().st_size for p in files}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def fill(wire: KafkaWire, topic: str, batches: int, timestamp: int | None = None) -> list[int]:
    return [
        wire.produce_ok(
            topic, encode_batch([RecordSpec(key=b"%d" % i, value=BIG_VALUE, timestamp=timestamp)])
        )
        for i in range(batches)
    ]


def new_topic(wire: KafkaWire, prefix: str, configs: dict[str, str]) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    assert wire.create_topic(name, configs=configs) == ErrorCode.none
    return name


def test_segment_bytes_below_kafka4_minimum_is_refused(wire: KafkaWire) -> None:
    assert wire.create_topic("tiny-segments", configs={"segment.bytes": "4096"}) == ErrorCode.invalid_config


def test_time_retention_deletes_expired_segments_but_keeps_the_active_one(
    wire: KafkaWire, broker: BrokerProcess
) -> None:
    topic = new_topic(wire, "time-retention", {"segment.bytes": str(SEGMENT_BYTES)})
    an_hour_ago = int(time.time() * 1000) - HOUR_MS
    fill(wire, topic, 35, timestamp=an_hour_ago)
    fresh = wire.produce_ok(topic, encode_batch([RecordSpec(key=b"fresh", value=b"now")]))
    before = segment_sizes(broker, topic)
    assert len(before) >= 4, before
    # Every segment older than the one holding the fresh record is expired; that one is not.
    kept_from = max(base for base in before if base <= fresh)
    assert kept_from > 0

    assert wire.incremental_alter_configs(topic, {"retention.ms": str(60_000)}) == ErrorCode.none
    wait_for(lambda: wire.list_offset(topic, EARLIEST) == kept_from, f"log start offset {kept_from}")
    kept = [base for base in sorted(before) if base >= kept_from]
    wait_for(lambda: sorted(segment_sizes(broker, topic)) == kept, f"segments {kept} to remain")
    assert wire.list_offset(topic, LATEST) == fresh + 1
    assert wire.fetch(topic, kept_from - 1).error_code == ErrorCode.offset_out_of_range
    records = [r for b in decode_batches(wire.fetch(topic, fresh).records) for r in b.records]
    assert (records[0].offset, records[0].value) == (fresh, b"now")
    # The log keeps taking appends after the deletion.
    assert wire.produce_ok(topic, encode_batch([RecordSpec(key=None, value=b"after")])) == fresh + 1


def test_size_retention_deletes_oldest_segments_down_to_retention_bytes(
    wire: KafkaWire, broker: BrokerProcess
) -> None:
    topic = new_topic(wire, "size-retention", {"segment.bytes": str(SEGMENT_BYTES)})
    fill(wire, topic, 45)
    before = segment_sizes(broker, topic)
    assert len(before) >= 4, before
    retention_bytes = 1_500_000
    # Kafka deletes oldest-first while the log would still hold at least retention.bytes without it.
    excess = sum(before.values()) - retention_bytes
    deleted = []
    for base in sorted(before):
        if excess - before[base] < 0:
            break
        excess -= before[base]
        deleted.append(base)
    assert deleted and len(deleted) < len(before)
    kept_from = min(set(before) - set(deleted))
    end = wire.list_offset(topic, LATEST)

    assert wire.incremental_alter_configs(topic, {"retention.bytes": str(retention_bytes)}) == ErrorCode.none
    wait_for(lambda: wire.list_offset(topic, EARLIEST) == kept_from, f"log start offset {kept_from}")
    # Allow the retention pass that moved the start offset to finish deleting files.
    kept = sorted(set(before) - set(deleted))
    wait_for(lambda: sorted(segment_sizes(broker, topic)) == kept, f"segments {kept} to remain")
    assert sum(segment_sizes(broker, topic).values()) >= retention_bytes
    assert wire.list_offset(topic, LATEST) == end
    time.sleep(1.0)  # several more retention passes: nothing else may go
    assert wire.list_offset(topic, EARLIEST) == kept_from


def test_delete_records_moves_the_log_start_offset(wire: KafkaWire) -> None:
    topic = new_topic(wire, "delete-records", {})
    for i in range(10):
        batch = encode_batch([RecordSpec(key=None, value=b"%d" % (3 * i + j)) for j in range(3)])
        assert wire.produce_ok(topic, batch) == 3 * i

    assert wire.delete_records(topic, 7) == (ErrorCode.none, 7)
    assert wire.list_offset(topic, EARLIEST) == 7
    assert wire.fetch(topic, 6).error_code == ErrorCode.offset_out_of_range
    data = wire.fetch(topic, 7)
    assert data.error_code == ErrorCode.none and data.log_start_offset == 7
    # Whole batches come back: the one holding offset 7 starts at 6.
    offsets = [r.offset for b in decode_batches(data.records) for r in b.records]
    assert offsets[0] == 6 and 7 in offsets and offsets[-1] == 29

    # Never backwards; never beyond the high watermark.
    assert wire.delete_records(topic, 5) == (ErrorCode.none, 7)
    assert wire.delete_records(topic, 31)[0] == ErrorCode.offset_out_of_range
    assert wire.list_offset(topic, EARLIEST) == 7
    # -1 means "up to the high watermark".
    assert wire.delete_records(topic, -1) == (ErrorCode.none, 30)
    assert wire.list_offset(topic, EARLIEST) == 30
    assert wire.fetch(topic, 29).error_code == ErrorCode.offset_out_of_range
    assert wire.produce_ok(topic, encode_batch([RecordSpec(key=None, value=b"30")])) == 30


def test_earliest_offset_of_an_empty_log_is_its_start_offset(wire: KafkaWire) -> None:
    topic = new_topic(wire, "empty-earliest", {})
    assert (wire.list_offset(topic, EARLIEST), wire.list_offset(topic, LATEST)) == (0, 0)


def test_delete_records_removes_segments_wholly_below_the_start_offset(
    wire: KafkaWire, broker: BrokerProcess
) -> None:
    topic = new_topic(wire, "delete-records-segments", {"segment.bytes": str(SEGMENT_BYTES)})
    fill(wire, topic, 25)
    before = sorted(segment_sizes(broker, topic))
    assert len(before) >= 3, before
    target = before[2] + 1  # inside the third segment
    assert wire.delete_records(topic, target) == (ErrorCode.none, target)
    wait_for(lambda: sorted(segment_sizes(broker, topic)) == before[2:], f"segments {before[2:]} to remain")
    assert wire.list_offset(topic, EARLIEST) == target


def test_fetch_outside_the_log_gets_offset_out_of_range(wire: KafkaWire) -> None:
    topic = new_topic(wire, "fetch-range", {})
    for i in range(5):
        wire.produce_ok(topic, encode_batch([RecordSpec(key=None, value=b"%d" % i)]))
    assert wire.delete_records(topic, 2) == (ErrorCode.none, 2)
    below = wire.fetch(topic, 1)
    assert below.error_code == ErrorCode.offset_out_of_range
    assert (below.high_watermark, below.log_start_offset) == (5, 2)
    at_end = wire.fetch(topic, 5)
    assert at_end.error_code == ErrorCode.none and not at_end.records
    above = wire.fetch(topic, 6)
    assert above.error_code == ErrorCode.offset_out_of_range
    assert wire.fetch(topic, 10**12).error_code == ErrorCode.offset_out_of_range


@pytest.mark.parametrize("position", [0, 1000])
def test_consumer_with_auto_offset_reset_earliest_recovers(
    wire: KafkaWire, broker: BrokerProcess, position: int
) -> None:
    topic = new_topic(wire, "reset-earliest", {})
    for i in range(10):
        wire.produce_ok(topic, encode_batch([RecordSpec(key=None, value=b"%d" % i)]))
    assert wire.delete_records(topic, 4) == (ErrorCode.none, 4)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"reset-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, position)])
        values: list[tuple[int | None, bytes | None]] = []
        deadline = time.monotonic() + 15
        while len(values) < 6 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append((message.offset(), message.value()))
    finally:
        consumer.close()
    assert values == [(i, b"%d" % i) for i in range(4, 10)]
