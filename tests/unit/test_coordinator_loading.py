"""Loading an offsets partition off the event loop: the worker's replay matches the blocking load,
runs on the load worker, and a load whose leadership ended (or changed epoch) is discarded; the
partition's groups answer COORDINATOR_LOAD_IN_PROGRESS meanwhile."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from strom.broker.control_plane.metadata import PartitionState, TopicState
from strom.broker.coordinator import group_metadata_manager as gmm
from strom.broker.coordinator.group import OffsetAndMetadata
from strom.broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from strom.broker.coordinator.group_metadata_manager import GroupMetadataManager
from strom.broker.coordinator.loader import CoordinatorLoader
from strom.broker.coordinator.records import OffsetCommitKey, OffsetCommitValue
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager
from strom.protocol.errors import ErrorCode
from strom.records.codec import RecordSpec, encode_batch
from strom.storage import LogConfig, LogManager

OFFSETS_TP = TopicPartition("__consumer_offsets", 0)
GROUPS = 40
TOPIC_PARTITIONS = 50  # commits per group: 2,000 records


def offsets_manager(tmp_path: Path) -> tuple[LogManager, ReplicaManager, GroupMetadataManager]:
    log_manager = LogManager([tmp_path / "logs"])
    log_manager.startup(lambda _: LogConfig())
    replica_manager = ReplicaManager(log_manager, lambda topic: LogConfig(cleanup_policy="compact"))
    replica_manager.lead_on_single_node(
        TopicState("__consumer_offsets", uuid.UUID(int=1), [PartitionState(0, 0, 0, [0], [0])])
    )
    partition = replica_manager.partition(OFFSETS_TP)
    assert partition is not None
    for group in range(GROUPS):
        records = [
            RecordSpec(
                gmm.encode_offset_commit_key(OffsetCommitKey(f"group-{group}", "t", p)),
                gmm.encode_offset_commit_value(OffsetCommitValue(p * 10 + group, -1, "", 1, -1)),
            )
            for p in range(TOPIC_PARTITIONS)
        ]
        partition.append_records_to_leader(encode_batch(records), required_acks=1)
    # A tombstone: group-0's offset of t-0 is gone.
    tombstone = RecordSpec(gmm.encode_offset_commit_key(OffsetCommitKey("group-0", "t", 0)), None)
    partition.append_records_to_leader(encode_batch([tombstone]), required_acks=1)
    return log_manager, replica_manager, GroupMetadataManager(replica_manager, 1)


def offsets_of(groups: dict[str, Any]) -> dict[str, dict[TopicPartition, OffsetAndMetadata]]:
    return {group_id: dict(group.offsets) for group_id, group in groups.items()}


def test_the_worker_load_replays_what_the_blocking_load_does_on_the_load_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_manager, _, manager = offsets_manager(tmp_path)
    manager.loader = CoordinatorLoader(slice_bytes=4096)  # many slices
    threads: set[str] = set()
    replay = gmm.GroupLoad.replay

    def recording(self: gmm.GroupLoad, *args: Any) -> None:
        threads.add(threading.current_thread().name)
        replay(self, *args)

    async def scenario() -> dict[str, Any] | None:
        return await manager.load_partition(0, lambda: True)

    blocking = manager.load([0])
    monkeypatch.setattr(gmm.GroupLoad, "replay", recording)
    loaded = asyncio.run(scenario())
    assert loaded is not None and len(loaded) == GROUPS
    assert offsets_of(loaded) == offsets_of(blocking)
    assert TopicPartition("t", 0) not in loaded["group-0"].offsets
    assert loaded["group-7"].offsets[TopicPartition("t", 3)].offset == 37
    assert threads and all(name.startswith("strom-coordinator-load") for name in threads)
    manager.loader.shutdown()
    log_manager.shutdown()


def test_a_load_whose_leadership_ended_is_discarded_between_slices(tmp_path: Path) -> None:
    log_manager, _, manager = offsets_manager(tmp_path)
    manager.loader = CoordinatorLoader(slice_bytes=4096)
    checks = 0

    def is_current() -> bool:
        nonlocal checks
        checks += 1
        return checks <= 3  # resigned after the second slice

    assert asyncio.run(manager.load_partition(0, is_current)) is None
    assert checks == 4  # no slice read after it turned stale
    manager.loader.shutdown()
    log_manager.shutdown()


def coordinator_for(manager: GroupMetadataManager) -> GroupCoordinator:
    config = GroupConfig(
        min_session_timeout_ms=1000,
        max_session_timeout_ms=60_000,
        initial_rebalance_delay_ms=0,
        max_size=100,
        offsets_retention_ms=7 * 24 * 3600 * 1000,
        offset_metadata_max_bytes=4096,
    )
    return GroupCoordinator(config, manager, lambda: None, follows_leadership=True)


async def until(condition: Any, timeout_s: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


def test_groups_answer_load_in_progress_until_the_current_epochs_load_is_adopted(tmp_path: Path) -> None:
    log_manager, _, manager = offsets_manager(tmp_path)
    manager.loader = CoordinatorLoader(slice_bytes=4096)
    loads: list[int] = []
    load_partition = manager.load_partition

    first_may_run = asyncio.Event()

    async def counting(partition: int, is_current: Any) -> Any:
        loads.append(partition)
        if len(loads) == 1:
            await first_may_run.wait()  # the first load is still running when leadership changes
        result = await load_partition(partition, is_current)
        loads.append(-1 if result is None else len(result))
        return result

    manager.load_partition = counting  # type: ignore[method-assign]

    async def scenario() -> None:
        coordinator = coordinator_for(manager)
        coordinator.startup()
        assert coordinator.coordinator_error("group-1") == ErrorCode.not_coordinator
        coordinator.on_become_leader(OFFSETS_TP, 5)
        # Nothing is replayed inline: the partition is loading, the loop goes on.
        assert coordinator.coordinator_error("group-1") == ErrorCode.coordinator_load_in_progress
        assert coordinator.group("group-1") is None and coordinator.loading
        await until(lambda: len(loads) >= 1)
        # Resigned, then led again in a newer epoch, while the first load runs.
        coordinator.on_become_follower(OFFSETS_TP)
        assert coordinator.coordinator_error("group-1") == ErrorCode.not_coordinator
        coordinator.on_become_leader(OFFSETS_TP, 6)
        assert coordinator.coordinator_error("group-1") == ErrorCode.coordinator_load_in_progress
        first_may_run.set()
        await until(lambda: coordinator.coordinator_error("group-1") == ErrorCode.none)
        await until(lambda: len(loads) == 4)
        # The epoch-5 load was discarded (None), the epoch-6 one adopted.
        assert sorted(loads) == sorted([0, -1, 0, GROUPS])
        assert not coordinator.loading
        group = coordinator.group("group-1")
        assert group is not None and group.offsets[TopicPartition("t", 2)].offset == 21
        # Resigning again: a later load would not bring them back.
        coordinator.on_become_follower(OFFSETS_TP)
        assert coordinator.group("group-1") is None
        coordinator.shutdown()

    asyncio.run(scenario())
    log_manager.shutdown()


def test_a_load_that_resigns_before_it_finishes_leaves_nothing_owned(tmp_path: Path) -> None:
    log_manager, _, manager = offsets_manager(tmp_path)
    manager.loader = CoordinatorLoader(slice_bytes=4096)

    async def scenario() -> None:
        coordinator = coordinator_for(manager)
        coordinator.startup()
        coordinator.on_become_leader(OFFSETS_TP, 5)
        await asyncio.sleep(0)
        coordinator.on_become_follower(OFFSETS_TP)
        await until(lambda: not coordinator._load_tasks)
        assert coordinator.coordinator_error("group-1") == ErrorCode.not_coordinator
        assert coordinator.group("group-1") is None and coordinator.list_groups(set(), set()) == []
        coordinator.shutdown()

    asyncio.run(scenario())
    log_manager.shutdown()
