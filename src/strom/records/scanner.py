"""The one record scanner: every reader of v2 records goes through it, and so does every writer of batches.

The records of a batch are the bytes after its 61-byte header, decompressed:

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

The walk is C (``strom.records._scanner``, built by setup.py): the broker's LogValidator
runs it over every record of every appended batch, so it must cost next to nothing. One
walk, three outputs: ``validate`` (a summary for the validator), ``decode`` (the records,
for the consumer and the tools) and ``layout`` (byte positions, for the log cleaner). All
of them reject the same records, with RecordError:

- a varint that runs past its record, or is longer or wider than its field (5 bytes for
  int32 fields, 10 for the timestamp delta);
- a record length that is negative, runs past the batch, or differs from what the record's
  fields take;
- a key or value length below -1, a header count below 0 or larger than the bytes left
  could hold, a negative header key length, a header value length below -1, any field
  running past its record;
- offset deltas that do not rise strictly or pass the batch's lastOffsetDelta (a client's
  batch, whose count is lastOffsetDelta + 1, therefore has exactly 0, 1, 2, ...);
- a record count that is negative or larger than the bytes could hold, and bytes left after
  the declared records.

``batch_records`` finds a batch's record bytes (checking the CRC and decompressing within a
bound); ``assemble_batch`` is the one place a batch header and its CRC are written.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import crc32c

from strom.records.batch import (
    ATTRIBUTES,
    COMPRESSION_MASK,
    CRC,
    HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    BatchHeader,
    CompressionType,
    InvalidBatchError,
    compute_crc,
)
from strom.records.compression import CompressionError, compress_to_buffer, decompress_to_buffer

Header = tuple[str, bytes | None]

# The name under which strom.spark ships the compiled scanner to Spark executors (see below).
SHIPPED_SCANNER_PREFIX = "strom-records-_scanner"


def _load_scanner() -> ModuleType:
    """The C scanner: normally the package's extension module. Spark executors get the strom
    package as a zip (addPyFile), and zipimport loads no extension module, so strom.spark also
    ships the compiled file (addFile) into Spark's files folder, which is on their sys.path."""
    try:
        import strom.records._scanner as scanner_module
    except ImportError:
        for entry in sys.path:
            folder = Path(entry or ".")
            if not folder.is_dir():
                continue
            for path in folder.glob(SHIPPED_SCANNER_PREFIX + "*"):
                spec = importlib.util.spec_from_file_location("strom.records._scanner", path)
                if spec is not None and spec.loader is not None:
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    return module
        raise
    return scanner_module


_scanner = _load_scanner()
BytesLike = bytes | bytearray | memoryview

RecordError = _scanner.RecordError
MAX_CODEC = CompressionType.ZSTD
_CRC = struct.Struct(">I")


def validate(
    data: BytesLike,
    start: int,
    end: int,
    header: BatchHeader,
    earliest: int,
    latest: int,
    check_timestamps: bool,
    check_keys: bool,
) -> tuple[int, list[int] | None, list[int] | None]:
    """Walk every record of ``header``'s batch in ``data[start:end]``.

    Returns the largest record timestamp, the indexes of keyless records when ``check_keys``
    and those of records whose timestamp (other than -1) lies outside [earliest, latest] when
    ``check_timestamps`` (None when there are none). Raises RecordError.
    """
    result: tuple[int, list[int] | None, list[int] | None] = _scanner.validate(
        data,
        start,
        end,
        header.records_count,
        header.last_offset_delta,
        header.base_timestamp,
        earliest,
        latest,
        check_timestamps,
        check_keys,
    )
    return result


def check(data: BytesLike, start: int, end: int, count: int, last_offset_delta: int) -> None:
    """Only the checks: raises RecordError for a malformed record (a decoder of its own, such as
    the Spark columnar one, calls this first so that it accepts exactly what the scanner does)."""
    _scanner.validate(data, start, end, count, last_offset_delta, 0, 0, 0, False, False)


def decode(
    data: BytesLike, start: int, end: int, count: int, last_offset_delta: int
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]]:
    """Every record as (offset delta, timestamp delta, key, value, headers). Raises RecordError."""
    records: list[tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]] = _scanner.decode(
        data, start, end, count, last_offset_delta
    )
    return records


