"""Pipelines: Spark Structured Streaming stages from Strom topics to Strom topics.

A pipeline file is a small Python file that defines a module-level ``pipeline``::

    from pyspark.sql import functions as F
    from strom.spark.pipeline import Pipeline

    pipeline = Pipeline("weblog")

    @pipeline.stage(source="access_log", sink="pageloads")
    def parse(lines):  # a streaming DataFrame with the strom source's columns
        return lines.where(F.col("value").contains(b"index.html")).select("value")

    pipeline.sql("stats", source="pageloads", sink="pageload_stats",
                 query="SELECT ... FROM pageloads ...")  # the source is a temp view named after its topic

Each stage is one streaming query, named ``<pipeline>.<stage>``, reading its source topics
with ``format("strom")`` (from the earliest offset when it first starts) and writing the
DataFrame it returns (a ``value`` column, optionally ``key``, ``headers``, ``partition``) to
its sink topic, with its checkpoint in ``<checkpoint dir>/<pipeline>/<stage>``. Its finished
micro-batches are committed to the consumer group ``strom-spark-<pipeline>.<stage>`` (or the
stage's ``kafka.group.id``), so lag shows in ``strom groups describe`` and ``pipeline_status``.
Every sink of a pipeline is a Strom topic, so stages write exactly once (the sink's
``exactlyOnce``, ``strom.spark.writer``) unless the runner is told otherwise or a stage's
``sink_options`` set ``exactlyOnce`` to false.

``PipelineRunner`` runs the stages of a pipeline in a SparkSession: all at once until told
to stop, or each once to the end of what its sources hold (``availableNow``), in order, so a
stage reads what the stages before it wrote. It keeps each stage's latest progress in
``strom-status.json`` beside the stage's checkpoint, which ``pipeline_status`` reads.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import runpy
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from strom.client.admin import AdminClient, OffsetSpec
from strom.client.cluster import TopicPartition
from strom.client.errors import KafkaException, KafkaTimeoutError
from strom.spark.committer import OffsetCommitter, StageIdentity, consumer_group
from strom.spark.offsets import CheckpointMismatchError, OffsetsFormatError, StreamOffset
from strom.spark.options import (
    Assign,
    OptionError,
    Subscribe,
    SubscribePattern,
    parse_sink_options,
    parse_source_options,
)
from strom.spark.session import register
from strom.spark.source import SOURCE_NAME

log = logging.getLogger("strom.pipeline")

STATUS_FILE = "strom-status.json"
EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"
DEFAULT_TRIGGER = "1 second"
# A stage with no finished batch for this long is logged with what its query is doing (and again
# every period): a run that seems to hang says where.
STALL_LOG_S = 60.0
OUTPUT_MODES = ("append", "update", "complete")
# Stage and pipeline names become query names, group ids and folder names.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")

Transform = Callable[[DataFrame], DataFrame]


class PipelineError(Exception):
    """A pipeline that cannot be loaded, built or run; the message is one line."""


@dataclass(frozen=True)
class Stage:
    """One streaming query: its source topics (or a ``subscribePattern``/``assign`` in
    ``source_options``), what it does (``transform`` or a SQL ``query`` over the view ``view``),
    and its sink topic."""

    name: str
    sink: str
    topics: tuple[str, ...] = ()
    transform: Transform | None = None
    query: str | None = None
    view: str | None = None
    output_mode: str = "append"
    trigger: str | None = None
    source_options: Mapping[str, str] = field(default_factory=dict)
    sink_options: Mapping[str, str] = field(default_factory=dict)

    def reader_options(self, bootstrap: str) -> dict[str, str]:
        """The strom source's options: new queries start at the earliest offset, and read only
        committed records (a stage's source is often an exactly-once stage's sink, whose aborted
        attempts are in the log)."""
        options = {
            "kafka.bootstrap.servers": bootstrap,
            "startingOffsets": "earliest",
            "kafka.isolation.level": "read_committed",
        }
        if self.topics:
            options["subscribe"] = ",".join(self.topics)
        options.update(self.source_options)
        return options

    def writer_options(self, bootstrap: str, exactly_once: bool = True) -> dict[str, str]:
        """The strom sink's options: exactly-once by default (``exactly_once``) unless the stage says."""
        return {
            "kafka.bootstrap.servers": bootstrap,
            "topic": self.sink,
            "exactlyOnce": str(exactly_once).lower(),
            **self.sink_options,
        }

    def delivery(self, exactly_once: bool = True) -> str:
        """``exactly-once`` or ``at-least-once``: what the stage's sink gives."""
        eos = parse_sink_options(self.writer_options("-", exactly_once)).exactly_once
        return EXACTLY_ONCE if eos else AT_LEAST_ONCE


