"""The source's rows: the columns of Spark's Kafka connector, in Spark and in Arrow terms.

``headers`` exists only when the source option ``includeHeaders`` is true. The Arrow
schema must match Spark's exactly (order, types, UTC microsecond timestamps), or Spark
refuses the batches ``read()`` yields.
"""

from __future__ import annotations

import functools

import pyarrow as pa

_COLUMNS = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
_HEADERS = "headers array<struct<key: string, value: binary>>"


def source_schema_ddl(include_headers: bool) -> str:
    return f"{_COLUMNS}, {_HEADERS}" if include_headers else _COLUMNS


@functools.cache
def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(pa.field("element", header))))
    return pa.schema(fields)
