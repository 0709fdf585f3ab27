"""Batch reads (spark.read.format("strom")) against a real broker: offset and timestamp
ranges return exactly their records, minPartitions splits, headers, assign, and the options
Spark's Kafka connector refuses are refused with a message naming the option."""

from __future__ import annotations

import json
import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark.spark_util import (
    assert_exactly_once,
    assert_rows_are_self_consistent,
    create_topic,
    produce,
    read_batch,
)
from strom.client import RecordMetadata

SOURCE_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
# A timestamp as ms since the epoch, computed by Spark (no Python time zone in between).
_MILLIS = "unix_millis(timestamp) AS ms"
HEADERS_FIELD = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)


@pytest.fixture(scope="module")
def ranged(bootstrap: str) -> list[RecordMetadata]:
    """Topic "ranged": 3 partitions, 30 records each."""
    create_topic(bootstrap, "ranged", 3)
    return produce(bootstrap, "ranged", 90)


def test_schema_is_spark_kafka_connectors(
    bootstrap: str, spark: SparkSession, ranged: list[RecordMetadata]
) -> None:
    df = read_batch(spark, bootstrap, subscribe="ranged").load()
    assert [(f.name, f.dataType) for f in df.schema.fields] == [
        (f.name, f.dataType) for f in SOURCE_SCHEMA.fields
    ]
    assert "headers" not in df.columns


def test_all_of_a_topic_by_default(bootstrap: str, spark: SparkSession, ranged: list[RecordMetadata]) -> None:
    rows = read_batch(spark, bootstrap, subscribe="ranged").load().selectExpr("*", _MILLIS).collect()
    assert_exactly_once(rows, ranged)
    assert_rows_are_self_consistent(rows)
    by_position = {(m.topic, m.partition, m.offset): m for m in ranged}
    for row in rows:
        metadata = by_position[(row["topic"], row["partition"], row["offset"])]
        # Producer-stamped CreateTime (type 0), to the millisecond.
        assert row["timestampType"] == 0
        assert row["ms"] == metadata.timestamp


def test_offset_range_returns_exactly_those_records(
    bootstrap: str, spark: SparkSession, ranged: list[RecordMetadata]
) -> None:
    # -2 = earliest, -1 = latest; ending offsets are exclusive.
    starting = {"ranged": {"0": 5, "1": -2, "2": 10}}
    ending = {"ranged": {"0": 20, "1": 7, "2": -1}}
    rows = (
        read_batch(
            spark,
            bootstrap,
            subscribe="ranged",
            startingOffsets=json.dumps(starting),
            endingOffsets=json.dumps(ending),
        )
        .load()
        .collect()
    )
    bounds = {0: (5, 20), 1: (0, 7), 2: (10, 30)}
    expected = [m for m in ranged if bounds[m.partition][0] <= m.offset < bounds[m.partition][1]]
    assert len(expected) == 15 + 7 + 20
    assert_exactly_once(rows, expected)
    assert_rows_are_self_consistent(rows)


def test_an_empty_range_reads_nothing(
    bootstrap: str, spark: SparkSession, ranged: list[RecordMetadata]
) -> None:
    at_end = json.dumps({"ranged": {"0": 30, "1": 30, "2": 30}})
    df = read_batch(spark, bootstrap, subscribe="ranged", startingOffsets=at_end).load()
    assert df.collect() == []
    same = json.dumps({"ranged": {"0": 4, "1": 4, "2": 4}})
    df = read_batch(spark, bootstrap, subscribe="ranged", startingOffsets=same, endingOffsets=same).load()
    assert df.collect() == []


