"""Builds valid v2 record batches for storage tests (struct + crc32c, independent of strom.records)."""

from __future__ import annotations

import struct
import time

import crc32c


def _varint(value: int) -> bytes:
    unsigned = (value << 1) ^ (value >> 63)
    unsigned &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)
    return bytes(out)


def _record(offset_delta: int, timestamp_delta: int, value: bytes) -> bytes:
    body = (
        b"\x00"
        + _varint(timestamp_delta)
        + _varint(offset_delta)
        + _varint(-1)  # null key
        + _varint(len(value))
        + value
        + _varint(0)  # no headers
    )
    return _varint(len(body)) + body


def make_batch(
    count: int = 1,
    value_size: int = 10,
    *,
    timestamps: list[int] | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
    attributes: int = 0,
) -> bytes:
    if timestamps is None:
        now = time.time_ns() // 1_000_000
        timestamps = [now]
    # A short list repeats its last timestamp for the remaining records.
    timestamps = timestamps + [timestamps[-1]] * (count - len(timestamps))
    base_ts = timestamps[0]
    records = b"".join(
        _record(i, timestamps[i] - base_ts, bytes([i % 256]) * value_size) for i in range(count)
    )
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            count - 1,
            base_ts,
            max(timestamps),
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
        + records
    )
    crc = crc32c.crc32c(after_crc)
    # batchLength counts from partitionLeaderEpoch to the end.
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, length, -1, 2, crc) + after_crc


def batch_offsets(records: bytes) -> list[tuple[int, int]]:
    """(base offset, last offset) of each batch in a record set."""
    out = []
    position = 0
    while position < len(records):
        base, length = struct.unpack_from(">qi", records, position)
        (delta,) = struct.unpack_from(">i", records, position + 23)
        out.append((base, base + delta))
        position += 12 + length
    return out
