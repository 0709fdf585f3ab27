"""TransactionCoordinator: the classic transaction protocol (KIP-98, KIP-360, KIP-890 part 1).

A transactional producer's calls, as Kafka's TransactionCoordinator answers them:
InitProducerId (a producer id and the next epoch for a transactional id, fencing its older
producers), AddPartitionsToTxn and AddOffsetsToTxn (the partitions of the ongoing transaction),
EndTxn (PrepareCommit or PrepareAbort, then markers to every partition, then CompleteCommit or
CompleteAbort). Each transition is written to ``__transaction_state`` before it takes effect;
while one is pending the id answers CONCURRENT_TRANSACTIONS. EndTxn is answered once the Prepare
state is written: from then on the outcome is decided, and a coordinator that takes over the
partition (or this one after a restart) finishes the markers from the log.

Background jobs abort ongoing transactions that outlived their ``transaction.timeout.ms`` (with
a bumped epoch, so the abandoned producer is fenced) and remove transactional ids idle for
``transactional.id.expiration.ms``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from strom.broker.detached import DetachedTasks
from strom.broker.partition import TopicPartition
from strom.broker.transaction.log_records import TransactionState
from strom.broker.transaction.markers import TransactionMarkerChannel, TxnMarker
from strom.broker.transaction.metadata import (
    NO_PRODUCER_EPOCH,
    TransactionMetadata,
    TxnTransition,
    is_epoch_exhausted,
)
from strom.broker.transaction.state_manager import TRANSACTION_STATE_TOPIC, TransactionStateManager
from strom.protocol.errors import ErrorCode
from strom.records.control import ControlRecordType

log = logging.getLogger(__name__)

S = TransactionState
# Between rounds of markers to partitions without a leader or that failed.
MARKER_RETRY_BACKOFF_S = 0.1
MAX_MARKER_RETRY_BACKOFF_S = 2.0
# A transaction whose markers are still not all written after this long is logged (again every
# period): until then its id answers CONCURRENT_TRANSACTIONS, and an operator needs to see why.
MARKER_STALL_LOG_S = 5.0
# Partitions a stall log names (a transaction may span thousands); the rest are counted.
MARKER_STALL_LOG_PARTITIONS = 10


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    max_timeout_ms: int
    id_expiration_ms: int


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


class TransactionCoordinator:
    def __init__(
        self,
        config: TransactionConfig,
        state: TransactionStateManager,
        markers: TransactionMarkerChannel,
        generate_producer_id: Callable[[], Awaitable[int]],
        leader_of: Callable[[TopicPartition], int | None],
        *,
        follows_leadership: bool,
        time_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.config = config
        self.state = state
        self._markers = markers
        self._generate_producer_id = generate_producer_id
        # The leader of a partition: its broker id, -1 while it has none, None when it does not exist.
        self._leader_of = leader_of
        # In a cluster the coordinator follows the leadership of __transaction_state's partitions;
        # a single node is told about each partition when the topic is loaded or created.
        self.follows_leadership = follows_leadership
        self._time_ms = time_ms
        # Markers, fence aborts and loads in the background; a producer's calls run detached from
        # its connection, so a written transition is always applied (strom.broker.detached).
        self._tasks = DetachedTasks(log)

    def time_ms(self) -> int:
        return self._time_ms()

    # --- lifecycle ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        self._tasks.cancel_all()
        self._markers.close()

    def on_become_leader(self, tp: TopicPartition, leader_epoch: int) -> None:
        if tp.topic == TRANSACTION_STATE_TOPIC and not self.state.coordinates(tp.partition, leader_epoch):
            self._tasks.spawn(self._load(tp.partition, leader_epoch))

    def on_become_follower(self, tp: TopicPartition) -> None:
        if tp.topic == TRANSACTION_STATE_TOPIC:
            self.state.unload(tp.partition)

    async def _load(self, partition: int, leader_epoch: int) -> None:
        loaded = await self.state.load(partition, leader_epoch)
        if loaded is None:
            return
        # Decided transactions whose markers may not all have been written: finish them.
        for metadata in loaded.transactions:
            if metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                self._tasks.spawn(self._complete_transaction(metadata, loaded.coordinator_epoch))

    # --- InitProducerId ------------------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None
    ) -> InitProducerIdResult:
        """``expected``: the (producer id, epoch) a KIP-360 client sends to bump its own epoch."""
        return await self._tasks.run(self._init_producer_id(transactional_id, timeout_ms, expected))

    async def _init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None
    ) -> InitProducerIdResult:
        if not transactional_id:
            return InitProducerIdResult(ErrorCode.invalid_request)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return InitProducerIdResult(ErrorCode.invalid_transaction_timeout)
        error, coordinator_epoch, metadata = self.state.get(transactional_id)
        if error != ErrorCode.none:
            return InitProducerIdResult(error)
        if metadata is None:
            producer_id = await self._generate_producer_id()
            error, coordinator_epoch, metadata = self.state.get(transactional_id)
            if error != ErrorCode.none:
                return InitProducerIdResult(error)
            if metadata is None:
                metadata = self.state.put_if_absent(
                    TransactionMetadata(
                        transactional_id,
                        producer_id,
                        NO_PRODUCER_EPOCH,
                        timeout_ms,
                        last_update_timestamp_ms=self._time_ms(),
                    )
                )
        if expected is not None and not (
            metadata.producer_epoch == NO_PRODUCER_EPOCH
            or expected[0] == metadata.producer_id
            or (expected[0] == metadata.last_producer_id and is_epoch_exhausted(expected[1]))
        ):
            return InitProducerIdResult(ErrorCode.producer_fenced)
        if metadata.pending_transition_in_progress or metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return InitProducerIdResult(ErrorCode.concurrent_transactions)
        if metadata.state == S.ONGOING:
            # A new producer for this id while a transaction is open: abort it with a bumped
            # epoch (fencing the old producer); the client retries until the abort completes.
            metadata.prepare_fence_epoch()
            self._tasks.spawn(self._fence_and_abort(metadata, metadata.producer_epoch))
            return InitProducerIdResult(ErrorCode.concurrent_transactions)
        if metadata.state not in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            return InitProducerIdResult(ErrorCode.concurrent_transactions)  # Dead: being removed
        transition: TxnTransition | None
        if is_epoch_exhausted(metadata.producer_epoch) and (
            expected is None or expected[1] == metadata.producer_epoch
        ):
            producer_id = await self._generate_producer_id()
            if metadata.pending_transition_in_progress or not self.state.is_current(
                transactional_id, coordinator_epoch
            ):
                return InitProducerIdResult(ErrorCode.concurrent_transactions)
            transition = metadata.prepare_producer_id_rotation(
                producer_id, timeout_ms, self._time_ms(), record_last_epoch=expected is not None
            )
        else:
            transition = metadata.prepare_increment_epoch(
                timeout_ms, expected[1] if expected is not None else None, self._time_ms()
            )
            if transition is None:
                return InitProducerIdResult(ErrorCode.producer_fenced)
        error = await self._write(metadata, coordinator_epoch, transition)
        if error != ErrorCode.none:
            return InitProducerIdResult(error)
        return InitProducerIdResult(ErrorCode.none, metadata.producer_id, metadata.producer_epoch)

    # --- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------------

    def _producer_error(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> tuple[ErrorCode, int, TransactionMetadata | None]:
        """The checks every call of the producer's transaction starts with."""
        if not transactional_id:
            return ErrorCode.invalid_request, -1, None
        error, coordinator_epoch, metadata = self.state.get(transactional_id)
        if error != ErrorCode.none:
            return error, -1, None
        if metadata is None or metadata.producer_id != producer_id or metadata.state == S.DEAD:
            return ErrorCode.invalid_producer_id_mapping, -1, None
        if metadata.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced, -1, None
        return ErrorCode.none, coordinator_epoch, metadata

    async def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: set[TopicPartition]
    ) -> ErrorCode:
        return await self._tasks.run(self._add_partitions(transactional_id, producer_id, producer_epoch, partitions))

    async def _add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: set[TopicPartition]
    ) -> ErrorCode:
        error, coordinator_epoch, metadata = self._producer_error(transactional_id, producer_id, producer_epoch)
        if metadata is None:
            return error
        if metadata.pending_transition_in_progress or metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return ErrorCode.concurrent_transactions
        if metadata.state == S.ONGOING and partitions <= metadata.partitions:
            return ErrorCode.none  # nothing new to write
        transition = metadata.prepare_add_partitions(partitions, self._time_ms())
        return await self._write(metadata, coordinator_epoch, transition)

    def verify_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: set[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """KIP-890's verify-only AddPartitionsToTxn: are these partitions in the ongoing transaction?

        A pending transition is no reason to refuse, as in Kafka: partitions join ``metadata`` only
        once their AddPartitionsToTxn is in the log, and the append re-checks its verification
        guard. Refusing would answer a retriable error to the first write of a partition already
        added while the producer adds the next one, and librdkafka, aborting meanwhile, keeps
        such retries queued until its flush gives up."""
        error, _, metadata = self._producer_error(transactional_id, producer_id, producer_epoch)
        if metadata is None:
            return dict.fromkeys(partitions, error)
        if metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return dict.fromkeys(partitions, ErrorCode.concurrent_transactions)
        ongoing = metadata.state == S.ONGOING
        return {
            tp: ErrorCode.none if ongoing and tp in metadata.partitions else ErrorCode.invalid_txn_state
            for tp in partitions
        }

    # --- EndTxn --------------------------------------------------------------------------------

    async def end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        *,
        from_client: bool = True,
    ) -> ErrorCode:
        return await self._tasks.run(
            self._end_transaction(transactional_id, producer_id, producer_epoch, commit, from_client)
        )

    async def _end_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool, from_client: bool
    ) -> ErrorCode:
        if not transactional_id:
            return ErrorCode.invalid_request
        error, coordinator_epoch, metadata = self.state.get(transactional_id)
        if error != ErrorCode.none:
            return error
        if metadata is None or metadata.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if (from_client and producer_epoch != metadata.producer_epoch) or producer_epoch < metadata.producer_epoch:
            return ErrorCode.producer_fenced
        if metadata.pending_state is not None and metadata.pending_state != S.PREPARE_EPOCH_FENCE:
            return ErrorCode.concurrent_transactions
        state = metadata.state
        if state == S.ONGOING:
            transition = metadata.prepare_abort_or_commit(
                S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, self._time_ms()
            )
            error = await self._write(metadata, coordinator_epoch, transition)
            if error == ErrorCode.none:
                self._tasks.spawn(self._complete_transaction(metadata, coordinator_epoch))
            return error
        if state == S.COMPLETE_COMMIT:
            return ErrorCode.none if commit else ErrorCode.invalid_txn_state
        if state == S.COMPLETE_ABORT:
            return ErrorCode.none if not commit else ErrorCode.invalid_txn_state
        if state == S.PREPARE_COMMIT:
            return ErrorCode.concurrent_transactions if commit else ErrorCode.invalid_txn_state
        if state == S.PREPARE_ABORT:
            return ErrorCode.concurrent_transactions if not commit else ErrorCode.invalid_txn_state
        return ErrorCode.invalid_txn_state  # Empty (nothing to end), Dead

    async def _fence_and_abort(self, metadata: TransactionMetadata, epoch: int) -> None:
        error = await self._end_transaction(
            metadata.transactional_id, metadata.producer_id, epoch, commit=False, from_client=False
        )
        if error != ErrorCode.none:
            metadata.abandon()  # the fence's pending state, if the abort never got to clear it
            log.warning(
                "aborting a fenced transaction failed; the next attempt will retry",
                extra={"transactional_id": metadata.transactional_id, "error": error.name},
            )

    async def _write(
        self, metadata: TransactionMetadata, coordinator_epoch: int, transition: TxnTransition
    ) -> ErrorCode:
        error = await self.state.append(metadata.transactional_id, coordinator_epoch, transition)
        if error != ErrorCode.none:
            metadata.abandon()
            return error
        metadata.complete(transition)
        return ErrorCode.none

    # --- markers, then Complete ------------------------------------------------------------------

    async def _complete_transaction(self, metadata: TransactionMetadata, coordinator_epoch: int) -> None:
        """Write the decided outcome's markers to every partition of the transaction, then the
        Complete state. Stops when this broker no longer coordinates the id in this epoch: the
        new coordinator loads the Prepare state and finishes the job."""
        transactional_id = metadata.transactional_id
        result = ControlRecordType.COMMIT if metadata.state == S.PREPARE_COMMIT else ControlRecordType.ABORT
        producer_id, producer_epoch = metadata.producer_id, metadata.producer_epoch
        pending = set(metadata.partitions)
        backoff = MARKER_RETRY_BACKOFF_S
        started = time.monotonic()
        next_stall_log = started + MARKER_STALL_LOG_S
        while pending:
            if not self.state.is_current(transactional_id, coordinator_epoch):
                return
            by_leader: dict[int, list[TopicPartition]] = {}
            # Why each partition is still pending, for the stall log: an error or "no leader".
            why: dict[TopicPartition, str] = {}
            for tp in list(pending):
                leader = self._leader_of(tp)
                if leader is None:
                    pending.discard(tp)  # deleted: nothing to mark
                elif leader >= 0:
                    by_leader.setdefault(leader, []).append(tp)
                else:
                    why[tp] = "no leader"
            sends = [
                self._markers.send(
                    leader, TxnMarker(producer_id, producer_epoch, coordinator_epoch, result, tuple(tps))
                )
                for leader, tps in by_leader.items()
            ]
            for (leader, tps), answer in zip(
                by_leader.items(), await asyncio.gather(*sends, return_exceptions=True), strict=True
            ):
                if isinstance(answer, BaseException):
                    if isinstance(answer, asyncio.CancelledError):
                        raise answer
                    # Not a Kafka error: say it, and retry as for a leader that cannot be reached.
                    log.error(
                        "sending transaction markers failed",
                        extra={"transactional_id": transactional_id, "broker": leader},
                        exc_info=answer,
                    )
                    why.update(dict.fromkeys(tps, type(answer).__name__))
                    continue
                for tp, error in answer.items():
                    if error == ErrorCode.none:
                        pending.discard(tp)
                    elif error == ErrorCode.transaction_coordinator_fenced:
                        log.warning(
                            "a newer coordinator owns the transaction; stopped writing its markers",
                            extra={"transactional_id": transactional_id, "partition": str(tp)},
                        )
                        return
                    elif error == ErrorCode.invalid_producer_epoch:
                        # The partition holds a newer epoch of the producer than this transaction's:
                        # a marker can no longer apply there (Kafka gives up on it too).
                        log.error(
                            "transaction marker refused for an old producer epoch",
                            extra={"transactional_id": transactional_id, "partition": str(tp)},
                        )
                        pending.discard(tp)
                    else:
                        why[tp] = error.name
            if pending:
                now = time.monotonic()
                if now >= next_stall_log:
                    next_stall_log = now + MARKER_STALL_LOG_S
                    log.warning(
                        "transaction markers not all written yet; retrying",
                        extra={
                            "transactional_id": transactional_id,
                            "result": result.name,
                            "seconds": round(now - started, 1),
                            "pending": _stalled(pending, why),
                        },
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_MARKER_RETRY_BACKOFF_S)
        backoff = MARKER_RETRY_BACKOFF_S
        while self.state.is_current(transactional_id, coordinator_epoch):
            if metadata.pending_transition_in_progress:
                await asyncio.sleep(backoff)
                continue
            error = await self._write(metadata, coordinator_epoch, metadata.prepare_complete(self._time_ms()))
            if error in (ErrorCode.none, ErrorCode.not_coordinator):
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_MARKER_RETRY_BACKOFF_S)

    # --- background jobs -------------------------------------------------------------------------

    def abort_timed_out_transactions(self) -> int:
        """Abort every ongoing transaction past its timeout, fencing its producer; returns how many."""
        now = self._time_ms()
        aborted = 0
        for _, metadata in self.state.transactions():
            if (
                metadata.state == S.ONGOING
                and not metadata.pending_transition_in_progress
                and metadata.start_timestamp_ms + metadata.timeout_ms < now
            ):
                log.info(
                    "aborting a transaction that passed its timeout",
                    extra={
                        "transactional_id": metadata.transactional_id,
                        "producer_id": metadata.producer_id,
                        "timeout_ms": metadata.timeout_ms,
                    },
                )
                metadata.prepare_fence_epoch()
                self._tasks.spawn(self._fence_and_abort(metadata, metadata.producer_epoch))
                aborted += 1
        return aborted

    async def remove_expired_transactional_ids(self) -> int:
        """Tombstone the ids with no transaction for transactional.id.expiration.ms."""
        now = self._time_ms()
        removed = 0
        for coordinator_epoch, metadata in list(self.state.transactions()):
            if (
                metadata.state not in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
                or metadata.pending_transition_in_progress
                or metadata.last_update_timestamp_ms + self.config.id_expiration_ms > now
            ):
                continue
            if await self._write(metadata, coordinator_epoch, metadata.prepare_dead()) == ErrorCode.none:
                self.state.remove(metadata)
                removed += 1
        return removed


def _stalled(pending: set[TopicPartition], why: dict[TopicPartition, str]) -> str:
    """The first partitions still without their marker, each with why, and how many more."""
    named = sorted(pending, key=str)[:MARKER_STALL_LOG_PARTITIONS]
    text = ", ".join(f"{tp}: {why.get(tp, '?')}" for tp in named)
    more = len(pending) - len(named)
    return f"{text}, and {more} more" if more else text
