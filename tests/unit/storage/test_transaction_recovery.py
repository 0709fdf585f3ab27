"""Transactions across restarts, truncation, replication and segments: snapshots, recovery that
reopens open transactions and rebuilds transaction indexes, followers' markers."""

from __future__ import annotations

import os
from pathlib import Path

from strom.storage import LogConfig, UnifiedLog
from strom.storage.producer_state import read_snapshot
from strom.storage.transaction_index import AbortedTxn
from unit.storage.txn_batches import ABORT, COMMIT, crash, idem, open_log, txn

SMALL_SEGMENTS = {"segment_bytes": 400, "index_interval_bytes": 100}


def build_history(log: UnifiedLog) -> None:
    """Producer 1 aborts [0, 4], producer 2 commits [2, 6], producer 3 leaves [7, ...) open."""
    log.append_as_leader(txn(1, 0), 0)  # 0-1
    log.append_as_leader(txn(2, 0), 0)  # 2-3
    log.append_transaction_marker(1, 0, 0, ABORT, 0)  # 4
    log.append_as_leader(idem(4, 0), 0)  # 5-6
    log.append_transaction_marker(2, 0, 0, COMMIT, 0)  # 7
    log.append_as_leader(txn(3, 0), 0)  # 8-9


def test_snapshot_round_trip_keeps_the_open_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    build_history(log)
    log.close()
    (snapshot,) = (tmp_path / "t-0").glob("*.snapshot")
    producers = read_snapshot(snapshot)
    assert producers[3].current_txn_first_offset == 8
    assert producers[1].coordinator_epoch == 0 and producers[1].current_txn_first_offset == -1
    reopened = UnifiedLog.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=True)
    assert reopened.producer_state.ongoing_transactions == [(8, 3)]
    assert reopened.last_stable_offset(10) == 8
    assert reopened.collect_aborted_transactions(0, 10) == [AbortedTxn(1, 0, 4, 2)]
    # The reopened transaction ends as any other.
    reopened.append_transaction_marker(3, 0, 0, COMMIT, 0)
    assert reopened.last_stable_offset(11) == 11


def test_snapshot_keeps_a_producer_whose_last_write_was_a_marker(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_transaction_marker(5, 2, 7, ABORT, 0)  # a hanging transaction's abort
    log.close()
    reopened = UnifiedLog.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=True)
    entry = reopened.producer_state.last_entry(5)
    assert entry is not None and (entry.producer_epoch, entry.coordinator_epoch) == (2, 7)
    assert not entry.batches and entry.last_timestamp > 0


def test_unclean_shutdown_reopens_an_open_transaction_and_rebuilds_the_index(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    build_history(log)
    dir = log.dir
    crash(log)
    # Lose the transaction index too: recovery of the segment rebuilds it from the markers.
    (index_file,) = dir.glob("*.txnindex")
    index_file.unlink()
    recovered = UnifiedLog.open(dir, LogConfig(), had_clean_shutdown=False, recovery_point=0)
    assert recovered.producer_state.ongoing_transactions == [(8, 3)]
    # Replayed markers hold the LSO until the high watermark is known to pass them (Kafka's
    # unreplicated transactions): the open transaction is what remains.
    assert recovered.first_unstable_offset == 0
    assert recovered.last_stable_offset(10) == 8 and recovered.first_unstable_offset == 8
    assert recovered.collect_aborted_transactions(0, 10) == [AbortedTxn(1, 0, 4, 2)]
    assert index_file.exists()


def test_recovery_replays_from_producer_state_before_the_recovered_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, **SMALL_SEGMENTS)
    log.append_as_leader(txn(1, 0, value_size=60), 0)  # begins in the first segment
    while log.num_segments < 3:
        log.append_as_leader(idem(2, log.log_end_offset, count=1), 0)
    log.flush()  # the recovery point passes the transaction's first batch
    marker = log.append_transaction_marker(1, 0, 0, ABORT, 0).first_offset
    dir, recovery_point = log.dir, log.recovery_point
    assert log.segments[0].base_offset < recovery_point <= marker
    crash(log)
    for path in dir.glob("*.txnindex"):
        path.unlink()
    recovered = UnifiedLog.open(
        dir, LogConfig(**SMALL_SEGMENTS), had_clean_shutdown=False, recovery_point=recovery_point
    )
    # The transaction began before the recovered segments: its first offset comes from the state
    # the earlier segments left.
    assert recovered.collect_aborted_transactions(0, 2) == [AbortedTxn(1, 0, marker, marker + 1)]
    assert recovered.last_stable_offset(marker + 1) == marker + 1
    assert recovered.first_unstable_offset is None


