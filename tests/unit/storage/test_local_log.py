"""LocalLog on its own: a directory of segments appended at offsets set by the caller, read,
rolled, flushed, truncated and deleted, with no producer state and no leader epochs."""

from __future__ import annotations

from pathlib import Path

from strom.records import batch as rb
from strom.storage import LocalLog, LogConfig
from strom.storage.local_log import create_segment
from unit.storage.storage_batches import batch_offsets, make_batch

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=200, file_delete_delay_ms=1000)
NOW = 1_700_000_000_000


def batch_at(base_offset: int, count: int = 2) -> tuple[bytes, list[rb.BatchHeader]]:
    """A whole batch whose offsets start at ``base_offset``, as UnifiedLog hands LocalLog one."""
    data = make_batch(count=count, value_size=40, base_offset=base_offset, timestamps=[NOW])
    return data, [rb.read_header(data, 0)]


def new_local_log(
    tmp_path: Path, base_offset: int = 0, config: LogConfig = CONFIG
) -> tuple[LocalLog, list[int]]:
    dir = tmp_path / "t-0"
    dir.mkdir()
    clock = [NOW]
    local = LocalLog(
        dir, config, [create_segment(dir, base_offset, config, NOW)], base_offset, lambda: clock[0]
    )
    return local, clock


def append(local: LocalLog, batches: int, count: int = 2) -> None:
    for _ in range(batches):
        local.append(*batch_at(local.log_end_offset, count))


def test_appends_at_the_given_offsets_and_reads_whole_batches_back(tmp_path: Path) -> None:
    local, _ = new_local_log(tmp_path, base_offset=100)
    append(local, 3)
    assert local.log_end_offset == 106
    assert batch_offsets(local.read(100, 1 << 20).records) == [(100, 101), (102, 103), (104, 105)]
    # From inside a batch: the whole batch containing the offset.
    assert batch_offsets(local.read(103, 1 << 20).records) == [(102, 103), (104, 105)]
    # Below max_offset (a high watermark) only.
    assert batch_offsets(local.read(100, 1 << 20, max_offset=104).records) == [(100, 101), (102, 103)]
    assert local.read(106, 1 << 20).records == b""
    assert local.read(104, 1 << 20, max_offset=104).records == b""
    # Nothing of producer state or leader epochs is kept beside the segments.
    assert sorted(p.suffix for p in local.dir.iterdir()) == [".index", ".log", ".timeindex"]


def test_roll_starts_a_segment_at_the_log_end_and_reads_cross_segments(tmp_path: Path) -> None:
    local, _ = new_local_log(tmp_path)
    assert local.roll() is local.active_segment  # an empty active segment is kept
    assert local.num_segments == 1
    append(local, 2)
    rolled = local.roll()
    assert rolled.base_offset == 4 and local.num_segments == 2
    assert local.flush_due(NOW)  # a rolled segment awaits its flush
    append(local, 2)
    assert [s.base_offset for s in local.segments] == [0, 4]
    assert sorted(p.name for p in local.dir.glob("*.log")) == [
        "00000000000000000000.log",
        "00000000000000000004.log",
    ]
    assert batch_offsets(local.read(0, 1 << 20).records) == [(0, 1), (2, 3)]
    assert batch_offsets(local.read(4, 1 << 20).records) == [(4, 5), (6, 7)]


def test_flush_advances_the_recovery_point_to_what_it_synced(tmp_path: Path) -> None:
    local, _ = new_local_log(tmp_path)
    append(local, 3)
    assert local.recovery_point == 0 and local.unflushed_messages == 6
    local.flush(up_to=4)
    assert local.recovery_point == 4
    local.flush()
    assert local.recovery_point == 6 and not local.flush_due(NOW)


def test_truncate_to_cuts_at_the_batch_holding_the_offset_and_drops_later_segments(tmp_path: Path) -> None:
    local, _ = new_local_log(tmp_path)
    append(local, 2)
    local.roll()
    append(local, 2)
    local.flush()
    assert local.recovery_point == 8
    assert not local.truncate_to(8)  # at the log end: nothing to remove
    assert local.truncate_to(3)
    assert local.log_end_offset == 2  # the batch 2-3 goes whole
    assert local.num_segments == 1
    assert not (local.dir / "00000000000000000004.log").exists()
    assert local.recovery_point == 2
    append(local, 1)
    assert batch_offsets(local.read(0, 1 << 20).records) == [(0, 1), (2, 3)]


def test_truncate_below_the_first_segment_restarts_the_log_empty_there(tmp_path: Path) -> None:
    local, _ = new_local_log(tmp_path, base_offset=50)
    append(local, 2)
    assert local.truncate_to(10)
    assert [s.base_offset for s in local.segments] == [10]
    assert local.log_end_offset == 10 and local.recovery_point == 10
    assert sorted(p.name for p in local.dir.glob("*.log")) == ["00000000000000000010.log"]
    local.truncate_fully_and_start_at(500)
    assert local.log_end_offset == 500 and local.read(500, 1000).records == b""


def test_deleted_segments_leave_the_log_at_once_and_their_files_after_the_delay(tmp_path: Path) -> None:
    local, clock = new_local_log(tmp_path)
    append(local, 1)
    local.roll()
    append(local, 1)
    local.roll()
    deletable = local.deletable_segments(lambda segment: True, upper_bound=local.log_end_offset)
    assert [s.base_offset for s in deletable] == [0, 2]  # never the empty active segment
    local.delete_segments(deletable[:1])
    assert [s.base_offset for s in local.segments] == [2, 4]
    assert sorted(p.name for p in local.dir.glob("*.deleted"))[0].startswith("00000000000000000000.")
    assert local.delete_pending_files() == 0
    clock[0] += 1000
    assert local.delete_pending_files() == 3  # log, index, time index
    assert not list(local.dir.glob("*.deleted"))


def test_delete_renames_the_directory_away_then_removes_it(tmp_path: Path) -> None:
    local, _ = new_local_log(tmp_path)
    append(local, 1)
    local.delete()
    assert local.closed
    assert list(tmp_path.iterdir()) == []