class Pipeline:
    """Stages that read topics and write topics, each a streaming query."""

    def __init__(self, name: str) -> None:
        _check_name(name, "pipeline")
        self.name = name
        self.stages: list[Stage] = []

    def stage(
        self,
        *,
        sink: str,
        source: str | Sequence[str] | None = None,
        name: str | None = None,
        output_mode: str = "append",
        trigger: str | None = None,
        source_options: Mapping[str, str] | None = None,
        sink_options: Mapping[str, str] | None = None,
    ) -> Callable[[Transform], Transform]:
        """A decorator: the function (named after the stage unless ``name``) takes the source's
        streaming DataFrame and returns the DataFrame to write to ``sink``."""

        def add(transform: Transform) -> Transform:
            self._add(
                Stage(
                    name=name or transform.__name__,
                    sink=sink,
                    topics=_topics(source),
                    transform=transform,
                    output_mode=output_mode,
                    trigger=trigger,
                    source_options=dict(source_options or {}),
                    sink_options=dict(sink_options or {}),
                )
            )
            return transform

        return add

    def sql(
        self,
        name: str,
        *,
        sink: str,
        query: str,
        source: str | Sequence[str] | None = None,
        view: str | None = None,
        output_mode: str = "append",
        trigger: str | None = None,
        source_options: Mapping[str, str] | None = None,
        sink_options: Mapping[str, str] | None = None,
    ) -> Stage:
        """A stage that is one Spark SQL query over a temp view of its source: ``view`` if given,
        else the source topic's name with characters other than letters, digits and ``_``
        replaced by ``_``."""
        topics = _topics(source)
        if view is None:
            if len(topics) != 1:
                raise PipelineError(
                    f"stage {name!r}: name the SQL view (view=...) of a source that is not one topic"
                )
            view = re.sub(r"\W", "_", topics[0])
        return self._add(
            Stage(
                name=name,
                sink=sink,
                topics=topics,
                query=query,
                view=view,
                output_mode=output_mode,
                trigger=trigger,
                source_options=dict(source_options or {}),
                sink_options=dict(sink_options or {}),
            )
        )

    def query_name(self, stage: Stage) -> str:
        return f"{self.name}.{stage.name}"

    def select(self, names: Iterable[str] | None) -> list[Stage]:
        """The stages named (all if None), in definition order."""
        if names is None:
            return list(self.stages)
        wanted = list(dict.fromkeys(names))
        known = {stage.name for stage in self.stages}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise PipelineError(
                f"pipeline {self.name!r} has no stage {unknown[0]!r} (stages: {', '.join(sorted(known))})"
            )
        return [stage for stage in self.stages if stage.name in wanted]

    def _add(self, stage: Stage) -> Stage:
        _check_name(stage.name, "stage")
        if any(s.name == stage.name for s in self.stages):
            raise PipelineError(f"pipeline {self.name!r} has two stages named {stage.name!r}")
        if stage.output_mode not in OUTPUT_MODES:
            raise PipelineError(
                f"stage {stage.name!r}: output_mode must be one of {', '.join(OUTPUT_MODES)}, got {stage.output_mode!r}"
            )
        if not stage.sink.strip():
            raise PipelineError(f"stage {stage.name!r}: the sink topic is empty")
        # The options are checked now (a placeholder bootstrap) so a mistake names its stage.
        try:
            parse_source_options(stage.reader_options("-"), streaming=True)
            parse_sink_options(stage.writer_options("-"))
        except OptionError as error:
            raise PipelineError(f"stage {stage.name!r}: {error}") from None
        self.stages.append(stage)
        return stage


def _topics(source: str | Sequence[str] | None) -> tuple[str, ...]:
    if source is None:
        return ()
    names = [source] if isinstance(source, str) else list(source)
    return tuple(dict.fromkeys(t.strip() for name in names for t in name.split(",") if t.strip()))


def _check_name(name: str, what: str) -> None:
    if not _NAME.fullmatch(name):
        raise PipelineError(
            f"{what} name {name!r}: use letters, digits, '_' and '-' (starting with a letter or digit)"
        )


