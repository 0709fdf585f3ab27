"""Log compaction against a real broker with real clients (confluent-kafka, kafka-python).

Topics roll a segment every 100 ms of record time (segment.ms) and the broker's cleaner runs
every 200 ms, so a test writes in waves a little further apart than that and ends with a sentinel
record: everything before the sentinel is then in closed, cleanable segments.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import kafka
from confluent_kafka import KafkaError, Producer
from confluent_kafka import TopicPartition as CKPartition
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from integration.clients_util import (
    Consumed,
    Message,
    confluent_consumer,
    fetch_batches,
    kafka_python_consumer,
    produce_confluent,
    stored_records,
)
from kafka_wire import KafkaWire
from strom.records.batch import DELETE_HORIZON_FLAG

BROKER_CONFIG = {"log.cleaner.backoff.ms": "200"}
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
}
WAVE_GAP = 0.15  # > segment.ms: the next wave starts a new segment
SENTINEL = b"sentinel"


def new_compacted_topic(bootstrap: str, prefix: str, **configs: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    with KafkaWire.connect(bootstrap) as wire:
        assert wire.create_topic(name, configs={**COMPACTED, **configs}) == ErrorCode.none
    return name


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def cleanings(broker: BrokerProcess, topic: str) -> int:
    """Cleaning rounds the broker logged for the topic's partition 0."""
    return sum(
        1
        for line in broker.log_path.read_text().splitlines()
        if "cleaned log" in line and f"log={topic}-0 " in line
    )


def write_waves(
    bootstrap: str, topic: str, waves: list[list[Message]]
) -> dict[bytes, tuple[int, bytes | None]]:
    """Produce each wave, a segment.ms apart, then the sentinel; key -> (offset, value) of its last write."""
    last: dict[bytes, tuple[int, bytes | None]] = {}
    for wave in [*waves, [Message(SENTINEL, b"end")]]:
        for message, delivery in zip(wave, produce_confluent(bootstrap, topic, wave, {}), strict=True):
            assert delivery.error_code is None, delivery
            assert message.key is not None
            last[message.key] = (delivery.offset, message.value)
        time.sleep(WAVE_GAP)
    return last


def updates(keys: int, per_key: int, tag: str) -> list[Message]:
    return [
        Message(b"key-%d" % k, b"%s-%d-%d" % (tag.encode(), k, n))
        for n in range(per_key)
        for k in range(keys)
    ]


def one_record_per_key_below_the_sentinel(bootstrap: str, topic: str) -> bool:
    stored = stored_records(bootstrap, topic)
    keys = [r.key for r in stored if r.key != SENTINEL]
    return len(keys) == len(set(keys))


def read_until(poll: Callable[[], list[Consumed]], last_offset: int, timeout: float = 20.0) -> list[Consumed]:
    got: list[Consumed] = []
    deadline = time.monotonic() + timeout
    while not got or got[-1].offset < last_offset:
        assert time.monotonic() < deadline, f"read up to {got[-1].offset if got else None} of {last_offset}"
        got += poll()
    return got


def confluent_read_all(bootstrap: str, topic: str, last_offset: int, **config: object) -> list[Consumed]:
    consumer = confluent_consumer(bootstrap, **config)
    try:
        consumer.assign([CKPartition(topic, 0, 0)])

        def poll() -> list[Consumed]:
            msg = consumer.poll(0.1)
            if msg is None:
                return []
            assert msg.error() is None, msg.error()
            return [Consumed(0, msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), ())]

        return read_until(poll, last_offset)
    finally:
        consumer.close()


def kafka_python_read_all(bootstrap: str, topic: str, last_offset: int) -> list[Consumed]:
    consumer = kafka_python_consumer(bootstrap)
    try:
        tp = kafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)

        def poll() -> list[Consumed]:
            return [
                Consumed(0, r.offset, r.timestamp, r.key, r.value, ())
                for records in consumer.poll(timeout_ms=100).values()
                for r in records
            ]

        return read_until(poll, last_offset)
    finally:
        consumer.close()


