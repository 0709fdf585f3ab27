"""The pipelines page: each Spark pipeline as a graph of topics and stages, with every stage's
rows/s, lag and last batch, live.

A stage is the consumer group its finished micro-batches are committed to,
``strom-spark-<pipeline>.<stage>`` (``strom.spark.pipeline.group_id``). The committer puts the
batch's progress (``strom.protocol.pipeline_progress``) in the metadata of those offsets, so
OffsetFetch alone says what a stage reads, writes and how fast: the console needs no access
to Spark. Groups only ever committed to from outside (no protocol type) are looked at too,
since a stage may have its own ``kafka.group.id``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from strom.client.errors import KafkaException
from strom.console.app import console
from strom.console.formatting import duration, utc
from strom.console.graph import GraphStage, pipeline_graph, stage_order
from strom.console.lag_history import PartitionLag, groups_lag, total_lag
from strom.console.pages.groups import group_url
from strom.protocol.pipeline_progress import PipelineProgress

NAV: str | None = "Pipelines"
GROUP_PREFIX = "strom-spark-"
# A stage with lag whose last batch is older than this is shown as stalled.
STALLED_AFTER_MS = 60_000


@dataclass(frozen=True, slots=True)
class StageView:
    pipeline: str
    stage: str
    group_id: str
    partitions: list[PartitionLag]
    progress: PipelineProgress | None

    @property
    def sources(self) -> tuple[str, ...]:
        if self.progress is not None and self.progress.sources:
            return self.progress.sources
        return tuple(sorted({p.partition.topic for p in self.partitions}))

    @property
    def sinks(self) -> tuple[str, ...]:
        return self.progress.sinks if self.progress is not None else ()

    @property
    def lag(self) -> int:
        return total_lag(self.partitions)

    def age_ms(self, now_ms: int) -> int | None:
        return None if self.progress is None else max(0, now_ms - self.progress.batch_end_ms)

    def status(self, now_ms: int) -> str:
        """ok: caught up; active: lagging but batches are finishing; warning: lagging and stalled."""
        if self.lag == 0:
            return "ok"
        age = self.age_ms(now_ms)
        return "warning" if age is None or age > STALLED_AFTER_MS else "active"

    def lines(self, now_ms: int) -> tuple[str, ...]:
        if self.progress is None:
            return (f"lag {self.lag:,}", "no batch progress committed")
        return (
            f"{self.progress.processed_rows_per_second:,.1f} rows/s · batch {self.progress.batch_id}",
            f"lag {self.lag:,} · {self.progress.rows:,} rows in last batch",
            f"last batch {duration(self.age_ms(now_ms))} ago",
        )


def latest_progress(partitions: Sequence[PartitionLag]) -> PipelineProgress | None:
    """The newest batch's progress among the partitions' commit metadata."""
    found = [p for p in (PipelineProgress.from_metadata(q.metadata) for q in partitions) if p is not None]
    return max(found, key=lambda p: (p.batch_id, p.batch_end_ms), default=None)


def stage_of(group_id: str, partitions: list[PartitionLag]) -> StageView | None:
    progress = latest_progress(partitions)
    if progress is not None:
        return StageView(progress.pipeline, progress.stage, group_id, partitions, progress)
    name = group_id.removeprefix(GROUP_PREFIX)
    pipeline, dot, stage = name.partition(".")
    if name == group_id or not dot:
        return None  # neither named as a stage nor committing a stage's progress
    return StageView(pipeline, stage, group_id, partitions, None)


async def stages(request: Request) -> list[StageView]:
    state = console(request)
    listings = await state.admin.list_consumer_groups()
    candidates = [g.group_id for g in listings if g.group_id.startswith(GROUP_PREFIX) or not g.protocol_type]
    found = []
    for group_id, lag in (await groups_lag(state.admin, candidates)).items():
        if isinstance(lag, KafkaException):
            continue  # the group went away between the listing and the fetch
        view = stage_of(group_id, lag)
        if view is not None:
            found.append(view)
    return sorted(found, key=lambda s: (s.pipeline, s.stage))


async def show_pipelines(request: Request) -> Response:
    state = console(request)
    now = time.time_ns() // 1_000_000
    by_pipeline: dict[str, list[StageView]] = {}
    for view in await stages(request):
        by_pipeline.setdefault(view.pipeline, []).append(view)
    pipelines = []
    for name, views in sorted(by_pipeline.items()):
        nodes = [
            GraphStage(
                view.stage,
                view.sources,
                view.sinks,
                view.lines(now),
                view.status(now),
                f"stage {view.stage} (group {view.group_id})",
            )
            for view in views
        ]
        graph = pipeline_graph(nodes, label=f"pipeline {name}")
        order = {stage: i for i, stage in enumerate(stage_order(nodes))}
        views.sort(key=lambda v: order[v.stage])
        rows = [
            {
                "view": view,
                "url": group_url(view.group_id),
                "status": view.status(now),
                "age": duration(view.age_ms(now)),
                "ended": utc(view.progress.batch_end_ms) if view.progress else "—",
                "batch_duration": duration(view.progress.batch_duration_ms) if view.progress else "—",
            }
            for view in views
        ]
        pipelines.append(
            {
                "name": name,
                "graph": graph,
                "rows": rows,
                "lag": sum(v.lag for v in views),
                "stages": len(views),
            }
        )
    template = (
        "pipelines/_pipelines.html" if request.headers.get("x-fragment") == "1" else "pipelines/index.html"
    )
    return state.render(request, template, pipelines=pipelines)


routes: list[BaseRoute] = [Route("/pipelines", show_pipelines, name="pipelines")]
