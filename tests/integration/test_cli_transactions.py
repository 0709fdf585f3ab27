"""`strom transactions` end to end: list, describe, describe-producers, abort (by start offset
and by producer id and epochs) and find-hanging, with kafka-transactions' options and columns.
Transactions are opened with Strom's transactional producer and left open (flushed, not ended)."""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from integration.clients_util import create_topic
from kafka_wire import KafkaWire, kio_request
from strom.cli.main import main
from strom.client import Consumer, Producer, TopicPartition
from strom.records.codec import RecordSpec, encode_batch

FAST = {"linger.ms": 1, "retry.backoff.ms": 20}


@dataclass
class Result:
    code: int
    out: str
    err: str

    def rows(self) -> list[list[str]]:
        return [line.split() for line in self.out.splitlines()]


Strom = Callable[..., Result]


@pytest.fixture()
def strom(capsys: pytest.CaptureFixture[str], bootstrap: str) -> Strom:
    def run(*argv: str) -> Result:
        root = logging.getLogger()
        saved = root.handlers[:], root.level  # main() configures logging for a whole process
        capsys.readouterr()
        try:
            code = main([*argv, "--bootstrap-server", bootstrap])
        except SystemExit as exc:
            code = int(exc.code or 0)
        finally:
            root.handlers[:], level = saved
            root.setLevel(level)
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


@pytest.fixture()
def open_transaction(bootstrap: str) -> Iterator[Callable[[str, int], Producer]]:
    """A producer whose transaction holds records on partition 0 of a topic, sent but not ended."""
    made: list[Producer] = []

    def make(topic: str, records: int) -> Producer:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tid", **FAST})
        made.append(producer)
        producer.init_transactions(10)
        producer.begin_transaction()
        for i in range(records):
            producer.send(topic, f"open-{i}".encode(), partition=0)
        producer.flush()
        return producer

    yield make
    for producer in made:
        producer.close(0)


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _last_stable_offset(bootstrap: str, tp: TopicPartition) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "isolation.level": "read_committed"})
    try:
        return consumer.end_offsets([tp])[tp]
    finally:
        consumer.close(0)


