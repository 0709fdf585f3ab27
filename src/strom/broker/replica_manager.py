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
from strom.storage import LogConfig, LogManager, StorageError
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
        self._fetch_waiters: dict[TopicPartition, list[asyncio.Future[None]]] = defaultdict(list)

    # -- leadership ---------------------------------------------------------------------------

    def become_leader(self, topic: TopicState) -> None:
        """Host every partition of ``topic`` that is not yet hosted (creating its log)."""
        config = self._config_for(topic)
        for state in topic.partitions:
            tp = TopicPartition(topic.name, state.partition)
            if tp in self._partitions:
                continue
            log_ = self.log_manager.get_or_create_log(topic.name, state.partition, config, topic.topic_id)
            self._partitions[tp] = Partition(tp, log_, state.leader_epoch, list(state.isr))

    def update_config(self, topic: TopicState) -> None:
        config = self._config_for(topic)
        for state in topic.partitions:
            partition = self._partitions.get(TopicPartition(topic.name, state.partition))
            if partition is not None:
                partition.log.update_config(config)

    def stop_replicas(self, topic: TopicState) -> None:
        """Stop hosting ``topic`` and delete its logs."""
        for state in topic.partitions:
            tp = TopicPartition(topic.name, state.partition)
            if self._partitions.pop(tp, None) is not None:
                self.log_manager.delete_log(topic.name, state.partition)
            self._wake_fetchers(tp)

    def partition(self, tp: TopicPartition) -> Partition | None:
        return self._partitions.get(tp)

    def partitions(self) -> list[Partition]:
        return list(self._partitions.values())

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
                results[tp] = ProduceResult(ErrorCode.unknown_topic_or_partition)
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
                results[request.tp] = FetchResult(ErrorCode.unknown_topic_or_partition)
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
