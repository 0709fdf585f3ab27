"""Data loss: offsets a query had not read are deleted, by time retention or by DeleteRecords.

Each test reads a topic's first records (offsets 0-19) into a Parquet file sink, then 20 more
are written (20-39) and 5 after them (40-44), and the log start moves to 40 before the query
runs again. failOnDataLoss=true must stop the query with a message naming the partition and
the lost offsets 20-39; false must skip to 40 and go on. Batch reads of a range that starts
before the log start behave the same way.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Literal

import pytest
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from brokerproc import BrokerProcess
from spark.spark_util import (
    assert_exactly_once,
    assert_rows_are_self_consistent,
    create_topic,
    earliest_offsets,
    offsets_json,
    produce,
    read_batch,
    read_stream,
    wait_until,
)
from strom.client import AdminClient, AlterConfigOp, ConfigResource, RecordMetadata, TopicPartition

How = Literal["retention", "delete_records"]
HOUR_MS = 3_600_000
READ, LOST, KEPT = 20, 20, 5
LOG_START = READ + LOST


def create(bootstrap: str, topic: str, how: How) -> list[RecordMetadata]:
    """The topic, with its first records (an hour old, so that time retention can expire them)."""
    # Old records make each produce roll a new segment after a second, so the ones written
    # later sit in segments of their own.
    create_topic(bootstrap, topic, 1, {"segment.ms": "1000"} if how == "retention" else None)
    return produce(bootstrap, topic, READ, partition=0, timestamp=_an_hour_ago())


def lose(bootstrap: str, topic: str, how: How) -> tuple[list[RecordMetadata], list[RecordMetadata]]:
    """Write the records to be lost and the ones after them, then move the log start past the
    lost ones; returns (lost, kept)."""
    lost = produce(bootstrap, topic, LOST, start=READ, partition=0, timestamp=_an_hour_ago())
    if how == "retention":
        time.sleep(1.1)  # past segment.ms: the fresh records start a segment of their own
    kept = produce(bootstrap, topic, KEPT, start=READ + LOST, partition=0)
    tp = TopicPartition(topic, 0)
    assert [m.offset for m in kept] == list(range(LOG_START, LOG_START + KEPT))
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        if how == "retention":
            # Segments whose newest record is older than a minute go: all but the fresh one.
            admin.incremental_alter_configs(
                {ConfigResource("topic", topic): [AlterConfigOp("retention.ms", "60000", "set")]}
            )
        else:
            assert admin.delete_records({tp: LOG_START}) == {tp: LOG_START}
    wait_until(lambda: earliest_offsets(bootstrap, [tp])[tp] == LOG_START, f"the log start of {tp} to move")
    return lost, kept


def to_parquet(df: DataFrame, tmp_path: Path, *, available_now: bool) -> StreamingQuery:
    writer = (
        df.select("key", "value", "topic", "partition", "offset")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "output"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime="200 milliseconds")
    )
    return writer.start()


def output(spark: SparkSession, tmp_path: Path) -> list[Row]:
    return spark.read.parquet(str(tmp_path / "output")).collect()


def read_the_first_records(
    spark: SparkSession, bootstrap: str, tmp_path: Path, topic: str, first: list[RecordMetadata], fail: str
) -> DataFrame:
    df = read_stream(
        spark, bootstrap, subscribe=topic, startingOffsets="earliest", failOnDataLoss=fail
    ).load()
    query = to_parquet(df, tmp_path, available_now=True)
    assert query.awaitTermination(120) is True
    assert query.exception() is None
    assert_exactly_once(output(spark, tmp_path), first)
    return df


def assert_names_the_loss(message: str, topic: str) -> None:
    assert f"{topic}-0" in message, message
    # The lost range, 20 to 39 (or 40 exclusive), however it is written.
    assert re.search(rf"\b{READ}\b\D{{1,12}}\b({LOG_START - 1}|{LOG_START})\b", message), message


@pytest.mark.parametrize("how", ["retention", "delete_records"])
def test_fail_on_data_loss_stops_the_stream(
    bootstrap: str, spark: SparkSession, tmp_path: Path, how: How
) -> None:
    topic = f"stream-fails-{how.replace('_', '-')}"
    first = create(bootstrap, topic, how)
    df = read_the_first_records(spark, bootstrap, tmp_path, topic, first, fail="true")
    lose(bootstrap, topic, how)

    query = to_parquet(df, tmp_path, available_now=True)
    try:
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(120)
    finally:
        query.stop()
    assert not query.isActive
    assert_names_the_loss(str(failed.value), topic)
    # Nothing after the loss was written either.
    assert_exactly_once(output(spark, tmp_path), first)


@pytest.mark.parametrize(("how", "available_now"), [("retention", True), ("delete_records", False)])
def test_no_fail_on_data_loss_skips_to_the_log_start_and_goes_on(
    bootstrap: str, spark: SparkSession, tmp_path: Path, how: How, available_now: bool
) -> None:
    topic = f"stream-skips-{how.replace('_', '-')}"
    first = create(bootstrap, topic, how)
    df = read_the_first_records(spark, bootstrap, tmp_path, topic, first, fail="false")
    lost, kept = lose(bootstrap, topic, how)

    query = to_parquet(df, tmp_path, available_now=available_now)
    expected = [*first, *kept]
    try:
        if available_now:
            # It finishes by itself, past the loss.
            assert query.awaitTermination(120) is True
        else:
            # It keeps running: records written after the skip arrive too.
            wait_until(lambda: len(output(spark, tmp_path)) >= len(expected), "the records after the loss")
            assert query.isActive
            expected += produce(bootstrap, topic, 7, start=READ + LOST + KEPT, partition=0)
            wait_until(
                lambda: len(output(spark, tmp_path)) >= len(expected), "records written after the skip"
            )
            assert query.isActive
    finally:
        query.stop()
    assert query.exception() is None
    rows = output(spark, tmp_path)
    assert_exactly_once(rows, expected)
    assert_rows_are_self_consistent(rows)
    assert not {m.offset for m in lost} & {r["offset"] for r in rows}


@pytest.mark.parametrize("how", ["retention", "delete_records"])
def test_batch_read_of_lost_offsets(bootstrap: str, spark: SparkSession, how: How) -> None:
    topic = f"batch-{how.replace('_', '-')}"
    create(bootstrap, topic, how)
    _, kept = lose(bootstrap, topic, how)
    # A range that starts at offset 20, which no longer exists.
    starting = offsets_json({TopicPartition(topic, 0): READ})

    with pytest.raises(PySparkException) as failed:
        read_batch(spark, bootstrap, subscribe=topic, startingOffsets=starting).load().collect()
    assert_names_the_loss(str(failed.value), topic)

    rows = (
        read_batch(spark, bootstrap, subscribe=topic, startingOffsets=starting, failOnDataLoss="false")
        .load()
        .collect()
    )
    assert_exactly_once(rows, kept)


def _an_hour_ago() -> int:
    return int(time.time() * 1000) - HOUR_MS


def test_a_checkpoint_from_another_cluster_is_refused_not_taken_for_data_loss(
    bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    """The checkpoint of a query that read 20 records, reused against a second broker with a
    fresh log dir (another cluster) whose topic of the same name holds 5: the offsets there
    would look like data loss; the query is refused in one line that says what to do instead."""
    topic = "moved"
    create_topic(bootstrap, topic, 1)
    first = produce(bootstrap, topic, READ, partition=0)
    read_the_first_records(spark, bootstrap, tmp_path, topic, first, fail="true")
    with BrokerProcess(tmp_path / "other-broker", overrides={"num.partitions": "1"}) as other:
        create_topic(other.bootstrap, topic, 1)
        produce(other.bootstrap, topic, KEPT, partition=0)
        ids = {}
        for name, server in (("first", bootstrap), ("other", other.bootstrap)):
            with AdminClient({"bootstrap.servers": server}) as admin:
                ids[name] = admin.describe_cluster().cluster_id
        assert ids["first"] != ids["other"]
        df = read_stream(spark, other.bootstrap, subscribe=topic, startingOffsets="earliest").load()
        query = to_parquet(df, tmp_path, available_now=True)
        try:
            with pytest.raises(StreamingQueryException) as failed:
                query.awaitTermination(120)
        finally:
            query.stop()
    message = str(failed.value)
    assert "failOnDataLoss" not in message and "Data loss" not in message, message
    lines = [line for line in message.splitlines() if "CheckpointMismatchError:" in line]
    assert len(lines) == 1, message
    assert lines[0].strip() == (
        f"strom.spark.offsets.CheckpointMismatchError: the query's checkpoint was taken on Kafka cluster "
        f"{ids['first']}, but {other.bootstrap} is cluster {ids['other']}: its offsets mean nothing there. "
        "Give the query a new checkpointLocation (or delete the old checkpoint) to start over, "
        "or point it at the cluster the checkpoint belongs to."
    )
    assert_exactly_once(output(spark, tmp_path), first)  # nothing from the other cluster was written
