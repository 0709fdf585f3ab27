"""Strom's producer: ``Producer`` (synchronous) and ``AsyncProducer`` (asyncio), one core.

The synchronous ``send`` does its work in the caller's thread: it picks the partition
and encodes the record into its partition's open batch, then returns. Only a new or
full batch wakes the I/O thread, whose event loop runs the sender. ``AsyncProducer``
runs the same sender on the caller's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from types import TracebackType
from typing import Any

from strom.client.config import PRODUCER, resolve
from strom.client.consumer.core import Offsets, normalize_offsets
from strom.client.consumer.structs import ConsumerGroupMetadata
from strom.client.errors import ConfigException, ErrorCode, KafkaException, KafkaTimeoutError
from strom.client.loop_thread import EventLoopThread
from strom.client.network_client import NetworkClient
from strom.client.producer.accumulator import (
    RECORD_OVERHEAD,
    Callback,
    FutureRecordMetadata,
    ProduceRequestResult,
    RecordAccumulator,
    RecordFuture,
    RecordMetadata,
    TopicExpiredError,
    TopicState,
)
from strom.client.producer.idempotence import IdempotenceManager
from strom.client.producer.metadata import ProducerMetadata
from strom.client.producer.partitioner import murmur2
from strom.client.producer.sender import Sender
from strom.client.producer.transactions import TransactionManager
from strom.records.batch import HEADER_SIZE, CompressionType

log = logging.getLogger(__name__)

Header = tuple[str, bytes | None]
_ACKS = {"all": -1, "-1": -1, "0": 0, "1": 1}
# Hashes of recently seen short keys: murmur2 in Python costs a microsecond.
_KEY_CACHE_SIZE = 65_536
_KEY_CACHE_MAX_KEY = 64


def _to_bytes(data: Any, what: str) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"record {what} must be bytes, str or None, not {type(data).__name__}")


def _check_headers(headers: Sequence[tuple[str, Any]]) -> list[Header]:
    checked: list[Header] = []
    for name, value in headers:
        if not isinstance(name, str):
            raise TypeError(f"header keys must be str, not {type(name).__name__}")
        checked.append((name, None if value is None else _to_bytes(value, "header value")))
    return checked


def _producer_settings(config: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Resolved config and whether idempotence is on (the Java client's rules)."""
    settings = resolve(PRODUCER, config, "producer")
    transactional = settings["transactional.id"] is not None
    acks = _ACKS[settings["acks"]]
    conflicts = []
    if settings["max.in.flight.requests.per.connection"] > 5:
        conflicts.append("max.in.flight.requests.per.connection must be at most 5")
    if settings["retries"] == 0:
        conflicts.append("retries must not be 0")
    if acks != -1:
        conflicts.append("acks must be all")
    idempotent = bool(settings["enable.idempotence"])
    if idempotent and conflicts:
        if "enable.idempotence" in config:
            raise ConfigException(f"the idempotent producer needs: {'; '.join(conflicts)}")
        # Idempotence is on by default only while nothing the user set contradicts it.
        idempotent = False
    if transactional and not idempotent:
        reasons = "; ".join(conflicts) if conflicts else "enable.idempotence must not be false"
        raise ConfigException(f"a transactional.id needs the idempotent producer: {reasons}")
    linger = settings["linger.ms"]
    request_timeout = settings["request.timeout.ms"]
    if settings["delivery.timeout.ms"] < linger + request_timeout:
        if "delivery.timeout.ms" in config:
            raise ConfigException(
                "delivery.timeout.ms should be equal to or larger than linger.ms + request.timeout.ms"
            )
        settings["delivery.timeout.ms"] = linger + request_timeout
    return settings, idempotent


def _group(group_metadata: ConsumerGroupMetadata | str) -> ConsumerGroupMetadata:
    """A consumer's group metadata, or a bare group id (no member check by the group coordinator)."""
    if isinstance(group_metadata, ConsumerGroupMetadata):
        return group_metadata
    return ConsumerGroupMetadata(group_metadata)


