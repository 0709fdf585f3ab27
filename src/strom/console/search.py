"""Searches over a bounded range of a topic, run by the console as cancellable background jobs.

A search reads with a consumer without a group (assign and seek), one partition after the
other, from each partition's start bound to its stop bound (both fixed when the search starts,
so a busy topic does not make it endless), and stops after ``max_records`` records. It runs
on a thread of its own: scanning is CPU work and the console's event loop keeps serving pages.

It is fast because most records are never decoded: the consumer hands over whole record
batches undecoded (``poll_batches``), and a batch whose bytes lack the search's needle (the
text searched for, or what a JSON path predicate needs, see ``JsonPredicate.needles``) cannot
hold a match and is skipped. Only the other batches' records are decoded, and only the field
the predicate looks at is tested; JSON is parsed only for JSON path searches.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strom.client import Consumer, TopicPartition
from strom.console.jsonpath import JsonPredicate
from strom.console.jsonpath import parse as parse_json_path
from strom.records import scanner
from strom.records.reader import FetchedBatch, Header

FIELDS = ("value", "key", "jsonpath")
DEFAULT_MAX_RECORDS = 1_000_000
MAX_RECORDS_CAP = 20_000_000
DEFAULT_MAX_MATCHES = 100
MAX_MATCHES_CAP = 1000
# A matching record's key and value are kept up to this size (what the page shows).
KEPT_BYTES = 4096
# Large fetches: few round trips; the consumer's buffer stays under a few of these.
FETCH_BYTES = 8 * 1024 * 1024
POLL_SECONDS = 0.5
# A partition that yields nothing for this long while short of its stop bound fails the search.
STALL_SECONDS = 30.0
# Finished searches kept for their pages; older ones are forgotten.
KEPT_SEARCHES = 20
# Searches running at once: each holds a thread, a consumer and its fetch buffers.
MAX_RUNNING = 4


@dataclass(frozen=True, slots=True)
class Bound:
    """Where a search starts or stops: ``kind`` is edge (the start or the end), offset or timestamp (ms)."""

    kind: str = "edge"
    value: int = 0


@dataclass(frozen=True, slots=True)
class SearchSpec:
    topic: str
    field: str
    text: str
    partitions: tuple[int, ...] | None = None  # None: every partition
    start: Bound = Bound()
    stop: Bound = Bound()
    max_records: int = DEFAULT_MAX_RECORDS
    max_matches: int = DEFAULT_MAX_MATCHES

    def __post_init__(self) -> None:
        if self.field not in FIELDS:
            raise ValueError(f"search field is one of {', '.join(FIELDS)}")
        if not self.text:
            raise ValueError("nothing to search for")
        if not 1 <= self.max_records <= MAX_RECORDS_CAP:
            raise ValueError(f"max records is between 1 and {MAX_RECORDS_CAP:,}")
        if not 1 <= self.max_matches <= MAX_MATCHES_CAP:
            raise ValueError(f"max matches is between 1 and {MAX_MATCHES_CAP}")


@dataclass(frozen=True, slots=True)
class Match:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


def _kept(data: bytes | None) -> bytes | None:
    return data if data is None or len(data) <= KEPT_BYTES else data[:KEPT_BYTES]


class Predicate:
    """What a record must satisfy, with the byte strings any matching batch contains."""

    def __init__(self, spec: SearchSpec) -> None:
        self.field = spec.field
        self.json: JsonPredicate | None = None
        if spec.field == "jsonpath":
            self.json = parse_json_path(spec.text)
            self.needles = self.json.needles()
        else:
            self.needles = [spec.text.encode()]

    def batch_may_match(self, batch: FetchedBatch) -> bool:
        find = batch.payload.find
        return all(find(needle, batch.position, batch.limit) >= 0 for needle in self.needles)

    def record_matches(self, key: bytes | None, value: bytes | None) -> bool:
        if self.json is None:
            data = value if self.field == "value" else key
            return data is not None and self.needles[0] in data
        if value is None or (self.needles and not all(n in value for n in self.needles)):
            return False
        try:
            document = json.loads(value)
        except ValueError:
            return False
        return self.json.matches(document)


class SearchJob:
    """One search: its progress, the matches so far, and a cancel switch. ``run`` does the work
    (on a thread); every attribute read by pages is a plain value, safe to read meanwhile."""

    def __init__(self, job_id: str, spec: SearchSpec, consumer_config: dict[str, Any]) -> None:
        self.id = job_id
        self.spec = spec
        self.predicate = Predicate(spec)  # raises on a bad JSON path, before any thread starts
        self._consumer_config = consumer_config
        self.state = "starting"  # then running, and done, cancelled or failed
        self.error: str | None = None
        self.total = 0
        self.scanned = 0
        self.matches: list[Match] = []
        self.truncated = False  # stopped at max_matches
        self.started = time.monotonic()
        self.finished: float | None = None
        self.ranges: dict[int, tuple[int, int]] = {}
        self._cancel = threading.Event()

    @property
    def active(self) -> bool:
        return self.state in ("starting", "running")

    def cancel(self) -> None:
        self._cancel.set()

    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def rate(self) -> float:
        elapsed = self.elapsed()
        return self.scanned / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        rate = self.rate()
        if not self.active or rate <= 0:
            return None
        return max(0.0, (self.total - self.scanned) / rate)

    def progress(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "error": self.error,
            "scanned": self.scanned,
            "total": self.total,
            "matches": len(self.matches),
            "truncated": self.truncated,
            "elapsed_seconds": round(self.elapsed(), 3),
            "records_per_second": round(self.rate(), 1),
            "eta_seconds": None if (eta := self.eta()) is None else round(eta, 1),
        }

    # -- the work ----------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            with Consumer(self._consumer_config) as consumer:
                self._plan(consumer)
                self.state = "running"
                for partition, (start, stop) in self.ranges.items():
                    if self._should_stop():
                        break
                    self._scan(consumer, partition, start, stop)
            self.state = "cancelled" if self._cancel.is_set() else "done"
        except Exception as error:
            self.error = str(error) or type(error).__name__
            self.state = "failed"
        finally:
            self.finished = time.monotonic()

    def _should_stop(self) -> bool:
        return self._cancel.is_set() or self.truncated or self.scanned >= self.spec.max_records

    def _plan(self, consumer: Consumer) -> None:
        """Each partition's [start, stop) offsets, fixed now."""
        spec = self.spec
        partitions = spec.partitions
        if partitions is None:
            partitions = tuple(consumer.partitions_for(spec.topic))
            if not partitions:
                raise ValueError(f"topic '{spec.topic}' does not exist")
        tps = [TopicPartition(spec.topic, p) for p in partitions]
        earliest = consumer.beginning_offsets(tps)
        latest = consumer.end_offsets(tps)

        def resolve(bound: Bound, edge: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
            if bound.kind == "edge":
                return edge
            if bound.kind == "offset":
                return {tp: min(max(bound.value, earliest[tp]), latest[tp]) for tp in tps}
            # The first offset at or after the timestamp; none such: the end.
            found = consumer.offsets_for_times({tp: bound.value for tp in tps})
            resolved = {}
            for tp in tps:
                hit = found[tp]
                resolved[tp] = latest[tp] if hit is None else hit.offset
            return resolved

        starts = resolve(spec.start, earliest)
        stops = resolve(spec.stop, latest)
        self.ranges = {tp.partition: (starts[tp], max(starts[tp], stops[tp])) for tp in tps}
        self.total = min(spec.max_records, sum(stop - start for start, stop in self.ranges.values()))

    def _scan(self, consumer: Consumer, partition: int, start: int, stop: int) -> None:
        if start >= stop:
            return
        tp = TopicPartition(self.spec.topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        done_before = self.scanned
        budget = self.spec.max_records - done_before
        stop = min(stop, start + budget)
        position = start
        last_progress = time.monotonic()
        while position < stop and not self._cancel.is_set() and not self.truncated:
            batches = consumer.poll_batches(POLL_SECONDS)
            for batch in batches:
                if batch.base_offset >= stop:
                    break
                if self.predicate.batch_may_match(batch):
                    self._test_records(partition, batch, stop)
            # Control batches and compacted gaps move the position without records.
            now_at = consumer.position(tp)
            if now_at > position:
                position = now_at
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > STALL_SECONDS:
                raise RuntimeError(f"partition {partition} gave no records past offset {position}")
            self.scanned = done_before + min(position, stop) - start

    def _test_records(self, partition: int, batch: FetchedBatch, stop: int) -> None:
        records = scanner.decode(
            batch.payload, batch.position, batch.limit, batch.count, batch.last_offset_delta
        )
        step = 0 if batch.timestamp_type == 1 else 1
        matches = self.predicate.record_matches
        for offset_delta, timestamp_delta, key, value, headers in records:
            offset = batch.base_offset + offset_delta
            if offset < batch.min_offset:
                continue
            if offset >= stop:
                break
            if matches(key, value):
                timestamp = batch.base_timestamp + timestamp_delta * step
                self.matches.append(Match(partition, offset, timestamp, _kept(key), _kept(value), headers))
                if len(self.matches) >= self.spec.max_matches:
                    self.truncated = True
                    return


class TooManySearches(RuntimeError):
    pass


@dataclass
class Searches:
    """The console's searches, newest last; finished ones beyond ``KEPT_SEARCHES`` are forgotten."""

    consumer_config: Callable[[], dict[str, Any]]
    jobs: OrderedDict[str, SearchJob] = field(default_factory=OrderedDict)
    threads: dict[str, threading.Thread] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def start(self, spec: SearchSpec) -> SearchJob:
        if sum(1 for j in self.jobs.values() if j.active) >= MAX_RUNNING:
            raise TooManySearches(f"{MAX_RUNNING} searches are running already; cancel one or wait")
        job = SearchJob(f"s{next(self._ids)}", spec, self.consumer_config())
        thread = threading.Thread(target=job.run, name=f"console-search-{job.id}", daemon=True)
        self.jobs[job.id] = job
        self.threads[job.id] = thread
        thread.start()
        self._forget_old()
        return job

    def get(self, job_id: str) -> SearchJob | None:
        return self.jobs.get(job_id)

    def _forget_old(self) -> None:
        finished = [j for j in self.jobs.values() if not j.active]
        for job in finished[: max(0, len(self.jobs) - KEPT_SEARCHES)]:
            del self.jobs[job.id]
            self.threads.pop(job.id, None)

    def close(self) -> None:
        """Cancel every search and wait for its thread (a poll ends within POLL_SECONDS)."""
        for job in self.jobs.values():
            job.cancel()
        for thread in self.threads.values():
            thread.join(timeout=10)


def consumer_config(base: dict[str, Any]) -> dict[str, Any]:
    """A search's consumer: no group, no commits, large fetches, batches as they come."""
    return {
        **base,
        "client.id": "strom-console-search",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "allow.auto.create.topics": False,
        "fetch.max.bytes": FETCH_BYTES,
        "max.partition.fetch.bytes": FETCH_BYTES,
        "max.poll.records": 50_000,
        # The range is written already: a fetch at a partition's end (in flight when the search
        # moves on to the next partition) must not hold the next one back for long.
        "fetch.max.wait.ms": 10,
        # Looking the offsets up is not cancellable: bounded.
        "default.api.timeout.ms": 15_000,
    }
