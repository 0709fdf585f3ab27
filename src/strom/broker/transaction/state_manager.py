"""TransactionStateManager: the transactional ids of the ``__transaction_state`` partitions this
broker leads, loaded from and written to those partitions (Kafka's TransactionStateManager).

A transactional id belongs to partition ``abs(hashCode(id)) % transaction.state.log.num.partitions``
(Java's String.hashCode, as Kafka). The coordinator of an id is the leader of its partition, and
its *coordinator epoch* is that partition's leader epoch: markers carry it, so a partition leader
refuses markers from a coordinator that has since been replaced. A partition's ids are loaded off
the event loop by the coordinators' shared ``CoordinatorLoader`` when this broker becomes its
leader; until then its ids answer COORDINATOR_LOAD_IN_PROGRESS, and NOT_COORDINATOR once another
broker leads it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from strom.broker.coordinator.group_metadata_manager import partition_for
from strom.broker.coordinator.loader import CoordinatorLoader
from strom.broker.coordinator.records import CoordinatorRecordError
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager
from strom.broker.transaction.log_records import (
    TransactionState,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from strom.broker.transaction.metadata import TransactionMetadata, TxnTransition
from strom.protocol.errors import ErrorCode
from strom.records.codec import RecordSpec, encode_batch

log = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"


@dataclass(frozen=True, slots=True)
class LoadedPartition:
    partition: int
    coordinator_epoch: int
    transactions: list[TransactionMetadata]


class TransactionStateManager:
    def __init__(
        self,
        replica_manager: ReplicaManager,
        num_partitions: int,
        loader: CoordinatorLoader,
        *,
        write_timeout_ms: int,
        time_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._replica_manager = replica_manager
        self.num_partitions = num_partitions
        self._loader = loader
        self._write_timeout_ms = write_timeout_ms
        self._time_ms = time_ms
        # Led partitions: their coordinator epoch, and their transactional ids.
        self._owned: dict[int, int] = {}
        self._transactions: dict[int, dict[str, TransactionMetadata]] = {}
        # Partitions being loaded: the leader epoch each load started in.
        self._loading: dict[int, int] = {}

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions)

    def topic_partition_of(self, transactional_id: str) -> TopicPartition:
        return TopicPartition(TRANSACTION_STATE_TOPIC, self.partition_of(transactional_id))

    # --- lookups -------------------------------------------------------------------------

    def coordinator_error(self, transactional_id: str) -> ErrorCode:
        partition = self.partition_of(transactional_id)
        if partition in self._loading:
            return ErrorCode.coordinator_load_in_progress
        if partition not in self._owned:
            return ErrorCode.not_coordinator
        return ErrorCode.none

    def get(self, transactional_id: str) -> tuple[ErrorCode, int, TransactionMetadata | None]:
        """(error, coordinator epoch, the id's metadata or None when it has none)."""
        error = self.coordinator_error(transactional_id)
        if error != ErrorCode.none:
            return error, -1, None
        partition = self.partition_of(transactional_id)
        return ErrorCode.none, self._owned[partition], self._transactions[partition].get(transactional_id)

    def put_if_absent(self, metadata: TransactionMetadata) -> TransactionMetadata:
        partition = self.partition_of(metadata.transactional_id)
        return self._transactions[partition].setdefault(metadata.transactional_id, metadata)

    def remove(self, metadata: TransactionMetadata) -> None:
        partition = self._transactions.get(self.partition_of(metadata.transactional_id))
        if partition is not None and partition.get(metadata.transactional_id) is metadata:
            del partition[metadata.transactional_id]

    def is_current(self, transactional_id: str, coordinator_epoch: int) -> bool:
        """This broker still coordinates the id in ``coordinator_epoch``."""
        return self._owned.get(self.partition_of(transactional_id)) == coordinator_epoch

    def transactions(self) -> Iterator[tuple[int, TransactionMetadata]]:
        """Every id this broker coordinates, with its coordinator epoch."""
        for partition, epoch in list(self._owned.items()):
            for metadata in list(self._transactions[partition].values()):
                yield epoch, metadata

    @property
    def loading(self) -> bool:
        return bool(self._loading)

    def coordinates(self, partition: int, leader_epoch: int) -> bool:
        """This broker owns (or is loading) ``partition`` in ``leader_epoch`` already."""
        return self._owned.get(partition, self._loading.get(partition)) == leader_epoch

    # --- writing ---------------------------------------------------------------------------

    async def append(self, transactional_id: str, coordinator_epoch: int, transition: TxnTransition) -> ErrorCode:
        """Write ``transition`` (a tombstone for Dead) and wait for the ISR; the caller then
        completes or abandons it. NOT_COORDINATOR when the partition changed leader meanwhile."""
        tp = self.topic_partition_of(transactional_id)
        value = None if transition.state == TransactionState.DEAD else encode_value(transition.log_value())
        batch = encode_batch([RecordSpec(encode_key(transactional_id), value)])
        results = await self._replica_manager.append(-1, [(tp, batch)], timeout_ms=self._write_timeout_ms)
        result = results[tp]
        error = result.error
        if error != ErrorCode.none:
            log.warning(
                "writing to the transaction log failed",
                extra={"transactional_id": transactional_id, "partition": str(tp), "error": error.name},
            )
        # Kafka's mapping (TransactionStateManager.appendTransactionToLog).
        if error in (
            ErrorCode.unknown_topic_or_partition,
            ErrorCode.not_enough_replicas,
            ErrorCode.not_enough_replicas_after_append,
            ErrorCode.request_timed_out,
        ):
            return ErrorCode.coordinator_not_available
        if error in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
            return ErrorCode.not_coordinator
        if error in (ErrorCode.message_too_large, ErrorCode.record_list_too_large):
            return ErrorCode.unknown_server_error
        if error != ErrorCode.none:
            return ErrorCode.unknown_server_error
        if not self.is_current(transactional_id, coordinator_epoch):
            return ErrorCode.not_coordinator
        return ErrorCode.none

    # --- leadership ----------------------------------------------------------------------------

    async def load(self, partition: int, leader_epoch: int) -> LoadedPartition | None:
        """Load ``partition``'s ids off the loop and own them; None if the load went stale
        (leadership changed meanwhile) or failed (the partition stays unowned: NOT_COORDINATOR)."""
        self._loading[partition] = leader_epoch
        tp = TopicPartition(TRANSACTION_STATE_TOPIC, partition)
        source = self._replica_manager.partition(tp)

        def is_current() -> bool:
            return self._loading.get(partition) == leader_epoch

        values: dict[str, TransactionMetadata | None] = {}

        def replay(key: bytes | None, value: bytes | None, offset: int) -> None:
            if key is None:
                return
            try:
                transactional_id = decode_key(key)
                values[transactional_id] = (
                    None if value is None else TransactionMetadata.from_log(transactional_id, decode_value(value))
                )
            except CoordinatorRecordError as e:
                # Never fatal for the partition, never turned into a deletion: logged and skipped.
                log.error(
                    "unreadable record in the transaction log",
                    extra={"partition": partition, "offset": offset, "error": str(e)},
                )

        try:
            stats = None if source is None else await self._loader.load(source, replay, is_current)
        except Exception:
            log.exception("loading a transaction log partition failed", extra={"partition": partition})
            if is_current():
                del self._loading[partition]
            return None
        if (source is not None and stats is None) or not is_current():
            return None
        del self._loading[partition]
        loaded = {tid: m for tid, m in values.items() if m is not None and m.state != TransactionState.DEAD}
        self._owned[partition] = leader_epoch
        self._transactions[partition] = loaded
        log.info(
            "coordinating the transactions of a transaction log partition",
            extra={"partition": partition, "coordinator_epoch": leader_epoch, "transactional_ids": len(loaded)},
        )
        return LoadedPartition(partition, leader_epoch, list(loaded.values()))

    def unload(self, partition: int) -> None:
        self._loading.pop(partition, None)
        if self._owned.pop(partition, None) is not None:
            self._transactions.pop(partition, None)
            log.info("stopped coordinating a transaction log partition", extra={"partition": partition})