def load_pipeline(path: Path) -> Pipeline:
    """Run a pipeline file and return its module-level ``pipeline``. Failures are one line
    naming the file and line. The file's folder is on ``sys.path`` while it loads, as for
    ``python FILE``, so it can import modules beside it."""
    if not path.is_file():
        raise PipelineError(f"{path}: no such pipeline file")
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        namespace = runpy.run_path(str(path), run_name="__strom_pipeline__")
    except SyntaxError as error:
        raise PipelineError(f"{path}:{error.lineno}: SyntaxError: {error.msg}") from None
    except Exception as error:
        raise PipelineError(f"{_where(path, error)}: {_describe(error)}") from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
    pipeline = namespace.get("pipeline")
    if not isinstance(pipeline, Pipeline):
        raise PipelineError(f"{path}: defines no module-level `pipeline` (a strom.spark.pipeline.Pipeline)")
    if not pipeline.stages:
        raise PipelineError(f"{path}: pipeline {pipeline.name!r} has no stages")
    return pipeline


def _where(path: Path, error: BaseException) -> str:
    """``file:line`` of the innermost frame of the traceback that is in the pipeline file."""
    line = None
    for frame in traceback.extract_tb(error.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            line = frame.lineno
    return f"{path}:{line}" if line is not None else str(path)


def _describe(error: BaseException) -> str:
    if isinstance(error, PipelineError):
        return str(error)
    return f"{type(error).__name__}: {one_line(str(error))}"


def one_line(text: str) -> str:
    """The telling line of an error text that may carry a Java stack trace or a Python traceback
    from a Spark worker: the exception line of the traceback, else the first line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    marker = "Traceback (most recent call last)"
    tracebacks = [i for i, line in enumerate(lines) if marker in line]
    if tracebacks:
        # What Spark says before the traceback, then the exception line after its last frame.
        context = lines[tracebacks[0]].split(marker)[0].strip()
        for line in lines[tracebacks[-1] + 1 :]:
            if not line.startswith(("File ", "^", "~")) and re.match(r"[\w.]+(Error|Exception|Exit)\b", line):
                return f"{context} {line}" if context else line
    return lines[0]


# -- checkpoints and status -------------------------------------------------------------------


def stage_checkpoint(checkpoint_dir: Path, pipeline: Pipeline, stage: Stage) -> Path:
    return checkpoint_dir / pipeline.name / stage.name


def group_id(pipeline: Pipeline, stage: Stage) -> str:
    """The consumer group the committer commits the stage's finished batches to."""
    return consumer_group(parse_source_options(stage.reader_options("-"), streaming=True), pipeline.query_name(stage))


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _write_json(path: Path, value: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(temporary, path)  # a reader never sees half a file


def read_status_file(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class StageStatus:
    """What a stage's status file says, kept up to date while the runner runs it."""

    def __init__(self, pipeline: Pipeline, stage: Stage, checkpoint: Path, delivery: str) -> None:
        self.path = checkpoint / STATUS_FILE
        # A restarted stage keeps showing its last batch until it finishes a new one.
        previous = read_status_file(self.path) or {}
        self.data: dict[str, Any] = {
            key: previous.get(key)
            for key in (
                "batchId",
                "numInputRows",
                "inputRowsPerSecond",
                "processedRowsPerSecond",
                "sources",
                "watermark",
                "timestamp",
            )
        }
        self.data.update(
            pipeline=pipeline.name,
            stage=stage.name,
            query=pipeline.query_name(stage),
            sink=stage.sink,
            delivery=delivery,
            group=group_id(pipeline, stage),
            checkpoint=str(checkpoint),
            pid=os.getpid(),
            host=socket.gethostname(),
            error=None,
        )

    def update(self, **values: Any) -> None:
        self.data.update(values, updated=_utc_now())
        _write_json(self.path, self.data)

    def progress(self, progress: Any) -> None:
        """A finished micro-batch's StreamingQueryProgress."""
        self.update(
            batchId=progress.batchId,
            numInputRows=progress.numInputRows,
            inputRowsPerSecond=_finite(progress.inputRowsPerSecond),
            processedRowsPerSecond=_finite(progress.processedRowsPerSecond),
            sources=[
                {
                    "description": s.description,
                    "endOffset": _json_or_text(s.endOffset),
                    "numInputRows": s.numInputRows,
                }
                for s in progress.sources
            ],
            watermark=(progress.eventTime or {}).get("watermark"),
            timestamp=progress.timestamp,
        )


def _finite(value: float | None) -> float | None:
    return None if value is None or value != value or value in (float("inf"), float("-inf")) else value


def _json_or_text(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


# -- running ------------------------------------------------------------------------------------


ProgressCallback = Callable[[Stage, Mapping[str, Any]], None]


@dataclass
class _Running:
    stage: Stage
    query: StreamingQuery
    status: StageStatus
    last_batch: int = -1
    next_stall_log: float = field(default_factory=lambda: time.monotonic() + STALL_LOG_S)


class PipelineRunner:
    """Runs stages of a pipeline as streaming queries of one SparkSession."""

    def __init__(
        self,
        pipeline: Pipeline,
        spark: SparkSession,
        *,
        bootstrap: str,
        checkpoint_dir: Path,
        stages: Iterable[str] | None = None,
        trigger: str = DEFAULT_TRIGGER,
        commit_timeout: float = 60.0,
        on_progress: ProgressCallback | None = None,
        exactly_once: bool = True,
    ) -> None:
        self.pipeline = pipeline
        self.exactly_once = exactly_once
        self.spark = spark
        self.bootstrap = bootstrap
        self.checkpoint_dir = checkpoint_dir
        self.stages = pipeline.select(stages)
        self.trigger = trigger
        self.commit_timeout = commit_timeout
        self.on_progress = on_progress
        self.committer: OffsetCommitter = register(spark)
        self._running: list[_Running] = []

    def build(self, stage: Stage) -> DataFrame:
        """The stage's output: a streaming DataFrame over its source."""
        reader = self.spark.readStream.format(SOURCE_NAME)
        for key, value in stage.reader_options(self.bootstrap).items():
            reader = reader.option(key, value)
        try:
            source = reader.load()
            if stage.transform is not None:
                output = stage.transform(source)
            else:
                assert stage.query is not None and stage.view is not None
                source.createOrReplaceTempView(stage.view)
                output = self.spark.sql(stage.query)
        except Exception as error:
            raise PipelineError(
                f"stage {stage.name!r}: {type(error).__name__}: {one_line(str(error))}"
            ) from None
        if not isinstance(output, DataFrame):
            raise PipelineError(
                f"stage {stage.name!r} returned {type(output).__name__}, not a DataFrame with a 'value' column"
            )
        if "value" not in output.columns:
            raise PipelineError(
                f"stage {stage.name!r}: its DataFrame has no 'value' column (it has {', '.join(output.columns)})"
            )
        return output

    def start(self, stage: Stage, *, once: bool) -> _Running:
        output = self.build(stage)
        checkpoint = stage_checkpoint(self.checkpoint_dir, self.pipeline, stage)
        writer = (
            output.writeStream.format(SOURCE_NAME)
            .queryName(self.pipeline.query_name(stage))
            .outputMode(stage.output_mode)
            .option("checkpointLocation", str(checkpoint))
        )
        for key, value in stage.writer_options(self.bootstrap, self.exactly_once).items():
            writer = writer.option(key, value)
        writer = (
            writer.trigger(availableNow=True)
            if once
            else writer.trigger(processingTime=stage.trigger or self.trigger)
        )
        status = StageStatus(self.pipeline, stage, checkpoint, stage.delivery(self.exactly_once))
        try:
            query = writer.start()
        except Exception as error:
            status.update(state="failed", error=one_line(str(error)))
            raise PipelineError(
                f"stage {stage.name!r}: {type(error).__name__}: {one_line(str(error))}"
            ) from None
        self.committer.track(query, StageIdentity(self.pipeline.name, stage.name, (stage.sink,)))
        status.update(state="running", id=str(query.id), runId=str(query.runId))
        running = _Running(stage, query, status)
        self._running.append(running)
        log.info("stage started", extra={"stage": stage.name, "query": self.pipeline.query_name(stage)})
        return running

    def run_once(self, stop: threading.Event | None = None) -> bool:
        """Each stage in turn to the end of what its sources hold, its offsets committed before
        the next starts. False if ``stop`` was set first (the current stage is stopped)."""
        stop = stop or threading.Event()
        for stage in self.stages:
            running = self.start(stage, once=True)
            while not self._ended(running):
                if stop.wait(0.25):
                    self._stop_all()
                    return False
                self._poll(running)
            self._finish(running)
            if not self.committer.wait_for(running.query, self.commit_timeout):
                raise PipelineError(
                    f"stage {stage.name!r}: its offsets were not committed within {self.commit_timeout:g} s"
                )
        return True

    def run(self, stop: threading.Event) -> None:
        """Every stage at once until ``stop`` is set; then stop them. If a stage fails, the
        others are stopped and PipelineError says why."""
        try:
            for stage in self.stages:
                self.start(stage, once=False)
            while not stop.wait(0.5):
                for running in list(self._running):
                    self._poll(running)
                    if self._ended(running):
                        self._finish(running)
                if not self._running:
                    return
        finally:
            self._stop_all()

    def _ended(self, running: _Running) -> bool:
        if running.query.isActive:
            return False
        self._poll(running)
        return True

    def _poll(self, running: _Running) -> None:
        """Record the batches finished since the last look; log a stage that finished none for
        STALL_LOG_S with its query's status (Spark's own words for where it is)."""
        now = time.monotonic()
        if now >= running.next_stall_log:
            running.next_stall_log = now + STALL_LOG_S
            with contextlib.suppress(Exception):  # the query may be going away meanwhile
                log.warning(
                    "stage finished no batch for a while",
                    extra={
                        "stage": running.stage.name,
                        "last_batch": running.last_batch,
                        "query_status": json.dumps(running.query.status, sort_keys=True),
                    },
                )
        for progress in running.query.recentProgress:
            # An idle trigger reports progress too (every 10 s), under the id of the batch
            # that has not run yet; only a batch that ran has added to its sink.
            if progress.batchId <= running.last_batch or "addBatch" not in (progress.durationMs or {}):
                continue
            running.last_batch = progress.batchId
            running.next_stall_log = time.monotonic() + STALL_LOG_S
            running.status.progress(progress)
            log.info(
                "batch done",
                extra={
                    "stage": running.stage.name,
                    "batch": progress.batchId,
                    "rows": progress.numInputRows,
                    "rows_per_second": round(_finite(progress.processedRowsPerSecond) or 0.0, 1),
                },
            )
            if self.on_progress is not None:
                self.on_progress(running.stage, running.status.data)

    def _finish(self, running: _Running) -> None:
        """Record how a query that is no longer active ended; raise if it failed."""
        self._running.remove(running)
        error = running.query.exception()
        if error is None:
            running.status.update(state="stopped")
            return
        message = one_line(str(error))
        if CheckpointMismatchError.__name__ in message:
            message += f" (the stage's checkpoint: {running.status.path.parent})"
        running.status.update(state="failed", error=message)
        raise PipelineError(f"stage {running.stage.name!r} failed: {message}")

    def _stop_all(self) -> None:
        for running in self._running:
            with contextlib.suppress(Exception):
                running.query.stop()
            self._poll(running)
            failed = running.query.exception()
            running.status.update(
                state="failed" if failed is not None else "stopped",
                error=one_line(str(failed)) if failed is not None else None,
            )
            self.committer.wait_for(running.query, self.commit_timeout)
        self._running.clear()


# -- status -------------------------------------------------------------------------------------


@dataclass
class StageReport:
    """A stage's state for ``strom pipeline status``: its status file and its group's lag."""

    stage: str
    query: str
    state: str
    sink: str
    group: str
    delivery: str = EXACTLY_ONCE
    pid: int | None = None
    batch: int | None = None
    rows: int | None = None
    rows_per_second: float | None = None
    updated: str | None = None
    error: str | None = None
    lag: dict[str, int | None] = field(default_factory=dict)  # source topic -> lag (None: unknown)
    lag_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def pipeline_status(
    pipeline: Pipeline,
    checkpoint_dir: Path,
    admin_config: Mapping[str, str],
) -> list[StageReport]:
    """Each stage's last known progress and its consumer group's lag per source topic: the sum
    over partitions of log end offset minus committed offset (minus log start offset where
    nothing is committed)."""
    reports: list[StageReport] = []
    unreachable: str | None = None  # after a timeout, the other stages do not wait for it again
    with AdminClient(dict(admin_config)) as admin:
        for stage in pipeline.stages:
            report = _report(pipeline, stage, stage_checkpoint(checkpoint_dir, pipeline, stage))
            strategy = parse_source_options(stage.reader_options("-"), streaming=True).strategy
            if isinstance(strategy, Subscribe):
                report.lag = dict.fromkeys(strategy.topics)
            elif isinstance(strategy, Assign):
                report.lag = dict.fromkeys(sorted({tp.topic for tp in strategy.partitions}))
            if unreachable is not None:
                report.lag_error = unreachable
            else:
                try:
                    report.lag = _lag(admin, stage, report.group)
                    _check_cluster(report, admin, stage_checkpoint(checkpoint_dir, pipeline, stage))
                except KafkaTimeoutError as error:
                    report.lag_error = unreachable = one_line(str(error))
                except KafkaException as error:
                    report.lag_error = one_line(str(error))
            reports.append(report)
    return reports


def _check_cluster(report: StageReport, admin: AdminClient, checkpoint: Path) -> None:
    """Say so when the stage's checkpoint belongs to another cluster: a run would refuse it."""
    taken_on = checkpoint_cluster_id(checkpoint)
    if taken_on is None or report.error is not None:
        return
    cluster_id = admin.describe_cluster().cluster_id
    if cluster_id and cluster_id != taken_on:
        report.error = (
            f"its checkpoint was taken on cluster {taken_on}, not on this one ({cluster_id}): a run would "
            f"refuse it; delete {checkpoint} (or use another --checkpoint-dir) to start over here"
        )


def _report(pipeline: Pipeline, stage: Stage, checkpoint: Path) -> StageReport:
    data = read_status_file(checkpoint / STATUS_FILE) or {}
    state = str(data.get("state") or ("not started" if not checkpoint.exists() else "stopped"))
    pid = data.get("pid")
    if state == "running" and isinstance(pid, int) and not _alive(pid, data.get("host")):
        state = "dead"  # the runner went away without recording it (killed)
    batch = data.get("batchId")
    if batch is None:
        batch = _last_committed_batch(checkpoint)
    return StageReport(
        stage=stage.name,
        query=pipeline.query_name(stage),
        state=state,
        sink=stage.sink,
        group=group_id(pipeline, stage),
        # As the last run wrote it; a stage never run shows what a run gives by default.
        delivery=str(data.get("delivery") or stage.delivery()),
        pid=pid if isinstance(pid, int) else None,
        batch=batch,
        rows=data.get("numInputRows"),
        rows_per_second=data.get("processedRowsPerSecond"),
        updated=data.get("updated"),
        error=data.get("error"),
    )


def _alive(pid: int, host: Any) -> bool:
    if host is not None and host != socket.gethostname():
        return True  # another machine's process: assume what the file says
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def checkpoint_cluster_id(checkpoint: Path) -> str | None:
    """The id of the cluster a query's checkpoint was taken on: what its latest planned batch's
    strom source offsets record (None if it has none, or no batch yet)."""
    offsets = checkpoint / "offsets"
    batches = [p for p in offsets.iterdir() if p.name.isdigit()] if offsets.is_dir() else []
    if not batches:
        return None
    latest = max(batches, key=lambda p: int(p.name))
    # Spark's offset log: a version line, the batch's metadata, then one line per source.
    for line in latest.read_text(errors="replace").splitlines()[2:]:
        with contextlib.suppress(ValueError, OffsetsFormatError):
            cluster = StreamOffset.from_json_dict(line).cluster_id
            if cluster is not None:
                return cluster
    return None


def _last_committed_batch(checkpoint: Path) -> int | None:
    """The last batch Spark's checkpoint records as committed (for stages run without a status file)."""
    commits = checkpoint / "commits"
    numbers = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(numbers) if numbers else None


def _lag(admin: AdminClient, stage: Stage, group: str) -> dict[str, int | None]:
    strategy = parse_source_options(stage.reader_options("-"), streaming=True).strategy
    existing = set(admin.list_topics())
    partitions: list[TopicPartition]
    if isinstance(strategy, Assign):
        topics = sorted({tp.topic for tp in strategy.partitions})
        partitions = [tp for tp in strategy.partitions if tp.topic in existing]
    else:
        if isinstance(strategy, Subscribe):
            topics = list(strategy.topics)
        else:
            assert isinstance(strategy, SubscribePattern)
            pattern = re.compile(strategy.pattern)
            topics = sorted(t for t in existing if pattern.fullmatch(t))
        present = [t for t in topics if t in existing]
        described = admin.describe_topics(present) if present else {}
        partitions = [TopicPartition(t, p.partition) for t in present for p in described[t].partitions]
    lag: dict[str, int | None] = {topic: None for topic in topics}
    if not partitions:
        return lag
    committed = admin.list_consumer_group_offsets(group)
    latest = admin.list_offsets(dict.fromkeys(partitions, OffsetSpec.latest()))
    uncommitted = [tp for tp in partitions if tp not in committed]
    earliest = admin.list_offsets(dict.fromkeys(uncommitted, OffsetSpec.earliest())) if uncommitted else {}
    for tp in partitions:
        start = committed[tp].offset if tp in committed else earliest[tp].offset
        lag[tp.topic] = (lag[tp.topic] or 0) + max(0, latest[tp].offset - start)
    return lag
