from __future__ import annotations

import dataclasses
import struct
import time

import pytest

from strom.records import batch
from strom.records.batch import (
    CompressionType,
    InvalidBatchError,
    TimestampType,
    is_crc_valid,
    iter_headers,
    read_header,
)
from strom.records.codec import (
    Record,
    RecordSpec,
    decode_batch,
    decode_batches,
    encode_batch,
    recompress_batches,
)
from strom.records.compression import CompressionError, compress
from strom.records.control import ControlRecordType, build_control_batch

ALL_CODECS = [
    CompressionType.NONE,
    CompressionType.GZIP,
    CompressionType.SNAPPY,
    CompressionType.LZ4,
    CompressionType.ZSTD,
]

SPECS = [
    RecordSpec(b"key-0", b"value-0", timestamp=1_700_000_000_000),
    RecordSpec(None, b"null key", timestamp=1_700_000_000_005),
    RecordSpec(b"null value", None, timestamp=1_699_999_999_990),  # earlier than the first
    RecordSpec(None, None, timestamp=1_700_000_000_001),
    RecordSpec(b"", b"", timestamp=1_700_000_000_002),  # empty, not null
    RecordSpec(
        b"headers",
        b"v" * 300,  # multi-byte length varints
        headers=(("trace", b"abc"), ("null", None), ("ünïcode", b""), ("trace", b"dup")),
        timestamp=1_700_000_000_003,
    ),
]


def expected_records(specs: list[RecordSpec], base_offset: int) -> list[Record]:
    return [
        Record(base_offset + i, s.timestamp or 0, s.key, s.value, tuple(s.headers))
        for i, s in enumerate(specs)
    ]


def set_attributes_and_recrc(buf: bytearray, attributes: int) -> None:
    struct.pack_into(">h", buf, batch.ATTRIBUTES, attributes)
    struct.pack_into(">I", buf, batch.CRC, batch.compute_crc(buf, 0, len(buf)))


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_round_trip(codec: int) -> None:
    encoded = encode_batch(
        SPECS,
        base_offset=42,
        compression=codec,
        producer_id=7,
        producer_epoch=3,
        base_sequence=11,
        partition_leader_epoch=5,
    )
    decoded = decode_batch(encoded)
    assert decoded.records == expected_records(SPECS, 42)
    header = decoded.header
    assert is_crc_valid(encoded, header)
    assert header.size == len(encoded)
    assert header.compression == codec
    assert (header.base_offset, header.last_offset_delta, header.records_count) == (42, 5, 6)
    assert header.base_timestamp == 1_700_000_000_000  # the first record's, as Kafka writes it
    assert header.max_timestamp == 1_700_000_000_005
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 3, 11)
    assert header.partition_leader_epoch == 5
    assert header.timestamp_type == TimestampType.CREATE_TIME
    assert not header.is_transactional and not header.is_control


def test_defaults_mark_no_producer() -> None:
    header = read_header(encode_batch([RecordSpec(b"k", b"v", timestamp=1)]))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert header.partition_leader_epoch == -1
    assert header.attributes == 0


def test_flags() -> None:
    encoded = encode_batch(
        [RecordSpec(b"k", b"v", timestamp=1)],
        compression=CompressionType.ZSTD,
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
        is_control=True,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
    )
    header = read_header(encoded)
    assert header.attributes == 0x04 | 0x08 | 0x10 | 0x20


@pytest.mark.parametrize("codec", [CompressionType.NONE, CompressionType.LZ4])
def test_many_records(codec: int) -> None:
    specs = [
        RecordSpec(
            str(i).encode() if i % 7 else None,
            bytes([i % 256]) * (i % 500),
            headers=(("i", str(i).encode()),) if i % 3 == 0 else (),
            timestamp=1_000_000 + i * 13 - (i % 5) * 1000,
        )
        for i in range(3000)
    ]
    decoded = decode_batch(encode_batch(specs, base_offset=10**12, compression=codec))
    assert decoded.records == expected_records(specs, 10**12)
    assert decoded.header.last_offset == 10**12 + 2999
    assert decoded.header.max_timestamp == max(s.timestamp or 0 for s in specs)


def test_missing_timestamp_is_now() -> None:
    before = time.time_ns() // 1_000_000
    decoded = decode_batch(encode_batch([RecordSpec(b"a", b"1"), RecordSpec(b"b", b"2", timestamp=5)]))
    after = time.time_ns() // 1_000_000
    now = decoded.records[0].timestamp
    assert before <= now <= after
    assert decoded.records[1].timestamp == 5  # negative delta from the base
    assert decoded.header.max_timestamp == now


