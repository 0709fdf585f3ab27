"""The transaction coordinator's state machine: every producer call in every state.

A real TransactionCoordinator and TransactionStateManager; the seams are faked: the replica
manager (the transaction log's appends succeed, or fail as a test says, and are kept to read
back) and the marker channel (answers each partition as a test says).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from strom.broker.coordinator.loader import CoordinatorLoader
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ProduceResult
from strom.broker.transaction import coordinator as coordinator_module
from strom.broker.transaction.coordinator import TransactionConfig, TransactionCoordinator
from strom.broker.transaction.log_records import TransactionState, decode_key, decode_value
from strom.broker.transaction.markers import TxnMarker
from strom.broker.transaction.metadata import TransactionMetadata
from strom.broker.transaction.state_manager import TransactionStateManager
from strom.protocol.errors import ErrorCode
from strom.records.batch import iter_headers
from strom.records.codec import decode_batch
from strom.records.control import ControlRecordType

S = TransactionState
E = ErrorCode
TID = "txn-1"
PID = 1000
EPOCH = 5
T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)
NUM_PARTITIONS = 3


@dataclass
class FakeReplicaManager:
    """The transaction log: appends answer ``error`` and are kept as (key, value) records."""

    error: ErrorCode = ErrorCode.none
    records: list[tuple[str, Any]] = field(default_factory=list)
    # When set, an append waits for it after taking its records (a write waiting for the ISR).
    replicated: asyncio.Event | None = None

    async def append(self, acks: int, entries: list[tuple[TopicPartition, bytes]], timeout_ms: int) -> Any:
        ((tp, batch),) = entries
        if self.error == ErrorCode.none:
            for header in iter_headers(batch):
                for record in decode_batch(batch, header.position).records:
                    assert record.key is not None
                    value = None if record.value is None else decode_value(record.value)
                    self.records.append((decode_key(record.key), value))
        if self.replicated is not None:
            await self.replicated.wait()
        return {tp: ProduceResult(self.error)}

    def partition(self, tp: TopicPartition) -> None:
        return None  # nothing to load: every partition starts empty


@dataclass
class FakeMarkers:
    """Partition leaders: every marker lands unless ``errors`` says otherwise for a partition."""

    sent: list[TxnMarker] = field(default_factory=list)
    errors: dict[TopicPartition, list[ErrorCode]] = field(default_factory=dict)

    async def send(self, leader_id: int, marker: TxnMarker) -> dict[TopicPartition, ErrorCode]:
        self.sent.append(marker)
        return {tp: (self.errors[tp].pop(0) if self.errors.get(tp) else E.none) for tp in marker.partitions}

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Harness:
    loop: asyncio.AbstractEventLoop
    coordinator: TransactionCoordinator
    log: FakeReplicaManager
    markers: FakeMarkers
    clock: Clock
    next_producer_id: list[int]

    def metadata(self) -> TransactionMetadata:
        _, _, metadata = self.coordinator.state.get(TID)
        assert metadata is not None
        return metadata

    async def settle(self) -> None:
        """Let background work (markers, Complete writes, fence aborts) finish."""
        for _ in range(50):
            await asyncio.sleep(0)
        while self.coordinator._tasks.pending:
            await asyncio.wait(self.coordinator._tasks.pending, timeout=5)


@pytest.fixture()
def harness() -> Iterator[Harness]:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    log = FakeReplicaManager()
    markers = FakeMarkers()
    clock = Clock()
    producer_ids = [PID + 1]

    async def generate() -> int:
        producer_ids[0] += 1
        return producer_ids[0] - 1

    state = TransactionStateManager(
        log,  # type: ignore[arg-type]
        NUM_PARTITIONS,
        CoordinatorLoader(),
        write_timeout_ms=1000,
        time_ms=clock,
    )
    coordinator = TransactionCoordinator(
        TransactionConfig(max_timeout_ms=60_000, id_expiration_ms=3_600_000),
        state,
        markers,  # type: ignore[arg-type]
        generate,
        lambda tp: 1,
        follows_leadership=False,
        time_ms=clock,
    )
    for p in range(NUM_PARTITIONS):
        loop.run_until_complete(state.load(p, leader_epoch=7))
    yield Harness(loop, coordinator, log, markers, clock, producer_ids)
    coordinator.shutdown()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    asyncio.set_event_loop(None)


def in_state(h: Harness, state: TransactionState) -> TransactionMetadata:
    """TID with producer PID at EPOCH, in ``state`` (T0 in the transaction when it has one)."""
    metadata = h.coordinator.state.put_if_absent(TransactionMetadata(TID, PID, EPOCH, 10_000))
    metadata.state = state
    if state in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT):
        metadata.partitions = {T0}
        metadata.start_timestamp_ms = h.clock.now
    return metadata


def run(h: Harness, coro: Any) -> Any:
    return h.loop.run_until_complete(coro)


ALL_STATES = [S.EMPTY, S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.COMPLETE_COMMIT, S.COMPLETE_ABORT]

# (state) -> (error, state after, epoch after) for InitProducerId without a producer id.
INIT_TABLE = {
    S.EMPTY: (E.none, S.EMPTY, EPOCH + 1),
    S.ONGOING: (E.concurrent_transactions, S.COMPLETE_ABORT, EPOCH + 1),  # fenced: aborted with a bump
    S.PREPARE_COMMIT: (E.concurrent_transactions, S.PREPARE_COMMIT, EPOCH),
    S.PREPARE_ABORT: (E.concurrent_transactions, S.PREPARE_ABORT, EPOCH),
    S.COMPLETE_COMMIT: (E.none, S.EMPTY, EPOCH + 1),
    S.COMPLETE_ABORT: (E.none, S.EMPTY, EPOCH + 1),
}
ADD_TABLE = {
    S.EMPTY: (E.none, S.ONGOING),
    S.ONGOING: (E.none, S.ONGOING),
    S.PREPARE_COMMIT: (E.concurrent_transactions, S.PREPARE_COMMIT),
    S.PREPARE_ABORT: (E.concurrent_transactions, S.PREPARE_ABORT),
    S.COMPLETE_COMMIT: (E.none, S.ONGOING),
    S.COMPLETE_ABORT: (E.none, S.ONGOING),
}
# (state, commit) -> (error, state after the markers)
END_TABLE = {
    (S.EMPTY, True): (E.invalid_txn_state, S.EMPTY),
    (S.EMPTY, False): (E.invalid_txn_state, S.EMPTY),
    (S.ONGOING, True): (E.none, S.COMPLETE_COMMIT),
    (S.ONGOING, False): (E.none, S.COMPLETE_ABORT),
    (S.PREPARE_COMMIT, True): (E.concurrent_transactions, S.PREPARE_COMMIT),
    (S.PREPARE_COMMIT, False): (E.invalid_txn_state, S.PREPARE_COMMIT),
    (S.PREPARE_ABORT, True): (E.invalid_txn_state, S.PREPARE_ABORT),
    (S.PREPARE_ABORT, False): (E.concurrent_transactions, S.PREPARE_ABORT),
    (S.COMPLETE_COMMIT, True): (E.none, S.COMPLETE_COMMIT),
    (S.COMPLETE_COMMIT, False): (E.invalid_txn_state, S.COMPLETE_COMMIT),
    (S.COMPLETE_ABORT, True): (E.invalid_txn_state, S.COMPLETE_ABORT),
    (S.COMPLETE_ABORT, False): (E.none, S.COMPLETE_ABORT),
}


@pytest.mark.parametrize("state", ALL_STATES, ids=lambda s: s.name)
def test_init_producer_id_in_every_state(harness: Harness, state: TransactionState) -> None:
    in_state(harness, state)
    result = run(harness, harness.coordinator.init_producer_id(TID, 10_000, None))
    run(harness, harness.settle())
    error, state_after, epoch_after = INIT_TABLE[state]
    assert result.error == error
    metadata = harness.metadata()
    assert (metadata.state, metadata.producer_epoch, metadata.producer_id) == (state_after, epoch_after, PID)
    if error == E.none:
        assert (result.producer_id, result.producer_epoch) == (PID, epoch_after)
        assert harness.log.records[-1][1].state == S.EMPTY  # written before it took effect
    if state == S.ONGOING:
        # The fenced transaction's ABORT carried the bumped epoch, which fences the old producer.
        assert [(m.result, m.producer_epoch) for m in harness.markers.sent] == [(ControlRecordType.ABORT, EPOCH + 1)]


@pytest.mark.parametrize("state", ALL_STATES, ids=lambda s: s.name)
def test_add_partitions_in_every_state(harness: Harness, state: TransactionState) -> None:
    before = set(in_state(harness, state).partitions)
    error = run(harness, harness.coordinator.add_partitions(TID, PID, EPOCH, {T1}))
    expected_error, state_after = ADD_TABLE[state]
    assert error == expected_error
    metadata = harness.metadata()
    assert metadata.state == state_after
    if error == E.none:
        assert metadata.partitions == ({T0, T1} if state == S.ONGOING else {T1})
        assert harness.log.records[-1][1].partitions == {"t": sorted(p.partition for p in metadata.partitions)}
    else:
        assert metadata.partitions == before and harness.log.records == []


@pytest.mark.parametrize(("state", "commit"), list(END_TABLE), ids=lambda v: getattr(v, "name", str(v)))
def test_end_transaction_in_every_state(harness: Harness, state: TransactionState, commit: bool) -> None:
    in_state(harness, state)
    error = run(harness, harness.coordinator.end_transaction(TID, PID, EPOCH, commit))
    run(harness, harness.settle())
    expected_error, state_after = END_TABLE[(state, commit)]
    assert error == expected_error
    assert harness.metadata().state == state_after
    if state == S.ONGOING:
        prepared = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        # Prepare, then the markers, then Complete: each written before it took effect.
        assert [value.state for _, value in harness.log.records] == [prepared, state_after]
        result = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
        assert harness.markers.sent == [TxnMarker(PID, EPOCH, 7, result, (T0,))]
        assert harness.metadata().partitions == set()


@pytest.mark.parametrize("state", ALL_STATES, ids=lambda s: s.name)
def test_a_wrong_producer_id_or_epoch_is_refused_in_every_state(harness: Harness, state: TransactionState) -> None:
    in_state(harness, state)
    c = harness.coordinator
    assert run(harness, c.add_partitions(TID, PID + 7, EPOCH, {T1})) == E.invalid_producer_id_mapping
    assert run(harness, c.end_transaction(TID, PID + 7, EPOCH, True)) == E.invalid_producer_id_mapping
    assert run(harness, c.add_partitions(TID, PID, EPOCH - 1, {T1})) == E.producer_fenced
    assert run(harness, c.end_transaction(TID, PID, EPOCH - 1, False)) == E.producer_fenced
    assert c.verify_partitions(TID, PID, EPOCH - 1, {T0}) == {T0: E.producer_fenced}
    assert harness.metadata().state == state and harness.log.records == []


def test_verify_only_checks_membership_of_the_ongoing_transaction(harness: Harness) -> None:
    in_state(harness, S.ONGOING)
    assert harness.coordinator.verify_partitions(TID, PID, EPOCH, {T0, T1}) == {
        T0: E.none,
        T1: E.invalid_txn_state,
    }
    assert harness.log.records == []  # verifying writes nothing


def test_unknown_ids_and_bad_arguments(harness: Harness) -> None:
    c = harness.coordinator
    assert run(harness, c.add_partitions("nobody", PID, EPOCH, {T0})) == E.invalid_producer_id_mapping
    assert run(harness, c.end_transaction("nobody", PID, EPOCH, True)) == E.invalid_producer_id_mapping
    assert run(harness, c.init_producer_id("", 1000, None)).error == E.invalid_request
    assert run(harness, c.init_producer_id(TID, 0, None)).error == E.invalid_transaction_timeout
    assert run(harness, c.init_producer_id(TID, 60_001, None)).error == E.invalid_transaction_timeout


def test_a_new_id_gets_a_fresh_producer_id_at_epoch_zero_and_keeps_it(harness: Harness) -> None:
    first = run(harness, harness.coordinator.init_producer_id("fresh", 1000, None))
    again = run(harness, harness.coordinator.init_producer_id("fresh", 1000, None))
    assert (first.error, first.producer_epoch) == (E.none, 0)
    assert (again.producer_id, again.producer_epoch) == (first.producer_id, 1)


def test_an_exhausted_epoch_rotates_the_producer_id(harness: Harness) -> None:
    metadata = in_state(harness, S.COMPLETE_COMMIT)
    metadata.producer_epoch = 0x7FFF - 1
    result = run(harness, harness.coordinator.init_producer_id(TID, 1000, (PID, 0x7FFF - 1)))
    assert (result.error, result.producer_epoch) == (E.none, 0)
    assert result.producer_id != PID and harness.metadata().last_producer_id == PID
    # A retry with the old id and its exhausted epoch (the answer was lost) is recognised.
    retry = run(harness, harness.coordinator.init_producer_id(TID, 1000, (PID, 0x7FFF - 1)))
    assert retry.error == E.none and retry.producer_id == result.producer_id


def test_kip360_bump_with_the_current_epoch_and_a_retried_one(harness: Harness) -> None:
    in_state(harness, S.COMPLETE_ABORT)
    bumped = run(harness, harness.coordinator.init_producer_id(TID, 1000, (PID, EPOCH)))
    assert (bumped.error, bumped.producer_epoch) == (E.none, EPOCH + 1)
    retried = run(harness, harness.coordinator.init_producer_id(TID, 1000, (PID, EPOCH)))
    assert (retried.error, retried.producer_epoch) == (E.none, EPOCH + 1)  # the lost answer again
    stale = run(harness, harness.coordinator.init_producer_id(TID, 1000, (PID, EPOCH - 3)))
    assert stale.error == E.producer_fenced
    other = run(harness, harness.coordinator.init_producer_id(TID, 1000, (PID + 50, 2)))
    assert other.error == E.producer_fenced


def test_a_failed_log_write_changes_nothing(harness: Harness) -> None:
    in_state(harness, S.ONGOING)
    harness.log.error = E.not_leader_or_follower
    assert run(harness, harness.coordinator.end_transaction(TID, PID, EPOCH, True)) == E.not_coordinator
    harness.log.error = E.request_timed_out
    assert run(harness, harness.coordinator.add_partitions(TID, PID, EPOCH, {T1})) == E.coordinator_not_available
    metadata = harness.metadata()
    assert (metadata.state, metadata.partitions, metadata.pending_state) == (S.ONGOING, {T0}, None)


def test_a_pending_transition_answers_concurrent_transactions(harness: Harness) -> None:
    metadata = in_state(harness, S.ONGOING)
    metadata.pending_state = S.PREPARE_COMMIT
    c = harness.coordinator
    assert run(harness, c.add_partitions(TID, PID, EPOCH, {T1})) == E.concurrent_transactions
    assert run(harness, c.end_transaction(TID, PID, EPOCH, True)) == E.concurrent_transactions
    assert run(harness, c.init_producer_id(TID, 1000, None)).error == E.concurrent_transactions


def test_verify_only_answers_while_partitions_are_being_added(harness: Harness) -> None:
    """The first write to a partition already in the transaction is confirmed while the producer's
    next AddPartitionsToTxn is in flight (Kafka checks no pending state here); the partition being
    added is not in the transaction until its record is in the log."""
    metadata = in_state(harness, S.ONGOING)
    metadata.pending_state = S.ONGOING
    assert harness.coordinator.verify_partitions(TID, PID, EPOCH, {T0, T1}) == {
        T0: E.none,
        T1: E.invalid_txn_state,
    }


def test_an_expired_transaction_is_aborted_with_a_bumped_epoch(harness: Harness) -> None:
    in_state(harness, S.ONGOING)
    c = harness.coordinator

    async def abort_timed_out() -> int:
        return c.abort_timed_out_transactions()

    assert run(harness, abort_timed_out()) == 0
    harness.clock.now += 10_001
    assert run(harness, abort_timed_out()) == 1
    run(harness, harness.settle())
    metadata = harness.metadata()
    assert (metadata.state, metadata.producer_epoch) == (S.COMPLETE_ABORT, EPOCH + 1)
    assert [(m.result, m.producer_epoch) for m in harness.markers.sent] == [(ControlRecordType.ABORT, EPOCH + 1)]
    # The abandoned producer is fenced.
    assert run(harness, c.end_transaction(TID, PID, EPOCH, True)) == E.producer_fenced


def test_markers_are_retried_until_every_partition_has_one(harness: Harness) -> None:
    metadata = in_state(harness, S.ONGOING)
    metadata.partitions = {T0, T1}
    harness.markers.errors[T1] = [E.not_leader_or_follower, E.not_enough_replicas]
    assert run(harness, harness.coordinator.end_transaction(TID, PID, EPOCH, True)) == E.none
    run(harness, harness.settle())
    assert harness.metadata().state == S.COMPLETE_COMMIT
    assert [sorted(m.partitions) for m in harness.markers.sent] == [[T0, T1], [T1], [T1]]


def test_markers_that_keep_failing_are_logged_naming_a_bounded_number_of_partitions(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A transaction of 12 partitions whose markers fail once: the stall log (here due at once)
    names the first 10 with their error and counts the rest, however many partitions there are."""
    monkeypatch.setattr(coordinator_module, "MARKER_STALL_LOG_S", 0.0)
    metadata = in_state(harness, S.ONGOING)
    partitions = {TopicPartition("t", p) for p in range(12)}
    metadata.partitions = set(partitions)
    for tp in partitions:
        harness.markers.errors[tp] = [E.not_leader_or_follower]
    with caplog.at_level(logging.WARNING, logger=coordinator_module.__name__):
        assert run(harness, harness.coordinator.end_transaction(TID, PID, EPOCH, True)) == E.none
        run(harness, harness.settle())
    assert harness.metadata().state == S.COMPLETE_COMMIT
    (stall,) = [r for r in caplog.records if r.getMessage() == "transaction markers not all written yet; retrying"]
    named = sorted(partitions, key=str)[:10]
    assert stall.__dict__["pending"] == ", ".join(f"{tp}: not_leader_or_follower" for tp in named) + ", and 2 more"


