"""The sink: rows to records, written by an idempotent Strom producer in each Spark task.

Columns as in Spark's Kafka sink: ``value`` (string or binary, required), and optional
``key`` (string or binary), ``headers`` (array of key/value structs), ``topic``
(string; the ``topic`` option overrides it) and ``partition`` (int; otherwise the
producer's partitioner picks). A task flushes its producer before it reports success,
so a finished task's records are all acknowledged. A retried task writes its rows again:
streaming writes are at-least-once until the sink writes transactionally.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from strom.client.producer import Producer
from strom.spark.options import OptionError, SinkOptions

# Throughput settings unless the user's kafka.* options say otherwise.
_DEFAULT_PRODUCER_CONFIG = {"linger.ms": "5", "batch.size": "262144", "compression.type": "lz4"}
_TEXT_OR_BYTES = (StringType, BinaryType)


@dataclass
class StromCommitMessage(WriterCommitMessage):
    """What a task wrote: records per topic."""

    records: dict[str, int] = field(default_factory=dict)


def validate_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """Refuse a DataFrame the sink cannot write, naming the column (Spark's connector's rules)."""
    types = {f.name: f.dataType for f in schema.fields}
    if "value" not in types:
        raise OptionError("required attribute 'value' not found in the DataFrame written to strom")
    if not isinstance(types["value"], _TEXT_OR_BYTES):
        raise OptionError(f"value attribute type must be a string or binary, not {types['value'].simpleString()}")
    if "key" in types and not isinstance(types["key"], _TEXT_OR_BYTES):
        raise OptionError(f"key attribute type must be a string or binary, not {types['key'].simpleString()}")
    if options.topic is None:
        if "topic" not in types:
            raise OptionError(
                "topic option required when no 'topic' attribute is present; "
                "use the topic option to set a topic"
            )
        if not isinstance(types["topic"], StringType):
            raise OptionError(f"topic attribute type must be a string, not {types['topic'].simpleString()}")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise OptionError(
            f"partition attribute type must be an int, not {types['partition'].simpleString()}"
        )
    if "headers" in types:
        headers = types["headers"]
        element = headers.elementType if isinstance(headers, ArrayType) else None
        if not (
            isinstance(element, StructType)
            and [(f.name, type(f.dataType)) for f in element.fields]
            == [("key", StringType), ("value", BinaryType)]
        ):
            raise OptionError(
                "headers attribute type must be array<struct<key: string, value: binary>>, "
                f"not {headers.simpleString()}"
            )


def write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> StromCommitMessage:
    """Send every row, flush, and fail the task if any record was not acknowledged."""
    errors: list[BaseException] = []
    counts: dict[str, int] = {}

    def on_delivery(metadata: Any, error: BaseException | None) -> None:
        if error is not None and not errors:
            errors.append(error)

    config = {**_DEFAULT_PRODUCER_CONFIG, **options.client_config()}
    with Producer(config) as producer:
        send = producer.send
        for batch in batches:
            if errors:
                break
            names = batch.schema.names
            values = _bytes_column(batch, "value")
            count = len(values)
            keys = _bytes_column(batch, "key") if "key" in names else [None] * count
            if options.topic is not None:
                topics = [options.topic] * count
            else:
                topics = batch.column("topic").to_pylist()
            partitions = batch.column("partition").to_pylist() if "partition" in names else [None] * count
            headers: list[Any] = (
                batch.column("headers").to_pylist() if "headers" in names else [None] * count
            )
            for topic, key, value, partition, header in zip(
                topics, keys, values, partitions, headers, strict=True
            ):
                if topic is None:
                    raise OptionError("a row has a null topic and no topic option is set")
                send(
                    topic,
                    value,
                    key,
                    partition=partition,
                    headers=[(h["key"], h["value"]) for h in header] if header else None,
                    callback=on_delivery,
                )
                counts[topic] = counts.get(topic, 0) + 1
        producer.flush()
    if errors:
        raise errors[0]
    return StromCommitMessage(counts)


def _bytes_column(batch: pa.RecordBatch, name: str) -> list[bytes | None]:
    column = batch.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()  # type: ignore[no-any-return]


class _RecordWriter:
    """What both writers do in a task: ``write_batches`` with the sink's options."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StromCommitMessage:
        return write_batches(self.options, iterator)


class StromBatchWriter(_RecordWriter, DataSourceArrowWriter):
    """``df.write``: each task's rows, flushed before the task succeeds."""


class StromStreamWriter(_RecordWriter, DataSourceStreamArrowWriter):
    """Each micro-batch's tasks flush before they finish, so Spark's batch commit and abort
    (no-ops) have nothing to add until the sink writes transactionally."""
