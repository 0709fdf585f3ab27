"""Segment indexes: written with pwrite (no memory map), lazy for inactive segments, and
repaired from the log when a file fails Kafka's sanity check."""

from __future__ import annotations

import logging
import os
import random
import struct
from pathlib import Path

import pytest

from strom.storage import CLEAN_SHUTDOWN_FILE, LogConfig, UnifiedLog
from strom.storage.index import CorruptIndexError, OffsetIndex, TimeIndex
from strom.storage.local_log import MAX_LOADED_INACTIVE_INDEXES
from unit.storage.storage_batches import batch_offsets, make_batch

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def fill(log: UnifiedLog, batches: int) -> None:
    for _ in range(batches):
        log.append_as_leader(make_batch(count=2, value_size=40), 0)


def closed_cleanly(tmp_path: Path, batches: int = 40) -> tuple[Path, int]:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    fill(log, batches)
    end = log.log_end_offset
    log.close()
    (tmp_path / CLEAN_SHUTDOWN_FILE).touch()
    return dir, end


def read_all(log: UnifiedLog) -> list[tuple[int, int]]:
    offset, seen = log.log_start_offset, []
    while offset < log.log_end_offset:
        batches = batch_offsets(log.read(offset, 1 << 20).records)
        seen.extend(batches)
        offset = batches[-1][1] + 1
    return seen


def open_fds_under(dir: Path) -> list[str]:
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(dir)):
            targets.append(target)
    return targets


def mapped_under(dir: Path) -> list[str]:
    with open("/proc/self/maps") as maps:
        return [line for line in maps if str(dir) in line]


