"""Record batch v2 header: the 61 bytes the broker reads on the hot path.

The broker parses this header, checks the CRC-32C over everything after the ``crc``
field (its records are walked by strom.records.scanner), and rewrites ``baseOffset`` and
``partitionLeaderEpoch`` in place. Those two fields sit before the CRC'd range,
so rewriting them never requires recomputing the checksum.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

# Byte offsets of the v2 header fields (KIP-98 layout).
BASE_OFFSET = 0
BATCH_LENGTH = 8
PARTITION_LEADER_EPOCH = 12
MAGIC = 16
CRC = 17
ATTRIBUTES = 21
LAST_OFFSET_DELTA = 23
BASE_TIMESTAMP = 27
MAX_TIMESTAMP = 35
PRODUCER_ID = 43
PRODUCER_EPOCH = 51
BASE_SEQUENCE = 53
RECORDS_COUNT = 57
HEADER_SIZE = 61
# baseOffset + batchLength: batchLength counts the bytes after these 12.
LOG_OVERHEAD = 12
# Smallest batch Kafka accepts: the header alone.
MIN_BATCH_SIZE = HEADER_SIZE

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_INT64_AT_MAX_TS = struct.Struct(">q")


class CompressionType:
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    NAMES = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class TimestampType:
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class InvalidBatchError(ValueError):
    """A batch that is not a well-formed v2 batch (bad magic, size or CRC)."""

    def __init__(self, message: str, corrupt: bool) -> None:
        super().__init__(message)
        # corrupt=True maps to CORRUPT_MESSAGE; False to INVALID_RECORD.
        self.corrupt = corrupt


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """A decoded v2 batch header; ``position`` is where the batch starts in its buffer."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return (self.attributes & TIMESTAMP_TYPE_MASK) >> 3

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        # Sequences wrap at Int32.MAX like Kafka's DefaultRecordBatch.incrementSequence.
        return (self.base_sequence + self.last_offset_delta) % 0x80000000


def read_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Decode the header at ``position``. Raises InvalidBatchError if it cannot be a v2 batch."""
    if len(buf) - position < HEADER_SIZE:
        raise InvalidBatchError("record batch shorter than its 61-byte header", corrupt=True)
    fields = HEADER_STRUCT.unpack_from(buf, position)
    header = BatchHeader(position, *fields)
    if header.magic != 2:
        raise InvalidBatchError(f"unsupported record batch magic {header.magic}", corrupt=False)
    if header.batch_length + LOG_OVERHEAD < HEADER_SIZE:
        raise InvalidBatchError(f"record batch length {header.batch_length} is too small", corrupt=True)
    return header


def compute_crc(buf: bytes | bytearray | memoryview, position: int, size: int) -> int:
    """CRC-32C over the attributes..end range of the batch at ``position``."""
    return crc32c.crc32c(memoryview(buf)[position + ATTRIBUTES : position + size])


def is_crc_valid(buf: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
    return compute_crc(buf, header.position, header.size) == header.crc


def iter_headers(buf: bytes | bytearray | memoryview) -> Iterator[BatchHeader]:
    """Walk the batches of a record set, header by header (no record decoding).

    Raises InvalidBatchError when a batch is truncated or malformed.
    """
    position = 0
    end = len(buf)
    while position < end:
        header = read_header(buf, position)
        if position + header.size > end:
            raise InvalidBatchError("record batch is truncated", corrupt=True)
        yield header
        position += header.size


def set_base_offset(buf: bytearray | memoryview, position: int, base_offset: int) -> None:
    _Q.pack_into(buf, position + BASE_OFFSET, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, position: int, epoch: int) -> None:
    _I.pack_into(buf, position + PARTITION_LEADER_EPOCH, epoch)


def set_max_timestamp(
    buf: bytearray | memoryview,
    header: BatchHeader,
    timestamp: int,
    batch: bytes | bytearray | memoryview | None = None,
) -> None:
    """Set maxTimestamp and re-CRC (it lies in the CRC'd range). ``buf`` holds the batch at
    ``header.position``; or, given ``batch`` (which does), a copy of the batch's header alone."""
    at = header.position if batch is None else 0
    _INT64_AT_MAX_TS.pack_into(buf, at + MAX_TIMESTAMP, timestamp)
    _set_crc(buf, at, header, buf if batch is None else batch)


def set_log_append_time(
    buf: bytearray | memoryview,
    header: BatchHeader,
    timestamp: int,
    batch: bytes | bytearray | memoryview | None = None,
) -> None:
    """Stamp LogAppendTime: set the timestamp-type bit and maxTimestamp, then re-CRC; ``buf``
    and ``batch`` as for ``set_max_timestamp``.

    Records keep their deltas; readers of a LogAppendTime batch use maxTimestamp
    for every record, so no per-record rewrite is needed.
    """
    at = header.position if batch is None else 0
    struct.pack_into(">h", buf, at + ATTRIBUTES, header.attributes | TIMESTAMP_TYPE_MASK)
    _INT64_AT_MAX_TS.pack_into(buf, at + MAX_TIMESTAMP, timestamp)
    _set_crc(buf, at, header, buf if batch is None else batch)


def _set_crc(
    head: bytearray | memoryview, at: int, header: BatchHeader, batch: bytes | bytearray | memoryview
) -> None:
    """The CRC of the header at ``head[at:]`` and of the records of ``header``'s batch in ``batch``."""
    records = memoryview(batch)[header.position + HEADER_SIZE : header.position + header.size]
    crc = crc32c.crc32c(records, crc32c.crc32c(memoryview(head)[at + ATTRIBUTES : at + HEADER_SIZE]))
    struct.pack_into(">I", head, at + CRC, crc)