def test_damaged_index_is_rebuilt_after_a_clean_shutdown(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    build_history(log)
    log.close()
    (index_file,) = (tmp_path / "t-0").glob("*.txnindex")
    index_file.write_bytes(index_file.read_bytes()[:-5])
    reopened = UnifiedLog.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=True)
    assert reopened.collect_aborted_transactions(0, 10) == [AbortedTxn(1, 0, 4, 2)]
    assert index_file.stat().st_size == 34
    assert reopened.producer_state.ongoing_transactions == [(8, 3)]


def test_truncation_truncates_the_index_and_reopens_transactions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    build_history(log)
    log.truncate_to(7)  # the COMMIT of producer 2 goes
    assert log.producer_state.ongoing_transactions == [(2, 2)]
    assert log.collect_aborted_transactions(0, 7) == [AbortedTxn(1, 0, 4, 2)]
    log.truncate_to(4)  # the ABORT of producer 1 goes too
    assert log.producer_state.ongoing_transactions == [(0, 1), (2, 2)]
    assert log.collect_aborted_transactions(0, 4) == []
    assert log.active_segment.txn_index.is_empty
    log.truncate_fully_and_start_at(100)
    assert log.first_unstable_offset is None and not list(log.dir.glob("*.txnindex"))


def test_follower_appends_markers_as_the_leader_did(tmp_path: Path) -> None:
    leader = open_log(tmp_path, "leader-0")
    build_history(leader)
    follower = open_log(tmp_path, "follower-0")
    records = leader.read(0, 1 << 20).records
    info = follower.append_as_follower(records)
    assert info is not None and info.last_offset == 9
    assert follower.producer_state.ongoing_transactions == [(8, 3)]
    assert follower.collect_aborted_transactions(0, 10) == leader.collect_aborted_transactions(0, 10)
    assert follower.last_stable_offset(10) == 8
    entry = follower.producer_state.last_entry(2)
    assert entry is not None and entry.coordinator_epoch == 0 and entry.current_txn_first_offset == -1
    # As the new leader, it fences what the old one would have.
    follower.append_transaction_marker(3, 0, 1, ABORT, 1)
    assert follower.collect_aborted_transactions(8, 11) == [AbortedTxn(3, 8, 10, 11)]


def test_aborted_transaction_is_found_from_a_segment_before_its_marker(tmp_path: Path) -> None:
    log = open_log(tmp_path, **SMALL_SEGMENTS)
    log.append_as_leader(txn(1, 0), 0)  # 0-1, in the first segment
    seq = 0
    while log.num_segments < 4:
        log.append_as_leader(idem(2, seq, count=1), 0)
        seq += 1
    marker = log.append_transaction_marker(1, 0, 0, ABORT, 0).first_offset
    assert log.segments[0].txn_index.is_empty and not log.active_segment.txn_index.is_empty
    # A fetch of the first segment's records needs the abort recorded three segments later.
    assert log.collect_aborted_transactions(0, 2) == [AbortedTxn(1, 0, marker, marker + 1)]
    assert log.collect_aborted_transactions(marker + 1, marker + 5) == []


def test_retention_renames_a_deleted_segments_index(tmp_path: Path) -> None:
    log = open_log(tmp_path, file_delete_delay_ms=60_000, **SMALL_SEGMENTS)
    log.append_as_leader(txn(1, 0), 0)
    log.append_transaction_marker(1, 0, 0, ABORT, 0)
    seq = 0
    while log.num_segments < 3:
        log.append_as_leader(idem(2, seq, count=1), 0)
        seq += 1
    first = log.segments[0]
    assert not first.txn_index.is_empty
    log.delete_records(log.segments[1].base_offset)
    assert not first.txn_index.path.exists()
    assert first.txn_index.path.with_name(first.txn_index.path.name + ".deleted").exists()
    assert log.collect_aborted_transactions(log.log_start_offset, log.log_end_offset) == []
    assert os.path.exists(log.dir)
