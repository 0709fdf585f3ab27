"""A follower's truncated leader-epoch cache reaches disk before its next append: a crash right
after it must not bring back an epoch the truncation removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from strom.storage import LogConfig, UnifiedLog
from strom.storage.checkpoint import LEADER_EPOCH_CHECKPOINT, LeaderEpochCheckpointFile
from unit.storage.test_storage_follower import leader_batch


def test_a_truncated_epoch_cache_survives_a_crash_after_an_append(tmp_path: Path) -> None:
    # The follower holds a deposed leader's epoch-3 suffix at 10..19 that the new leader (still in
    # epoch 1 there) never had: truncation removes it, the leader's epoch-1 records 10..29 follow.
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    log.append_as_follower(leader_batch(0, 10, 1))
    log.append_as_follower(leader_batch(10, 10, 3))
    assert log.leader_epoch_cache.entries == [(1, 0), (3, 10)]
    assert log.truncate_to(10)
    log.append_as_follower(leader_batch(10, 20, 1))
    # Killed here: no close, no checkpoint job; the log dir was not shut down cleanly.
    checkpoint = LeaderEpochCheckpointFile(log.dir / LEADER_EPOCH_CHECKPOINT)
    assert checkpoint.read() == [(1, 0)]
    reopened = UnifiedLog.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=False)
    assert reopened.log_end_offset == 30
    assert reopened.leader_epoch_cache.entries == [(1, 0)]
    # OffsetForLeaderEpoch: epoch 1 runs to the log end, epoch 3 is unknown here. A stale
    # (3, 10) would answer (1, 10) and (3, 30): a replica with a divergent epoch-3 suffix up to
    # 30 would keep it.
    assert reopened.end_offset_for_epoch(1) == (1, 30)
    assert reopened.end_offset_for_epoch(3) == (-1, -1)
    reopened.close()
    log.close()


def test_a_full_truncation_is_written_before_the_next_append(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    log.append_as_follower(leader_batch(0, 5, 2))
    log.truncate_fully_and_start_at(100)
    # Batches without a leader epoch (as a pre-KIP-101 leader stored them) record none.
    log.append_as_follower(leader_batch(100, 5, -1))
    assert LeaderEpochCheckpointFile(log.dir / LEADER_EPOCH_CHECKPOINT).read() == []
    reopened = UnifiedLog.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=False)
    assert reopened.leader_epoch_cache.entries == []
    assert reopened.end_offset_for_epoch(2) == (-1, -1)
    reopened.close()
    log.close()


def test_a_new_epoch_from_an_append_is_written_by_the_flush_before_the_recovery_point_passes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 18: after a failover every follower partition meets its leader's new epoch at once;
    # an fsync of its checkpoint on the way (file and directory) was most of a failover's time.
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    checkpoint = LeaderEpochCheckpointFile(log.dir / LEADER_EPOCH_CHECKPOINT)
    log.append_as_follower(leader_batch(0, 10, 1))
    log.flush()
    assert checkpoint.read() == [(1, 0)] and log.recovery_point == 10
    monkeypatch.setattr(os, "fsync", recording_fsync)
    log.append_as_follower(leader_batch(10, 10, 3))
    assert synced == []  # recorded in memory only
    assert log.leader_epoch_cache.entries == [(1, 0), (3, 10)] and checkpoint.read() == [(1, 0)]
    log.flush()
    # The checkpoint is written and synced before the segment, so the recovery point (20) never
    # passes a batch whose epoch a crash could lose.
    assert checkpoint.read() == [(1, 0), (3, 10)]
    assert synced[0].endswith(LEADER_EPOCH_CHECKPOINT + ".tmp"), synced
    assert any(path.endswith(".log") for path in synced[1:]), synced
    assert log.recovery_point == 20
    log.close()


def test_an_epoch_not_yet_written_when_killed_is_assigned_again_by_recovery(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    checkpoint = LeaderEpochCheckpointFile(log.dir / LEADER_EPOCH_CHECKPOINT)
    log.append_as_follower(leader_batch(0, 10, 1))
    log.flush()
    log.append_as_follower(leader_batch(10, 10, 3))
    # Killed before the next flush: the checkpoint is as the last flush left it.
    assert checkpoint.read() == [(1, 0)]
    reopened = UnifiedLog.open(tmp_path / "t-0", LogConfig(), recovery_point=10, had_clean_shutdown=False)
    assert reopened.log_end_offset == 20
    assert reopened.leader_epoch_cache.entries == [(1, 0), (3, 10)]
    assert reopened.end_offset_for_epoch(1) == (1, 10)
    reopened.close()
    log.close()
