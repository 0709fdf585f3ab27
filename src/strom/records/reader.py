"""The consumer's fetch-path record decoder: raw fetched bytes to ConsumerRecords, lazily.

A fetch response carries each partition's record batches as opaque bytes. The I/O
thread only walks their 61-byte headers (``scan_batches``) to learn where the complete
batches end and which offset to fetch next; ``FetchedRecords.take`` decodes records in
the caller's thread, batch by batch and only as many as it is asked for, straight into
``ConsumerRecord`` objects. Each batch is CRC-checked and decompressed once, its
records read by the one record scanner (strom.records.scanner, in C) at the batch's first
record.

Batches a consumer must not see are skipped whole: control batches (transaction
markers), batches emptied by the log cleaner, and under read_committed the batches of
aborted transactions, found with the fetch response's aborted-transaction list as
Kafka's consumer does. Offsets may have gaps (compacted topics); the position after a
batch is always its last offset + 1.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable

import crc32c

from strom.records import scanner
from strom.records.batch import (
    ATTRIBUTES,
    COMPRESSION_MASK,
    CONTROL_FLAG,
    HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG,
    CompressionType,
    InvalidBatchError,
)
from strom.records.codec import decode_batch
from strom.records.compression import CompressionError, decompress
from strom.records.control import ControlRecordType, decode_control_key

Header = tuple[str, bytes | None]

# baseOffset, batchLength ... lastOffsetDelta: what the I/O thread reads of each header.
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23


class ConsumerRecord:
    """One record as poll() returns it. ``timestamp_type`` is 0 (create time) or 1 (log append time);
    ``headers`` is a tuple of (key, value) pairs; ``leader_epoch`` is None when the batch has none."""

    __slots__ = (
        "headers",
        "key",
        "leader_epoch",
        "offset",
        "partition",
        "timestamp",
        "timestamp_type",
        "topic",
        "value",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        timestamp_type: int,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[Header, ...] = (),
        leader_epoch: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.timestamp_type = timestamp_type
        self.key = key
        self.value = value
        self.headers = headers
        self.leader_epoch = leader_epoch

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConsumerRecord):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((self.topic, self.partition, self.offset))

    def __repr__(self) -> str:
        return (
            f"ConsumerRecord(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"timestamp={self.timestamp}, timestamp_type={self.timestamp_type}, key={self.key!r}, "
            f"value={self.value!r}, headers={self.headers!r}, leader_epoch={self.leader_epoch})"
        )


class FetchedBatch:
    """The undecoded records of one fetched batch, for a caller that decodes them itself
    (column by column, say): ``count`` records at ``payload[position:limit]``, CRC-checked
    and decompressed. Offsets are ``base_offset`` + each record's offset delta; records
    below ``min_offset`` were returned before (a compressed batch the broker sent whole).
    The records are not checked yet: decoders hold them to strom.records.scanner's rules.
    Timestamps are ``base_timestamp`` + each record's delta, or ``base_timestamp`` itself
    when ``timestamp_type`` is 1 (LogAppendTime, the batch's max timestamp)."""

    __slots__ = (
        "base_offset",
        "base_timestamp",
        "count",
        "last_offset_delta",
        "leader_epoch",
        "limit",
        "min_offset",
        "payload",
        "position",
        "timestamp_type",
    )

    def __init__(
        self,
        payload: bytes,
        position: int,
        limit: int,
        count: int,
        base_offset: int,
        base_timestamp: int,
        timestamp_type: int,
        leader_epoch: int | None,
        min_offset: int,
        last_offset_delta: int,
    ) -> None:
        self.payload = payload
        self.position = position
        self.limit = limit
        self.count = count
        self.base_offset = base_offset
        self.base_timestamp = base_timestamp
        self.timestamp_type = timestamp_type
        self.leader_epoch = leader_epoch
        self.min_offset = min_offset
        self.last_offset_delta = last_offset_delta


def scan_batches(data: bytes, fetch_offset: int) -> tuple[int, int]:
    """(bytes taken by the complete batches, the offset to fetch next) of a fetched record set.

    A broker may end a response with a partial batch (cut at the size limit); it is
    ignored and fetched again. The next offset is never below ``fetch_offset``.
    """
    position = 0
    size = len(data)
    next_offset = fetch_offset
    unpack = _OFFSET_AND_LENGTH.unpack_from
    while size - position >= HEADER_SIZE:
        base_offset, batch_length = unpack(data, position)
        batch_end = position + LOG_OVERHEAD + batch_length
        if batch_end > size or batch_length < HEADER_SIZE - LOG_OVERHEAD:
            break
        (last_delta,) = _LAST_OFFSET_DELTA.unpack_from(data, position + _LAST_OFFSET_DELTA_AT)
        next_offset = max(next_offset, base_offset + last_delta + 1)
        position = batch_end
    return position, next_offset


class FetchedRecords:
    """One partition's fetched record set with a decoding cursor.

    ``next_offset`` is the consumer's position once the records returned so far are
    consumed: after the last returned record, or past every batch skipped so far, and
    ``end_offset`` once the set is exhausted. ``aborted_transactions`` (producer id,
    first offset) is None under read_uncommitted.
    """

    __slots__ = (
        "_aborted",
        "_aborted_pids",
        "_base_offset",
        "_base_timestamp",
        "_batch_next_offset",
        "_check_crcs",
        "_data",
        "_decoded",
        "_decoded_index",
        "_end",
        "_last_offset_delta",
        "_leader_epoch",
        "_min_offset",
        "_payload",
        "_position",
        "_record_limit",
        "_record_position",
        "_remaining",
        "_timestamp_step",
        "_timestamp_type",
        "end_offset",
        "last_leader_epoch",
        "next_offset",
        "partition",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        data: bytes,
        fetch_offset: int,
        *,
        end: int | None = None,
        end_offset: int | None = None,
        check_crcs: bool = True,
        aborted_transactions: Iterable[tuple[int, int]] | None = None,
    ) -> None:
        if end is None or end_offset is None:
            end, end_offset = scan_batches(data, fetch_offset)
        self.topic = topic
        self.partition = partition
        self._data = data
        self._end = end
        self.end_offset = end_offset
        self.next_offset = fetch_offset
        self._min_offset = fetch_offset
        self._check_crcs = check_crcs
        self._aborted: list[tuple[int, int]] | None = None
        self._aborted_pids: set[int] = set()
        if aborted_transactions is not None:
            self._aborted = [(first_offset, pid) for pid, first_offset in aborted_transactions]
            heapq.heapify(self._aborted)
        self._position = 0
        self._payload = b""
        self._record_position = 0
        self._record_limit = 0
        self._remaining = 0
        self._base_offset = 0
        self._base_timestamp = 0
        self._timestamp_step = 1
        self._timestamp_type = 0
        self._last_offset_delta = 0
        self._decoded: list[tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]] | None = None
        self._decoded_index = 0
        self._leader_epoch: int | None = None
        self._batch_next_offset = fetch_offset
        self.last_leader_epoch: int | None = None

    @property
    def exhausted(self) -> bool:
        return self._remaining == 0 and self._position >= self._end

    def take(self, max_records: int) -> list[ConsumerRecord]:
        """Up to ``max_records`` records, decoding only the batches they come from.

        Raises InvalidBatchError for a corrupt batch (CRC, framing, codec).
        """
        out: list[ConsumerRecord] = []
        while len(out) < max_records:
            if self._remaining == 0:
                if not self._next_batch():
                    break
                continue
            self._decode(out, max_records - len(out))
        return out

    def take_batches(self, max_records: int) -> list[FetchedBatch]:
        """Whole batches, undecoded, until they hold at least ``max_records`` records (or none are
        left); the position moves past each. Raises InvalidBatchError as ``take`` does."""
        out: list[FetchedBatch] = []
        taken = 0
        while taken < max_records:
            if self._remaining == 0 and not self._next_batch():
                break
            out.append(
                FetchedBatch(
                    self._payload,
                    self._record_position,
                    self._record_limit,
                    self._remaining,
                    self._base_offset,
                    self._base_timestamp,
                    self._timestamp_type,
                    self._leader_epoch,
                    self._min_offset,
                    self._last_offset_delta,
                )
            )
            taken += self._remaining
            self._remaining = 0
            self._payload = b""
            self.next_offset = max(self.next_offset, self._batch_next_offset)
            self.last_leader_epoch = self._leader_epoch
        return out

    # -- batches ----------------------------------------------------------------------------

    def _next_batch(self) -> bool:
        """Move to the next batch that has records to return; False once none is left."""
        data = self._data
        while self._position < self._end:
            position = self._position
            (
                base_offset,
                batch_length,
                leader_epoch,
                magic,
                crc,
                attributes,
                last_offset_delta,
                base_timestamp,
                max_timestamp,
                producer_id,
                _producer_epoch,
                _base_sequence,
                records_count,
            ) = HEADER_STRUCT.unpack_from(data, position)
            batch_end = position + LOG_OVERHEAD + batch_length
            self._position = batch_end
            if magic != 2:
                raise InvalidBatchError(f"unsupported record batch magic {magic}", corrupt=False)
            last_offset = base_offset + last_offset_delta
            if last_offset < self._min_offset:
                continue
            if self._check_crcs and crc32c.crc32c(memoryview(data)[position + ATTRIBUTES : batch_end]) != crc:
                raise InvalidBatchError(f"record batch at offset {base_offset} fails its CRC", corrupt=True)
            if self._skip(data, position, attributes, producer_id, last_offset) or records_count <= 0:
                self.next_offset = max(self.next_offset, last_offset + 1)
                continue
            codec = attributes & COMPRESSION_MASK
            if codec == CompressionType.NONE:
                self._payload = data
                self._record_position = position + HEADER_SIZE
                self._record_limit = batch_end
            else:
                try:
                    # Bounded: a bomb stops at compression.MAX_DECOMPRESSED_BATCH_BYTES.
                    self._payload = decompress(codec, memoryview(data)[position + HEADER_SIZE : batch_end])
                except CompressionError as error:
                    raise InvalidBatchError(str(error), corrupt=True) from error
                self._record_position = 0
                self._record_limit = len(self._payload)
            self._last_offset_delta = last_offset_delta
            self._decoded = None
            self._remaining = records_count
            self._base_offset = base_offset
            if attributes & TIMESTAMP_TYPE_MASK:
                # LogAppendTime: every record carries the batch's maxTimestamp.
                self._base_timestamp, self._timestamp_step, self._timestamp_type = max_timestamp, 0, 1
            else:
                self._base_timestamp, self._timestamp_step, self._timestamp_type = base_timestamp, 1, 0
            self._leader_epoch = leader_epoch if leader_epoch >= 0 else None
            self._batch_next_offset = last_offset + 1
            return True
        self.next_offset = max(self.next_offset, self.end_offset)
        return False

    def _skip(self, data: bytes, position: int, attributes: int, producer_id: int, last_offset: int) -> bool:
        """Whether the batch is a control batch or (read_committed) part of an aborted transaction."""
        aborted = self._aborted
        if aborted is not None and producer_id >= 0:
            while aborted and aborted[0][0] <= last_offset:
                self._aborted_pids.add(heapq.heappop(aborted)[1])
            if attributes & CONTROL_FLAG:
                if producer_id in self._aborted_pids and self._is_abort_marker(data, position):
                    self._aborted_pids.discard(producer_id)
            elif attributes & TRANSACTIONAL_FLAG and producer_id in self._aborted_pids:
                return True
        return bool(attributes & CONTROL_FLAG)

    @staticmethod
    def _is_abort_marker(data: bytes, position: int) -> bool:
        batch = decode_batch(data, position, verify_crc=False)
        return bool(batch.records) and decode_control_key(batch.records[0].key) == ControlRecordType.ABORT

    # -- records ----------------------------------------------------------------------------

    def _decode(self, out: list[ConsumerRecord], limit: int) -> None:
        """Decode up to ``limit`` records of the current batch into ``out``.

        The scanner decodes the whole batch at its first record; later calls take from that.
        """
        decoded = self._decoded
        if decoded is None:
            try:
                decoded = scanner.decode(
                    self._payload,
                    self._record_position,
                    self._record_limit,
                    self._remaining,
                    self._last_offset_delta,
                )
            except scanner.RecordError as error:
                raise InvalidBatchError(
                    f"malformed record in batch at offset {self._base_offset}: {error}", corrupt=True
                ) from error
            self._decoded = decoded
            self._decoded_index = 0
        first = self._decoded_index
        count = min(self._remaining, limit)
        base_offset = self._base_offset
        base_timestamp = self._base_timestamp
        step = self._timestamp_step
        timestamp_type = self._timestamp_type
        leader_epoch = self._leader_epoch
        min_offset = self._min_offset
        topic = self.topic
        partition = self.partition
        append = out.append
        record = ConsumerRecord
        new = object.__new__
        start = len(out)
        for offset_delta, timestamp_delta, key, value, headers in decoded[first : first + count]:
            # Setting the slots here is a third cheaper than calling __init__ with nine arguments.
            built = new(record)
            built.topic = topic
            built.partition = partition
            built.offset = base_offset + offset_delta
            built.timestamp = base_timestamp + timestamp_delta * step
            built.timestamp_type = timestamp_type
            built.key = key
            built.value = value
            built.headers = headers
            built.leader_epoch = leader_epoch
            append(built)
        if base_offset < min_offset:
            # A batch that starts before the fetch offset (a compressed batch the broker sent
            # whole): its records below it were returned before. Offsets rise within a batch.
            skip = start
            while skip < len(out) and out[skip].offset < min_offset:
                skip += 1
            del out[start:skip]
        self._decoded_index = first + count
        self._remaining -= count
        if len(out) > start:
            self.next_offset = out[-1].offset + 1
            self.last_leader_epoch = leader_epoch
        if not self._remaining:
            # Past the batch's last offset even if the cleaner removed its last records.
            self.next_offset = max(self.next_offset, self._batch_next_offset)
            self._payload = b""
            self._decoded = None


def read_headers(data: bytes, position: int, limit: int) -> tuple[tuple[Header, ...], int]:
    """A record's header count and headers at ``position``; raises InvalidBatchError if malformed."""
    try:
        return scanner.read_headers(data, position, limit)
    except scanner.RecordError as error:
        raise InvalidBatchError(f"malformed record headers: {error}", corrupt=True) from error