def _compression_level(settings: Mapping[str, Any], config: Mapping[str, Any], codec: str) -> int | None:
    """The level the user set for the codec; None keeps strom.records.compression's default."""
    key = f"compression.{codec}.level"
    if key not in config:
        return None
    level: int = settings[key]
    return None if codec == "gzip" and level == -1 else level


class _ProducerCore:
    """What both faces share: settings, accumulator, and (once started on a loop) the I/O side."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        settings, idempotent = _producer_settings(config)
        self.settings = settings
        self.acks = _ACKS[settings["acks"]]
        self.max_block = settings["max.block.ms"] / 1000
        self.max_request_size = settings["max.request.size"]
        self.buffer_memory = settings["buffer.memory"]
        self.ignore_keys = settings["partitioner.ignore.keys"] or settings["partitioner.class"] == "round_robin"
        # Records whose key and value together are smaller than this need no size check.
        self.size_check = min(self.max_request_size, self.buffer_memory) - HEADER_SIZE - RECORD_OVERHEAD - 64
        codec = settings["compression.type"]
        self.accumulator = RecordAccumulator(
            batch_size=settings["batch.size"],
            buffer_memory=settings["buffer.memory"],
            linger=settings["linger.ms"] / 1000,
            delivery_timeout=settings["delivery.timeout.ms"] / 1000,
            retry_backoff=settings["retry.backoff.ms"] / 1000,
            retry_backoff_max=settings["retry.backoff.max.ms"] / 1000,
            compression=CompressionType.NAMES[codec],
            compression_level=_compression_level(settings, config, codec),
            partitioner=settings["partitioner.class"],
            adaptive_partitioning=settings["partitioner.adaptive.partitioning.enable"],
            partition_availability_timeout=settings["partitioner.availability.timeout.ms"] / 1000,
        )
        self.transactional_id: str | None = settings["transactional.id"]
        # A transactional producer's manager needs the network client: start() makes it.
        self.idempotence = IdempotenceManager() if idempotent and self.transactional_id is None else None
        self.transactions: TransactionManager | None = None
        self.accumulator.idempotence = self.idempotence
        self.accumulator.transactional = self.transactional_id is not None
        self._key_hashes: dict[bytes, int] = {}
        self.client: NetworkClient | None = None
        self.metadata: ProducerMetadata | None = None
        self.sender: Sender | None = None
        self.closed = False

    async def start(self) -> None:
        """Create the I/O side on the running loop."""
        settings = self.settings
        self.client = client = NetworkClient(settings)
        if self.transactional_id is not None:
            self.idempotence = self.transactions = TransactionManager(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=settings["transaction.timeout.ms"],
                client=client,
                retry_backoff=settings["retry.backoff.ms"] / 1000,
            )
            self.accumulator.idempotence = self.transactions
            self.transactions.flush = self.flush_all
        self.sender = sender = Sender(
            client=client,
            accumulator=self.accumulator,
            idempotence=self.idempotence,
            request_metadata_update=self._request_metadata_update,
            leaders_moved=self._leaders_moved,
            acks=self.acks,
            retries=settings["retries"],
            max_in_flight=settings["max.in.flight.requests.per.connection"],
            max_request_size=self.max_request_size,
            request_timeout=settings["request.timeout.ms"] / 1000,
        )
        self.metadata = ProducerMetadata(
            client,
            self.accumulator,
            max_age=settings["metadata.max.age.ms"] / 1000,
            max_idle=settings["metadata.max.idle.ms"] / 1000,
            allow_auto_create=settings["allow.auto.create.topics"],
            on_update=sender.wakeup,
        )
        self.metadata.start()
        if self.transactions is not None:
            self.transactions.wakeup = sender.wakeup
        sender.start()

    def _request_metadata_update(self) -> None:
        if self.metadata is not None:
            self.metadata.request_update()

    def _leaders_moved(self) -> None:
        """KIP-951 hints changed leaders in the client's metadata: route the queued batches by it."""
        if self.metadata is not None and self.client is not None:
            self.metadata.apply(self.client.cluster)

    async def wait_on_metadata(self, topic: str, partition: int | None, timeout: float) -> TopicState:
        assert self.metadata is not None
        return await self.metadata.wait_for_topic(topic, partition, timeout)

    def key_partition(self, key: bytes, num_partitions: int) -> int:
        hashes = self._key_hashes
        hashed = hashes.get(key)
        if hashed is None:
            hashed = murmur2(key) & 0x7FFFFFFF
            if len(key) <= _KEY_CACHE_MAX_KEY:
                if len(hashes) >= _KEY_CACHE_SIZE:
                    hashes.clear()
                hashes[key] = hashed
        return hashed % num_partitions

    def check_record_size(self, key: bytes | None, value: bytes | None, headers: Sequence[Header] | None) -> None:
        size = HEADER_SIZE + RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
        if headers:
            size += sum(len(name) + len(v or b"") + 10 for name, v in headers)
        if size > self.max_request_size:
            raise KafkaException(
                f"the record is {size} bytes when serialized, which is larger than {self.max_request_size}, "
                f"the value of max.request.size",
                ErrorCode.message_too_large,
            )
        if size > self.buffer_memory:
            raise KafkaException(
                f"the record is {size} bytes when serialized, which is larger than the total memory buffer "
                f"configured with buffer.memory ({self.buffer_memory})",
                ErrorCode.message_too_large,
            )

    def partitions_of(self, state: TopicState) -> list[int]:
        return list(range(state.num_partitions))

    async def flush_all(self) -> None:
        """Wait (on the loop) until every batch appended so far completed."""
        accumulator = self.accumulator
        results = accumulator.begin_flush()
        try:
            if self.sender is not None:
                self.sender.wakeup()
            waits = [_finished(result) for result in results if not result.finished]
            if waits:
                await asyncio.gather(*waits)
        finally:
            accumulator.end_flush()

    def transaction_manager(self) -> TransactionManager:
        if self.transactions is None:
            raise KafkaException("transactional methods need a transactional.id")
        return self.transactions

    def timeout_or_max_block(self, timeout: float | None) -> float:
        return self.max_block if timeout is None else timeout

    async def close(self, timeout: float | None, abort_open_transaction: bool = True) -> None:
        self.closed = True
        transactions = self.transactions
        if transactions is not None:
            if abort_open_transaction and transactions.has_ongoing_transaction and (timeout is None or timeout > 0):
                # As Java's producer does: a transaction left open is aborted, not left to time out.
                started = time.monotonic()
                try:
                    await transactions.abort_transaction(self.max_block if timeout is None else timeout)
                except KafkaException as exc:
                    log.info("transactional id %s: abort on close failed: %s", self.transactional_id, exc)
                if timeout is not None:
                    timeout = max(0.0, timeout - (time.monotonic() - started))
            transactions.close()
        if self.sender is not None:
            await self.sender.close(timeout)
        if self.metadata is not None:
            await self.metadata.stop()
        if self.client is not None:
            await self.client.close()