def test_a_fenced_coordinator_stops_writing_markers(harness: Harness) -> None:
    in_state(harness, S.ONGOING)
    harness.markers.errors[T0] = [E.transaction_coordinator_fenced]
    assert run(harness, harness.coordinator.end_transaction(TID, PID, EPOCH, False)) == E.none
    run(harness, harness.settle())
    # Left in PrepareAbort: the newer coordinator finishes it from the log.
    assert harness.metadata().state == S.PREPARE_ABORT


def test_idle_transactional_ids_expire_with_a_tombstone(harness: Harness) -> None:
    in_state(harness, S.COMPLETE_COMMIT).last_update_timestamp_ms = harness.clock.now
    c = harness.coordinator
    assert run(harness, c.remove_expired_transactional_ids()) == 0
    harness.clock.now += 3_600_000
    assert run(harness, c.remove_expired_transactional_ids()) == 1
    assert harness.log.records[-1] == (TID, None)
    assert c.state.get(TID)[2] is None


def test_unowned_partitions_answer_not_coordinator(harness: Harness) -> None:
    state = harness.coordinator.state
    state.unload(state.partition_of(TID))
    assert run(harness, harness.coordinator.init_producer_id(TID, 1000, None)).error == E.not_coordinator
    assert run(harness, harness.coordinator.end_transaction(TID, PID, EPOCH, True)) == E.not_coordinator


