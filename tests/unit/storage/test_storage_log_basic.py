from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from strom.records import batch as rb
from strom.storage import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    LogConfig,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnifiedLog,
)
from strom.storage.log_config import LONG_MAX
from unit.storage.storage_batches import batch_offsets, make_batch


def open_log(tmp_path: Path, **config: object) -> UnifiedLog:
    return UnifiedLog.open(tmp_path / "topic-0", LogConfig(**config))  # type: ignore[arg-type]


def test_append_assigns_dense_offsets_and_read_round_trips(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    infos = [log.append_as_leader(make_batch(count=n), leader_epoch=3) for n in (1, 5, 2)]
    assert [(i.first_offset, i.last_offset, i.record_count) for i in infos] == [
        (0, 0, 1),
        (1, 5, 5),
        (6, 7, 2),
    ]
    assert all(i.log_append_time == -1 and not i.duplicate for i in infos)
    assert log.log_end_offset == 8
    data = log.read(0, 1 << 20).records
    assert batch_offsets(data) == [(0, 0), (1, 5), (6, 7)]
    # The partition leader epoch is stamped into every batch.
    assert data[12:16] == (3).to_bytes(4, "big")
    # A read from the middle of a batch starts with that whole batch.
    assert batch_offsets(log.read(3, 1 << 20).records) == [(1, 5), (6, 7)]
    assert log.read(8, 1 << 20).records == b""
    log.close()


def test_read_bounds(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for _ in range(4):
        log.append_as_leader(make_batch(count=2, value_size=100), 0)
    one = len(make_batch(count=2, value_size=100))
    # max_bytes stops at whole batches.
    assert batch_offsets(log.read(0, one * 2 + 10).records) == [(0, 1), (2, 3)]
    # At least one batch even if larger than max_bytes, unless min_one_batch is off.
    assert batch_offsets(log.read(0, 5).records) == [(0, 1)]
    assert log.read(0, 5, min_one_batch=False).records == b""
    # max_offset (the high watermark) excludes batches at or above it.
    assert batch_offsets(log.read(0, 1 << 20, max_offset=4).records) == [(0, 1), (2, 3)]
    assert log.read(4, 1 << 20, max_offset=4).records == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(9, 100)
    with pytest.raises(OffsetOutOfRangeError) as exc:
        log.read(-1, 100)
    assert exc.value.error_code == 1


def test_reads_across_segments_and_index_lookups(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=3000, index_interval_bytes=300)
    for _ in range(40):
        log.append_as_leader(make_batch(count=3, value_size=50), 0)
    assert log.num_segments > 3
    assert log.log_end_offset == 120
    # Every offset can be fetched, from whichever segment holds it.
    for offset in range(120):
        first_base, first_last = batch_offsets(log.read(offset, 200).records)[0]
        assert first_base <= offset <= first_last
    # Consuming sequentially walks through all segments.
    offset, seen = 0, []
    while offset < log.log_end_offset:
        batches = batch_offsets(log.read(offset, 1000).records)
        seen.extend(batches)
        offset = batches[-1][1] + 1
    assert seen == [(i * 3, i * 3 + 2) for i in range(40)]
    assert log.active_segment.offset_index.entries > 0


def test_validation_errors(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_message_bytes=500, message_timestamp_after_max_ms=1000)
    good = make_batch()
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(bytes(corrupt), 0)
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(good[:-3], 0)
    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(bytes(wrong_magic), 0)
    with pytest.raises(RecordTooLargeError) as too_large:
        log.append_as_leader(make_batch(value_size=600), 0)
    assert too_large.value.error_code == 10
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(make_batch(base_offset=5), 0)
    with pytest.raises(InvalidTimestampError) as bad_ts:
        log.append_as_leader(make_batch(timestamps=[2**50]), 0)
    assert bad_ts.value.error_code == 32 and bad_ts.value.record_errors[0][0] == 0
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(b"", 0)
    assert log.log_end_offset == 0
    assert log.size_in_bytes == 0


def test_inconsistent_record_count_is_invalid(tmp_path: Path) -> None:
    import struct

    import crc32c

    log = open_log(tmp_path)
    batch = bytearray(make_batch(count=3))
    struct.pack_into(">i", batch, 57, 2)  # recordsCount 2 but lastOffsetDelta 2
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    with pytest.raises(InvalidRecordError, match="inconsistent"):
        log.append_as_leader(bytes(batch), 0)


def test_timestamp_bounds_can_be_disabled(tmp_path: Path) -> None:
    log = open_log(tmp_path, message_timestamp_after_max_ms=LONG_MAX)
    assert log.append_as_leader(make_batch(timestamps=[2**50]), 0).last_offset == 0


def test_log_append_time_stamping(tmp_path: Path) -> None:
    log = UnifiedLog.open(
        tmp_path / "t-0", LogConfig(message_timestamp_type="LogAppendTime"), time_ms=lambda: 1234567
    )
    info = log.append_as_leader(make_batch(count=2, timestamps=[10, 20]), 0)
    assert info.log_append_time == 1234567
    data = log.read(0, 1000).records
    from strom.records.batch import TimestampType, is_crc_valid, read_header

    header = read_header(data)
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == 1234567
    assert is_crc_valid(data, header)


def test_writable_buffers_are_rewritten_in_place(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(make_batch(), 0)
    buf = bytearray(make_batch())
    log.append_as_leader(memoryview(buf), 7)
    assert int.from_bytes(buf[:8], "big") == 1
    assert batch_offsets(log.read(1, 1000).records) == [(1, 1)]


def _with_max_timestamp(batch: bytes, max_timestamp: int) -> bytes:
    """``batch`` claiming ``max_timestamp`` (CRC kept valid)."""
    out = bytearray(batch)
    struct.pack_into(">q", out, rb.MAX_TIMESTAMP, max_timestamp)
    struct.pack_into(">I", out, rb.CRC, rb.compute_crc(out, 0, len(out)))
    return bytes(out)


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_a_leader_append_of_bytes_writes_what_an_in_place_rewrite_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timestamp_type: str
) -> None:
    """Bytes are appended as rewritten header copies followed by the records where they lie (one
    pwritev, short writes resumed), never changed themselves: the log holds what rewriting a copy
    of them in place writes, CRCs valid, the stale maxTimestamp of the middle batch corrected."""
    now = time.time_ns() // 1_000_000
    stale = _with_max_timestamp(make_batch(count=3, timestamps=[now, now + 5, now + 9]), now)
    records = make_batch(count=2, value_size=300) + stale + make_batch(count=4)
    original = bytes(records)

    def short_pwritev(fd: int, parts: list[memoryview], at: int) -> int:
        return os.pwrite(fd, b"".join(parts)[:7], at)  # at most 7 bytes a call

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    logs = []
    for name, given in (("bytes", records), ("in-place", bytearray(records))):
        log = UnifiedLog.open(
            tmp_path / f"{name}-0", LogConfig(message_timestamp_type=timestamp_type), time_ms=lambda: now + 50
        )
        log.append_as_leader(make_batch(), leader_epoch=2)
        log.append_as_leader(given, leader_epoch=3)
        logs.append(log)
    assert records == original
    written = [log.read(1, 1 << 20).records for log in logs]
    assert written[0] == written[1]
    headers = list(rb.iter_headers(written[0]))
    assert [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in headers] == [
        (1, 2, 3),
        (3, 5, 3),
        (6, 9, 3),
    ]
    assert all(rb.is_crc_valid(written[0], h) for h in headers)
    expected_max = now + 50 if timestamp_type == "LogAppendTime" else now + 9
    assert headers[1].max_timestamp == expected_max
    for log in logs:
        log.close()
