"""The driver side of reads: batch reads of an offset range, and micro-batches of a stream.

Spark calls these in Python processes on the driver: ``partitions()`` plans one task per
partition range (more with ``minPartitions``), ``latestOffset()`` decides where the next
micro-batch ends. ``read()`` runs on executors and uses only the partition object it is
given (``strom.spark.partition_reader``).

A stream's offsets are the next offset to read per partition. Partitions that appear
while a query runs (added partitions, new topics matching a pattern) start at their
earliest offset, so nothing written to them is missed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from strom.client.cluster import TopicPartition
from strom.spark.offset_reader import OffsetReader
from strom.spark.offsets import PartitionOffsets, StreamOffset, check_origin
from strom.spark.options import SourceOptions
from strom.spark.partition_reader import (
    OffsetRangePartition,
    data_loss_message,
    read_range,
    report_data_loss,
)

log = logging.getLogger("strom.spark")


class StromInputPartition(InputPartition):
    """Spark's handle on one task's range (InputPartition subclasses must pickle)."""

    def __init__(self, offset_range: OffsetRangePartition) -> None:
        super().__init__(offset_range)
        self.offset_range = offset_range


def plan_partitions(
    options: SourceOptions, ranges: Mapping[TopicPartition, tuple[int, int]]
) -> list[StromInputPartition]:
    """One input partition per non-empty range, split further to reach ``minPartitions``.

    Each range gets a share of the wanted partitions in proportion to its size (at least
    one, at most one per offset), so there are at least ``minPartitions`` when there are
    that many offsets; offsets stay in order within each range.
    """
    sized = [(tp, start, end) for tp, (start, end) in sorted(ranges.items()) if end > start]
    wanted = options.min_partitions or 0
    pieces = dict.fromkeys((tp for tp, _, _ in sized), 1)
    if wanted > len(sized):
        shares = _apportion({tp: end - start for tp, start, end in sized}, wanted)
        # Every range at least one piece, none smaller than one offset.
        pieces = {tp: min(end - start, max(1, shares[tp])) for tp, start, end in sized}
    parts: list[StromInputPartition] = []
    for tp, start, end in sized:
        step, extra = divmod(end - start, pieces[tp])
        lower = start
        for index in range(pieces[tp]):
            upper = lower + step + (1 if index < extra else 0)
            if upper > lower:
                parts.append(StromInputPartition(_range(options, tp, lower, upper)))
            lower = upper
    return parts


def _range(options: SourceOptions, tp: TopicPartition, start: int, end: int) -> OffsetRangePartition:
    return OffsetRangePartition(
        topic=tp.topic,
        partition=tp.partition,
        from_offset=start,
        until_offset=end,
        consumer_config=options.client_config("consumer"),
        include_headers=options.include_headers,
        fail_on_data_loss=options.fail_on_data_loss,
        poll_timeout_ms=options.poll_timeout_ms,
    )


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(partition, StromInputPartition):
        return read_range(partition.offset_range)
    if partition.value is None:
        # PySpark plans InputPartition(None) when partitions() is empty: nothing to read.
        return iter(())
    raise TypeError(f"not a strom input partition: {partition!r}")


class StromBatchReader(DataSourceReader):
    """``spark.read``: the records between the starting and ending offsets, fixed at planning."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        offsets = OffsetReader(self.options)
        try:
            tps = offsets.partitions()
            start = offsets.resolve(self.options.starting, tps, starting=True)
            end = offsets.resolve(self.options.ending, tps, starting=False)
            earliest = offsets.earliest(tps)
        finally:
            offsets.close()
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for tp in tps:
            lower, upper = start[tp], end[tp]
            if upper < lower:
                raise ValueError(
                    f"ending offset {upper} of {tp} is before its starting offset {lower} "
                    "(check startingOffsets / endingOffsets)"
                )
            if lower < earliest[tp]:
                report_data_loss(
                    self.options.fail_on_data_loss,
                    data_loss_message(tp, lower, min(earliest[tp], upper), "deleted by retention or DeleteRecords"),
                )
                lower = min(earliest[tp], upper)
            ranges[tp] = (lower, upper)
        return plan_partitions(self.options, ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class StromStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches of offset ranges, checkpointed by Spark.

    ``commit(end)`` is left as Spark's no-op: Spark calls it late, and not at all after an
    availableNow query's last batch, so the driver's OffsetCommitter commits finished
    batches to the consumer group instead.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.offsets = OffsetReader(options)
        self._available_now: PartitionOffsets | None = None
        # maxTriggerDelay counts from the last batch minOffsetsPerTrigger let through; the first never waits.
        self._last_trigger: float | None = None
        self._planned: dict[str, Any] | None = None  # the end offset latestOffset last returned

    # -- offsets ------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        tps, topic_ids = self.offsets.describe()
        start = self.offsets.resolve(self.options.starting, tps, starting=True)
        return self._stamp(start, self.offsets.cluster_id(), topic_ids)

    def _stamp(self, offsets: PartitionOffsets, cluster_id: str | None, topic_ids: dict[str, str]) -> dict[str, Any]:
        """The checkpoint form of ``offsets``, with the ids of the cluster and topics they are in."""
        topics = {tp.topic for tp in offsets}
        ids = {topic: topic_id for topic, topic_id in topic_ids.items() if topic in topics}
        return StreamOffset(offsets, cluster_id, ids).to_json_dict()

    def _checked(self, value: Any, what: str, cluster_id: str | None, topic_ids: dict[str, str]) -> PartitionOffsets:
        """A checkpointed offset's positions, once it is known to belong to this cluster and its topics."""
        offset = StreamOffset.from_json_dict(value, what)
        check_origin(offset, cluster_id, topic_ids, self.options.bootstrap_servers)
        return offset.offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        # Python has no composite limit; latestOffset applies both options whenever any limit is asked for.
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.offsets.latest(self.offsets.partitions())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Before anything else: offsets from another cluster must not be taken for data loss.
        cluster_id = self.offsets.cluster_id()
        existing, topic_ids = self.offsets.describe()
        current = self._checked(start, "start offset", cluster_id, topic_ids)
        begin = dict(current)
        new = existing - set(current)
        if new:
            begin.update(self.offsets.earliest(new))
        # A partition that is gone is left out of the end offsets: partitions() reports it.
        end = self.offsets.latest(existing)
        target = self._available_now
        if target is not None:
            # Nothing beyond what existed when availableNow fixed its target.
            end = {tp: min(offset, target[tp]) for tp, offset in end.items() if tp in target}
            end.update({tp: offset for tp, offset in current.items() if tp in existing and tp not in end})
        if not isinstance(limit, ReadAllAvailable):
            end = self._apply_limits(begin, end)
        self._planned = self._stamp(end, cluster_id, topic_ids)
        return self._planned

    def _apply_limits(self, begin: PartitionOffsets, end: PartitionOffsets) -> PartitionOffsets:
        backlog = {tp: max(0, end[tp] - begin.get(tp, end[tp])) for tp in end}
        total = sum(backlog.values())
        minimum = self.options.min_offsets_per_trigger
        if minimum is not None and self._available_now is None:
            now = time.monotonic()
            # monotonic() counts from boot, so "never" cannot be 0.0: on a machine booted minutes
            # ago that would make the first trigger wait for maxTriggerDelay.
            waited_ms = math.inf if self._last_trigger is None else (now - self._last_trigger) * 1000
            if total < minimum and waited_ms < self.options.max_trigger_delay_ms:
                # Not enough new records yet and not waited long enough: no batch this trigger.
                return {tp: begin.get(tp, offset) for tp, offset in end.items()}
            self._last_trigger = now
        maximum = self.options.max_offsets_per_trigger
        if maximum is None or total <= maximum:
            return end
        return {tp: begin.get(tp, end[tp]) + share for tp, share in _apportion(backlog, maximum).items()}

    # -- planning -----------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if end == self._planned:
            # The range latestOffset just returned, from a start it checked.
            begin = StreamOffset.from_json_dict(start, "start offset").offsets
            until = StreamOffset.from_json_dict(end, "end offset").offsets
        else:
            # A restarted query replays its last planned batch from the checkpoint: check it.
            cluster_id = self.offsets.cluster_id()
            _, topic_ids = self.offsets.describe()
            begin = self._checked(start, "start offset", cluster_id, topic_ids)
            until = self._checked(end, "end offset", cluster_id, topic_ids)
        fail = self.options.fail_on_data_loss
        for tp in sorted(set(begin) - set(until)):
            report_data_loss(fail, data_loss_message(tp, begin[tp], begin[tp] + 1, "the partition is gone"))
        new = [tp for tp in until if tp not in begin]
        if new:
            begin.update(self.offsets.earliest(new))
        earliest = self.offsets.earliest(until) if until else {}
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for tp, upper in until.items():
            lower = begin[tp]
            if upper < lower:
                report_data_loss(
                    fail,
                    data_loss_message(tp, upper, lower, f"the log now ends at {upper}, before the query's position"),
                )
                continue
            if lower < earliest.get(tp, lower):
                report_data_loss(
                    fail, data_loss_message(tp, lower, min(earliest[tp], upper), "deleted by retention or DeleteRecords")
                )
                lower = min(earliest[tp], upper)
            ranges[tp] = (lower, upper)
        return plan_partitions(self.options, ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def stop(self) -> None:
        self.offsets.close()


def _apportion(backlog: Mapping[TopicPartition, int], limit: int) -> dict[TopicPartition, int]:
    """Split ``limit`` records across partitions in proportion to their backlogs, summing to
    exactly ``limit`` (largest remainders get the leftover), never more than a backlog."""
    total = sum(backlog.values())
    shares = {tp: size * limit // total for tp, size in backlog.items()}
    leftover = limit - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda tp: (-(backlog[tp] * limit % total), tp))
    for tp in by_remainder[:leftover]:
        shares[tp] += 1
    return shares
