"""The record accumulator: per-partition queues of batches that the sender drains.

``send`` runs in the caller's thread: it appends the record's bytes to the open batch
of its partition under one lock and returns a future that points at the batch's
shared result (Java's FutureRecordMetadata over ProduceRequestResult). The sender, on
the event loop, asks which leaders have sendable batches (``ready``), takes batches off
the queue fronts (``drain``), puts failed ones back in sequence order (``reenqueue``),
and expires those past ``delivery.timeout.ms``.

Memory is accounted as in Kafka's BufferPool: a new batch reserves ``batch.size`` bytes
(more for a larger first record) out of ``buffer.memory`` until it completes; when the
pool is exhausted, ``send`` waits (``max.block.ms``) and every batch counts as ready.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from strom.client.cluster import TopicPartition
from strom.client.errors import KafkaException, KafkaTimeoutError
from strom.client.producer.partitioner import RoundRobinPartitioner, StickyPartitioner
from strom.records.batch import HEADER_SIZE, CompressionType
from strom.records.builder import RecordBatchBuilder, rewrite_producer_state

if TYPE_CHECKING:
    from strom.client.producer.idempotence import IdempotenceManager

log = logging.getLogger(__name__)

Header = tuple[str, bytes | None]
Callback = Callable[["RecordMetadata | None", "Exception | None"], Any]

NO_SEQUENCE = -1
# Upper bound of one record's framing inside a batch (length, attributes, deltas, lengths).
RECORD_OVERHEAD = 21
_MAX_SEQUENCE = 0x7FFFFFFF


class RecordMetadata(NamedTuple):
    """Where a record landed. ``offset`` is -1 when unknown (acks=0, or a duplicate the broker
    no longer has metadata for); ``timestamp`` is the broker's LogAppendTime if the topic uses it.

    A named tuple (as in kafka-python and aiokafka): one is built per record that has a
    callback, and a tuple builds in a seventh of a frozen dataclass's time.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    serialized_key_size: int
    serialized_value_size: int


# RecordMetadata without the keyword-argument handling of its __new__ (the completion loop's).
_new_tuple = tuple.__new__


_listeners_lock = threading.Lock()


class ProduceRequestResult:
    """The outcome of one batch, shared by the futures of all its records.

    A batch the broker found too large is split; its result then completes when all
    the parts have, and each record's outcome is its part's (``children``).
    """

    __slots__ = (
        "_event",
        "_finished",
        "_listeners",
        "base_offset",
        "children",
        "completed",
        "error",
        "log_append_time",
        "tp",
    )

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.base_offset = -1
        self.log_append_time = -1
        self.error: Exception | None = None
        # Set before the callbacks run, so a callback may read its own future.
        self.completed = False
        # (first relative offset, part) per part of a split batch, in order.
        self.children: list[tuple[int, ProduceRequestResult]] | None = None
        # Created by the first thread that waits: most batches are never waited for one by one.
        self._event: threading.Event | None = None
        self._finished = False
        self._listeners: list[Callable[[], Any]] | None = None

    def complete(self, base_offset: int, log_append_time: int, error: Exception | None) -> None:
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.error = error
        self.completed = True

    def finish(self) -> None:
        """After the record callbacks: release waiters (get, flush) and listeners."""
        with _listeners_lock:
            self._finished = True
            listeners, self._listeners = self._listeners, None
            event = self._event
        if event is not None:
            event.set()
        for listener in listeners or ():
            try:
                listener()
            except Exception:
                log.exception("producer result listener failed")

    def split(self, children: list[tuple[int, ProduceRequestResult]]) -> None:
        """Complete once every part has (records resolve to their part's outcome)."""
        self.children = children
        remaining = [len(children)]

        def part_finished() -> None:
            remaining[0] -= 1
            if not remaining[0]:
                self.completed = True
                self.finish()

        for _, child in children:
            child.add_listener(part_finished)

    def resolve(self, relative_offset: int) -> tuple[ProduceRequestResult, int]:
        """The result (and position in it) that holds the record at ``relative_offset``."""
        result = self
        while result.children is not None:
            for start, child in reversed(result.children):
                if relative_offset >= start:
                    result, relative_offset = child, relative_offset - start
                    break
        return result, relative_offset

    @property
    def finished(self) -> bool:
        return self._finished

    def wait(self, timeout: float | None) -> bool:
        with _listeners_lock:
            if self._finished:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        return event.wait(timeout)

    def add_listener(self, listener: Callable[[], Any]) -> None:
        """Call ``listener`` once the batch finished (now, if it already has)."""
        with _listeners_lock:
            if not self._finished:
                if self._listeners is None:
                    self._listeners = []
                self._listeners.append(listener)
                return
        listener()