def test_list_and_describe_an_open_transaction(
    strom: Strom, bootstrap: str, open_transaction: Callable[[str, int], Producer]
) -> None:
    topic = _topic("cli-txn")
    create_topic(bootstrap, topic)
    producer = open_transaction(topic, 3)
    tid = f"{topic}-tid"

    listed = strom("transactions", "list")
    assert listed.code == 0, listed.err
    assert listed.rows()[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    rows = {row[0]: row for row in listed.rows()[1:]}
    assert rows[tid] == [tid, "0", str(producer._core.transactions.producer_id), "Ongoing"]  # type: ignore[union-attr]

    described = strom("transactions", "describe", "--transactional-id", tid)
    assert described.code == 0, described.err
    header, row = described.rows()
    assert header == [
        "CoordinatorId",
        "TransactionalId",
        "ProducerId",
        "ProducerEpoch",
        "TransactionState",
        "TransactionTimeoutMs",
        "CurrentTransactionStartTimeMs",
        "TransactionDurationMs",
        "TopicPartitions",
    ]
    assert row[:2] == ["0", tid] and row[4:6] == ["Ongoing", "60000"]
    assert int(row[6]) <= time.time() * 1000 and int(row[7]) >= 0
    assert row[8] == f"{topic}-0"

    producer.commit_transaction(10)
    described = strom("transactions", "describe", "--transactional-id", tid)
    assert described.rows()[1][4] == "CompleteCommit"

    missing = strom("transactions", "describe", "--transactional-id", "no-such-id")
    assert missing.code == 1
    assert "TRANSACTIONAL_ID_NOT_FOUND" in missing.err


def test_abort_by_start_offset_releases_read_committed_consumers(
    strom: Strom, bootstrap: str, open_transaction: Callable[[str, int], Producer]
) -> None:
    topic = _topic("cli-abort")
    create_topic(bootstrap, topic)
    tp = TopicPartition(topic, 0)
    open_transaction(topic, 2)
    assert _last_stable_offset(bootstrap, tp) == 0

    producers = strom("transactions", "describe-producers", "--topic", topic, "--partition", "0")
    assert producers.code == 0, producers.err
    header, row = producers.rows()
    assert header == [
        "ProducerId",
        "ProducerEpoch",
        "LatestCoordinatorEpoch",
        "LastSequence",
        "LastTimestamp",
        "CurrentTransactionStartOffset",
    ]
    assert row[3] == "1" and row[5] == "0"

    wrong = strom("transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "1")
    assert wrong.code == 1
    assert "could not find any open transactions starting at offset 1" in wrong.err

    aborted = strom("transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "0")
    assert aborted.code == 0, aborted.err
    assert _last_stable_offset(bootstrap, tp) == 3  # past the two records and the ABORT marker
    after = strom("transactions", "describe-producers", "--topic", topic, "--partition", "0")
    assert after.rows()[1][5] == "None"


def test_abort_by_producer_id_and_epochs(
    strom: Strom, bootstrap: str, open_transaction: Callable[[str, int], Producer]
) -> None:
    topic = _topic("cli-abort-id")
    create_topic(bootstrap, topic)
    tp = TopicPartition(topic, 0)
    producer = open_transaction(topic, 1)
    transactions = producer._core.transactions
    assert transactions is not None
    base = ("transactions", "abort", "--topic", topic, "--partition", "0")

    neither = strom(*base)
    assert neither.code == 2 and "--start-offset" in neither.err
    no_epoch = strom(*base, "--producer-id", str(transactions.producer_id))
    assert no_epoch.code == 2 and "--producer-epoch" in no_epoch.err

    aborted = strom(
        *base,
        "--producer-id",
        str(transactions.producer_id),
        "--producer-epoch",
        str(transactions.producer_epoch),
        "--coordinator-epoch",
        "-1",
    )
    assert aborted.code == 0, aborted.err
    assert _last_stable_offset(bootstrap, tp) == 2


def test_find_hanging_skips_transactions_their_coordinator_still_runs(
    strom: Strom, bootstrap: str, open_transaction: Callable[[str, int], Producer]
) -> None:
    topic = _topic("cli-hanging")
    create_topic(bootstrap, topic)
    open_transaction(topic, 1)
    time.sleep(0.01)  # older than the 0-minute bound below

    found = strom("transactions", "find-hanging", "--broker-id", "0", "--max-transaction-timeout", "0")
    assert found.code == 0, found.err
    assert found.rows() == [
        [
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "LastTimestamp",
            "Duration(min)",
        ]
    ]
    scoped = strom("transactions", "find-hanging", "--topic", topic, "--partition", "0")
    assert scoped.code == 0 and len(scoped.rows()) == 1

    unscoped = strom("transactions", "find-hanging")
    assert unscoped.code == 2 and "--topic or --broker-id" in unscoped.err
    partition_only = strom("transactions", "find-hanging", "--broker-id", "0", "--partition", "0")
    assert partition_only.code == 2 and "--partition needs --topic" in partition_only.err


def test_find_hanging_reports_a_transaction_no_coordinator_knows(strom: Strom, bootstrap: str) -> None:
    """A transactional batch written without a transactional id bypasses the coordinator (as in
    Kafka, how hanging transactions arise): find-hanging reports it, and abort ends it."""
    topic = _topic("cli-hanging-real")
    create_topic(bootstrap, topic)
    with KafkaWire.connect(bootstrap) as wire:
        init = kio_request("init_producer_id", 4)
        ids = wire.request(
            init.InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        batch = encode_batch(
            [RecordSpec(b"k", b"hanging")],
            producer_id=ids.producer_id,
            producer_epoch=ids.producer_epoch,
            base_sequence=0,
            is_transactional=True,
        )
        assert wire.produce(topic, batch).error_code == 0
    time.sleep(0.01)
    found = strom("transactions", "find-hanging", "--broker-id", "0", "--max-transaction-timeout", "0")
    assert found.code == 0, found.err
    rows = found.rows()[1:]
    assert [(r[0], r[1], r[2], r[5]) for r in rows] == [(topic, "0", str(ids.producer_id), "0")]
    aborted = strom("transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "0")
    assert aborted.code == 0, aborted.err
    assert _last_stable_offset(bootstrap, TopicPartition(topic, 0)) == 2
    again = strom("transactions", "find-hanging", "--broker-id", "0", "--max-transaction-timeout", "0")
    assert len(again.rows()) == 1  # the header alone
