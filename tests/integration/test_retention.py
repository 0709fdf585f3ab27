"""Retention by time and size, DeleteRecords, and what fetches outside the log's range get.

Segments are 1 MiB (the smallest segment.bytes Kafka 4 accepts) filled with ~100 kB batches, so
a few MB make several segments. The conftest broker checks retention every 300 ms.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.create_topics.v7 import request as create_topics7
from kio.schema.delete_records.v2 import request as delete_records2
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.incremental_alter_configs.v1 import request as alter_configs1
from kio.schema.list_offsets.v7 import request as list_offsets7
from kio.schema.produce.v9 import request as produce9

from brokerproc import BrokerProcess
from kafka_wire import KafkaWire
from strom.records.codec import RecordSpec, decode_batches, encode_batch

TIMEOUT = datetime.timedelta(seconds=5)
SEGMENT_BYTES = 1024 * 1024
# About ten of these fill a segment.
BIG_VALUE = b"r" * 100_000
LATEST, EARLIEST = -1, -2
TOPIC_RESOURCE, SET = 2, 0
HOUR_MS = 3_600_000


def host_port(broker: BrokerProcess) -> tuple[str, int]:
    host, port = broker.bootstrap.split(":")
    return host, int(port)


@pytest.fixture()
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire(*host_port(broker)) as conn:
        yield conn


def create_topic(wire: KafkaWire, name: str, configs: dict[str, str]) -> int:
    response = wire.request(
        create_topics7.CreateTopicsRequest(
            topics=(
                create_topics7.CreatableTopic(
                    name=name,
                    num_partitions=1,
                    replication_factor=1,
                    assignments=(),
                    configs=tuple(
                        create_topics7.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()
                    ),
                ),
            ),
            timeout=TIMEOUT,
        )
    )
    error: int = response.topics[0].error_code
    return error


def alter_topic_configs(wire: KafkaWire, topic: str, configs: dict[str, str]) -> None:
    response = wire.request(
        alter_configs1.IncrementalAlterConfigsRequest(
            resources=(
                alter_configs1.AlterConfigsResource(
                    resource_type=TOPIC_RESOURCE,
                    resource_name=topic,
                    configs=tuple(
                        alter_configs1.AlterableConfig(name=k, config_operation=SET, value=v)
                        for k, v in configs.items()
                    ),
                ),
            ),
            validate_only=False,
        )
    )
    assert response.responses[0].error_code == ErrorCode.none, response


def produce(wire: KafkaWire, topic: str, records: bytes) -> int:
    """Append one batch; returns its base offset."""
    response = wire.request(
        produce9.ProduceRequest(
            transactional_id=None,
            acks=1,
            timeout=TIMEOUT,
            topic_data=(
                produce9.TopicProduceData(
                    name=topic, partition_data=(produce9.PartitionProduceData(index=0, records=records),)
                ),
            ),
        )
    )
    result = response.responses[0].partition_responses[0]
    assert result.error_code == ErrorCode.none, result
    offset: int = result.base_offset
    return offset


def fetch(wire: KafkaWire, topic: str, offset: int) -> Any:
    response = wire.request(
        fetch12.FetchRequest(
            max_wait=datetime.timedelta(milliseconds=0),
            min_bytes=1,
            topics=(
                fetch12.FetchTopic(
                    topic=topic,
                    partitions=(
                        fetch12.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20),
                    ),
                ),
            ),
            forgotten_topics_data=(),
        )
    )
    return response.responses[0].partitions[0]


def list_offset(wire: KafkaWire, topic: str, timestamp: int) -> int:
    response = wire.request(
        list_offsets7.ListOffsetsRequest(
            replica_id=-1,
            isolation_level=0,
            topics=(
                list_offsets7.ListOffsetsTopic(
                    name=topic,
                    partitions=(list_offsets7.ListOffsetsPartition(partition_index=0, timestamp=timestamp),),
                ),
            ),
        )
    )
    result = response.topics[0].partitions[0]
    assert result.error_code == ErrorCode.none, result
    offset: int = result.offset
    return offset


def delete_records(wire: KafkaWire, topic: str, offset: int) -> tuple[int, int]:
    """DeleteRecords up to ``offset``; returns (error code, low watermark)."""
    response = wire.request(
        delete_records2.DeleteRecordsRequest(
            topics=(
                delete_records2.DeleteRecordsTopic(
                    name=topic,
                    partitions=(delete_records2.DeleteRecordsPartition(partition_index=0, offset=offset),),
                ),
            ),
            timeout=TIMEOUT,
        )
    )
    result = response.topics[0].partitions[0]
    return result.error_code, result.low_watermark


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
        produce(wire, topic, encode_batch([RecordSpec(key=b"%d" % i, value=BIG_VALUE, timestamp=timestamp)]))
        for i in range(batches)
    ]


def new_topic(wire: KafkaWire, prefix: str, configs: dict[str, str]) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    assert create_topic(wire, name, configs) == ErrorCode.none
    return name


def test_segment_bytes_below_kafka4_minimum_is_refused(wire: KafkaWire) -> None:
    assert create_topic(wire, "tiny-segments", {"segment.bytes": "4096"}) == ErrorCode.invalid_config


def test_time_retention_deletes_expired_segments_but_keeps_the_active_one(
    wire: KafkaWire, broker: BrokerProcess
) -> None:
    topic = new_topic(wire, "time-retention", {"segment.bytes": str(SEGMENT_BYTES)})
    an_hour_ago = int(time.time() * 1000) - HOUR_MS
    fill(wire, topic, 35, timestamp=an_hour_ago)
    fresh = produce(wire, topic, encode_batch([RecordSpec(key=b"fresh", value=b"now")]))
    before = segment_sizes(broker, topic)
    assert len(before) >= 4, before
    # Every segment older than the one holding the fresh record is expired; that one is not.
    kept_from = max(base for base in before if base <= fresh)
    assert kept_from > 0

    alter_topic_configs(wire, topic, {"retention.ms": str(60_000)})
    wait_for(lambda: list_offset(wire, topic, EARLIEST) == kept_from, f"log start offset {kept_from}")
    kept = [base for base in sorted(before) if base >= kept_from]
    wait_for(lambda: sorted(segment_sizes(broker, topic)) == kept, f"segments {kept} to remain")
    assert list_offset(wire, topic, LATEST) == fresh + 1
    assert fetch(wire, topic, kept_from - 1).error_code == ErrorCode.offset_out_of_range
    records = [r for b in decode_batches(fetch(wire, topic, fresh).records) for r in b.records]
    assert (records[0].offset, records[0].value) == (fresh, b"now")
    # The log keeps taking appends after the deletion.
    assert produce(wire, topic, encode_batch([RecordSpec(key=None, value=b"after")])) == fresh + 1


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
    end = list_offset(wire, topic, LATEST)

    alter_topic_configs(wire, topic, {"retention.bytes": str(retention_bytes)})
    wait_for(lambda: list_offset(wire, topic, EARLIEST) == kept_from, f"log start offset {kept_from}")
    # Allow the retention pass that moved the start offset to finish deleting files.
    kept = sorted(set(before) - set(deleted))
    wait_for(lambda: sorted(segment_sizes(broker, topic)) == kept, f"segments {kept} to remain")
    assert sum(segment_sizes(broker, topic).values()) >= retention_bytes
    assert list_offset(wire, topic, LATEST) == end
    time.sleep(1.0)  # several more retention passes: nothing else may go
    assert list_offset(wire, topic, EARLIEST) == kept_from


def test_delete_records_moves_the_log_start_offset(wire: KafkaWire) -> None:
    topic = new_topic(wire, "delete-records", {})
    for i in range(10):
        batch = encode_batch([RecordSpec(key=None, value=b"%d" % (3 * i + j)) for j in range(3)])
        assert produce(wire, topic, batch) == 3 * i

    assert delete_records(wire, topic, 7) == (ErrorCode.none, 7)
    assert list_offset(wire, topic, EARLIEST) == 7
    assert fetch(wire, topic, 6).error_code == ErrorCode.offset_out_of_range
    data = fetch(wire, topic, 7)
    assert data.error_code == ErrorCode.none and data.log_start_offset == 7
    # Whole batches come back: the one holding offset 7 starts at 6.
    offsets = [r.offset for b in decode_batches(data.records) for r in b.records]
    assert offsets[0] == 6 and 7 in offsets and offsets[-1] == 29

    # Never backwards; never beyond the high watermark.
    assert delete_records(wire, topic, 5) == (ErrorCode.none, 7)
    assert delete_records(wire, topic, 31)[0] == ErrorCode.offset_out_of_range
    assert list_offset(wire, topic, EARLIEST) == 7
    # -1 means "up to the high watermark".
    assert delete_records(wire, topic, -1) == (ErrorCode.none, 30)
    assert list_offset(wire, topic, EARLIEST) == 30
    assert fetch(wire, topic, 29).error_code == ErrorCode.offset_out_of_range
    assert produce(wire, topic, encode_batch([RecordSpec(key=None, value=b"30")])) == 30


def test_earliest_offset_of_an_empty_log_is_its_start_offset(wire: KafkaWire) -> None:
    topic = new_topic(wire, "empty-earliest", {})
    assert (list_offset(wire, topic, EARLIEST), list_offset(wire, topic, LATEST)) == (0, 0)


def test_delete_records_removes_segments_wholly_below_the_start_offset(
    wire: KafkaWire, broker: BrokerProcess
) -> None:
    topic = new_topic(wire, "delete-records-segments", {"segment.bytes": str(SEGMENT_BYTES)})
    fill(wire, topic, 25)
    before = sorted(segment_sizes(broker, topic))
    assert len(before) >= 3, before
    target = before[2] + 1  # inside the third segment
    assert delete_records(wire, topic, target) == (ErrorCode.none, target)
    wait_for(lambda: sorted(segment_sizes(broker, topic)) == before[2:], f"segments {before[2:]} to remain")
    assert list_offset(wire, topic, EARLIEST) == target


def test_fetch_outside_the_log_gets_offset_out_of_range(wire: KafkaWire) -> None:
    topic = new_topic(wire, "fetch-range", {})
    for i in range(5):
        produce(wire, topic, encode_batch([RecordSpec(key=None, value=b"%d" % i)]))
    assert delete_records(wire, topic, 2) == (ErrorCode.none, 2)
    below = fetch(wire, topic, 1)
    assert below.error_code == ErrorCode.offset_out_of_range
    assert (below.high_watermark, below.log_start_offset) == (5, 2)
    at_end = fetch(wire, topic, 5)
    assert at_end.error_code == ErrorCode.none and not at_end.records
    above = fetch(wire, topic, 6)
    assert above.error_code == ErrorCode.offset_out_of_range
    assert fetch(wire, topic, 10**12).error_code == ErrorCode.offset_out_of_range


@pytest.mark.parametrize("position", [0, 1000])
def test_consumer_with_auto_offset_reset_earliest_recovers(
    wire: KafkaWire, broker: BrokerProcess, position: int
) -> None:
    topic = new_topic(wire, "reset-earliest", {})
    for i in range(10):
        produce(wire, topic, encode_batch([RecordSpec(key=None, value=b"%d" % i)]))
    assert delete_records(wire, topic, 4) == (ErrorCode.none, 4)
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
