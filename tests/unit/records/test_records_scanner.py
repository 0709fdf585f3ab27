"""The record scanner (strom.records.scanner, C): every malformed kind, varint edges, every codec,
bounded decompression, and a seeded differential fuzz against a plain-Python reading of the rules."""

from __future__ import annotations

import random
import resource
import struct
from collections.abc import Sequence

import pytest

from strom.records import scanner
from strom.records.batch import CompressionType, InvalidBatchError, read_header
from strom.records.compression import (
    MAX_DECOMPRESSED_BATCH_BYTES,
    XERIAL_MAGIC,
    CompressionError,
    compress,
    decompress,
    decompression_limit,
)
from strom.records.varint import zigzag

ALL_CODECS = [
    CompressionType.NONE,
    CompressionType.GZIP,
    CompressionType.SNAPPY,
    CompressionType.LZ4,
    CompressionType.ZSTD,
]


def varint(value: int) -> bytes:
    unsigned = zigzag(value) & ((1 << 64) - 1)
    out = bytearray()
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)
    return bytes(out)


def field(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def body(
    offset_delta: int,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: Sequence[tuple[bytes, bytes | None]] = (),
    timestamp_delta: int = 0,
) -> bytes:
    out = b"\x00" + varint(timestamp_delta) + varint(offset_delta) + field(key) + field(value)
    out += varint(len(headers))
    for hkey, hvalue in headers:
        out += field(hkey) + field(hvalue)
    return out


def record(offset_delta: int, *args: object, **kwargs: object) -> bytes:
    raw = body(offset_delta, *args, **kwargs)  # type: ignore[arg-type]
    return varint(len(raw)) + raw


def scan(payload: bytes, count: int, last_offset_delta: int | None = None) -> list[tuple[object, ...]]:
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    return [tuple(r) for r in scanner.decode(payload, 0, len(payload), count, lod)]


def check(payload: bytes, count: int, last_offset_delta: int | None = None) -> None:
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    scanner.check(payload, 0, len(payload), count, lod)


def rejects(payload: bytes, count: int, match: str, last_offset_delta: int | None = None) -> None:
    """Every output of the scanner refuses the payload with the same message."""
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    messages = set()
    for run in (scanner.check, scanner.decode, scanner.layout):
        with pytest.raises(scanner.RecordError, match=match) as caught:
            run(payload, 0, len(payload), count, lod)  # type: ignore[operator]
        messages.add(str(caught.value))
    assert len(messages) == 1


# ---------------------------------------------------------------- well-formed records


def test_decodes_every_field() -> None:
    payload = (
        record(0, b"key", b"value", timestamp_delta=-5)
        + record(1, None, None, headers=[(b"h", b"1"), ("ü".encode(), None)], timestamp_delta=10**12)
        + record(2, b"", b"")
    )
    assert scan(payload, 3) == [
        (0, -5, b"key", b"value", ()),
        (1, 10**12, None, None, (("h", b"1"), ("ü", None))),
        (2, 0, b"", b"", ()),
    ]
    start, body_at, after_ts, end, offset_delta, ts_delta, key, has_value = scanner.layout(
        payload, 0, len(payload), 3, 2
    )[1]
    assert (start, payload[body_at], offset_delta, ts_delta, key, has_value) == (
        len(record(0, b"key", b"value", timestamp_delta=-5)),
        0,
        1,
        10**12,
        None,
        False,
    )
    assert end == start + len(record(1, None, None, headers=[(b"h", b"1"), ("ü".encode(), None)], timestamp_delta=10**12))
    assert after_ts == body_at + 1 + len(varint(10**12))


def test_validate_reports_max_timestamp_keyless_and_out_of_range_records() -> None:
    payload = record(0, None, b"a", timestamp_delta=7) + record(1, b"k", b"b", timestamp_delta=-3) + record(
        2, None, b"c", timestamp_delta=2
    )
    header = read_header(
        scanner.assemble_batch(
            payload,
            attributes=0,
            base_offset=0,
            partition_leader_epoch=-1,
            last_offset_delta=2,
            base_timestamp=1000,
            max_timestamp=0,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            records_count=3,
        )
    )
    assert scanner.validate(payload, 0, len(payload), header, 0, 10**6, True, True) == (1007, [0, 2], None)
    assert scanner.validate(payload, 0, len(payload), header, 998, 1003, True, True) == (1007, [0, 2], [0, 1])
    assert scanner.validate(payload, 0, len(payload), header, 998, 1003, False, False) == (1007, None, None)


def test_timestamp_of_minus_one_is_never_out_of_range() -> None:
    payload = record(0, timestamp_delta=0)
    header = read_header(
        scanner.assemble_batch(
            payload,
            attributes=0,
            base_offset=0,
            partition_leader_epoch=-1,
            last_offset_delta=0,
            base_timestamp=-1,
            max_timestamp=-1,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            records_count=1,
        )
    )
    assert scanner.validate(payload, 0, len(payload), header, 5, 10, True, True) == (-1, None, None)


def test_cleaned_batches_may_have_gaps_in_offset_deltas() -> None:
    payload = record(0) + record(3) + record(9)
    assert [r[0] for r in scan(payload, 3, last_offset_delta=9)] == [0, 3, 9]


def test_empty_batch() -> None:
    assert scan(b"", 0, last_offset_delta=4) == []


def test_header_keys_decode_like_kafka_with_replacement() -> None:
    payload = record(0, headers=[(b"\xff", b"x")])
    assert scan(payload, 1)[0][4] == (("\ufffd", b"x"),)


def test_scans_inside_a_larger_buffer() -> None:
    payload = record(0) + record(1)
    padded = b"\x7f" * 5 + payload + b"\x7f" * 3
    assert scanner.decode(memoryview(padded), 5, 5 + len(payload), 2, 1) == scanner.decode(payload, 0, len(payload), 2, 1)
    with pytest.raises(ValueError, match="outside"):
        scanner.decode(payload, 0, len(payload) + 1, 2, 1)


# ---------------------------------------------------------------- malformed records


def test_record_length_past_the_end() -> None:
    rejects(varint(50) + body(0), 1, "expected 50 bytes in record payload")


def test_record_length_larger_than_its_fields() -> None:
    raw = body(0) + b"\x00"
    rejects(varint(len(raw)) + raw, 1, "expected to read 9 bytes in record payload, but instead read 8")


def test_record_length_smaller_than_its_fields() -> None:
    raw = body(0, b"key", b"value")
    rejects(varint(len(raw) - 1) + raw, 1, "record 0")


def test_negative_record_length() -> None:
    rejects(varint(-3) + body(0), 1, "invalid record size -3")


def test_zero_length_record() -> None:
    rejects(varint(0) + b"\x00" * 8, 1, "invalid record structure")


def test_count_larger_than_the_records() -> None:
    payload = record(0, b"k" * 20) + record(1, b"k" * 20)
    rejects(payload, 3, "record 2 at byte", last_offset_delta=2)


def test_count_smaller_than_the_records() -> None:
    payload = record(0) + record(1) + record(2)
    rejects(payload, 2, r"\d+ bytes left after the batch's 2 declared records")


def test_count_that_cannot_fit_is_refused_before_anything_is_allocated() -> None:
    rejects(record(0), 2**31 - 1, "does not fit")
    rejects(record(0), -1, "does not fit")


@pytest.mark.parametrize(
    ("deltas", "last_offset_delta", "bad"),
    [([0, 0], 1, 1), ([0, 2], 1, 1), ([1, 2], 2, None), ([0, 1, 1], 2, 2), ([-1, 0], 1, 0), ([0, 5], 5, None)],
)
def test_offset_deltas_rise_strictly_within_the_last_offset_delta(
    deltas: list[int], last_offset_delta: int, bad: int | None
) -> None:
    payload = b"".join(record(d) for d in deltas)
    if bad is None:
        check(payload, len(deltas), last_offset_delta)
    else:
        rejects(payload, len(deltas), f"record {bad} at .*offset delta", last_offset_delta)


@pytest.mark.parametrize(("which", "length"), [("key", -2), ("value", -7)])
def test_lengths_below_minus_one(which: str, length: int) -> None:
    raw = b"\x00\x00\x00" + (varint(length) if which == "key" else field(b"k") + varint(length)) + b"\x00" * 4
    rejects(varint(len(raw)) + raw, 1, f"invalid {which} length {length}")


def test_key_running_past_its_record() -> None:
    raw = b"\x00\x00\x00" + varint(40) + b"k" * 5
    rejects(varint(len(raw)) + raw + b"\x00" * 40, 1, "a field of 40 bytes runs past its record")


def test_header_count_out_of_bounds() -> None:
    raw = b"\x00\x00\x00" + field(b"k") + field(b"v") + varint(2**30)
    rejects(varint(len(raw)) + raw, 1, "invalid number of record headers 1073741824")
    raw = b"\x00\x00\x00" + field(b"k") + field(b"v") + varint(-1)
    rejects(varint(len(raw)) + raw, 1, "invalid number of record headers -1")


def test_header_with_null_key_or_bad_value_length() -> None:
    raw = b"\x00\x00\x00" + field(b"k") + field(b"v") + varint(1) + varint(-1) + varint(-1)
    rejects(varint(len(raw)) + raw, 1, "negative header key size -1")
    raw = b"\x00\x00\x00" + field(b"k") + field(b"v") + varint(1) + field(b"h") + varint(-2)
    rejects(varint(len(raw)) + raw, 1, "invalid header value length -2")
    raw = b"\x00\x00\x00" + field(b"k") + field(b"v") + varint(1) + field(b"h") + varint(9) + b"xy"
    rejects(varint(len(raw)) + raw, 1, "runs past its record")


def test_varint_running_past_its_record() -> None:
    raw = b"\x00\x00\x80"  # an offset delta whose varint goes on past the record
    rejects(varint(len(raw)) + raw + b"\x00" * 6, 1, "a varint runs past its record")


# ---------------------------------------------------------------- varints


@pytest.mark.parametrize("value", [0, -1, 1, 63, -64, 64, 8191, -8192, 2**31 - 1, -(2**31)])
def test_int32_varints_round_trip(value: int) -> None:
    # As an offset delta (negative ones are refused as deltas, after decoding) and as a key length.
    raw = b"\x00\x00" + varint(value) + field(b"k") + field(b"v") + b"\x00"
    payload = varint(len(raw)) + raw
    if value >= 0:
        assert scanner.decode(payload, 0, len(payload), 1, 2**31 - 1)[0][0] == value
    else:
        rejects(payload, 1, f"offset delta {value} ", last_offset_delta=2**31 - 1)
    raw = b"\x00\x00\x00" + varint(value) + b"\x00" * 3
    payload = varint(len(raw)) + raw
    if value < -1 or value > 3:
        rejects(payload, 1, "key length" if value < -1 else "runs past its record")


@pytest.mark.parametrize("value", [0, -1, 2**62, -(2**63), 2**63 - 1])
def test_varlong_timestamp_deltas(value: int) -> None:
    assert scan(record(0, timestamp_delta=value), 1)[0][1] == value


@pytest.mark.parametrize(
    "encoding",
    [
        b"\x80\x80\x80\x80\x80\x00",  # six bytes
        b"\xff\xff\xff\xff\x1f",  # a fifth byte wider than the 32 bits of an int32
        b"\x80\x80\x80\x80\x90",  # a fifth byte that goes on
    ],
)
def test_int32_varints_longer_or_wider_than_their_field(encoding: bytes) -> None:
    raw = b"\x00\x00" + encoding + field(b"k") + field(b"v") + b"\x00"
    rejects(varint(len(raw)) + raw, 1, "too long")


def test_a_five_byte_int32_varint_is_fine() -> None:
    raw = b"\x00\x00" + b"\x80\x80\x80\x80\x00" + field(b"k") + field(b"v") + b"\x00"
    assert scan(varint(len(raw)) + raw, 1)[0][0] == 0


def test_varlong_longer_than_ten_bytes() -> None:
    raw = b"\x00" + b"\x80" * 10 + b"\x00" + b"\x00" + field(b"k") + field(b"v") + b"\x00"
    rejects(varint(len(raw)) + raw, 1, "too long")
    raw = b"\x00" + b"\x80" * 9 + b"\x02" + b"\x00" + field(b"k") + field(b"v") + b"\x00"
    rejects(varint(len(raw)) + raw, 1, "too long")


def test_record_length_varint_that_is_too_long() -> None:
    rejects(b"\xff\xff\xff\xff\xff\x01" + b"\x00" * 10, 1, "too long")


# ---------------------------------------------------------------- batches and codecs


def batch(payload: bytes, count: int, codec: int = CompressionType.NONE, last_offset_delta: int | None = None) -> bytearray:
    return scanner.assemble_batch(
        payload,
        attributes=codec,
        base_offset=0,
        partition_leader_epoch=-1,
        last_offset_delta=count - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp=0,
        max_timestamp=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        records_count=count,
    )


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_every_codec(codec: int) -> None:
    payload = b"".join(record(i, b"key-%d" % i, b"v" * i) for i in range(50))
    buf = batch(payload, 50, codec)
    data, start, end = scanner.batch_records(buf, read_header(buf))
    assert bytes(memoryview(data)[start:end]) == payload
    assert [r[3] for r in scanner.decode(data, start, end, 50, 49)] == [b"v" * i for i in range(50)]


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codecs(codec: int) -> None:
    buf = batch(record(0), 1)
    struct.pack_into(">h", buf, 21, codec)
    scanner.write_crc(buf)
    with pytest.raises(InvalidBatchError, match=f"unknown compression codec {codec}") as caught:
        scanner.batch_records(buf, read_header(buf))
    assert not caught.value.corrupt


@pytest.mark.parametrize("codec", ALL_CODECS[1:])
def test_payload_that_does_not_decompress(codec: int) -> None:
    buf = batch(b"\x13" * 40, 1)
    struct.pack_into(">h", buf, 21, codec)
    scanner.write_crc(buf)
    with pytest.raises(InvalidBatchError) as caught:
        scanner.batch_records(buf, read_header(buf))
    assert caught.value.corrupt


def test_crc_mismatch_and_truncation() -> None:
    buf = batch(record(0), 1)
    buf[-1] ^= 1
    with pytest.raises(InvalidBatchError, match="CRC"):
        scanner.batch_records(buf, read_header(buf))
    with pytest.raises(InvalidBatchError, match="truncated"):
        scanner.batch_records(buf[:-1], read_header(buf))


# ---------------------------------------------------------------- bounded decompression


@pytest.mark.parametrize("codec", ALL_CODECS[1:])
def test_decompression_stops_at_its_limit(codec: int) -> None:
    data = bytes(3 * 1024 * 1024)
    packed = compress(codec, data)
    assert decompress(codec, packed, limit=len(data)) == data
    with pytest.raises(CompressionError, match="limit"):
        decompress(codec, packed, limit=len(data) - 1)
    with pytest.raises(CompressionError, match="limit"):
        decompress(codec, packed, limit=1000)


def test_bombs_stop_at_the_cap_without_inflating() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for codec in ALL_CODECS[1:]:
        bomb = compress(codec, bytes(MAX_DECOMPRESSED_BATCH_BYTES * 2))
        with pytest.raises(CompressionError):
            decompress(codec, bomb)
    # Compressing the bomb here took 128 MiB once; decompression may hold the 64 MiB cap.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300 * 1024


def test_xerial_chunks_claiming_gigabytes_are_refused_before_allocating() -> None:
    # 97 bytes whose chunks' raw-snappy preambles claim 2 GiB: refused from the claims alone.
    chunk = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x07]) + b"\x00" * 8
    payload = XERIAL_MAGIC + struct.pack(">ii", 1, 1) + b"".join(struct.pack(">i", len(chunk)) + chunk for _ in range(5))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CompressionError, match="limit"):
        decompress(CompressionType.SNAPPY, payload)
    with pytest.raises(CompressionError, match="limit"):
        decompress(CompressionType.SNAPPY, chunk)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 10 * 1024


