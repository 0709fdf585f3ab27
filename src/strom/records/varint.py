"""Zig-zag varints as used inside v2 records (protobuf's signed encoding).

Kafka writes every length, delta and count inside a record as a zig-zag varint:
int32 fields take at most 5 bytes, int64 fields (the timestamp delta) at most 10.
"""

from __future__ import annotations

from typing import Protocol


class ByteIndexable(Protocol):
    """bytes, or a memoryview of unsigned bytes: indexing yields an int."""

    def __getitem__(self, index: int, /) -> int: ...

    def __len__(self) -> int: ...


MAX_VARINT_BYTES = 5
MAX_VARLONG_BYTES = 10


class VarintError(ValueError):
    """A varint that runs past its buffer or past its maximum length."""


def zigzag(value: int) -> int:
    """Map a signed int64 to the unsigned value its varint carries (0, -1, 1, -2 -> 0, 1, 2, 3)."""
    return (value << 1) ^ (value >> 63)


def write_varint(out: bytearray, value: int) -> None:
    """Append the zig-zag varint of ``value`` (int32 or int64) to ``out``."""
    unsigned = (value << 1) ^ (value >> 63)
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)


def read_varint(buf: ByteIndexable, position: int, max_bytes: int = MAX_VARINT_BYTES) -> tuple[int, int]:
    """Decode the zig-zag varint at ``position``; return (value, position after it).

    ``max_bytes`` is 5 for int32 fields and 10 for int64 fields, like Kafka's
    ByteUtils.readVarint / readVarlong, which reject longer encodings.
    """
    result = 0
    try:
        for shift in range(0, 7 * max_bytes, 7):
            byte = buf[position]
            position += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return (result >> 1) ^ -(result & 1), position
    except IndexError:
        raise VarintError("varint runs past the end of its buffer") from None
    raise VarintError(f"varint longer than {max_bytes} bytes")
