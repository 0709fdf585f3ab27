"""The group coordinator's rules that need a clock: offsets.retention.minutes and retention_time expiry.

The coordinator runs on a fake clock with a manager that records what it would write, so
days of retention pass in a test. The rules are Kafka 4.1's (ClassicGroup.offsetExpirationCondition,
OffsetExpirationConditionImpl and OffsetMetadataManager.cleanupExpiredOffsets):
- a standalone group (no protocol type) expires each offset `retention` after its commit;
- an Empty group expires its offsets `retention` after it became Empty, whatever their commit time;
- a Stable consumer group expires only offsets of topics no member subscribes to, `retention` after commit;
- any other group (rebalancing, or not the consumer protocol while it has members) expires nothing;
- an explicit expire timestamp (OffsetCommit v2-v4's retention_time) replaces the retention rule, under
  the same conditions;
- a group left Empty without offsets is deleted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
from typing import Any

from strom.broker.coordinator.group import GroupState, OffsetAndMetadata
from strom.broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator, JoinRequest
from strom.broker.coordinator.group_metadata_manager import AppendOutcome
from strom.broker.coordinator.loader import CoordinatorLoader
from strom.broker.partition import TopicPartition
from strom.protocol.errors import ErrorCode

RETENTION_MS = 7 * 24 * 3600 * 1000
HOUR = 3600 * 1000
T0 = 1_700_000_000_000
SUBSCRIBED, OTHER = TopicPartition("subscribed", 0), TopicPartition("other", 0)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class RecordingManager:
    """Stands in for GroupMetadataManager: every write succeeds and is remembered."""

    def __init__(self) -> None:
        self.deleted_offsets: list[tuple[str, list[TopicPartition]]] = []
        self.deleted_groups: list[str] = []
        self.loader = CoordinatorLoader()

    def load(self) -> dict[str, Any]:
        return {}

    async def load_partition(self, partition: int, is_current: Any) -> dict[str, Any] | None:
        return {} if is_current() else None

    def partition_of(self, group_id: str) -> TopicPartition:
        return TopicPartition("__consumer_offsets", 0)

    async def store_group(self, group: Any) -> AppendOutcome:
        return AppendOutcome(ErrorCode.none)

    async def store_offsets(self, group_id: str, offsets: Any) -> AppendOutcome:
        return AppendOutcome(ErrorCode.none)

    async def delete_offsets(self, group_id: str, tps: Any) -> AppendOutcome:
        tps = list(tps)
        if tps:
            self.deleted_offsets.append((group_id, tps))
        return AppendOutcome(ErrorCode.none)

    async def delete_group(self, group: Any) -> AppendOutcome:
        self.deleted_groups.append(group.group_id)
        return AppendOutcome(ErrorCode.none)


def make_coordinator() -> tuple[GroupCoordinator, Clock, RecordingManager]:
    clock, manager = Clock(), RecordingManager()
    config = GroupConfig(
        min_session_timeout_ms=1000,
        max_session_timeout_ms=RETENTION_MS,
        initial_rebalance_delay_ms=0,
        max_size=100,
        offsets_retention_ms=RETENTION_MS,
        offset_metadata_max_bytes=4096,
    )
    coordinator = GroupCoordinator(config, manager, lambda: None, time_ms=clock)  # type: ignore[arg-type]
    return coordinator, clock, manager


async def commit(
    coordinator: GroupCoordinator,
    group: str,
    clock: Clock,
    tps: list[TopicPartition],
    *,
    generation: int = -1,
    member: str = "",
    expire_after_ms: int | None = None,
) -> None:
    expire = clock.now + expire_after_ms if expire_after_ms is not None else -1
    offsets = {tp: OffsetAndMetadata(10, -1, "", clock.now, expire) for tp in tps}
    errors = await coordinator.commit_offsets(group, generation, member, None, offsets, 8)
    assert set(errors.values()) == {ErrorCode.none}, errors


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


def first_join(group: str) -> JoinRequest:
    """A new consumer's JoinGroup subscribed to SUBSCRIBED's topic; its session never expires
    while the fake clock runs."""
    return JoinRequest(
        group_id=group,
        member_id="",
        group_instance_id=None,
        client_id="c",
        client_host="/127.0.0.1",
        session_timeout_ms=RETENTION_MS,
        rebalance_timeout_ms=1000,
        protocol_type="consumer",
        protocols=[("range", subscription(SUBSCRIBED.topic))],
        require_known_member_id=False,
        supports_skip_assignment=True,
    )


async def stable_member(
    coordinator: GroupCoordinator, group: str, protocol_type: str = "consumer"
) -> tuple[str, int]:
    """A one-member Stable group subscribed to SUBSCRIBED's topic; (member id, generation)."""
    coordinator.startup()
    joined = await coordinator.join_group(dataclasses.replace(first_join(group), protocol_type=protocol_type))
    assert joined.error == ErrorCode.none
    synced = await coordinator.sync_group(
        group, joined.generation_id, joined.member_id, None, None, None, {joined.member_id: b""}
    )
    assert synced.error == ErrorCode.none
    return joined.member_id, joined.generation_id


