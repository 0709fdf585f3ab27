from __future__ import annotations

import pytest

from strom.records.varint import (
    MAX_VARLONG_BYTES,
    VarintError,
    read_varint,
    write_varint,
    zigzag,
)

# Encodings as protobuf's zig-zag sint32/sint64 (and Kafka's ByteUtils) define them.
KNOWN = [
    (0, b"\x00"),
    (-1, b"\x01"),
    (1, b"\x02"),
    (63, b"\x7e"),
    (-64, b"\x7f"),
    (64, b"\x80\x01"),
    (300, b"\xd8\x04"),
    (2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
    (-(2**31), b"\xff\xff\xff\xff\x0f"),
    (2**63 - 1, b"\xfe" + b"\xff" * 8 + b"\x01"),
    (-(2**63), b"\xff" * 9 + b"\x01"),
]


@pytest.mark.parametrize(("value", "encoded"), KNOWN)
def test_known_encodings(value: int, encoded: bytes) -> None:
    out = bytearray()
    write_varint(out, value)
    assert bytes(out) == encoded
    assert read_varint(encoded, 0, MAX_VARLONG_BYTES) == (value, len(encoded))


def test_zigzag_order() -> None:
    assert [zigzag(v) for v in (0, -1, 1, -2, 2)] == [0, 1, 2, 3, 4]


def test_read_at_position_inside_a_view() -> None:
    buf = memoryview(b"\xaa\xbb\xd8\x04\x01")
    assert read_varint(buf, 2) == (300, 4)
    assert read_varint(buf, 4) == (-1, 5)


def test_truncated_varint() -> None:
    with pytest.raises(VarintError, match="past the end"):
        read_varint(b"\x80\x80", 0)


def test_int32_varint_longer_than_five_bytes() -> None:
    six_bytes = b"\x80\x80\x80\x80\x80\x01"
    with pytest.raises(VarintError, match="longer than 5"):
        read_varint(six_bytes, 0)
    # The same bytes are a valid varlong.
    assert read_varint(six_bytes, 0, MAX_VARLONG_BYTES) == (zigzag_inverse(1 << 35), 6)


def zigzag_inverse(unsigned: int) -> int:
    return (unsigned >> 1) ^ -(unsigned & 1)
