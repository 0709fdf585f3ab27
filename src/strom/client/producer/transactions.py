"""The transactional producer: Kafka's TransactionManager (KIP-98, KIP-360), on the event loop.

The idempotent half (producer id and epoch, sequences per partition) is
IdempotenceManager's; this adds the transactional id and the transaction's life.
``init_transactions`` finds the transaction coordinator (FindCoordinator, key type 1) and
takes the producer id and epoch from it (InitProducerId with the transactional id), which
fences every older producer of that id. Inside a transaction each partition a record goes
to is added to it (AddPartitionsToTxn, every partition new since the last request in one)
before the sender may drain its batches; ``send_offsets_to_transaction`` adds the group
(AddOffsetsToTxn) and then writes the offsets to the group coordinator (TxnOffsetCommit);
commit and abort wait until every batch of the transaction completed, then end it (EndTxn).

Transactional requests go one at a time and are retried (after ``retry.backoff.ms``) while
the coordinator moves, loads or is still completing the previous transaction. Errors are
classified as the Java client does: fatal ones (fenced, not authorized, unsupported, an
unexpected answer) leave a producer that can only be closed; abortable ones (a batch that
failed inside the transaction, an unknown producer id, a refused group) fail the
transaction, which the application aborts before going on. After an abortable error the
abort also bumps the epoch (InitProducerId with the current producer id and epoch,
KIP-360) when the coordinator supports it (InitProducerId v3+), so the partitions'
sequences start again at 0.

The caller's thread only reads the state (``fail_if_not_ready_for_send``) and registers
partitions (``maybe_add_partition``, under a lock); everything else runs on the loop.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from strom.client.cluster import TopicPartition
from strom.client.consumer.structs import ConsumerGroupMetadata
from strom.client.errors import (
    KafkaException,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionFatalError,
)
from strom.client.network_client import GROUP_KEY, TRANSACTION_KEY, NetworkClient
from strom.client.producer.accumulator import ProducerBatch
from strom.client.producer.idempotence import IdempotenceManager, increment_sequence
from strom.network.connection import (
    BrokerConnection,
    KafkaConnectionError,
    RequestTimeoutError,
    UnsupportedVersionError,
)
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.framing import ProtocolError
from strom.protocol.messages import build

log = logging.getLogger(__name__)

INIT_PRODUCER_ID_MAX_VERSION = 5
# v4+ are the brokers' batched verify-only form (KIP-890); a client adds its partitions with v3.
ADD_PARTITIONS_TO_TXN_MAX_VERSION = 3
# v5 of these belongs to KIP-890 part 2 (transaction.version 2), which the client does not speak.
ADD_OFFSETS_TO_TXN_MAX_VERSION = 4
END_TXN_MAX_VERSION = 4
TXN_OFFSET_COMMIT_MAX_VERSION = 4
# CONCURRENT_TRANSACTIONS for a transaction's first AddPartitionsToTxn means the previous one is
# still writing its markers: ask again soon rather than after retry.backoff.ms.
_ADD_PARTITIONS_RETRY_BACKOFF = 0.02


class TransactionState(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


_S = TransactionState
# The states each state may be entered from (FATAL_ERROR from any).
_SOURCES: dict[TransactionState, frozenset[TransactionState]] = {
    _S.UNINITIALIZED: frozenset({_S.READY}),
    _S.INITIALIZING: frozenset({_S.UNINITIALIZED, _S.ABORTING_TRANSACTION}),
    _S.READY: frozenset({_S.INITIALIZING, _S.COMMITTING_TRANSACTION, _S.ABORTING_TRANSACTION}),
    _S.IN_TRANSACTION: frozenset({_S.READY}),
    _S.COMMITTING_TRANSACTION: frozenset({_S.IN_TRANSACTION}),
    _S.ABORTING_TRANSACTION: frozenset({_S.IN_TRANSACTION, _S.ABORTABLE_ERROR}),
    _S.ABORTABLE_ERROR: frozenset({_S.IN_TRANSACTION, _S.COMMITTING_TRANSACTION, _S.ABORTABLE_ERROR}),
}

# Errors of a produce that end the producer rather than the transaction.
_FATAL_BATCH_ERRORS = frozenset(
    {
        ErrorCode.producer_fenced,
        ErrorCode.transactional_id_authorization_failed,
        ErrorCode.cluster_authorization_failed,
        ErrorCode.unsupported_version,
    }
)
_FENCED = frozenset({ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch})
_RELOOKUP = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available})
_RETRY = frozenset({ErrorCode.coordinator_load_in_progress, ErrorCode.concurrent_transactions})
_LOST_PRODUCER_ID = frozenset({ErrorCode.unknown_producer_id, ErrorCode.invalid_producer_id_mapping})
# What _classify answers alike for every request to the transaction coordinator.
_COORDINATOR_ERRORS = (
    _RELOOKUP | _RETRY | _FENCED | _LOST_PRODUCER_ID | {ErrorCode.transactional_id_authorization_failed}
)


class _Retry(Exception):
    """A transactional request is to be sent again (after a backoff; ``relookup``: find the coordinator first)."""

    def __init__(self, relookup: bool = False, backoff: float | None = None) -> None:
        super().__init__()
        self.relookup = relookup
        self.backoff = backoff


def _fenced() -> ProducerFencedError:
    return ProducerFencedError(
        "there is a newer producer with the same transactional.id, which fenced this one",
        ErrorCode.producer_fenced,
    )


class TransactionManager(IdempotenceManager):
    """The state of a transactional producer (one per ``transactional.id``)."""

    def __init__(
        self,
        *,
        transactional_id: str,
        transaction_timeout_ms: int,
        client: NetworkClient,
        retry_backoff: float,
    ) -> None:
        super().__init__()
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.client = client
        self.retry_backoff = retry_backoff
        self.state = TransactionState.UNINITIALIZED
        self.last_error: KafkaException | None = None
        # Wakes the sender (set by the producer); waits until every batch sent so far completed.
        self.wakeup: Callable[[], None] = lambda: None
        self.flush: Callable[[], Awaitable[None]] = _nothing
        self._lock = threading.Lock()  # the partition sets: send() adds from the caller's thread
        self._new_partitions: set[TopicPartition] = set()
        self._pending_partitions: set[TopicPartition] = set()
        self.partitions_in_transaction: set[TopicPartition] = set()
        self._transaction_started = False
        self._coordinator_supports_bump = False
        self._coordinators: dict[tuple[int, str], int] = {}
        self._request_lock = asyncio.Lock()  # one transactional request at a time
        self._add_partitions_task: asyncio.Task[None] | None = None
        # commit/abort/init that timed out keep going; calling the same method again waits for them.
        self._pending: tuple[TransactionState, asyncio.Task[None]] | None = None

    # -- state -----------------------------------------------------------------------------

    @property
    def has_fatal_error(self) -> bool:
        return self.state is TransactionState.FATAL_ERROR

    @property
    def has_abortable_error(self) -> bool:
        return self.state is TransactionState.ABORTABLE_ERROR

    @property
    def has_ongoing_transaction(self) -> bool:
        """Begun and not yet ended (nor failed fatally)."""
        return self.state in (
            TransactionState.IN_TRANSACTION,
            TransactionState.COMMITTING_TRANSACTION,
            TransactionState.ABORTING_TRANSACTION,
            TransactionState.ABORTABLE_ERROR,
        )

    @property
    def is_completing(self) -> bool:
        return self.state in (TransactionState.COMMITTING_TRANSACTION, TransactionState.ABORTING_TRANSACTION)

    def _transition(self, target: TransactionState, error: KafkaException | None = None) -> None:
        if target is not TransactionState.FATAL_ERROR and self.state not in _SOURCES[target]:
            raise KafkaException(
                f"transactional id {self.transactional_id}: invalid transition from {self.state.name} "
                f"to {target.name}"
            )
        log.debug("transactional id %s: %s -> %s", self.transactional_id, self.state.name, target.name)
        self.last_error = error
        self.state = target

    def _fatal(self, error: KafkaException) -> KafkaException:
        """Enter FATAL_ERROR; returns the error (a TransactionFatalError) for the caller to raise."""
        if not isinstance(error, TransactionFatalError):
            error = TransactionFatalError(str(error), error.error_code)
        if not self.has_fatal_error:
            log.error("transactional id %s: fatal error: %s", self.transactional_id, error)
            self._transition(TransactionState.FATAL_ERROR, error)
        return error

    def _abortable(self, error: KafkaException, bump_epoch: bool = False) -> KafkaException:
        """Enter ABORTABLE_ERROR (``bump_epoch``: the abort must bump the epoch, or failing that this is fatal).

        Returns the error (a TransactionAbortableError) for the caller to raise.
        """
        if not isinstance(error, TransactionAbortableError):
            error = TransactionAbortableError(str(error), error.error_code)
        if bump_epoch:
            if not self._coordinator_supports_bump:
                return self._fatal(error)
            self.epoch_bump_required = True
        if self.state is TransactionState.ABORTING_TRANSACTION or self.has_fatal_error:
            return error  # already on its way out
        log.info("transactional id %s: the transaction must be aborted: %s", self.transactional_id, error)
        self._transition(TransactionState.ABORTABLE_ERROR, error)
        self.wakeup()  # the sender fails the transaction's queued batches
        return error

    def _raise_if_failed(self) -> None:
        """Java's maybeFailWithError: a transactional method in an error state raises that error."""
        error = self.last_error
        if self.has_fatal_error:
            assert error is not None
            if isinstance(error, ProducerFencedError):
                raise _fenced()
            raise TransactionFatalError(
                f"the transactional producer failed and can only be closed: {error}", error.error_code
            ) from error
        if self.has_abortable_error:
            assert error is not None
            raise TransactionAbortableError(
                f"the transaction failed and must be aborted: {error}", error.error_code
            ) from error

    def _ensure_initialized(self) -> None:
        if not self.has_producer_id or self.state is TransactionState.INITIALIZING:
            raise KafkaException("call init_transactions() first")

    # -- the caller's side -------------------------------------------------------------------

    def fail_if_not_ready_for_send(self) -> None:
        state = self.state
        if state is TransactionState.IN_TRANSACTION:
            return
        self._raise_if_failed()
        if not self.has_producer_id:
            raise KafkaException("cannot send before init_transactions() completed")
        raise KafkaException(f"cannot send in state {state.name}: begin_transaction() first")

    def maybe_add_partition(self, tp: TopicPartition) -> None:
        """A record went to ``tp``: add it to the transaction before its batches are sent."""
        if tp in self.partitions_in_transaction:
            return
        with self._lock:
            if tp in self._pending_partitions or tp in self._new_partitions:
                return
            self._new_partitions.add(tp)
        self.wakeup()

    def begin_transaction(self) -> None:
        self._raise_if_failed()
        self._ensure_initialized()
        self._transition(TransactionState.IN_TRANSACTION)

    # -- operations the application waits for --------------------------------------------------

    async def init_transactions(self, timeout: float) -> None:
        task = self._resume(TransactionState.INITIALIZING)
        if task is None:
            self._transition(TransactionState.INITIALIZING)
            task = self._start(TransactionState.INITIALIZING, self._initialize(bump=False))
        await self._wait(task, timeout, "init_transactions")

    async def commit_transaction(self, timeout: float) -> None:
        task = self._resume(TransactionState.COMMITTING_TRANSACTION)
        if task is None:
            self._raise_if_failed()
            self._transition(TransactionState.COMMITTING_TRANSACTION)
            task = self._start(TransactionState.COMMITTING_TRANSACTION, self._complete(True, end_txn=True))
        await self._wait(task, timeout, "commit_transaction")

    async def abort_transaction(self, timeout: float) -> None:
        task = self._resume(TransactionState.ABORTING_TRANSACTION)
        if task is None:
            if not self.has_abortable_error:
                self._raise_if_failed()
            # INVALID_PRODUCER_ID_MAPPING: the coordinator forgot the producer; only a new epoch helps.
            lost = (
                self.last_error is not None
                and self.last_error.error_code == ErrorCode.invalid_producer_id_mapping
            )
            self._transition(TransactionState.ABORTING_TRANSACTION)
            with self._lock:
                self._new_partitions.clear()  # nothing more goes out in this transaction
            self.wakeup()  # the sender fails the batches not sent yet
            task = self._start(TransactionState.ABORTING_TRANSACTION, self._complete(False, end_txn=not lost))
        await self._wait(task, timeout, "abort_transaction")

    async def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, Any], group: ConsumerGroupMetadata, timeout: float
    ) -> None:
        """``offsets``: OffsetAndMetadata-like values (``offset``, ``metadata``, ``leader_epoch``) by partition."""
        self._raise_if_failed()
        if self.state is not TransactionState.IN_TRANSACTION:
            raise KafkaException("cannot send offsets to the transaction: no transaction is in progress")
        task = asyncio.ensure_future(self._send_offsets(dict(offsets), group))
        await self._wait(task, timeout, "send_offsets_to_transaction")

    def _resume(self, target: TransactionState) -> asyncio.Task[None] | None:
        pending = self._pending
        if pending is not None and pending[0] is target and (self.state is target or not pending[1].done()):
            return pending[1]
        return None

    def _start(self, target: TransactionState, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._pending = (target, task)
        return task

    async def _wait(self, task: asyncio.Task[None], timeout: float, what: str) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            raise KafkaTimeoutError(
                f"{what} did not complete within {timeout * 1000:.0f} ms; calling it again waits on"
            ) from None
        finally:
            if task.done() and self._pending is not None and self._pending[1] is task:
                self._pending = None

    async def _initialize(self, bump: bool) -> None:
        async with self._request_lock:
            await self._init_producer_id(bump)
        self._transition(TransactionState.READY)

    async def _complete(self, commit: bool, end_txn: bool) -> None:
        await self.flush()  # EndTxn goes only once every batch of the transaction completed
        if commit:
            self._raise_if_failed()
        async with self._request_lock:
            if self._transaction_started and end_txn:
                await self._end_txn(commit)
            bump = self.epoch_bump_required
            self._complete_transaction(bump)
            if bump:
                await self._init_producer_id(bump=True)
                self._transition(TransactionState.READY)

    def _complete_transaction(self, bump: bool) -> None:
        self._transition(TransactionState.INITIALIZING if bump else TransactionState.READY)
        self._transaction_started = False
        with self._lock:
            self._new_partitions.clear()
            self._pending_partitions.clear()
            self.partitions_in_transaction.clear()

    # -- the sender's side -------------------------------------------------------------------

    def undrained_batch_error(self) -> Exception | None:
        """The error to fail queued batches with: the transaction failed or is being aborted."""
        if self.has_fatal_error or self.has_abortable_error:
            return self.last_error
        if self.state is TransactionState.ABORTING_TRANSACTION:
            return TransactionAbortedError("the transaction was aborted before this record was sent")
        return None

    def maybe_add_partitions(self) -> None:
        """Start an AddPartitionsToTxn for the partitions new to the transaction (one at a time)."""
        if not self._new_partitions or (
            self._add_partitions_task is not None and not self._add_partitions_task.done()
        ):
            return
        if self.state not in (TransactionState.IN_TRANSACTION, TransactionState.COMMITTING_TRANSACTION):
            return
        self._add_partitions_task = asyncio.ensure_future(self._add_partitions())

    def should_stop_drain(self, first: ProducerBatch) -> bool:
        if first.tp not in self.partitions_in_transaction or self.has_fatal_error:
            return True
        return super().should_stop_drain(first)

    def bump_epoch_if_needed(self) -> None:
        """A transactional producer bumps its epoch through the coordinator when it aborts, never locally."""

    def can_retry(self, error: ErrorCode, log_start_offset: int, batch: ProducerBatch) -> bool:
        """Java's TransactionManager.canRetry for a transactional producer: a lost sequence fails the transaction."""
        tp = batch.tp
        if error == ErrorCode.unknown_producer_id:
            return log_start_offset == -1 or batch.sequence_reset
        if error == ErrorCode.out_of_order_sequence_number:
            # Not the next batch the broker expects: an earlier one failed and is being retried.
            return tp not in self._unresolved and (
                batch.sequence_reset or not self._is_next_sequence(tp, batch.base_sequence)
            )
        return bool(error.retriable)

    def handle_failed_batch(
        self,
        batch: ProducerBatch,
        error: ErrorCode | None,
        adjust_sequences: bool,
        exception: Exception | None = None,
    ) -> None:
        if isinstance(exception, KafkaException) and exception.error_code in _FATAL_BATCH_ERRORS:
            self._fatal(_fenced() if exception.error_code == ErrorCode.producer_fenced else exception)
        elif exception is not None and exception is not self.last_error:
            failure = exception if isinstance(exception, KafkaException) else KafkaException(str(exception))
            # Java bumps the epoch after any failed batch while the transaction is open (KIP-360).
            if self._coordinator_supports_bump and not self.is_completing:
                self.epoch_bump_required = True
            self._abortable(failure)
        tp = batch.tp
        entry = self._partitions.get(tp)
        if entry is not None:
            entry.remove(batch)
        if self.has_fatal_error or not batch.has_sequence:
            return
        if error == ErrorCode.unknown_producer_id:
            # The broker has no state for us: the partition starts again at sequence 0.
            self._partitions.pop(tp, None)
            self._unresolved.pop(tp, None)
        elif adjust_sequences and not self.epoch_bump_required and entry is not None:
            self._adjust_sequences(batch)

    def _adjust_sequences(self, failed: ProducerBatch) -> None:
        """The broker certainly refused ``failed``: the partition's later batches move down into its sequences."""
        entry = self._partitions[failed.tp]
        entry.next_sequence = increment_sequence(entry.next_sequence, -failed.record_count)
        for batch in entry.in_flight:
            if batch.base_sequence > failed.base_sequence:
                batch.reset_producer_state(
                    batch.producer_id, batch.producer_epoch, batch.base_sequence - failed.record_count
                )
        entry.sequences = [batch.base_sequence for batch in entry.in_flight]

    def maybe_resolve_sequences(self) -> None:
        """Batches expired unacknowledged and nothing is in flight: whether they were appended is unknown."""
        for tp in list(self._unresolved):
            entry = self._entry(tp)
            if entry.in_flight:
                continue
            del self._unresolved[tp]
            if not self._is_next_sequence(tp, entry.next_sequence):
                error = KafkaException(
                    f"records sent to {tp} were never acknowledged and can no longer be retried"
                )
                self._abortable(error, bump_epoch=True)

    # -- requests ------------------------------------------------------------------------------

    async def _coordinator(self, key_type: int, key: str) -> int:
        node = self._coordinators.get((key_type, key))
        while node is None:
            try:
                found = await self.client.find_coordinator(key, key_type)
            except UnsupportedVersionError as exc:
                raise self._fatal(
                    TransactionFatalError(f"FindCoordinator: {exc}", ErrorCode.unsupported_version)
                ) from None
            except (KafkaConnectionError, RequestTimeoutError, ProtocolError) as exc:
                log.debug("FindCoordinator(%s) failed: %s", key, exc)
            except KafkaException as exc:
                code = exc.error_code
                if code == ErrorCode.transactional_id_authorization_failed:
                    raise self._fatal(exc) from None
                if code == ErrorCode.group_authorization_failed:
                    raise self._abortable(exc) from None
                if code is None or not code.retriable:
                    raise self._fatal(exc) from None
            else:
                node = self._coordinators[(key_type, key)] = found.node_id
                log.info(
                    "%s coordinator for %s: broker %d",
                    "group" if key_type == GROUP_KEY else "transaction",
                    key,
                    node,
                )
                break
            await asyncio.sleep(self.retry_backoff)
        return node

    async def _request(
        self,
        what: str,
        build_request: Callable[[BrokerConnection], Any],
        key_type: int = TRANSACTION_KEY,
        key: str = "",
    ) -> Any:
        """Send to the coordinator of ``key`` (the transactional id unless given); raises _Retry when it failed."""
        key = key or self.transactional_id
        node = await self._coordinator(key_type, key)
        try:
            return await self.client.send(node, build_request)
        except UnsupportedVersionError as exc:
            raise self._fatal(
                TransactionFatalError(f"{what}: {exc}", ErrorCode.unsupported_version)
            ) from None
        except (KafkaConnectionError, RequestTimeoutError, ProtocolError) as exc:
            log.debug("%s to broker %d failed: %s", what, node, exc)
            self._coordinators.pop((key_type, key), None)
            raise _Retry() from None

    async def _retrying(
        self, attempt: Callable[[], Awaitable[None]], key_type: int = TRANSACTION_KEY, key: str = ""
    ) -> None:
        """Run ``attempt`` until it no longer asks to be retried."""
        while True:
            try:
                await attempt()
                return
            except _Retry as retry:
                if retry.relookup:
                    self._coordinators.pop((key_type, key or self.transactional_id), None)
                await asyncio.sleep(self.retry_backoff if retry.backoff is None else retry.backoff)

    def _classify(self, what: str, code: ErrorCode) -> KafkaException:
        """The errors every request to the transaction coordinator answers alike; raises _Retry for a retry."""
        if code in _RELOOKUP:
            raise _Retry(relookup=True)
        if code in _RETRY:
            raise _Retry()
        if code in _FENCED:
            # INVALID_PRODUCER_EPOCH is how older coordinators say PRODUCER_FENCED.
            return self._fatal(_fenced())
        error = KafkaException.from_code(code, what)
        if code in (ErrorCode.transactional_id_authorization_failed, ErrorCode.cluster_authorization_failed):
            return self._fatal(error)
        if code in _LOST_PRODUCER_ID:
            return self._abortable(error, bump_epoch=True)
        if code == ErrorCode.transaction_abortable:
            return self._abortable(error)
        return self._fatal(error)

    async def _init_producer_id(self, bump: bool) -> None:
        """InitProducerId with the transactional id (``bump``: with the current id and epoch, KIP-360)."""
        producer_id, producer_epoch = (self.producer_id, self.producer_epoch) if bump else (-1, -1)

        def build_request(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_MAX_VERSION)
            self._coordinator_supports_bump = version >= 3
            return build(
                request_module(ApiKey.INIT_PRODUCER_ID, version).InitProducerIdRequest,
                transactional_id=self.transactional_id,
                transaction_timeout=datetime.timedelta(milliseconds=self.transaction_timeout_ms),
                producer_id=producer_id,
                producer_epoch=producer_epoch,
            )

        async def attempt() -> None:
            response = await self._request("InitProducerId", build_request)
            code = ErrorCode(response.error_code)
            if code == ErrorCode.none:
                self.set_producer_id_and_epoch(int(response.producer_id), int(response.producer_epoch))
                if bump:
                    self._partitions.clear()
                    self._unresolved.clear()
                    self.epoch_bump_required = False
                return
            if code in _LOST_PRODUCER_ID or code == ErrorCode.transaction_abortable:
                raise self._fatal(KafkaException.from_code(code, "InitProducerId"))
            raise self._classify("InitProducerId", code)

        await self._retrying(attempt)

    async def _add_partitions(self) -> None:
        try:
            async with self._request_lock:
                await self._add_partitions_locked()
        except KafkaException:
            pass  # recorded in the state: the sender and the next transactional call see it
        finally:
            self.wakeup()

    async def _add_partitions_locked(self) -> None:
        with self._lock:
            self._pending_partitions |= self._new_partitions
            self._new_partitions.clear()
            partitions = sorted(self._pending_partitions)
        if not partitions or self.has_fatal_error or self.state is TransactionState.ABORTING_TRANSACTION:
            return

        def build_request(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.ADD_PARTITIONS_TO_TXN, ADD_PARTITIONS_TO_TXN_MAX_VERSION)
            module = request_module(ApiKey.ADD_PARTITIONS_TO_TXN, version)
            by_topic: dict[str, list[int]] = {}
            for tp in partitions:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            return module.AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=self.transactional_id,
                v3_and_below_producer_id=self.producer_id,
                v3_and_below_producer_epoch=self.producer_epoch,
                v3_and_below_topics=tuple(
                    module.AddPartitionsToTxnTopic(name=topic, partitions=tuple(indexes))
                    for topic, indexes in by_topic.items()
                ),
            )

        async def attempt() -> None:
            if self.state is TransactionState.ABORTING_TRANSACTION or self.has_fatal_error:
                return  # nothing of this transaction is sent any more
            response = await self._request("AddPartitionsToTxn", build_request)
            errors = {
                TopicPartition(topic.name, result.partition_index): ErrorCode(result.partition_error_code)
                for topic in response.results_by_topic_v3_and_below
                for result in topic.results_by_partition
            }
            failed: dict[TopicPartition, ErrorCode] = {}
            for tp, code in errors.items():
                if code == ErrorCode.none:
                    continue
                if code == ErrorCode.concurrent_transactions and not self.partitions_in_transaction:
                    raise _Retry(backoff=min(self.retry_backoff, _ADD_PARTITIONS_RETRY_BACKOFF))
                if code == ErrorCode.unknown_topic_or_partition:
                    raise _Retry()
                if code == ErrorCode.invalid_txn_state:
                    raise self._fatal(KafkaException.from_code(code, f"AddPartitionsToTxn({tp})"))
                if code in _COORDINATOR_ERRORS:
                    raise self._classify(f"AddPartitionsToTxn({tp})", code)
                # Refused topics, OPERATION_NOT_ATTEMPTED (another partition failed), the unexpected.
                failed[tp] = code
            with self._lock:
                self._pending_partitions -= errors.keys()
            if failed:
                names = ", ".join(f"{tp}: {code.name.upper()}" for tp, code in sorted(failed.items()))
                raise self._abortable(
                    KafkaException(
                        f"could not add partitions to the transaction: {names}", next(iter(failed.values()))
                    )
                )
            self.partitions_in_transaction.update(errors)
            self._transaction_started = True
            log.debug("added %s to the transaction", ", ".join(map(str, sorted(errors))))

        await self._retrying(attempt)

    async def _end_txn(self, commit: bool) -> None:
        def build_request(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.END_TXN, END_TXN_MAX_VERSION)
            return request_module(ApiKey.END_TXN, version).EndTxnRequest(
                transactional_id=self.transactional_id,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                committed=commit,
            )

        async def attempt() -> None:
            response = await self._request("EndTxn", build_request)
            code = ErrorCode(response.error_code)
            if code == ErrorCode.none:
                return
            if code == ErrorCode.invalid_txn_state:
                raise self._fatal(KafkaException.from_code(code, "EndTxn"))
            raise self._classify("EndTxn", code)

        await self._retrying(attempt)

    async def _send_offsets(self, offsets: dict[TopicPartition, Any], group: ConsumerGroupMetadata) -> None:
        async with self._request_lock:
            self._raise_if_failed()

            def add_offsets(connection: BrokerConnection) -> Any:
                version = connection.version(ApiKey.ADD_OFFSETS_TO_TXN, ADD_OFFSETS_TO_TXN_MAX_VERSION)
                return request_module(ApiKey.ADD_OFFSETS_TO_TXN, version).AddOffsetsToTxnRequest(
                    transactional_id=self.transactional_id,
                    producer_id=self.producer_id,
                    producer_epoch=self.producer_epoch,
                    group_id=group.group_id,
                )

            async def attempt() -> None:
                response = await self._request("AddOffsetsToTxn", add_offsets)
                code = ErrorCode(response.error_code)
                if code == ErrorCode.none:
                    self._transaction_started = True
                    return
                if code == ErrorCode.group_authorization_failed:
                    raise self._abortable(
                        KafkaException.from_code(code, f"AddOffsetsToTxn({group.group_id})")
                    )
                raise self._classify("AddOffsetsToTxn", code)

            await self._retrying(attempt)
            await self._txn_offset_commit(offsets, group)

    async def _txn_offset_commit(
        self, offsets: dict[TopicPartition, Any], group: ConsumerGroupMetadata
    ) -> None:
        pending = dict(offsets)

        def build_request(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.TXN_OFFSET_COMMIT, TXN_OFFSET_COMMIT_MAX_VERSION)
            module = request_module(ApiKey.TXN_OFFSET_COMMIT, version)
            by_topic: dict[str, list[Any]] = {}
            for tp, committed in sorted(pending.items()):
                leader_epoch = getattr(committed, "leader_epoch", None)
                by_topic.setdefault(tp.topic, []).append(
                    build(
                        module.TxnOffsetCommitRequestPartition,
                        partition_index=tp.partition,
                        committed_offset=committed.offset,
                        committed_leader_epoch=-1 if leader_epoch is None else leader_epoch,
                        committed_metadata=getattr(committed, "metadata", "") or "",
                    )
                )
            return build(
                module.TxnOffsetCommitRequest,
                transactional_id=self.transactional_id,
                group_id=group.group_id,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                generation_id=group.generation_id,
                member_id=group.member_id,
                group_instance_id=group.group_instance_id,
                topics=tuple(
                    module.TxnOffsetCommitRequestTopic(name=topic, partitions=tuple(partitions))
                    for topic, partitions in by_topic.items()
                ),
            )

        async def attempt() -> None:
            response = await self._request("TxnOffsetCommit", build_request, GROUP_KEY, group.group_id)
            relookup = False
            for topic in response.topics:
                for partition in topic.partitions:
                    tp = TopicPartition(topic.name, partition.partition_index)
                    code = ErrorCode(partition.error_code)
                    if code == ErrorCode.none:
                        pending.pop(tp, None)
                    elif code in (*_RELOOKUP, ErrorCode.request_timed_out):
                        relookup = True
                    elif code in (
                        ErrorCode.unknown_topic_or_partition,
                        ErrorCode.coordinator_load_in_progress,
                    ):
                        continue
                    elif code in (
                        ErrorCode.group_authorization_failed,
                        ErrorCode.fenced_instance_id,
                        ErrorCode.unknown_member_id,
                        ErrorCode.illegal_generation,
                    ):
                        # The member lost its partitions (or its right to commit for the group).
                        raise self._abortable(
                            KafkaException.from_code(code, f"TxnOffsetCommit({group.group_id})")
                        )
                    elif code in _FENCED:
                        raise self._fatal(_fenced())
                    else:
                        raise self._fatal(
                            KafkaException.from_code(code, f"TxnOffsetCommit({group.group_id})")
                        )
            if pending:
                raise _Retry(relookup=relookup)

        await self._retrying(attempt, GROUP_KEY, group.group_id)

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the requests in progress (a transaction left open is aborted by its coordinator's timeout)."""
        for task in (self._add_partitions_task, self._pending[1] if self._pending else None):
            if task is not None and not task.done():
                task.cancel()


async def _nothing() -> None:
    return None
