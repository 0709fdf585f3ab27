"""The sender: the producer's I/O loop, on the event loop (Kafka's Sender thread).

Each round it asks the accumulator which leaders have sendable batches, drains up to
``max.request.size`` per leader (one batch per partition) into one ProduceRequest per
leader, and writes it on that broker's connection without waiting, up to
``max.in.flight.requests.per.connection`` requests at a time; connections write in
order, which keeps the batches of a partition in sequence. Responses complete batches,
or put them back for a retry after ``retry.backoff.ms`` (doubling up to
``retry.backoff.max.ms``) until ``delivery.timeout.ms`` after they were created.
Leader errors and lost connections ask for fresh metadata. A NOT_LEADER_OR_FOLLOWER
answer that names the new leader (KIP-951, Produce v10+) moves the partition to it at
once, and a batch whose partition has a newer leader than the one that failed it is
retried without waiting out its backoff, as Kafka's Sender does. An idempotent batch
keeps its sequence across the move, so the new leader (whose producer state was
replicated with the log) recognises a batch the old one appended as a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from strom.client.cluster import TopicPartition
from strom.client.errors import KafkaException, KafkaTimeoutError
from strom.client.network_client import NetworkClient
from strom.client.producer.accumulator import ProducerBatch, RecordAccumulator
from strom.client.producer.idempotence import IdempotenceManager
from strom.client.producer.transactions import TransactionManager
from strom.network.connection import (
    BrokerConnection,
    KafkaConnectionError,
    RequestTimeoutError,
    UnsupportedVersionError,
)
from strom.network.pool import Node
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.framing import ProtocolError
from strom.protocol.messages import build

log = logging.getLogger(__name__)

# v13 names topics by id; the producer addresses them by name.
PRODUCE_MAX_VERSION = 12
PRODUCE_MIN_VERSION = 3  # the first version that carries record batch v2
INIT_PRODUCER_ID_MAX_VERSION = 5
_NO_TRANSACTION_TIMEOUT = datetime.timedelta(milliseconds=2**31 - 1)

# Errors after which the client's view of partition leadership is stale (Java's InvalidMetadataException).
METADATA_ERRORS = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.leader_not_available,
        ErrorCode.kafka_storage_error,
        ErrorCode.network_exception,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.unknown_topic_id,
        ErrorCode.inconsistent_topic_id,
    }
)


def _append_time_ms(value: Any) -> int:
    if value is None:
        return -1
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value)


class Sender:
    def __init__(
        self,
        *,
        client: NetworkClient,
        accumulator: RecordAccumulator,
        idempotence: IdempotenceManager | None,
        request_metadata_update: Callable[[], None],
        leaders_moved: Callable[[], None],
        acks: int,
        retries: int,
        max_in_flight: int,
        max_request_size: int,
        request_timeout: float,
    ) -> None:
        self.client = client
        self.accumulator = accumulator
        self.idempotence = idempotence
        self.transactions = idempotence if isinstance(idempotence, TransactionManager) else None
        self.transactional_id = self.transactions.transactional_id if self.transactions is not None else None
        self._request_metadata_update = request_metadata_update
        self._leaders_moved = leaders_moved
        self.acks = acks
        self.retries = retries
        self.max_in_flight = max_in_flight
        self.max_request_size = max_request_size
        self.request_timeout = request_timeout
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._woken = False
        self.running = True
        self.force_close = False
        self.fatal_error: KafkaException | None = None
        self._in_flight_batches: dict[ProducerBatch, None] = {}
        self._requests_in_flight: dict[int, int] = {}
        self._connecting: dict[int, asyncio.Future[BrokerConnection]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = self._loop.create_task(self._run())

    # -- waking ----------------------------------------------------------------------------

    def wakeup(self) -> None:
        """Make the loop run a round now (on the event loop's thread)."""
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _sleep(self, timeout: float) -> None:
        if self._woken:
            self._woken = False
            await asyncio.sleep(0)
            return
        if timeout <= 0:
            await asyncio.sleep(0)
            return
        waiter = self._waiter = self._loop.create_future()
        handle = self._loop.call_later(min(timeout, 3600.0), _resolve, waiter) if timeout != float("inf") else None
        try:
            await waiter
        finally:
            if handle is not None:
                handle.cancel()
            self._waiter = None
            self._woken = False

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self.running:
                await self._run_once()
            # Closing: send what is left unless forced.
            while not self.force_close and self.accumulator.has_incomplete():
                await self._run_once()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("producer sender failed")
            self.fatal_error = KafkaException(f"the producer's sender failed: {exc}")
            self.abort_all(self.fatal_error)

    async def _run_once(self) -> None:
        idempotence = self.idempotence
        if idempotence is not None:
            idempotence.maybe_resolve_sequences()
            idempotence.bump_epoch_if_needed()
            if not idempotence.has_producer_id and self.transactions is None:
                await self._init_producer_id()
                return
        accumulator = self.accumulator
        transactions = self.transactions
        if transactions is not None:
            error = transactions.undrained_batch_error()
            if error is not None:
                # The transaction failed or is being aborted: what it has not sent yet never goes.
                for batch in accumulator.abort_undrained(error):
                    self._fail_batch(batch, error, None, adjust_sequences=False)
            transactions.maybe_add_partitions()
        now = time.monotonic()
        result = accumulator.ready(now)
        if result.unknown_leader_topics:
            self._request_metadata_update()
        sendable: list[int] = []
        for node in result.nodes:
            can_send = self._node_ready(node)
            accumulator.update_node_latency(node, now, can_send)
            if can_send:
                sendable.append(node)
        drained = accumulator.drain(sendable, self.max_request_size, now) if sendable else {}
        for batches in drained.values():
            for batch in batches:
                self._in_flight_batches[batch] = None
        self._expire(now)
        for node, batches in drained.items():
            self._send_produce(node, batches)
        # Ready leaders may have more to send right away; otherwise sleep until a batch
        # lingered enough, a backoff ended or something woke us (a new batch, a response).
        await self._sleep(0.0 if drained else result.next_ready_check)

    def _node_ready(self, node: int) -> bool:
        connection = self.client.pool.connected(node)
        if connection is None:
            self._connect(node)
            return False
        return self._requests_in_flight.get(node, 0) < self.max_in_flight

    def _connect(self, node: int) -> None:
        if node in self._connecting:
            return
        if self.client.pool.node(node) is None:
            broker = self.client.cluster.brokers.get(node)
            if broker is None:
                self._request_metadata_update()
                return
            self.client.pool.set_node(broker)
        future = asyncio.ensure_future(self.client.pool.get(node))
        self._connecting[node] = future
        future.add_done_callback(functools.partial(self._connected, node))

    def _connected(self, node: int, future: asyncio.Future[BrokerConnection]) -> None:
        self._connecting.pop(node, None)
        if not future.cancelled() and future.exception() is not None:
            log.debug("cannot connect to broker %d: %s", node, future.exception())
            self._request_metadata_update()
        self.wakeup()

    def _expire(self, now: float) -> None:
        expired = self.accumulator.expired_batches(now)
        expired += [batch for batch in self._in_flight_batches if now >= batch.deadline]
        for batch in expired:
            self._in_flight_batches.pop(batch, None)
            if self.idempotence is not None and batch.in_retry:
                # Whether the broker appended it is unknown: hold the partition's later
                # batches until the sequence resolves (or the epoch is bumped).
                self.idempotence.mark_sequence_unresolved(batch)
            error = KafkaTimeoutError(
                f"expiring {batch.record_count} record(s) for {batch.tp}: "
                f"{(now - batch.created) * 1000:.0f} ms has passed since batch creation "
                f"(delivery.timeout.ms)"
            )
            self._fail_batch(batch, error, None, adjust_sequences=False)

    # -- produce ---------------------------------------------------------------------------

    def _produce_request(self, connection: BrokerConnection, batches: list[ProducerBatch]) -> Any:
        version = connection.version(ApiKey.PRODUCE, PRODUCE_MAX_VERSION, PRODUCE_MIN_VERSION)
        module = request_module(ApiKey.PRODUCE, version)
        by_topic: dict[str, list[Any]] = {}
        for batch in batches:
            assert batch.built is not None
            by_topic.setdefault(batch.tp.topic, []).append(
                module.PartitionProduceData(index=batch.tp.partition, records=batch.built)
            )
        return module.ProduceRequest(
            transactional_id=self.transactional_id,
            acks=self.acks,
            timeout=datetime.timedelta(seconds=self.request_timeout),
            topic_data=tuple(
                module.TopicProduceData(name=topic, partition_data=tuple(partitions))
                for topic, partitions in by_topic.items()
            ),
        )

    def _send_produce(self, node: int, batches: list[ProducerBatch]) -> None:
        connection = self.client.pool.connected(node)
        try:
            if connection is None:
                raise KafkaConnectionError(f"broker {node} disconnected")
            request = self._produce_request(connection, batches)
            if self.acks == 0:
                connection.send_without_response(request)
            else:
                future = connection.send_nowait(request, timeout=self.request_timeout)
        except UnsupportedVersionError as exc:
            for batch in batches:
                self._in_flight_batches.pop(batch, None)
                self._fail_batch(batch, KafkaException(str(exc), ErrorCode.unsupported_version), None, False)
            return
        except KafkaConnectionError as exc:
            self._on_disconnect(batches, exc)
            return
        self._requests_in_flight[node] = self._requests_in_flight.get(node, 0) + 1
        if self.acks == 0:
            # Nothing will answer: the batches are done once written. A request counts as in
            # flight until the socket's buffer drains, which bounds what acks=0 queues up.
            for batch in batches:
                self._in_flight_batches.pop(batch, None)
                self._complete_batch(batch, ErrorCode.none, -1, -1, -1, None, time.monotonic())
            drained = asyncio.ensure_future(connection.drain())
            drained.add_done_callback(functools.partial(self._on_drained, node))
            return
        by_tp = {(batch.tp.topic, batch.tp.partition): batch for batch in batches}
        future.add_done_callback(functools.partial(self._on_response, node, by_tp))

    def _on_drained(self, node: int, future: asyncio.Future[None]) -> None:
        self._requests_in_flight[node] -= 1
        if not future.cancelled() and future.exception() is not None:
            self._request_metadata_update()
        self.wakeup()

    def _on_response(
        self, node: int, batches: dict[tuple[str, int], ProducerBatch], future: asyncio.Future[Any]
    ) -> None:
        self._requests_in_flight[node] -= 1
        now = time.monotonic()
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            self._on_disconnect(list(batches.values()), error)
            self.wakeup()
            return
        response = future.result()
        moved = self._apply_leader_hints(response)
        for topic in response.responses:
            for partition in topic.partition_responses:
                batch = batches.pop((topic.name, partition.index), None)
                if batch is None:
                    continue
                self._complete_batch(
                    batch,
                    partition.error_code,
                    partition.base_offset,
                    _append_time_ms(partition.log_append_time),
                    getattr(partition, "log_start_offset", -1),
                    getattr(partition, "error_message", None),
                    now,
                    batch.tp in moved,
                )
        for batch in batches.values():
            # A partition the response left out: as if the connection failed for it.
            self._complete_batch(batch, ErrorCode.network_exception, -1, -1, -1, "missing from the response", now)
        self.wakeup()

    def _apply_leader_hints(self, response: Any) -> set[TopicPartition]:
        """KIP-951: the new leaders named by failed partitions (Produce v10+), applied to the metadata."""
        hints: dict[TopicPartition, tuple[int, int]] = {}
        for topic in response.responses:
            for partition in topic.partition_responses:
                leader = getattr(partition, "current_leader", None)
                if partition.error_code != ErrorCode.none and leader is not None and leader.leader_id >= 0:
                    hints[TopicPartition(topic.name, partition.index)] = (
                        int(leader.leader_id),
                        int(leader.leader_epoch),
                    )
        if not hints:
            return set()
        nodes = [
            Node(int(n.node_id), n.host, int(n.port), n.rack) for n in getattr(response, "node_endpoints", ())
        ]
        moved = self.client.cluster.update_leaders(hints, nodes)
        if moved:
            for node in nodes:
                self.client.pool.set_node(node)
            log.info("new leaders from produce answers: %s", ", ".join(sorted(map(str, moved))))
            self._leaders_moved()
        return moved

    def _on_disconnect(self, batches: list[ProducerBatch], error: BaseException | None) -> None:
        code = ErrorCode.request_timed_out if isinstance(error, RequestTimeoutError) else ErrorCode.network_exception
        now = time.monotonic()
        for batch in batches:
            self._complete_batch(batch, code, -1, -1, -1, str(error) if error else None, now)
        self._request_metadata_update()

    def _complete_batch(
        self,
        batch: ProducerBatch,
        error: ErrorCode,
        base_offset: int,
        log_append_time: int,
        log_start_offset: int,
        message: str | None,
        now: float,
        leader_known: bool = False,
    ) -> None:
        """``leader_known``: the answer named the partition's new leader (no metadata refresh needed)."""
        self._in_flight_batches.pop(batch, None)
        if error == ErrorCode.none:
            self._succeed_batch(batch, base_offset, log_append_time)
            return
        if error == ErrorCode.message_too_large and batch.record_count > 1 and not batch.is_done:
            # Larger than the topic's max.message.bytes: send it again in batch.size parts.
            log.warning("%s: batch of %d records too large, splitting it", batch.tp, batch.record_count)
            self.accumulator.split_and_reenqueue(batch)
            return
        if self._can_retry(batch, error, log_start_offset, now):
            log.debug("%s: %s, retrying (attempt %d)", batch.tp, error.name, batch.attempts + 1)
            self.accumulator.reenqueue(batch, now)
        elif error == ErrorCode.duplicate_sequence_number:
            # Appended before, but the broker no longer knows at which offset.
            self._succeed_batch(batch, -1, log_append_time)
        else:
            exception = KafkaException.from_code(error, f"produce to {batch.tp}", message)
            # Only a batch that had retries left was certainly refused; after the last
            # attempt it may have been appended, so its sequence cannot be reused.
            self._fail_batch(batch, exception, error, adjust_sequences=batch.attempts < self.retries)
        if error in METADATA_ERRORS and not leader_known:
            self._request_metadata_update()

    def _can_retry(self, batch: ProducerBatch, error: ErrorCode, log_start_offset: int, now: float) -> bool:
        if batch.is_done or batch.attempts >= self.retries or now >= batch.deadline:
            return False
        if self.idempotence is not None:
            return self.idempotence.can_retry(error, log_start_offset, batch)
        return bool(error.retriable)

    def _succeed_batch(self, batch: ProducerBatch, base_offset: int, log_append_time: int) -> None:
        if self.idempotence is not None and batch.has_sequence:
            self.idempotence.handle_completed_batch(batch)
        if batch.done(base_offset, log_append_time, None):
            self.accumulator.deallocate(batch)

    def _fail_batch(
        self, batch: ProducerBatch, error: Exception, code: ErrorCode | None, adjust_sequences: bool
    ) -> None:
        if self.idempotence is not None:
            self.idempotence.handle_failed_batch(batch, code, adjust_sequences, error)
        if batch.done(-1, -1, error):
            self.accumulator.deallocate(batch)

    # -- producer id -----------------------------------------------------------------------

    async def _init_producer_id(self) -> None:
        assert self.idempotence is not None

        def build_request(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_MAX_VERSION)
            return build(
                request_module(ApiKey.INIT_PRODUCER_ID, version).InitProducerIdRequest,
                transactional_id=None,
                transaction_timeout=_NO_TRANSACTION_TIMEOUT,
                producer_id=-1,
                producer_epoch=-1,
            )

        try:
            response = await self.client.send_any(build_request)
        except UnsupportedVersionError as exc:
            self._fatal(KafkaException(f"idempotence needs InitProducerId: {exc}", ErrorCode.unsupported_version))
            return
        except (KafkaConnectionError, RequestTimeoutError, ProtocolError) as exc:
            log.debug("InitProducerId failed: %s", exc)
            self._request_metadata_update()
            await self._sleep(self.client.retry_backoff)
            return
        code = ErrorCode(response.error_code)
        if code == ErrorCode.none:
            self.idempotence.set_producer_id_and_epoch(int(response.producer_id), int(response.producer_epoch))
        elif code.retriable:
            await self._sleep(self.client.retry_backoff)
        else:
            self._fatal(KafkaException.from_code(code, "InitProducerId"))

    def _fatal(self, error: KafkaException) -> None:
        log.error("producer failed: %s", error)
        self.fatal_error = error
        self.accumulator.fail_appends(error)
        self.abort_all(error)

    # -- closing ---------------------------------------------------------------------------

    def abort_all(self, error: Exception) -> None:
        """Fail every batch not yet completed: queued and in flight."""
        for batch in self.accumulator.abort_undrained(error):
            self._fail_batch(batch, error, None, adjust_sequences=False)
        for batch in list(self._in_flight_batches):
            self._in_flight_batches.pop(batch, None)
            self._fail_batch(batch, error, None, adjust_sequences=False)
        for batch in self.accumulator.incomplete_batches():
            self._fail_batch(batch, error, None, adjust_sequences=False)

    async def close(self, timeout: float | None) -> None:
        """Send what is queued (within ``timeout`` s, None for no limit), then stop; fail what is left."""
        self.running = False
        self.accumulator.close()
        self.wakeup()
        task = self._task
        if task is not None and not task.done():
            if timeout is None or timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), timeout)
            if not task.done():
                self.force_close = True
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for connecting in list(self._connecting.values()):
            connecting.cancel()
        self.abort_all(KafkaException("the producer was closed before these records were sent"))


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
