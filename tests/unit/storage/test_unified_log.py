"""UnifiedLog over a LocalLog built by hand (no LogLoader): what it adds to the segments is
offsets (validation and assignment, the log start offset), leader epochs and producer state."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.storage import (
    LeaderEpochFileCache,
    LocalLog,
    LogConfig,
    OffsetOutOfRangeError,
    ProducerStateManager,
    UnifiedLog,
)
from strom.storage.local_log import create_segment
from strom.storage.producer_state import snapshot_offsets
from unit.storage.storage_batches import batch_offsets, make_batch

CONFIG = LogConfig(segment_bytes=1 << 20)
NOW = 1_700_000_000_000
PID = 7


def over_local_log(tmp_path: Path, base_offset: int) -> tuple[UnifiedLog, LocalLog]:
    dir = tmp_path / "t-0"
    dir.mkdir()
    local = LocalLog(dir, CONFIG, [create_segment(dir, base_offset, CONFIG, NOW)], base_offset, lambda: NOW)
    log = UnifiedLog(
        local,
        base_offset,
        LeaderEpochFileCache(dir, lambda: local.log_end_offset),
        ProducerStateManager(dir),
    )
    return log, local


def produce(log: UnifiedLog, sequence: int, epoch: int, count: int = 2) -> int:
    batch = make_batch(
        count=count, producer_id=PID, producer_epoch=0, base_sequence=sequence, timestamps=[NOW]
    )
    return log.append_as_leader(batch, epoch).first_offset


def test_leader_appends_continue_the_local_logs_offsets_and_record_epochs(tmp_path: Path) -> None:
    log, local = over_local_log(tmp_path, base_offset=100)
    assert produce(log, 0, epoch=3) == 100
    assert produce(log, 2, epoch=5) == 102
    assert local.log_end_offset == log.log_end_offset == 104
    assert batch_offsets(local.read(100, 1 << 20).records) == [(100, 101), (102, 103)]
    assert log.leader_epoch_cache.entries == [(3, 100), (5, 102)]
    assert log.end_offset_for_epoch(3) == (3, 102)
    # A retried batch is answered from producer state, not appended again.
    duplicate = log.append_as_leader(
        make_batch(count=2, producer_id=PID, producer_epoch=0, base_sequence=2, timestamps=[NOW]), 5
    )
    assert duplicate.duplicate and duplicate.first_offset == 102
    assert local.log_end_offset == 104


def test_reads_below_the_log_start_offset_are_out_of_range(tmp_path: Path) -> None:
    log, local = over_local_log(tmp_path, base_offset=0)
    for sequence in range(0, 8, 2):
        produce(log, sequence, epoch=1)
    log.roll()
    produce(log, 8, epoch=1)
    assert log.delete_records(5) == 5
    assert [s.base_offset for s in local.segments] == [0, 8]  # 0-7 still holds offsets 5-7
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, 1000)
    assert batch_offsets(log.read(5, 1000).records) == [(4, 5), (6, 7)]
    # LocalLog knows nothing of the log start offset: it reads what its segments hold.
    assert batch_offsets(local.read(0, 1000).records)[0] == (0, 1)
    assert log.delete_records(8) == 8
    assert [s.base_offset for s in local.segments] == [8]


def test_roll_snapshots_producer_state_where_the_local_log_rolls(tmp_path: Path) -> None:
    log, local = over_local_log(tmp_path, base_offset=0)
    produce(log, 0, epoch=1)
    local.roll()  # the segments alone: no snapshot
    assert snapshot_offsets(local.dir) == []
    produce(log, 2, epoch=1)
    log.roll()
    assert snapshot_offsets(local.dir) == [4]
    assert [s.base_offset for s in local.segments] == [0, 2, 4]


def test_truncation_takes_epochs_and_producer_state_back_with_the_segments(tmp_path: Path) -> None:
    log, local = over_local_log(tmp_path, base_offset=0)
    produce(log, 0, epoch=1)
    log.roll()
    produce(log, 2, epoch=2)
    produce(log, 4, epoch=2)
    assert log.truncate_to(2)
    assert local.log_end_offset == 2 and local.num_segments == 2
    assert log.leader_epoch_cache.entries == [(1, 0)]
    entry = log.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == 1
    # The producer's next sequence after the truncation is 2 again.
    assert produce(log, 2, epoch=3) == 2
