"""Strom's producer against a real broker: interoperability, partitioning, failures, back-pressure.

Records the Strom producer writes must read back byte for byte through confluent-kafka and
kafka-python; keys must land where the Java client (and librdkafka's murmur2_random, and
kafka-python) put them; a broker restart mid-stream must lose no acknowledged record and
duplicate none. The module's broker is stopped and killed by some tests and started again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import kafka
import pytest
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient

from brokerproc import BrokerProcess, free_port
from integration.clients_util import CODECS, Consumed, consume, create_topic, fetch_batches, stored_records
from strom.client.errors import ConfigException, KafkaException, KafkaTimeoutError
from strom.client.producer import AsyncProducer, FutureRecordMetadata, Producer, RecordMetadata
from strom.client.producer.partitioner import partition_for_key
from strom.protocol.errors import ErrorCode

pytestmark = pytest.mark.usefixtures("running_broker")

FAST = {
    "linger.ms": 2,
    "request.timeout.ms": 5000,
    "delivery.timeout.ms": 30000,
    "retry.backoff.ms": 50,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 300,
}


@pytest.fixture()
def make_producer(bootstrap: str) -> Iterator[Callable[..., Producer]]:
    """Producers for the test, closed at its end (at once: a failed test must not wait on them)."""
    made: list[Producer] = []

    def make(**config: Any) -> Producer:
        producer = Producer({"bootstrap.servers": bootstrap, **FAST, **config})
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.close(0)


# ---------------------------------------------------------------- interoperability


def _messages(count: int, now: int) -> list[dict[str, Any]]:
    """Keys, null keys, null and empty values, headers with null values, explicit and default timestamps."""
    messages = []
    for i in range(count):
        messages.append(
            {
                "key": None if i % 3 == 0 else b"key-%d" % i,
                "value": None if i % 7 == 3 else (b"" if i % 11 == 5 else bytes([i % 256]) * (i * 13 % 300)),
                "headers": [("h", b"%d" % i), ("null", None), ("h", b"")][: i % 4],
                "timestamp": now - 1000 + i if i % 2 else None,
                "partition": i % 2,
            }
        )
    return messages


@pytest.mark.parametrize("codec", CODECS)
def test_records_read_byte_identically_by_confluent_and_kafka_python(
    codec: str, bootstrap: str, make_producer: Callable[..., Producer]
) -> None:
    topic = f"interop-{codec}"
    create_topic(bootstrap, topic, partitions=2)
    producer = make_producer(**{"compression.type": codec})
    messages = _messages(60, int(time.time() * 1000))
    futures = [producer.send(topic, **message) for message in messages]
    producer.flush(15)
    expected = []
    for message, future in zip(messages, futures, strict=True):
        metadata = future.get(0)
        assert metadata.partition == message["partition"]
        if message["timestamp"] is not None:
            assert metadata.timestamp == message["timestamp"]
        expected.append(
            Consumed(
                metadata.partition,
                metadata.offset,
                metadata.timestamp,
                message["key"],
                message["value"],
                tuple(message["headers"]),
            )
        )
    expected.sort()
    for partition in (0, 1):
        offsets = [c.offset for c in expected if c.partition == partition]
        assert offsets == list(range(30))  # dense, in send order
    stored = stored_records(bootstrap, topic, 0) + stored_records(bootstrap, topic, 1)
    assert sorted(stored) == expected
    assert consume("confluent", bootstrap, topic, [0, 1], len(expected)) == expected
    assert consume("kafka-python", bootstrap, topic, [0, 1], len(expected)) == expected


def test_key_partitions_match_confluent_murmur2_random_and_kafka_python(
    bootstrap: str, make_producer: Callable[..., Producer]
) -> None:
    topic = "key-partitions"
    create_topic(bootstrap, topic, partitions=7)
    keys = [b"user-%d" % i for i in range(150)] + [bytes([i, 255 - i, i * 7 % 256]) for i in range(50)]
    producer = make_producer()
    ours = [producer.send(topic, b"strom", key) for key in keys]
    producer.flush(15)
    strom_partitions = [future.get(0).partition for future in ours]
    assert strom_partitions == [partition_for_key(key, 7) for key in keys]
    assert len(set(strom_partitions)) == 7

    confluent: dict[int, int] = {}
    ck = ConfluentProducer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 2})
    for index, key in enumerate(keys):
        ck.produce(
            topic, b"confluent", key, on_delivery=lambda err, msg, i=index: confluent.__setitem__(i, msg.partition())
        )
    assert ck.flush(15) == 0
    assert [confluent[i] for i in range(len(keys))] == strom_partitions

    kp = kafka.KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
    try:
        sent = [kp.send(topic, value=b"kafka-python", key=key) for key in keys]
        kp.flush(15)
        assert [future.get(15).partition for future in sent] == strom_partitions
    finally:
        kp.close(5)


def test_explicit_partition_wins_and_ignore_keys_spreads_keyed_records(
    bootstrap: str, make_producer: Callable[..., Producer]
) -> None:
    topic = "ignore-keys"
    create_topic(bootstrap, topic, partitions=3)
    producer = make_producer()
    key = b"same-key"
    assert producer.send(topic, b"v", key, partition=2).get(10).partition == 2
    spreading = make_producer(**{"partitioner.ignore.keys": True, "batch.size": 200})
    futures = [spreading.send(topic, b"x" * 50, key) for _ in range(300)]
    spreading.flush(15)
    counts = Counter(future.get(0).partition for future in futures)
    assert set(counts) == {0, 1, 2}, counts
    assert producer.partitions_for(topic) == [0, 1, 2]


# ---------------------------------------------------------------- acks, callbacks, flush, async


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_each_acks_mode_delivers_with_one_callback_per_record(
    acks: str, bootstrap: str, make_producer: Callable[..., Producer]
) -> None:
    topic = f"acks-{acks}"
    create_topic(bootstrap, topic)
    producer = make_producer(acks=acks, **{"batch.size": 2000})
    calls: list[tuple[int, RecordMetadata | None, Exception | None]] = []
    count = 500
    for i in range(count):
        producer.send(topic, b"record-%d" % i, callback=lambda m, e, i=i: calls.append((i, m, e)))
    producer.flush(15)
    assert sorted(i for i, _, _ in calls) == list(range(count))  # each callback once
    assert all(e is None and m is not None for _, m, e in calls)
    # Callbacks run in send order within a partition.
    assert [i for i, _, _ in calls] == list(range(count))
    offsets = [m.offset for _, m, _ in calls if m is not None]
    assert offsets == ([-1] * count if acks == "0" else list(range(count)))
    stored = stored_records(bootstrap, topic)
    assert [r.value for r in stored] == [b"record-%d" % i for i in range(count)]


def test_async_producer_sends_and_waits(bootstrap: str) -> None:
    topic = "async-producer"

    async def run() -> tuple[RecordMetadata, list[RecordMetadata], list[int]]:
        called: list[int] = []
        async with AsyncProducer({"bootstrap.servers": bootstrap, **FAST}) as producer:
            first = await producer.send_and_wait(topic, b"first", b"k", headers=[("h", None)])
            futures = [
                await producer.send(topic, b"n-%d" % i, callback=lambda m, e, i=i: called.append(i))
                for i in range(200)
            ]
            await producer.flush(10)
            assert all(future.done() for future in futures)
            assert await producer.partitions_for(topic) == [0]
            return first, [future.result() for future in futures], called

    first, rest, called = asyncio.run(run())
    assert (first.topic, first.partition, first.offset) == (topic, 0, 0)
    assert [m.offset for m in rest] == list(range(1, 201))
    assert called == list(range(200))
    assert stored_records(bootstrap, topic)[0].headers == (("h", None),)


def test_async_producer_futures_gather_and_take_done_callbacks_like_asyncio_futures(bootstrap: str) -> None:
    topic = "async-futures"
    create_topic(bootstrap, topic, partitions=2)

    async def run() -> None:
        async with AsyncProducer({"bootstrap.servers": bootstrap, **FAST}) as producer:
            futures = [await producer.send(topic, b"v-%d" % i, partition=i % 2) for i in range(100)]
            assert all(asyncio.isfuture(future) for future in futures)
            done: list[Any] = []
            futures[5].add_done_callback(done.append)
            metadata = await asyncio.gather(*futures)
            assert [(m.partition, m.offset) for m in metadata] == [(i % 2, i // 2) for i in range(100)]
            assert done == [futures[5]]
            assert futures[0].result() == RecordMetadata(topic, 0, 0, futures[0].result().timestamp, -1, 3)

    asyncio.run(run())


def test_a_topic_idle_for_metadata_max_idle_drops_out_and_is_fetched_again_when_used(
    make_producer: Callable[..., Producer],
) -> None:
    producer = make_producer(**{"metadata.max.idle.ms": 5000})
    metadata = producer._core.metadata
    assert metadata is not None and metadata.max_idle == 5.0
    metadata.max_idle = 0.2  # the config's floor is 5 s: shortened for the test
    assert producer.send("idle-topic", b"first").get(10).offset == 0
    time.sleep(0.3)
    # Any refresh (here: the metadata wait for a new topic) lets the idle topic go.
    assert producer.send("busy-topic", b"other").get(10).offset == 0
    assert "idle-topic" not in producer._accumulator.topics
    assert "busy-topic" in producer._accumulator.topics
    assert producer.send("idle-topic", b"second").get(10).offset == 1
    assert "idle-topic" in producer._accumulator.topics


def test_auto_created_topic_is_awaited_and_future_get_blocks_until_acknowledged(
    make_producer: Callable[..., Producer],
) -> None:
    producer = make_producer()
    future = producer.send("auto-created", b"hello")
    assert isinstance(future, FutureRecordMetadata)
    assert future.get(10).offset == 0
    assert future.done()


def test_oversized_record_raises_message_too_large(make_producer: Callable[..., Producer]) -> None:
    producer = make_producer(**{"max.request.size": 10_000})
    producer.send("too-large", b"small").get(10)
    with pytest.raises(KafkaException) as raised:
        producer.send("too-large", b"x" * 20_000)
    assert raised.value.error_code == ErrorCode.message_too_large


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_batch_above_max_message_bytes_is_split_and_every_record_lands_once_in_order(
    idempotent: bool, bootstrap: str, make_producer: Callable[..., Producer]
) -> None:
    topic = f"split-{idempotent}"
    create_topic(bootstrap, topic, config={"max.message.bytes": "3000"})
    # Without idempotence, only one request in flight keeps order across retries (as in Java).
    producer = make_producer(
        **{
            "batch.size": 20_000,
            "linger.ms": 50,
            "enable.idempotence": idempotent,
            "max.in.flight.requests.per.connection": 5 if idempotent else 1,
        }
    )
    calls: list[tuple[int, int]] = []
    futures = [
        producer.send(topic, b"%04d" % i + b"x" * 96, callback=lambda m, e, i=i: calls.append((i, m.offset if m else -1)))
        for i in range(150)
    ]
    producer.flush(15)
    assert [future.get(0).offset for future in futures] == list(range(150))
    # Each part's callbacks get their records' own offsets, built from the part's response.
    assert calls == [(i, i) for i in range(150)]
    batches = fetch_batches(bootstrap, topic)
    assert len(batches) > 1 and all(batch.header.size <= 3000 for batch in batches)
    assert [r.value[:4] for b in batches for r in b.records if r.value] == [b"%04d" % i for i in range(150)]


def test_close_zero_fails_pending_records(make_producer: Callable[..., Producer]) -> None:
    producer = make_producer(**{"linger.ms": 60_000, "delivery.timeout.ms": 120_000})
    first = producer.send("close-zero", b"first")
    producer.flush(10)  # a flush sends without waiting for linger.ms
    assert first.get(0).offset == 0
    pending = [producer.send("close-zero", b"pending-%d" % i) for i in range(10)]
    producer.close(0)
    for future in pending:
        assert isinstance(future.exception(5), KafkaException)
    with pytest.raises(KafkaException, match="closed"):
        producer.send("close-zero", b"after")


def test_close_flushes_what_is_queued(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **FAST, "linger.ms": 500})
    futures = [producer.send("close-flushes", b"r-%d" % i) for i in range(100)]
    producer.close()
    assert [future.get(0).offset for future in futures] == list(range(100))


def test_config_rules_for_idempotence_and_transactions(bootstrap: str) -> None:
    with pytest.raises(ConfigException, match="needs the idempotent producer"):
        Producer({"bootstrap.servers": bootstrap, "transactional.id": "tx", "enable.idempotence": False})
    with pytest.raises(ConfigException, match="acks must be all"):
        Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "1"})
    with pytest.raises(ConfigException, match="at most 5"):
        Producer({"bootstrap.servers": bootstrap, "enable.idempotence": "true", "max.in.flight.requests.per.connection": 6})
    with pytest.raises(ConfigException, match="unknown configuration"):
        Producer({"bootstrap.servers": bootstrap, "no.such.key": 1})


# ---------------------------------------------------------------- failures


def test_records_for_a_deleted_topic_are_retried_until_metadata_finds_it_recreated(
    bootstrap: str, make_producer: Callable[..., Producer]
) -> None:
    topic = "recreated"
    producer = make_producer()
    assert [producer.send(topic, b"old-%d" % i).get(10).offset for i in range(5)] == list(range(5))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result(15)
    # The producer's metadata still names the old partition: UNKNOWN_TOPIC_OR_PARTITION, a retriable
    # error that also asks for fresh metadata, which creates the topic again.
    futures = [producer.send(topic, b"new-%d" % i) for i in range(5)]
    producer.flush(20)
    assert [future.get(0).offset for future in futures] == list(range(5))
    assert [r.value for r in stored_records(bootstrap, topic)] == [b"new-%d" % i for i in range(5)]


class NumberedProducer(threading.Thread):
    """Sends records 0, 1, 2, ... with acks=all (idempotent) until stopped; tracks acknowledgements."""

    def __init__(self, producer: Producer, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = producer
        self.topic = topic
        self.sent = 0
        self.acked: set[int] = set()
        self.failed: dict[int, str] = {}
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def _delivered(self, number: int, metadata: RecordMetadata | None, error: Exception | None) -> None:
        with self._lock:
            if error is None:
                self.acked.add(number)
            else:
                self.failed[number] = repr(error)

    def run(self) -> None:
        while not self._stop_event.is_set():
            number = self.sent
            self.producer.send(
                self.topic,
                b"%d" % number,
                key=b"%d" % (number % 5),
                callback=lambda m, e, n=number: self._delivered(n, m, e),
            )
            self.sent += 1
            if number % 50 == 0:
                time.sleep(0.002)  # a steady stream rather than one burst

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)
        assert not self.is_alive()
        self.producer.flush(30)


@pytest.mark.parametrize("crash", [True, False], ids=["kill9", "sigterm"])
def test_broker_restart_during_produce_loses_no_acknowledged_record_and_duplicates_none(
    crash: bool, broker: BrokerProcess, make_producer: Callable[..., Producer]
) -> None:
    topic = f"restart-{'kill9' if crash else 'sigterm'}"
    create_topic(broker.bootstrap, topic, partitions=3)
    producer = make_producer(**{"batch.size": 4096})
    numbered = NumberedProducer(producer, topic)
    numbered.start()
    time.sleep(0.8)
    before = len(numbered.acked)
    broker.restart(crash=crash)
    time.sleep(0.8)
    numbered.stop()
    assert before > 100, "too few records acknowledged before the restart"
    assert numbered.failed == {}
    assert numbered.acked == set(range(numbered.sent))
    stored = [int(r.value or b"-1") for p in range(3) for r in stored_records(broker.bootstrap, topic, p)]
    duplicates = [n for n, count in Counter(stored).items() if count > 1]
    assert duplicates == []
    assert set(stored) == numbered.acked
    # Per key (one partition each), numbers are stored in send order.
    for p in range(3):
        numbers = [int(r.value or b"-1") for r in stored_records(broker.bootstrap, topic, p)]
        for key in {n % 5 for n in numbers}:
            in_key = [n for n in numbers if n % 5 == key]
            assert in_key == sorted(in_key)


def test_send_raises_after_max_block_when_the_buffer_stays_full(
    broker: BrokerProcess, make_producer: Callable[..., Producer]
) -> None:
    topic = "max-block"
    producer = make_producer(**{"batch.size": 1000, "buffer.memory": 3000, "max.block.ms": 600})
    producer.send(topic, b"known").get(10)  # metadata and connection are set up
    broker.stop()
    try:
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError, match=r"max\.block\.ms"):
            for _ in range(100):
                started = time.monotonic()
                producer.send(topic, b"x" * 600)
        blocked = time.monotonic() - started
        assert 0.5 <= blocked < 3.0, blocked
    finally:
        broker.start()


def test_metadata_for_an_unreachable_cluster_raises_after_max_block() -> None:
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{free_port()}", "max.block.ms": 700})
    try:
        for call in (lambda: producer.send("nowhere", b"v"), lambda: producer.partitions_for("nowhere")):
            started = time.monotonic()
            with pytest.raises(KafkaTimeoutError, match="not present in metadata"):
                call()
            assert 0.6 <= time.monotonic() - started < 3.0
    finally:
        producer.close(0)


def test_topic_never_created_times_out_without_auto_creation(make_producer: Callable[..., Producer]) -> None:
    producer = make_producer(**{"allow.auto.create.topics": False, "max.block.ms": 500})
    with pytest.raises(KafkaTimeoutError, match="never-created"):
        producer.send("never-created", b"v")


def test_flush_inside_a_callback_is_refused_and_close_inside_one_closes(
    make_producer: Callable[..., Producer],
) -> None:
    producer = make_producer()
    seen: list[BaseException | None] = []

    def flush_from_callback(metadata: RecordMetadata | None, error: Exception | None) -> None:
        try:
            producer.flush()
        except KafkaException as exc:
            seen.append(exc)
        producer.close()

    producer.send("callbacks", b"v", callback=flush_from_callback).get(10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not producer._thread.loop.is_closed():
        time.sleep(0.05)
    assert len(seen) == 1 and "deadlock" in str(seen[0])
    with pytest.raises(KafkaException, match="closed"):
        producer.send("callbacks", b"after")


def test_an_invalid_topic_name_raises_at_once(make_producer: Callable[..., Producer]) -> None:
    producer = make_producer(**{"max.block.ms": 5000})
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        producer.send("not a valid name!", b"v")
    assert raised.value.error_code == ErrorCode.invalid_topic_exception
    assert time.monotonic() - started < 2.0