def remaining(coordinator: GroupCoordinator, group: str) -> set[TopicPartition]:
    return set(coordinator.fetch_offsets(group, None))


def test_standalone_offsets_expire_one_retention_after_their_own_commit() -> None:
    async def scenario() -> None:
        coordinator, clock, manager = make_coordinator()
        await commit(coordinator, "solo", clock, [SUBSCRIBED])
        clock.now += 2 * HOUR
        await commit(coordinator, "solo", clock, [OTHER])
        clock.now = T0 + RETENTION_MS - 1
        assert await coordinator.expire_offsets() == 0
        clock.now = T0 + RETENTION_MS
        assert await coordinator.expire_offsets() == 1
        assert remaining(coordinator, "solo") == {OTHER}
        clock.now = T0 + 2 * HOUR + RETENTION_MS
        assert await coordinator.expire_offsets() == 1
        assert manager.deleted_offsets == [("solo", [SUBSCRIBED]), ("solo", [OTHER])]
        # Nothing left: the group itself goes.
        assert coordinator.group("solo") is None

    asyncio.run(scenario())


def test_an_empty_group_expires_its_offsets_one_retention_after_it_became_empty() -> None:
    async def scenario() -> None:
        coordinator, clock, manager = make_coordinator()
        member, generation = await stable_member(coordinator, "g")
        await commit(coordinator, "g", clock, [SUBSCRIBED, OTHER], generation=generation, member=member)
        clock.now += 3 * HOUR  # the member keeps consuming; it leaves three hours after its last commit
        await coordinator.leave_group("g", [(member, None)])
        await asyncio.sleep(0.01)  # the rebalance that empties the group
        group = coordinator.group("g")
        assert group is not None and group.state.value == "Empty"
        emptied_at = clock.now
        clock.now = T0 + RETENTION_MS  # a retention after the commits, not after the group emptied
        assert await coordinator.expire_offsets() == 0
        clock.now = emptied_at + RETENTION_MS
        assert await coordinator.expire_offsets() == 2
        assert remaining(coordinator, "g") == set()
        assert manager.deleted_groups == ["g"]
        assert coordinator.group("g") is None
        coordinator.shutdown()

    asyncio.run(scenario())


def test_a_stable_consumer_group_expires_only_offsets_of_topics_it_does_not_subscribe_to() -> None:
    async def scenario() -> None:
        coordinator, clock, manager = make_coordinator()
        member, generation = await stable_member(coordinator, "g")
        await commit(coordinator, "g", clock, [SUBSCRIBED, OTHER], generation=generation, member=member)
        clock.now += 10 * RETENTION_MS
        assert await coordinator.expire_offsets() == 1
        assert remaining(coordinator, "g") == {SUBSCRIBED}
        assert manager.deleted_groups == []
        coordinator.shutdown()

    asyncio.run(scenario())


