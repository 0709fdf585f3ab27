"""A pipeline stage's progress travels with its committed offsets: after one short availableNow
run, the stage group's offset metadata reads back as the batch's PipelineProgress (what the
console reads with OffsetFetch), and the broker's /metrics shows the stage's rows/s, batch
duration and lag, labelled with the pipeline and the stage."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerproc import HOST, BrokerProcess, free_port
from spark.spark_util import create_topic, produce
from strom.client import AdminClient, TopicPartition
from strom.protocol.pipeline_progress import PipelineProgress
from strom.spark import pipeline as pipeline_module
from strom.spark.pipeline import Pipeline, PipelineRunner, group_id

METRICS_PORT = free_port()
BROKER_CONFIG = {
    "metrics.listener": f"http://{HOST}:{METRICS_PORT}",
    "metrics.lag.sample.interval.ms": "200",
}
SOURCE, SINK, RECORDS = "progress-clicks", "progress-shouted", 30


def stage_metrics(pipeline: str, stage: str) -> dict[str, float]:
    """The /metrics samples labelled with this stage, by name (group metrics by name and topic)."""
    response = httpx.get(f"http://{HOST}:{METRICS_PORT}/metrics", timeout=10)
    response.raise_for_status()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("pipeline") == pipeline and labels.get("stage") == stage and "status" not in labels:
                found[sample.name + (f"/{labels['topic']}" if "topic" in labels else "")] = sample.value
    return found


def test_a_stage_commits_its_progress_and_the_broker_exports_it(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, SOURCE, 1)
    create_topic(broker.bootstrap, SINK, 1)
    produce(broker.bootstrap, SOURCE, RECORDS)
    pipeline = Pipeline("progress")

    @pipeline.stage(source=SOURCE, sink=SINK)
    def shout(clicks: DataFrame) -> DataFrame:
        return clicks.select(F.upper(F.col("value").cast("string")).alias("value"))

    started_ms = time.time_ns() // 1_000_000
    runner = PipelineRunner(pipeline, spark, bootstrap=broker.bootstrap, checkpoint_dir=tmp_path)
    assert runner.run_once()
    ended_ms = time.time_ns() // 1_000_000

    group = group_id(pipeline, pipeline.stages[0])
    assert group == "strom-spark-progress.shout"
    with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
        committed = admin.list_consumer_group_offsets(group)[TopicPartition(SOURCE, 0)]
    assert committed.offset == RECORDS
    progress = PipelineProgress.from_metadata(committed.metadata)
    assert progress is not None, committed.metadata
    assert (progress.pipeline, progress.stage) == ("progress", "shout")
    assert (progress.sources, progress.sinks) == ((SOURCE,), (SINK,))
    assert progress.rows == RECORDS  # availableNow with no trigger limit: one batch
    assert progress.processed_rows_per_second > 0 and progress.batch_duration_ms > 0
    assert started_ms <= progress.batch_end_ms <= ended_ms + 1000

    deadline = time.monotonic() + 30
    while "strom_pipeline_stage_rows_per_second" not in (found := stage_metrics("progress", "shout")):
        assert time.monotonic() < deadline, f"no stage metrics within 30 s: {found}"
        time.sleep(0.2)
    assert found["strom_pipeline_stage_rows_per_second"] == progress.processed_rows_per_second
    assert found["strom_pipeline_stage_batch_duration_seconds"] == progress.batch_duration_ms / 1000
    assert found["strom_pipeline_stage_last_batch_timestamp_seconds"] == progress.batch_end_ms / 1000
    assert found["strom_pipeline_stage_batch_rows"] == RECORDS
    assert found[f"kafka_consumergroup_group_offset/{SOURCE}"] == RECORDS
    assert found[f"kafka_consumergroup_group_lag/{SOURCE}"] == 0
    assert found["kafka_consumergroup_group_sum_lag"] == 0


def test_a_stage_that_finishes_no_batch_is_logged_with_its_query_status(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running stage whose source stays empty finishes no batch: after STALL_LOG_S the runner
    says so, with Spark's status of the query (here: no data), instead of staying silent."""
    monkeypatch.setattr(pipeline_module, "STALL_LOG_S", 0.5)
    create_topic(broker.bootstrap, "stall-in", 1)
    create_topic(broker.bootstrap, "stall-out", 1)
    pipeline = Pipeline("stall")

    @pipeline.stage(source="stall-in", sink="stall-out")
    def copy(rows: DataFrame) -> DataFrame:
        return rows.select("value")

    stop = threading.Event()
    stalled: list[logging.LogRecord] = []

    class StallHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "stage finished no batch for a while":
                stalled.append(record)
                stop.set()

    handler = StallHandler()
    logger = logging.getLogger("strom.pipeline")
    logger.addHandler(handler)
    give_up = threading.Timer(60, stop.set)
    give_up.start()
    try:
        # In this thread, as `strom pipeline run` does; the first stall warning stops the run.
        runner = PipelineRunner(pipeline, spark, bootstrap=broker.bootstrap, checkpoint_dir=tmp_path, trigger="200 milliseconds")
        runner.run(stop)
    finally:
        give_up.cancel()
        logger.removeHandler(handler)
    assert stalled, "no stall warning within 60 s"
    record = stalled[0]
    fields = record.__dict__  # the record's structured fields
    assert (record.levelno, fields["stage"], fields["last_batch"]) == (logging.WARNING, "copy", -1)
    status = json.loads(fields["query_status"])
    assert set(status) == {"message", "isDataAvailable", "isTriggerActive"}
    assert status["isDataAvailable"] is False
