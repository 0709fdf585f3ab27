"""The strom source with a ``read()`` that yields Python tuples instead of Arrow record batches:
bench/spark_bench.py's measure of what building Arrow batches gains.

Planning (offsets, partitions) is the strom source's own; each task reads its range through a
Strom Consumer and yields one tuple per record, in the source's column order, with the
timestamp as the ``datetime`` Spark wants for a timestamp column. Registered as
``bench_strom_tuples``; Spark's Python processes cannot import this module from bench/, so
spark_bench.py registers it for pickling by value.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from strom.client import Consumer, TopicPartition
from strom.spark.reader import StromInputPartition, StromStreamReader
from strom.spark.source import StromDataSource

NAME = "bench_strom_tuples"


def read_tuples(partition: InputPartition) -> Iterator[tuple[Any, ...]]:
    assert isinstance(partition, StromInputPartition)
    offsets = partition.offset_range
    tp = TopicPartition(offsets.topic, offsets.partition)
    as_datetime = datetime.datetime.fromtimestamp
    utc = datetime.UTC
    config = {**offsets.consumer_config, "enable.auto.commit": "false", "auto.offset.reset": "none"}
    with Consumer({**config, "max.poll.records": "10000"}) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, offsets.from_offset)
        while consumer.position(tp) < offsets.until_offset:
            for r in consumer.poll(1.0):
                if r.offset >= offsets.until_offset:
                    return
                yield (
                    r.key,
                    r.value,
                    r.topic,
                    r.partition,
                    r.offset,
                    as_datetime(r.timestamp / 1000, utc),
                    r.timestamp_type,
                )


class TupleStreamReader(StromStreamReader):
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_tuples(partition)


class StromTupleSource(StromDataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        reader = super().streamReader(schema)
        assert isinstance(reader, StromStreamReader)
        return TupleStreamReader(reader.options)