def test_a_group_of_another_protocol_with_members_expires_nothing() -> None:
    async def scenario() -> None:
        coordinator, clock, _ = make_coordinator()
        member, generation = await stable_member(coordinator, "connect-group", protocol_type="connect")
        await commit(
            coordinator, "connect-group", clock, [SUBSCRIBED, OTHER], generation=generation, member=member
        )
        clock.now += 10 * RETENTION_MS
        assert await coordinator.expire_offsets() == 0
        coordinator.shutdown()

    asyncio.run(scenario())


def test_an_explicit_retention_time_replaces_the_retention_rule() -> None:
    async def scenario() -> None:
        coordinator, clock, _ = make_coordinator()
        await commit(coordinator, "solo", clock, [SUBSCRIBED], expire_after_ms=1000)
        await commit(coordinator, "solo", clock, [OTHER], expire_after_ms=RETENTION_MS * 2)
        clock.now += 999
        assert await coordinator.expire_offsets() == 0
        clock.now += 1
        assert await coordinator.expire_offsets() == 1
        # Longer than offsets.retention.minutes: the explicit time still decides.
        clock.now = T0 + RETENTION_MS + HOUR
        assert await coordinator.expire_offsets() == 0
        clock.now = T0 + 2 * RETENTION_MS
        assert await coordinator.expire_offsets() == 1

    asyncio.run(scenario())


def test_an_explicit_retention_time_does_not_expire_a_subscribed_topic_of_a_stable_group() -> None:
    # cleanupExpiredOffsets only looks at topics the group is not subscribed to, whatever the expiry.
    async def scenario() -> None:
        coordinator, clock, _ = make_coordinator()
        member, generation = await stable_member(coordinator, "g")
        await commit(
            coordinator,
            "g",
            clock,
            [SUBSCRIBED, OTHER],
            generation=generation,
            member=member,
            expire_after_ms=1000,
        )
        clock.now += 2000
        assert await coordinator.expire_offsets() == 1
        assert remaining(coordinator, "g") == {SUBSCRIBED}
        coordinator.shutdown()

    asyncio.run(scenario())


