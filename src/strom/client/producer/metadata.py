"""The producer's metadata: the topics it sends to, their partitions and leaders.

Like the Java producer, it fetches metadata only for topics it was asked to send to
(auto-creating them when the broker allows), refreshes on request (leader errors,
lost connections) no more often than ``retry.backoff.ms``, and in any case every
``metadata.max.age.ms``. A topic not sent to for ``metadata.max.idle.ms`` drops out
(its next send waits for its metadata again, as a new topic's first one does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable

from strom.client.cluster import Cluster
from strom.client.errors import KafkaException, KafkaTimeoutError
from strom.client.network_client import NetworkClient
from strom.client.producer.accumulator import RecordAccumulator, TopicState
from strom.network.connection import KafkaConnectionError, RequestTimeoutError, UnsupportedVersionError
from strom.protocol.errors import ErrorCode
from strom.protocol.framing import ProtocolError

log = logging.getLogger(__name__)

# Topic errors that waiting will not cure.
_FATAL_TOPIC_ERRORS = frozenset(
    {ErrorCode.invalid_topic_exception, ErrorCode.topic_authorization_failed, ErrorCode.invalid_request}
)
_REFRESH_ERRORS = (KafkaConnectionError, RequestTimeoutError, UnsupportedVersionError, ProtocolError, KafkaException)


class ProducerMetadata:
    def __init__(
        self,
        client: NetworkClient,
        accumulator: RecordAccumulator,
        *,
        max_age: float,
        max_idle: float,
        allow_auto_create: bool,
        on_update: Callable[[], None],
    ) -> None:
        self.client = client
        self.accumulator = accumulator
        self.max_age = max_age
        self.max_idle = max_idle
        self.allow_auto_create = allow_auto_create
        self._on_update = on_update
        self._requested = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._waiting: Counter[str] = Counter()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def request_update(self) -> None:
        self._requested.set()

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.max_age):
                    await self._requested.wait()
            except TimeoutError:
                pass
            self._requested.clear()
            try:
                await self.refresh()
            except Exception as exc:
                # Whatever went wrong, the producer must keep refreshing: retry after the backoff.
                if isinstance(exc, _REFRESH_ERRORS):
                    log.debug("metadata refresh failed: %s", exc)
                else:
                    log.exception("metadata refresh failed")
                self._requested.set()
                self._failures += 1
            else:
                self._failures = 0
            # At most one refresh per retry.backoff.ms, doubling while they fail.
            await self.client.backoff(self._failures)

    async def refresh(self) -> Cluster | None:
        expired = self.accumulator.expire_idle_topics(self.max_idle, keep=+self._waiting)
        if expired:
            log.debug("metadata.max.idle.ms: no longer asking for %s", ", ".join(expired))
        topics = list(self.accumulator.topics)
        if not topics:
            return None
        cluster = await self.client.refresh_metadata(topics, allow_auto_create=self.allow_auto_create)
        self.apply(cluster)
        return cluster

    def apply(self, cluster: Cluster) -> None:
        """Copy partition counts and leaders into the accumulator's topic states."""
        brokers = cluster.brokers.keys()
        for state in list(self.accumulator.topics.values()):
            metadata = cluster.topics.get(state.name)
            if metadata is None or not metadata.partitions:
                continue
            count = max(metadata.partitions) + 1
            leaders = [
                metadata.partitions[p].leader if p in metadata.partitions else -1 for p in range(count)
            ]
            state.update(leaders, brokers)
        self._on_update()

    async def wait_for_topic(self, topic: str, partition: int | None, timeout: float) -> TopicState:
        """The topic's state once metadata knows it (and ``partition``), within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        state = self.accumulator.topic_state(topic)
        attempt = 0
        self._waiting[topic] += 1
        try:
            while True:
                if state.num_partitions > 0 and (partition is None or partition < state.num_partitions):
                    return state
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        cluster = await self.refresh()
                except TimeoutError:
                    break
                except _REFRESH_ERRORS as exc:
                    log.debug("metadata for %s: %s", topic, exc)
                else:
                    metadata = cluster.topics.get(topic) if cluster is not None else None
                    if metadata is not None and metadata.error in _FATAL_TOPIC_ERRORS:
                        raise KafkaException.from_code(metadata.error, f"topic {topic}")
                    if state.num_partitions > 0 and (partition is None or partition < state.num_partitions):
                        return state
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.sleep(min(remaining, self.client.retry_backoff * 2 ** min(attempt, 4)))
                attempt += 1
        finally:
            self._waiting[topic] -= 1
            if state.num_partitions == 0 and not self._waiting[topic]:
                # Not known after all: stop asking for it on every refresh.
                self.accumulator.topics.pop(topic, None)
                del self._waiting[topic]
        if state.num_partitions > 0:
            raise KafkaTimeoutError(
                f"partition {partition} of topic {topic} with partition count {state.num_partitions} "
                f"is not present in metadata after {timeout * 1000:.0f} ms"
            )
        raise KafkaTimeoutError(f"topic {topic} not present in metadata after {timeout * 1000:.0f} ms")
