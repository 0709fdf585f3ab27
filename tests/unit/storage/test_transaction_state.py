"""Transactions in a leader's log: producer state transitions, the LSO, markers and their checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.records import batch as rb
from strom.records.codec import decode_batches
from strom.records.control import batch_end_txn_marker
from strom.storage import InvalidProducerEpochError, OutOfOrderSequenceError
from strom.storage.append_origin import AppendOrigin
from strom.storage.errors import InvalidRecordError, InvalidTxnStateError, TransactionCoordinatorFencedError
from strom.storage.transaction_index import AbortedTxn
from unit.storage.storage_batches import make_batch
from unit.storage.txn_batches import ABORT, COMMIT, idem, open_log, txn


def test_transactional_batch_begins_a_transaction_at_its_first_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(make_batch(3), 0)  # offsets 0-2, no producer
    assert log.first_unstable_offset is None
    assert log.last_stable_offset(3) == 3
    log.append_as_leader(txn(1, 0), 0)  # offsets 3-4
    log.append_as_leader(txn(1, 2), 0)  # 5-6: the same transaction
    entry = log.producer_state.last_entry(1)
    assert entry is not None and entry.current_txn_first_offset == 3
    assert log.first_unstable_offset == 3
    assert log.last_stable_offset(7) == 3
    # The LSO is capped at the high watermark.
    assert log.last_stable_offset(2) == 2
    assert log.producer_state.ongoing_transactions == [(3, 1)]


def test_non_transactional_batch_inside_a_transaction_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn(1, 0), 0)
    with pytest.raises(InvalidTxnStateError) as refused:
        log.append_as_leader(idem(1, 2), 0)
    assert refused.value.error_code == 48
    # Within one request too: the second batch of the producer leaves the transaction.
    log2 = open_log(tmp_path, "u-0")
    with pytest.raises(InvalidTxnStateError):
        log2.append_as_leader(txn(1, 0) + idem(1, 2), 0)
    assert log2.log_end_offset == 0 and log2.first_unstable_offset is None
    assert log.log_end_offset == 2


def test_transactional_batch_of_another_epoch_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn(1, 0, epoch=3), 0)
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(txn(1, 0, epoch=4), 0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(txn(1, 2, epoch=2), 0)
    assert log.log_end_offset == 2
    # Other producers are not held up by it.
    assert log.append_as_leader(idem(2, 0), 0).first_offset == 2


def test_commit_marker_ends_the_transaction_and_holds_the_lso_until_replicated(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn(1, 0), 0)  # 0-1
    info = log.append_transaction_marker(1, 0, 5, COMMIT, leader_epoch=0)
    assert (info.first_offset, info.last_offset, info.record_count) == (2, 2, 1)
    entry = log.producer_state.last_entry(1)
    assert entry is not None and entry.current_txn_first_offset == -1 and entry.coordinator_epoch == 5
    # The marker is above the high watermark: the transaction still holds the LSO.
    assert log.first_unstable_offset == 0
    assert log.last_stable_offset(2) == 0
    assert log.last_stable_offset(3) == 3
    assert log.first_unstable_offset is None
    # The marker is a control batch as Kafka writes it: transactional, one COMMIT record.
    (batch,) = decode_batches(log.read(2, 1 << 20).records)
    header = batch.header
    assert header.is_control and header.is_transactional and header.producer_id == 1
    marker = batch_end_txn_marker(log.read(2, 1 << 20).records)
    assert marker is not None and marker.type is COMMIT and marker.coordinator_epoch == 5
    # A commit leaves nothing in the transaction index.
    assert log.collect_aborted_transactions(0, 3) == []
    # The producer may begin its next transaction.
    log.append_as_leader(txn(1, 2), 0)
    assert log.first_unstable_offset == 3


def test_lso_with_interleaved_transactions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn(1, 0), 0)  # 0-1
    log.append_as_leader(txn(2, 0), 0)  # 2-3
    log.append_as_leader(idem(3, 0), 0)  # 4-5, outside transactions
    log.append_transaction_marker(1, 0, 0, COMMIT, 0)  # 6
    assert log.last_stable_offset(7) == 2  # producer 2's transaction is open
    log.append_transaction_marker(2, 0, 0, ABORT, 0)  # 7
    assert log.last_stable_offset(7) == 2  # its marker is not replicated yet
    assert log.last_stable_offset(8) == 8
    # Producer 2's abort recorded the LSO it left: just after its marker (no other transaction open).
    assert log.collect_aborted_transactions(0, 8) == [AbortedTxn(2, 2, 7, 8)]


def test_abort_records_the_first_offset_of_another_open_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn(1, 0), 0)  # 0-1
    log.append_as_leader(txn(2, 0), 0)  # 2-3
    log.append_transaction_marker(1, 0, 0, ABORT, 0)  # 4
    assert log.active_segment.txn_index.all() == [AbortedTxn(1, 0, 4, 2)]
    assert log.last_stable_offset(5) == 2


def test_marker_checks_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn(1, 0, epoch=2), 0)
    with pytest.raises(InvalidProducerEpochError) as old:
        log.append_transaction_marker(1, 1, 0, COMMIT, 0)
    assert old.value.error_code == 47
    log.append_transaction_marker(1, 2, 4, ABORT, 0)  # offset 2
    # A coordinator older than the last marker's is a zombie.
    log.append_as_leader(txn(1, 2, epoch=2), 0)  # 3-4
    with pytest.raises(TransactionCoordinatorFencedError) as fenced:
        log.append_transaction_marker(1, 2, 3, COMMIT, 0)
    assert fenced.value.error_code == 52
    assert log.log_end_offset == 5 and log.last_stable_offset(5) == 3
    # A marker with a newer epoch (the coordinator's bump when it aborts a timed-out
    # transaction) ends it and fences the older epoch.
    log.append_transaction_marker(1, 3, 4, ABORT, 0)
    assert log.last_stable_offset(6) == 6 and log.first_unstable_offset is None
    assert log.collect_aborted_transactions(0, 6) == [AbortedTxn(1, 0, 2, 3), AbortedTxn(1, 3, 5, 6)]
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(txn(1, 4, epoch=2), 0)


def test_marker_for_a_producer_without_a_transaction_is_written_and_ends_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    info = log.append_transaction_marker(42, 0, 1, ABORT, 0)
    assert (info.first_offset, log.log_end_offset) == (0, 1)
    assert log.first_unstable_offset is None
    assert log.active_segment.txn_index.is_empty
    entry = log.producer_state.last_entry(42)
    assert entry is not None and entry.coordinator_epoch == 1 and entry.last_offset == -1
    # It counts as the producer's activity, so its coordinator epoch is remembered.
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append_transaction_marker(42, 0, 0, ABORT, 0)


def test_coordinator_origin_checks_epochs_but_not_sequences(tmp_path: Path) -> None:
    log = open_log(tmp_path, "__consumer_offsets-0")
    offset_commit = make_batch(
        1, producer_id=9, producer_epoch=1, base_sequence=-1, attributes=rb.TRANSACTIONAL_FLAG
    )
    # A client may not send a producer id without a sequence.
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(offset_commit, 0)
    info = log.append_as_leader(offset_commit, 0, origin=AppendOrigin.COORDINATOR)
    assert not info.duplicate and log.first_unstable_offset == 0
    # The same bytes again are no retry for the coordinator: appended again, in the transaction.
    assert log.append_as_leader(offset_commit, 0, origin=AppendOrigin.COORDINATOR).first_offset == 1
    older = make_batch(1, producer_id=9, producer_epoch=0, base_sequence=-1, attributes=rb.TRANSACTIONAL_FLAG)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(older, 0, origin=AppendOrigin.COORDINATOR)
    log.append_transaction_marker(9, 1, 0, COMMIT, 0)
    assert log.last_stable_offset(3) == 3


def test_client_sequences_still_checked_in_transactions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn(1, 0), 0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(txn(1, 5), 0)
    assert log.append_as_leader(txn(1, 0), 0).duplicate


def test_expiration_keeps_producers_with_an_open_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn(1, 0), 0)
    log.append_as_leader(idem(2, 0), 0)
    state = log.producer_state
    assert state.remove_expired_producers(now_ms=1 << 62, expiration_ms=1) == 1
    assert state.last_entry(1) is not None and state.last_entry(2) is None
    assert log.first_unstable_offset == 0


def test_first_unstable_offset_is_never_below_the_log_start(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn(1, 0), 0)  # 0-1
    log.append_as_leader(txn(1, 2), 0)  # 2-3
    log.delete_records(3)
    assert log.first_unstable_offset == 3
    assert log.last_stable_offset(4) == 3
