"""Strom's transactional producer and read_committed consumer against a real broker.

Committed transactions become visible to read_committed consumers (Strom's and librdkafka's)
at once and whole; aborted ones never; an open transaction holds read_committed consumers at
its first offset (the last stable offset). Offsets sent with a transaction are committed
with it and only with it. A second producer with the same transactional id fences the first.
A failed send fails the transaction, which is aborted (bumping the epoch) and followed by one
that commits.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from integration.clients_util import confluent_consumer, create_topic, fetch_batches, poll_confluent
from strom.client import (
    AdminClient,
    AsyncProducer,
    Consumer,
    KafkaException,
    OffsetAndMetadata,
    Producer,
    ProducerFencedError,
    TopicPartition,
    TransactionAbortableError,
    TransactionAbortedError,
)
from strom.protocol.errors import ErrorCode

FAST = {
    "linger.ms": 2,
    "request.timeout.ms": 5000,
    "retry.backoff.ms": 20,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 300,
}
_ids = itertools.count()


def _name(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{time.monotonic_ns()}"


@pytest.fixture()
def make_producer(bootstrap: str) -> Iterator[Callable[..., Producer]]:
    made: list[Producer] = []

    def make(transactional_id: str, **config: Any) -> Producer:
        producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **FAST, **config}
        )
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.close(0)


@pytest.fixture()
def make_consumer(bootstrap: str) -> Iterator[Callable[..., Consumer]]:
    made: list[Consumer] = []

    def make(**config: Any) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.max.wait.ms": 100,
                **config,
            }
        )
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close(0)


def _read_until(consumer: Consumer, last: bytes, timeout: float = 15.0) -> list[bytes]:
    """Values polled until the record ``last`` arrived (it included)."""
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    while last not in values:
        assert time.monotonic() < deadline, f"{last!r} not read within {timeout}s; read {values}"
        values += [record.value for record in consumer.poll(0.2) if record.value is not None]
    return values


def test_committed_transaction_is_read_whole_by_read_committed_consumers(
    bootstrap: str, make_producer: Callable[..., Producer], make_consumer: Callable[..., Consumer]
) -> None:
    topic = _name("txn-commit")
    create_topic(bootstrap, topic, partitions=2)
    producer = make_producer(_name("tid"))
    producer.init_transactions(10)
    producer.begin_transaction()
    sent = [f"v{i}".encode() for i in range(20)]
    futures = [producer.send(topic, value, partition=i % 2) for i, value in enumerate(sent)]
    producer.commit_transaction(10)
    assert all(future.done() and future.exception() is None for future in futures)

    # The data batches carry the transactional flag and the producer's id; a COMMIT marker follows.
    batches = fetch_batches(bootstrap, topic, 0)
    assert [batch.header.is_transactional for batch in batches] == [True] * len(batches)
    assert batches[-1].header.is_control and not any(batch.header.is_control for batch in batches[:-1])
    assert len({batch.header.producer_id for batch in batches}) == 1

    consumer = make_consumer(**{"isolation.level": "read_committed"})
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    consumer.assign(tps)
    got = _read_until(consumer, sent[-1]) + [r.value for r in consumer.poll(0.5)]
    assert sorted(got) == sorted(sent)  # no control record, no duplicate
    # The markers are past the records: positions and end offsets include them.
    ends = consumer.end_offsets(tps)
    assert ends == {tps[0]: 11, tps[1]: 11}
    assert [consumer.position(tp) for tp in tps] == [11, 11]


def test_aborted_transaction_is_never_read_committed(
    bootstrap: str, make_producer: Callable[..., Producer], make_consumer: Callable[..., Consumer]
) -> None:
    topic = _name("txn-abort")
    create_topic(bootstrap, topic)
    producer = make_producer(_name("tid"))
    producer.init_transactions(10)
    producer.begin_transaction()
    aborted = [producer.send(topic, f"aborted-{i}".encode()) for i in range(5)]
    producer.flush()  # sent, so that the abort discards records the log holds
    producer.abort_transaction(10)
    assert all(future.exception() is None for future in aborted)
    producer.begin_transaction()
    unsent = producer.send(topic, b"aborted-unsent")
    producer.abort_transaction(10)
    assert isinstance(unsent.exception(), TransactionAbortedError)
    producer.begin_transaction()
    producer.send(topic, b"committed")
    producer.commit_transaction(10)

    committed = make_consumer(**{"isolation.level": "read_committed"})
    committed.assign([TopicPartition(topic, 0)])
    assert _read_until(committed, b"committed") == [b"committed"]

    uncommitted = make_consumer()
    uncommitted.assign([TopicPartition(topic, 0)])
    values = _read_until(uncommitted, b"committed")
    assert values == [f"aborted-{i}".encode() for i in range(5)] + [b"committed"]

    # librdkafka's read_committed consumer agrees.
    confluent = confluent_consumer(bootstrap, **{"isolation.level": "read_committed", "group.id": _name("g")})
    try:
        confluent.subscribe([topic])
        assert [record.value for record in poll_confluent(confluent, 1, 15)] == [b"committed"]
    finally:
        confluent.close()


def test_open_transaction_holds_read_committed_consumers_at_its_start(
    bootstrap: str, make_producer: Callable[..., Producer], make_consumer: Callable[..., Consumer]
) -> None:
    topic = _name("txn-lso")
    create_topic(bootstrap, topic)
    tp = TopicPartition(topic, 0)
    plain = make_producer(_name("tid"))
    plain.init_transactions(10)
    plain.begin_transaction()
    plain.send(topic, b"before")
    plain.commit_transaction(10)  # offsets 0 and 1 (its marker)

    producer = make_producer(_name("tid"))
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(3):
        producer.send(topic, f"open-{i}".encode())
    producer.flush()

    committed = make_consumer(**{"isolation.level": "read_committed"})
    uncommitted = make_consumer(**{"max.poll.records": 1})
    assert committed.end_offsets([tp]) == {tp: 2}  # the last stable offset
    assert uncommitted.end_offsets([tp]) == {tp: 5}  # the high watermark
    # Lag counts to the high watermark, or under read_committed to the last stable offset.
    uncommitted.assign([tp])
    assert uncommitted.current_lag(tp) is None  # no fetch answered yet
    assert _read_until(uncommitted, b"before") == [b"before"]
    assert uncommitted.current_lag(tp) == 4
    committed.assign([tp])
    assert _read_until(committed, b"before") == [b"before"]
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert committed.poll(0.2) == []
    assert committed.position(tp) == 2
    assert committed.current_lag(tp) == 0

    producer.commit_transaction(10)
    assert _read_until(committed, b"open-2") == [b"open-0", b"open-1", b"open-2"]
    assert committed.end_offsets([tp]) == {tp: 6}


def test_offsets_sent_to_a_transaction_commit_with_it(
    bootstrap: str, make_producer: Callable[..., Producer], make_consumer: Callable[..., Consumer]
) -> None:
    source, sink, group = _name("txn-in"), _name("txn-out"), _name("txn-group")
    create_topic(bootstrap, source)
    create_topic(bootstrap, sink)
    seed = make_producer(_name("tid"))
    seed.init_transactions(10)
    seed.begin_transaction()
    for i in range(10):
        seed.send(source, f"in-{i}".encode())
    seed.commit_transaction(10)

    consumer = make_consumer(**{"group.id": group, "isolation.level": "read_committed"})
    consumer.subscribe([source])
    records = []
    deadline = time.monotonic() + 20
    while len(records) < 10:
        assert time.monotonic() < deadline
        records += consumer.poll(0.2)
    tp = TopicPartition(source, 0)
    metadata = consumer.group_metadata()
    assert metadata.group_id == group and metadata.generation_id >= 1 and metadata.member_id

    producer = make_producer(_name("tid"))
    producer.init_transactions(10)
    # Aborted: neither the output nor the offsets count.
    producer.begin_transaction()
    producer.send(sink, b"out-aborted")
    producer.send_offsets_to_transaction({tp: OffsetAndMetadata(5, "half")}, metadata)
    producer.abort_transaction(10)
    assert consumer.committed({tp}, timeout=10) == {tp: None}

    producer.begin_transaction()
    for record in records:
        producer.send(sink, record.value.replace(b"in", b"out"))
    producer.send_offsets_to_transaction({tp: OffsetAndMetadata(10, "all")}, metadata)
    producer.commit_transaction(10)
    committed = consumer.committed({tp}, timeout=10)[tp]
    assert committed is not None and (committed.offset, committed.metadata) == (10, "all")

    reader = make_consumer(**{"isolation.level": "read_committed"})
    reader.assign([TopicPartition(sink, 0)])
    assert _read_until(reader, b"out-9") == [f"out-{i}".encode() for i in range(10)]

    # A member id the group does not know: the group coordinator refuses, the transaction must abort.
    producer.begin_transaction()
    stale = metadata._replace(member_id="gone", generation_id=metadata.generation_id + 5)
    with pytest.raises(TransactionAbortableError):
        producer.send_offsets_to_transaction({tp: 10}, stale)
    producer.abort_transaction(10)


def test_a_second_producer_with_the_same_id_fences_the_first(
    bootstrap: str, make_producer: Callable[..., Producer], make_consumer: Callable[..., Consumer]
) -> None:
    topic = _name("txn-fence")
    create_topic(bootstrap, topic)
    transactional_id = _name("tid")
    first = make_producer(transactional_id)
    first.init_transactions(10)
    first.begin_transaction()
    first.send(topic, b"zombie")
    first.flush()

    second = make_producer(transactional_id)
    second.init_transactions(10)  # aborts the first one's transaction
    with pytest.raises(ProducerFencedError):
        first.commit_transaction(10)
    with pytest.raises(ProducerFencedError):
        first.begin_transaction()
    with pytest.raises(ProducerFencedError):
        first.send(topic, b"zombie-2")

    second.begin_transaction()
    second.send(topic, b"successor")
    second.commit_transaction(10)
    consumer = make_consumer(**{"isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0)])
    assert _read_until(consumer, b"successor") == [b"successor"]


def test_a_failed_send_fails_the_transaction_and_the_abort_recovers(
    bootstrap: str, make_producer: Callable[..., Producer], make_consumer: Callable[..., Consumer]
) -> None:
    topic = _name("txn-fail")
    create_topic(bootstrap, topic, config={"max.message.bytes": "1024"})
    producer = make_producer(_name("tid"))
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.send(topic, b"fine")
    too_large = producer.send(topic, b"x" * 4096)
    producer.flush()  # the failure arrives inside the transaction, which the abort then bumps past
    with pytest.raises(TransactionAbortableError) as failed:
        producer.commit_transaction(10)
    assert failed.value.error_code == ErrorCode.message_too_large
    assert isinstance(too_large.exception(), KafkaException)
    with pytest.raises(TransactionAbortableError):
        producer.send(topic, b"refused")
    producer.abort_transaction(10)  # with an epoch bump (KIP-360): the sequences start again

    producer.begin_transaction()
    producer.send(topic, b"after")
    producer.commit_transaction(10)
    consumer = make_consumer(**{"isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0)])
    assert _read_until(consumer, b"after") == [b"after"]
    epochs = {
        batch.header.producer_epoch
        for batch in fetch_batches(bootstrap, topic)
        if not batch.header.is_control
    }
    assert len(epochs) == 2


def test_transactional_methods_in_the_wrong_order_are_refused(
    bootstrap: str, make_producer: Callable[..., Producer]
) -> None:
    topic = _name("txn-order")
    create_topic(bootstrap, topic)
    producer = make_producer(_name("tid"))
    with pytest.raises(KafkaException, match="init_transactions"):
        producer.begin_transaction()
    with pytest.raises(KafkaException, match="init_transactions"):
        producer.send(topic, b"early")
    producer.init_transactions(10)
    with pytest.raises(KafkaException, match="begin_transaction"):
        producer.send(topic, b"outside")
    with pytest.raises(KafkaException, match="invalid transition"):
        producer.commit_transaction(10)
    producer.begin_transaction()
    with pytest.raises(KafkaException, match="invalid transition"):
        producer.begin_transaction()
    producer.commit_transaction(10)  # nothing was added: no EndTxn needed
    plain = Producer({"bootstrap.servers": bootstrap})
    try:
        with pytest.raises(KafkaException, match="need a transactional"):
            plain.begin_transaction()
    finally:
        plain.close(0)


def test_async_producer_transactions(bootstrap: str, make_consumer: Callable[..., Consumer]) -> None:
    topic = _name("txn-async")
    create_topic(bootstrap, topic)

    async def run() -> None:
        async with AsyncProducer(
            {"bootstrap.servers": bootstrap, "transactional.id": _name("tid"), **FAST}
        ) as producer:
            await producer.init_transactions(10)
            producer.begin_transaction()
            await producer.send(topic, b"async-aborted")
            await producer.flush()
            await producer.abort_transaction(10)
            producer.begin_transaction()
            future = await producer.send(topic, b"async-committed")
            await producer.commit_transaction(10)
            assert (await future).offset == 2

    asyncio.run(run())
    consumer = make_consumer(**{"isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0)])
    assert _read_until(consumer, b"async-committed") == [b"async-committed"]


def test_closing_aborts_the_open_transaction(bootstrap: str, make_consumer: Callable[..., Consumer]) -> None:
    topic = _name("txn-close")
    create_topic(bootstrap, topic)
    tp = TopicPartition(topic, 0)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": _name("tid"), **FAST})
    producer.init_transactions(10)
    producer.begin_transaction()
    sent = producer.send(topic, b"left-open")
    producer.flush()
    producer.close()  # aborted now rather than after transaction.timeout.ms
    assert sent.exception() is None
    consumer = make_consumer(**{"isolation.level": "read_committed"})
    assert consumer.end_offsets([tp]) == {tp: 2}  # the record and its ABORT marker
    consumer.assign([tp])
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        assert consumer.poll(0.1) == []
    assert consumer.position(tp) == 2


def test_describe_a_transactional_id_with_no_open_transaction(
    bootstrap: str, make_producer: Callable[..., Producer]
) -> None:
    """Kafka answers start time -1 while no transaction is open; the admin client reads it as None
    instead of failing the response (and retrying it until its timeout)."""
    transactional_id = _name("tid-idle")
    producer = make_producer(transactional_id)
    producer.init_transactions(10)
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        described = admin.describe_transactions([transactional_id], timeout=10)[transactional_id]
    assert described.state == "Empty"
    assert described.transaction_start_time_ms is None