class RecordFuture:
    """One sent record: its batch's shared result plus the record's position in the batch.

    Nothing is done per record when the batch completes: the metadata is built when
    asked for (``_metadata``), from the batch's base offset and the record's position.
    """

    __slots__ = ("_key_size", "_relative_offset", "_result", "_timestamp", "_value_size")

    def __init__(
        self, result: ProduceRequestResult, relative_offset: int, timestamp: int, key_size: int, value_size: int
    ) -> None:
        self._result = result
        self._relative_offset = relative_offset
        self._timestamp = timestamp
        self._key_size = key_size
        self._value_size = value_size

    @property
    def topic_partition(self) -> TopicPartition:
        return self._result.tp

    def _error(self) -> Exception | None:
        """The record's error once its batch completed (the part's, for a split batch)."""
        return self._result.resolve(self._relative_offset)[0].error

    def _metadata(self) -> RecordMetadata:
        result, relative_offset = self._result.resolve(self._relative_offset)
        tp = result.tp
        base = result.base_offset
        return _new_tuple(
            RecordMetadata,
            (
                tp.topic,
                tp.partition,
                base + relative_offset if base >= 0 else -1,
                result.log_append_time if result.log_append_time >= 0 else self._timestamp,
                self._key_size,
                self._value_size,
            ),
        )


class FutureRecordMetadata(RecordFuture):
    """The future of one record sent with the synchronous Producer."""

    __slots__ = ()

    def done(self) -> bool:
        return self._result.completed

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait for the record's delivery; raise its error, or KafkaTimeoutError after ``timeout`` s."""
        error = self.exception(timeout)
        if error is not None:
            raise error
        return self._metadata()

    result = get

    def exception(self, timeout: float | None = None) -> Exception | None:
        result = self._result
        if not result.completed and not result.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout} s")
        return self._error()

    def add_callback(self, callback: Callback) -> None:
        """``callback(metadata, exception)`` once the record completed (at once if it has)."""
        self._result.add_listener(lambda: self._fire(callback))

    def _fire(self, callback: Callback) -> None:
        error = self.exception(0)
        callback(None if error is not None else self._metadata(), error)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<FutureRecordMetadata {self._result.tp} +{self._relative_offset} {state}>"


