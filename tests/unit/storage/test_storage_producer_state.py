from __future__ import annotations

from pathlib import Path

import pytest

from strom.storage import (
    InvalidProducerEpochError,
    LogConfig,
    OutOfOrderSequenceError,
    UnifiedLog,
)
from unit.storage.storage_batches import batch_offsets, make_batch

PID = 1000


def idem(seq: int, count: int = 2, epoch: int = 0, pid: int = PID) -> bytes:
    return make_batch(count=count, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_duplicate_of_recent_batch_returns_original_offsets(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    infos = [log.append_as_leader(idem(seq), 0) for seq in range(0, 12, 2)]
    end = log.log_end_offset
    # A retry of any of the last five batches is answered with its original offsets.
    retry = log.append_as_leader(idem(4), 0)
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (
        infos[2].first_offset,
        infos[2].last_offset,
    )
    assert log.log_end_offset == end
    # The sixth-oldest batch is no longer remembered: its retry is out of order.
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(idem(0), 0)
    entry = log.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == 11 and entry.producer_epoch == 0


def test_sequence_gap_and_fencing(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    log.append_as_leader(idem(0), 0)
    with pytest.raises(OutOfOrderSequenceError) as gap:
        log.append_as_leader(idem(5), 0)
    assert gap.value.error_code == 45
    # A new epoch must start at sequence 0.
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(idem(2, epoch=1), 0)
    log.append_as_leader(idem(0, epoch=1), 0)
    with pytest.raises(InvalidProducerEpochError) as fenced:
        log.append_as_leader(idem(2, epoch=0), 0)
    assert fenced.value.error_code == 47
    # An unknown producer may start anywhere (Kafka since KIP-360).
    assert log.append_as_leader(idem(17, pid=2000), 0).first_offset == 4
    # Non-idempotent batches are not checked.
    assert not log.append_as_leader(make_batch(), 0).duplicate
    assert log.log_end_offset == 7


def test_sequences_within_one_append(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    info = log.append_as_leader(idem(0) + idem(2) + idem(4), 0)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 5, 6)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(idem(6) + idem(9), 0)
    assert log.log_end_offset == 6


def test_state_survives_reopen_from_snapshot(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, LogConfig())
    for seq in range(0, 6, 2):
        log.append_as_leader(idem(seq), 0)
    log.close()
    assert (dir / "00000000000000000006.snapshot").exists()
    reopened = UnifiedLog.open(dir, LogConfig(), had_clean_shutdown=True)
    entry = reopened.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == 5
    # The last batch is still recognised as a duplicate; the next sequence is accepted.
    assert reopened.append_as_leader(idem(4), 0).duplicate
    assert reopened.append_as_leader(idem(6), 0).first_offset == 6
    with pytest.raises(OutOfOrderSequenceError):
        reopened.append_as_leader(idem(10), 0)


def test_state_rebuilt_from_log_without_snapshot(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, LogConfig(segment_bytes=400))
    for seq in range(0, 20, 2):
        log.append_as_leader(idem(seq), 0)
    assert log.num_segments > 2
    log.close()
    for snapshot in dir.glob("*.snapshot"):
        snapshot.unlink()
    reopened = UnifiedLog.open(dir, LogConfig(segment_bytes=400))
    entry = reopened.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == 19
    # All five retained batches were rebuilt, not just the last one.
    assert reopened.append_as_leader(idem(12), 0).duplicate
    assert reopened.append_as_leader(idem(20), 0).first_offset == 20


def test_replay_after_latest_snapshot_following_crash(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, LogConfig(segment_bytes=400))
    for seq in range(0, 20, 2):
        log.append_as_leader(idem(seq), 0)
    snapshots = sorted(dir.glob("*.snapshot"))
    assert snapshots  # written at each roll
    for segment in log.segments:
        segment.close_handles()
    reopened = UnifiedLog.open(dir, LogConfig(segment_bytes=400))
    entry = reopened.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == 19
    assert reopened.append_as_leader(idem(18), 0).duplicate


def test_corrupt_snapshot_is_ignored(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, LogConfig())
    log.append_as_leader(idem(0), 0)
    log.close()
    snapshot = dir / "00000000000000000002.snapshot"
    data = bytearray(snapshot.read_bytes())
    data[-1] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    reopened = UnifiedLog.open(dir, LogConfig())
    assert not snapshot.exists()
    entry = reopened.producer_state.last_entry(PID)
    assert entry is not None and entry.last_seq == 1


def test_producer_expiration(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    log.append_as_leader(make_batch(producer_id=PID, producer_epoch=0, base_sequence=0, timestamps=[1000]), 0)
    assert log.producer_state.remove_expired_producers(now_ms=2000, expiration_ms=5000) == 0
    assert log.producer_state.remove_expired_producers(now_ms=7000, expiration_ms=5000) == 1
    assert log.producer_state.last_entry(PID) is None
    assert batch_offsets(log.read(0, 1000).records) == [(0, 0)]
