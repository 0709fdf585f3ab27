"""The sink (df.write / df.writeStream with format("strom")) against a real broker.

100k rows written and read back once each; rows routed by a topic column, placed by a
partition column, with headers, string or binary values and keys; DataFrames and modes the
sink cannot write are refused with messages naming the column or mode; a streaming stage
copying one topic to another commits its source offsets to its consumer group.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import strom.spark
from spark.spark_util import (
    consume_all,
    create_topic,
    end_offsets,
    group_offsets,
    produce,
    read_batch,
    read_stream,
    topic_partitions,
)
from strom.client import TopicPartition
from strom.client.producer.partitioner import partition_for_key

ROWS = 100_000


def write(df: DataFrame, bootstrap: str, **options: str) -> None:
    # Append: Spark refuses its default mode (ErrorIfExists) for every Python data source.
    writer = df.write.format("strom").mode("append").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def test_100k_rows_written_and_read_back_once_each(bootstrap: str, spark: SparkSession) -> None:
    create_topic(bootstrap, "bulk", 4)
    df = spark.range(ROWS).selectExpr("CAST(id AS STRING) AS key", "CONCAT('value-', id) AS value")
    write(df, bootstrap, topic="bulk")

    # On the log: exactly ROWS records, none written twice.
    assert sum(end_offsets(bootstrap, topic_partitions("bulk", 4)).values()) == ROWS
    back = (
        read_batch(spark, bootstrap, subscribe="bulk")
        .load()
        .selectExpr("CAST(CAST(key AS STRING) AS LONG) AS id", "CAST(value AS STRING) AS value", "partition")
    )
    summary = back.agg(
        F.count("*").alias("rows"),
        F.count_distinct("id").alias("ids"),
        F.min("id").alias("low"),
        F.max("id").alias("high"),
        F.sum(F.when(F.col("value") != F.concat(F.lit("value-"), F.col("id")), 1).otherwise(0)).alias("bad"),
    ).first()
    assert summary is not None
    assert summary.asDict() == {"rows": ROWS, "ids": ROWS, "low": 0, "high": ROWS - 1, "bad": 0}
    # Keyed rows go where Kafka's default partitioner puts their key.
    for row in back.where("id % 997 = 0").collect():
        assert row["partition"] == partition_for_key(str(row["id"]).encode(), 4), row


def test_topic_column_routes_rows_and_the_topic_option_overrides_it(
    bootstrap: str, spark: SparkSession
) -> None:
    for topic in ("route-even", "route-odd", "route-all"):
        create_topic(bootstrap, topic, 1)
    df = spark.range(20).selectExpr(
        "IF(id % 2 = 0, 'route-even', 'route-odd') AS topic", "CAST(id AS STRING) AS value"
    )
    write(df, bootstrap)
    for topic, parity in (("route-even", 0), ("route-odd", 1)):
        values = sorted(int(r.value) for r in consume_all(bootstrap, [TopicPartition(topic, 0)]))
        assert values == list(range(parity, 20, 2))

    write(df, bootstrap, topic="route-all")
    values = sorted(int(r.value) for r in consume_all(bootstrap, [TopicPartition("route-all", 0)]))
    assert values == list(range(20))
    assert sum(end_offsets(bootstrap, topic_partitions("route-even", 1)).values()) == 10


def test_partition_column_is_honoured(bootstrap: str, spark: SparkSession) -> None:
    create_topic(bootstrap, "placed", 4)
    # The key would hash elsewhere: the partition column wins.
    df = spark.range(40).selectExpr(
        "CAST(id % 4 AS INT) AS partition", "'same-key' AS key", "CAST(id AS STRING) AS value"
    )
    write(df, bootstrap, topic="placed")
    records = consume_all(bootstrap, topic_partitions("placed", 4))
    assert sorted(int(r.value) for r in records) == list(range(40))
    for record in records:
        assert record.partition == int(record.value) % 4, record
        assert record.key == b"same-key"


def test_headers_keys_and_values_as_written(bootstrap: str, spark: SparkSession) -> None:
    create_topic(bootstrap, "shapes", 1)
    df = spark.range(3).selectExpr(
        "CAST(id AS STRING) AS value",
        "IF(id = 0, NULL, CAST(CONCAT('k', id) AS BINARY)) AS key",
        "array(named_struct('key', 'trace', 'value', CAST(CONCAT('t', id) AS BINARY)),"
        " named_struct('key', 'empty', 'value', CAST(NULL AS BINARY))) AS headers",
    )
    write(df, bootstrap, topic="shapes")
    binary = spark.createDataFrame([(b"\x00\xffraw", "text-key")], "value binary, key string")
    write(binary, bootstrap, topic="shapes")

    records = sorted(consume_all(bootstrap, [TopicPartition("shapes", 0)]), key=lambda r: r.value)
    assert [(r.key, r.value) for r in records] == [
        (b"text-key", b"\x00\xffraw"),
        (None, b"0"),
        (b"k1", b"1"),
        (b"k2", b"2"),
    ]
    assert list(records[0].headers) == []
    for record in records[1:]:
        assert list(record.headers) == [("trace", b"t" + record.value), ("empty", None)]

    # And the source reads the headers back as written.
    rows = read_batch(spark, bootstrap, subscribe="shapes", includeHeaders="true").load().collect()
    by_value = {bytes(r["value"]): r["headers"] for r in rows}
    assert [(h["key"], h["value"]) for h in by_value[b"2"]] == [("trace", bytearray(b"t2")), ("empty", None)]


@pytest.mark.parametrize(
    ("columns", "options", "named"),
    [
        ("CAST(id AS STRING) AS key", {"topic": "refused"}, "value"),
        ("id AS value", {"topic": "refused"}, "value attribute type"),
        ("CAST(id AS STRING) AS value, id AS key", {"topic": "refused"}, "key attribute type"),
        ("CAST(id AS STRING) AS value", {}, "topic"),
        ("CAST(id AS STRING) AS value, 5 AS topic", {}, "topic attribute type"),
        ("CAST(id AS STRING) AS value, 'p' AS partition", {"topic": "refused"}, "partition attribute type"),
        (
            "CAST(id AS STRING) AS value, array('h') AS headers",
            {"topic": "refused"},
            "headers attribute type",
        ),
        (
            "CAST(id AS STRING) AS value",
            {"topic": "refused", "kafka.value.serializer": "x"},
            "value.serializer",
        ),
        (
            "CAST(id AS STRING) AS value",
            {"topic": "refused", "kafka.no.such.config": "x"},
            "kafka.no.such.config",
        ),
    ],
)
def test_dataframes_the_sink_cannot_write_are_refused(
    bootstrap: str, spark: SparkSession, columns: str, options: dict[str, str], named: str
) -> None:
    df = spark.range(3).selectExpr(*columns.split(", "))
    with pytest.raises(PySparkException) as refused:
        write(df, bootstrap, **options)
    assert named in str(refused.value)


def test_missing_bootstrap_servers_is_refused(spark: SparkSession) -> None:
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(PySparkException) as refused:
        df.write.format("strom").mode("append").option("topic", "refused").save()
    assert "kafka.bootstrap.servers" in str(refused.value)


def test_overwrite_mode_is_refused(bootstrap: str, spark: SparkSession) -> None:
    create_topic(bootstrap, "kept", 1)
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(PySparkException) as refused:
        df.write.format("strom").mode("overwrite").option("kafka.bootstrap.servers", bootstrap).option(
            "topic", "kept"
        ).save()
    assert "overwrite" in str(refused.value)
    assert end_offsets(bootstrap, topic_partitions("kept", 1)) == {TopicPartition("kept", 0): 0}


def test_a_streaming_stage_copies_a_topic_and_commits_its_progress(
    bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    create_topic(bootstrap, "stage-in", 3)
    create_topic(bootstrap, "stage-out", 3)
    sources = topic_partitions("stage-in", 3)
    committer = strom.spark.register(spark)

    def run_stage() -> None:
        query = (
            read_stream(
                spark, bootstrap, subscribe="stage-in", startingOffsets="earliest", maxOffsetsPerTrigger="25"
            )
            .load()
            .selectExpr("key", "value", "partition")
            .writeStream.format("strom")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", "stage-out")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .queryName("copier")
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(120) is True
        finally:
            query.stop()
        assert query.exception() is None
        assert committer.wait_for(query, 30)

    def copied() -> list[tuple[int, bytes, bytes]]:
        return sorted(
            (r.partition, r.key, r.value) for r in consume_all(bootstrap, topic_partitions("stage-out", 3))
        )

    def originals() -> list[tuple[int, bytes, bytes]]:
        return sorted((r.partition, r.key, r.value) for r in consume_all(bootstrap, sources))

    produce(bootstrap, "stage-in", 60)
    run_stage()
    assert copied() == originals()
    assert len(copied()) == 60
    assert group_offsets(bootstrap, "strom-spark-copier") == end_offsets(bootstrap, sources)

    # A second run from the checkpoint copies only the new records and moves the group on.
    produce(bootstrap, "stage-in", 15, start=60)
    run_stage()
    assert copied() == originals()
    assert len(copied()) == 75
    ends = end_offsets(bootstrap, sources)
    assert sum(ends.values()) == 75
    assert group_offsets(bootstrap, "strom-spark-copier") == ends
