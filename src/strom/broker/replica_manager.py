"""The replica manager: every partition this broker hosts, and the produce and fetch paths over them.

Produce appends to each partition's leader log; fetch reads whole batches below the
high watermark and, when fewer than ``min_bytes`` are available, waits (a delayed
fetch) until an append to one of its partitions or ``max_wait_ms`` -- Kafka's
purgatory reduced to one future per waiting fetch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from strom.broker.cluster.metadata import TopicState
from strom.broker.partition import NotEnoughReplicasError, Partition, TopicPartition
from strom.protocol.errors import ErrorCode
from strom.storage import KafkaStorageError, LogConfig, LogManager, NewLog, StorageError
from strom.storage.log_validator import ValidatedRecords, needs_worker

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ProduceResult:
    error: ErrorCode = ErrorCode.none
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    record_errors: list[tuple[int, str]] = field(default_factory=list)


@dataclass(slots=True)
class FetchRequestPartition:
    tp: TopicPartition
    fetch_offset: int
    max_bytes: int


@dataclass(slots=True)
class FetchResult:
    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""


def error_code_of(exc: BaseException) -> ErrorCode:
    code = getattr(exc, "error_code", None)
    return ErrorCode(code) if isinstance(code, int) else ErrorCode.unknown_server_error


class ReplicaManager:
    def __init__(self, log_manager: LogManager, config_for: Callable[[TopicState], LogConfig]) -> None:
        self.log_manager = log_manager
        self._config_for = config_for
        self._partitions: dict[TopicPartition, Partition] = {}
        # Partitions whose log could not be opened because its log dir is offline (Kafka's
        # HostedPartition.Offline): they answer KAFKA_STORAGE_ERROR until a restart.
        self._offline_partitions: set[TopicPartition] = set()
        self._fetch_waiters: dict[TopicPartition, list[asyncio.Future[None]]] = defaultdict(list)

    # -- leadership ---------------------------------------------------------------------------

    def become_leader(self, topic: TopicState) -> None:
        """Host every partition of ``topic`` that is not yet hosted, creating missing logs inline
        (startup, before the broker serves anyone; later changes use ``create_partitions``)."""
        config = self._config_for(topic)
        for state in topic.partitions:
            tp = TopicPartition(topic.name, state.partition)
            if tp in self._partitions or tp in self._offline_partitions:
                continue
            try:
                log_ = self.log_manager.get_or_create_log(topic.name, state.partition, config, topic.topic_id)
                self._partitions[tp] = Partition(tp, log_, state.leader_epoch, list(state.isr))
            except KafkaStorageError as exc:
                log.debug("partition %s is offline: %s", tp, exc)  # the failure channel logged the cause
                self._offline_partitions.add(tp)

    async def create_partitions(self, topic: TopicState) -> None:
        """Create the logs of ``topic``'s partitions not yet hosted, off the event loop, then host them.

        Raises KafkaStorageError (having created nothing) if the disk fails.
        """
        config = self._config_for(topic)
        missing = [
            state
            for state in topic.partitions
            if TopicPartition(topic.name, state.partition) not in self._partitions
            and self.log_manager.get_log(topic.name, state.partition) is None
        ]
        dirs = self.log_manager.assign_log_dirs(len(missing))
        specs = [
            NewLog(log_dir, topic.name, state.partition, config, topic.topic_id, state.leader_epoch)
            for log_dir, state in zip(dirs, missing, strict=True)
        ]
        logs = await asyncio.get_running_loop().run_in_executor(None, self.log_manager.open_new_logs, specs)
        self.log_manager.register_logs(logs)
        self.become_leader(topic)

    def update_config(self, topic: TopicState) -> None:
        config = self._config_for(topic)
        for state in topic.partitions:
            partition = self._partitions.get(TopicPartition(topic.name, state.partition))
            if partition is not None:
                partition.log.update_config(config)

    async def stop_replicas(self, topic: TopicState) -> None:
        """Stop hosting ``topic`` and delete its logs.

        Its partitions leave the broker here, on the event loop, so no append or fetch reaches
        their logs any more; the files are removed in a worker thread.
        """
        keys = []
        for state in topic.partitions:
            tp = TopicPartition(topic.name, state.partition)
            self._offline_partitions.discard(tp)
            self._partitions.pop(tp, None)
            self._wake_fetchers(tp)
            keys.append((topic.name, state.partition))
        logs = self.log_manager.unregister_logs(keys)
        await asyncio.get_running_loop().run_in_executor(None, self.log_manager.delete_logs, logs)

    def partition(self, tp: TopicPartition) -> Partition | None:
        return self._partitions.get(tp)

    def partition_of(self, topic: str, partition: int) -> Partition | None:
        return self._partitions.get(TopicPartition(topic, partition))

    def partitions(self) -> list[Partition]:
        return list(self._partitions.values())

    def is_offline(self, tp: TopicPartition) -> bool:
        """The partition's log dir failed: produce and fetch answer KAFKA_STORAGE_ERROR."""
        if tp in self._offline_partitions:
            return True
        partition = self._partitions.get(tp)
        return partition is not None and partition.offline

    def _missing_partition_error(self, tp: TopicPartition) -> ErrorCode:
        if tp in self._offline_partitions:
            return ErrorCode.kafka_storage_error
        return ErrorCode.unknown_topic_or_partition

    # -- produce ------------------------------------------------------------------------------

    async def append_records_async(
        self, required_acks: int, entries: list[tuple[TopicPartition, bytes | None]]
    ) -> dict[TopicPartition, ProduceResult]:
        """append_records for the produce path: record sets whose validation may take long
        (compressed, recompressed or large: log_validator.needs_worker) are validated on a
        worker thread first, so the event loop never waits for a decompression."""
        validated: dict[TopicPartition, ValidatedRecords] = {}
        early: dict[TopicPartition, ProduceResult] = {}
        loop = asyncio.get_running_loop()
        for tp, records in entries:
            partition = self._partitions.get(tp)
            if partition is None or not records or not needs_worker(records, partition.log.config):
                continue
            try:
                validated[tp] = await loop.run_in_executor(None, partition.log.analyze_for_append, records)
            except StorageError as exc:
                early[tp] = ProduceResult(
                    error_code_of(exc),
                    log_start_offset=partition.log_start_offset,
                    error_message=str(exc) or None,
                    record_errors=list(exc.record_errors),
                )
        results = self.append_records(
            required_acks, [entry for entry in entries if entry[0] not in early], validated
        )
        results.update(early)
        return results

    def append_records(
        self,
        required_acks: int,
        entries: list[tuple[TopicPartition, bytes | None]],
        validated: dict[TopicPartition, ValidatedRecords] | None = None,
    ) -> dict[TopicPartition, ProduceResult]:
        results: dict[TopicPartition, ProduceResult] = {}
        for tp, records in entries:
            partition = self._partitions.get(tp)
            if partition is None:
                results[tp] = ProduceResult(self._missing_partition_error(tp))
                continue
            if not records:
                results[tp] = ProduceResult(ErrorCode.invalid_record, error_message="empty record set")
                continue
            try:
                info = partition.append_records_to_leader(
                    records, required_acks, validated.get(tp) if validated is not None else None
                )
            except (StorageError, NotEnoughReplicasError) as exc:
                results[tp] = ProduceResult(
                    error_code_of(exc),
                    log_start_offset=partition.log_start_offset,
                    error_message=str(exc) or None,
                    record_errors=list(getattr(exc, "record_errors", [])),
                )
                continue
            results[tp] = ProduceResult(
                base_offset=info.first_offset,
                log_append_time=info.log_append_time,
                log_start_offset=info.log_start_offset,
            )
            if not info.duplicate:
                self._wake_fetchers(tp)
        # acks=-1 would wait here (a delayed produce) until the HW passes each last offset;
        # with ISR = {leader} the HW moved with the append itself.
        return results

    async def append(
        self, required_acks: int, entries: list[tuple[TopicPartition, bytes | None]]
    ) -> dict[TopicPartition, ProduceResult]:
        """``append_records_async``, then the fsyncs that flush.messages asks for, off the event
        loop, before the caller acknowledges (a failed fsync answers KAFKA_STORAGE_ERROR)."""
        results = await self.append_records_async(required_acks, entries)
        due = [
            (tp, partition)
            for tp, result in results.items()
            if result.error == ErrorCode.none
            and (partition := self._partitions.get(tp)) is not None
            and partition.log.flush_messages_due
        ]
        if due:
            loop = asyncio.get_running_loop()
            outcomes = await asyncio.gather(
                *(loop.run_in_executor(None, partition.log.flush) for _, partition in due),
                return_exceptions=True,
            )
            for (tp, _), outcome in zip(due, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    log.error("flush failed", extra={"partition": str(tp), "error": str(outcome)})
                    results[tp] = ProduceResult(ErrorCode.kafka_storage_error, error_message=str(outcome))
        return results

    # -- fetch --------------------------------------------------------------------------------

    def read_from_local_log(
        self, requests: list[FetchRequestPartition], max_bytes: int
    ) -> tuple[dict[TopicPartition, FetchResult], int]:
        results: dict[TopicPartition, FetchResult] = {}
        remaining = max_bytes
        total = 0
        for request in requests:
            partition = self._partitions.get(request.tp)
            if partition is None:
                results[request.tp] = FetchResult(self._missing_partition_error(request.tp))
                continue
            result = FetchResult(
                high_watermark=partition.high_watermark,
                last_stable_offset=partition.last_stable_offset,
                log_start_offset=partition.log_start_offset,
            )
            try:
                # The first partition with data gets at least one batch, even above the limits.
                data = partition.read_records(
                    request.fetch_offset, min(request.max_bytes, remaining), min_one_batch=total == 0
                )
            except StorageError as exc:
                result.error = error_code_of(exc)
            else:
                result.records = data.records
                total += len(data.records)
                remaining = max(0, remaining - len(data.records))
            results[request.tp] = result
        return results, total

    async def fetch_messages(
        self,
        requests: list[FetchRequestPartition],
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
    ) -> dict[TopicPartition, FetchResult]:
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            results, total = self.read_from_local_log(requests, max_bytes)
            remaining = deadline - time.monotonic()
            errors = any(r.error != ErrorCode.none for r in results.values())
            if total >= min_bytes or errors or remaining <= 0 or not requests:
                return results
            await self._await_append([r.tp for r in requests], remaining)

    async def _await_append(self, tps: list[TopicPartition], timeout: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for tp in tps:
            self._fetch_waiters[tp].append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            for tp in tps:
                waiters = self._fetch_waiters.get(tp)
                if waiters is not None:
                    if waiter in waiters:
                        waiters.remove(waiter)
                    if not waiters:
                        del self._fetch_waiters[tp]

    def _wake_fetchers(self, tp: TopicPartition) -> None:
        for waiter in self._fetch_waiters.pop(tp, ()):
            if not waiter.done():
                waiter.set_result(None)

    def wake_all_fetchers(self) -> None:
        for tp in list(self._fetch_waiters):
            self._wake_fetchers(tp)
