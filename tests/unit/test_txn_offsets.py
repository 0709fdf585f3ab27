"""Transactional offset commits in the group coordinator's state: pending until the marker,
applied at COMMIT unless a later commit is in the log, dropped at ABORT; and the load of an
offsets partition holding committed, aborted and still-open transactions."""

from __future__ import annotations

from strom.broker.coordinator.group import ClassicGroup, OffsetAndMetadata
from strom.broker.coordinator.group_metadata_manager import GroupLoad
from strom.broker.coordinator.loader import replay_records
from strom.broker.coordinator.records import (
    OffsetCommitKey,
    OffsetCommitValue,
    encode_offset_commit_key,
    encode_offset_commit_value,
)
from strom.broker.partition import TopicPartition
from strom.records.codec import RecordSpec, encode_batch
from strom.records.control import ControlRecordType, build_control_batch

GROUP = "g"
TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def _offset(value: int) -> OffsetAndMetadata:
    return OffsetAndMetadata(value, -1, "", 0)


def test_pending_offsets_apply_at_commit_and_vanish_at_abort() -> None:
    group = ClassicGroup(GROUP, 0)
    group.pending_txn_offsets[7] = {TP: (_offset(10), 5)}
    group.pending_txn_offsets[8] = {TP1: (_offset(20), 6)}
    assert group.has_pending_txn_offset(TP) and TP not in group.offsets
    group.complete_txn_offsets(7, committed=True)
    group.complete_txn_offsets(8, committed=False)
    assert group.offsets == {TP: _offset(10)} and group.pending_txn_offsets == {}


def test_a_commit_written_after_the_transactions_offsets_wins() -> None:
    group = ClassicGroup(GROUP, 0)
    group.pending_txn_offsets[7] = {TP: (_offset(10), 5)}
    group.commit_offsets({TP: _offset(99)}, log_position=9)  # a plain commit, later in the log
    group.complete_txn_offsets(7, committed=True)
    assert group.offsets[TP] == _offset(99)


def _commit_batch(offset: int, producer_id: int = -1, base_offset: int = 0) -> bytes:
    record = RecordSpec(
        encode_offset_commit_key(OffsetCommitKey(GROUP, TP.topic, TP.partition)),
        encode_offset_commit_value(OffsetCommitValue(offset, -1, "", 0)),
    )
    if producer_id < 0:
        return encode_batch([record], base_offset=base_offset)
    return encode_batch(
        [record], base_offset=base_offset, producer_id=producer_id, producer_epoch=0, is_transactional=True
    )


def _marker(producer_id: int, commit: bool, base_offset: int) -> bytes:
    marker = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    return build_control_batch(
        marker, producer_id=producer_id, producer_epoch=0, coordinator_epoch=0, base_offset=base_offset
    )


def test_a_load_honours_markers_and_keeps_open_transactions_pending() -> None:
    log = b"".join(
        [
            _commit_batch(1, base_offset=0),  # plain
            _commit_batch(2, producer_id=7, base_offset=1),  # committed below
            _commit_batch(3, producer_id=8, base_offset=2),  # aborted below
            _marker(7, True, 3),
            _marker(8, False, 4),
            _commit_batch(4, producer_id=9, base_offset=5),  # still open at the log end
        ]
    )
    state = GroupLoad(0)
    next_offset, replayed = replay_records(log, state.replay, transactions=state)
    assert (next_offset, replayed) == (6, 4)
    group = state.groups(0)[GROUP]
    assert group.offsets[TP] == _offset(2)
    assert set(group.pending_txn_offsets) == {9}
    group.complete_txn_offsets(9, committed=True)
    assert group.offsets[TP] == _offset(4)


def test_a_load_keeps_a_later_plain_commit_over_a_transaction_committed_after_it() -> None:
    log = b"".join(
        [
            _commit_batch(2, producer_id=7, base_offset=0),
            _commit_batch(50, base_offset=1),  # plain, after the transaction's offsets
            _marker(7, True, 2),
        ]
    )
    state = GroupLoad(0)
    replay_records(log, state.replay, transactions=state)
    assert state.groups(0)[GROUP].offsets[TP] == _offset(50)
