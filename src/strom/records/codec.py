"""Record batch v2 codec: records in and out of batches (KIP-98 layout).

A v2 record, after the 61-byte batch header (possibly inside the compressed payload):

    length: varint            bytes after this field
    attributes: int8          unused, 0
    timestampDelta: varlong   from the batch's baseTimestamp
    offsetDelta: varint       from the batch's baseOffset
    keyLength: varint         -1 for a null key
    key: bytes
    valueLength: varint       -1 for a null value
    value: bytes
    headerCount: varint
    headers: [keyLength: varint, key: utf-8, valueLength: varint (-1 null), value: bytes]
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from strom.records.batch import (
    ATTRIBUTES,
    COMPRESSION_MASK,
    CONTROL_FLAG,
    CRC,
    HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
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
    is_crc_valid,
    iter_headers,
    read_header,
)
from strom.records.compression import CompressionError, compress_to_buffer, decompress_to_buffer
from strom.records.varint import MAX_VARLONG_BYTES, VarintError, read_varint_fast, write_varint

Header = tuple[str, bytes | None]

# The v2 header with the CRC field; same layout as strom.records.batch reads.

_CRC = struct.Struct(">I")
_MAX_CODEC = CompressionType.ZSTD


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
    if verify_crc:
        _check_crc(data, header)
    if header.records_count < 0:
        raise InvalidBatchError(f"negative record count {header.records_count}", corrupt=True)
    start = header.position + HEADER_SIZE
    end = header.position + header.size
    codec = header.compression
    if codec == CompressionType.NONE:
        payload, start_in_payload, end_in_payload = data, start, end
    else:
        payload = _decompress(codec, memoryview(data)[start:end])
        start_in_payload, end_in_payload = 0, len(payload)
    log_append_time = header.max_timestamp if header.timestamp_type == TimestampType.LOG_APPEND_TIME else None
    records = _decode_records(
        payload,
        start_in_payload,
        end_in_payload,
        header.records_count,
        header.base_offset,
        header.base_timestamp,
        log_append_time,
    )
    return RecordBatch(header, records)


def _check_crc(data: bytes | memoryview, header: BatchHeader) -> None:
    if not is_crc_valid(data, header):
        raise InvalidBatchError(f"record batch at offset {header.base_offset} fails its CRC", corrupt=True)


def _decompress(codec: int, compressed: bytes | memoryview) -> bytes:
    if codec > _MAX_CODEC:
        raise InvalidBatchError(f"unknown compression codec {codec}", corrupt=False)
    try:
        # Records decode fastest from bytes: indexing and slicing bytes is cheaper than a view.
        return bytes(decompress_to_buffer(codec, compressed))
    except CompressionError as error:
        raise InvalidBatchError(str(error), corrupt=True) from error


def _decode_records(
    data: bytes | memoryview,
    position: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
) -> list[Record]:
    records: list[Record] = []
    append = records.append
    varint = read_varint_fast
    try:
        for _ in range(count):
            length, position = varint(data, position)
            record_end = position + length
            if length < 0 or record_end > end:
                raise InvalidBatchError(f"record length {length} runs past its batch", corrupt=True)
            # attributes (int8) are unused in v2
            timestamp_delta, position = varint(data, position + 1, MAX_VARLONG_BYTES)
            offset_delta, position = varint(data, position)
            # key and value: -1 is null
            size, position = varint(data, position)
            if size >= 0:
                key: bytes | None = bytes(data[position : position + size])
                position += size
            else:
                _check_null(size)
                key = None
            size, position = varint(data, position)
            if size >= 0:
                value: bytes | None = bytes(data[position : position + size])
                position += size
            else:
                _check_null(size)
                value = None
            header_count, position = varint(data, position)
            headers: tuple[Header, ...] = ()
            if header_count:
                headers, position = _read_headers(data, position, record_end, header_count)
            if position != record_end:
                raise InvalidBatchError(
                    f"record declares {length} bytes but its fields take {length + position - record_end}",
                    corrupt=True,
                )
            append(
                _new_record(
                    base_offset + offset_delta,
                    base_timestamp + timestamp_delta if log_append_time is None else log_append_time,
                    key,
                    value,
                    headers,
                )
            )
    except (IndexError, VarintError) as error:
        raise InvalidBatchError(f"malformed record in batch: {error}", corrupt=True) from error
    if position != end:
        raise InvalidBatchError(
            f"{end - position} bytes left after the batch's {count} declared records", corrupt=True
        )
    return records


def _check_null(size: int) -> None:
    if size != -1:
        raise InvalidBatchError(f"invalid field length {size}", corrupt=True)


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


def _read_bytes(data: bytes | memoryview, position: int, limit: int) -> tuple[bytes | None, int]:
    size, position = read_varint_fast(data, position)
    if size < 0:
        _check_null(size)
        return None, position
    end = position + size
    if end > limit:
        raise InvalidBatchError("record field runs past its record", corrupt=True)
    return bytes(data[position:end]), end


def _read_headers(
    data: bytes | memoryview, position: int, limit: int, count: int
) -> tuple[tuple[Header, ...], int]:
    if count < 0:
        raise InvalidBatchError(f"invalid header count {count}", corrupt=True)
    headers: list[Header] = []
    for _ in range(count):
        raw_key, position = _read_bytes(data, position, limit)
        if raw_key is None:
            raise InvalidBatchError("record header with a null key", corrupt=True)
        try:
            key = raw_key.decode()
        except UnicodeDecodeError as error:
            raise InvalidBatchError(f"record header key is not UTF-8: {error}", corrupt=True) from error
        value, position = _read_bytes(data, position, limit)
        headers.append((key, value))
    return tuple(headers), position


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
    return _assemble(
        body,
        compression,
        compression_level,
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


def _assemble(
    payload: bytes | bytearray | memoryview,
    codec: int,
    level: int | None,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    records_count: int,
) -> bytes:
    """Header + (compressed) record bytes, with batchLength and CRC-32C filled in."""
    if codec != CompressionType.NONE:
        payload = compress_to_buffer(codec, payload, level)
    header = bytearray(
        HEADER_STRUCT.pack(
            base_offset,
            HEADER_SIZE - LOG_OVERHEAD + len(payload),
            partition_leader_epoch,
            2,
            0,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            records_count,
        )
    )
    crc = crc32c.crc32c(payload, crc32c.crc32c(memoryview(header)[ATTRIBUTES:]))
    _CRC.pack_into(header, CRC, crc)
    return b"".join((header, payload))


# ---------------------------------------------------------------- recompression


def recompress_batches(
    records: bytes | bytearray | memoryview, codec: int, *, level: int | None = None
) -> bytes:
    """Re-encode every batch with ``codec`` (the broker's topic-level compression.type).

    Only the payload's compression changes: the record bytes (offset and timestamp
    deltas included) and every header field other than the codec bits, batchLength
    and CRC are kept. A batch already in ``codec`` is kept byte-identical, and so is an
    uncompressed control batch (Kafka does not compress control records that arrive
    uncompressed). Raises InvalidBatchError for a malformed or corrupt source batch.
    """
    if not 0 <= codec <= _MAX_CODEC:
        raise CompressionError(f"unknown compression codec {codec}")
    data = _indexable(records)
    view = memoryview(data)  # slices of it do not copy
    parts: list[bytes | memoryview] = []
    for header in iter_headers(data):
        source_codec = header.compression
        batch_end = header.position + header.size
        if source_codec == codec or (header.is_control and source_codec == CompressionType.NONE):
            parts.append(view[header.position : batch_end])
            continue
        _check_crc(data, header)
        body = view[header.position + HEADER_SIZE : batch_end]
        raw: bytes | memoryview = (
            body if source_codec == CompressionType.NONE else _decompress(source_codec, body)
        )
        parts.append(
            _assemble(
                raw,
                codec,
                level,
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
        )
    return b"".join(parts)