def test_log_append_time_reports_max_timestamp_for_every_record() -> None:
    encoded = encode_batch(
        SPECS, timestamp_type=TimestampType.LOG_APPEND_TIME, compression=CompressionType.GZIP
    )
    decoded = decode_batch(encoded)
    assert decoded.header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in decoded.records] == [1_700_000_000_005] * len(SPECS)


def test_broker_stamped_log_append_time() -> None:
    # The broker stamps LogAppendTime in place (batch.set_log_append_time); records keep their deltas.
    buf = bytearray(encode_batch(SPECS, compression=CompressionType.SNAPPY))
    batch.set_log_append_time(buf, read_header(buf), 1_800_000_000_000)
    decoded = decode_batch(buf)
    assert {r.timestamp for r in decoded.records} == {1_800_000_000_000}
    assert [r.value for r in decoded.records] == [s.value for s in SPECS]


def test_decode_batches_walks_every_batch() -> None:
    parts = [
        encode_batch(SPECS[:2], base_offset=0, compression=CompressionType.NONE),
        encode_batch(SPECS[2:4], base_offset=2, compression=CompressionType.ZSTD),
        build_control_batch(
            ControlRecordType.COMMIT,
            producer_id=1,
            producer_epoch=0,
            coordinator_epoch=0,
            base_offset=4,
            timestamp=9,
        ),
        encode_batch(SPECS[4:], base_offset=5, compression=CompressionType.GZIP),
    ]
    record_set = b"".join(parts)
    for buf in (record_set, bytearray(record_set), memoryview(record_set)):
        batches = decode_batches(buf)
        assert [b.header.base_offset for b in batches] == [0, 2, 4, 5]
        assert [b.header.position for b in batches] == [
            0,
            len(parts[0]),
            sum(map(len, parts[:2])),
            sum(map(len, parts[:3])),
        ]
        data_records = [r for b in batches if not b.header.is_control for r in b.records]
        assert [r.offset for r in data_records] == [0, 1, 2, 3, 5, 6]
        assert [r.key for r in data_records] == [s.key for s in SPECS]
    second = decode_batch(record_set, len(parts[0]))
    assert second.records[0] == Record(2, 1_699_999_999_990, b"null value", None, ())


def test_decode_empty_record_set() -> None:
    assert decode_batches(b"") == []


def test_decode_from_a_memoryview_slice() -> None:
    encoded = encode_batch(SPECS)
    decoded = decode_batch(memoryview(b"junk" + encoded + b"tail")[4:-4])
    assert decoded.records == expected_records(SPECS, 0)
    assert all(type(r.key) is bytes for r in decoded.records if r.key is not None)


# ---------------------------------------------------------------- bad input


def test_crc_mismatch() -> None:
    buf = bytearray(encode_batch(SPECS))
    buf[-1] ^= 0xFF
    with pytest.raises(InvalidBatchError, match="CRC") as caught:
        decode_batch(buf)
    assert caught.value.corrupt
    # Without the check the flipped byte shows up in the last record.
    assert decode_batch(buf, verify_crc=False).records[-1].headers[-1] == (
        "trace",
        b"du" + bytes([ord("p") ^ 0xFF]),
    )


def test_truncated_batch() -> None:
    encoded = encode_batch(SPECS)
    with pytest.raises(InvalidBatchError, match="truncated"):
        decode_batch(encoded[:-1])
    with pytest.raises(InvalidBatchError, match="truncated"):
        decode_batches(encoded + encoded[:70])


def test_declared_count_larger_than_records() -> None:
    buf = bytearray(encode_batch(SPECS))
    struct.pack_into(">i", buf, batch.RECORDS_COUNT, len(SPECS) + 1)
    struct.pack_into(">I", buf, batch.CRC, batch.compute_crc(buf, 0, len(buf)))
    with pytest.raises(InvalidBatchError, match="malformed record") as caught:
        decode_batch(buf)
    assert caught.value.corrupt


def test_declared_count_smaller_than_records() -> None:
    buf = bytearray(encode_batch(SPECS, compression=CompressionType.GZIP))
    struct.pack_into(">i", buf, batch.RECORDS_COUNT, len(SPECS) - 1)
    struct.pack_into(">I", buf, batch.CRC, batch.compute_crc(buf, 0, len(buf)))
    with pytest.raises(InvalidBatchError, match="bytes left after"):
        decode_batch(buf)


