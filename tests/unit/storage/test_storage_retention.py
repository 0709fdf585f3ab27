from __future__ import annotations

import time
from pathlib import Path

import pytest

from strom.storage import LogConfig, LogManager, OffsetOutOfRangeError, UnifiedLog
from unit.storage.storage_batches import batch_offsets, make_batch


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_roll_by_size(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1000))
    batch = make_batch(value_size=200)
    for _ in range(12):
        log.append_as_leader(batch, 0)
    assert all(s.size <= 1000 for s in log.segments)
    per_segment = 1000 // len(batch)
    assert log.num_segments == -(-12 // per_segment)
    bases = [s.base_offset for s in log.segments]
    assert bases == sorted(bases) and bases[0] == 0
    # Each rolled segment's files are named by their base offset.
    assert (log.dir / f"{bases[1]:020d}.log").exists()
    assert (log.dir / f"{bases[1]:020d}.snapshot").exists()


def test_roll_by_time(tmp_path: Path) -> None:
    clock = Clock(1_000_000)
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_ms=1000), time_ms=clock)
    log.append_as_leader(make_batch(timestamps=[clock.now]), 0)
    log.append_as_leader(make_batch(timestamps=[clock.now + 500]), 0)
    assert log.num_segments == 1
    # segment.ms counts from the first batch's timestamp to the incoming batch's.
    clock.now += 1500
    log.append_as_leader(make_batch(timestamps=[clock.now]), 0)
    assert log.num_segments == 2 and log.active_segment.base_offset == 2


def test_roll_when_index_is_full(tmp_path: Path) -> None:
    # Room for 3 offset-index entries; an entry is added for nearly every batch.
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_index_bytes=24, index_interval_bytes=1))
    for _ in range(10):
        log.append_as_leader(make_batch(), 0)
    assert log.num_segments > 1
    assert all(s.offset_index.entries <= 3 for s in log.segments)
    assert batch_offsets(log.read(0, 1 << 20).records)[0] == (0, 0)


def test_delete_records_moves_log_start_and_deletes_segments(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=600))
    for _ in range(20):
        log.append_as_leader(make_batch(count=2, value_size=100), 0)
    segments_before = log.num_segments
    assert log.delete_records(15) == 15
    assert log.log_start_offset == 15
    assert log.num_segments < segments_before
    assert log.segments[0].base_offset <= 15
    with pytest.raises(OffsetOutOfRangeError):
        log.read(14, 100)
    # The batch holding offset 15 is served whole.
    assert batch_offsets(log.read(15, 100).records) == [(14, 15)]
    assert log.fetch_offset_by_timestamp(-2) is not None
    assert log.fetch_offset_by_timestamp(-2).offset == 15  # type: ignore[union-attr]
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(41)
    # Deleting everything up to the log end keeps the (non-empty) active segment.
    assert log.delete_records(40) == 40
    assert log.log_end_offset == 40 and log.num_segments >= 1
    assert log.read(40, 100).records == b""


def test_time_retention(tmp_path: Path) -> None:
    clock = Clock(10_000_000)
    config = LogConfig(segment_bytes=600, retention_ms=5000)
    log = UnifiedLog.open(tmp_path / "t-0", config, time_ms=clock)
    for i in range(10):
        log.append_as_leader(make_batch(count=2, value_size=100, timestamps=[clock.now - 10_000 + i]), 0)
    for _ in range(4):
        log.append_as_leader(make_batch(count=2, value_size=100, timestamps=[clock.now]), 0)
    deleted = log.delete_retention_segments()
    assert deleted > 0
    assert all(s.max_timestamp_so_far >= clock.now - 5000 for s in log.segments)
    assert log.log_start_offset == log.segments[0].base_offset > 0
    # Once everything expires, the active segment goes too, after rolling an empty one.
    clock.now += 60_000
    log.delete_retention_segments()
    assert log.num_segments == 1 and log.active_segment.size == 0
    assert log.log_start_offset == log.log_end_offset == 28
    assert log.append_as_leader(make_batch(timestamps=[clock.now]), 0).first_offset == 28


def test_size_retention(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=600, retention_bytes=1500))
    for _ in range(20):
        log.append_as_leader(make_batch(count=2, value_size=100), 0)
    log.delete_retention_segments()
    assert log.size_in_bytes <= 1500 + 600
    assert log.size_in_bytes > 1500 - 600
    assert log.log_start_offset == log.segments[0].base_offset


def test_retention_and_log_start_survive_restart(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=600, retention_bytes=1500)
    manager = LogManager([tmp_path])
    manager.startup(lambda topic: config)
    log = manager.get_or_create_log("t", 0, config)
    for _ in range(20):
        log.append_as_leader(make_batch(count=2, value_size=100), 0)
    assert manager.cleanup_logs() > 0
    start = log.log_start_offset
    log.delete_records(start + 1)
    manager.shutdown()
    again = LogManager([tmp_path])
    again.startup(lambda topic: config)
    reloaded = again.get_log("t", 0)
    assert reloaded is not None and reloaded.log_start_offset == start + 1
    assert reloaded.log_end_offset == 40


def test_truncate_to(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=600))
    for epoch in range(10):
        log.append_as_leader(make_batch(count=2, value_size=100), epoch)
    assert log.truncate_to(9)  # mid-batch: the whole batch holding 9 goes
    assert log.log_end_offset == 8
    assert log.leader_epoch_cache.latest_epoch == 3
    assert log.append_as_leader(make_batch(), 4).first_offset == 8
    assert batch_offsets(log.read(8, 1 << 20).records) == [(8, 8)]


def test_deleted_segments_are_renamed_at_once_and_unlinked_after_file_delete_delay_ms(tmp_path: Path) -> None:
    clock = Clock(time.time_ns() // 1_000_000)  # the batches carry the real time
    log = UnifiedLog.open(
        tmp_path / "t-0", LogConfig(segment_bytes=600, file_delete_delay_ms=60_000), time_ms=clock
    )
    for _ in range(20):
        log.append_as_leader(make_batch(count=2, value_size=100), 0)
    first_base = log.segments[0].base_offset
    log.delete_records(log.segments[2].base_offset)
    # Out of the log at once, renamed: a crash here leaves files that startup removes.
    assert not (log.dir / f"{first_base:020d}.log").exists()
    renamed = sorted(p.name for p in log.dir.glob("*.deleted"))
    assert f"{first_base:020d}.log.deleted" in renamed
    clock.now += 59_999
    assert log.delete_pending_files() == 0
    clock.now += 1
    assert log.delete_pending_files() == len(renamed) > 0
    assert not list(log.dir.glob("*.deleted"))
    assert log.delete_pending_files() == 0
    log.close()


def test_startup_removes_renamed_files_a_crash_left_behind(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=600))
    for _ in range(20):
        log.append_as_leader(make_batch(count=2, value_size=100), 0)
    log.delete_records(log.segments[2].base_offset)
    assert list(log.dir.glob("*.deleted"))
    log.close()
    reopened = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=600))
    assert not list(reopened.dir.glob("*.deleted"))
    assert reopened.log_start_offset == log.log_start_offset
    reopened.close()
