"""A follower's log: appends that keep the leader's offsets and epochs, truncation, the HW checkpoint."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from strom.records import batch as rb
from strom.storage import CorruptRecordError, LogConfig, LogManager, OffsetOutOfRangeError, UnifiedLog
from strom.storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from unit.storage.storage_batches import make_batch


def leader_batch(base_offset: int, count: int, epoch: int, **kwargs: object) -> bytes:
    """A batch as a leader stored it: its offset and partition leader epoch set, CRC intact
    (partitionLeaderEpoch lies outside the CRC'd range)."""
    batch = bytearray(make_batch(count, base_offset=base_offset, **kwargs))  # type: ignore[arg-type]
    struct.pack_into(">i", batch, rb.PARTITION_LEADER_EPOCH, epoch)
    return bytes(batch)


def open_log(tmp_path: Path, **config: object) -> UnifiedLog:
    return UnifiedLog.open(tmp_path / "t-0", LogConfig(**config))  # type: ignore[arg-type]


def test_append_as_follower_keeps_offsets_epochs_and_producer_state(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    records = (
        leader_batch(0, 3, 0)
        + leader_batch(3, 2, 2, producer_id=7, producer_epoch=0, base_sequence=0)
        + leader_batch(5, 1, 2, producer_id=7, producer_epoch=0, base_sequence=2)
    )
    info = log.append_as_follower(records)
    assert info is not None and (info.first_offset, info.last_offset) == (0, 5)
    assert log.log_end_offset == 6
    assert log.leader_epoch_cache.entries == [(0, 0), (2, 3)]
    # The same bytes as the leader's, so the same offsets and epochs to every reader.
    assert bytes(log.read(0, 1 << 20).records) == records
    entry = log.producer_state.last_entry(7)
    assert entry is not None and entry.last_seq == 2
    # As leader now, the idempotent producer's retry of its last batch is a duplicate.
    duplicate = log.append_as_leader(make_batch(1, producer_id=7, producer_epoch=0, base_sequence=2), 3)
    assert duplicate.duplicate and duplicate.first_offset == 5
    log.close()


def test_append_as_follower_checks_structure(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_follower(leader_batch(0, 2, 0))
    with pytest.raises(OffsetOutOfRangeError):
        log.append_as_follower(leader_batch(5, 1, 0))  # a gap
    with pytest.raises(OffsetOutOfRangeError):
        log.append_as_follower(leader_batch(0, 1, 0))  # an overlap
    damaged = bytearray(leader_batch(2, 1, 0))
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(bytes(damaged))
    assert log.log_end_offset == 2
    # A response cut at its size limit ends in part of a batch: the whole ones are appended.
    whole = leader_batch(2, 1, 0)
    info = log.append_as_follower(whole + leader_batch(3, 4, 0)[:30])
    assert info is not None and log.log_end_offset == 3
    assert log.append_as_follower(leader_batch(3, 4, 0)[:70]) is None
    log.close()


def test_truncation_and_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=200)
    for batch in (leader_batch(0, 2, 0), leader_batch(2, 2, 1), leader_batch(4, 2, 3)):
        log.append_as_follower(batch)
    assert log.num_segments > 1
    assert log.leader_epoch_cache.entries == [(0, 0), (1, 2), (3, 4)]
    assert log.truncate_to(3)  # inside the epoch-1 batch: the whole batch goes, as in Kafka
    assert log.log_end_offset == 2
    assert log.leader_epoch_cache.entries == [(0, 0)]
    # A new leader's data in a new epoch appends where the log now ends.
    log.append_as_follower(leader_batch(2, 3, 4))
    assert log.leader_epoch_cache.entries == [(0, 0), (4, 2)]
    assert log.leader_epoch_cache.end_offset_for(1) == (0, 2)
    # A follower far behind the leader's log start restarts its log there.
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset) == (100, 100)
    assert log.leader_epoch_cache.entries == []
    log.append_as_follower(leader_batch(100, 1, 5))
    assert log.leader_epoch_cache.entries == [(5, 100)]
    log.close()


def test_follower_log_start_follows_the_leader(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=200)
    for base in range(0, 10, 2):
        log.append_as_follower(leader_batch(base, 2, 0))
    log.follow_log_start_offset(6, high_watermark=4)  # never past the follower's HW
    assert log.log_start_offset == 4
    log.follow_log_start_offset(8, high_watermark=10)
    assert log.log_start_offset == 8
    assert log.segments[0].base_offset <= 8
    log.follow_log_start_offset(2, high_watermark=10)  # never backwards
    assert log.log_start_offset == 8
    log.close()


def test_high_watermark_checkpoint_round_trip(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = LogManager(dirs)
    manager.startup(lambda _: LogConfig())
    one = manager.get_or_create_log("t", 0, LogConfig())
    two = manager.get_or_create_log("t", 1, LogConfig())
    assert one.dir.parent != two.dir.parent
    manager.checkpoint_high_watermarks({("t", 0): 5, ("t", 1): 7, ("gone", 0): 9})
    # Kafka's file format, each dir holding its own partitions only.
    assert OffsetCheckpointFile(one.dir.parent / REPLICATION_OFFSET_CHECKPOINT).read() == {("t", 0): 5}
    assert (two.dir.parent / REPLICATION_OFFSET_CHECKPOINT).read_text() == "0\n1\nt 1 7\n"
    assert manager.read_high_watermarks() == {("t", 0): 5, ("t", 1): 7}
    manager.shutdown()
