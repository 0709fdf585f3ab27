"""Consumer lag as broker metrics: per group and partition, and a Burrow-style status per group.

``ConsumerLagMonitor`` samples, every ``metrics.lag.sample.interval.ms``, every group this broker
coordinates and every partition the group has a committed offset for (at most
``metrics.lag.max.partitions`` partitions per sample, groups in name order):

* the committed offset;
* the partition's latest offset as consumers see it: the high watermark (what kafka-lag-exporter
  and Burrow call the latest or log-end offset is what ListOffsets(latest) answers, the HW), from
  the local replica -- the leader's, or a follower's, whose HW trails the leader's by at most one
  replica fetch;
* lag in records, ``max(0, HW - committed)`` (as kafka-lag-exporter counts it: transaction
  markers and aborted records below the HW count too, though a read_committed consumer skips them);
* lag in seconds: the age, now minus its timestamp, of the first record not yet consumed (the one
  at the committed offset); 0 when the lag is 0. The timestamp is read from the header of the batch
  holding that offset (an offset index lookup and one 61-byte read per batch header walked, on a
  worker thread, and only when the committed offset moved): a CreateTime batch's base timestamp
  is its first record's, so the age is exact when the committed offset starts a batch and too old
  by at most the batch's own time span (its max minus base timestamp: the producer's linger)
  otherwise; a LogAppendTime batch's records all have its max timestamp. Records are never
  decompressed for this.

Partitions this broker holds no replica of (in a cluster, partitions led by brokers that do not
coordinate the group) are asked of their leaders: one ListOffsets(latest) per leader per sample,
as a consumer asks (replica id -1: the leader answers its HW), over a connection to the leader's
inter-broker listener kept across samples, bounded by ``REMOTE_TIMEOUT_S``. Their lag in seconds
is interpolated, as kafka-lag-exporter does, from the history of (sample time, HW) this monitor
keeps for them: the record at offset ``o`` became readable when the HW passed ``o``, between the
last sample that saw the HW at or below ``o`` and the first that saw it above (linear within that
interval). When the committed offset predates the history, the age of the history's first sample
is a lower bound and is what is exported. A partition whose leader does not answer this time has
no lag in that sample (only its committed offset) and no say in the group's status.

Status rules (Burrow's evaluator, over a sliding window of the last ``metrics.lag.window.samples``
samples of each partition; the window's span is the time from its first to its last sample).
For one partition, in this order:

1. ERROR: the partition is gone (its topic deleted, or fewer partitions than committed to), the
   committed offset is beyond the log end of a partition this broker leads, or the committed
   offset went backwards within the window (Burrow's REWIND; an offset reset to an earlier
   position shows as ERROR until it leaves the window).
2. OK: the current lag is 0, or the window is not full yet (as Burrow judges only complete
   windows: a group's first ``window samples x interval`` show OK).
3. STOPPED: the group has no members and its last commit of the partition is older than the
   window's span (Burrow: now minus the last commit's time exceeds the time between the window's
   first and last commits).
4. OK: the lag was 0 in some sample of the window (the consumer caught up recently).
5. STALLED: the committed offset did not move over the window (consumers are there, or still
   commit, but make no progress).
6. WARNING: the committed offset moved, but the lag never decreased from sample to sample and is
   larger at the end than at the start (the group consumes, slower than producers produce).
7. OK otherwise.

A group's status is its partitions' worst: ERROR > STOPPED > STALLED > WARNING > OK (OK for a
group without sampled partitions).

Spark pipeline stages commit to groups ``strom-spark-<pipeline>.<stage>``; their metrics carry
``pipeline`` and ``stage`` labels (empty for other groups), from the ``PipelineProgress`` in the
committed offsets' metadata, or else from the group's name. From that progress come the stage
metrics (rows/s, batch duration, last batch time).

Sampling runs as one task on the event loop (coordinator state is the loop's); it yields to the
loop every ``_YIELD_EVERY`` partitions of each pass, reads batch headers on a worker thread, and
builds a new immutable snapshot that ``collect`` reads (from any thread). Groups and partitions
can change while a sample yields: each pass works on what it copied. A sample that takes longer
than the interval delays the next one; samples never overlap.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import itertools
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from strom.broker.partition import TopicPartition
from strom.network.connection import BrokerConnection
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from strom.protocol.pipeline_progress import PipelineProgress
from strom.records.batch import TimestampType

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from strom.broker.broker import Broker
    from strom.broker.coordinator.group import ClassicGroup, OffsetAndMetadata
    from strom.storage.unified_log import UnifiedLog

log = logging.getLogger(__name__)

# The group of a pipeline stage, as strom.spark.pipeline.group_id names it (pipeline and stage
# names have no dots).
PIPELINE_GROUP = re.compile(r"strom-spark-([A-Za-z0-9][A-Za-z0-9_-]*)\.([A-Za-z0-9][A-Za-z0-9_-]*)")
# Partitions handled between two turns of the event loop (about a millisecond of work).
_YIELD_EVERY = 100
REMOTE_TIMEOUT_S = 5.0
LIST_OFFSETS_VERSIONS = (1, 8)  # v1 brings replica_id; v8 is the newest this request fills
LATEST_TIMESTAMP = -1
# (HW, first seen ms, last seen ms) runs kept per remote partition for the interpolation.
HISTORY_POINTS = 1024


class LagStatus(enum.Enum):
    OK = "OK"
    WARNING = "WARNING"
    STALLED = "STALLED"
    STOPPED = "STOPPED"
    ERROR = "ERROR"


_SEVERITY = {status: rank for rank, status in enumerate(LagStatus)}


@dataclass(frozen=True, slots=True)
class Observation:
    """One partition of a group in one sample."""

    time_ms: int
    committed: int
    commit_time_ms: int
    high_watermark: int
    # The partition is gone, or the committed offset is beyond the log end of a led partition.
    invalid: bool = False

    @property
    def lag(self) -> int:
        return max(0, self.high_watermark - self.committed)


def partition_status(window: Sequence[Observation], *, has_members: bool, window_size: int) -> LagStatus:
    """A partition's status from its last samples (oldest first), by the rules in the module's doc."""
    last = window[-1]
    if last.invalid or any(
        later.committed < earlier.committed for earlier, later in itertools.pairwise(window)
    ):
        return LagStatus.ERROR
    if last.lag == 0 or len(window) < window_size:
        return LagStatus.OK
    if not has_members and last.time_ms - last.commit_time_ms > last.time_ms - window[0].time_ms:
        return LagStatus.STOPPED
    if any(o.lag == 0 for o in window):
        return LagStatus.OK
    if window[0].committed == last.committed:
        return LagStatus.STALLED
    if (
        all(later.lag >= earlier.lag for earlier, later in itertools.pairwise(window))
        and last.lag > window[0].lag
    ):
        return LagStatus.WARNING
    return LagStatus.OK


def group_status(statuses: Iterable[LagStatus]) -> LagStatus:
    """The worst of a group's partition statuses (OK for none)."""
    return max(statuses, key=_SEVERITY.__getitem__, default=LagStatus.OK)


