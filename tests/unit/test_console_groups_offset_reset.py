"""Reset-offsets planning (AsyncAdminClient.plan_offset_reset, with the console's modes from
``strom.console.offset_reset``) against an admin client whose lookups are stood in for: each mode,
clamping into the log, and the plan's round trip through the form."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

import pytest

from strom.client.admin import (
    AsyncAdminClient,
    ListOffsetsResult,
    OffsetReset,
    OffsetResetError,
    OffsetSpec,
    PartitionInfo,
    PlannedOffset,
    TopicDescription,
)
from strom.client.admin.types import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from strom.client.cluster import TopicPartition
from strom.client.consumer import OffsetAndMetadata
from strom.console.offset_reset import (
    check_inactive,
    decode_plan,
    encode_plan,
    parse_value,
    plan_reset,
)

P0, P1 = TopicPartition("orders", 0), TopicPartition("orders", 1)


class FakeAdmin(AsyncAdminClient):
    """orders: partition 0 holds offsets 10..100, partition 1 holds 0..50; a record per ms from
    1000 (offset 10) on partition 0, none that late on partition 1. Nothing is sent anywhere."""

    def __init__(self, committed: Mapping[TopicPartition, int]) -> None:
        super().__init__({"bootstrap.servers": "unused:9092"})
        self.committed = committed

    async def list_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None, *, timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        return {tp: OffsetAndMetadata(o) for tp, o in self.committed.items()}

    async def describe_topics(
        self, names: Sequence[str], *, timeout: float | None = None
    ) -> dict[str, TopicDescription]:
        partitions = [PartitionInfo(p, 0, (0,), (0,), ()) for p in (0, 1)]
        return {n: TopicDescription(n, None, False, partitions) for n in names}

    async def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: str = "read_uncommitted",
        timeout: float | None = None,
    ) -> dict[TopicPartition, ListOffsetsResult]:
        bounds = {P0: (10, 100), P1: (0, 50)}

        def find(tp: TopicPartition, spec: OffsetSpec) -> int:
            start, end = bounds[tp]
            if spec.timestamp == EARLIEST_TIMESTAMP:
                return start
            if spec.timestamp == LATEST_TIMESTAMP:
                return end
            if tp == P1:
                return -1
            return min(end, 10 + max(0, spec.timestamp - 1000))

        return {tp: ListOffsetsResult(find(tp, spec), -1, None) for tp, spec in specs.items()}


def plan(
    mode: str, value: str = "", committed: Mapping[TopicPartition, int] | None = None, **kw: object
) -> list[PlannedOffset]:
    async def run() -> list[PlannedOffset]:
        admin = FakeAdmin({P0: 40, P1: 20} if committed is None else committed)
        return await plan_reset(admin, "g", mode, parse_value(mode, value), **kw)  # type: ignore[arg-type]

    return asyncio.run(run())


def news(planned: list[PlannedOffset]) -> dict[TopicPartition, int]:
    return {p.partition: p.new for p in planned}


def test_each_mode() -> None:
    assert news(plan("to-earliest")) == {P0: 10, P1: 0}
    assert news(plan("to-latest")) == {P0: 100, P1: 50}
    assert news(plan("to-current")) == {P0: 40, P1: 20}
    assert news(plan("to-offset", "30")) == {P0: 30, P1: 30}
    assert news(plan("shift-by", "-5")) == {P0: 35, P1: 15}
    # A time past partition 1's last record lands on its log end, as Kafka's tool does.
    assert news(plan("to-datetime", "1970-01-01T00:00:01.030Z")) == {P0: 40, P1: 50}
    assert news(plan("by-duration", "PT1S", now_ms=2050)) == {P0: 60, P1: 50}
    shown = plan("to-earliest")[0]
    assert (shown.current, shown.log_start, shown.log_end) == (40, 10, 100)


def test_offsets_are_clamped_into_the_log() -> None:
    assert news(plan("to-offset", "5")) == {P0: 10, P1: 5}
    assert news(plan("shift-by", "+1000")) == {P0: 100, P1: 50}


def test_given_offsets_are_clamped_but_a_committed_one_is_kept_as_kafka_does() -> None:
    async def run() -> tuple[list[PlannedOffset], list[PlannedOffset]]:
        admin = FakeAdmin({P0: 5})  # below partition 0's log start
        given = await admin.plan_offset_reset("g", OffsetReset.to_offsets({P1: 70}))
        return given, await admin.plan_offset_reset("g", OffsetReset.current())

    given, current = asyncio.run(run())
    assert news(given) == {P1: 50}
    assert news(current) == {P0: 5}


def test_a_topic_takes_all_its_partitions_and_to_current_falls_back_to_the_end() -> None:
    planned = plan("to-current", committed={P0: 40}, topics=["orders"])
    assert news(planned) == {P0: 40, P1: 50}
    assert planned[1].current is None


def test_refusals() -> None:
    with pytest.raises(
        OffsetResetError, match="cannot shift the offset of orders-1: the group has no committed offset"
    ):
        plan("shift-by", "1", committed={P0: 40}, topics=["orders"])
    with pytest.raises(OffsetResetError, match="no committed offsets to reset"):
        plan("to-earliest", committed={})
    with pytest.raises(OffsetResetError, match="--to-offset needs a value"):
        parse_value("to-offset", " ")
    with pytest.raises(OffsetResetError, match="--shift-by: expected"):
        parse_value("shift-by", "ten")
    with pytest.raises(OffsetResetError, match="--by-duration: expected a duration"):
        parse_value("by-duration", "30 minutes")
    with pytest.raises(OffsetResetError, match="unknown mode"):
        parse_value("to-somewhere", "")


def test_the_plan_round_trips_through_the_form() -> None:
    planned = plan("shift-by", "-1")
    assert encode_plan(planned) == ["orders:0:39", "orders:1:19"]
    assert decode_plan(encode_plan(planned)) == {P0: 39, P1: 19}
    with pytest.raises(OffsetResetError, match="not a planned offset"):
        decode_plan(["orders:zero:1"])
    with pytest.raises(OffsetResetError, match="empty"):
        decode_plan([])


def test_only_an_inactive_group_may_be_reset() -> None:
    check_inactive("g", "Empty", 0)
    check_inactive("g", None, 0)
    with pytest.raises(OffsetResetError, match="group 'g' is Stable with 2 active member"):
        check_inactive("g", "Stable", 2)
