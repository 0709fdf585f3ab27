"""The pipelines page's reading of consumer groups as stages (``strom.console.pages.pipelines``):
names and topics from the committed progress, or from the group id when there is none."""

from __future__ import annotations

from strom.client.cluster import TopicPartition
from strom.console.lag_history import PartitionLag
from strom.console.pages.pipelines import StageView, latest_progress, stage_of
from strom.protocol.pipeline_progress import PipelineProgress


def progress(batch_id: int, end_ms: int = 10_000) -> PipelineProgress:
    return PipelineProgress(
        "shop", "upper", batch_id, 30, 12.5, 25.0, 800, end_ms, ("clicks",), ("clicks.upper",)
    )


def lag(partition: int, committed: int, end: int, metadata: str = "") -> PartitionLag:
    return PartitionLag(TopicPartition("clicks", partition), committed, end, metadata)


def test_the_newest_batch_s_progress_names_the_stage_and_its_topics() -> None:
    partitions = [lag(0, 5, 5, progress(3).to_metadata()), lag(1, 7, 9, progress(4).to_metadata())]
    assert latest_progress(partitions) == progress(4)
    view = stage_of("my-own-group", partitions)
    assert view is not None
    assert (view.pipeline, view.stage, view.sources, view.sinks, view.lag) == (
        "shop",
        "upper",
        ("clicks",),
        ("clicks.upper",),
        2,
    )
    assert view.status(now_ms=20_000) == "active"
    assert view.status(now_ms=10_000 + 61_000) == "warning"  # lagging, and no batch for a minute
    assert view.lines(now_ms=12_000) == (
        "25.0 rows/s · batch 4",
        "lag 2 · 30 rows in last batch",
        "last batch 2.0 s ago",
    )


def test_without_progress_the_group_id_names_the_stage() -> None:
    view = stage_of("strom-spark-weblog.parse", [lag(0, 3, 3, "someone else's text")])
    assert view == StageView(
        "weblog", "parse", "strom-spark-weblog.parse", [lag(0, 3, 3, "someone else's text")], None
    )
    assert view.sources == ("clicks",) and view.sinks == () and view.status(0) == "ok"
    assert stage_of("billing", [lag(0, 1, 2)]) is None
    assert stage_of("strom-spark-no-stage", [lag(0, 1, 2)]) is None