def test_record_length_that_lies() -> None:
    buf = bytearray(encode_batch([RecordSpec(b"k", b"v", timestamp=0)]))
    # The first record's length varint sits right after the header: claim one byte more.
    buf[batch.HEADER_SIZE] += 2
    buf += b"\x00"
    struct.pack_into(">i", buf, batch.BATCH_LENGTH, len(buf) - batch.LOG_OVERHEAD)
    struct.pack_into(">I", buf, batch.CRC, batch.compute_crc(buf, 0, len(buf)))
    with pytest.raises(InvalidBatchError, match="expected to read 9 bytes"):
        decode_batch(buf)


def test_field_running_past_its_record() -> None:
    body = bytearray(b"\x0c\x00\x00\x00\x7e\x00\x00")  # length 6; key length 63, but 2 bytes follow
    header = struct.pack(">qiibIhiqqqhii", 0, 49 + len(body), -1, 2, 0, 0, 0, 0, 0, -1, -1, -1, 1)
    buf = bytearray(header) + body
    struct.pack_into(">I", buf, batch.CRC, batch.compute_crc(buf, 0, len(buf)))
    with pytest.raises(InvalidBatchError, match="runs past"):
        decode_batch(buf)


def test_null_header_key_is_rejected() -> None:
    # record: attrs, ts delta 0, offset delta 0, key null, value null, 1 header with null key
    fields = b"\x00\x00\x00\x01\x01\x02\x01\x01"
    body = bytes([len(fields) * 2]) + fields
    header = struct.pack(">qiibIhiqqqhii", 0, 49 + len(body), -1, 2, 0, 0, 0, 0, 0, -1, -1, -1, 1)
    buf = bytearray(header + body)
    struct.pack_into(">I", buf, batch.CRC, batch.compute_crc(buf, 0, len(buf)))
    with pytest.raises(InvalidBatchError, match="negative header key size"):
        decode_batch(buf)


def test_garbage_compressed_payload() -> None:
    buf = bytearray(encode_batch(SPECS))
    set_attributes_and_recrc(buf, CompressionType.ZSTD)  # an uncompressed payload claimed as zstd
    with pytest.raises(InvalidBatchError) as caught:
        decode_batch(buf)
    assert caught.value.corrupt
    assert isinstance(caught.value.__cause__, CompressionError)


def test_unknown_codec_in_batch() -> None:
    buf = bytearray(encode_batch(SPECS))
    set_attributes_and_recrc(buf, 5)
    with pytest.raises(InvalidBatchError, match="unknown compression codec 5") as caught:
        decode_batch(buf)
    assert not caught.value.corrupt


def test_bad_magic() -> None:
    buf = bytearray(encode_batch(SPECS))
    buf[batch.MAGIC] = 1
    with pytest.raises(InvalidBatchError, match="magic"):
        decode_batches(buf)


def test_encode_rejects_empty_batches_and_unknown_codecs() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch([])
    with pytest.raises(CompressionError):
        encode_batch(SPECS, compression=6)


# ---------------------------------------------------------------- recompression


@pytest.mark.parametrize("source", ALL_CODECS)
@pytest.mark.parametrize("target", ALL_CODECS)
def test_recompress_keeps_everything_but_the_codec(source: int, target: int) -> None:
    kwargs = dict(
        producer_id=99,
        producer_epoch=4,
        base_sequence=1000,
        partition_leader_epoch=8,
        is_transactional=True,
    )
    record_set = encode_batch(SPECS, base_offset=100, compression=source, **kwargs) + encode_batch(
        SPECS[:3], base_offset=106, compression=source, timestamp_type=TimestampType.LOG_APPEND_TIME
    )
    recompressed = recompress_batches(record_set, target)
    before = decode_batches(record_set)
    after = decode_batches(recompressed)
    assert len(after) == 2
    for old, new in zip(before, after, strict=True):
        assert new.records == old.records
        assert is_crc_valid(recompressed, new.header)
        assert new.header.compression == target
        assert new.header.attributes & ~0x07 == old.header.attributes & ~0x07
        for field in (
            "base_offset",
            "partition_leader_epoch",
            "last_offset_delta",
            "base_timestamp",
            "max_timestamp",
            "producer_id",
            "producer_epoch",
            "base_sequence",
            "records_count",
        ):
            assert getattr(new.header, field) == getattr(old.header, field), field
    if source == target:
        assert recompressed == record_set