@pytest.mark.parametrize(
    ("option", "value", "missing"),
    [
        ("startingOffsets", {"ranged": {"1": 25}}, "ranged-0, ranged-2"),
        ("endingOffsets", {"ranged": {"0": 3, "1": -1}}, "ranged-2"),
        ("startingOffsetsByTimestamp", {"ranged": {"0": 0, "2": 0}}, "ranged-1"),
    ],
)
def test_offsets_json_must_name_every_partition_read(
    bootstrap: str,
    spark: SparkSession,
    ranged: list[RecordMetadata],
    option: str,
    value: dict[str, dict[str, int]],
    missing: str,
) -> None:
    """As Spark's connector asserts: JSON offsets (or timestamps) name exactly the partitions the
    source reads, -2/-1 for earliest/latest; no partition is silently read from an edge."""
    with pytest.raises(PySparkException) as refused:
        read_batch(spark, bootstrap, subscribe="ranged", **{option: json.dumps(value)}).load().collect()
    lines = [line for line in str(refused.value).splitlines() if "OffsetLookupError:" in line]
    assert len(lines) == 1, str(refused.value)
    assert f"option '{option}' must name every partition the source reads, and no other " in lines[0]
    assert f"it does not name {missing})" in lines[0], lines[0]
    # A partition of a topic the source does not read is refused too.
    every = json.dumps({"ranged": {"0": -2, "1": -2, "2": -2}, "other": {"0": 0}})
    with pytest.raises(PySparkException) as refused:
        read_batch(spark, bootstrap, subscribe="ranged", startingOffsets=every).load().collect()
    assert "the source does not read other-0" in str(refused.value)


def test_timestamp_range_returns_exactly_those_records(bootstrap: str, spark: SparkSession) -> None:
    create_topic(bootstrap, "timed", 2)
    base = (int(time.time()) - 3600) * 1000
    # Record seq has timestamp base + seq seconds, in partition seq % 2.
    acked = [
        produce(bootstrap, "timed", 1, start=seq, partition=seq % 2, timestamp=base + seq * 1000)[0]
        for seq in range(40)
    ]
    seq_of = {(m.partition, m.offset): seq for seq, m in enumerate(acked)}

    rows = (
        read_batch(
            spark,
            bootstrap,
            subscribe="timed",
            startingTimestamp=str(base + 10_000),
            endingTimestamp=str(base + 30_000),
        )
        .load()
        .selectExpr("*", _MILLIS)
        .collect()
    )
    # The start is the first offset at or after the starting timestamp, the end (exclusive)
    # the first at or after the ending one.
    assert_exactly_once(rows, [m for seq, m in enumerate(acked) if 10 <= seq < 30])
    for row in rows:
        assert row["ms"] == base + seq_of[(row["partition"], row["offset"])] * 1000

    by_partition = (
        read_batch(
            spark,
            bootstrap,
            subscribe="timed",
            startingOffsetsByTimestamp=json.dumps({"timed": {"0": base + 4_000, "1": base + 15_000}}),
            endingOffsetsByTimestamp=json.dumps({"timed": {"0": base + 20_000, "1": base + 35_000}}),
        )
        .load()
        .collect()
    )
    wanted = [
        m
        for seq, m in enumerate(acked)
        if (m.partition == 0 and 4 <= seq < 20) or (m.partition == 1 and 15 <= seq < 35)
    ]
    assert len(wanted) == 8 + 10
    assert_exactly_once(by_partition, wanted)


def test_starting_timestamp_after_every_record(bootstrap: str, spark: SparkSession) -> None:
    create_topic(bootstrap, "timed-late", 1)
    base = (int(time.time()) - 3600) * 1000
    produce(bootstrap, "timed-late", 5, partition=0, timestamp=base)
    later = str(base + 60_000)
    # The default strategy "error" refuses a starting timestamp nothing matches ...
    with pytest.raises(PySparkException) as refused:
        read_batch(spark, bootstrap, subscribe="timed-late", startingTimestamp=later).load().collect()
    assert "timed-late-0" in str(refused.value)
    assert "startingOffsetsByTimestampStrategy" in str(refused.value)
    # ... and "latest" starts such partitions at their end: nothing to read.
    rows = (
        read_batch(
            spark,
            bootstrap,
            subscribe="timed-late",
            startingTimestamp=later,
            startingOffsetsByTimestampStrategy="latest",
        )
        .load()
        .collect()
    )
    assert rows == []


def test_min_partitions_splits_into_at_least_that_many(
    bootstrap: str, spark: SparkSession, ranged: list[RecordMetadata]
) -> None:
    plain = read_batch(spark, bootstrap, subscribe="ranged").load()
    assert plain.rdd.getNumPartitions() == 3  # one per Kafka partition
    split = read_batch(spark, bootstrap, subscribe="ranged", minPartitions="7").load()
    assert split.rdd.getNumPartitions() >= 7
    rows = split.collect()
    assert_exactly_once(rows, ranged)
    # Each Spark partition keeps its Kafka partition's offsets in order.
    per_task = split.rdd.glom().collect()
    assert sum(len(task) for task in per_task) == 90
    for task in per_task:
        offsets = [(row["partition"], row["offset"]) for row in task]
        assert offsets == sorted(offsets)
        assert len({p for p, _ in offsets}) <= 1


