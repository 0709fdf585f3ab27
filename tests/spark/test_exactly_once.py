"""The exactly-once streaming sink (``exactlyOnce=true``) against a real broker and real Spark.

A query copies and transforms records and a read_committed consumer sees each once, with
the ledger holding the batch ids; a batch replayed after a crash between the transactions'
commit and Spark's commit log is not written twice; a task attempt that fails mid-batch
leaves only aborted records behind; and, without Spark, a zombie attempt's transaction is
fenced by the next attempt's init_transactions.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from spark.spark_util import create_topic, end_offsets, produce, read_stream, topic_partitions
from strom.client import AdminClient, Consumer, TopicPartition
from strom.client.admin import ConfigResource, ConfigResourceType
from strom.client.errors import ProducerFencedError
from strom.client.producer import end_transactions
from strom.spark import session
from strom.spark.ledger import ensure_ledger_topic, ledger_partition, parse_entry, read_ledger
from strom.spark.options import parse_sink_options
from strom.spark.writer import LedgerView, TaskIdentity, TransactionCommitMessage, write_transaction

LEDGER = "strom-spark-ledger"
ROWS = 2000  # the retry test's


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # local[2, 2]: a failed task is retried once (spark.task.maxFailures is 1 in local mode otherwise).
    spark = session("local[2, 2]", app_name="strom-eos-tests", conf={"spark.sql.shuffle.partitions": "2"})
    yield spark
    spark.stop()


def read_committed(bootstrap: str, partitions: Sequence[TopicPartition], timeout: float = 30.0) -> list[Any]:
    """Every committed record of ``partitions``, to their last stable offsets of now."""
    config = {"bootstrap.servers": bootstrap, "isolation.level": "read_committed", "enable.auto.commit": "false"}
    with Consumer(config) as consumer:
        consumer.assign(list(partitions))
        ends = consumer.end_offsets(list(partitions))
        consumer.seek_to_beginning(list(partitions))
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, "timed out reading back"
            records.extend(consumer.poll(0.5))
    return records


def copy_query(
    spark: SparkSession, bootstrap: str, source: str, sink: str, checkpoint: Path, **options: str
) -> StreamingQuery:
    """source -> upper-cased values -> sink, exactly once, to the end of what the source holds."""
    writer = (
        read_stream(spark, bootstrap, subscribe=source, startingOffsets="earliest", **options)
        .load()
        .select("key", F.upper(F.col("value").cast("string")).alias("value"))
        .writeStream.format("strom")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("exactlyOnce", "true")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    return writer.start()


def run_to_end(query: StreamingQuery) -> None:
    try:
        assert query.awaitTermination(120) is True
    finally:
        query.stop()
    assert query.exception() is None, query.exception()


def ledger_entries(bootstrap: str, query_id: str) -> dict[int, int]:
    with Consumer({"bootstrap.servers": bootstrap}) as consumer:
        count = len(consumer.partitions_for(LEDGER))
    return read_ledger({"bootstrap.servers": bootstrap}, LEDGER, ledger_partition(query_id, count), query_id)


def expected_values(bootstrap: str, topic: str, count: int) -> Counter[bytes]:
    return Counter(f"{topic}/{seq}/v".upper().encode() for seq in range(count))


def test_a_query_copies_each_record_once_and_the_ledger_holds_its_batches(
    bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    create_topic(bootstrap, "eos-in", 2)
    create_topic(bootstrap, "eos-out", 3)
    produce(bootstrap, "eos-in", 500)
    query = copy_query(spark, bootstrap, "eos-in", "eos-out", tmp_path / "ck", maxOffsetsPerTrigger="200")
    run_to_end(query)

    out = read_committed(bootstrap, topic_partitions("eos-out", 3))
    assert Counter(r.value for r in out) == expected_values(bootstrap, "eos-in", 500)
    # Nothing was aborted: every record in the log is a committed one (plus one marker per
    # partition and transaction).
    assert sum(end_offsets(bootstrap, topic_partitions("eos-out", 3)).values()) > 500
    batches = [p.batchId for p in query.recentProgress if p.numInputRows]
    assert len(batches) == 3  # 200 + 200 + 100
    assert ledger_entries(bootstrap, str(query.id)) == {0: batches[-1], 1: batches[-1]}
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        resource = ConfigResource(ConfigResourceType.TOPIC, LEDGER)
        assert admin.describe_configs([resource])[resource]["cleanup.policy"].value == "compact"


def test_a_batch_replayed_after_its_commit_is_not_written_twice(
    bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    """What a driver killed between its EndTxns and Spark's commit log leaves: the batch's
    offsets in the offset log, its output committed, no entry in commits/. The restarted
    query replays the batch; the ledger says its tasks committed it, so they write nothing."""
    create_topic(bootstrap, "replay-in", 2)
    create_topic(bootstrap, "replay-out", 2)
    produce(bootstrap, "replay-in", 300)
    checkpoint = tmp_path / "ck"
    first = copy_query(spark, bootstrap, "replay-in", "replay-out", checkpoint)
    run_to_end(first)
    assert sorted(p.name for p in (checkpoint / "commits").iterdir() if p.name.isdigit()) == ["0"]
    for name in ("0", ".0.crc"):  # the entry and its checksum file, as if never written
        (checkpoint / "commits" / name).unlink()

    produce(bootstrap, "replay-in", 100, start=300)
    second = copy_query(spark, bootstrap, "replay-in", "replay-out", checkpoint)
    run_to_end(second)
    assert second.id == first.id
    ran = [(p.batchId, p.numInputRows) for p in second.recentProgress if p.numInputRows]
    assert ran == [(0, 300), (1, 100)]  # batch 0 again, then the new records

    out = read_committed(bootstrap, topic_partitions("replay-out", 2))
    assert Counter(r.value for r in out) == expected_values(bootstrap, "replay-in", 400)
    assert ledger_entries(bootstrap, str(second.id)) == {0: 1, 1: 1}


def test_a_task_attempt_that_fails_leaves_nothing_a_read_committed_consumer_sees(
    bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    """A UDF fails the first attempt of one task at its last row: that attempt's
    transaction is aborted (Spark's Python UDF runs ahead of the writer, so it had begun but
    sent nothing yet; the zombie test below covers an attempt whose rows reached the log), and
    the retry, in a transaction of the same id, writes every row once."""
    create_topic(bootstrap, "retry-in", 2)
    create_topic(bootstrap, "retry-out", 1)
    produce(bootstrap, "retry-in", ROWS)

    failed = tmp_path / "failed"

    @F.udf("string")
    def shout(value: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context.attemptNumber() == 0 and value.endswith(f"/{ROWS - 2}/v"):
            failed.write_text(str(context.partitionId()))
            raise RuntimeError("the first attempt fails here")
        return value.upper()

    query = (
        read_stream(spark, bootstrap, subscribe="retry-in", startingOffsets="earliest")
        .load()
        .select("key", shout(F.col("value").cast("string")).alias("value"))
        .writeStream.format("strom")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", "retry-out")
        .option("exactlyOnce", "true")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    run_to_end(query)
    assert failed.exists()  # the task did fail once, and its retry succeeded

    out = read_committed(bootstrap, [TopicPartition("retry-out", 0)])
    assert Counter(r.value for r in out) == expected_values(bootstrap, "retry-in", ROWS)


def batches_of(values: Sequence[bytes]) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch([pa.array(values, pa.binary())], names=["value"])


def test_a_zombie_attempt_is_fenced_by_the_next_one(bootstrap: str, tmp_path: Path) -> None:
    """Without Spark: attempt 1 writes and leaves its transaction open (its answer never reached
    the driver); attempt 2 of the same task fences it, aborting what it wrote. Committing
    attempt 2 commits its rows once; attempt 1's transaction can no longer be committed."""
    create_topic(bootstrap, "zombie-out", 1)
    options = parse_sink_options(
        {"kafka.bootstrap.servers": bootstrap, "topic": "zombie-out", "exactlyOnce": "true"}
    )
    ensure_ledger_topic(options.client_config(), LEDGER)
    ledger = LedgerView("zombie-query", 0, {})
    task = TaskIdentity("zombie-query", 7, 0)
    rows = [f"row-{i}".encode() for i in range(50)]
    first = write_transaction(options, ledger, task, batches_of(rows))
    second = write_transaction(options, ledger, task, batches_of(rows))
    assert isinstance(first, TransactionCommitMessage) and first.transaction is not None
    assert second.transaction is not None
    assert second.transaction.transactional_id == first.transaction.transactional_id == "strom-spark-zombie-query-0"
    assert second.transaction.producer_epoch > first.transaction.producer_epoch
    assert second.records == {"zombie-out": 50}

    with pytest.raises(ProducerFencedError):
        end_transactions(options.client_config(), [first.transaction], commit=True, timeout=30)
    end_transactions(options.client_config(), [second.transaction], commit=True, timeout=30)
    out = read_committed(bootstrap, [TopicPartition("zombie-out", 0)])
    assert sorted(r.value for r in out) == sorted(rows)
    # The ledger record committed with it (partition 0 of the ledger topic, as the view says).
    committed = read_committed(bootstrap, [TopicPartition(LEDGER, 0)])
    assert (0, 7) in [parse_entry("zombie-query", r.key, r.value) for r in committed]