def test_index_entries_are_written_to_the_file_not_through_a_map(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.index"
    index = OffsetIndex(path, 100, 1024)
    index.create()
    index.append(105, 0)
    index.append(110, 300)
    assert not mapped_under(tmp_path)
    # The file holds exactly the entries (nothing preallocated, no sparse tail to fault on).
    assert path.read_bytes() == struct.pack(">iiii", 5, 0, 10, 300)
    index.close()
    reopened = OffsetIndex(path, 100, 1024)
    assert reopened.lookup(109) == (105, 0) and reopened.lookup(200) == (110, 300)
    reopened.truncate_to(110)
    assert path.stat().st_size == 8
    reopened.close()


def test_index_respects_its_maximum_size(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "00000000000000000000.index", 0, 20)  # rounded down: 2 entries
    index.create()
    index.append(1, 10)
    index.append(2, 20)
    assert index.is_full
    time_index = TimeIndex(tmp_path / "00000000000000000000.timeindex", 0, 36)
    time_index.create()
    time_index.maybe_append(1000, 1)
    time_index.maybe_append(2000, 2)
    assert time_index.is_full  # the last of 3 slots stays for the entry written at roll
    index.close()
    time_index.close()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda size: random.Random(7).randbytes(size), id="random-bytes"),
        pytest.param(lambda size: random.Random(8).randbytes(size + 3), id="not-whole-entries"),
        # Increasing offsets but a negative position: seeking there gave [Errno 22] before.
        pytest.param(lambda size: struct.pack(">ii", 1, -4096), id="negative-position"),
        pytest.param(lambda size: struct.pack(">iiii", 4, 100, 2, 200), id="decreasing-offsets"),
        pytest.param(lambda size: struct.pack(">ii", 1, 1 << 30), id="position-past-the-end"),
        pytest.param(lambda size: struct.pack(">ii", -5, 0), id="offset-below-base"),
    ],
)
def test_damaged_offset_index_after_clean_shutdown_is_rebuilt(
    tmp_path: Path, damage: object, caplog: pytest.LogCaptureFixture
) -> None:
    dir, end = closed_cleanly(tmp_path)
    indexes = sorted(dir.glob("*.index"))
    assert len(indexes) >= 3
    victim = indexes[1]
    assert callable(damage)
    victim.write_bytes(damage(victim.stat().st_size))
    with caplog.at_level(logging.WARNING, logger="strom.storage"):
        reopened = UnifiedLog.open(dir, CONFIG)
        assert reopened.log_end_offset == end
        assert read_all(reopened) == [(i * 2, i * 2 + 1) for i in range(end // 2)]
    rebuilt = [r for r in caplog.records if "rebuilding its indexes" in r.getMessage()]
    assert len(rebuilt) == 1 and victim.name[:20] in rebuilt[0].getMessage()
    # The repaired file is sane on disk too.
    segment = next(s for s in reopened.segments if s.log_path.name[:20] == victim.name[:20])
    segment.offset_index.sanity_check(segment.size)
    reopened.close()


def test_garbage_time_index_after_clean_shutdown_is_rebuilt(tmp_path: Path) -> None:
    dir, end = closed_cleanly(tmp_path)
    victim = sorted(dir.glob("*.timeindex"))[0]
    victim.write_bytes(random.Random(3).randbytes(36))
    reopened = UnifiedLog.open(dir, CONFIG)
    assert reopened.log_end_offset == end
    assert reopened.segments[0].time_index.entries > 0
    assert reopened.fetch_offset_by_timestamp(0) is not None
    reopened.close()


def test_zeroed_index_is_rebuilt(tmp_path: Path) -> None:
    dir, end = closed_cleanly(tmp_path)
    victim = sorted(dir.glob("*.index"))[0]
    victim.write_bytes(bytes(victim.stat().st_size))
    reopened = UnifiedLog.open(dir, CONFIG)
    assert read_all(reopened)[-1] == (end - 2, end - 1)
    reopened.close()


def test_sanity_check_rejects_a_torn_index(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    path.write_bytes(struct.pack(">ii", 1, 0) + b"\x00\x01\x02")
    with pytest.raises(CorruptIndexError):
        OffsetIndex(path, 0, 1024).sanity_check(1000)


def test_inactive_segments_hold_no_descriptor_until_read(tmp_path: Path) -> None:
    dir, end = closed_cleanly(tmp_path, batches=120)
    reopened = UnifiedLog.open(dir, CONFIG)
    segments = reopened.num_segments
    assert segments >= 10
    fds = open_fds_under(dir)
    # At most the active segment's files are open; inactive segments hold nothing.
    assert sum(f.endswith(".log") for f in fds) <= 1
    assert sum(f.endswith((".index", ".timeindex")) for f in fds) <= 2
    assert not mapped_under(dir)
    # Reading every segment reopens its log file; the log keeps only the last few read open.
    assert read_all(reopened)[-1] == (end - 2, end - 1)
    fds = open_fds_under(dir)
    assert sum(f.endswith(".log") for f in fds) <= MAX_LOADED_INACTIVE_INDEXES + 1
    assert sum(f.endswith((".index", ".timeindex")) for f in fds) <= 2
    # Appends that roll segments release the rolled ones' descriptors once flushed.
    fill(reopened, 60)
    reopened.flush()
    assert sum(f.endswith((".index", ".timeindex")) for f in open_fds_under(dir)) <= 2
    reopened.close()
    assert not open_fds_under(dir)


def test_rolled_segment_index_is_trimmed_and_synced(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", CONFIG)
    fill(log, 30)
    log.flush()
    for segment in log.segments[:-1]:
        index = segment.offset_index
        assert index.path.stat().st_size == index.entries * 8
        assert segment.time_index.path.stat().st_size == segment.time_index.entries * 12
    log.close()


def damage_a_middle_entry(index_path: Path) -> None:
    """A bad entry between good ends: startup's O(1) check passes, the first use's full check not."""
    data = bytearray(index_path.read_bytes())
    assert len(data) >= 5 * 8
    struct.pack_into(">ii", data, 16, 0x7FFFFFF0, -1)
    index_path.write_bytes(bytes(data))


def test_index_damaged_between_its_ends_is_rebuilt_at_first_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dir, end = closed_cleanly(tmp_path, batches=60)
    indexes = sorted(dir.glob("*.index"))
    damage_a_middle_entry(indexes[1])
    damage_a_middle_entry(indexes[3])
    with caplog.at_level(logging.WARNING, logger="strom.storage"):
        reopened = UnifiedLog.open(dir, CONFIG)
        assert not [r for r in caplog.records if "rebuilding" in r.getMessage()]  # startup: O(1) checks
        assert read_all(reopened) == [(i * 2, i * 2 + 1) for i in range(end // 2)]
        rebuilt = [r.getMessage() for r in caplog.records if "rebuilding its indexes" in r.getMessage()]
        assert len(rebuilt) == 2
        segment = reopened.segments[1]
        segment.offset_index.sanity_check(segment.size)
        # A follower truncation as the first use of a damaged index: rebuilt, then truncated.
        reopened.close()
    damage_a_middle_entry(indexes[3])
    reopened = UnifiedLog.open(dir, CONFIG)
    base = int(indexes[3].name[:20])
    assert reopened.truncate_to(base + 3)
    assert reopened.log_end_offset == base + 2
    assert read_all(reopened)[-1] == (base, base + 1)
    reopened.close()


def test_reads_keep_few_inactive_indexes_in_memory(tmp_path: Path) -> None:
    dir, end = closed_cleanly(tmp_path, batches=400)
    reopened = UnifiedLog.open(dir, CONFIG)
    assert reopened.num_segments > 3 * MAX_LOADED_INACTIVE_INDEXES
    assert read_all(reopened)[-1] == (end - 2, end - 1)
    loaded = [s for s in reopened.segments[:-1] if s._offset_index.loaded]
    assert len(loaded) <= MAX_LOADED_INACTIVE_INDEXES
    reopened.close()


def test_torn_index_write_is_invisible_and_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0, 1024)
    index.create()
    index.append(1, 100)
    real_pwrite = os.pwrite

    def torn(fd: int, data: bytes, offset: int) -> int:
        real_pwrite(fd, data[:4], offset)
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr("strom.storage.index.os.pwrite", torn)
        with pytest.raises(OSError):
            index.append(2, 200)
    assert index.entries == 1 and path.stat().st_size == 12
    index.mark_inactive()  # the roll cuts the torn bytes
    assert path.read_bytes() == struct.pack(">ii", 1, 100)
    index.close()
