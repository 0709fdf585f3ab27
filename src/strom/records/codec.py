"""Record batch v2 codec: records in and out of batches (KIP-98 layout; records as
strom.records.scanner describes them, which does the parsing and the batch assembly).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from strom.records import scanner
from strom.records.batch import (
    COMPRESSION_MASK,
    CONTROL_FLAG,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    CompressionType,
    InvalidBatchError,
    TimestampType,
    iter_headers,
    read_header,
)
from strom.records.compression import CompressionError
from strom.records.varint import write_varint

Header = tuple[str, bytes | None]

_MAX_CODEC = scanner.MAX_CODEC


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded record; ``offset`` and ``timestamp`` are absolute."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class RecordBatch:
    header: BatchHeader
    records: list[Record]


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """A record to encode; ``timestamp=None`` means now (ms)."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[Header] = ()
    timestamp: int | None = None


# ---------------------------------------------------------------- decoding


def decode_batch(
    buf: bytes | bytearray | memoryview, position: int = 0, *, verify_crc: bool = True
) -> RecordBatch:
    """Decode the batch at ``position`` with all its records.

    Raises InvalidBatchError: corrupt=True for a truncated batch, a CRC mismatch, an
    undecompressable payload or malformed records; corrupt=False for an unknown codec.
    """
    data = _indexable(buf)
    header = read_header(data, position)
    if position + header.size > len(data):
        raise InvalidBatchError("record batch is truncated", corrupt=True)
    return _decode(data, header, verify_crc)


def decode_batches(buf: bytes | bytearray | memoryview, *, verify_crc: bool = True) -> list[RecordBatch]:
    """Decode every batch of a record set (e.g. a fetched partition's records)."""
    data = _indexable(buf)
    return [_decode(data, header, verify_crc) for header in iter_headers(data)]


def _indexable(buf: bytes | bytearray | memoryview) -> bytes | memoryview:
    # Slicing bytes or a memoryview copies at most once; a bytearray slice would copy twice.
    if isinstance(buf, bytes):
        return buf
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _decode(data: bytes | memoryview, header: BatchHeader, verify_crc: bool) -> RecordBatch:
    payload, start, end = scanner.batch_records(data, header, verify_crc=verify_crc)
    try:
        decoded = scanner.decode(payload, start, end, header.records_count, header.last_offset_delta)
    except scanner.RecordError as error:
        raise InvalidBatchError(f"malformed record in batch at offset {header.base_offset}: {error}", corrupt=True) from error
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    records: list[Record] = []
    append = records.append
    if header.timestamp_type == TimestampType.LOG_APPEND_TIME:
        # Every record of a LogAppendTime batch carries the batch's maxTimestamp.
        log_append_time = header.max_timestamp
        for offset_delta, _, key, value, headers in decoded:
            append(_new_record(base_offset + offset_delta, log_append_time, key, value, headers))
    else:
        for offset_delta, timestamp_delta, key, value, headers in decoded:
            append(_new_record(base_offset + offset_delta, base_timestamp + timestamp_delta, key, value, headers))
    return RecordBatch(header, records)


def _new_record(
    offset: int, timestamp: int, key: bytes | None, value: bytes | None, headers: tuple[Header, ...]
) -> Record:
    # A frozen dataclass's __init__ goes through object.__setattr__ per field; setting
    # the slots directly builds the same object in less than half the time.
    record: Record = object.__new__(Record)
    _SET_OFFSET(record, offset)
    _SET_TIMESTAMP(record, timestamp)
    _SET_KEY(record, key)
    _SET_VALUE(record, value)
    _SET_HEADERS(record, headers)
    return record


# The slot descriptors of Record's fields.
_SET_OFFSET, _SET_TIMESTAMP, _SET_KEY, _SET_VALUE, _SET_HEADERS = (
    vars(Record)[name].__set__ for name in ("offset", "timestamp", "key", "value", "headers")
)


# ---------------------------------------------------------------- encoding