def test_include_headers_adds_the_headers_column(bootstrap: str, spark: SparkSession) -> None:
    create_topic(bootstrap, "headed", 1)
    headers = [("trace", b"abc"), ("empty", None), ("trace", b"\x00\xff")]
    produce(bootstrap, "headed", 3, partition=0, headers=headers)
    produce(bootstrap, "headed", 1, start=3, partition=0)

    with_headers = read_batch(spark, bootstrap, subscribe="headed", includeHeaders="true").load()
    assert with_headers.schema.fields == [*SOURCE_SCHEMA.fields, HEADERS_FIELD]
    rows = sorted(with_headers.collect(), key=lambda row: row["offset"])
    assert len(rows) == 4
    for row in rows[:3]:
        assert [
            (h["key"], None if h["value"] is None else bytes(h["value"])) for h in row["headers"]
        ] == headers
    assert rows[3]["headers"] == []

    without = read_batch(spark, bootstrap, subscribe="headed", includeHeaders="false").load()
    assert "headers" not in without.columns
    assert without.count() == 4


def test_assign_reads_only_the_assigned_partitions(
    bootstrap: str, spark: SparkSession, ranged: list[RecordMetadata]
) -> None:
    rows = read_batch(spark, bootstrap, assign=json.dumps({"ranged": [0, 2]})).load().collect()
    assert_exactly_once(rows, [m for m in ranged if m.partition in (0, 2)])


def test_subscribe_pattern_reads_every_matching_topic(
    bootstrap: str, spark: SparkSession, ranged: list[RecordMetadata]
) -> None:
    create_topic(bootstrap, "rangedextra", 1)
    extra = produce(bootstrap, "rangedextra", 4)
    create_topic(bootstrap, "xranged", 1)
    produce(bootstrap, "xranged", 2)
    # The pattern must match a whole topic name, as in Java's Pattern.matcher().matches().
    rows = read_batch(spark, bootstrap, subscribePattern="ranged.*").load().collect()
    assert_exactly_once(rows, [*ranged, *extra])


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "ranged", "startingOffsets": "latest"}, "startingOffsets"),
        ({"subscribe": "ranged", "startingOffsets": '{"ranged": {"0": -1}}'}, "latest"),
        ({"subscribe": "ranged", "endingOffsets": "earliest"}, "endingOffsets"),
        ({"subscribe": "ranged", "endingOffsets": '{"ranged": {"0": -2}}'}, "earliest"),
        ({"subscribe": "ranged", "kafka.auto.offset.reset": "earliest"}, "auto.offset.reset"),
        ({"subscribe": "ranged", "kafka.key.deserializer": "x"}, "key.deserializer"),
        ({"subscribe": "ranged", "kafka.value.deserializer": "x"}, "value.deserializer"),
        ({"subscribe": "ranged", "kafka.enable.auto.commit": "true"}, "enable.auto.commit"),
        ({"subscribe": "ranged", "assign": '{"ranged": [0]}'}, "assign"),
        ({"subscribe": "ranged", "subscribePattern": "r.*"}, "subscribePattern"),
        ({}, "subscribe"),
        ({"subscribe": "ranged", "minPartitions": "0"}, "minPartitions"),
        ({"subscribe": "ranged", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"subscribe": "ranged", "startingOffsets": "{not json"}, "startingOffsets"),
    ],
)
def test_refused_options_name_the_option(
    bootstrap: str, spark: SparkSession, ranged: list[RecordMetadata], options: dict[str, str], named: str
) -> None:
    with pytest.raises(PySparkException) as refused:
        read_batch(spark, bootstrap, **options).load().collect()
    assert named in str(refused.value)


def test_missing_bootstrap_servers_is_refused(spark: SparkSession) -> None:
    with pytest.raises(PySparkException) as refused:
        spark.read.format("strom").option("subscribe", "ranged").load().collect()
    assert "kafka.bootstrap.servers" in str(refused.value)
