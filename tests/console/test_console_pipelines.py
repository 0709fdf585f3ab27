"""The console's pipelines page in a real browser while ``strom pipeline run`` runs a two-stage
pipeline (a Spark process of its own): the graph shows the stages and their topics, and a
stage's batch, rows/s and last batch change live as more records arrive."""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from brokerproc import STROM
from strom.client import AdminClient, NewTopic, Producer

Screenshot = Callable[[Page, str], Path]
# Spark starts in a few seconds on an idle machine; a shared one may take far longer.
SPARK_TIMEOUT = 180_000  # ms
TIMEOUT = 60_000  # ms
BROKER_CONFIG = {
    # Fewer internal partitions: faster coordinator loading for the stages' transactions and commits.
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.num.partitions": "3",
}

PIPELINE = """
from pyspark.sql import functions as F
from strom.spark.pipeline import Pipeline

pipeline = Pipeline("shop")


@pipeline.stage(source="clicks", sink="clicks.upper")
def upper(clicks):
    return clicks.select(F.upper(F.col("value").cast("string")).alias("value"))


@pipeline.stage(source="clicks.upper", sink="clicks.short")
def short(upper):
    return upper.select(F.substring(F.col("value").cast("string"), 1, 5).alias("value"))
"""


def produce(bootstrap: str, start: int, count: int) -> None:
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
        for i in range(start, start + count):
            producer.send("clicks", f"click {i}".encode())
        producer.flush()


@pytest.fixture(scope="module")
def pipeline_run(
    bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    """``strom pipeline run`` of the shop pipeline, until the module ends."""
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, 2, 1) for name in ("clicks", "clicks.upper", "clicks.short")])
    folder = tmp_path_factory.mktemp("pipeline")
    path = folder / "shop.py"
    path.write_text(PIPELINE)
    log = (folder / "run.log").open("wb")
    process = subprocess.Popen(
        [
            str(STROM),
            "pipeline",
            "run",
            str(path),
            "--bootstrap-server",
            bootstrap,
            "--checkpoint-dir",
            str(folder / "checkpoints"),
            "--trigger",
            "500 milliseconds",
            "--conf",
            "spark.ui.enabled=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


def test_the_graph_updates_live_while_the_pipeline_runs(
    page: Page, console: str, bootstrap: str, pipeline_run: subprocess.Popen[bytes], screenshot: Screenshot
) -> None:
    produce(bootstrap, 0, 200)
    page.goto(f"{console}/pipelines")
    section = page.locator("section.pipeline[data-pipeline='shop']")
    upper = section.locator("table.stages tr[data-stage='upper']")
    # Each stage's first batch commits its progress: both stages, and the topics between them.
    expect(upper.locator("td.batch")).to_have_text(re.compile(r"^\d+$"), timeout=SPARK_TIMEOUT)
    expect(section.locator("tr[data-stage='short'] td.batch")).to_have_text(
        re.compile(r"^\d+$"), timeout=TIMEOUT
    )
    assert pipeline_run.poll() is None
    graph = section.locator("svg.graph")
    for topic in ("clicks", "clicks.upper", "clicks.short"):
        expect(graph.locator(f"g.topic[data-topic='{topic}']")).to_have_count(1)
    for stage in ("upper", "short"):
        expect(graph.locator(f"g.stage[data-stage='{stage}']")).to_have_count(1)
    expect(graph.locator("path.edge")).to_have_count(4)  # clicks→upper→clicks.upper→short→clicks.short
    expect(upper.locator("td.lag")).to_have_text("0", timeout=TIMEOUT)
    expect(upper).to_contain_text("clicks.upper")  # its sink, from the progress in its commits
    first_batch = upper.locator("td.batch").inner_text()
    first_metric = graph.locator("g.stage[data-stage='upper'] text[data-line='0']").text_content() or ""
    assert "rows/s" in first_metric

    # More records: the same page (no reload) shows a later batch of the stage.
    produce(bootstrap, 200, 300)
    expect(upper.locator("td.batch")).not_to_have_text(first_batch, timeout=TIMEOUT)
    expect(upper.locator("td.lag")).to_have_text("0", timeout=TIMEOUT)
    expect(graph.locator("g.stage[data-stage='upper'] text[data-line='0']")).not_to_have_text(first_metric)
    expect(section.locator("tr[data-stage='short'] td.lag")).to_have_text("0", timeout=TIMEOUT)
    assert int(upper.locator("td.batch").inner_text()) > int(first_batch)
    screenshot(page, "pipelines")
