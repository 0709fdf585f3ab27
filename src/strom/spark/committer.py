"""Commits each finished micro-batch's end offsets to a consumer group, from the driver.

Spark's Kafka connector never commits, so ``kafka-consumer-groups`` cannot show a
query's lag. Strom commits after every micro-batch so ``strom groups describe`` can. The
source's own ``commit(end)`` is no help: Spark calls it only when it plans the next batch
(late), and never after an availableNow query's last batch. A StreamingQueryListener
sees every finished batch's progress, with each source's end offsets, instead.

A progress event names its sources only by their description, so the committer looks
up each query's strom sources (their options and checkpoint paths) in the query's
logical plan through the JVM gateway. It records the query's handle when the query
starts (``track`` does the same at once, for a caller that cannot wait for the event),
because a query that finishes fast is gone from ``spark.streams`` before its last
progress event is delivered. Commits run in order on a thread of their own, so a broker
that does not answer never holds up Spark's listener bus; once a query's termination
event has gone through that thread, its last batch has been committed (``wait_for``).

The JVM delivers listener events asynchronously, through py4j callbacks into this process.
A script that ends right after its query does (``awaitTermination``) would exit before the
termination event arrives, and the JVM would log a py4j stack trace for the callback into a
Python that is gone; ``close`` (run at exit) lets the events already posted through, finishes
their commits and unregisters the listener first.

The group is ``kafka.group.id`` if the source has one, else ``<groupIdPrefix>-<query
name>``, else ``<groupIdPrefix>-<hash of the checkpoint location>``: stable across
restarts of the same query.

Each commit's offsets carry the batch's progress in their metadata (``PipelineProgress``: rows,
rows/s, duration, end time, source and sink topics), so the broker's lag metrics and the console
show a pipeline stage's throughput with one OffsetFetch. A pipeline runner names the stage and its
sink (``track``); for other queries the stage is the query's name and the sinks are unknown. A
broker whose ``offset.metadata.max.bytes`` is below the metadata's size gets the commit without it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)
from pyspark.sql.streaming.query import StreamingQuery

from strom.client.admin import AdminClient
from strom.client.cluster import TopicPartition
from strom.client.consumer import OffsetAndMetadata
from strom.client.errors import KafkaException
from strom.protocol.errors import ErrorCode
from strom.protocol.pipeline_progress import PipelineProgress
from strom.spark.offsets import StreamOffset
from strom.spark.options import SourceOptions, parse_source_options
from strom.spark.source import SOURCE_NAME

log = logging.getLogger("strom.spark")

# Seconds a commit may take; a later batch's commit covers a failed one.
COMMIT_TIMEOUT = 10.0


@dataclass(frozen=True)
class _StromSource:
    options: SourceOptions
    group_id: str


@dataclass(frozen=True)
class StageIdentity:
    """What a query is, for the progress its commits carry: a pipeline's stage and its sink topics."""

    pipeline: str
    stage: str
    sinks: tuple[str, ...] = ()


