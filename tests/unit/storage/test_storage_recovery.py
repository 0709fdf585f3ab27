from __future__ import annotations

import os
from pathlib import Path

from strom.storage import CLEAN_SHUTDOWN_FILE, LogConfig, UnifiedLog
from unit.storage.storage_batches import batch_offsets, make_batch

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def fill(log: UnifiedLog, batches: int, count: int = 2) -> None:
    for _ in range(batches):
        log.append_as_leader(make_batch(count=count, value_size=40), 0)


def crash(log: UnifiedLog) -> None:
    """Drop the log without flushing, closing or snapshotting: what kill -9 leaves behind."""
    for segment in log.segments:
        segment.close_handles()


def segment_files(dir: Path) -> list[Path]:
    return sorted(dir.glob("*.log"))


def test_recovery_truncates_torn_tail(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    fill(log, 30)
    end = log.log_end_offset
    crash(log)
    last = segment_files(dir)[-1]
    size = last.stat().st_size
    os.truncate(last, size - 7)  # a torn final write
    recovered = UnifiedLog.open(dir, CONFIG)
    assert recovered.log_end_offset == end - 2
    data = recovered.read(0, 1 << 20).records
    # Everything left reads back whole, and appends continue densely.
    assert recovered.append_as_leader(make_batch(), 0).first_offset == end - 2
    assert batch_offsets(recovered.read(end - 2, 1000).records) == [(end - 2, end - 2)]
    assert data


def test_recovery_truncates_at_corrupt_byte_and_drops_later_segments(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    fill(log, 40)
    assert log.num_segments >= 3
    crash(log)
    files = segment_files(dir)
    target = files[1]
    segment_base = int(target.name[:-4])
    with open(target, "r+b") as f:
        f.seek(400)  # inside some batch of the second segment
        byte = f.read(1)
        f.seek(400)
        f.write(bytes([byte[0] ^ 0x55]))
    recovered = UnifiedLog.open(dir, CONFIG)
    assert recovered.num_segments == 2
    leo = recovered.log_end_offset
    assert segment_base < leo < segment_base + 20
    # Every remaining batch is valid; offsets are dense from 0.
    offset, seen = 0, []
    while offset < leo:
        batches = batch_offsets(recovered.read(offset, 1 << 20).records)
        seen.extend(batches)
        offset = batches[-1][1] + 1
    assert seen == [(i * 2, i * 2 + 1) for i in range(leo // 2)]
    assert recovered.append_as_leader(make_batch(), 0).first_offset == leo


def test_clean_shutdown_skips_validation(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    fill(log, 30)
    end = log.log_end_offset
    log.close()
    (tmp_path / CLEAN_SHUTDOWN_FILE).touch()
    # A flipped payload byte goes unnoticed when nothing needs recovery (Kafka trusts a clean shutdown).
    first = segment_files(dir)[0]
    with open(first, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x01]))
    reopened = UnifiedLog.open(dir, CONFIG)
    assert reopened.log_end_offset == end
    assert reopened.recovery_point == end
    # Indexes were trimmed on close and are loaded, not rebuilt.
    index = reopened.segments[0].offset_index
    assert index.path.stat().st_size == index.entries * 8 and index.entries > 0
    reopened.close()


def test_recovery_point_limits_recovery_to_unflushed_segments(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    fill(log, 40)
    log.flush()
    flushed = log.recovery_point
    fill(log, 3)
    crash(log)
    # Corrupting an old (flushed) segment's payload is not detected: it is below the recovery point.
    first = segment_files(dir)[0]
    with open(first, "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    recovered = UnifiedLog.open(dir, CONFIG, recovery_point=flushed)
    assert recovered.log_end_offset == 86


def test_untrimmed_index_after_crash_is_rebuilt(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    fill(log, 10)
    crash(log)
    # Strom grows an index by pwrite; Kafka (and earlier Strom) preallocate the active one, and a
    # crash leaves it that long, ending in zero entries.
    index = sorted(dir.glob("*.index"))[-1]
    os.truncate(index, CONFIG.segment_index_bytes)
    recovered = UnifiedLog.open(dir, CONFIG)
    for offset in range(recovered.log_end_offset):
        base, last = batch_offsets(recovered.read(offset, 100).records)[0]
        assert base <= offset <= last


def test_stray_files_are_cleaned_up(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    fill(log, 5)
    log.close()
    (dir / "00000000000000000000.log.deleted").write_bytes(b"x")
    (dir / "00000000000000000000.log.cleaned").write_bytes(b"x")
    (dir / "00000000000000000077.index").write_bytes(b"")
    (dir / "00000000000000000000.index.swap").write_bytes(b"")
    reopened = UnifiedLog.open(dir, CONFIG)
    names = {p.name for p in dir.iterdir()}
    assert not any(n.endswith((".deleted", ".cleaned", ".swap")) for n in names)
    assert "00000000000000000077.index" not in names
    assert reopened.log_end_offset == 10


def test_swap_file_replaces_the_segments_it_covers(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    fill(log, 30)
    first = log.segments[0]
    second_base = log.segments[1].base_offset
    end = log.log_end_offset
    log.close()
    # A swap holding the first segment's batches (as a cleaner would leave it) replaces that segment.
    (dir / (first.log_path.name + ".swap")).write_bytes(first.log_path.read_bytes())
    reopened = UnifiedLog.open(dir, CONFIG)
    assert reopened.segments[0].base_offset == 0 and reopened.segments[1].base_offset == second_base
    assert reopened.log_end_offset == end
    assert not list(dir.glob("*.swap")) and not list(dir.glob("*.deleted"))
    # The swapped-in segment got fresh indexes.
    assert reopened.segments[0].offset_index.entries > 0
    assert batch_offsets(reopened.read(5, 100).records) == [(4, 5)]


def test_missing_index_files_are_rebuilt(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    fill(log, 30)
    log.close()
    (tmp_path / CLEAN_SHUTDOWN_FILE).touch()
    for index in dir.glob("*.index"):
        index.unlink()
    reopened = UnifiedLog.open(dir, CONFIG)
    assert all(s.offset_index.entries > 0 for s in reopened.segments[:-1])
    assert reopened.log_end_offset == 60
