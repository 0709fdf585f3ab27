"""The LogValidator on its own: every record walked, Kafka's codes, bounds, the worker-thread rule."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from strom.records import scanner
from strom.records.batch import CONTROL_FLAG, TIMESTAMP_TYPE_MASK, CompressionType, read_header
from strom.records.codec import RecordSpec, decode_batches, encode_batch
from strom.storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
)
from strom.storage.log_config import LogConfig
from strom.storage.log_validator import WORKER_THRESHOLD_BYTES, DecompressionBudget, analyze, needs_worker
from strom.storage.unified_log import UnifiedLog

NOW = 1_700_000_000_000
HOUR = 3_600_000


def specs(count: int, key: bytes | None = b"k", timestamp: int = NOW) -> list[RecordSpec]:
    return [RecordSpec(key, b"value-%d" % i, timestamp=timestamp + i) for i in range(count)]


def with_records(
    payload: bytes, count: int, *, codec: int = 0, max_timestamp: int = NOW, attributes: int = 0
) -> bytes:
    return bytes(
        scanner.assemble_batch(
            payload,
            attributes=codec | attributes,
            base_offset=0,
            partition_leader_epoch=-1,
            last_offset_delta=count - 1,
            base_timestamp=NOW,
            max_timestamp=max_timestamp,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            records_count=count,
        )
    )


def payload_of(batch: bytes) -> bytes:
    return batch[61:]


def test_a_well_formed_record_set_passes_with_its_records_max_timestamps() -> None:
    records = encode_batch(specs(3)) + encode_batch(
        specs(2, timestamp=NOW + 50), compression=CompressionType.GZIP
    )
    validated = analyze(records, LogConfig(), NOW, "t-0")
    assert [h.records_count for h in validated.headers] == [3, 2]
    assert validated.max_timestamps == [NOW + 2, NOW + 51]
    assert validated.records is records


def test_malformed_records_in_a_crc_valid_batch_are_invalid_record() -> None:
    good = payload_of(encode_batch(specs(3)))
    with pytest.raises(InvalidRecordError, match="bytes left after the batch's 2 declared records"):
        analyze(with_records(good, 2), LogConfig(), NOW, "t-0")
    with pytest.raises(InvalidRecordError, match="record 3 at byte"):
        analyze(with_records(good, 4), LogConfig(), NOW, "t-0")


def test_malformed_records_inside_a_compressed_payload_are_found_too() -> None:
    broken = payload_of(encode_batch(specs(2)))[:-1] + b"\x05"  # the last record's header count lies
    with pytest.raises(InvalidRecordError, match="record 1"):
        analyze(with_records(broken, 2, codec=CompressionType.ZSTD), LogConfig(), NOW, "t-0")


def test_a_payload_that_does_not_decompress_is_corrupt() -> None:
    batch = bytearray(with_records(b"\x00" * 30, 2))
    struct.pack_into(">h", batch, 21, CompressionType.LZ4)
    scanner.write_crc(batch)
    with pytest.raises(CorruptRecordError):
        analyze(bytes(batch), LogConfig(), NOW, "t-0")


def test_decompression_is_bounded_by_record_count_and_max_message_bytes() -> None:
    payload = payload_of(encode_batch([RecordSpec(b"k", bytes(5000), timestamp=NOW)]))
    batch = with_records(payload, 1, codec=CompressionType.ZSTD)
    analyze(batch, LogConfig(max_message_bytes=6000), NOW, "t-0")
    with pytest.raises(CorruptRecordError, match="limit"):
        analyze(batch, LogConfig(max_message_bytes=4000), NOW, "t-0")


def test_record_timestamps_are_checked_one_by_one() -> None:
    # The header's timestamps are in range; the second record is two hours ahead.
    payload = payload_of(
        encode_batch(
            [RecordSpec(b"k", b"a", timestamp=NOW), RecordSpec(b"k", b"b", timestamp=NOW + 2 * HOUR)]
        )
    )
    batch = with_records(payload, 2)
    with pytest.raises(InvalidTimestampError) as caught:
        analyze(batch, LogConfig(), NOW, "t-0")
    assert [i for i, _ in caught.value.record_errors] == [1]
    analyze(batch, LogConfig(message_timestamp_type="LogAppendTime"), NOW, "t-0")


def test_producers_may_not_set_log_append_time_or_write_control_batches() -> None:
    payload = payload_of(encode_batch(specs(1)))
    with pytest.raises(InvalidTimestampError):
        analyze(with_records(payload, 1, attributes=TIMESTAMP_TYPE_MASK), LogConfig(), NOW, "t-0")
    with pytest.raises(InvalidRecordError, match="control"):
        analyze(with_records(payload, 1, attributes=CONTROL_FLAG), LogConfig(), NOW, "t-0")


def test_keyless_records_on_compacted_topics() -> None:
    batch = encode_batch([*specs(1), *specs(2, key=None)])
    analyze(batch, LogConfig(), NOW, "t-0")
    with pytest.raises(InvalidRecordError) as caught:
        analyze(batch, LogConfig(cleanup_policy="compact"), NOW, "t-0")
    assert [i for i, _ in caught.value.record_errors] == [1, 2]


def test_recompression_reuses_the_validated_payload() -> None:
    records = encode_batch(specs(4), compression=CompressionType.GZIP) + encode_batch(specs(2))
    validated = analyze(records, LogConfig(compression_type="zstd"), NOW, "t-0")
    assert [h.compression for h in validated.headers] == [CompressionType.ZSTD] * 2
    assert [r.value for b in decode_batches(validated.records) for r in b.records] == [
        r.value for b in decode_batches(records) for r in b.records
    ]


def test_needs_worker() -> None:
    plain = encode_batch(specs(3))
    assert not needs_worker(plain, LogConfig())
    assert needs_worker(encode_batch(specs(3), compression=CompressionType.LZ4), LogConfig())
    assert needs_worker(plain, LogConfig(compression_type="lz4"))
    assert not needs_worker(plain, LogConfig(compression_type="uncompressed"))
    assert needs_worker(b"\x00" * (WORKER_THRESHOLD_BYTES + 1), LogConfig())
    assert not needs_worker(b"garbage", LogConfig())


def test_the_log_stores_the_records_largest_timestamp_as_max_timestamp(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(), time_ms=lambda: NOW)
    batch = bytearray(encode_batch(specs(3)))
    struct.pack_into(">q", batch, 35, NOW - 7)  # a producer's maxTimestamp that lies
    scanner.write_crc(batch)
    log.append_as_leader(batch, 0)
    stored = read_header(log.read(0, 1 << 20).records)
    assert stored.max_timestamp == NOW + 2
    log.close()


def test_a_request_may_inflate_only_so_far_however_its_batches_are_split() -> None:
    big = encode_batch([RecordSpec(b"k", b"\0" * 1000, timestamp=NOW)] * 50, compression=CompressionType.ZSTD)
    budget = DecompressionBudget(limit=120_000)
    analyze(big, LogConfig(max_message_bytes=100_000), NOW, "t-0", budget)  # ~50 KB inflated
    used = budget.used
    assert 50_000 < used < 60_000
    # The next record set of the same request would take it past the bound: MESSAGE_TOO_LARGE.
    with pytest.raises(RecordTooLargeError, match="decompressed"):
        analyze(big + big, LogConfig(max_message_bytes=100_000), NOW, "t-1", budget)
    # Each batch alone is within its own bound, and a fresh request's budget takes it.
    assert len(analyze(big + big, LogConfig(max_message_bytes=100_000), NOW, "t-1").headers) == 2


def test_recompression_goes_batch_by_batch() -> None:
    records = b"".join(
        encode_batch(specs(3), compression=codec)
        for codec in (CompressionType.NONE, CompressionType.ZSTD, CompressionType.GZIP)
    )
    validated = analyze(records, LogConfig(compression_type="gzip"), NOW, "t-0")
    assert [h.compression for h in validated.headers] == [CompressionType.GZIP] * 3
    assert [len(b.records) for b in decode_batches(validated.records)] == [3, 3, 3]
