"""LogManager.open_new_logs: a topic's new logs are created together, and made durable in one pass."""

from __future__ import annotations

import ctypes
import errno
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.storage import CLEAN_SHUTDOWN_FILE, LogConfig, LogManager
from strom.storage import checkpoint as checkpoint_module
from strom.storage.checkpoint import PARTITION_METADATA, SYNCFS_MIN_LOGS, PartitionMetadataFile
from strom.storage.log_manager import NewLog
from unit.storage.storage_batches import batch_offsets, make_batch


class SyncRecorder:
    """Counts fsync and syncfs calls (the real calls still run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fsyncs = 0
        self.syncfs_calls = 0
        real_fsync = os.fsync
        real_syncfs = checkpoint_module._syncfs()
        assert real_syncfs is not None, "this test needs Linux's syncfs"

        def fsync(fd: int) -> None:
            self.fsyncs += 1
            real_fsync(fd)

        def syncfs(fd: int) -> int:
            self.syncfs_calls += 1
            return real_syncfs(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        recorded: Callable[[], Callable[[int], int] | None] = lambda: syncfs  # noqa: E731
        monkeypatch.setattr(checkpoint_module, "_syncfs", recorded)


def specs(log_dir: Path, topic_id: uuid.UUID, count: int) -> list[NewLog]:
    # Partition 0 led here (epoch 3), the others followed.
    return [NewLog(log_dir, "t", p, LogConfig(), topic_id, 3 if p == 0 else -1) for p in range(count)]


def test_new_logs_cost_two_fsyncs_each_and_no_leader_epoch_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager([tmp_path])
    manager.startup(lambda topic: LogConfig())
    topic_id = uuid.uuid4()
    count = 100
    recorder = SyncRecorder(monkeypatch)

    logs = manager.open_new_logs(specs(tmp_path, topic_id, count))

    assert len(logs) == count
    # Per log its partition.metadata and its directory, then the log dir once; no syncfs.
    assert (recorder.syncfs_calls, recorder.fsyncs) == (0, count * 2 + 1)
    for log_ in logs:
        assert PartitionMetadataFile(log_.dir / PARTITION_METADATA).read() == topic_id
        assert not list(log_.dir.glob("*.tmp"))
    # The leader's first epoch is in memory; the file is written by the log's first flush or close.
    leader = logs[0]
    assert leader.leader_epoch_cache.entries == [(3, 0)]
    assert not (leader.dir / "leader-epoch-checkpoint").exists()
    manager.register_logs(logs)
    leader.append_as_leader(make_batch(count=2), 3)
    manager.shutdown()

    again = LogManager([tmp_path])
    again.startup(lambda topic: LogConfig(), {"t": topic_id})
    reloaded = again.get_log("t", 0)
    assert reloaded is not None and reloaded.topic_id == topic_id
    assert reloaded.leader_epoch_cache.entries == [(3, 0)]
    assert batch_offsets(reloaded.read(0, 1000).records) == [(0, 1)]
    assert len(again.all_logs()) == count
    again.shutdown()


def test_a_directory_already_there_is_opened_with_its_data_not_replaced(tmp_path: Path) -> None:
    manager = LogManager([tmp_path])
    manager.startup(lambda topic: LogConfig())
    topic_id = uuid.uuid4()
    [old] = manager.open_new_logs(specs(tmp_path, topic_id, 1))
    old.append_as_leader(make_batch(count=4), 3)
    old.close()  # left behind: not registered, as after a failed deletion

    [log_] = manager.open_new_logs(specs(tmp_path, topic_id, 1))

    assert log_.log_end_offset == 4
    assert log_.topic_id == topic_id


def test_a_crash_before_the_commit_leaves_a_log_that_takes_its_topic_id_again(tmp_path: Path) -> None:
    """Killed between writing partition.metadata's temporary file and renaming it: the next start
    finds no partition.metadata, takes the control plane's topic id and drops the leftover."""
    topic_id = uuid.uuid4()
    partition_dir = tmp_path / "t-0"
    partition_dir.mkdir()
    PartitionMetadataFile(partition_dir / PARTITION_METADATA).write_unsynced(topic_id)

    manager = LogManager([tmp_path])
    manager.startup(lambda topic: LogConfig(), {"t": topic_id})

    log_ = manager.get_log("t", 0)
    assert log_ is not None and log_.topic_id == topic_id
    assert PartitionMetadataFile(partition_dir / PARTITION_METADATA).read() == topic_id
    assert not list(partition_dir.glob("*.tmp"))
    manager.shutdown()


def test_shutting_down_many_logs_syncs_each_file_system_once_before_the_clean_shutdown_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager([tmp_path])
    manager.startup(lambda topic: LogConfig())
    topic_id = uuid.uuid4()
    count = SYNCFS_MIN_LOGS
    logs = manager.open_new_logs(specs(tmp_path, topic_id, count))
    manager.register_logs(logs)
    for log_ in logs:
        log_.append_as_leader(make_batch(count=2), 3)
    recorder = SyncRecorder(monkeypatch)

    manager.shutdown()

    # The closes' fsyncs (segments, epochs, snapshots, directories) left to one syncfs; only the
    # log dir's checkpoints and marker, written after it, are fsynced.
    assert recorder.syncfs_calls == 1
    assert recorder.fsyncs <= 5
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    again = LogManager([tmp_path])
    again.startup(lambda topic: LogConfig(), {"t": topic_id})
    for p in range(count):
        reloaded = again.get_log("t", p)
        assert reloaded is not None and reloaded.log_end_offset == 2
        assert reloaded.leader_epoch_cache.entries == [(3, 0)]
    again.shutdown()


def test_a_failed_syncfs_at_shutdown_leaves_no_clean_shutdown_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager([tmp_path])
    manager.startup(lambda topic: LogConfig())
    manager.register_logs(manager.open_new_logs(specs(tmp_path, uuid.uuid4(), SYNCFS_MIN_LOGS)))

    def failing(fd: int) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(checkpoint_module, "_syncfs", lambda: failing)
    manager.shutdown()

    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert manager.log_dir_failure_channel.is_offline(tmp_path)