class ProducerBatch(RecordBatchBuilder):
    """A batch of one partition: its records, their callbacks and its delivery state."""

    __slots__ = (
        "attempts",
        "backoff",
        "base_sequence",
        "built",
        "created",
        "deadline",
        "final_error",
        "is_done",
        "last_attempt",
        "leader_epoch",
        "producer_epoch",
        "producer_id",
        "record_base",
        "reserved",
        "result",
        "sequence_reset",
        "state_changed",
        "thunks",
        "tp",
    )

    def __init__(self, tp: TopicPartition, limit: int, now: float, delivery_timeout: float, reserved: int) -> None:
        super().__init__(limit)
        self.tp = tp
        self.result = ProduceRequestResult(tp)
        self.thunks: list[tuple[RecordFuture, Callback]] = []
        # Position of the first record in the batch its futures point at (a split batch's part).
        self.record_base = 0
        self.created = self.last_attempt = now
        self.deadline = now + delivery_timeout
        self.attempts = 0
        self.backoff = 0.0
        # The partition's leader epoch when the batch was last sent (-1: not sent, or unknown).
        self.leader_epoch = -1
        self.reserved = reserved
        self.built: bytearray | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = NO_SEQUENCE
        self.sequence_reset = False
        self.state_changed = False
        self.is_done = False
        self.final_error: Exception | None = None

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence != NO_SEQUENCE

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.record_count - 1) % (_MAX_SEQUENCE + 1)

    @property
    def in_retry(self) -> bool:
        return self.attempts > 0

    def backing_off(self, now: float, leader_epoch: int) -> bool:
        """Waiting out retry.backoff.ms before the next attempt; not when the partition has a
        newer leader than the one that failed it (KIP-951: the new leader is likely fine)."""
        if self.attempts == 0 or now - self.last_attempt >= self.backoff:
            return False
        return not (leader_epoch > self.leader_epoch >= 0)

    def set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence

    def reset_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        """New id/epoch/sequence for a batch that was already sent (after an epoch bump)."""
        self.set_producer_state(producer_id, producer_epoch, base_sequence)
        self.sequence_reset = True
        self.state_changed = True

    def close(self, compression: int, level: int | None, transactional: bool = False) -> bytearray:
        """The batch's wire bytes, built on first drain and patched when its producer state changed."""
        built = self.built
        if built is None:
            built = self.built = self.build(
                compression=compression,
                compression_level=level,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=self.base_sequence,
                is_transactional=transactional,
            )
        elif self.state_changed:
            rewrite_producer_state(built, self.producer_id, self.producer_epoch, self.base_sequence)
        self.state_changed = False
        return built

    def done(self, base_offset: int, log_append_time: int, error: Exception | None) -> bool:
        """Complete every record's future and run the callbacks in order; False if already done."""
        if self.is_done:
            if error is None and self.final_error is not None:
                log.debug("%s: a response arrived for a batch that already failed: %s", self.tp, self.final_error)
            return False
        self.is_done = True
        self.final_error = error
        result = self.result
        result.complete(base_offset, log_append_time, error)
        thunks = self.thunks
        if thunks:
            self.thunks = []
            if error is None:
                # RecordFuture._metadata for each record, with what they share looked up once.
                topic, partition = self.tp.topic, self.tp.partition
                base = base_offset - self.record_base
                for future, callback in thunks:
                    metadata = _new_tuple(
                        RecordMetadata,
                        (
                            topic,
                            partition,
                            base + future._relative_offset if base_offset >= 0 else -1,
                            log_append_time if log_append_time >= 0 else future._timestamp,
                            future._key_size,
                            future._value_size,
                        ),
                    )
                    try:
                        callback(metadata, None)
                    except Exception:
                        log.exception("producer callback for %s raised", self.tp)
            else:
                for _, callback in thunks:
                    try:
                        callback(None, error)
                    except Exception:
                        log.exception("producer callback for %s raised", self.tp)
        result.finish()
        return True

    def __repr__(self) -> str:
        return f"<ProducerBatch {self.tp} records={self.record_count} seq={self.base_sequence}>"


class PartitionQueue:
    """The batches of one partition, oldest first; ``open`` is the last one while it takes records."""

    __slots__ = ("batches", "open", "tp")

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.batches: deque[ProducerBatch] = deque()
        self.open: ProducerBatch | None = None


class TopicExpiredError(Exception):
    """``append`` to a topic that metadata.max.idle.ms dropped: look it up again."""


