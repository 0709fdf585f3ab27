"""The consumer's machinery on its I/O loop, shared by Consumer and AsyncConsumer.

ConsumerCore owns the network client, the subscription state, the fetcher, the group
coordinator (with ``group.id``) and a metadata task that refreshes what the consumer
needs every ``metadata.max.age.ms`` or when asked (unknown leaders, new subscriptions),
re-evaluating a pattern subscription each time. Its coroutines run on the loop; the
methods without I/O may be called from the caller's thread, which is also where
``poll_step`` decodes records.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from strom.client.cluster import TopicPartition
from strom.client.config import CONSUMER, resolve
from strom.client.consumer.caller import CallerTasks
from strom.client.consumer.coordinator import ConsumerCoordinator
from strom.client.consumer.fetcher import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, READ_COMMITTED, Fetcher
from strom.client.consumer.structs import (
    ConsumerGroupMetadata,
    ConsumerRebalanceListener,
    NoOffsetForPartitionError,
    OffsetAndMetadata,
    OffsetAndTimestamp,
)
from strom.client.consumer.subscription_state import OffsetResetStrategy, SubscriptionState
from strom.client.errors import ConfigException, ErrorCode, KafkaException, KafkaTimeoutError
from strom.client.network_client import NetworkClient
from strom.network.connection import KafkaConnectionError, RequestTimeoutError
from strom.records.reader import ConsumerRecord, FetchedBatch

log = logging.getLogger(__name__)

# How long close() may take to commit and leave the group (Kafka's default close timeout).
CLOSE_TIMEOUT = 30.0

Offsets = Mapping[TopicPartition, "OffsetAndMetadata | int"]
CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], "Exception | None"], Any]


def subscription_pattern(topics: Iterable[str] | re.Pattern[str] | str) -> re.Pattern[str] | None:
    """A regex subscription: a compiled pattern, or a string starting with ``^`` (as librdkafka reads it)."""
    if isinstance(topics, re.Pattern):
        return topics
    if isinstance(topics, str) and topics.startswith("^"):
        return re.compile(topics)
    return None


def normalize_offsets(offsets: Offsets) -> dict[TopicPartition, OffsetAndMetadata]:
    normalized: dict[TopicPartition, OffsetAndMetadata] = {}
    for tp, offset in offsets.items():
        value = offset if isinstance(offset, OffsetAndMetadata) else OffsetAndMetadata(int(offset))
        if value.offset < 0:
            raise KafkaException(f"invalid offset {value.offset} to commit for {tp}")
        normalized[tp] = value
    return normalized


class ConsumerCore:
    """Create on the consumer's event loop; ``notify`` wakes the thread that polls."""

    def __init__(self, config: Mapping[str, Any], notify: Callable[[], None]) -> None:
        self.config = resolve(CONSUMER, config, "consumer")
        if self.config["group.instance.id"] is not None and not self.config["group.id"]:
            raise ConfigException("group.instance.id needs a group.id")
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.notify = notify
        self.client = NetworkClient(self.config)
        self.subscriptions = SubscriptionState(OffsetResetStrategy(self.config["auto.offset.reset"]))
        self.caller = CallerTasks(self.loop, notify)
        self.max_poll_records: int = self.config["max.poll.records"]
        self.default_timeout = self.config["default.api.timeout.ms"] / 1000
        self.request_timeout = self.config["request.timeout.ms"] / 1000
        self.fetcher = Fetcher(
            self.client,
            self.subscriptions,
            self.config,
            request_metadata_update=self.request_metadata_update,
            notify=notify,
        )
        self.coordinator: ConsumerCoordinator | None = None
        if self.config["group.id"]:
            coordinator = self.coordinator = ConsumerCoordinator(
                self.client,
                self.config,
                self.subscriptions,
                caller=self.caller,
                notify=notify,
                assignment_changed=self._assignment_changed,
                refresh_pattern=self._refresh_metadata,
            )

            async def fetch_committed(partitions: set[TopicPartition]) -> dict[TopicPartition, Any]:
                return await coordinator.fetch_committed_offsets(partitions, self.request_timeout)

            self.fetcher.fetch_committed = fetch_committed
        self._metadata_requested = asyncio.Event()
        self._tasks = [
            asyncio.ensure_future(self.fetcher.run()),
            asyncio.ensure_future(self._metadata_loop()),
        ]
        self.closed = False

    # -- threads ------------------------------------------------------------------------------

    def on_loop(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` on the I/O loop: now if this is the loop's thread, else soon."""
        if threading.get_ident() == self._loop_thread:
            function(*args)
        else:
            self.loop.call_soon_threadsafe(function, *args)

    def check_open(self) -> None:
        if self.closed:
            raise KafkaException("the consumer is closed")

    # -- metadata -----------------------------------------------------------------------------

    def request_metadata_update(self) -> None:
        self.on_loop(self._metadata_requested.set)

    def _metadata_topics(self) -> set[str] | None:
        """What to ask metadata for; None means every topic (a pattern subscription)."""
        subscriptions = self.subscriptions
        if subscriptions.has_pattern_subscription:
            return None
        return (
            set(subscriptions.subscription)
            | subscriptions.group_subscription
            | {tp.topic for tp in list(subscriptions.assignment)}
        )

    async def _metadata_loop(self) -> None:
        max_age = self.config["metadata.max.age.ms"] / 1000
        failures = 0
        while not self.closed:
            wanted = self._metadata_topics()
            timeout: float | None = None
            if wanted is None or wanted:
                timeout = max(0.0, self.client.last_metadata_refresh + max_age - self.loop.time())
            try:
                async with asyncio.timeout(timeout):
                    await self._metadata_requested.wait()
            except TimeoutError:
                pass
            self._metadata_requested.clear()
            try:
                await self._refresh_metadata()
            except (KafkaConnectionError, RequestTimeoutError, KafkaException) as exc:
                log.info("metadata refresh failed: %s", exc)
                self._metadata_requested.set()
                failures += 1
            else:
                failures = 0
            # Refreshes come no closer together than retry.backoff.ms, doubling up to
            # retry.backoff.max.ms while they fail (a cluster in the middle of a failover).
            await self.client.backoff(min(failures, 10))

    async def _refresh_metadata(self) -> None:
        wanted = self._metadata_topics()
        if wanted is not None and not wanted:
            return
        auto_create = self.config["allow.auto.create.topics"] and wanted is not None
        cluster = await self.client.refresh_metadata(wanted, allow_auto_create=auto_create)
        subscriptions = self.subscriptions
        if subscriptions.has_pattern_subscription:
            exclude_internal = self.config["exclude.internal.topics"]
            matched = {
                name
                for name, topic in cluster.topics.items()
                if subscriptions.matches_pattern(name) and not (exclude_internal and topic.is_internal)
            }
            if subscriptions.change_subscription(matched):
                log.info("pattern subscription now matches %s", sorted(matched))
                self.notify()
        if self.coordinator is not None:
            self.coordinator.on_metadata_update(cluster)
        self.fetcher.on_metadata_update(cluster)

    # -- poll (the caller's thread) --------------------------------------------------------------

    def before_poll(self) -> None:
        """At poll()'s start: reset the poll timer and auto-commit what earlier polls returned."""
        self.check_open()
        subscriptions = self.subscriptions
        if not subscriptions.subscription and not subscriptions.assignment and subscriptions.pattern is None:
            raise KafkaException("the consumer is not subscribed to any topics or assigned any partitions")
        coordinator = self.coordinator
        if coordinator is None:
            return
        coordinator.record_poll()
        if coordinator.auto_commit and time.monotonic() >= coordinator.next_auto_commit:
            coordinator.next_auto_commit = time.monotonic() + coordinator.auto_commit_interval
            offsets = subscriptions.all_consumed()
            if offsets and not coordinator.need_rejoin():
                self.on_loop(coordinator.commit_offsets_async, offsets, None)

    def poll_step(self, max_records: int | None = None) -> list[ConsumerRecord]:
        """One look at everything poll() waits for (after the caller ran its queued callbacks)."""
        if not self._may_return_records():
            return []
        return self.fetcher.collect(self.max_poll_records if max_records is None else max_records)

    def poll_batches_step(self) -> list[FetchedBatch]:
        """poll_step for poll_batches(): whole batches, undecoded."""
        if not self._may_return_records():
            return []
        return self.fetcher.collect_batches(self.max_poll_records)

    def _may_return_records(self) -> bool:
        """Raise the group's error, rejoin if needed; False while a rebalance holds records back."""
        coordinator = self.coordinator
        if coordinator is not None:
            error = coordinator.take_error()
            if error is not None:
                raise error
            if coordinator.need_rejoin() and not coordinator.rebalancing:
                self.on_loop(coordinator.ensure_active_group)
            if coordinator.holding_records and coordinator.rebalancing:
                return False
        return True

    # -- subscriptions and positions (no I/O; any thread) ------------------------------------------

    def subscribe(
        self, topics: Iterable[str] | re.Pattern[str] | str, listener: ConsumerRebalanceListener | None
    ) -> None:
        self.check_open()
        self._require_group("subscribe")
        pattern = subscription_pattern(topics)
        if pattern is not None:
            self.subscriptions.subscribe_pattern(pattern, listener)
        elif not isinstance(topics, re.Pattern):
            names = [topics] if isinstance(topics, str) else list(topics)
            if any(not name for name in names):
                raise KafkaException("topic names must not be empty")
            if self.subscriptions.subscribe(names, listener):
                self.fetcher.discard(
                    tp for tp in self.subscriptions.assigned_partitions() if tp.topic not in names
                )
        self.request_metadata_update()

    def _assignment_changed(self, dropped: set[TopicPartition]) -> None:
        self.fetcher.discard(dropped)
        self.fetcher.wakeup()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self.check_open()
        wanted = list(partitions)
        if not wanted and not self.subscriptions.has_auto_assigned_partitions:
            self._unsubscribe_now()  # as Kafka: assigning nothing is unsubscribing
            return
        coordinator = self.coordinator
        if coordinator is not None and coordinator.auto_commit:
            offsets = self.subscriptions.all_consumed()
            if offsets:
                self.on_loop(coordinator.commit_offsets_async, offsets, None)
        before = self.subscriptions.assigned_partitions()
        if self.subscriptions.assign_from_user(wanted):
            self.fetcher.discard(before - set(wanted))
            self.request_metadata_update()
            self.fetcher.wakeup()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.check_open()
        if offset < 0:
            raise KafkaException(f"seek offset must not be negative: {offset}")
        self.subscriptions.seek(tp, offset)
        self.fetcher.discard([tp])
        self.fetcher.wakeup()

    def seek_to(self, partitions: Iterable[TopicPartition] | None, strategy: OffsetResetStrategy) -> None:
        self.check_open()
        wanted = self.subscriptions.assigned_partitions() if partitions is None else set(partitions)
        self.subscriptions.request_reset(wanted, strategy)
        self.fetcher.discard(wanted)
        self.fetcher.wakeup()

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self.check_open()
        self.subscriptions.pause(partitions)
        self.fetcher.wakeup()  # their buffered records no longer hold back the other partitions' fetches

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self.check_open()
        self.subscriptions.resume(partitions)
        self.fetcher.wakeup()

    def known_position(self, tp: TopicPartition) -> int | None:
        self.check_open()
        return self.subscriptions.state(tp).position

    def current_lag(self, tp: TopicPartition) -> int | None:
        """Records from the position to the partition's end as the last fetch answer had it: the
        high watermark, or under read_committed the last stable offset. None until both are known."""
        with self.subscriptions.lock:
            state = self.subscriptions.state(tp)
            end = state.last_stable_offset if self.fetcher.isolation_level == READ_COMMITTED else state.high_watermark
            if state.position is None or end < 0:
                return None
            return max(end - state.position, 0)

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._require_group("group_metadata()").group_metadata()

    def _require_group(self, what: str) -> ConsumerCoordinator:
        if self.coordinator is None:
            raise KafkaException(f"{what} needs a group.id", ErrorCode.invalid_group_id)
        return self.coordinator

    # -- coroutines (the loop) ---------------------------------------------------------------------

    async def unsubscribe(self) -> None:
        self.check_open()
        coordinator = self.coordinator
        if coordinator is not None and self.subscriptions.has_auto_assigned_partitions:
            deadline = time.monotonic() + self.default_timeout
            await coordinator.leave("the consumer unsubscribed from all topics", deadline, revoke_static=True)
        await self.caller.call(self._unsubscribe_now)

    def _unsubscribe_now(self) -> None:
        self.subscriptions.unsubscribe()
        self.fetcher.discard()

    async def commit_sync(self, offsets: Offsets | None, timeout: float | None) -> None:
        self.check_open()
        coordinator = self._require_group("commit")
        wanted = self.subscriptions.all_consumed() if offsets is None else normalize_offsets(offsets)
        await coordinator.commit_offsets(wanted, self.default_timeout if timeout is None else timeout)

    def commit_async(self, offsets: Offsets | None, callback: CommitCallback | None) -> None:
        """Start a commit of ``offsets`` (default: the positions now) on the loop; no waiting."""
        self.check_open()
        coordinator = self._require_group("commit")
        wanted = self.subscriptions.all_consumed() if offsets is None else normalize_offsets(offsets)
        self.on_loop(coordinator.commit_offsets_async, wanted, callback)

    async def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        self.check_open()
        coordinator = self._require_group("committed")
        wanted = set(partitions)
        found = await coordinator.fetch_committed_offsets(
            wanted, self.default_timeout if timeout is None else timeout
        )
        return {tp: found.get(tp) for tp in wanted}

    async def position(self, tp: TopicPartition, timeout: float | None) -> int:
        """The position, waiting for committed offsets or a reset to give one."""
        self.check_open()
        deadline = time.monotonic() + (self.default_timeout if timeout is None else timeout)
        updated = self.fetcher.positions_updated
        while True:
            state = self.subscriptions.state(tp)
            if state.position is not None:
                return state.position
            if state.reset_strategy is OffsetResetStrategy.NONE:
                raise NoOffsetForPartitionError({tp})
            updated.clear()
            self.fetcher.wakeup()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(f"the position of {tp} was not found in time")
            try:
                async with asyncio.timeout(remaining):
                    await updated.wait()
            except TimeoutError:
                pass

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout: float | None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        self.check_open()
        for tp, timestamp in timestamps.items():
            if timestamp < 0:
                raise KafkaException(f"invalid timestamp {timestamp} for {tp}: must not be negative")
        return await self.fetcher.list_offsets(
            timestamps, self.default_timeout if timeout is None else timeout
        )

    async def edge_offsets(
        self, partitions: Iterable[TopicPartition], timestamp: int, timeout: float | None
    ) -> dict[TopicPartition, int]:
        self.check_open()
        assert timestamp in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP)
        found = await self.fetcher.list_offsets(
            dict.fromkeys(partitions, timestamp), self.default_timeout if timeout is None else timeout
        )
        return {tp: answer.offset if answer is not None else -1 for tp, answer in found.items()}

    async def partitions_for(self, topic: str, timeout: float | None) -> list[int]:
        self.check_open()
        cluster = await self.client.with_deadline(
            self.default_timeout if timeout is None else timeout,
            f"metadata for {topic}",
            lambda: self.client.refresh_metadata(
                [topic], allow_auto_create=self.config["allow.auto.create.topics"]
            ),
        )
        return [p.partition for p in cluster.partitions_for(topic)]

    async def list_topics(self, timeout: float | None) -> dict[str, list[int]]:
        self.check_open()
        cluster = await self.client.with_deadline(
            self.default_timeout if timeout is None else timeout,
            "metadata",
            lambda: self.client.refresh_metadata(),
        )
        exclude_internal = self.config["exclude.internal.topics"]
        return {
            name: sorted(topic.partitions)
            for name, topic in cluster.topics.items()
            if not (exclude_internal and topic.is_internal)
        }

    async def close(self, timeout: float | None) -> None:
        if self.closed:
            return
        deadline = time.monotonic() + (CLOSE_TIMEOUT if timeout is None else timeout)
        try:
            if self.coordinator is not None:
                await self.coordinator.close(max(0.0, deadline - time.monotonic()))
        finally:
            self.closed = True
            await self.fetcher.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self.caller.cancel_all()
            await self.client.close()
