"""Consumer (synchronous, with its own I/O thread) and AsyncConsumer (on the caller's loop).

Both wrap one ConsumerCore. poll() runs in the caller's thread: it runs queued rebalance
and commit callbacks, raises errors the I/O loop recorded, starts a rebalance when the
group needs one, and decodes buffered fetched records; only when nothing is buffered
does it wait, for the I/O loop's signal or the timeout. Calls that need the network hand
a coroutine to the loop and wait for it, running queued callbacks meanwhile (a rebalance
listener may itself call commit_sync).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

from strom.client.cluster import TopicPartition
from strom.client.consumer.core import CommitCallback, ConsumerCore, Offsets
from strom.client.consumer.fetcher import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from strom.client.consumer.structs import (
    ConsumerGroupMetadata,
    ConsumerRebalanceListener,
    OffsetAndMetadata,
    OffsetAndTimestamp,
)
from strom.client.consumer.subscription_state import OffsetResetStrategy
from strom.client.errors import KafkaException
from strom.client.loop_thread import EventLoopThread
from strom.records.reader import ConsumerRecord, FetchedBatch

T = TypeVar("T")
# Records an AsyncConsumer decodes between two chances for the loop to do I/O.
_ASYNC_DECODE_CHUNK = 1000
Topics = Iterable[str] | re.Pattern[str] | str


class Consumer:
    """Kafka's KafkaConsumer: ``Consumer({"bootstrap.servers": ..., "group.id": ...})``.

    Like Kafka's, one Consumer is used from one thread at a time.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._wake = threading.Event()
        self._thread = EventLoopThread("strom-consumer")
        try:
            self._core: ConsumerCore = self._thread.run(self._create(config))
        except BaseException:
            self._thread.stop()
            raise
        self._core.fetcher.yield_gil = True
        self._closed = False

    async def _create(self, config: Mapping[str, Any]) -> ConsumerCore:
        return ConsumerCore(config, self._wake.set)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the I/O loop; run the callbacks it queues for this thread meanwhile."""
        if self._thread.is_current:
            coroutine.close()
            raise RuntimeError("a Consumer call from its own I/O thread would deadlock")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._thread.loop)
        future.add_done_callback(lambda _f: self._wake.set())
        caller = self._core.caller
        while True:
            self._wake.clear()
            # Done before running the queue: callbacks queued before the coroutine ended (the
            # asynchronous commits a commit_sync waited for) run before this call returns.
            done = future.done()
            caller.run_pending()
            if done:
                return future.result()
            self._wake.wait()

    # -- subscriptions --------------------------------------------------------------------------

    def subscribe(self, topics: Topics, listener: ConsumerRebalanceListener | None = None) -> None:
        """Subscribe to topics, or to every topic a pattern matches (a re.Pattern or a string
        starting with ``^``); the group assigns partitions at the next poll()."""
        if isinstance(topics, (list, tuple, set, frozenset)) and not topics:
            self.unsubscribe()
            return
        self._core.subscribe(topics, listener)

    def subscription(self) -> set[str]:
        return set(self._core.subscriptions.subscription)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._core.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self._core.subscriptions.assigned_partitions()

    def unsubscribe(self) -> None:
        self._run(self._core.unsubscribe())

    # -- poll -----------------------------------------------------------------------------------

    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        """Up to ``max.poll.records`` records, waiting up to ``timeout`` seconds for some."""
        return self._poll(self._core.poll_step, timeout)

    def poll_batches(self, timeout: float = 1.0) -> list[FetchedBatch]:
        """As poll(), but the fetched record batches themselves, undecoded (about
        ``max.poll.records`` records' worth), for a caller that decodes them its own way
        (``strom.spark`` builds Arrow columns). Positions move past the batches returned."""
        return self._poll(self._core.poll_batches_step, timeout)

    def _poll(self, step: Callable[[], list[T]], timeout: float) -> list[T]:
        core = self._core
        caller = core.caller
        core.before_poll()
        deadline = time.monotonic() + timeout
        while True:
            self._wake.clear()
            if caller.pending:
                caller.run_pending()
            records = step()
            if records:
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._wake.wait(remaining)

    # -- commits ----------------------------------------------------------------------------------

    def commit_sync(self, offsets: Offsets | None = None, timeout: float | None = None) -> None:
        """Commit ``offsets`` (default: the positions of everything poll() returned) and wait."""
        self._run(self._core.commit_sync(offsets, timeout))

    def commit_async(self, offsets: Offsets | None = None, callback: CommitCallback | None = None) -> None:
        """Commit without waiting; ``callback(offsets, exception)`` runs in a later poll() or commit."""
        self._core.commit_async(offsets, callback)

    def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return self._run(self._core.committed(partitions, timeout))

    # -- positions ----------------------------------------------------------------------------------

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._core.seek(partition, offset)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._core.seek_to(partitions, OffsetResetStrategy.EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._core.seek_to(partitions, OffsetResetStrategy.LATEST)

    def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        known = self._core.known_position(partition)
        if known is not None:
            return known
        return self._run(self._core.position(partition, timeout))

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return self._run(self._core.offsets_for_times(timestamps, timeout))

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        return self._run(self._core.edge_offsets(partitions, EARLIEST_TIMESTAMP, timeout))

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        return self._run(self._core.edge_offsets(partitions, LATEST_TIMESTAMP, timeout))

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._core.pause(partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._core.resume(partitions)

    def paused(self) -> set[TopicPartition]:
        return self._core.subscriptions.paused_partitions()

    def current_lag(self, partition: TopicPartition) -> int | None:
        """Records between the position and the end (the last stable offset under read_committed)
        as the last fetch of the partition saw it, without a request; None before one answered."""
        return self._core.current_lag(partition)

    # -- metadata -----------------------------------------------------------------------------------

    def partitions_for(self, topic: str, timeout: float | None = None) -> list[int]:
        return self._run(self._core.partitions_for(topic, timeout))

    def list_topics(self, timeout: float | None = None) -> dict[str, list[int]]:
        return self._run(self._core.list_topics(timeout))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group id, generation id, member id and group instance id as this member knows them
        (for a transactional producer's ``send_offsets_to_transaction``)."""
        return self._core.group_metadata()

    def close(self, timeout: float | None = None) -> None:
        """Commit (with enable.auto.commit), leave the group (not a static member), stop the I/O thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._core.close(timeout))
        finally:
            self._thread.stop()


class AsyncConsumer:
    """The consumer on the caller's asyncio loop (create it inside a coroutine).

    The methods that need the network are coroutines; ``async for record in consumer``
    yields records one by one until the consumer is closed. Positions, commits and close()
    count only the records it yielded, also when the loop stops in the middle of a poll's.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._wake = asyncio.Event()
        self._core = ConsumerCore(config, self._wake.set)
        self._buffer: list[ConsumerRecord] = []
        self._buffered_from = 0

    async def start(self) -> AsyncConsumer:
        """Connect and fetch cluster metadata now (otherwise the first call that needs it does)."""
        self._core.check_open()
        await self._core.client.refresh_metadata([])
        return self

    async def __aenter__(self) -> AsyncConsumer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _give_back(self) -> None:
        """Hand the records ``async for`` took with poll() but has not yielded back to the fetcher.

        poll() moved the positions past them; each partition goes back to its first record
        not yielded, so commits, close() and position() never count records the application
        did not get, and a seek, pause or new assignment is never followed by stale records.
        """
        rest = self._buffer[self._buffered_from :]
        self._buffer = []
        self._buffered_from = 0
        first: dict[TopicPartition, ConsumerRecord] = {}
        for record in rest:
            first.setdefault(TopicPartition(record.topic, record.partition), record)
        subscriptions = self._core.subscriptions
        for tp, record in first.items():
            with subscriptions.lock:
                state = subscriptions.assignment.get(tp)
                if state is None or state.position is None or state.position <= record.offset:
                    continue
                subscriptions.seek(tp, record.offset, record.leader_epoch)
            self._core.fetcher.discard([tp])
        if first:
            self._core.fetcher.wakeup()

    async def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await a coroutine while running the callbacks it queues (a rebalance in unsubscribe, close)."""
        task = asyncio.ensure_future(coroutine)
        task.add_done_callback(lambda _t: self._wake.set())
        caller = self._core.caller
        while True:
            self._wake.clear()
            done = task.done()  # as in Consumer._run: what it queued before ending runs first
            await caller.run_pending_async()
            if done:
                return task.result()
            await self._wake.wait()

    def subscribe(self, topics: Topics, listener: ConsumerRebalanceListener | None = None) -> None:
        self._give_back()
        self._core.subscribe(topics, listener)

    def subscription(self) -> set[str]:
        return set(self._core.subscriptions.subscription)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._give_back()
        self._core.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self._core.subscriptions.assigned_partitions()

    async def unsubscribe(self) -> None:
        self._give_back()
        await self._run(self._core.unsubscribe())

    async def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        core = self._core
        caller = core.caller
        self._give_back()
        core.before_poll()
        deadline = time.monotonic() + timeout
        records: list[ConsumerRecord] = []
        while True:
            self._wake.clear()
            if caller.pending:
                await caller.run_pending_async()
            wanted = core.max_poll_records - len(records)
            chunk = core.poll_step(min(wanted, _ASYNC_DECODE_CHUNK))
            if chunk:
                records += chunk
                # Decoding runs on the loop: yield between chunks, so the fetcher reads the
                # responses arriving meanwhile and sends the next fetch.
                await asyncio.sleep(0)
                if len(chunk) < wanted:
                    continue  # more may be buffered now
            if records:
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            try:
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
            except TimeoutError:
                return []

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self

    async def __anext__(self) -> ConsumerRecord:
        while self._buffered_from >= len(self._buffer):
            if self._core.closed:
                raise StopAsyncIteration
            try:
                self._buffer = await self.poll(timeout=1.0)
            except KafkaException:
                if self._core.closed:
                    raise StopAsyncIteration from None
                raise
            self._buffered_from = 0
        record = self._buffer[self._buffered_from]
        self._buffered_from += 1
        return record

    async def commit_sync(self, offsets: Offsets | None = None, timeout: float | None = None) -> None:
        if offsets is None:
            self._give_back()
        await self._run(self._core.commit_sync(offsets, timeout))

    def commit_async(self, offsets: Offsets | None = None, callback: CommitCallback | None = None) -> None:
        if offsets is None:
            self._give_back()
        self._core.commit_async(offsets, callback)

    async def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return await self._core.committed(partitions, timeout)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._give_back()
        self._core.seek(partition, offset)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> asyncio.Future[None]:
        """Look the earliest offsets up before the next fetch (Kafka's lazy seekToBeginning).

        Takes effect at once; it also returns an awaitable, so code written for aiokafka
        (``await consumer.seek_to_beginning()``) works unchanged.
        """
        self._give_back()
        self._core.seek_to(partitions, OffsetResetStrategy.EARLIEST)
        return _done()

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> asyncio.Future[None]:
        """Like seek_to_beginning, for the latest offsets."""
        self._give_back()
        self._core.seek_to(partitions, OffsetResetStrategy.LATEST)
        return _done()

    async def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        self._give_back()
        return await self._core.position(partition, timeout)

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return await self._core.offsets_for_times(timestamps, timeout)

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        return await self._core.edge_offsets(partitions, EARLIEST_TIMESTAMP, timeout)

    async def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        return await self._core.edge_offsets(partitions, LATEST_TIMESTAMP, timeout)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._give_back()
        self._core.pause(partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._core.resume(partitions)

    def paused(self) -> set[TopicPartition]:
        return self._core.subscriptions.paused_partitions()

    def current_lag(self, partition: TopicPartition) -> int | None:
        return self._core.current_lag(partition)

    async def partitions_for(self, topic: str, timeout: float | None = None) -> list[int]:
        return await self._core.partitions_for(topic, timeout)

    async def list_topics(self, timeout: float | None = None) -> dict[str, list[int]]:
        return await self._core.list_topics(timeout)

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._core.group_metadata()

    async def close(self, timeout: float | None = None) -> None:
        if not self._core.closed:
            self._give_back()
        await self._run(self._core.close(timeout))

    stop = close


def _done() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future
