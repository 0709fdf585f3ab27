"""Streaming reads (spark.readStream.format("strom")) against a real broker and Spark in local mode.

Exactly once across a stop and a restart while a producer keeps writing; maxOffsetsPerTrigger
bounds and splits micro-batches; availableNow ends by itself; partitions and pattern-matching
topics that appear are read from their start; finished batches are committed to the query's
consumer group; startingOffsets for streams; the checkpoint's offsets have a stable key order.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import strom.spark
from spark.spark_util import (
    BackgroundProducer,
    assert_exactly_once,
    assert_rows_are_self_consistent,
    checkpoint_offsets,
    create_topic,
    end_offsets,
    group_offsets,
    parse_offsets,
    produce,
    read_stream,
    topic_partitions,
    wait_until,
)
from strom.client import AdminClient, TopicPartition

TRIGGER = "200 milliseconds"
COLUMNS = ("key", "value", "topic", "partition", "offset")


def data_batches(query: StreamingQuery) -> list[dict[str, Any]]:
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def to_memory(df: DataFrame, name: str, checkpoint: Path, *, available_now: bool = False) -> StreamingQuery:
    writer = (
        df.select(*COLUMNS)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=TRIGGER)
    return writer.start()


def memory_rows(spark: SparkSession, name: str) -> list[Row]:
    return spark.table(name).collect()


def to_parquet(df: DataFrame, name: str, tmp_path: Path, *, available_now: bool = False) -> StreamingQuery:
    """A file sink: it can restart from its checkpoint (the memory sink cannot) and its
    metadata log makes what it wrote exactly the committed batches."""
    writer = (
        df.select(*COLUMNS)
        .writeStream.format("parquet")
        .queryName(name)
        .option("path", str(tmp_path / "output"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=TRIGGER)
    return writer.start()


def parquet_rows(spark: SparkSession, tmp_path: Path) -> list[Row]:
    return spark.read.parquet(str(tmp_path / "output")).collect()


def run_available_now(query: StreamingQuery, timeout: int = 120) -> None:
    """An availableNow query ends by itself once it has read what existed when it started."""
    try:
        assert query.awaitTermination(timeout) is True, "the availableNow query did not end by itself"
    finally:
        query.stop()
    assert query.exception() is None


def progress_offsets(progress: Any, which: str) -> dict[TopicPartition, int]:
    """A progress report's start or end offsets of its (only) source."""
    value = progress["sources"][0][which]
    return parse_offsets(value if isinstance(value, str) else json.dumps(value))


def key_order(text: str) -> list[tuple[str, list[str]]]:
    """The topics and partition keys of an offsets JSON in the order they are written."""
    pairs = json.loads(text, object_pairs_hook=lambda items: items)
    return [(topic, [p for p, _ in partitions]) for topic, partitions in pairs if not topic.startswith("@")]


def assert_stable_key_order(text: str) -> None:
    order = key_order(text)
    topics = [topic for topic, _ in order]
    assert topics == sorted(topics), text
    for _, partitions in order:
        assert partitions == [str(p) for p in sorted(int(p) for p in partitions)], text


