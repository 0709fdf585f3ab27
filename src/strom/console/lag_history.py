"""Consumer-group lag for the console: per partition now, and over time for the groups being viewed.

A group's lag is, per partition, the log end offset minus the group's committed offset.
``LagSampler`` samples the total lag of each group someone viewed recently, in the
background, and keeps a bounded history of it in memory for the group page's chart: a
group no page has asked about for ``watch_for`` seconds is dropped, and so is the group
viewed longest ago once ``max_groups`` are watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from strom.client.admin import AsyncAdminClient, OffsetSpec
from strom.client.cluster import TopicPartition
from strom.client.consumer import OffsetAndMetadata
from strom.client.errors import KafkaException

log = logging.getLogger("strom.console")


@dataclass(frozen=True, slots=True)
class PartitionLag:
    partition: TopicPartition
    committed: int | None
    log_end: int | None  # None when the topic is gone
    metadata: str

    @property
    def lag(self) -> int | None:
        if self.committed is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.committed)


def total_lag(partitions: Iterable[PartitionLag]) -> int:
    return sum(p.lag or 0 for p in partitions)


async def log_ends(
    admin: AsyncAdminClient, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, int]:
    """Log end offsets of the partitions whose topics still exist, in one ListOffsets."""
    wanted = list(dict.fromkeys(partitions))
    if not wanted:
        return {}
    existing = set(await admin.list_topics(include_internal=True))
    alive = [tp for tp in wanted if tp.topic in existing]
    if not alive:
        return {}
    found = await admin.list_offsets(dict.fromkeys(alive, OffsetSpec.latest()))
    return {tp: result.offset for tp, result in found.items()}


def partition_lags(
    committed: dict[TopicPartition, OffsetAndMetadata],
    ends: dict[TopicPartition, int],
    assigned: Iterable[TopicPartition] = (),
) -> list[PartitionLag]:
    partitions = sorted(set(committed) | set(assigned), key=lambda tp: (tp.topic, tp.partition))
    return [
        PartitionLag(
            tp,
            committed[tp].offset if tp in committed else None,
            ends.get(tp),
            committed[tp].metadata if tp in committed else "",
        )
        for tp in partitions
    ]


async def group_lag(
    admin: AsyncAdminClient, group_id: str, assigned: Iterable[TopicPartition] = ()
) -> list[PartitionLag]:
    committed = await admin.list_consumer_group_offsets(group_id)
    assigned = list(assigned)
    return partition_lags(committed, await log_ends(admin, [*committed, *assigned]), assigned)


async def groups_lag(
    admin: AsyncAdminClient, group_ids: Sequence[str], concurrency: int = 8
) -> dict[str, list[PartitionLag] | KafkaException]:
    """Many groups' lag: their committed offsets a few groups at a time, then one ListOffsets
    for every partition any of them has committed."""
    gate = asyncio.Semaphore(concurrency)

    async def fetch(group_id: str) -> dict[TopicPartition, OffsetAndMetadata] | KafkaException:
        async with gate:
            try:
                return await admin.list_consumer_group_offsets(group_id)
            except KafkaException as exc:
                return exc

    fetched = dict(zip(group_ids, await asyncio.gather(*(fetch(g) for g in group_ids)), strict=True))
    everything = [tp for c in fetched.values() if isinstance(c, dict) for tp in c]
    ends = await log_ends(admin, everything)
    return {g: c if isinstance(c, KafkaException) else partition_lags(c, ends) for g, c in fetched.items()}


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # seconds since the epoch
    lag: int


class _Watched:
    def __init__(self, capacity: int) -> None:
        self.samples: deque[Sample] = deque(maxlen=capacity)
        self.viewed = time.monotonic()


class LagSampler:
    """Samples the total lag of recently viewed groups every ``interval`` seconds."""

    def __init__(
        self,
        admin: AsyncAdminClient,
        *,
        interval: float = 2.0,
        capacity: int = 900,
        max_groups: int = 50,
        watch_for: float = 600.0,
    ) -> None:
        self.admin = admin
        self.interval = interval
        self.capacity = capacity
        self.max_groups = max_groups
        self.watch_for = watch_for
        self._watched: OrderedDict[str, _Watched] = OrderedDict()
        self._task: asyncio.Task[None] | None = None

    def view(self, group_id: str) -> list[Sample]:
        """Note that someone is looking at the group (starting its sampling); its history so far."""
        watched = self._watched.pop(group_id, None) or _Watched(self.capacity)
        watched.viewed = time.monotonic()
        self._watched[group_id] = watched
        while len(self._watched) > self.max_groups:
            self._watched.popitem(last=False)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="strom-console-lag-sampler")
        return list(watched.samples)

    def record(self, group_id: str, lag: int, at: float | None = None) -> None:
        """Add a sample taken elsewhere (a page that just computed the lag) to a watched group."""
        watched = self._watched.get(group_id)
        if watched is not None:
            watched.samples.append(Sample(time.time() if at is None else at, lag))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def sample_once(self) -> None:
        now = time.monotonic()
        for group_id in [g for g, w in self._watched.items() if now - w.viewed > self.watch_for]:
            del self._watched[group_id]
        if not self._watched:
            return
        lags = await groups_lag(self.admin, list(self._watched))
        at = time.time()
        for group_id, lag in lags.items():
            if not isinstance(lag, KafkaException):
                self.record(group_id, total_lag(lag), at)

    async def _run(self) -> None:
        while self._watched:
            started = time.monotonic()
            try:
                await self.sample_once()
            except KafkaException as exc:  # the cluster is away for a moment: the next tick tries again
                log.debug("lag sample failed: %s", exc)
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