# -- a sample -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int
    high_watermark: int | None  # None: no replica here, and the leader did not answer
    lag: int | None
    lag_seconds: float | None  # None: unknown (no HW, its batch unreadable, or no history of it)


@dataclass(frozen=True, slots=True)
class GroupLag:
    group: str
    pipeline: str
    stage: str
    status: LagStatus
    partitions: tuple[PartitionLag, ...]
    progress: PipelineProgress | None


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    time_ms: int
    groups: tuple[GroupLag, ...]
    skipped_partitions: int  # over metrics.lag.max.partitions, not sampled
    duration_seconds: float


@dataclass(frozen=True, slots=True)
class _Latest:
    """A sampled partition's HW; its log end and log if this broker leads it / holds a replica."""

    high_watermark: int
    log_end_offset: int | None  # only for a partition this broker leads
    log: UnifiedLog | None  # None: led elsewhere, asked over the network


def record_timestamp(log_: UnifiedLog, offset: int) -> int | None:
    """The timestamp of the record at ``offset`` as its batch header gives it (see the module's
    doc), or None when no batch holds it. Blocking file reads: call it off the event loop."""
    segments = log_.segments
    floor = 0
    for index, segment in enumerate(segments):
        if segment.base_offset <= offset:
            floor = index
    for segment in segments[floor:]:
        found = segment.find_batch(offset)
        if found is None:
            continue
        header = found[1]
        if header.timestamp_type == TimestampType.LOG_APPEND_TIME:
            return header.max_timestamp
        return header.base_timestamp
    return None


