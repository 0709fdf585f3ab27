"""The executor side of a read: one offset range of one partition, as Arrow record batches.

A Spark task gets an ``OffsetRangePartition``, which carries everything the read needs
(Spark runs ``read()`` in a Python worker on a copy of the reader made when the query
started, so nothing else may be relied on). A Strom consumer assigned to the partition
reads from the range's start to its end; the records come back as Arrow record batches
with the source's schema, decoded column by column (``strom.spark.arrow_decoder``).

Offsets in the range may be missing for good reasons (compaction, transaction markers);
offsets deleted by retention before the read are data loss, which fails the read or is
skipped and logged, per ``failOnDataLoss``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from strom.client.cluster import TopicPartition
from strom.client.consumer import Consumer, FetchedBatch
from strom.client.consumer.structs import OffsetOutOfRangeError
from strom.spark.arrow_decoder import MAX_PAYLOAD, decode_batches
from strom.spark.schema import arrow_schema

log = logging.getLogger("strom.spark")

# Rows per Arrow batch: large enough that Spark's per-batch cost vanishes, small enough to stream.
RECORDS_PER_BATCH = 10_000
# Settings the read needs whatever the user passed: no group, no auto commit, and an
# out-of-range position reported rather than silently reset.
_FIXED_CONSUMER_CONFIG = {
    "enable.auto.commit": "false",
    "auto.offset.reset": "none",
    "max.poll.records": str(RECORDS_PER_BATCH),
}


class DataLossError(RuntimeError):
    """Offsets a query had not read are gone (retention, or a deleted and re-created topic)."""


def data_loss_message(tp: TopicPartition, lost_from: int, lost_until: int, cause: str) -> str:
    return (
        f"Data loss in {tp}: offsets {lost_from} to {lost_until - 1} are no longer available ({cause}) "
        "and the query had not read them."
    )


def report_data_loss(fail: bool, message: str) -> None:
    if fail:
        raise DataLossError(f"{message} Set the source option failOnDataLoss to false to skip lost offsets and go on.")
    log.warning("%s Skipped (failOnDataLoss=false).", message)


@dataclass(frozen=True)
class OffsetRangePartition:
    """What one Spark task reads: offsets [from_offset, until_offset) of one partition."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    consumer_config: dict[str, str] = field(default_factory=dict)
    include_headers: bool = False
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def read_range(part: OffsetRangePartition) -> Iterator[pa.RecordBatch]:
    """The range's records, in offset order, as Arrow record batches."""
    if part.until_offset <= part.from_offset:
        return
    schema = arrow_schema(part.include_headers)
    tp = part.tp
    consumer = Consumer({**part.consumer_config, **_FIXED_CONSUMER_CONFIG})
    try:
        consumer.assign([tp])
        consumer.seek(tp, part.from_offset)
        position = part.from_offset
        until = part.until_offset
        last_progress = time.monotonic()
        while position < until:
            try:
                batches = consumer.poll_batches(1.0)
            except OffsetOutOfRangeError:
                position = _skip_lost(consumer, part, position)
                consumer.seek(tp, position)
                continue
            for chunk in _chunks(batches):
                rows = decode_batches(chunk, schema, part.topic, part.partition, until, part.include_headers)
                if rows.num_rows:
                    yield rows
                last_progress = time.monotonic()
            # Control batches and compacted-away records move the position without records.
            position = max(position, consumer.position(tp))
            if position < until and time.monotonic() - last_progress > part.poll_timeout_ms / 1000:
                position = _check_stalled(consumer, part, position)
                last_progress = time.monotonic()
    finally:
        consumer.close()


def _chunks(batches: list[FetchedBatch]) -> Iterator[list[FetchedBatch]]:
    """The batches in runs of at most MAX_PAYLOAD bytes (a batch larger than that alone)."""
    chunk: list[FetchedBatch] = []
    size = 0
    for batch in batches:
        batch_size = batch.limit - batch.position
        if chunk and size + batch_size > MAX_PAYLOAD:
            yield chunk
            chunk, size = [], 0
        chunk.append(batch)
        size += batch_size
    if chunk:
        yield chunk


def _skip_lost(consumer: Consumer, part: OffsetRangePartition, position: int) -> int:
    """The position after offsets retention deleted (OFFSET_OUT_OF_RANGE at ``position``)."""
    tp = part.tp
    earliest = consumer.beginning_offsets([tp])[tp]
    latest = consumer.end_offsets([tp])[tp]
    if position < earliest:
        lost_until = min(earliest, part.until_offset)
        report_data_loss(
            part.fail_on_data_loss,
            data_loss_message(tp, position, lost_until, "deleted by retention or DeleteRecords"),
        )
        return lost_until
    # Past the end: the log was truncated or the topic re-created with fewer records.
    report_data_loss(
        part.fail_on_data_loss,
        data_loss_message(tp, max(position, latest), part.until_offset, f"the log now ends at {latest}"),
    )
    return part.until_offset


def _check_stalled(consumer: Consumer, part: OffsetRangePartition, position: int) -> int:
    """No records for pollTimeoutMs: data loss if the offsets are gone, a timeout if not."""
    tp = part.tp
    latest = consumer.end_offsets([tp])[tp]
    if latest <= position:
        report_data_loss(
            part.fail_on_data_loss,
            data_loss_message(tp, position, part.until_offset, f"the log now ends at {latest}"),
        )
        return part.until_offset
    raise TimeoutError(
        f"no records from {tp} at offset {position} within kafkaConsumer.pollTimeoutMs "
        f"({part.poll_timeout_ms} ms) though the log ends at {latest}"
    )