class GatedManager(RecordingManager):
    """Every write waits until the test releases it (as a write waits for the ISR in a cluster),
    then ends with the error the test gives."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, asyncio.Future[ErrorCode]]] = []

    def load(self, partitions: Any = None) -> dict[str, Any]:
        return {}

    async def _write(self, kind: str) -> AppendOutcome:
        gate: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
        self.writes.append((kind, gate))
        return AppendOutcome(await gate)

    async def store_group(self, group: Any) -> AppendOutcome:
        return await self._write("group")

    async def store_offsets(self, group_id: str, offsets: Any) -> AppendOutcome:
        return await self._write(f"offsets {next(iter(offsets.values())).offset}")


def gated_coordinator() -> tuple[GroupCoordinator, Clock, GatedManager]:
    coordinator, clock, _ = make_coordinator()
    manager = GatedManager()
    coordinator._manager = manager  # type: ignore[assignment]
    return coordinator, clock, manager


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_commit_takes_effect_once_written_and_commits_of_a_group_apply_in_order() -> None:
    async def scenario() -> None:
        coordinator, clock, manager = gated_coordinator()
        coordinator.startup()

        def committing(offset: int) -> asyncio.Task[dict[TopicPartition, ErrorCode]]:
            offsets = {SUBSCRIBED: OffsetAndMetadata(offset, -1, "", clock.now)}
            return asyncio.ensure_future(coordinator.commit_offsets("solo", -1, "", None, offsets, 8))

        first, second = committing(10), committing(20)
        await settle()
        # The second write waits for the first: one write of a group at a time.
        assert [kind for kind, _ in manager.writes] == ["offsets 10"]
        assert coordinator.fetch_offsets("solo", [SUBSCRIBED]) == {SUBSCRIBED: None}
        manager.writes[0][1].set_result(ErrorCode.none)
        await settle()
        assert await first == {SUBSCRIBED: ErrorCode.none}
        assert [kind for kind, _ in manager.writes] == ["offsets 10", "offsets 20"]
        assert coordinator.fetch_offsets("solo", [SUBSCRIBED])[SUBSCRIBED].offset == 10  # type: ignore[union-attr]
        # A failed write changes nothing in memory.
        manager.writes[1][1].set_result(ErrorCode.coordinator_not_available)
        assert await second == {SUBSCRIBED: ErrorCode.coordinator_not_available}
        assert coordinator.fetch_offsets("solo", [SUBSCRIBED])[SUBSCRIBED].offset == 10  # type: ignore[union-attr]
        coordinator.shutdown()

    asyncio.run(scenario())


def test_unloading_a_group_answers_its_waiting_requests_not_coordinator() -> None:
    async def scenario() -> None:
        coordinator, _, manager = gated_coordinator()
        coordinator._follows_leadership = True
        coordinator.startup()
        offsets_tp = TopicPartition("__consumer_offsets", 0)
        coordinator.on_become_leader(offsets_tp, 0)
        await settle()  # the (empty) partition loads
        joined = await coordinator.join_group(first_join("g"))
        syncing = asyncio.ensure_future(
            coordinator.sync_group(
                "g", joined.generation_id, joined.member_id, None, None, None, {joined.member_id: b"a"}
            )
        )
        committing = asyncio.ensure_future(
            coordinator.commit_offsets(
                "g", joined.generation_id, joined.member_id, None, {OTHER: OffsetAndMetadata(5, -1, "", 0)}, 8
            )
        )
        await settle()
        assert [kind for kind, _ in manager.writes] == ["group"]  # the assignment waits for the ISR
        coordinator.on_become_follower(offsets_tp)
        manager.writes[0][1].set_result(ErrorCode.not_coordinator)  # leadership went with the partition
        assert (await asyncio.wait_for(syncing, 5)).error == ErrorCode.not_coordinator
        # The commit was refused while the group was completing its rebalance, before any write.
        assert await committing == {OTHER: ErrorCode.rebalance_in_progress}
        assert coordinator.coordinator_error("g") == ErrorCode.not_coordinator
        coordinator.shutdown()

    asyncio.run(scenario())


def test_a_client_that_goes_away_during_a_write_still_has_it_applied() -> None:
    """The connection closes while a commit and a leader's assignment wait for the ISR (the broker
    cancels the connection's handler): once written, the offsets are applied and the group is
    Stable, as in Kafka, instead of the log and the coordinator's memory disagreeing."""

    async def scenario() -> None:
        coordinator, clock, manager = gated_coordinator()
        coordinator.startup()
        joined = await coordinator.join_group(first_join("g"))
        syncing = asyncio.ensure_future(
            coordinator.sync_group("g", joined.generation_id, joined.member_id, None, None, None, {joined.member_id: b"a"})
        )
        await settle()
        assert [kind for kind, _ in manager.writes] == ["group"]
        syncing.cancel()  # the leader's connection closed
        manager.writes[0][1].set_result(ErrorCode.none)
        await settle()
        group = coordinator.group("g")
        assert group is not None and group.is_(GroupState.STABLE)

        offsets = {SUBSCRIBED: OffsetAndMetadata(42, -1, "", clock.now)}
        committing = asyncio.ensure_future(
            coordinator.commit_offsets("g", joined.generation_id, joined.member_id, None, offsets, 8)
        )
        await settle()
        assert [kind for kind, _ in manager.writes] == ["group", "offsets 42"]
        committing.cancel()
        manager.writes[1][1].set_result(ErrorCode.none)
        await settle()
        assert coordinator.fetch_offsets("g", [SUBSCRIBED])[SUBSCRIBED].offset == 42  # type: ignore[union-attr]
        coordinator.shutdown()

    asyncio.run(scenario())