def _read_timestamps(
    wanted: Mapping[tuple[TopicPartition, int], UnifiedLog],
) -> dict[tuple[TopicPartition, int], int]:
    """Each (partition, offset)'s record timestamp; a log that fails to read (deleted, closed or
    rolled meanwhile) gives none this time."""
    found: dict[tuple[TopicPartition, int], int] = {}
    for key, log_ in wanted.items():
        try:
            timestamp = record_timestamp(log_, key[1])
        except Exception as error:
            log.debug(
                "could not read a record timestamp for lag",
                extra={"partition": str(key[0]), "error": str(error)},
            )
            continue
        if timestamp is not None and timestamp >= 0:
            found[key] = timestamp
    return found


class HighWatermarkHistory:
    """A remote partition's HW as samples saw it: runs of one HW value, oldest first, each with the
    first and last time it was seen (at most ``HISTORY_POINTS`` runs)."""

    def __init__(self) -> None:
        self.runs: collections.deque[list[int]] = collections.deque(maxlen=HISTORY_POINTS)

    def add(self, time_ms: int, high_watermark: int) -> None:
        if self.runs and self.runs[-1][0] == high_watermark:
            self.runs[-1][2] = time_ms
            return
        if self.runs and high_watermark < self.runs[-1][0]:
            self.runs.clear()  # truncated (an unclean leader election): the history no longer holds
        self.runs.append([high_watermark, time_ms, time_ms])

    def readable_since(self, offset: int) -> int | None:
        """When the record at ``offset`` became readable (ms), interpolated; the history's first
        time if it was readable before that (a lower bound of its age); None if it is not yet."""
        runs = self.runs
        for index, (high_watermark, first_seen, _) in enumerate(runs):
            if high_watermark <= offset:
                continue
            if index == 0:
                return first_seen
            before, last_before = runs[index - 1][0], runs[index - 1][2]
            fraction = (offset + 1 - before) / (high_watermark - before)
            return round(last_before + fraction * (first_seen - last_before))
        return None