def test_recompress_same_codec_is_byte_identical_even_with_bad_crc() -> None:
    # Batches in the target codec are not even opened.
    buf = bytearray(encode_batch(SPECS, compression=CompressionType.GZIP))
    buf[-1] ^= 1
    assert recompress_batches(buf, CompressionType.GZIP) == bytes(buf)


def test_recompress_keeps_uncompressed_control_batches() -> None:
    control = build_control_batch(
        ControlRecordType.ABORT, producer_id=3, producer_epoch=1, coordinator_epoch=2, base_offset=7
    )
    data = encode_batch(SPECS, base_offset=0)
    recompressed = recompress_batches(data + control, CompressionType.ZSTD)
    headers = list(iter_headers(recompressed))
    assert [h.compression for h in headers] == [CompressionType.ZSTD, CompressionType.NONE]
    assert recompressed.endswith(control)


def test_recompress_keeps_offset_gaps() -> None:
    # A compacted batch: offset deltas 0, 2, 5 and lastOffsetDelta 5 with 3 records.
    records = bytearray()
    for delta in (0, 2, 5):
        # record: attrs, ts delta, offset delta, key "k", value null, no headers
        fields = bytes([0, 0, delta * 2, 2]) + b"k" + b"\x01\x00"
        records += bytes([len(fields) * 2]) + fields
    header = struct.pack(">qiibIhiqqqhii", 50, 49 + len(records), -1, 2, 0, 0, 5, 10, 10, -1, -1, -1, 3)
    buf = bytearray(header) + records
    struct.pack_into(">I", buf, batch.CRC, batch.compute_crc(buf, 0, len(buf)))
    recompressed = recompress_batches(buf, CompressionType.LZ4)
    decoded = decode_batch(recompressed)
    assert [r.offset for r in decoded.records] == [50, 52, 55]
    assert decoded.header.last_offset == 55
    assert decoded.header.records_count == 3


def test_recompress_rejects_corrupt_source() -> None:
    buf = bytearray(encode_batch(SPECS))
    buf[-1] ^= 1
    with pytest.raises(InvalidBatchError, match="CRC"):
        recompress_batches(buf, CompressionType.SNAPPY)
    with pytest.raises(InvalidBatchError, match="truncated"):
        recompress_batches(encode_batch(SPECS)[:-2], CompressionType.SNAPPY)


def test_recompress_garbage_payload() -> None:
    buf = bytearray(batch_with_payload(b"not gzip at all", CompressionType.GZIP))
    with pytest.raises(InvalidBatchError) as caught:
        recompress_batches(buf, CompressionType.NONE)
    assert caught.value.corrupt


def test_recompress_unknown_target() -> None:
    with pytest.raises(CompressionError):
        recompress_batches(encode_batch(SPECS), 9)


def test_recompress_level() -> None:
    specs = [RecordSpec(None, b"abcdefgh" * 2000, timestamp=0)]
    fast = recompress_batches(encode_batch(specs), CompressionType.GZIP, level=1)
    best = recompress_batches(encode_batch(specs), CompressionType.GZIP, level=9)
    assert decode_batch(fast).records == decode_batch(best).records
    assert len(best) <= len(fast)


def batch_with_payload(payload: bytes, codec: int) -> bytes:
    header = struct.pack(">qiibIhiqqqhii", 0, 49 + len(payload), -1, 2, 0, codec, 0, 0, 0, -1, -1, -1, 1)
    buf = bytearray(header) + payload
    struct.pack_into(">I", buf, batch.CRC, batch.compute_crc(buf, 0, len(buf)))
    return bytes(buf)


def test_batch_with_payload_helper_round_trips() -> None:
    # Guards the helper above: a real compressed record body through it decodes.
    fields = b"\x00\x00\x00\x02k\x02v\x00"
    body = bytes([len(fields) * 2]) + fields
    decoded = decode_batch(batch_with_payload(compress(CompressionType.GZIP, body), CompressionType.GZIP))
    assert decoded.records == [Record(0, 0, b"k", b"v", ())]


def test_decoded_records_are_ordinary_frozen_records() -> None:
    record = decode_batch(encode_batch(SPECS[:1])).records[0]
    same = Record(0, 1_700_000_000_000, b"key-0", b"value-0", ())
    assert record == same and hash(record) == hash(same)
    assert repr(record) == repr(same)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.key = b"other"