class TopicState:
    """One topic as the producer sees it: partitions, their leaders and queues, its partitioner.

    Written by metadata updates on the event loop; read without a lock by ``send``
    (each attribute is replaced whole, never mutated in place).
    """

    __slots__ = (
        "available",
        "expired",
        "last_used",
        "leader_epochs",
        "leaders",
        "name",
        "num_partitions",
        "partitioner",
        "queues",
        "round_robin",
    )

    def __init__(self, name: str, sticky_batch_size: int) -> None:
        self.name = name
        # When a batch for it last started (a topic in use starts one at least every linger.ms).
        self.last_used = time.monotonic()
        # Dropped for being idle (metadata.max.idle.ms): a send that still holds it must look again.
        self.expired = False
        self.num_partitions = 0
        self.leaders: list[int] = []
        self.leader_epochs: list[int] = []  # -1 where the broker names no epoch
        self.available: list[int] = []  # partitions with a known leader
        self.queues: list[PartitionQueue] = []
        self.partitioner = StickyPartitioner(sticky_batch_size)
        self.round_robin = RoundRobinPartitioner()

    def update(self, leaders: list[int], known_nodes: Iterable[int], leader_epochs: list[int] | None = None) -> None:
        nodes = set(known_nodes)
        if len(leaders) > len(self.queues):
            self.queues = self.queues + [
                PartitionQueue(TopicPartition(self.name, p)) for p in range(len(self.queues), len(leaders))
            ]
        self.leader_epochs = leader_epochs if leader_epochs is not None else [-1] * len(leaders)
        self.leaders = leaders
        self.available = [p for p, leader in enumerate(leaders) if leader >= 0 and leader in nodes]
        self.num_partitions = len(leaders)


@dataclass(slots=True)
class ReadyCheckResult:
    nodes: set[int] = field(default_factory=set)
    next_ready_check: float = float("inf")  # seconds from now
    unknown_leader_topics: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _NodeLatency:
    ready_time: float = 0.0
    drain_time: float = 0.0


