"""An exactly-once consume-transform-produce loop, as Kafka's system tests run it
(``TransactionalMessageCopier``): read a batch from the input topic, write its transformed
records to the same partition of the output topic and the batch's consumer offsets to the
group, all in one transaction. A killed copier's successor (same transactional id) fences it,
its open transaction is aborted, and it goes on from the offsets the last committed
transaction wrote.

    python tests/eos_copier.py CLIENT BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID

CLIENT is confluent, kafka-python or strom (Strom's own client). The copier runs until it is killed; it prints
``committed N`` after each transaction. It exits 3 on a fatal error (fenced, say), which the
test answers by starting another.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

BATCH = 500
# A transaction (begin to commit) taking longer than this makes the copier exit (and the test start
# another): librdkafka 2.16's send_offsets_to_transaction() can hang past its own timeout once its
# group coordinator's broker was restarted (librdkafka issues #5456 and #5511).
STUCK_S = 20.0
# An output record is the input record's value with this appended: the "transform".
SUFFIX = b"|copied"


@contextlib.contextmanager
def watchdog() -> Iterator[None]:
    timer = threading.Timer(STUCK_S, _stuck)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _stuck() -> None:
    print(f"stuck: a transaction took over {STUCK_S:.0f} s", flush=True)
    os._exit(4)


def run_confluent(bootstrap: str, source: str, sink: str, group: str, transactional_id: str) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5})
    producer.init_transactions(60)
    consumer.subscribe([source])
    while True:
        messages = [m for m in consumer.consume(BATCH, 0.5) if m.error() is None]
        if not messages:
            continue
        with watchdog():
            try:
                producer.begin_transaction()
                for m in messages:
                    producer.produce(sink, key=m.key(), value=m.value() + SUFFIX, partition=m.partition())
                producer.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 60
                )
                producer.commit_transaction(60)
            except KafkaException as e:
                error = e.args[0]
                if not error.txn_requires_abort():
                    print(f"fatal: {error}", flush=True)
                    sys.exit(3)
                producer.abort_transaction(60)
                _rewind_confluent(consumer)
                continue
        print(f"committed {len(messages)}", flush=True)


def _rewind_confluent(consumer: Any) -> None:
    """Back to the offsets the last committed transaction wrote (its aborted batch is read again)."""
    for tp in consumer.committed(consumer.assignment(), timeout=30):
        if tp.offset >= 0:
            consumer.seek(tp)
        else:
            tp.offset = -2  # OFFSET_BEGINNING: nothing committed yet
            consumer.seek(tp)


def run_kafka_python(bootstrap: str, source: str, sink: str, group: str, transactional_id: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError, ProducerFencedError
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, linger_ms=5)
    producer.init_transactions()
    while True:
        batch = consumer.poll(timeout_ms=500, max_records=BATCH)
        records = [r for rs in batch.values() for r in rs]
        if not records:
            continue
        with watchdog():
            try:
                producer.begin_transaction()
                for r in records:
                    producer.send(sink, key=r.key, value=r.value + SUFFIX, partition=r.partition)
                offsets = {tp: OffsetAndMetadata(consumer.position(tp), "", -1) for tp in batch}
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                producer.commit_transaction()
            except ProducerFencedError as e:
                print(f"fatal: {e}", flush=True)
                sys.exit(3)
            except KafkaError as e:
                print(f"aborting: {e!r}", flush=True)
                try:
                    producer.abort_transaction()
                except KafkaError as fatal:
                    print(f"fatal: {fatal!r}", flush=True)
                    sys.exit(3)
                for tp in consumer.assignment():
                    committed = consumer.committed(tp)
                    consumer.seek(tp, committed if committed is not None else 0)
                continue
        print(f"committed {len(records)}", flush=True)


def run_strom(bootstrap: str, source: str, sink: str, group: str, transactional_id: str) -> None:
    from strom.client.consumer import Consumer, OffsetAndMetadata
    from strom.client.errors import KafkaException, TransactionFatalError
    from strom.client.producer import Producer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "max.poll.records": BATCH,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5})
    producer.init_transactions(60)
    consumer.subscribe([source])
    while True:
        records = consumer.poll(0.5)
        if not records:
            continue
        with watchdog():
            try:
                producer.begin_transaction()
                for r in records:
                    producer.send(sink, (r.value or b"") + SUFFIX, r.key, partition=r.partition)
                offsets = {tp: OffsetAndMetadata(consumer.position(tp)) for tp in consumer.assignment()}
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata(), 60)
                producer.commit_transaction(60)
            except TransactionFatalError as e:
                print(f"fatal: {e}", flush=True)
                sys.exit(3)
            except KafkaException as e:
                print(f"aborting: {e!r}", flush=True)
                try:
                    producer.abort_transaction(60)
                except KafkaException as fatal:
                    print(f"fatal: {fatal!r}", flush=True)
                    sys.exit(3)
                committed = consumer.committed(consumer.assignment(), 30)
                for tp in consumer.assignment():
                    offset = committed.get(tp)
                    consumer.seek(tp, offset.offset if offset is not None else 0)
                continue
        print(f"committed {len(records)}", flush=True)


CLIENTS = {"confluent": run_confluent, "kafka-python": run_kafka_python, "strom": run_strom}


def main() -> None:
    client, bootstrap, source, sink, group, transactional_id = sys.argv[1:7]
    CLIENTS[client](bootstrap, source, sink, group, transactional_id)


if __name__ == "__main__":
    main()