def test_decompression_limit_from_record_count_and_max_message_bytes() -> None:
    assert decompression_limit(3, 1000) == 3000
    assert decompression_limit(0, 1000) == 1000
    assert decompression_limit(10**6, 1 << 20) == MAX_DECOMPRESSED_BATCH_BYTES
    assert decompression_limit(10**6, 1 << 30) == 1 << 30
    assert decompression_limit(10**6) == MAX_DECOMPRESSED_BATCH_BYTES


# ---------------------------------------------------------------- differential fuzz


class Malformed(Exception):
    pass


def reference_decode(
    data: bytes, count: int, last_offset_delta: int
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    """The rules of strom.records.scanner's docstring, read one byte at a time in Python."""

    def read(position: int, limit: int, max_bytes: int, bits: int) -> tuple[int, int]:
        unsigned = 0
        for i in range(max_bytes):
            if position >= limit:
                raise Malformed
            byte = data[position]
            position += 1
            unsigned |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                if unsigned >> bits:
                    raise Malformed
                return (unsigned >> 1) ^ -(unsigned & 1), position
        raise Malformed

    if count < 0 or count > len(data) // 7:
        raise Malformed
    out = []
    position = 0
    previous = -1
    for _ in range(count):
        length, position = read(position, len(data), 5, 32)
        if length < 0 or length > len(data) - position:
            raise Malformed
        end = position + length
        if position >= end:
            raise Malformed
        timestamp_delta, position = read(position + 1, end, 10, 64)
        offset_delta, position = read(position, end, 5, 32)
        if not previous < offset_delta <= last_offset_delta:
            raise Malformed
        previous = offset_delta
        fields: list[bytes | None] = []
        for _field in ("key", "value"):
            size, position = read(position, end, 5, 32)
            if size < -1 or size > end - position:
                raise Malformed
            fields.append(None if size < 0 else data[position : position + size])
            position += max(size, 0)
        header_count, position = read(position, end, 5, 32)
        if header_count < 0 or header_count > (end - position) // 2:
            raise Malformed
        headers = []
        for _ in range(header_count):
            size, position = read(position, end, 5, 32)
            if size < 0 or size > end - position:
                raise Malformed
            key = data[position : position + size].decode(errors="replace")
            position += size
            size, position = read(position, end, 5, 32)
            if size < -1 or size > end - position:
                raise Malformed
            headers.append((key, None if size < 0 else data[position : position + size]))
            position += max(size, 0)
        if position != end:
            raise Malformed
        out.append((offset_delta, timestamp_delta, fields[0], fields[1], tuple(headers)))
    if position != len(data):
        raise Malformed
    return out


def random_records(rng: random.Random) -> tuple[bytes, int]:
    count = rng.randint(1, 12)
    parts = []
    for i in range(count):
        headers = [
            (rng.randbytes(rng.randint(0, 4)), None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 20)))
            for _ in range(rng.choice((0, 0, 1, 3)))
        ]
        key = None if rng.random() < 0.2 else rng.randbytes(rng.choice((0, 1, 10, 200)))
        value = None if rng.random() < 0.2 else rng.randbytes(rng.choice((0, 5, 100, 1000)))
        parts.append(record(i, key, value, headers, rng.choice((0, 1, -1, 300, -(2**40), 2**62))))
    return b"".join(parts), count


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(5)
        at = rng.randrange(len(buf) + 1)
        if kind == 0 and buf:
            buf[min(at, len(buf) - 1)] = rng.randrange(256)
        elif kind == 1 and buf:
            buf[min(at, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 2:
            buf[at:at] = rng.randbytes(rng.randint(1, 3))
        elif kind == 3:
            del buf[at : at + rng.randint(1, 3)]
        else:
            buf[at:at] = rng.choice((b"\x80" * 6, b"\xff\xff\xff\xff\x0f", b"\x01", b"\x03"))
    return bytes(buf)


@pytest.mark.parametrize("seed", range(4))
def test_scanner_agrees_with_the_reference_reading(seed: int) -> None:
    rng = random.Random(seed)
    outcomes = {"accepted": 0, "rejected": 0}
    for _ in range(1500):
        data, count = random_records(rng)
        if rng.random() < 0.8:
            data = mutate(rng, data)
        count += rng.choice((0, 0, 0, -1, 1))
        last_offset_delta = count - 1 + rng.choice((0, 0, 1))
        try:
            expected = reference_decode(data, count, last_offset_delta)
        except Malformed:
            expected = None
        try:
            got = scanner.decode(data, 0, len(data), count, last_offset_delta)
        except scanner.RecordError:
            got = None
        assert got == expected, (seed, data.hex(), count, last_offset_delta)
        checked = True
        try:
            scanner.check(data, 0, len(data), count, last_offset_delta)
        except scanner.RecordError:
            checked = False
        assert checked == (expected is not None)
        outcomes["accepted" if expected is not None else "rejected"] += 1
    assert outcomes["accepted"] > 100 and outcomes["rejected"] > 100