def test_compaction_keeps_the_latest_value_of_each_key_at_its_original_offset(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    topic = new_compacted_topic(bootstrap, "compact-latest")
    waves = [updates(20, 5, f"w{w}") for w in range(8)]  # 800 writes, 20 keys, 8 segments
    waves[-1].append(Message(b"key-3", None))  # a tombstone: kept (a day), stamped with its horizon
    last = write_waves(bootstrap, topic, waves)
    sentinel_offset = last[SENTINEL][0]

    wait_for(lambda: one_record_per_key_below_the_sentinel(bootstrap, topic), "the log to be cleaned")
    assert cleanings(broker, topic) >= 1
    expected = sorted((offset, key, value) for key, (offset, value) in last.items())
    stored = stored_records(bootstrap, topic)
    assert [(r.offset, r.key, r.value) for r in stored] == expected
    (tombstone_batch,) = [
        b for b in fetch_batches(bootstrap, topic) if any(r.value is None for r in b.records)
    ]
    assert tombstone_batch.header.attributes & DELETE_HORIZON_FLAG
    # Both clients read the compacted log (gaps, emptied batches and the tombstone's batch with
    # its delete horizon as base timestamp included) the same way, timestamps too.
    for read in (
        confluent_read_all(bootstrap, topic, sentinel_offset),
        kafka_python_read_all(bootstrap, topic, sentinel_offset),
    ):
        assert [(r.offset, r.key, r.value, r.timestamp) for r in read] == [
            (r.offset, r.key, r.value, r.timestamp) for r in stored
        ]
    # The log end did not move; new writes go on from it.
    with KafkaWire.connect(bootstrap) as wire:
        assert wire.list_offset(topic, -1) == sentinel_offset + 1


def test_tombstones_disappear_after_delete_retention_ms(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    topic = new_compacted_topic(bootstrap, "compact-tombstones", **{"delete.retention.ms": "1500"})
    values = [Message(b"a", b"1"), Message(b"b", b"1"), Message(b"c", b"1")]
    deletes = [Message(b"a", None), Message(b"b", None)]
    write_waves(bootstrap, topic, [values, deletes, [Message(b"c", b"2")]])

    snapshots: list[list[tuple[bytes | None, bytes | None]]] = []

    def snapshot() -> list[tuple[bytes | None, bytes | None]]:
        snapshots.append([(r.key, r.value) for r in stored_records(bootstrap, topic)])
        return snapshots[-1]

    def both_tombstones(records: list[tuple[bytes | None, bytes | None]]) -> bool:
        return (b"a", None) in records and (b"b", None) in records

    # The round that drops a's and b's older values is the first to keep their tombstones: it
    # stamps them with a delete horizon delete.retention.ms (1.5 s) ahead. (c's older value may go
    # in that round or a later one, depending on whether its update's segment was closed yet.)
    wait_for(lambda: (b"a", b"1") not in snapshot(), "the older values to go")
    horizon_floor = time.monotonic() + 1.0  # the round ran at most ~0.3 s before this read
    assert (b"b", b"1") not in snapshots[-1] and both_tombstones(snapshots[-1])
    # Every read before the horizon still has both tombstones...
    while time.monotonic() < horizon_floor:
        assert both_tombstones(snapshot())
        time.sleep(0.05)
    # ...and then they go too, with no new writes to the topic.
    wait_for(
        lambda: snapshot() == [(b"c", b"2"), (SENTINEL, b"end")],
        "the tombstones to go",
    )


def test_a_consumer_reading_while_the_cleaner_runs_sees_every_keys_final_value(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    topic = new_compacted_topic(bootstrap, "compact-concurrent")
    write_waves(bootstrap, topic, [updates(30, 4, f"a{w}") for w in range(4)])
    cleaned_before = cleanings(broker, topic)

    done = threading.Event()
    more: dict[bytes, tuple[int, bytes | None]] = {}

    def writer() -> None:
        # Keep the cleaner busy while the consumer reads: new waves make new dirty segments.
        more.update(write_waves(bootstrap, topic, [updates(30, 3, f"b{w}") for w in range(8)]))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    # Small fetches: many round trips while segments are swapped under the consumer.
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=512,
        request_timeout_ms=10000,
    )
    seen: dict[bytes | None, bytes | None] = {}
    try:
        tp = kafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        position = -1
        deadline = time.monotonic() + 30
        while not (done.is_set() and position >= more[SENTINEL][0]):
            assert time.monotonic() < deadline
            for records in consumer.poll(timeout_ms=50, max_records=20).values():
                for r in records:
                    assert r.offset > position  # offsets only grow, never repeat
                    position = r.offset
                    seen[r.key] = r.value
            time.sleep(0.01)
    finally:
        consumer.close()
        thread.join()
    assert cleanings(broker, topic) > cleaned_before  # the cleaner did run meanwhile
    # The later waves rewrote every key: their last values are the final ones.
    assert seen == {key: value for key, (_, value) in more.items()}


def test_keyless_produce_to_a_compacted_topic_fails_with_invalid_record(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    topic = new_compacted_topic(bootstrap, "compact-keyless")
    errors: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": 10000})
    producer.produce(topic, value=b"no key", on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(15) == 0
    producer.produce(topic, key=b"k", value=b"keyed", on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(15) == 0
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
    assert errors[1] is None
    assert [(r.key, r.value) for r in stored_records(bootstrap, topic)] == [(b"k", b"keyed")]


def test_keyless_records_fail_alone_and_their_batch_mates_fail_as_different_records(
    broker: BrokerProcess,
) -> None:
    """librdkafka's 0011 (record_fail, variation 0): one batch, every tenth record without a key."""
    bootstrap = broker.bootstrap
    topic = new_compacted_topic(bootstrap, "compact-keyless-batch")
    errors: dict[int, int | None] = {}
    # A long linger keeps all 100 records in one batch even on a loaded machine; flush() sends it.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5000, "message.timeout.ms": 10000})
    for i in range(100):

        def report(err: KafkaError | None, msg: object, i: int = i) -> None:
            errors[i] = None if err is None else err.code()

        producer.produce(topic, key=None if i % 10 == 0 else b"%d" % i, value=b"v", on_delivery=report)
    assert producer.flush(15) == 0
    # The per-record errors name exactly the keyless records; the rest of the batch is refused too.
    assert {i for i, code in errors.items() if code == KafkaError.INVALID_RECORD} == set(range(0, 100, 10))
    assert sum(code == KafkaError._INVALID_DIFFERENT_RECORD for code in errors.values()) == 90
    assert stored_records(bootstrap, topic) == []