def encode_batch(
    records: Sequence[RecordSpec],
    *,
    base_offset: int = 0,
    compression: int = CompressionType.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    timestamp_type: int = TimestampType.CREATE_TIME,
    is_transactional: bool = False,
    is_control: bool = False,
    compression_level: int | None = None,
) -> bytes:
    """Encode ``records`` as one v2 batch with offset deltas 0..n-1.

    baseTimestamp is the first record's timestamp (as Kafka's builders write it) and
    maxTimestamp the largest; records without a timestamp get the current time.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    if not 0 <= compression <= _MAX_CODEC:
        raise CompressionError(f"unknown compression codec {compression}")
    now: int | None = None
    timestamps: list[int] = []
    for spec in records:
        if spec.timestamp is None:
            if now is None:
                now = time.time_ns() // 1_000_000
            timestamps.append(now)
        else:
            timestamps.append(spec.timestamp)
    base_timestamp = timestamps[0]
    body = bytearray()
    scratch = bytearray()
    for offset_delta, (spec, timestamp) in enumerate(zip(records, timestamps, strict=True)):
        _write_record(
            body, scratch, offset_delta, timestamp - base_timestamp, spec.key, spec.value, spec.headers
        )
    attributes = (
        compression
        | (TIMESTAMP_TYPE_MASK if timestamp_type == TimestampType.LOG_APPEND_TIME else 0)
        | (TRANSACTIONAL_FLAG if is_transactional else 0)
        | (CONTROL_FLAG if is_control else 0)
    )
    return bytes(
        scanner.assemble_batch(
            body,
            compression_level=compression_level,
            base_offset=base_offset,
            partition_leader_epoch=partition_leader_epoch,
            attributes=attributes,
            last_offset_delta=len(records) - 1,
            base_timestamp=base_timestamp,
            max_timestamp=max(timestamps),
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            records_count=len(records),
        )
    )


def _write_record(
    out: bytearray,
    scratch: bytearray,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
) -> None:
    # The length prefix comes first: write the fields to ``scratch``, then copy them
    # after the length. In Python a small copy is cheaper than sizing every field twice.
    scratch.append(0)  # attributes
    write_varint(scratch, timestamp_delta)
    write_varint(scratch, offset_delta)
    _write_bytes(scratch, key)
    _write_bytes(scratch, value)
    write_varint(scratch, len(headers))
    for header_key, header_value in headers:
        _write_bytes(scratch, header_key.encode())
        _write_bytes(scratch, header_value)
    write_varint(out, len(scratch))
    out += scratch
    del scratch[:]


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out.append(1)  # zig-zag varint of -1
    else:
        write_varint(out, len(data))
        out += data


# ---------------------------------------------------------------- recompression


def recompress_batches(
    records: bytes | bytearray | memoryview,
    codec: int,
    *,
    level: int | None = None,
) -> bytes:
    """Re-encode every batch with ``codec`` (the broker's topic-level compression.type):
    ``recompress_batch`` of each. Raises InvalidBatchError for a malformed or corrupt batch."""
    if not 0 <= codec <= _MAX_CODEC:
        raise CompressionError(f"unknown compression codec {codec}")
    data = _indexable(records)
    return b"".join(recompress_batch(data, header, codec, level=level) for header in iter_headers(data))


def recompress_batch(
    data: bytes | bytearray | memoryview,
    header: BatchHeader,
    codec: int,
    *,
    level: int | None = None,
    payload: tuple[scanner.BytesLike, int, int] | None = None,
) -> bytes | bytearray | memoryview:
    """The batch ``header`` describes in ``data``, re-encoded with ``codec``.

    Only the payload's compression changes: the record bytes (offset and timestamp
    deltas included) and every header field other than the codec bits, batchLength
    and CRC are kept. A batch already in ``codec`` is kept byte-identical (a view), and so
    is an uncompressed control batch (Kafka does not compress control records that arrive
    uncompressed). ``payload`` is the batch's records already decompressed
    (scanner.batch_records' answer), to save decompressing them again.
    """
    source_codec = header.compression
    if source_codec == codec or (header.is_control and source_codec == CompressionType.NONE):
        return memoryview(data)[header.position : header.position + header.size]
    records, start, end = payload if payload is not None else scanner.batch_records(data, header)
    return scanner.assemble_batch(
        memoryview(records)[start:end],
        compression_level=level,
        base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch,
        attributes=(header.attributes & ~COMPRESSION_MASK) | codec,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        records_count=header.records_count,
    )