def test_exactly_once_while_producing_across_stop_and_restart(
    bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    topics = ["flow-a", "flow-b", "flow-c"]
    for topic in topics:
        create_topic(bootstrap, topic, 4)
    checkpoint = tmp_path / "checkpoint"
    name = "exactly_once"

    def start(*, available_now: bool = False) -> StreamingQuery:
        df = read_stream(
            spark,
            bootstrap,
            subscribe=",".join(topics),
            startingOffsets="earliest",
            maxOffsetsPerTrigger="200",
        ).load()
        return to_parquet(df, name, tmp_path, available_now=available_now)

    with BackgroundProducer(bootstrap, topics, per_second=20) as producer:
        wait_until(lambda: len(producer.acked()) >= 300, "the producer to get going", timeout=30)
        first = start()
        try:
            wait_until(lambda: len(data_batches(first)) >= 3, "three micro-batches with data")
        finally:
            first.stop()  # mid-stream: the producer is still writing
        assert first.exception() is None
        read_by_first = sum(p["numInputRows"] for p in first.recentProgress)
        acked_at_stop = len(producer.acked())
        committed = max(int(path.name) for path in (checkpoint / "commits").iterdir() if path.name.isdigit())
        committed_end = parse_offsets(checkpoint_offsets(checkpoint)[committed])

        second = start()
        try:
            wait_until(lambda: len(data_batches(second)) >= 2, "two micro-batches after the restart")
        finally:
            second.stop()
        assert second.exception() is None
        # The restart resumed where the first run's last committed batch ended.
        assert progress_offsets(second.recentProgress[0], "startOffset") == committed_end
        assert len(producer.acked()) > acked_at_stop
        acked = producer.stop()

    catch_up = start(available_now=True)
    run_available_now(catch_up)
    assert strom.spark.register(spark).wait_for(catch_up, 30)

    for query in (first, second, catch_up):
        assert all(p["numInputRows"] <= 200 for p in query.recentProgress)
    rows = parquet_rows(spark, tmp_path)
    assert read_by_first < len(rows)
    assert_exactly_once(rows, acked)
    assert_rows_are_self_consistent(rows)

    partitions = [tp for topic in topics for tp in topic_partitions(topic, 4)]
    ends = end_offsets(bootstrap, partitions)
    assert sum(ends.values()) == len(acked)
    # The last batch ended at the end of every partition, and the query's default consumer
    # group has that committed.
    offsets = checkpoint_offsets(checkpoint)
    assert parse_offsets(offsets[max(offsets)]) == ends
    assert group_offsets(bootstrap, f"strom-spark-{name}") == ends
    for text in offsets.values():
        assert_stable_key_order(text)
        assert [topic for topic, _ in key_order(text)] == topics


def test_max_offsets_per_trigger_bounds_each_batch_and_splits_by_backlog(
    bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    create_topic(bootstrap, "bounded", 4)
    backlog = {0: 40, 1: 80, 2: 120, 3: 160}
    acked = [
        m for p, n in backlog.items() for m in produce(bootstrap, "bounded", n, start=1000 * p, partition=p)
    ]
    checkpoint = tmp_path / "checkpoint"
    df = read_stream(
        spark,
        bootstrap,
        subscribe="bounded",
        startingOffsets="earliest",
        maxOffsetsPerTrigger="100",
        **{"kafka.group.id": "bounded-readers"},
    ).load()
    query = to_memory(df, "bounded", checkpoint, available_now=True)
    run_available_now(query)

    batches = data_batches(query)
    assert [b["numInputRows"] for b in batches] == [100, 100, 100, 100]
    assert all(p["numInputRows"] <= 100 for p in query.recentProgress)
    assert_exactly_once(memory_rows(spark, "bounded"), acked)
    # The first batch takes from every partition in proportion to its backlog.
    offsets = checkpoint_offsets(checkpoint)
    assert parse_offsets(offsets[0]) == {TopicPartition("bounded", p): n // 4 for p, n in backlog.items()}

    # kafka.group.id names the group the finished batches are committed to.
    assert strom.spark.register(spark).wait_for(query, 30)
    ends = end_offsets(bootstrap, topic_partitions("bounded", 4))
    assert group_offsets(bootstrap, "bounded-readers") == ends
    assert group_offsets(bootstrap, "strom-spark-bounded") == {}


def test_available_now_ends_when_caught_up_and_resumes_from_its_checkpoint(
    bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    create_topic(bootstrap, "now", 2)
    acked = produce(bootstrap, "now", 30)
    df = read_stream(spark, bootstrap, subscribe="now", startingOffsets="earliest").load()
    run_available_now(to_parquet(df, "now", tmp_path, available_now=True))
    assert_exactly_once(parquet_rows(spark, tmp_path), acked)

    # A second run from the same checkpoint reads only what came since.
    acked += produce(bootstrap, "now", 10, start=30)
    query = to_parquet(df, "now", tmp_path, available_now=True)
    run_available_now(query)
    assert sum(p["numInputRows"] for p in query.recentProgress) == 10
    assert_exactly_once(parquet_rows(spark, tmp_path), acked)

    # With nothing new it ends too, after reading nothing.
    query = to_parquet(df, "now", tmp_path, available_now=True)
    run_available_now(query)
    assert sum(p["numInputRows"] for p in query.recentProgress) == 0
    assert_exactly_once(parquet_rows(spark, tmp_path), acked)


def test_new_partitions_and_new_matching_topics_are_read_from_their_start(
    bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    create_topic(bootstrap, "grow-b", 2)
    create_topic(bootstrap, "other", 1)
    acked = produce(bootstrap, "grow-b", 10)
    produce(bootstrap, "other", 5)
    checkpoint = tmp_path / "checkpoint"
    df = read_stream(spark, bootstrap, subscribePattern="grow-.*", startingOffsets="earliest").load()
    query = to_memory(df, "grow", checkpoint)
    try:
        wait_until(lambda: len(memory_rows(spark, "grow")) >= 10, "the first records")

        # Ten more partitions: 0 and 1 get more records, 2..11 their first.
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_partitions({"grow-b": 12})
        acked += produce(bootstrap, "grow-b", 48, start=10)
        # A new topic the pattern matches, sorted before the first.
        create_topic(bootstrap, "grow-a", 3)
        acked += produce(bootstrap, "grow-a", 9)
        wait_until(lambda: len(memory_rows(spark, "grow")) >= len(acked), "the new partitions' records")
        ends = end_offsets(bootstrap, [*topic_partitions("grow-a", 3), *topic_partitions("grow-b", 12)])
        wait_until(
            lambda: (
                parse_offsets(checkpoint_offsets(checkpoint)[max(checkpoint_offsets(checkpoint))]) == ends
            ),
            "a batch ending at the end offsets",
        )
    finally:
        query.stop()
    assert query.exception() is None
    rows = memory_rows(spark, "grow")
    assert_exactly_once(rows, acked)
    assert_rows_are_self_consistent(rows)

    offsets = checkpoint_offsets(checkpoint)
    last = offsets[max(offsets)]
    # Topics sorted by name, partitions by number (10 and 11 after 9, not after 1).
    assert key_order(last) == [
        ("grow-a", ["0", "1", "2"]),
        ("grow-b", [str(p) for p in range(12)]),
    ]
    for text in offsets.values():
        assert_stable_key_order(text)


def test_starting_offsets_json_for_a_stream(bootstrap: str, spark: SparkSession, tmp_path: Path) -> None:
    create_topic(bootstrap, "from-json", 2)
    acked = produce(bootstrap, "from-json", 20)
    starting = json.dumps({"from-json": {"0": 7, "1": -2}})
    df = read_stream(spark, bootstrap, subscribe="from-json", startingOffsets=starting).load()
    query = to_memory(df, "from_json", tmp_path / "checkpoint", available_now=True)
    run_available_now(query)
    expected = [m for m in acked if m.partition == 1 or m.offset >= 7]
    assert len(expected) == 3 + 10
    assert_exactly_once(memory_rows(spark, "from_json"), expected)


def test_a_stream_starts_at_latest_by_default(bootstrap: str, spark: SparkSession, tmp_path: Path) -> None:
    create_topic(bootstrap, "from-latest", 2)
    produce(bootstrap, "from-latest", 20)
    df = read_stream(spark, bootstrap, subscribe="from-latest").load()
    query = to_memory(df, "from_latest", tmp_path / "checkpoint")
    try:
        # The first (empty) batch fixes where the query starts.
        wait_until(lambda: (tmp_path / "checkpoint" / "commits" / "0").exists(), "the first batch")
        fresh = produce(bootstrap, "from-latest", 6, start=20)
        wait_until(lambda: len(memory_rows(spark, "from_latest")) >= 6, "the new records")
    finally:
        query.stop()
    assert query.exception() is None
    assert_exactly_once(memory_rows(spark, "from_latest"), fresh)


def test_starting_timestamp_for_a_stream(bootstrap: str, spark: SparkSession, tmp_path: Path) -> None:
    create_topic(bootstrap, "from-time", 2)
    # An hour ago: within the topic's retention (a week), which would delete older records.
    base = (int(time.time()) - 3600) * 1000
    acked = [
        produce(bootstrap, "from-time", 1, start=seq, partition=seq % 2, timestamp=base + seq * 1000)[0]
        for seq in range(20)
    ]
    df = read_stream(spark, bootstrap, subscribe="from-time", startingTimestamp=str(base + 12_500)).load()
    query = to_memory(df, "from_time", tmp_path / "checkpoint", available_now=True)
    run_available_now(query)
    assert_exactly_once(memory_rows(spark, "from_time"), acked[13:])


def test_ending_offsets_are_refused_for_a_stream(bootstrap: str, spark: SparkSession, tmp_path: Path) -> None:
    create_topic(bootstrap, "no-end", 1)
    df = read_stream(spark, bootstrap, subscribe="no-end", endingOffsets="latest").load()
    with pytest.raises(PySparkException) as refused:
        query = to_memory(df, "no_end", tmp_path / "checkpoint", available_now=True)
        try:
            query.awaitTermination(60)
        finally:
            query.stop()
    assert "endingoffsets" in str(refused.value).lower()


def test_rows_carry_the_produced_metadata(bootstrap: str, spark: SparkSession, tmp_path: Path) -> None:
    create_topic(bootstrap, "described", 1)
    stamp = (int(time.time()) - 3600) * 1000 + 123
    acked = produce(bootstrap, "described", 5, timestamp=stamp)
    df = read_stream(spark, bootstrap, subscribe="described", startingOffsets="earliest").load()
    query = (
        df.selectExpr("*", "unix_millis(timestamp) AS ms")
        .writeStream.format("memory")
        .queryName("described")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    run_available_now(query)
    rows = memory_rows(spark, "described")
    assert_exactly_once(rows, acked)
    assert_rows_are_self_consistent(rows)
    assert {(r["ms"], r["timestampType"]) for r in rows} == {(stamp, 0)}
