"""What the request path counts: plain Python counters and bucket arrays, no locks, no label lookups.

Each API has one ``RequestStats`` (resolved once, by the dispatcher, from a list indexed by API key),
each topic one ``TopicStats`` (resolved by name in the replica manager), each listener one
``ListenerStats`` (held by its connections). A request adds to them with a few integer additions and
a ``bisect`` per histogram; the collectors turn them into Prometheus metric families only when
``/metrics`` is scraped. The event loop is the only writer and the scrape runs on it, so no lock is
needed either way.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from strom.protocol.apis import ApiKey
from strom.protocol.errors import ErrorCode
from strom.protocol.framing import EncodedArray

# Request latencies in milliseconds, as Kafka's RequestMetrics beans (TotalTimeMs, ...) are named.
LATENCY_MS_BUCKETS: tuple[float, ...] = (
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
)  # fmt: skip
SIZE_BUCKETS: tuple[float, ...] = tuple(float(4**i * 64) for i in range(12))  # 64 B .. 256 MiB
# Event-loop lag and GC pauses in seconds (Strom's own metrics use Prometheus' base units).
PAUSE_SECONDS_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
)  # fmt: skip


class Histogram:
    """Counts per bucket (the last one is +Inf) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are upper-inclusive: bisect_left finds the first bound >= value.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def add(self, other: Histogram) -> None:
        """Add ``other``'s observations (same bounds)."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.sum += other.sum

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs, +Inf last: HistogramMetricFamily's buckets."""
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == float("inf") else _float_text(bound), running))
        return buckets


