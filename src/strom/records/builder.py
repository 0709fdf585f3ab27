"""An incremental record batch v2 builder: the producer's records go straight into one buffer.

The producer appends each record as it is sent, encoded in place after 61 bytes kept
for the batch header (layout in strom.records.codec). The header and the CRC-32C are
written once, when the batch is closed for sending; that is also when a compressed
batch's records are compressed. Producer id, epoch and base sequence are known only
then (they are assigned when the batch is drained), and a retry after an epoch bump
rewrites them in the built batch (``rewrite_producer_state``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from strom.records.batch import (
    HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    PRODUCER_ID,
    TRANSACTIONAL_FLAG,
    CompressionType,
)
from strom.records.codec import Record, decode_batch
from strom.records.compression import compress_to_buffer
from strom.records.scanner import write_crc, write_header
from strom.records.varint import write_varint

Header = tuple[str, bytes | None]

# Zig-zag varints of 0..VARINT_TABLE_SIZE-1, precomputed: lengths, offset deltas and
# timestamp deltas inside a batch are almost always small, and a list lookup is far
# cheaper than encoding in Python.
VARINT_TABLE_SIZE = 1 << 14


def varint_bytes(value: int) -> bytes:
    """The zig-zag varint of ``value`` as bytes."""
    out = bytearray()
    write_varint(out, value)
    return bytes(out)


_VARINTS: list[bytes] = [varint_bytes(n) for n in range(VARINT_TABLE_SIZE)]
_NULL = b"\x01"  # the varint of -1: a null key, value or header value
_PRODUCER_STATE = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence: contiguous


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
) -> bytes:
    """One record with its length prefix (the general path: headers, large fields)."""
    body = bytearray(b"\x00")  # attributes
    write_varint(body, timestamp_delta)
    write_varint(body, offset_delta)
    for field in (key, value):
        if field is None:
            body += _NULL
        else:
            write_varint(body, len(field))
            body += field
    write_varint(body, len(headers))
    for header_key, header_value in headers:
        name = header_key.encode()
        write_varint(body, len(name))
        body += name
        if header_value is None:
            body += _NULL
        else:
            write_varint(body, len(header_value))
            body += header_value
    out = bytearray()
    write_varint(out, len(body))
    out += body
    return bytes(out)


class RecordBatchBuilder:
    """Records appended one by one into ``buffer``; ``build`` turns it into a v2 batch.

    ``limit`` is the batch size in bytes (header included) beyond which ``try_append``
    refuses records; the first record is always accepted, however large.
    """

    __slots__ = ("base_timestamp", "buffer", "limit", "max_timestamp", "record_count")

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray(HEADER_SIZE)
        self.limit = limit
        self.record_count = 0
        self.base_timestamp = 0
        self.max_timestamp = 0

    @property
    def size(self) -> int:
        """Uncompressed bytes so far, header included."""
        return len(self.buffer)

    def try_append(
        self, timestamp: int, key: bytes | None, value: bytes | None, headers: Sequence[Header] | None
    ) -> int:
        """Append a record; return the bytes it took, or 0 if it does not fit."""
        count = self.record_count
        if count:
            delta = timestamp - self.base_timestamp
            if timestamp > self.max_timestamp:
                self.max_timestamp = timestamp
        else:
            self.base_timestamp = self.max_timestamp = timestamp
            delta = 0
        table = _VARINTS
        n = VARINT_TABLE_SIZE
        if not headers and 0 <= delta < n and count < n:
            if key is None:
                key_length = 0
                key_prefix = _NULL
                key = b""
            else:
                key_length = len(key)
                key_prefix = table[key_length] if key_length < n else varint_bytes(key_length)
            if value is None:
                value_length = 0
                value_prefix = _NULL
                value = b""
            else:
                value_length = len(value)
                value_prefix = table[value_length] if value_length < n else varint_bytes(value_length)
            timestamp_delta = table[delta]
            offset_delta = table[count]
            # attributes + timestampDelta + offsetDelta + key + value + headerCount
            body = (
                2
                + len(timestamp_delta)
                + len(offset_delta)
                + len(key_prefix)
                + key_length
                + len(value_prefix)
                + value_length
            )
            length_prefix = table[body] if body < n else varint_bytes(body)
            size = len(length_prefix) + body
            buffer = self.buffer
            if count and len(buffer) + size > self.limit:
                return 0
            # The value (usually the bulk) is copied once, straight into the batch.
            buffer += b"".join((length_prefix, b"\x00", timestamp_delta, offset_delta, key_prefix, key, value_prefix))
            buffer += value
            buffer += b"\x00"  # no headers
        else:
            record = encode_record(count, delta, key, value, headers or ())
            size = len(record)
            if count and len(self.buffer) + size > self.limit:
                return 0
            self.buffer += record
        self.record_count = count + 1
        return size

    def build(
        self,
        *,
        compression: int = CompressionType.NONE,
        compression_level: int | None = None,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        is_transactional: bool = False,
    ) -> bytearray:
        """The finished batch (base offset 0). Uncompressed, it is ``buffer`` itself, completed in place."""
        count = self.record_count
        if not count:
            raise ValueError("a record batch needs at least one record")
        buffer = self.buffer
        if compression == CompressionType.NONE:
            batch = buffer
        else:
            payload = compress_to_buffer(compression, memoryview(buffer)[HEADER_SIZE:], compression_level)
            batch = bytearray(HEADER_SIZE)
            batch += payload
        write_header(
            batch,
            base_offset=0,  # the broker assigns it
            partition_leader_epoch=NO_PARTITION_LEADER_EPOCH,
            attributes=compression | (TRANSACTIONAL_FLAG if is_transactional else 0),
            last_offset_delta=count - 1,
            base_timestamp=self.base_timestamp,
            max_timestamp=self.max_timestamp,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            records_count=count,
        )
        return batch


    def records(self) -> list[Record]:
        """The records appended so far, decoded (offsets relative to the batch)."""
        data = bytearray(self.buffer)
        HEADER_STRUCT.pack_into(
            data,
            0,
            0,
            len(data) - LOG_OVERHEAD,
            NO_PARTITION_LEADER_EPOCH,
            2,
            0,
            CompressionType.NONE,
            self.record_count - 1,
            self.base_timestamp,
            self.max_timestamp,
            -1,
            -1,
            -1,
            self.record_count,
        )
        return decode_batch(data, verify_crc=False).records


def rewrite_producer_state(batch: bytearray, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
    """Set a built batch's producer id, epoch and base sequence, and its CRC again."""
    _PRODUCER_STATE.pack_into(batch, PRODUCER_ID, producer_id, producer_epoch, base_sequence)
    write_crc(batch)
