"""The broker's metrics as Prometheus metric families, built when ``/metrics`` is scraped.

Counters and histograms come from the plain objects the request path keeps (strom.broker.metrics.
stats); gauges of state (log sizes, under-replicated partitions, groups) are read from the broker's
structures at the scrape, never maintained. ``BrokerCollector.collect`` builds what costs
O(APIs + topics + groups); ``partition_families`` walks every hosted partition, a slice at a time
with the event loop served in between, so that a broker of 10,000 partitions is not held up.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strom.broker.coordinator.group import GroupState
from strom.broker.metrics.stats import ListenerStats, RequestStats, error_name
from strom.broker.transaction.log_records import TransactionState

if TYPE_CHECKING:
    from strom.broker.server import BrokerServer

# Partitions walked between two turns of the event loop (about 0.1 ms of work: 9 us each): a produce
# arriving during a step waits for it, so longer steps show in the p99 of a broker scraped often.
PARTITION_SLICE = 10

_NETWORK = "kafka_network_requestmetrics_"
# Kafka's RequestMetrics histograms, by the RequestStats attribute that holds each.
_REQUEST_TIMES = (
    ("total", "totaltimems", "From the request whole to its response written (ms)."),
    ("queue", "requestqueuetimems", "Waiting behind earlier requests of its connection (ms)."),
    ("local", "localtimems", "In its handler, decoding and encoding included (ms)."),
    ("remote", "remotetimems", "In purgatory: a delayed fetch's or acks=all produce's wait (ms)."),
    ("response_queue", "responsequeuetimems", "Complete, waiting behind earlier responses (ms)."),
    ("send", "responsesendtimems", "Writing the response until the socket took it (ms)."),
)


def request_families(all_stats: list[RequestStats]) -> Iterator[Metric]:
    """Requests by API and version, errors by API and error name (histograms: ``request_histograms_text``)."""
    stats = [api for api in all_stats if api.versions]  # APIs never called have no series
    requests = CounterMetricFamily(
        _NETWORK + "requests", "Requests received, by API and version.", labels=["request", "version"]
    )
    errors = CounterMetricFamily(
        _NETWORK + "errors",
        "Error codes answered (NONE left out), by API and Kafka's error name.",
        labels=["request", "error"],
    )
    for api in stats:
        for version, count in sorted(api.versions.items()):
            requests.add_metric([api.name, str(version)], count)
        for code, count in sorted(api.errors.items()):
            errors.add_metric([api.name, error_name(code)], count)
    yield requests
    yield errors


_REQUEST_HISTOGRAMS = (
    *((attribute, _NETWORK + name, doc) for attribute, name, doc in _REQUEST_TIMES),
    ("request_bytes", _NETWORK + "requestbytes", "Request sizes (bytes)."),
    ("response_bytes", "strom_network_requestmetrics_responsebytes", "Response sizes (bytes)."),
)


def request_histograms_text(all_stats: list[RequestStats]) -> Iterator[str]:
    """Each request histogram family in Prometheus' text format, one family a chunk. Written here:
    prometheus_client's writer validates and escapes every label of every line, some 12 us a line,
    and these families have some 200 lines each."""
    stats = [api for api in all_stats if api.versions]
    for attribute, name, doc in _REQUEST_HISTOGRAMS:
        lines = [f"# HELP {name} {doc}\n# TYPE {name} histogram\n"]
        for api in stats:
            histogram = getattr(api, attribute)
            request = api.name
            lines.extend(
                f'{name}_bucket{{le="{le}",request="{request}"}} {count}\n'
                for le, count in histogram.cumulative()
            )
            lines.append(f'{name}_count{{request="{request}"}} {histogram.count}\n')
            lines.append(f'{name}_sum{{request="{request}"}} {histogram.sum!r}\n')
        yield "".join(lines)


def listener_families(listeners: list[ListenerStats]) -> Iterator[Metric]:
    prefix = "kafka_server_socket_server_metrics_"
    count = GaugeMetricFamily(prefix + "connection_count", "Open connections.", labels=["listener"])
    created = CounterMetricFamily(
        prefix + "connection_creation", "Connections accepted.", labels=["listener"]
    )
    closed = CounterMetricFamily(prefix + "connection_close", "Connections closed.", labels=["listener"])
    for listener in listeners:
        count.add_metric([listener.name], listener.connections)
        created.add_metric([listener.name], listener.created)
        closed.add_metric([listener.name], listener.closed)
    yield from (count, created, closed)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class BrokerCollector(Collector):
    """Everything but the per-partition families (``partition_families``)."""

    def __init__(self, server: BrokerServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        server = self._server
        yield from request_families(server.request_stats())
        yield from listener_families(server.listener_stats)
        yield from self._topic_families()
        yield from self._group_families()
        yield from self._transaction_families()
        yield from self._cleaner_families()

    def _topic_families(self) -> Iterator[Metric]:
        stats = self._server.replica_manager.topic_stats
        prefix = "kafka_server_brokertopicmetrics_"
        bytes_in = CounterMetricFamily(
            prefix + "bytesin", "Record bytes appended as leader.", labels=["topic"]
        )
        bytes_out = CounterMetricFamily(
            prefix + "bytesout", "Record bytes fetched by consumers.", labels=["topic"]
        )
        messages_in = CounterMetricFamily(
            prefix + "messagesin", "Records appended as leader.", labels=["topic"]
        )
        for topic, topic_stats in sorted(stats.topics.items()):
            bytes_in.add_metric([topic], topic_stats.bytes_in)
            bytes_out.add_metric([topic], topic_stats.bytes_out)
            messages_in.add_metric([topic], topic_stats.messages_in)
        yield from (bytes_in, bytes_out, messages_in)
        yield CounterMetricFamily(
            prefix + "replicationbytesout",
            "Record bytes fetched by followers.",
            value=stats.replication_bytes_out,
        )

    def _group_families(self) -> Iterator[Metric]:
        groups = self._server.group_coordinator.list_groups(None, None)
        states = Counter(group.state for group in groups)
        prefix = "kafka_coordinator_group_groupmetadatamanager_"
        yield _gauge(prefix + "numgroups", "Groups this broker coordinates.", len(groups))
        for state in GroupState:
            if state is GroupState.DEAD:
                continue  # dead groups are gone from the coordinator
            name = state.value.lower()
            yield _gauge(prefix + f"numgroups{name}", f"Groups in state {state.value}.", states[state])
        yield _gauge(
            prefix + "numoffsets", "Committed offsets of those groups.", sum(len(g.offsets) for g in groups)
        )

    def _transaction_families(self) -> Iterator[Metric]:
        coordinator = self._server.transaction_coordinator
        states = Counter(metadata.state for _, metadata in coordinator.state.transactions())
        family = GaugeMetricFamily(
            "strom_transaction_coordinator_transactions",
            "Transactional ids this broker coordinates, by state.",
            labels=["state"],
        )
        for state in TransactionState:
            family.add_metric([state.display_name], states[state])
        yield family
        yield _gauge(
            "strom_transaction_coordinator_markers_pending",
            "Transactions whose markers are being written (PrepareCommit or PrepareAbort).",
            states[TransactionState.PREPARE_COMMIT] + states[TransactionState.PREPARE_ABORT],
        )

    def _cleaner_families(self) -> Iterator[Metric]:
        cleaner = self._server.log_manager.cleaner
        if cleaner is None:
            return
        yield _gauge(
            "kafka_log_logcleaner_max_dirty_percent",
            "The largest dirty share of a compacted log at the last pass (percent).",
            round(cleaner.max_dirty_ratio * 100, 3),
        )
        yield _gauge(
            "kafka_log_logcleaner_max_clean_time_secs",
            "The longest round of the last pass that cleaned (seconds).",
            cleaner.max_clean_ms / 1000,
        )
        yield _gauge(
            "kafka_log_logcleanermanager_uncleanable_partitions_count",
            "Logs a round failed on, left alone until a restart.",
            cleaner.uncleanable_count,
        )
        since = self._server.replica_manager.time_ms() - cleaner.last_run_ms if cleaner.last_run_ms else 0
        yield _gauge(
            "kafka_log_logcleanermanager_time_since_last_run_ms", "Since the last cleaner pass (ms).", since
        )


# One partition's log as read on the loop: topic (escaped for a label), partition, size,
# segments, log end, log start.
LogRow = tuple[str, int, int, int, int, int]
_LOG_GAUGES = (
    ("kafka_log_log_size", "Bytes of the partition's log."),
    ("kafka_log_log_numlogsegments", "Segments of the log."),
    ("kafka_log_log_logendoffset", "The log end offset."),
    ("kafka_log_log_logstartoffset", "The log start offset."),
)


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def log_gauges_text(rows: list[LogRow]) -> bytes:
    """Kafka's Log gauges of every partition in Prometheus' text format, written here rather than
    through metric families (8 objects a partition), a slice at a time, the loop served between."""
    parts: list[str] = []
    for column, (name, doc) in enumerate(_LOG_GAUGES, start=2):
        parts.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
        for first in range(0, len(rows), PARTITION_SLICE):
            if first:
                await asyncio.sleep(0)
            parts.append(
                "".join(
                    f'{name}{{partition="{row[1]}",topic="{row[0]}"}} {row[column]}\n'
                    for row in rows[first : first + PARTITION_SLICE]
                )
            )
    return "".join(parts).encode()


async def partition_families(server: BrokerServer) -> tuple[list[LogRow], list[Metric]]:
    """Every partition's log figures (for ``log_gauges_text``), and ReplicaManager's
    and the controller's aggregates, read a slice at a time."""
    replica_manager = server.replica_manager
    rows: list[LogRow] = []
    leaders = under_replicated = under_min_isr = offline = delayed_produces = 0
    partitions = replica_manager.partitions()
    for index, partition in enumerate(partitions):
        if index and index % PARTITION_SLICE == 0:
            await asyncio.sleep(0)  # other work runs between slices
        if partition.offline:
            offline += 1
            continue
        log_ = partition.log
        if log_.closed:  # stopped (deleted) between two slices
            continue
        tp = partition.tp
        rows.append(
            (
                _label_value(tp.topic),
                tp.partition,
                log_.size_in_bytes,
                log_.num_segments,
                log_.log_end_offset,
                log_.log_start_offset,
            )
        )
        if partition.is_leader:
            leaders += 1
            isr = len(partition.isr)
            if isr < len(partition.replicas):
                under_replicated += 1
            if isr < partition.min_insync_replicas:
                under_min_isr += 1
            delayed_produces += partition.delayed_produces
    prefix = "kafka_server_replicamanager_"
    isr_stats = replica_manager.isr_stats
    purgatory = GaugeMetricFamily(
        "kafka_server_delayedoperationpurgatory_purgatorysize",
        "Requests waiting in purgatory.",
        labels=["delayedoperation"],
    )
    purgatory.add_metric(["Fetch"], server.network.delayed.fetch)
    purgatory.add_metric(["Produce"], delayed_produces)
    families: list[Any] = [
        *await _controller_families(server, offline + replica_manager.offline_count),
        purgatory,
        _gauge(prefix + "partitioncount", "Partitions hosted here.", len(partitions)),
        _gauge(prefix + "leadercount", "Partitions led here.", leaders),
        _gauge(
            prefix + "underreplicatedpartitions",
            "Led here with an ISR smaller than the replicas.",
            under_replicated,
        ),
        _gauge(
            prefix + "underminisrpartitioncount",
            "Led here with an ISR below min.insync.replicas.",
            under_min_isr,
        ),
        _gauge(
            prefix + "offlinereplicacount",
            "Replicas here in a failed log dir.",
            offline + replica_manager.offline_count,
        ),
        CounterMetricFamily(
            prefix + "isrshrinks", "ISR shrinks of partitions led here.", value=isr_stats.shrinks
        ),
        CounterMetricFamily(
            prefix + "isrexpands", "ISR expansions of partitions led here.", value=isr_stats.expands
        ),
    ]
    return rows, families


async def _controller_families(server: BrokerServer, offline_here: int) -> list[Metric]:
    """ActiveControllerCount, and OfflinePartitionsCount as the active controller sees it: every
    partition of the cluster without a live leader (a single node's: those in a failed log dir)."""
    plane = server.control_plane
    if not plane.replicated:
        active, offline = True, offline_here
    else:
        active = server.controller is not None and server.controller.active
        offline = 0
        if active:
            live = set(plane.live_broker_ids)
            walked = 0
            for topic in plane.image.topics():
                for state in topic.partitions:
                    walked += 1
                    if walked % PARTITION_SLICE == 0:
                        await asyncio.sleep(0)
                    if state.leader < 0 or state.leader not in live:
                        offline += 1
    prefix = "kafka_controller_kafkacontroller_"
    return [
        _gauge(prefix + "activecontrollercount", "1 on the active controller.", int(active)),
        _gauge(
            prefix + "offlinepartitionscount",
            "Partitions without a live leader (on the active controller).",
            offline,
        ),
    ]