class OffsetCommitter(StreamingQueryListener):
    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._lock = threading.Lock()
        self._queries: dict[str, Any] = {}  # runId -> the JVM StreamExecution
        self._sources: dict[str, dict[str, _StromSource]] = {}  # runId -> source description -> source
        self._terminated: dict[str, threading.Event] = {}
        self._committed: dict[tuple[str, str], str] = {}  # (runId, description) -> last end offset sent
        self._admins: dict[tuple[tuple[str, str], ...], AdminClient] = {}
        self._identities: dict[str, StageIdentity] = {}  # runId -> the stage the query runs
        # Commits run on a thread of their own: a slow or absent broker must not hold up
        # Spark's listener bus (or spark.stop(), which drains it).
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._commit_loop, name="strom-offset-committer", daemon=True).start()

    # -- the caller's side ----------------------------------------------------------------------

    def track(self, query: StreamingQuery, identity: StageIdentity | None = None) -> None:
        """Remember a just-started query's handle now rather than when its start event arrives,
        and, for a pipeline's stage, which stage it is."""
        run_id = str(query.runId)
        if identity is not None:
            with self._lock:
                self._identities[run_id] = identity
        self._remember(run_id, query._jsq.streamingQuery())

    def wait_for(self, query: StreamingQuery, timeout: float = 30.0) -> bool:
        """After the query stopped: wait until its last batch's offsets are committed."""
        return self._event(str(query.runId)).wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Before the driver's Python exits: deliver the listener events the JVM has posted
        (an ended query's last progress and termination), finish their commits, and stop
        listening, so that no callback reaches this process once it is gone. A no-op once
        the session has stopped: stopping drains the listener bus."""
        context = self._spark.sparkContext
        if context._jsc is None:
            return
        deadline = time.monotonic() + timeout
        try:
            context._jsc.sc().listenerBus().waitUntilEmpty(int(timeout * 1000))
        except Exception as error:  # a timeout, or a JVM already going away
            log.debug("listener events not all delivered before exit: %s", error)
        drained = threading.Event()
        self._work.put(drained.set)
        drained.wait(max(0.0, deadline - time.monotonic()))
        try:
            self._spark.streams.removeListener(self)
        except Exception as error:
            log.debug("could not unregister the offset committer: %s", error)

    # -- listener events (the listener bus thread, in order) ------------------------------------

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        run_id = str(event.runId)
        self._event(run_id)
        jquery = self._spark._jsparkSession.streams().get(str(event.id))
        if jquery is not None:
            self._remember(run_id, jquery.streamingQuery())

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        run_id = str(progress.runId)
        query = progress.name or str(progress.id)
        try:
            sources = self._strom_sources(run_id, progress.name)
        except Exception:  # the JVM gateway failing must not take the listener bus down
            log.warning("cannot inspect the sources of query %s", query, exc_info=True)
            return
        with self._lock:
            identity = self._identities.get(run_id) or StageIdentity("", query)
        try:
            batch: PipelineProgress | None = batch_progress(progress, identity)
        except Exception:  # a progress of unexpected shape costs the metadata, not the commit
            log.debug("cannot read the progress of query %s", query, exc_info=True)
            batch = None
        for source_progress in progress.sources:
            source = sources.get(source_progress.description)
            end = source_progress.endOffset
            key = (run_id, source_progress.description)
            if source is None or not end or self._committed.get(key) == end:
                continue
            self._committed[key] = end
            self._work.put(functools.partial(self._commit, query, source, end, batch))

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        run_id = str(event.runId)
        with self._lock:
            self._queries.pop(run_id, None)
            self._sources.pop(run_id, None)
            self._identities.pop(run_id, None)
            for key in [key for key in self._committed if key[0] == run_id]:
                del self._committed[key]
        # Set once the commits queued before it are done.
        self._work.put(self._event(run_id).set)

    # -- internals ------------------------------------------------------------------------------

    def _event(self, run_id: str) -> threading.Event:
        with self._lock:
            return self._terminated.setdefault(run_id, threading.Event())

    def _remember(self, run_id: str, execution: Any) -> None:
        with self._lock:
            self._queries.setdefault(run_id, execution)

    def _strom_sources(self, run_id: str, query_name: str | None) -> dict[str, _StromSource]:
        with self._lock:
            known = self._sources.get(run_id)
            execution = self._queries.get(run_id)
        if known is not None:
            return known
        if execution is None:
            log.warning("query %s ended before its sources could be inspected; offsets not committed", query_name)
            return {}
        checkpoint = str(execution.resolvedCheckpointRoot())
        found: dict[str, _StromSource] = {}
        leaves = execution.logicalPlan().collectLeaves().iterator()
        while leaves.hasNext():
            leaf = leaves.next()
            if leaf.getClass().getSimpleName() != "StreamingDataSourceV2ScanRelation":
                continue
            relation = leaf.relation()
            if str(relation.name()) != SOURCE_NAME:
                continue
            options = _java_map(relation.options().asCaseSensitiveMap())
            parsed = parse_source_options(options, streaming=True)
            found[str(leaf.stream().toString())] = _StromSource(parsed, consumer_group(parsed, query_name, checkpoint))
        with self._lock:
            self._sources[run_id] = found
        return found

    def _commit_loop(self) -> None:
        while True:
            self._work.get()()

    def _commit(
        self, query: str, source: _StromSource, end_offset: str, progress: PipelineProgress | None
    ) -> None:
        offsets = StreamOffset.from_json_dict(end_offset, "end offset").offsets
        config = source.options.client_config("admin")
        key = tuple(sorted(config.items()))
        admin = self._admins.get(key)
        if admin is None:
            admin = self._admins[key] = AdminClient(config)
        sources = tuple(sorted({tp.topic for tp in offsets}))
        metadata = "" if progress is None else dataclasses.replace(progress, sources=sources).to_metadata()
        try:
            try:
                self._alter(admin, source.group_id, offsets, metadata)
            except KafkaException as error:
                if error.error_code != ErrorCode.offset_metadata_too_large:
                    raise
                self._alter(admin, source.group_id, offsets, "")
        except Exception as error:
            log.warning("could not commit offsets of query %s to group %s: %s", query, source.group_id, error)

    @staticmethod
    def _alter(
        admin: AdminClient, group_id: str, offsets: Mapping[TopicPartition, int], metadata: str
    ) -> None:
        admin.alter_consumer_group_offsets(
            group_id,
            {tp: OffsetAndMetadata(offset, metadata) for tp, offset in offsets.items()},
            timeout=COMMIT_TIMEOUT,
        )


def batch_progress(progress: Any, identity: StageIdentity) -> PipelineProgress:
    """A finished batch's StreamingQueryProgress as what its commits carry (their source topics
    are added per commit)."""
    duration_ms = int(progress.batchDuration or 0)
    try:
        started = datetime.fromisoformat(str(progress.timestamp).replace("Z", "+00:00"))
        end_ms = int(started.timestamp() * 1000) + duration_ms
    except ValueError:
        end_ms = time.time_ns() // 1_000_000
    return PipelineProgress(
        pipeline=identity.pipeline,
        stage=identity.stage,
        batch_id=int(progress.batchId),
        rows=int(progress.numInputRows or 0),
        input_rows_per_second=float(progress.inputRowsPerSecond or 0.0),
        processed_rows_per_second=float(progress.processedRowsPerSecond or 0.0),
        batch_duration_ms=duration_ms,
        batch_end_ms=end_ms,
        sinks=identity.sinks,
    )


def consumer_group(options: SourceOptions, query_name: str | None, checkpoint: str = "") -> str:
    """The group a query's strom source commits to: ``kafka.group.id``, else one named after the
    query, else after its checkpoint location (stable across restarts either way)."""
    if options.group_id:
        return options.group_id
    if query_name:
        return f"{options.group_id_prefix}-{query_name}"
    return f"{options.group_id_prefix}-{hashlib.sha256(checkpoint.encode()).hexdigest()[:16]}"


def _java_map(jmap: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    entries = jmap.entrySet().iterator()
    while entries.hasNext():
        entry = entries.next()
        out[str(entry.getKey())] = str(entry.getValue())
    return out