class Producer:
    """A Kafka producer whose ``send`` works in the calling thread (thread-safe).

    ``Producer({"bootstrap.servers": "host:9092", "linger.ms": 5, "compression.type": "lz4"})``
    takes the Java client's config keys.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._core = core = _ProducerCore(config)
        self._accumulator = core.accumulator
        self._max_block = core.max_block
        self._ignore_keys = core.ignore_keys
        self._size_check = core.size_check
        self._thread = EventLoopThread(f"strom-producer-{core.settings['client.id']}")
        self._closed = False
        self._close_lock = threading.Lock()
        self._close_task: asyncio.Future[None] | None = None
        try:
            self._thread.run(core.start())
        except BaseException:
            self._thread.stop()
            raise
        sender = core.sender
        assert sender is not None
        loop = self._thread.loop

        def wakeup() -> None:
            # A closed producer's loop is gone too, and then there is nothing left to send.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(sender.wakeup)

        self._accumulator.wakeup = wakeup
        self._accumulator.yield_gil = True
        self._transactions = core.transactions
        if core.transactions is not None:
            # send() registers a transaction's partitions from the caller's thread.
            core.transactions.wakeup = wakeup

    @property
    def config(self) -> dict[str, Any]:
        return dict(self._core.settings)

    def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
        callback: Callback | None = None,
    ) -> FutureRecordMetadata:
        """Queue a record; returns its future at once unless metadata or buffer space must be waited for.

        ``callback(metadata, exception)`` runs on the producer's I/O thread once the
        record is acknowledged or failed, in send order per partition. Raises
        KafkaTimeoutError after ``max.block.ms`` without metadata or buffer memory, and
        KafkaException (MESSAGE_TOO_LARGE) for a record above ``max.request.size``.
        """
        transactions = self._transactions
        if transactions is not None:
            transactions.fail_if_not_ready_for_send()
        if value is not None and value.__class__ is not bytes:
            value = _to_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = _to_bytes(key, "key")
        checked_headers = _check_headers(headers) if headers else None
        max_block = self._max_block
        requested_partition = partition
        state = self._accumulator.topics.get(topic)
        if state is None or not state.num_partitions or (partition is not None and partition >= state.num_partitions):
            started = time.monotonic()
            state = self._wait_on_metadata(topic, partition)
            max_block = max(0.0, max_block - (time.monotonic() - started))
        if partition is None:
            partition = -1 if key is None or self._ignore_keys else self._core.key_partition(key, state.num_partitions)
        elif partition < 0:
            raise KafkaException(f"invalid partition {partition} for topic {topic}")
        if (len(value) if value else 0) + (len(key) if key else 0) > self._size_check or checked_headers:
            self._core.check_record_size(key, value, checked_headers)
        if timestamp is None:
            timestamp = time.time_ns() // 1_000_000
        try:
            future = self._accumulator.append(
                state, partition, timestamp, key, value, checked_headers, callback, max_block
            )
        except TopicExpiredError:
            # Idle for metadata.max.idle.ms just now: its metadata is fetched again first.
            return self.send(
                topic,
                value,
                key,
                partition=requested_partition,
                timestamp=timestamp,
                headers=checked_headers,
                callback=callback,
            )
        assert future is not None  # with a max_block, append waits rather than returning None
        if transactions is not None:
            transactions.maybe_add_partition(future.topic_partition)
        return future  # type: ignore[return-value]  # the accumulator's future_factory

    def _wait_on_metadata(self, topic: str, partition: int | None) -> TopicState:
        if self._closed:
            raise KafkaException("cannot send: the producer is closed")
        # The loop-side wait has its own deadline; the extra second only guards a stuck loop.
        return self._thread.run(
            self._core.wait_on_metadata(topic, partition, self._max_block), self._max_block + 1.0
        )

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait until each of those records completed."""
        if self._thread.is_current:
            raise KafkaException("flush() inside a producer callback would deadlock")
        accumulator = self._accumulator
        results = accumulator.begin_flush()
        try:
            accumulator.wakeup()
            deadline = None if timeout is None else time.monotonic() + timeout
            for result in results:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not result.wait(remaining):
                    raise KafkaTimeoutError(f"flush did not complete within {timeout} s")
        finally:
            accumulator.end_flush()

    # -- transactions ------------------------------------------------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Register the ``transactional.id`` with its coordinator, first and once.

        This fences every older producer with the same id and ends (commits or aborts)
        a transaction one of them left open. Raises KafkaTimeoutError after ``timeout``
        seconds (default ``max.block.ms``); calling it again keeps waiting for the same
        request. ProducerFencedError and other TransactionFatalErrors leave a producer that
        can only be closed.
        """
        core = self._core
        self._thread.run(core.transaction_manager().init_transactions(core.timeout_or_max_block(timeout)))

    def begin_transaction(self) -> None:
        """Start a transaction: what is sent from now on is committed or aborted as one."""
        self._core.transaction_manager().begin_transaction()

    def send_offsets_to_transaction(
        self, offsets: Offsets, group_metadata: ConsumerGroupMetadata | str, timeout: float | None = None
    ) -> None:
        """Commit a consumer's offsets (the next offsets to read) with the transaction.

        ``group_metadata`` is the consumer's ``group_metadata()`` (a group id alone skips
        the group coordinator's check that the member still owns its partitions).
        """
        core = self._core
        self._thread.run(
            core.transaction_manager().send_offsets_to_transaction(
                normalize_offsets(offsets), _group(group_metadata), core.timeout_or_max_block(timeout)
            )
        )

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Send what is queued, then commit the transaction.

        Raises TransactionAbortableError when a record of the transaction failed (then
        ``abort_transaction()``), KafkaTimeoutError after ``timeout`` seconds (default
        ``max.block.ms``; calling it again keeps waiting for the same commit).
        """
        core = self._core
        self._thread.run(core.transaction_manager().commit_transaction(core.timeout_or_max_block(timeout)))

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: queued records fail with TransactionAbortedError, sent ones are discarded."""
        core = self._core
        self._thread.run(core.transaction_manager().abort_transaction(core.timeout_or_max_block(timeout)))

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids (waits up to max.block.ms for metadata)."""
        state = self._accumulator.topics.get(topic)
        if state is None or not state.num_partitions:
            state = self._wait_on_metadata(topic, None)
        return self._core.partitions_of(state)

    def producer_id_and_epoch(self) -> tuple[int, int]:
        """The producer id and epoch of a transactional producer (-1, -1 before init_transactions):
        with the transactional id, what EndTxn must name to end its transaction from elsewhere
        (``strom.client.producer.end_transactions``)."""
        manager = self._core.transaction_manager()
        return manager.producer_id, manager.producer_epoch

    def close(self, timeout: float | None = None, *, abort_open_transaction: bool = True) -> None:
        """Send what is queued (within ``timeout`` s), then stop; ``close(0)`` fails pending records.

        A transaction still open is aborted first, as Java's producer does, unless
        ``abort_open_transaction`` is False: then it stays open, its records sent, for another
        process to end with EndTxn (or for its coordinator to abort at ``transaction.timeout.ms``).
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._thread.is_current:
            # From a callback, as in Java: close(0), without waiting for the I/O thread (this one).
            self._close_task = asyncio.ensure_future(self._close_from_callback())
            return
        try:
            self._thread.run(self._core.close(timeout, abort_open_transaction))
        finally:
            self._thread.stop()

    async def _close_from_callback(self) -> None:
        try:
            await self._core.close(0)
        finally:
            self._thread.stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncFutureRecordMetadata(RecordFuture):
    """The asyncio future of one record sent with AsyncProducer.

    It follows asyncio's Future protocol (``asyncio.isfuture`` is true: await it, pass it to
    ``gather``, ``wait``, ``wait_for`` or ``shield``; ``done``, ``result``, ``exception``,
    ``add_done_callback``, ``cancel``), but it is a view of the record's batch: a loop future
    stands behind it only once something waits on it or cancels it. Records nobody waits for
    cost nothing when their batch completes (most of a fast producer's records).
    Cancelling it does not unsend the record.
    """

    __slots__ = ("_future", "_loop")

    # What asyncio.isfuture() looks for (asyncio's duck-typed Future protocol).
    _asyncio_future_blocking = False

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        result: ProduceRequestResult,
        relative_offset: int,
        timestamp: int,
        key_size: int,
        value_size: int,
    ) -> None:
        self._loop = loop
        self._future: asyncio.Future[RecordMetadata] | None = None
        self._result = result
        self._relative_offset = relative_offset
        self._timestamp = timestamp
        self._key_size = key_size
        self._value_size = value_size

    def _waiter(self) -> asyncio.Future[RecordMetadata]:
        """The loop future behind this one, completed when the batch finishes (created once)."""
        future = self._future
        if future is None:
            future = self._future = self._loop.create_future()
            if self._result.finished:
                self._settle()
            else:
                self._result.add_listener(self._settle)
        return future

    def _settle(self) -> None:
        # On the loop, where batches complete.
        future = self._future
        if future is not None and not future.done():
            error = self._error()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(self._metadata())

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._result.completed or (self._future is not None and self._future.done())

    def cancelled(self) -> bool:
        return self._future is not None and self._future.cancelled()

    def cancel(self, msg: Any = None) -> bool:
        if self._result.completed:
            return False
        return self._waiter().cancel(msg)

    def result(self) -> RecordMetadata:
        """The record's metadata; raises its error, or InvalidStateError before it completed."""
        future = self._future
        if future is not None and future.done():
            return future.result()  # raises CancelledError if it was cancelled
        if not self._result.completed:
            raise asyncio.InvalidStateError("Result is not set.")
        error = self._error()
        if error is not None:
            raise error
        return self._metadata()

    def exception(self) -> BaseException | None:
        future = self._future
        if future is not None and future.done():
            return future.exception()  # raises CancelledError if it was cancelled
        if not self._result.completed:
            raise asyncio.InvalidStateError("Exception is not set.")
        return self._error()

    def add_done_callback(self, fn: Callable[[Any], object], *, context: Any = None) -> None:
        """``fn(this future)`` on the loop once the record completed."""
        self._waiter().add_done_callback(_Relay(fn, self), context=context)

    def remove_done_callback(self, fn: Callable[[Any], object]) -> int:
        if self._future is None:
            return 0
        return self._future.remove_done_callback(fn)

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        if not self._result.completed:
            yield from self._waiter()
        return self.result()

    __iter__ = __await__

    def __repr__(self) -> str:
        state = "cancelled" if self.cancelled() else "done" if self.done() else "pending"
        return f"<AsyncFutureRecordMetadata {self._result.tp} +{self._relative_offset} {state}>"


class _Relay:
    """A done callback of the loop future behind an AsyncFutureRecordMetadata, handing the
    latter to ``fn``; equal to ``fn``, so that ``remove_done_callback(fn)`` finds it."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[Any], object], future: AsyncFutureRecordMetadata) -> None:
        self.fn = fn
        self.future = future

    def __call__(self, _inner: asyncio.Future[RecordMetadata]) -> None:
        self.fn(self.future)

    def __eq__(self, other: object) -> bool:
        return self.fn == (other.fn if isinstance(other, _Relay) else other)

    def __hash__(self) -> int:
        return hash(self.fn)


class AsyncProducer:
    """The producer on the caller's asyncio event loop: ``await start()``, ``await send(...)``."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._core = _ProducerCore(config)
        self._accumulator = self._core.accumulator
        self._space = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        if self._loop is not None:
            return
        await self._core.start()
        sender = self._core.sender
        assert sender is not None
        self._accumulator.wakeup = sender.wakeup
        self._accumulator.space_listener = self._space.set
        self._loop = loop = asyncio.get_running_loop()
        self._accumulator.future_factory = functools.partial(AsyncFutureRecordMetadata, loop)

    async def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
        callback: Callback | None = None,
    ) -> AsyncFutureRecordMetadata:
        """Queue a record (awaiting metadata or buffer space up to max.block.ms); returns its future.

        ``callback(metadata, exception)`` runs on the loop once the record is acknowledged
        or failed, in send order per partition.
        """
        if self._loop is None:
            raise KafkaException("the producer is not started: await start() first")
        core = self._core
        accumulator = self._accumulator
        transactions = core.transactions
        if transactions is not None:
            transactions.fail_if_not_ready_for_send()
        if value is not None and value.__class__ is not bytes:
            value = _to_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = _to_bytes(key, "key")
        checked_headers = _check_headers(headers) if headers else None
        started = time.monotonic()
        requested_partition = partition
        state = accumulator.topics.get(topic)
        if state is None or not state.num_partitions or (partition is not None and partition >= state.num_partitions):
            if core.closed:
                raise KafkaException("cannot send: the producer is closed")
            state = await core.wait_on_metadata(topic, partition, core.max_block)
        if partition is None:
            partition = -1 if key is None or core.ignore_keys else core.key_partition(key, state.num_partitions)
        elif partition < 0:
            raise KafkaException(f"invalid partition {partition} for topic {topic}")
        if (len(value) if value else 0) + (len(key) if key else 0) > core.size_check or checked_headers:
            core.check_record_size(key, value, checked_headers)
        if timestamp is None:
            timestamp = time.time_ns() // 1_000_000
        sender_was_woken = accumulator.wakeup_pending
        try:
            while (
                future := accumulator.append(state, partition, timestamp, key, value, checked_headers, callback, None)
            ) is None:
                await accumulator.wait_for_space(started + core.max_block, self._space)
        except TopicExpiredError:
            # Idle for metadata.max.idle.ms just now: its metadata is fetched again first.
            return await self.send(
                topic,
                value,
                key,
                partition=requested_partition,
                timestamp=timestamp,
                headers=checked_headers,
                callback=callback,
            )
        if transactions is not None:
            transactions.maybe_add_partition(future.topic_partition)
        if not sender_was_woken and accumulator.wakeup_pending:
            # A batch started (or filled): let the sender, on this same loop, take its turn.
            await asyncio.sleep(0)
        return future  # type: ignore[return-value]  # the accumulator's future_factory

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
    ) -> RecordMetadata:
        future = await self.send(topic, value, key, partition=partition, timestamp=timestamp, headers=headers)
        return await future

    async def flush(self, timeout: float | None = None) -> None:
        accumulator = self._accumulator
        results = accumulator.begin_flush()
        try:
            accumulator.wakeup()
            waits = [_finished(result) for result in results if not result.finished]
            if waits:
                try:
                    async with asyncio.timeout(timeout):
                        await asyncio.gather(*waits)
                except TimeoutError:
                    raise KafkaTimeoutError(f"flush did not complete within {timeout} s") from None
        finally:
            accumulator.end_flush()

    # -- transactions (as Producer's) ---------------------------------------------------------

    async def init_transactions(self, timeout: float | None = None) -> None:
        core = self._core
        await core.transaction_manager().init_transactions(core.timeout_or_max_block(timeout))

    def begin_transaction(self) -> None:
        self._core.transaction_manager().begin_transaction()

    async def send_offsets_to_transaction(
        self, offsets: Offsets, group_metadata: ConsumerGroupMetadata | str, timeout: float | None = None
    ) -> None:
        core = self._core
        await core.transaction_manager().send_offsets_to_transaction(
            normalize_offsets(offsets), _group(group_metadata), core.timeout_or_max_block(timeout)
        )

    async def commit_transaction(self, timeout: float | None = None) -> None:
        core = self._core
        await core.transaction_manager().commit_transaction(core.timeout_or_max_block(timeout))

    async def abort_transaction(self, timeout: float | None = None) -> None:
        core = self._core
        await core.transaction_manager().abort_transaction(core.timeout_or_max_block(timeout))

    async def partitions_for(self, topic: str) -> list[int]:
        state = self._accumulator.topics.get(topic)
        if state is None or not state.num_partitions:
            state = await self._core.wait_on_metadata(topic, None, self._core.max_block)
        return self._core.partitions_of(state)

    async def stop(self, timeout: float | None = None) -> None:
        if self._core.closed:
            return
        await self._core.close(timeout)

    close = stop

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def _finished(result: ProduceRequestResult) -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done() -> None:
        if not future.done():
            future.set_result(None)

    result.add_listener(done)
    return future
