"""Pages of records for the messages page: bounded reads with a consumer without a group.

A page is read from a cursor, an offset per partition. Forward, each partition gives up to
``limit`` records from its cursor; backward, up to ``limit`` records before it. The records of
several partitions are merged by timestamp, each partition's kept in offset order, and the
first (forward) or last (backward) ``limit`` are the page. So a page never holds more than
``limit`` records per partition in memory, and the page's cursors (where it starts and where
it ends, per partition) give the previous and the next page without skipping a record.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from strom.client import AsyncConsumer, ConsumerRecord, TopicPartition

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# Small fetches: a page needs few records, and a partition's fetch is what the consumer holds.
FETCH_BYTES = 1024 * 1024
READ_SECONDS = 15.0

Cursor = dict[int, int]


def encode_cursor(cursor: Cursor) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(cursor.items()))


def decode_cursor(text: str) -> Cursor:
    cursor: Cursor = {}
    for part in filter(None, text.split(",")):
        partition, _, offset = part.partition(":")
        cursor[int(partition)] = int(offset)
    return cursor


@dataclass(frozen=True, slots=True)
class Page:
    records: list[ConsumerRecord]
    first: Cursor  # where the page starts, per partition (the previous page ends here)
    after: Cursor  # one past where it ends (the next page starts here)
    earliest: Cursor
    latest: Cursor
    complete: bool  # False when the read timed out before every partition answered

    @property
    def has_older(self) -> bool:
        return any(self.first[p] > self.earliest[p] for p in self.first)

    @property
    def has_newer(self) -> bool:
        return any(self.after[p] < self.latest[p] for p in self.after)


def consumer_config(base: dict[str, Any], limit: int) -> dict[str, Any]:
    return {
        **base,
        "client.id": "strom-console-browse",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "allow.auto.create.topics": False,
        "fetch.max.bytes": 4 * FETCH_BYTES,
        "max.partition.fetch.bytes": FETCH_BYTES,
        "max.poll.records": max(limit, 500),
        # A page stops at the end offsets: a fetch there need not wait for new records.
        "fetch.max.wait.ms": 10,
    }


async def edges(consumer: AsyncConsumer, topic: str, partitions: Sequence[int]) -> tuple[Cursor, Cursor]:
    tps = [TopicPartition(topic, p) for p in partitions]
    earliest = await consumer.beginning_offsets(tps)
    latest = await consumer.end_offsets(tps)
    return {tp.partition: earliest[tp] for tp in tps}, {tp.partition: latest[tp] for tp in tps}


async def at_timestamp(
    consumer: AsyncConsumer, topic: str, partitions: Sequence[int], timestamp: int
) -> Cursor:
    """Each partition's first offset at or after ``timestamp`` (its end when there is none)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    found = await consumer.offsets_for_times({tp: timestamp for tp in tps})
    latest = await consumer.end_offsets(tps)
    cursor: Cursor = {}
    for tp in tps:
        hit = found[tp]
        cursor[tp.partition] = latest[tp] if hit is None else hit.offset
    return cursor


async def _read_ranges(
    consumer: AsyncConsumer, topic: str, ranges: dict[int, tuple[int, int]]
) -> tuple[dict[int, list[ConsumerRecord]], bool]:
    """Every partition's records in [start, stop); False as well if the time ran out first."""
    wanted = {TopicPartition(topic, p): r for p, r in ranges.items() if r[0] < r[1]}
    out: dict[int, list[ConsumerRecord]] = {p: [] for p in ranges}
    if not wanted:
        return out, True
    consumer.assign(wanted)
    for tp, (start, _stop) in wanted.items():
        consumer.seek(tp, start)
    pending = set(wanted)
    deadline = time.monotonic() + READ_SECONDS
    while pending and time.monotonic() < deadline:
        for record in await consumer.poll(timeout=0.5):
            tp = TopicPartition(record.topic, record.partition)
            if tp in pending and record.offset < wanted[tp][1]:
                out[record.partition].append(record)
        for tp in list(pending):
            # Compacted gaps and control batches move the position past records never returned.
            if await consumer.position(tp) >= wanted[tp][1]:
                pending.discard(tp)
                consumer.pause([tp])
    return out, not pending


def _merged(per_partition: Iterable[list[ConsumerRecord]], reverse: bool) -> Iterable[ConsumerRecord]:
    # Merged by the head records' timestamps: each partition's records stay in offset order,
    # so what a page takes of a partition is always a run of it (its cursor stays exact).
    # Equal timestamps (a batch's records often share one) alternate between partitions.
    if reverse:
        return heapq.merge(
            *(reversed(r) for r in per_partition), key=lambda r: (-r.timestamp, -r.offset, -r.partition)
        )
    return heapq.merge(*per_partition, key=lambda r: (r.timestamp, r.offset, r.partition))


async def read_page(
    consumer: AsyncConsumer,
    topic: str,
    cursor: Cursor,
    limit: int,
    *,
    backward: bool,
    earliest: Cursor,
    latest: Cursor,
) -> Page:
    if backward:
        ranges = {p: (max(earliest[p], o - limit), min(o, latest[p])) for p, o in cursor.items()}
    else:
        ranges = {
            p: (max(o, earliest[p]), min(latest[p], max(o, earliest[p]) + limit)) for p, o in cursor.items()
        }
    read, complete = await _read_ranges(consumer, topic, ranges)
    taken = list(itertools.islice(_merged(read.values(), backward), limit))
    if backward:
        taken.reverse()
    by_partition: dict[int, list[ConsumerRecord]] = {p: [] for p in ranges}
    for record in taken:
        by_partition[record.partition].append(record)
    first: Cursor = {}
    after: Cursor = {}
    for p, (start, stop) in ranges.items():
        got = by_partition[p]
        # All of a range taken: the page reaches its bound, past any compacted gap at its edge.
        whole = complete and len(got) == len(read[p])
        if backward:
            after[p] = stop
            first[p] = start if whole else (got[0].offset if got else stop)
        else:
            first[p] = start
            after[p] = stop if whole else (got[-1].offset + 1 if got else start)
    return Page(taken, first, after, earliest, latest, complete)