class RemoteHighWatermarks:
    """High watermarks of partitions led by other brokers, by ListOffsets(latest) as a consumer
    asks: one request per leader, concurrently, over a connection per leader kept across samples."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._connections: dict[int, BrokerConnection] = {}

    async def fetch(self, leaders: Mapping[int, Sequence[TopicPartition]]) -> dict[TopicPartition, int]:
        found: dict[TopicPartition, int] = {}
        answers = await asyncio.gather(
            *(self._ask(leader, partitions) for leader, partitions in leaders.items()), return_exceptions=True
        )
        for leader, answer in zip(leaders, answers, strict=True):
            if isinstance(answer, BaseException):
                log.debug(
                    "no high watermarks from a leader for lag", extra={"broker": leader, "error": str(answer)}
                )
                self._drop(leader)
            else:
                found.update(answer)
        return found

    def close(self) -> None:
        for leader in list(self._connections):
            self._drop(leader)

    def _drop(self, leader: int) -> None:
        connection = self._connections.pop(leader, None)
        if connection is not None:
            connection.close()

    async def _connection(self, leader: int) -> BrokerConnection:
        connection = self._connections.get(leader)
        if connection is not None and connection.is_open:
            return connection
        endpoint = self._broker.replica_manager.peer_endpoint(leader)
        if endpoint is None:
            raise ConnectionError(f"broker {leader} is not registered")
        connection = await BrokerConnection.open(
            endpoint[0],
            endpoint[1],
            client_id=f"broker-{self._broker.node_id}-lag-monitor",
            timeout=REMOTE_TIMEOUT_S,
        )
        self._connections[leader] = connection
        return connection

    async def _ask(self, leader: int, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        connection = await self._connection(leader)
        version = connection.version(ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSIONS[1], LIST_OFFSETS_VERSIONS[0])
        module = request_module(ApiKey.LIST_OFFSETS, version)
        by_topic: dict[str, list[int]] = collections.defaultdict(list)
        for tp in partitions:
            by_topic[tp.topic].append(tp.partition)
        request = build(
            module.ListOffsetsRequest,
            replica_id=-1,
            isolation_level=0,
            topics=tuple(
                build(
                    module.ListOffsetsTopic,
                    name=topic,
                    partitions=tuple(
                        build(
                            module.ListOffsetsPartition,
                            partition_index=index,
                            current_leader_epoch=-1,
                            timestamp=LATEST_TIMESTAMP,
                            max_num_offsets=1,
                        )
                        for index in indexes
                    ),
                )
                for topic, indexes in by_topic.items()
            ),
        )
        response = await connection.send(request, timeout=REMOTE_TIMEOUT_S)
        return {
            TopicPartition(topic.name, answer.partition_index): int(answer.offset)
            for topic in response.topics
            for answer in topic.partitions
            if answer.error_code == ErrorCode.none and int(answer.offset) >= 0
        }


class ConsumerLagMonitor(Collector):
    """Samples the lag of the groups this broker coordinates (``start``/``stop`` on the event
    loop); a prometheus_client collector of the latest sample."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        config = broker.config
        self.interval_ms: int = config.metrics_lag_sample_interval_ms
        self.max_partitions: int = config.metrics_lag_max_partitions
        self.window_size: int = config.metrics_lag_window_samples
        self._windows: dict[tuple[str, TopicPartition], collections.deque[Observation]] = {}
        # (partition, committed offset) -> the timestamp of the record there: read once per commit.
        self._timestamps: dict[tuple[TopicPartition, int], int] = {}
        self._remote = RemoteHighWatermarks(broker)
        self._histories: dict[TopicPartition, HighWatermarkHistory] = {}
        self._snapshot = LagSnapshot(0, (), 0, 0.0)
        self._families: list[Metric] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def snapshot(self) -> LagSnapshot:
        return self._snapshot

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="consumer-lag-monitor")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._remote.close()

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sample()
            except Exception:
                log.exception("sampling consumer lag failed")
            elapsed_ms = (time.monotonic() - started) * 1000
            await asyncio.sleep(max(0.0, self.interval_ms - elapsed_ms) / 1000)

    async def sample(self) -> LagSnapshot:
        """Take one sample now and make it the one collected."""
        started = time.monotonic()
        taken, skipped = await self._committed_offsets()
        if skipped:
            log.warning(
                "consumer lag sampled only metrics.lag.max.partitions partitions",
                extra={"max_partitions": self.max_partitions, "skipped": skipped},
            )
        image = self._broker.control_plane.image
        counts = {topic.name: len(topic.partitions) for topic in image.topics()}
        partitions = {tp for _, offsets in taken for tp, _ in offsets}
        latest: dict[TopicPartition, _Latest] = {}
        leaders: dict[int, list[TopicPartition]] = collections.defaultdict(list)
        for walked, tp in enumerate(sorted(partitions), 1):
            if walked % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            local = self._broker.replica_manager.partition(tp)
            if local is not None and not local.offline:
                latest[tp] = _Latest(
                    local.high_watermark, local.log_end_offset if local.is_leader else None, local.log
                )
            elif tp.partition < counts.get(tp.topic, 0):
                topic = image.topic(tp.topic)
                state = (
                    next((p for p in topic.partitions if p.partition == tp.partition), None)
                    if topic
                    else None
                )
                leader = state.leader if state is not None else -1
                if leader >= 0 and leader != self._broker.node_id:
                    leaders[leader].append(tp)
        remote = await self._remote.fetch(leaders) if leaders else {}
        now_ms = time.time_ns() // 1_000_000
        histories: dict[TopicPartition, HighWatermarkHistory] = {}
        for tp, high_watermark in remote.items():
            history = histories[tp] = self._histories.get(tp) or HighWatermarkHistory()
            history.add(now_ms, high_watermark)
            latest[tp] = _Latest(high_watermark, None, None)
        # A leader that did not answer this time keeps the history of its partitions.
        for tp in (
            tp for tps in leaders.values() for tp in tps if tp not in remote and tp in self._histories
        ):
            histories[tp] = self._histories[tp]
        self._histories = histories
        wanted: dict[tuple[TopicPartition, int], UnifiedLog] = {}
        for _, offsets in taken:
            for tp, offset in offsets:
                found = latest.get(tp)
                key = (tp, offset.offset)
                if (
                    found is not None
                    and found.log is not None
                    and offset.offset < found.high_watermark
                    and key not in self._timestamps
                ):
                    wanted[key] = found.log
            await asyncio.sleep(0)
        if wanted:
            read = await asyncio.get_running_loop().run_in_executor(None, _read_timestamps, wanted)
            self._timestamps.update(read)
        snapshot = await self._build(taken, latest, counts, now_ms, skipped, started)
        families = await self._build_families(snapshot, started)
        # Both replaced at once, between two turns of the loop: a scrape sees one sample whole.
        self._snapshot, self._families = snapshot, families
        return snapshot

    async def _committed_offsets(
        self,
    ) -> tuple[list[tuple[ClassicGroup, list[tuple[TopicPartition, OffsetAndMetadata]]]], int]:
        """Each group's committed offsets, groups in name order, up to max partitions in all; and
        how many were left out."""
        groups = sorted(self._broker.group_coordinator.list_groups(None, None), key=lambda g: g.group_id)
        taken: list[tuple[ClassicGroup, list[tuple[TopicPartition, OffsetAndMetadata]]]] = []
        budget, skipped, walked = self.max_partitions, 0, 0
        for group in groups:
            offsets = sorted(group.offsets.items(), key=lambda item: item[0])
            if len(offsets) > budget:
                skipped += len(offsets) - budget
                offsets = offsets[:budget]
            budget -= len(offsets)
            taken.append((group, offsets))
            walked += len(offsets)
            if walked >= _YIELD_EVERY:
                walked = 0
                await asyncio.sleep(0)  # many groups: let requests in between
        return taken, skipped

    async def _build(
        self,
        taken: list[tuple[ClassicGroup, list[tuple[TopicPartition, OffsetAndMetadata]]]],
        latest: Mapping[TopicPartition, _Latest],
        partition_counts: Mapping[str, int],
        now_ms: int,
        skipped: int,
        started: float,
    ) -> LagSnapshot:
        windows: dict[tuple[str, TopicPartition], collections.deque[Observation]] = {}
        timestamps: dict[tuple[TopicPartition, int], int] = {}
        result: list[GroupLag] = []
        walked = 0
        for group, offsets in taken:
            statuses: list[LagStatus] = []
            partitions: list[PartitionLag] = []
            for tp, offset in offsets:
                walked += 1
                if walked % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                found = latest.get(tp)
                gone = tp.partition >= partition_counts.get(tp.topic, 0)
                if found is None and not gone:
                    partitions.append(PartitionLag(tp.topic, tp.partition, offset.offset, None, None, None))
                    continue
                high_watermark = found.high_watermark if found is not None else offset.offset
                beyond = (
                    found is not None
                    and found.log_end_offset is not None
                    and offset.offset > found.log_end_offset
                )
                observation = Observation(
                    now_ms, offset.offset, offset.commit_timestamp, high_watermark, invalid=gone or beyond
                )
                window = self._windows.get((group.group_id, tp))
                if window is None:
                    window = collections.deque(maxlen=self.window_size)
                window.append(observation)
                windows[(group.group_id, tp)] = window
                statuses.append(
                    partition_status(window, has_members=bool(group.members), window_size=self.window_size)
                )
                lag_seconds: float | None = 0.0
                if observation.lag > 0:
                    since = self._since(tp, offset.offset, found)
                    if since is not None and found is not None and found.log is not None:
                        timestamps[(tp, offset.offset)] = since
                    lag_seconds = None if since is None else max(0, now_ms - since) / 1000
                partitions.append(
                    PartitionLag(
                        tp.topic, tp.partition, offset.offset, high_watermark, observation.lag, lag_seconds
                    )
                )
            progress = _latest_progress(offsets)
            pipeline, stage = _stage_of(group.group_id, progress)
            result.append(
                GroupLag(group.group_id, pipeline, stage, group_status(statuses), tuple(partitions), progress)
            )
        # Windows and timestamps of partitions no longer committed to (or over the cap) are dropped.
        self._windows = windows
        self._timestamps = timestamps
        return LagSnapshot(now_ms, tuple(result), skipped, time.monotonic() - started)

    def _since(self, tp: TopicPartition, offset: int, found: _Latest | None) -> int | None:
        """The time (ms) the record at ``offset`` dates from: its batch's timestamp from a local
        replica, else when the leader's HW passed it."""
        if found is not None and found.log is not None:
            return self._timestamps.get((tp, offset))
        history = self._histories.get(tp)
        return history.readable_since(offset) if history is not None else None

    # -- prometheus_client --------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The families of the last sample, built when it was taken (a scrape costs nothing)."""
        return iter(self._families)

    async def _build_families(self, snapshot: LagSnapshot, started: float) -> list[Metric]:
        labels = ["group", "topic", "partition", "pipeline", "stage"]
        group_labels = ["group", "pipeline", "stage"]
        stage_labels = ["pipeline", "stage"]
        offset = GaugeMetricFamily(
            "kafka_consumergroup_group_offset",
            "The group's committed offset of the partition.",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "kafka_consumergroup_group_lag",
            "The partition's high watermark minus the group's committed offset (records).",
            labels=labels,
        )
        lag_seconds = GaugeMetricFamily(
            "kafka_consumergroup_group_lag_seconds",
            "Age of the group's first unconsumed record of the partition (0 when the lag is 0).",
            labels=labels,
        )
        latest = GaugeMetricFamily(
            "kafka_partition_latest_offset",
            "The partition's high watermark (the latest offset consumers can read), for partitions groups commit to.",
            labels=["topic", "partition"],
        )
        max_lag = GaugeMetricFamily(
            "kafka_consumergroup_group_max_lag",
            "The group's largest partition lag (records).",
            labels=group_labels,
        )
        max_lag_seconds = GaugeMetricFamily(
            "kafka_consumergroup_group_max_lag_seconds",
            "The group's largest partition lag in seconds.",
            labels=group_labels,
        )
        sum_lag = GaugeMetricFamily(
            "kafka_consumergroup_group_sum_lag",
            "The group's lag over all its partitions (records).",
            labels=group_labels,
        )
        status = GaugeMetricFamily(
            "strom_consumergroup_status",
            "The group's Burrow-style status: 1 for the current one (OK, WARNING, STALLED, STOPPED, ERROR), 0 for the others.",
            labels=[*group_labels, "status"],
        )
        rows_per_second = GaugeMetricFamily(
            "strom_pipeline_stage_rows_per_second",
            "Rows per second the stage's last micro-batch processed.",
            labels=stage_labels,
        )
        input_rows_per_second = GaugeMetricFamily(
            "strom_pipeline_stage_input_rows_per_second",
            "Rows per second that arrived for the stage's last micro-batch.",
            labels=stage_labels,
        )
        batch_rows = GaugeMetricFamily(
            "strom_pipeline_stage_batch_rows",
            "Input rows of the stage's last micro-batch.",
            labels=stage_labels,
        )
        batch_duration = GaugeMetricFamily(
            "strom_pipeline_stage_batch_duration_seconds",
            "How long the stage's last micro-batch took.",
            labels=stage_labels,
        )
        last_batch = GaugeMetricFamily(
            "strom_pipeline_stage_last_batch_timestamp_seconds",
            "When the stage's last micro-batch finished (seconds since the epoch).",
            labels=stage_labels,
        )
        latest_seen: set[tuple[str, int]] = set()
        stages_seen: set[tuple[str, str]] = set()
        walked = 0
        for group in snapshot.groups:
            known = [p for p in group.partitions if p.lag is not None]
            for p in group.partitions:
                walked += 1
                if walked % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                values = [group.group, p.topic, str(p.partition), group.pipeline, group.stage]
                offset.add_metric(values, p.committed)
                if p.lag is not None:
                    lag.add_metric(values, p.lag)
                if p.lag_seconds is not None:
                    lag_seconds.add_metric(values, p.lag_seconds)
                if p.high_watermark is not None and (p.topic, p.partition) not in latest_seen:
                    latest_seen.add((p.topic, p.partition))
                    latest.add_metric([p.topic, str(p.partition)], p.high_watermark)
            group_values = [group.group, group.pipeline, group.stage]
            if known:
                max_lag.add_metric(group_values, max(p.lag or 0 for p in known))
                sum_lag.add_metric(group_values, sum(p.lag or 0 for p in known))
            seconds = [p.lag_seconds for p in group.partitions if p.lag_seconds is not None]
            if seconds:
                max_lag_seconds.add_metric(group_values, max(seconds))
            for each in LagStatus:
                status.add_metric([*group_values, each.value], 1.0 if each is group.status else 0.0)
            progress = group.progress
            # Two groups of one stage (its group id changed): the first in name order speaks for it.
            if progress is not None and group.pipeline and (group.pipeline, group.stage) not in stages_seen:
                stages_seen.add((group.pipeline, group.stage))
                stage_values = [group.pipeline, group.stage]
                rows_per_second.add_metric(stage_values, progress.processed_rows_per_second)
                input_rows_per_second.add_metric(stage_values, progress.input_rows_per_second)
                batch_rows.add_metric(stage_values, progress.rows)
                batch_duration.add_metric(stage_values, progress.batch_duration_ms / 1000)
                last_batch.add_metric(stage_values, progress.batch_end_ms / 1000)
        sample = GaugeMetricFamily(
            "strom_consumer_lag_sample_duration_seconds",
            "How long the last consumer lag sample took, its metric families built.",
        )
        sample.add_metric([], time.monotonic() - started)
        skipped = GaugeMetricFamily(
            "strom_consumer_lag_skipped_partitions",
            "Partitions with committed offsets the last sample left out (over metrics.lag.max.partitions).",
        )
        skipped.add_metric([], snapshot.skipped_partitions)
        return [
            *(offset, lag, lag_seconds, latest, max_lag, max_lag_seconds, sum_lag, status),
            *(rows_per_second, input_rows_per_second, batch_rows, batch_duration, last_batch),
            sample,
            skipped,
        ]


def _latest_progress(offsets: Sequence[tuple[TopicPartition, OffsetAndMetadata]]) -> PipelineProgress | None:
    """The pipeline progress in the group's most recent commit (its partitions share it)."""
    latest = max(offsets, key=lambda item: item[1].commit_timestamp, default=None)
    return None if latest is None else PipelineProgress.from_metadata(latest[1].metadata)


def _stage_of(group_id: str, progress: PipelineProgress | None) -> tuple[str, str]:
    if progress is not None and progress.pipeline and progress.stage:
        return progress.pipeline, progress.stage
    match = PIPELINE_GROUP.fullmatch(group_id)
    return (match.group(1), match.group(2)) if match else ("", "")