class RecordAccumulator:
    def __init__(
        self,
        *,
        batch_size: int,
        buffer_memory: int,
        linger: float,
        delivery_timeout: float,
        retry_backoff: float,
        retry_backoff_max: float,
        compression: int = CompressionType.NONE,
        compression_level: int | None = None,
        partitioner: str = "default",
        adaptive_partitioning: bool = True,
        partition_availability_timeout: float = 0.0,
    ) -> None:
        self.batch_size = max(batch_size, HEADER_SIZE + RECORD_OVERHEAD)
        self.available_memory = buffer_memory
        self.linger = linger
        self.delivery_timeout = delivery_timeout
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = max(retry_backoff, retry_backoff_max)
        self.compression = compression
        self.compression_level = compression_level
        self.partitioner = partitioner
        self._sticky = partitioner == "default"
        self.adaptive = adaptive_partitioning and self._sticky
        self.availability_timeout = partition_availability_timeout
        self.topics: dict[str, TopicState] = {}
        # Held by send() while it appends. The sender's side takes it only to take an open
        # batch away from send() (see _take_front) and to wake threads waiting for memory.
        self.lock = threading.Lock()
        self._space = threading.Condition(self.lock)
        self._memory_waiters = 0
        # Memory of completed batches, returned by the sender without the lock and folded
        # into available_memory by the next append that needs it.
        self._released: deque[int] = deque()
        self.space_listener: Callable[[], None] | None = None  # the async face's wake-up
        # Whether the sender was woken and has not yet looked at the queues: no need to wake it again.
        self.wakeup_pending = False
        self.wakeup: Callable[[], None] = lambda: None
        self.flushes_in_progress = 0
        self.closed = False
        self.closed_error: KafkaException | None = None
        self.incomplete: dict[ProducerBatch, int] = {}  # batch -> its reserved memory
        self._drain_index: dict[int, int] = {}
        self._node_latency: dict[int, _NodeLatency] = {}
        self.idempotence: IdempotenceManager | None = None  # set by the producer when enabled
        self.transactional = False  # batches carry the transactional flag (a transactional.id is set)
        # Set when send() runs on another thread than the I/O loop (the synchronous Producer).
        self.yield_gil = False
        # What append returns for a record (the async face sets its own kind of future).
        self.future_factory: Callable[[ProduceRequestResult, int, int, int, int], RecordFuture] = (
            FutureRecordMetadata
        )

    # -- the caller's side -----------------------------------------------------------------

    def topic_state(self, topic: str) -> TopicState:
        state = self.topics.get(topic)
        if state is None:
            with self.lock:
                state = self.topics.get(topic)
                if state is None:
                    state = self.topics[topic] = TopicState(topic, self.batch_size)
        return state

    def append(
        self,
        topic: TopicState,
        partition: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] | None,
        callback: Callback | None,
        max_block: float | None,
    ) -> RecordFuture | None:
        """Append a record to its partition's open batch, starting a batch if needed.

        ``partition`` < 0 lets the topic's partitioner pick (keyless records). Waits up
        to ``max_block`` seconds for buffer memory; with ``max_block=None`` returns None
        instead of waiting (the async face then awaits ``wait_for_space``).
        """
        key_size = len(key) if key is not None else -1
        value_size = len(value) if value is not None else -1
        deadline = 0.0
        new_batch = False
        lock = self.lock
        lock.acquire()
        try:
            while True:
                if self.closed:
                    raise self.closed_error or KafkaException("cannot send: the producer is closed")
                sticky = None
                if partition >= 0:
                    chosen = partition
                elif self._sticky:
                    sticky = topic.partitioner
                    chosen = sticky.current
                    if chosen < 0:
                        chosen = sticky.partition(topic.available, topic.num_partitions)
                elif self.partitioner == "round_robin":
                    chosen = topic.round_robin.partition(topic.available, topic.num_partitions)
                else:  # murmur2_random: keyless records anywhere
                    chosen = random.randrange(topic.num_partitions)
                queue = topic.queues[chosen]
                batch = queue.open
                if batch is not None:
                    size = batch.try_append(timestamp, key, value, headers)
                    if size:
                        future = self.future_factory(
                            batch.result, batch.record_count - 1, timestamp, key_size, value_size
                        )
                        if callback is not None:
                            batch.thunks.append((future, callback))
                        full = len(batch.buffer) >= batch.limit
                        if full:
                            queue.open = None
                            self._wake()
                        if sticky is not None:
                            # StickyPartitioner.on_append, its common case inlined.
                            produced = sticky.produced_bytes = sticky.produced_bytes + size
                            if produced >= sticky.sticky_batch_size:
                                sticky.maybe_switch(
                                    full or len(queue.batches) > 1, topic.available, topic.num_partitions
                                )
                        return future
                    queue.open = None  # no room: it is full, and a new batch follows
                if topic.expired:
                    # An expired topic has no open batch, so every append to it comes here.
                    raise TopicExpiredError(topic.name)
                need = HEADER_SIZE + RECORD_OVERHEAD + max(key_size, 0) + max(value_size, 0)
                if headers:
                    need += sum(len(k) + len(v or b"") + 10 for k, v in headers)
                need = max(self.batch_size, need)
                if self.available_memory < need:
                    self._reclaim()
                if self.available_memory >= need:
                    self.available_memory -= need
                    new_batch = True
                    return self._new_batch(
                        topic, queue, sticky, need, timestamp, key, value, headers, callback, key_size, value_size
                    )
                if max_block is None:
                    return None
                if not deadline:
                    deadline = time.monotonic() + max_block
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KafkaTimeoutError(
                        f"failed to allocate {need} bytes within max.block.ms "
                        f"({max_block * 1000:.0f} ms): buffer.memory is exhausted"
                    )
                self._memory_waiters += 1
                try:
                    # Every batch is ready while memory is short: make the sender look.
                    self._wake()
                    # Counted as a waiter first: memory released from now on comes with a notify.
                    self._reclaim()
                    if self.available_memory < need:
                        self._space.wait(remaining)
                finally:
                    self._memory_waiters -= 1
        finally:
            lock.release()
            if new_batch and self.yield_gil:
                # The previous batch is full (or a first one lingers): let the I/O thread take
                # the GIL now if it waits for it, to send it or to handle a response. A sending
                # thread would otherwise keep the GIL for sys.getswitchinterval() (5 ms) at a
                # time, and the I/O thread needs it for each of its callbacks.
                time.sleep(0)

    def _new_batch(
        self,
        topic: TopicState,
        queue: PartitionQueue,
        sticky: StickyPartitioner | None,
        reserved: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] | None,
        callback: Callback | None,
        key_size: int,
        value_size: int,
    ) -> RecordFuture:
        # Called with the lock held.
        now = time.monotonic()
        topic.last_used = now
        batch = ProducerBatch(queue.tp, self.batch_size, now, self.delivery_timeout, reserved)
        size = batch.try_append(timestamp, key, value, headers)
        future = self.future_factory(batch.result, 0, timestamp, key_size, value_size)
        if callback is not None:
            batch.thunks.append((future, callback))
        self.incomplete[batch] = reserved
        full = len(batch.buffer) >= batch.limit
        if not full:
            queue.open = batch
        # Queued last: once the sender can see the batch, it also sees whether it is open.
        queue.batches.append(batch)
        if sticky is not None:
            sticky.on_append(size, full or len(queue.batches) > 1, topic.available, topic.num_partitions)
        # A new batch arms the sender's linger timer (the previous one, if any, is full).
        self._wake()
        return future

    @property
    def free_memory(self) -> int:
        """Bytes of buffer.memory not reserved by an incomplete batch."""
        return self.available_memory + sum(self._released)

    def _reclaim(self) -> None:
        # With the lock held.
        released = self._released
        while released:
            self.available_memory += released.popleft()

    def _wake(self) -> None:
        # With the lock held. The sender clears the flag before it looks at the queues,
        # so a batch started after that look always wakes it again.
        if not self.wakeup_pending:
            self.wakeup_pending = True
            self.wakeup()

    async def wait_for_space(self, deadline: float, event: Any) -> None:
        """The async face's wait for buffer memory: ``event`` (an asyncio.Event) is set on release."""
        with self.lock:
            self._memory_waiters += 1
        try:
            event.clear()
            self.wakeup()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError("failed to allocate memory within max.block.ms: buffer.memory is exhausted")
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                raise KafkaTimeoutError(
                    "failed to allocate memory within max.block.ms: buffer.memory is exhausted"
                ) from None
        finally:
            with self.lock:
                self._memory_waiters -= 1

    def expire_idle_topics(self, max_idle: float, keep: Iterable[str] = ()) -> list[str]:
        """Drop the topics no batch started for in ``max_idle`` seconds (metadata.max.idle.ms),
        unless they have records queued or in flight or are in ``keep``; returns their names.

        Under the lock, so that an append either started its batch first (and the topic
        stays) or finds the topic expired (and the producer looks it up again).
        """
        cutoff = time.monotonic() - max_idle
        kept = set(keep)
        expired: list[str] = []
        with self.lock:
            idle = [
                state
                for state in self.topics.values()
                if state.last_used < cutoff
                and state.name not in kept
                and not any(queue.batches or queue.open is not None for queue in state.queues)
            ]
            if not idle:
                return expired
            busy = {batch.tp.topic for batch in self.incomplete}
            for state in idle:
                if state.name not in busy:
                    state.expired = True
                    del self.topics[state.name]
                    expired.append(state.name)
        return expired

    def begin_flush(self) -> list[ProduceRequestResult]:
        """Make every batch ready; return the results to wait for (what is incomplete now)."""
        with self.lock:
            self.flushes_in_progress += 1
            return [batch.result for batch in list(self.incomplete)]

    def end_flush(self) -> None:
        with self.lock:
            self.flushes_in_progress -= 1

    # -- the sender's side -----------------------------------------------------------------

    def deallocate(self, batch: ProducerBatch) -> None:
        """Return a completed batch's memory and stop tracking it.

        Without the lock, which a busy sending thread holds most of the time; only a
        thread waiting for memory needs to be told (under the lock).
        """
        reserved = self.incomplete.pop(batch, None)
        if reserved is None:
            return
        self._released.append(reserved)
        if self._memory_waiters:
            with self.lock:
                self._space.notify_all()
        if self.space_listener is not None:
            self.space_listener()

    def backoff_for(self, attempts: int) -> float:
        """retry.backoff.ms doubled per attempt up to retry.backoff.max.ms, with ±20% jitter."""
        base = min(self.retry_backoff * 2.0 ** max(attempts - 1, 0), self.retry_backoff_max)
        return base * random.uniform(0.8, 1.2)

    def ready(self, now: float) -> ReadyCheckResult:
        """The leaders with sendable batches, and when to look again (Java's RecordAccumulator.ready).

        No lock: only the sender removes batches, so a queue's front stays put while it
        looks, and a batch still taking records only gets fuller.
        """
        result = ReadyCheckResult()
        self.wakeup_pending = False
        urgent = self._memory_waiters > 0 or self.closed or self.flushes_in_progress > 0
        linger = self.linger
        next_check = result.next_ready_check
        for topic in list(self.topics.values()):
            leaders = topic.leaders
            adaptive = self.adaptive and topic.num_partitions > 1
            queue_sizes: list[int] = []
            partition_ids: list[int] = []
            for partition, queue in enumerate(topic.queues):
                batches = queue.batches
                leader = leaders[partition] if partition < len(leaders) else -1
                if adaptive and leader >= 0 and not self._unavailable(leader):
                    queue_sizes.append(len(batches))
                    partition_ids.append(partition)
                if not batches:
                    continue
                if leader < 0:
                    result.unknown_leader_topics.add(topic.name)
                    continue
                first = batches[0]
                waited = now - first.last_attempt
                epochs = topic.leader_epochs
                backing_off = first.backing_off(now, epochs[partition] if partition < len(epochs) else -1)
                time_to_wait = first.backoff if backing_off else linger
                full = len(batches) > 1 or len(first.buffer) >= first.limit
                if (full or waited >= time_to_wait or urgent) and not backing_off:
                    result.nodes.add(leader)
                else:
                    next_check = min(next_check, max(time_to_wait - waited, 0.0))
                next_check = min(next_check, max(first.deadline - now, 0.0))
            if adaptive:
                topic.partitioner.update_load_stats(queue_sizes, partition_ids, topic.num_partitions)
        result.next_ready_check = next_check
        return result

    def _unavailable(self, node_id: int) -> bool:
        """partitioner.availability.timeout.ms: the leader had batches ready but could not take them."""
        if self.availability_timeout <= 0:
            return False
        latency = self._node_latency.get(node_id)
        return latency is not None and latency.ready_time - latency.drain_time > self.availability_timeout

    def update_node_latency(self, node_id: int, now: float, can_drain: bool) -> None:
        stats = self._node_latency.get(node_id)
        if stats is None:
            stats = self._node_latency[node_id] = _NodeLatency(now, now)
        stats.ready_time = now
        if can_drain:
            stats.drain_time = now

    def drain(self, nodes: Iterable[int], max_size: int, now: float) -> dict[int, list[ProducerBatch]]:
        """Take up to ``max_size`` bytes of batches per node, at most one per partition.

        Each node keeps a rotating start index so that no partition starves. Batches are
        built (header, CRC, compression) here, outside the lock.
        """
        drained: dict[int, list[ProducerBatch]] = {}
        idempotence = self.idempotence
        topics = list(self.topics.values())
        for node in nodes:
            partitions = [
                (queue, topic.leader_epochs[partition] if partition < len(topic.leader_epochs) else -1)
                for topic in topics
                for partition, queue in enumerate(topic.queues)
                if partition < len(topic.leaders) and topic.leaders[partition] == node
            ]
            if not partitions:
                continue
            start = self._drain_index.get(node, 0) % len(partitions)
            ready: list[ProducerBatch] = []
            size = 0
            for i in range(len(partitions)):
                index = (start + i) % len(partitions)
                queue, leader_epoch = partitions[index]
                if not queue.batches:
                    continue
                first = queue.batches[0]
                if first.backing_off(now, leader_epoch):
                    continue
                if ready and size + len(first.buffer) > max_size:
                    break
                if idempotence is not None and idempotence.should_stop_drain(first):
                    break
                self._take_front(queue, first)
                if idempotence is not None and not first.has_sequence:
                    idempotence.assign_sequence(first)
                self._drain_index[node] = index + 1
                first.leader_epoch = leader_epoch
                built = first.close(self.compression, self.compression_level, self.transactional)
                size += len(built)
                ready.append(first)
            if ready:
                drained[node] = ready
        return drained

    def _take_front(self, queue: PartitionQueue, first: ProducerBatch) -> None:
        """Remove a queue's front batch (the sender's side)."""
        if queue.open is first:
            # Senders append to the open batch under the lock: take it from them under it too.
            with self.lock:
                if queue.open is first:
                    queue.open = None
        queue.batches.popleft()

    def reenqueue(self, batch: ProducerBatch, now: float) -> None:
        """Put a batch to retry back at the front of its queue (in sequence order when idempotent)."""
        batch.attempts += 1
        batch.last_attempt = now
        batch.backoff = self.backoff_for(batch.attempts)
        self._insert_front(self.topic_state(batch.tp.topic).queues[batch.tp.partition], batch)

    def _insert_front(self, queue: PartitionQueue, batch: ProducerBatch) -> None:
        # No lock: senders only ever add at the other end.
        batches = queue.batches
        if self.idempotence is not None and batch.has_sequence:
            # In front of every unsequenced batch and of every batch with a higher sequence.
            ahead: list[ProducerBatch] = []
            while batches and batches[0].has_sequence and batches[0].base_sequence < batch.base_sequence:
                ahead.append(batches.popleft())
            batches.appendleft(batch)
            for earlier in reversed(ahead):
                batches.appendleft(earlier)
        else:
            batches.appendleft(batch)

    def split_and_reenqueue(self, batch: ProducerBatch) -> list[ProducerBatch]:
        """Split a batch the broker refused as too large into parts, queued in its place.

        The parts take no buffer memory (the big batch's is released); the records'
        futures and callbacks follow them. An idempotent batch's sequence range is
        divided among the parts.
        """
        parts: list[ProducerBatch] = []
        starts: list[int] = []
        # At most half the refused batch, so that repeated refusals converge on batches that fit.
        limit = min(self.batch_size, max(len(batch.buffer) // 2, HEADER_SIZE + RECORD_OVERHEAD))
        for index, record in enumerate(batch.records()):
            part = parts[-1] if parts else None
            if part is None or not part.try_append(record.timestamp, record.key, record.value, record.headers):
                part = ProducerBatch(batch.tp, limit, batch.created, self.delivery_timeout, 0)
                part.record_base = batch.record_base + index
                part.try_append(record.timestamp, record.key, record.value, record.headers)
                parts.append(part)
                starts.append(index)
        for future, callback in batch.thunks:
            position = bisect.bisect_right(starts, future._relative_offset - batch.record_base) - 1
            parts[position].thunks.append((future, callback))
        batch.thunks = []
        batch.is_done = True  # a late response for the big batch is ignored
        batch.result.split([(start, part.result) for start, part in zip(starts, parts, strict=True)])
        if self.idempotence is not None:
            self.idempotence.split(batch, parts)
        for part in parts:
            self.incomplete[part] = 0
        queue = self.topic_state(batch.tp.topic).queues[batch.tp.partition]
        for part in reversed(parts):
            self._insert_front(queue, part)
        self.deallocate(batch)
        return parts

    def expired_batches(self, now: float) -> list[ProducerBatch]:
        """Remove and return queued batches past delivery.timeout.ms (oldest first per partition)."""
        expired: list[ProducerBatch] = []
        for topic in list(self.topics.values()):
            for queue in topic.queues:
                batches = queue.batches
                while batches and now >= batches[0].deadline:
                    first = batches[0]
                    self._take_front(queue, first)
                    expired.append(first)
        return expired

    def has_incomplete(self) -> bool:
        return bool(self.incomplete)

    def close(self) -> None:
        """No more appends; every queued batch becomes ready."""
        with self.lock:
            self.closed = True
            self._space.notify_all()

    def fail_appends(self, error: KafkaException) -> None:
        """A fatal error: every later send raises it."""
        with self.lock:
            self.closed = True
            self.closed_error = error
            self._space.notify_all()

    def abort_undrained(self, error: Exception) -> list[ProducerBatch]:
        """Remove every queued batch (to fail it); in-flight ones are the sender's."""
        aborted: list[ProducerBatch] = []
        with self.lock:
            for topic in self.topics.values():
                for queue in topic.queues:
                    aborted.extend(queue.batches)
                    queue.batches.clear()
                    queue.open = None
        return aborted

    def incomplete_batches(self) -> list[ProducerBatch]:
        return list(self.incomplete)
