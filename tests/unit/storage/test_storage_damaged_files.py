"""Damaged or contended files in a log dir: the lock, garbage checkpoints, a lost leader epoch file."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.storage import KafkaStorageError, LogConfig, LogDirInUseError, LogManager, UnifiedLog
from strom.storage.checkpoint import LeaderEpochCheckpointFile, OffsetCheckpointFile, PartitionMetadataFile
from strom.storage.leader_epoch_cache import LeaderEpochFileCache
from unit.storage.storage_batches import make_batch

GARBAGE = b"\xff\xfe\x00\x80not a checkpoint\n\x81"


def test_a_second_log_manager_cannot_lock_a_locked_dir_and_creates_nothing(tmp_path: Path) -> None:
    first = LogManager([tmp_path / "a", tmp_path / "b"])
    first.lock_log_dirs()
    other = tmp_path / "c"
    second = LogManager([other, tmp_path / "b"])
    with pytest.raises(LogDirInUseError, match="in use by another process"):
        second.lock_log_dirs()
    # The dir it did lock before failing is released again.
    third = LogManager([other])
    third.lock_log_dirs()
    third.unlock_log_dirs()
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [".lock"]
    first.unlock_log_dirs()
    second.lock_log_dirs()
    second.unlock_log_dirs()


@pytest.mark.parametrize("content", [GARBAGE, b"0\n2\nt 0 5\n", b"0\n1\nt zero 5\n", b"7\n0\n"])
def test_malformed_offset_checkpoints_raise_storage_errors(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(content)
    with pytest.raises(KafkaStorageError):
        OffsetCheckpointFile(path).read()
    epochs = tmp_path / "leader-epoch-checkpoint"
    epochs.write_bytes(content)
    with pytest.raises(KafkaStorageError):
        LeaderEpochCheckpointFile(epochs).read()


def test_garbage_partition_metadata_is_a_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "partition.metadata"
    path.write_bytes(GARBAGE)
    with pytest.raises(KafkaStorageError):
        PartitionMetadataFile(path).read()
    path.write_text("version: 0\ntopic_id: !!!\n")
    with pytest.raises(KafkaStorageError):
        PartitionMetadataFile(path).read()


@pytest.mark.parametrize("content", [GARBAGE, b"0\n2\n5 10\n3 20\n", b"0\n1\n-1 0\n", None])
def test_a_damaged_or_missing_leader_epoch_checkpoint_is_rebuilt_from_the_batches(
    tmp_path: Path, content: bytes | None
) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_ms=1))
    for epoch in (0, 0, 2, 2, 5):
        log.append_as_leader(make_batch(count=2), epoch)
    assert log.leader_epoch_cache.entries == [(0, 0), (2, 4), (5, 8)]
    log.close()
    path = tmp_path / "t-0" / "leader-epoch-checkpoint"
    if content is None:
        path.unlink()
    else:
        path.write_bytes(content)
    reopened = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_ms=1))
    assert reopened.leader_epoch_cache.entries == [(0, 0), (2, 4), (5, 8)]
    if content is None:
        # A missing file (epochs never flushed before a crash) is written by the next flush.
        assert not path.exists()
    else:
        assert LeaderEpochCheckpointFile(path).read() == [(0, 0), (2, 4), (5, 8)]  # replaced at once
    reopened.close()
    assert LeaderEpochCheckpointFile(path).read() == [(0, 0), (2, 4), (5, 8)]


def test_a_new_log_writes_no_empty_leader_epoch_file(tmp_path: Path) -> None:
    cache = LeaderEpochFileCache(tmp_path, lambda: 0)
    assert cache.rebuild_needed
    cache.rebuild(iter(()))
    assert not (tmp_path / "leader-epoch-checkpoint").exists()


def test_truncations_from_the_start_are_written_by_flush_from_the_end_at_once(tmp_path: Path) -> None:
    cache = LeaderEpochFileCache(tmp_path, lambda: 30)
    cache.assign(1, 0)
    cache.assign(2, 10)
    cache.assign(3, 20)
    cache.truncate_from_start(12)
    path = tmp_path / "leader-epoch-checkpoint"
    assert LeaderEpochCheckpointFile(path).read() == [(1, 0), (2, 10), (3, 20)]  # not yet
    cache.flush()
    assert LeaderEpochCheckpointFile(path).read() == [(2, 12), (3, 20)]
    cache.truncate_from_end(15)
    assert LeaderEpochCheckpointFile(path).read() == [(2, 12)]


def test_a_log_start_offset_beyond_the_log_end_is_ignored(tmp_path: Path) -> None:
    manager = LogManager([tmp_path])
    manager.startup(lambda topic: LogConfig())
    log = manager.get_or_create_log("t", 0, LogConfig())
    log.append_as_leader(make_batch(count=5), 0)
    manager.shutdown()
    OffsetCheckpointFile(tmp_path / "log-start-offset-checkpoint").write({("t", 0): 10**9})
    again = LogManager([tmp_path])
    again.startup(lambda topic: LogConfig())
    reloaded = again.get_log("t", 0)
    assert reloaded is not None
    assert (reloaded.log_start_offset, reloaded.log_end_offset) == (0, 5)
    assert len(reloaded.read(0, 1 << 20).records) > 0
    again.shutdown()
