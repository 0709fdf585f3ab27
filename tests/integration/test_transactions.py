"""Transactions on a single node with real clients: confluent-kafka (librdkafka) and kafka-python.

A transactional producer's committed records reach read_committed consumers, aborted ones never
do, an open transaction holds read_committed consumers at its first offset (the LSO), a second
producer with the same transactional id fences the first, an abandoned transaction is aborted
after its timeout, and offsets sent to a transaction commit with it.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from integration.clients_util import confluent_consumer, create_topic, poll_confluent
from kafka_wire import LATEST, KafkaWire, kio_request
from strom.protocol.errors import ErrorCode
from strom.records.codec import RecordSpec, encode_batch

BROKER_CONFIG = {
    "transaction.state.log.num.partitions": "5",
    "offsets.topic.num.partitions": "5",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
    "group.initial.rebalance.delay.ms": "0",
}


def _producer(bootstrap: str, transactional_id: str, **extra: Any) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 2,
            "transaction.timeout.ms": 20000,
            **extra,
        }
    )


@pytest.fixture()
def topic(bootstrap: str) -> str:
    name = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, name, partitions=2)
    return name


@pytest.fixture()
def producer(bootstrap: str) -> Iterator[Producer]:
    p = _producer(bootstrap, f"tx-{uuid.uuid4().hex[:8]}")
    p.init_transactions(15)
    yield p
    p.flush(1)


def _read(bootstrap: str, topic: str, count: int, isolation: str, timeout: float = 10.0) -> list[bytes]:
    consumer = confluent_consumer(bootstrap, **{"isolation.level": isolation, "group.id": uuid.uuid4().hex})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        return sorted(c.value for c in poll_confluent(consumer, count, timeout) if c.value is not None)
    finally:
        consumer.close()


def _send(producer: Producer, topic: str, values: list[bytes]) -> None:
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % 2)
    producer.flush(10)


def test_committed_records_reach_read_committed_consumers(bootstrap: str, topic: str, producer: Producer) -> None:
    values = [f"c{i}".encode() for i in range(10)]
    producer.begin_transaction()
    _send(producer, topic, values)
    producer.commit_transaction(15)
    assert _read(bootstrap, topic, 10, "read_committed") == sorted(values)
    assert _read(bootstrap, topic, 10, "read_uncommitted") == sorted(values)


def test_aborted_records_never_reach_read_committed_consumers(
    bootstrap: str, topic: str, producer: Producer
) -> None:
    aborted = [f"a{i}".encode() for i in range(10)]
    committed = [f"c{i}".encode() for i in range(6)]
    producer.begin_transaction()
    _send(producer, topic, aborted)
    producer.abort_transaction(15)
    producer.begin_transaction()
    _send(producer, topic, committed)
    producer.commit_transaction(15)
    # Waiting for more than the committed records shows no aborted one comes after them.
    assert _read(bootstrap, topic, 7, "read_committed", timeout=3) == sorted(committed)
    assert _read(bootstrap, topic, 16, "read_uncommitted") == sorted(aborted + committed)


def test_an_open_transaction_holds_read_committed_consumers_at_its_first_offset(
    bootstrap: str, topic: str, producer: Producer
) -> None:
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, value=b"before", partition=0)
    plain.flush(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(10)
    plain.produce(topic, value=b"after", partition=0)
    plain.flush(10)
    consumer = confluent_consumer(bootstrap, **{"isolation.level": "read_committed", "group.id": uuid.uuid4().hex})
    try:
        # The LSO is the open transaction's first offset (1); the HW is past the later record.
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (0, 1)
        consumer.assign([TopicPartition(topic, 0, 0)])
        assert [c.value for c in poll_confluent(consumer, 2, 2)] == [b"before"]
        producer.commit_transaction(15)
        assert [c.value for c in poll_confluent(consumer, 2, 10)] == [b"open", b"after"]
    finally:
        consumer.close()
    uncommitted = confluent_consumer(bootstrap, **{"isolation.level": "read_uncommitted"})
    try:
        assert uncommitted.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] == 4  # with the marker
    finally:
        uncommitted.close()


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(bootstrap: str, topic: str) -> None:
    transactional_id = f"fence-{uuid.uuid4().hex[:8]}"
    first = _producer(bootstrap, transactional_id)
    first.init_transactions(15)
    first.begin_transaction()
    _send(first, topic, [b"zombie"])
    second = _producer(bootstrap, transactional_id)
    # Aborts the first producer's open transaction (with a bumped epoch) before it answers.
    second.init_transactions(15)
    with pytest.raises(KafkaException) as raised:
        first.commit_transaction(10)
    error: KafkaError = raised.value.args[0]
    assert error.fatal() and error.code() == KafkaError._FENCED
    second.begin_transaction()
    _send(second, topic, [b"winner"])
    second.commit_transaction(15)
    assert _read(bootstrap, topic, 2, "read_committed", timeout=3) == [b"winner"]


def test_an_abandoned_transaction_is_aborted_after_its_timeout(bootstrap: str, topic: str) -> None:
    abandoned = _producer(bootstrap, f"abandon-{uuid.uuid4().hex[:8]}", **{"transaction.timeout.ms": 1000})
    abandoned.init_transactions(15)
    abandoned.begin_transaction()
    _send(abandoned, topic, [b"lost"])
    time.sleep(2.5)
    # The coordinator aborted it: the LSO moved past the transaction, with no record visible.
    consumer = confluent_consumer(bootstrap, **{"isolation.level": "read_committed", "group.id": uuid.uuid4().hex})
    try:
        high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        assert high == 2  # the record and the ABORT marker
        consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        assert poll_confluent(consumer, 1, 2) == []
    finally:
        consumer.close()
    with pytest.raises(KafkaException):
        abandoned.commit_transaction(10)


def test_offsets_sent_to_a_transaction_commit_with_it(bootstrap: str, topic: str, producer: Producer) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = confluent_consumer(bootstrap, **{"group.id": group})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 15
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.1)
        offsets = [TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 7)]
        producer.begin_transaction()
        _send(producer, topic, [b"x"])
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 15)
        producer.abort_transaction(15)
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        assert [tp.offset for tp in committed] == [-1001, -1001]  # aborted: nothing committed
        producer.begin_transaction()
        _send(producer, topic, [b"y"])
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 15)
        producer.commit_transaction(15)
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        assert [tp.offset for tp in committed] == [5, 7]
    finally:
        consumer.close()


# ---------------------------------------------------------------- the operators' APIs, on the wire


def _wire(bootstrap: str) -> KafkaWire:
    return KafkaWire.connect(bootstrap)


def test_describe_and_list_transactions(bootstrap: str, topic: str) -> None:
    transactional_id = f"described-{uuid.uuid4().hex[:8]}"
    producer = _producer(bootstrap, transactional_id)
    producer.init_transactions(15)
    producer.begin_transaction()
    _send(producer, topic, [b"d0", b"d1"])
    with _wire(bootstrap) as wire:
        describe = kio_request("describe_transactions", 0)
        (state,) = wire.request(
            describe.DescribeTransactionsRequest(transactional_ids=(transactional_id,))
        ).transaction_states
        assert (state.error_code, state.transaction_state) == (ErrorCode.none, "Ongoing")
        assert [(t.topic, sorted(t.partitions)) for t in state.topics] == [(topic, [0, 1])]
        assert state.transaction_timeout == datetime.timedelta(seconds=20)
        (missing,) = wire.request(
            describe.DescribeTransactionsRequest(transactional_ids=("nobody-has-this-id",))
        ).transaction_states
        assert missing.error_code == ErrorCode.transactional_id_not_found

        list_ = kio_request("list_transactions", 1)
        listed = wire.request(
            list_.ListTransactionsRequest(state_filters=("Ongoing",), producer_id_filters=(), duration_filter=-1)
        )
        assert (transactional_id, "Ongoing") in [
            (t.transactional_id, t.transaction_state) for t in listed.transaction_states
        ]
        bogus = wire.request(
            list_.ListTransactionsRequest(state_filters=("Bogus",), producer_id_filters=(), duration_filter=-1)
        )
        assert bogus.unknown_state_filters == ("Bogus",)
        producer.commit_transaction(15)  # answered once PrepareCommit is written; Complete follows
        deadline = time.monotonic() + 10
        while True:
            (state,) = wire.request(
                describe.DescribeTransactionsRequest(transactional_ids=(transactional_id,))
            ).transaction_states
            if state.transaction_state != "PrepareCommit" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (state.transaction_state, state.topics) == ("CompleteCommit", ())


def test_a_hanging_transaction_is_found_and_aborted_with_write_txn_markers(bootstrap: str, topic: str) -> None:
    """A transactional batch written without a transactional id skips the coordinator (as in
    Kafka, where that is how hanging transactions arise); DescribeProducers shows it holding the
    LSO, and WriteTxnMarkers (what ``kafka-transactions.sh abort`` sends) ends it."""
    with _wire(bootstrap) as wire:
        init = kio_request("init_producer_id", 4)
        ids = wire.request(
            init.InitProducerIdRequest(
                transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1
            )
        )
        batch = encode_batch(
            [RecordSpec(b"k", b"hanging")],
            producer_id=ids.producer_id,
            producer_epoch=ids.producer_epoch,
            base_sequence=0,
            is_transactional=True,
        )
        assert wire.produce(topic, batch).error_code == ErrorCode.none
        assert wire.list_offset(topic, LATEST, isolation_level=1) == 0  # held by the open transaction
        assert wire.list_offset(topic, LATEST) == 1

        describe = kio_request("describe_producers", 0)
        response = wire.request(
            describe.DescribeProducersRequest(topics=(describe.TopicRequest(name=topic, partition_indexes=(0,)),))
        )
        (partition,) = response.topics[0].partitions
        (producer,) = partition.active_producers
        assert (producer.producer_id, producer.current_txn_start_offset) == (ids.producer_id, 0)

        markers = kio_request("write_txn_markers", 1)
        response = wire.request(
            markers.WriteTxnMarkersRequest(
                markers=(
                    markers.WritableTxnMarker(
                        producer_id=ids.producer_id,
                        producer_epoch=ids.producer_epoch,
                        transaction_result=False,
                        topics=(markers.WritableTxnMarkerTopic(name=topic, partition_indexes=(0,)),),
                        coordinator_epoch=producer.coordinator_epoch,
                    ),
                )
            )
        )
        assert response.markers[0].topics[0].partitions[0].error_code == ErrorCode.none
        assert wire.list_offset(topic, LATEST, isolation_level=1) == 2  # past the ABORT marker
    assert _read(bootstrap, topic, 1, "read_committed", timeout=2) == []


def test_require_stable_waits_for_a_pending_transactional_commit(
    bootstrap: str, topic: str, producer: Producer
) -> None:
    group = f"stable-{uuid.uuid4().hex[:8]}"
    fetch = kio_request("offset_fetch", 7)

    def offset_fetch(require_stable: bool) -> tuple[int, int]:
        with _wire(bootstrap) as wire:
            response = wire.request(
                fetch.OffsetFetchRequest(
                    group_id=group,
                    topics=(fetch.OffsetFetchRequestTopic(name=topic, partition_indexes=(0,)),),
                    require_stable=require_stable,
                )
            )
        (partition,) = response.topics[0].partitions
        return partition.error_code, partition.committed_offset

    standalone = confluent_consumer(bootstrap, **{"group.id": group})  # its group's metadata
    producer.begin_transaction()
    _send(producer, topic, [b"s"])
    producer.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 42)], standalone.consumer_group_metadata(), 15
    )
    standalone.close()
    assert offset_fetch(require_stable=True) == (ErrorCode.unstable_offset_commit, -1)
    assert offset_fetch(require_stable=False) == (ErrorCode.none, -1)  # the pending one is not visible
    producer.commit_transaction(15)
    deadline = time.monotonic() + 10
    while offset_fetch(require_stable=True)[0] != ErrorCode.none and time.monotonic() < deadline:
        time.sleep(0.05)
    assert offset_fetch(require_stable=True) == (ErrorCode.none, 42)