CALLS = {
    # call -> (state before, the call, state after once settled)
    "end_txn": (S.ONGOING, lambda c: c.end_transaction(TID, PID, EPOCH, True), S.COMPLETE_COMMIT),
    "add_partitions": (S.ONGOING, lambda c: c.add_partitions(TID, PID, EPOCH, {T1}), S.ONGOING),
    "init_producer_id": (S.COMPLETE_ABORT, lambda c: c.init_producer_id(TID, 1000, None), S.EMPTY),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_client_that_goes_away_during_a_write_leaves_no_pending_transition(harness: Harness, name: str) -> None:
    """The connection closes while the call's transition waits for the ISR (the broker cancels
    the connection's handler): the write still completes the transition, and a decided EndTxn
    still gets its markers, instead of the id answering CONCURRENT_TRANSACTIONS forever."""
    before, call, after = CALLS[name]
    in_state(harness, before)
    harness.log.replicated = asyncio.Event()

    async def disconnect_mid_write() -> None:
        handler = asyncio.ensure_future(call(harness.coordinator))
        while not harness.log.records:
            await asyncio.sleep(0)
        handler.cancel()  # what the network layer does when the client goes away
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert harness.log.replicated is not None
        harness.log.replicated.set()
        await harness.settle()

    run(harness, disconnect_mid_write())
    metadata = harness.metadata()
    assert (metadata.state, metadata.pending_state) == (after, None)
    if name == "end_txn":
        assert [m.result for m in harness.markers.sent] == [ControlRecordType.COMMIT]
