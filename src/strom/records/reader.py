"""The consumer's fetch-path record decoder: raw fetched bytes to ConsumerRecords, lazily.

A fetch response carries each partition's record batches as opaque bytes. The I/O
thread only walks their 61-byte headers (``scan_batches``) to learn where the complete
batches end and which offset to fetch next; ``FetchedRecords.take`` decodes records in
the caller's thread, batch by batch and only as many as it is asked for, straight into
``ConsumerRecord`` objects. Each batch is CRC-checked and decompressed once, its
records read in one pass with the common one-byte varints decoded inline (a function
call per field would cost more than the rest of the record).

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
from strom.records.varint import MAX_VARLONG_BYTES, VarintError, read_varint

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
    Timestamps are ``base_timestamp`` + each record's delta, or ``base_timestamp`` itself
    when ``timestamp_type`` is 1 (LogAppendTime, the batch's max timestamp)."""

    __slots__ = (
        "base_offset",
        "base_timestamp",
        "count",
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
        "_end",
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
                    self._payload = decompress(codec, memoryview(data)[position + HEADER_SIZE : batch_end])
                except CompressionError as error:
                    raise InvalidBatchError(str(error), corrupt=True) from error
                self._record_position = 0
                self._record_limit = len(self._payload)
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
        """Decode up to ``limit`` records of the current batch into ``out``."""
        data = self._payload
        position = self._record_position
        remaining = self._remaining
        base_offset = self._base_offset
        base_timestamp = self._base_timestamp
        step = self._timestamp_step
        timestamp_type = self._timestamp_type
        leader_epoch = self._leader_epoch
        min_offset = self._min_offset
        limit_position = self._record_limit
        topic = self.topic
        partition = self.partition
        append = out.append
        record = ConsumerRecord
        new = object.__new__
        start = len(out)
        count = min(remaining, limit)
        timestamp = base_timestamp
        try:
            for _ in range(count):
                # Each varint: one- and two-byte ones inline (zig-zag), longer ones through read_varint.
                byte = data[position]
                if byte < 0x80:
                    length = (byte >> 1) ^ -(byte & 1)
                    position += 1
                elif data[position + 1] < 0x80:
                    length = (byte & 0x7F) | (data[position + 1] << 7)
                    length = (length >> 1) ^ -(length & 1)
                    position += 2
                else:
                    length, position = read_varint(data, position)
                record_end = position + length
                if record_end > limit_position:  # a negative length fails the check after the fields
                    raise InvalidBatchError(f"record length {length} runs past its batch", corrupt=True)
                position += 1  # the unused attributes byte
                byte = data[position]
                if byte < 0x80:
                    timestamp_delta = (byte >> 1) ^ -(byte & 1)
                    position += 1
                elif data[position + 1] < 0x80:
                    timestamp_delta = (byte & 0x7F) | (data[position + 1] << 7)
                    timestamp_delta = (timestamp_delta >> 1) ^ -(timestamp_delta & 1)
                    position += 2
                else:
                    timestamp_delta, position = read_varint(data, position, MAX_VARLONG_BYTES)
                byte = data[position]
                if byte < 0x80:
                    offset_delta = (byte >> 1) ^ -(byte & 1)
                    position += 1
                elif data[position + 1] < 0x80:
                    offset_delta = (byte & 0x7F) | (data[position + 1] << 7)
                    offset_delta = (offset_delta >> 1) ^ -(offset_delta & 1)
                    position += 2
                else:
                    offset_delta, position = read_varint(data, position)
                byte = data[position]
                if byte < 0x80:
                    size = (byte >> 1) ^ -(byte & 1)
                    position += 1
                elif data[position + 1] < 0x80:
                    size = (byte & 0x7F) | (data[position + 1] << 7)
                    size = (size >> 1) ^ -(size & 1)
                    position += 2
                else:
                    size, position = read_varint(data, position)
                if size >= 0:
                    key: bytes | None = data[position : position + size]
                    position += size
                elif size == -1:
                    key = None
                else:
                    raise InvalidBatchError(f"invalid key length {size}", corrupt=True)
                byte = data[position]
                if byte < 0x80:
                    size = (byte >> 1) ^ -(byte & 1)
                    position += 1
                elif data[position + 1] < 0x80:
                    size = (byte & 0x7F) | (data[position + 1] << 7)
                    size = (size >> 1) ^ -(size & 1)
                    position += 2
                else:
                    size, position = read_varint(data, position)
                if size >= 0:
                    value: bytes | None = data[position : position + size]
                    position += size
                elif size == -1:
                    value = None
                else:
                    raise InvalidBatchError(f"invalid value length {size}", corrupt=True)
                if data[position] == 0:
                    headers: tuple[Header, ...] = ()
                    position += 1
                else:
                    headers, position = read_headers(data, position, record_end)
                if position != record_end:
                    raise InvalidBatchError(
                        f"record declares {length} bytes but its fields take {length + position - record_end}",
                        corrupt=True,
                    )
                if step:
                    timestamp = base_timestamp + timestamp_delta
                # Setting the slots here is a third cheaper than calling __init__ with nine arguments.
                built = new(record)
                built.topic = topic
                built.partition = partition
                built.offset = base_offset + offset_delta
                built.timestamp = timestamp
                built.timestamp_type = timestamp_type
                built.key = key
                built.value = value
                built.headers = headers
                built.leader_epoch = leader_epoch
                append(built)
        except (IndexError, VarintError) as error:
            raise InvalidBatchError(f"malformed record in batch: {error}", corrupt=True) from error
        if base_offset < min_offset:
            # A batch that starts before the fetch offset (a compressed batch the broker sent
            # whole): its records below it were returned before. Offsets rise within a batch.
            first = start
            while first < len(out) and out[first].offset < min_offset:
                first += 1
            del out[start:first]
        remaining -= count
        self._record_position = position
        self._remaining = remaining
        if len(out) > start:
            self.next_offset = out[-1].offset + 1
            self.last_leader_epoch = leader_epoch
        if not remaining:
            if position != limit_position:
                raise InvalidBatchError(
                    f"{limit_position - position} bytes left after the batch's declared records", corrupt=True
                )
            # Past the batch's last offset even if the cleaner removed its last records.
            self.next_offset = max(self.next_offset, self._batch_next_offset)
            self._payload = b""


def read_headers(data: bytes, position: int, limit: int) -> tuple[tuple[Header, ...], int]:
    count, position = read_varint(data, position)
    if count < 0:
        raise InvalidBatchError(f"invalid header count {count}", corrupt=True)
    headers: list[Header] = []
    for _ in range(count):
        size, position = read_varint(data, position)
        if size < 0:
            raise InvalidBatchError("record header with a null key", corrupt=True)
        end = position + size
        try:
            key = data[position:end].decode()
        except UnicodeDecodeError as error:
            raise InvalidBatchError(f"record header key is not UTF-8: {error}", corrupt=True) from error
        size, position = read_varint(data, end)
        if size < 0:
            if size != -1:
                raise InvalidBatchError(f"invalid header value length {size}", corrupt=True)
            value = None
        else:
            value = data[position : position + size]
            position += size
        if position > limit:
            raise InvalidBatchError("record header runs past its record", corrupt=True)
        headers.append((key, value))
    return tuple(headers), position