# A record's place in its payload, as layout() gives it (a plain tuple: there are millions).
RecordLayout = tuple[int, int, int, int, int, int, bytes | None, bool]


def layout(data: BytesLike, start: int, end: int, count: int, last_offset_delta: int) -> list[RecordLayout]:
    """Every record as (start, attributes position, end of its timestamp delta, end, offset delta,
    timestamp delta, key, has value). Raises RecordError."""
    records: list[RecordLayout] = _scanner.layout(data, start, end, count, last_offset_delta)
    return records


def read_headers(data: BytesLike, position: int, end: int) -> tuple[tuple[Header, ...], int]:
    """A header count and its headers at ``position`` (ending by ``end``), and the position after them."""
    result: tuple[tuple[Header, ...], int] = _scanner.read_headers(data, position, end)
    return result


def batch_records(
    data: BytesLike,
    header: BatchHeader,
    *,
    verify_crc: bool = True,
    limit: int | None = None,
    position: int | None = None,
) -> tuple[BytesLike, int, int]:
    """The record bytes of the batch ``header`` describes: (buffer, start, end).

    The batch starts at ``position`` in ``data`` (default: ``header.position``).
    An uncompressed batch's records stay in ``data``; a compressed one's are decompressed,
    to at most ``limit`` bytes (compression.MAX_DECOMPRESSED_BATCH_BYTES by default).
    Raises InvalidBatchError: corrupt=True for a truncated batch, a CRC mismatch or a
    payload that does not decompress within the limit; corrupt=False for an unknown codec.
    """
    if position is None:
        position = header.position
    batch_end = position + header.size
    if batch_end > len(data):
        raise InvalidBatchError("record batch is truncated", corrupt=True)
    if verify_crc and compute_crc(data, position, header.size) != header.crc:
        raise InvalidBatchError(
            f"record batch at offset {header.base_offset} fails its CRC (stored crc = {header.crc})", corrupt=True
        )
    codec = header.attributes & COMPRESSION_MASK
    if codec == CompressionType.NONE:
        return data, position + HEADER_SIZE, batch_end
    if codec > MAX_CODEC:
        raise InvalidBatchError(f"unknown compression codec {codec}", corrupt=False)
    try:
        if limit is None:
            payload = decompress_to_buffer(codec, memoryview(data)[position + HEADER_SIZE : batch_end])
        else:
            payload = decompress_to_buffer(
                codec, memoryview(data)[position + HEADER_SIZE : batch_end], limit
            )
    except CompressionError as error:
        raise InvalidBatchError(str(error), corrupt=True) from error
    return payload, 0, len(payload)


def assemble_batch(
    records: BytesLike, *, attributes: int, compression_level: int | None = None, **fields: int
) -> bytearray:
    """A v2 batch: the header (``fields``: write_header's) around ``records``, compressed with
    the codec in ``attributes``."""
    codec = attributes & COMPRESSION_MASK
    payload: Any = records if codec == CompressionType.NONE else compress_to_buffer(codec, records, compression_level)
    batch = bytearray(HEADER_SIZE)
    batch += payload
    write_header(batch, attributes=attributes, **fields)
    return batch


def write_header(
    batch: bytearray,
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
) -> None:
    """Fill in the 61 header bytes ``batch`` starts with, batchLength (the rest of ``batch``) and CRC-32C."""
    HEADER_STRUCT.pack_into(
        batch,
        0,
        base_offset,
        len(batch) - LOG_OVERHEAD,
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
    write_crc(batch)


def write_crc(batch: bytearray | memoryview, position: int = 0, size: int | None = None) -> None:
    """Compute and store the CRC-32C of the batch at ``position`` (of ``size`` bytes, default: to the end).

    The GIL is kept: hardware CRC-32C takes ~40 us per MiB, less than the wait to take the GIL
    back from a busy thread.
    """
    end = len(batch) if size is None else position + size
    crc = crc32c.crc32c(memoryview(batch)[position + ATTRIBUTES : end], 0, 0)
    _CRC.pack_into(batch, position + CRC, crc)