def _float_text(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def request_name(key: ApiKey) -> str:
    """Kafka's name of an API (ApiKeys.name: "Produce", "ListOffsets"), its ``request`` label."""
    return "".join(word.capitalize() for word in key.name.split("_"))


def error_name(code: int) -> str:
    """Kafka's name of an error code ("NOT_LEADER_OR_FOLLOWER"), its ``error`` label."""
    try:
        return str(ErrorCode(code).name).upper()
    except ValueError:
        return f"UNKNOWN_{code}"


class RequestStats:
    """One API's requests: count by version, errors by code, latency and size histograms."""

    __slots__ = (
        "errors",
        "local",
        "name",
        "queue",
        "remote",
        "request_bytes",
        "response_bytes",
        "response_queue",
        "send",
        "total",
        "versions",
    )  # fmt: skip

    def __init__(self, name: str) -> None:
        self.name = name
        self.versions: dict[int, int] = {}
        self.errors: dict[int, int] = {}
        self.total = Histogram(LATENCY_MS_BUCKETS)
        self.queue = Histogram(LATENCY_MS_BUCKETS)
        self.local = Histogram(LATENCY_MS_BUCKETS)
        self.remote = Histogram(LATENCY_MS_BUCKETS)
        self.response_queue = Histogram(LATENCY_MS_BUCKETS)
        self.send = Histogram(LATENCY_MS_BUCKETS)
        self.request_bytes = Histogram(SIZE_BUCKETS)
        self.response_bytes = Histogram(SIZE_BUCKETS)

    def received(self, version: int, size: int) -> None:
        versions = self.versions
        versions[version] = versions.get(version, 0) + 1
        self.request_bytes.observe(size)

    def responded(
        self,
        received: float,
        dequeued: float,
        handled: float,
        ready: float,
        write_start: float,
        written: float,
        waited: float,
        response_size: int,
    ) -> None:
        """The times (perf_counter seconds) of one request: its frame whole, taken by its
        connection, its handler returned, its response complete (after a purgatory wait), being
        written, written; ``waited`` of the handler's time was a delayed fetch's wait."""
        self.queue.observe((dequeued - received) * 1000)
        self.local.observe((handled - dequeued - waited) * 1000)
        self.remote.observe((waited + ready - handled) * 1000)
        self.response_queue.observe((write_start - ready) * 1000)
        self.send.observe((written - write_start) * 1000)
        self.total.observe((written - received) * 1000)
        self.response_bytes.observe(response_size)

    @classmethod
    def sum_of(cls, name: str, parts: Iterable[RequestStats]) -> RequestStats:
        """Figures that are their parts' added up, made at scrape time: Kafka records a Fetch under
        Fetch and under FetchConsumer or FetchFollower (RequestChannel's metric names)."""
        summed = cls(name)
        for part in parts:
            _merge(summed.versions, part.versions)
            _merge(summed.errors, part.errors)
            for attribute in _HISTOGRAMS:
                getattr(summed, attribute).add(getattr(part, attribute))
        return summed


_HISTOGRAMS = ("total", "queue", "local", "remote", "response_queue", "send", "request_bytes", "response_bytes")


class TopicStats:
    """Kafka's BrokerTopicMetrics of one topic (leader appends in, consumer fetches out)."""

    __slots__ = ("bytes_in", "bytes_out", "messages_in")

    def __init__(self) -> None:
        self.bytes_in = 0
        self.bytes_out = 0
        self.messages_in = 0


class BrokerTopicStats:
    """Every topic's stats, and the broker's replication traffic (Kafka's all-topics beans)."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicStats] = {}
        self.replication_bytes_out = 0
        self.replication_bytes_in = 0

    def of(self, topic: str) -> TopicStats:
        stats = self.topics.get(topic)
        if stats is None:
            stats = self.topics[topic] = TopicStats()
        return stats

    def remove(self, topic: str) -> None:
        """A deleted topic's series go, as Kafka removes its beans."""
        self.topics.pop(topic, None)


class IsrStats:
    """Kafka's ReplicaManager IsrShrinksPerSec and IsrExpandsPerSec, of the partitions led here."""

    __slots__ = ("expands", "shrinks")

    def __init__(self) -> None:
        self.shrinks = 0
        self.expands = 0

    def changed(self, before: list[int], after: list[int]) -> None:
        if len(after) < len(before):
            self.shrinks += 1
        elif len(after) > len(before):
            self.expands += 1


class ListenerStats:
    """Kafka's socket-server-metrics of one listener: open connections and connections made."""

    __slots__ = ("closed", "connections", "created", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.connections = 0
        self.created = 0
        self.closed = 0


class DelayedOperations:
    """Requests waiting in purgatory now (Kafka's DelayedOperationPurgatory PurgatorySize)."""

    __slots__ = ("fetch",)

    def __init__(self) -> None:
        self.fetch = 0


class RequestWait:
    """The purgatory wait of the request a connection is serving (its RemoteTimeMs)."""

    __slots__ = ("delayed", "seconds")

    def __init__(self, delayed: DelayedOperations) -> None:
        self.seconds = 0.0
        self.delayed = delayed


# Set once in each connection's task: a delayed fetch's wait (deep inside the handler) is added to
# the request of the connection it runs for, without passing anything down the call chain.
CURRENT_REQUEST: ContextVar[RequestWait | None] = ContextVar("strom_current_request", default=None)


@contextlib.contextmanager
def delayed_fetch() -> Iterator[None]:
    """Around a fetch's wait for data: counted in the Fetch purgatory and as remote time."""
    wait = CURRENT_REQUEST.get()
    if wait is None:  # not on behalf of a client request
        yield
        return
    wait.delayed.fetch += 1
    started = perf_counter()
    try:
        yield
    finally:
        wait.delayed.fetch -= 1
        wait.seconds += perf_counter() - started


# -- errors in responses --------------------------------------------------------------------------

# Per kio response class: its ErrorCode fields, and the fields (one entity, or a tuple of them)
# below which some ErrorCode field lies. Built once per class from its dataclass fields.
_Plan = tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]
_PLANS: dict[type, _Plan] = {}


def _entity_of(annotation: Any) -> tuple[type | None, bool]:
    """The kio entity class an annotation holds (``X``, ``tuple[X, ...]``, either ``| None``)
    and whether it is a tuple of them."""
    args = getattr(annotation, "__args__", None)
    origin = getattr(annotation, "__origin__", None)
    if origin is tuple and args:
        inner, _ = _entity_of(args[0])
        return inner, True
    if args is not None and origin is None:  # X | None
        for arg in args:
            if arg is not type(None):
                return _entity_of(arg)
    if isinstance(annotation, type) and hasattr(annotation, "__dataclass_fields__"):
        return annotation, False
    return None, False


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is not None:
        return plan
    errors: list[str] = []
    children: list[tuple[str, bool]] = []
    for entity_field in cls.__dataclass_fields__.values():  # type: ignore[attr-defined]
        if entity_field.type is ErrorCode:
            errors.append(entity_field.name)
            continue
        entity, many = _entity_of(entity_field.type)
        if entity is not None and entity is not cls and _has_errors(entity):
            children.append((entity_field.name, many))
    plan = _PLANS[cls] = (tuple(errors), tuple(children))
    return plan


def _has_errors(cls: type) -> bool:
    errors, children = _plan(cls)
    return bool(errors or children)


def count_errors(response: Any, errors: dict[int, int]) -> None:
    """Add every non-zero error code in ``response`` (a kio entity) to ``errors``: Kafka's
    ErrorsPerSec counts a response's error codes (its ``errorCounts``); NONE is left out."""
    error_fields, children = _plan(type(response))
    for name in error_fields:
        code = getattr(response, name)
        if code:
            errors[code] = errors.get(code, 0) + 1
    for name, many in children:
        value = getattr(response, name)
        if value is None:
            continue
        if isinstance(value, EncodedArray):
            _merge(errors, value.tally.errors)
        elif many:
            for item in value:
                count_errors(item, errors)
        else:
            count_errors(value, errors)


_HOLDS_RECORDS: dict[type, bool] = {}


def _holds_records(cls: type) -> bool:
    """Whether ``cls`` has an array of ``partitions`` with records: a Fetch response's topic."""
    found = _HOLDS_RECORDS.get(cls)
    if found is None:
        fields = getattr(cls, "__dataclass_fields__", {})
        entity = _entity_of(fields["partitions"].type)[0] if "partitions" in fields else None
        found = _HOLDS_RECORDS[cls] = entity is not None and "records" in getattr(
            entity, "__dataclass_fields__", {}
        )
    return found


def _merge(into: dict[Any, int], counts: dict[Any, int]) -> None:
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count


@dataclass(slots=True)
class ResponseTally:
    """The error codes and record bytes of response elements encoded ahead of the response (an
    EncodedArray's, strom.broker.slices), for ``count_errors`` and ``count_fetch``."""

    errors: dict[int, int] = field(default_factory=dict)
    # Fetch record bytes by topic (name or id, as the response keys its topics); partitions'
    # bytes under None: their topic is the element holding the array.
    record_bytes: dict[Any, int] = field(default_factory=dict)

    def add(self, elements: list[Any]) -> None:
        for element in elements:
            count_errors(element, self.errors)
            records = getattr(element, "records", None)
            if records:  # a Fetch PartitionData
                self.record_bytes[None] = self.record_bytes.get(None, 0) + len(records)
            elif _holds_records(type(element)):  # a Fetch FetchableTopicResponse
                size = _partition_bytes(element.partitions, self.errors, count_codes=False)
                if size:
                    key = element.topic_id if hasattr(element, "topic_id") else element.topic
                    self.record_bytes[key] = self.record_bytes.get(key, 0) + size

def count_fetch(response: Any, by_id: bool, errors: dict[int, int], bytes_out: dict[Any, int]) -> None:
    """A Fetch response's error codes, and its record bytes per topic (keyed by topic id when
    ``by_id``, v13 on, else by name) -- one pass over its partitions, which may be thousands."""
    code = getattr(response, "error_code", 0)  # from v7
    if code:
        errors[code] = errors.get(code, 0) + 1
    topics = response.responses
    if isinstance(topics, EncodedArray):
        _merge(errors, topics.tally.errors)
        _merge(bytes_out, topics.tally.record_bytes)
        return
    for topic in topics:
        size = _partition_bytes(topic.partitions, errors, count_codes=True)
        if size:
            key = topic.topic_id if by_id else topic.topic
            bytes_out[key] = bytes_out.get(key, 0) + size


def _partition_bytes(partitions: Any, errors: dict[int, int], *, count_codes: bool) -> int:
    """The record bytes of a Fetch topic's partitions; their error codes added to ``errors`` when
    ``count_codes`` (a tally has counted them already)."""
    if isinstance(partitions, EncodedArray):
        if count_codes:
            _merge(errors, partitions.tally.errors)
        return int(partitions.tally.record_bytes.get(None, 0))
    size = 0
    for partition in partitions:
        if count_codes:
            code = partition.error_code
            if code:
                errors[code] = errors.get(code, 0) + 1
        records = partition.records
        if records:
            size += len(records)
    return size
