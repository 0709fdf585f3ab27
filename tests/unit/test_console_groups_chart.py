"""The lag chart (``strom.console.chart``) and the sampler's bounded history (``strom.console.lag_history``)."""

from __future__ import annotations

import asyncio
import re

from strom.client.admin import ListOffsetsResult
from strom.client.cluster import TopicPartition
from strom.client.consumer import OffsetAndMetadata
from strom.console.chart import compact, lag_chart, nice_ceiling
from strom.console.lag_history import LagSampler, Sample, partition_lags, total_lag


def test_axis_tops_and_labels() -> None:
    assert [nice_ceiling(v) for v in (0, 3, 7, 12, 2600, 3000)] == [1.0, 5.0, 10.0, 20.0, 5000.0, 5000.0]
    assert [compact(v) for v in (0, 250, 1250, 2_500_000, 0.5)] == ["0", "250", "1.25k", "2.5M", "0.5"]


def test_the_chart_draws_the_samples_inside_its_box() -> None:
    assert "collecting samples" in lag_chart([Sample(100.0, 5)])
    svg = lag_chart([Sample(100.0, 3000), Sample(102.0, 1500), Sample(104.0, 0)], width=400, height=200)
    points = re.search(r'<polyline class="line" points="([^"]+)"', svg)
    assert points is not None
    xy = [tuple(map(float, p.split(","))) for p in points.group(1).split()]
    assert [x for x, _ in xy] == sorted(x for x, _ in xy)
    assert xy[-1][1] == 174.0  # lag 0 sits on the x axis (height - bottom margin)
    assert xy[0][1] > 12.0  # 3000 is below the top of 5k
    assert ">5k<" in svg and "UTC" in svg


def test_partition_lags_cover_committed_and_assigned_partitions() -> None:
    a, b, gone = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("old", 0)
    lags = partition_lags({a: OffsetAndMetadata(5, "m"), gone: OffsetAndMetadata(1)}, {a: 9, b: 4}, [b])
    assert [(p.partition, p.lag) for p in lags] == [(gone, None), (a, 4), (b, None)]
    assert lags[1].metadata == "m"
    assert total_lag(lags) == 4


class CountingAdmin:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def list_consumer_group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        self.asked.append(group_id)
        return {TopicPartition("t", 0): OffsetAndMetadata(len(self.asked))}

    async def list_topics(self, include_internal: bool = False) -> list[str]:
        return ["t"]

    async def list_offsets(
        self, specs: dict[TopicPartition, object]
    ) -> dict[TopicPartition, ListOffsetsResult]:
        return {tp: ListOffsetsResult(100, -1, None) for tp in specs}


def test_the_sampler_keeps_a_bounded_history_of_the_groups_viewed_last() -> None:
    async def run() -> None:
        admin = CountingAdmin()
        sampler = LagSampler(admin, interval=3600, capacity=3, max_groups=2)  # type: ignore[arg-type]
        assert sampler.view("a") == []
        sampler.view("b")
        sampler.view("c")  # "a" was viewed longest ago: dropped
        for _ in range(5):
            await sampler.sample_once()
        history = sampler.view("c")
        assert len(history) == 3
        assert "a" not in {g for g in admin.asked[2:]}
        assert all(s.lag < 100 for s in history)
        await sampler.close()

    asyncio.run(run())
