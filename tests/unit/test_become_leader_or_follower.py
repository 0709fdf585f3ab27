"""Kafka's becomeLeaderOrFollower against a real ReplicaManager, Partition and logs: the partition
states of a topic applied in one pass (their logs created together, each new leader's epoch in
its leader-epoch-checkpoint before it leads, the fetchers updated for the batch), older states
ignored. The cluster link is the fake of test_replication_partition."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

from strom.broker.control_plane.metadata import PartitionState, TopicState
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager, partition_ranges
from strom.storage.checkpoint import LEADER_EPOCH_CHECKPOINT, LeaderEpochCheckpointFile
from unit.test_replication_partition import Clock, FakeLink, make_manager

PARTITIONS = 300
REPLICAS = [1, 2, 3]


def topic_with(states: list[PartitionState]) -> TopicState:
    return TopicState("big", uuid.UUID(int=11), states, {})


def states_at(epoch: int, leader_of: Any) -> list[PartitionState]:
    return [
        PartitionState(p, leader_of(p), epoch, REPLICAS, REPLICAS, partition_epoch=epoch)
        for p in range(PARTITIONS)
    ]


def checkpointed_epochs(manager: ReplicaManager, partition: int) -> list[tuple[int, int]]:
    log = manager.log_manager.get_log("big", partition)
    assert log is not None
    return LeaderEpochCheckpointFile(log.dir / LEADER_EPOCH_CHECKPOINT).read()


def followed(manager: ReplicaManager) -> dict[TopicPartition, int]:
    """Each followed partition and the leader its fetcher fetches from."""
    assert manager.fetchers is not None
    return {tp: leader for (leader, _), f in manager.fetchers._fetchers.items() for tp in f.partitions}


def test_a_topics_partitions_are_applied_in_one_pass(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager = make_manager(tmp_path, Clock(), FakeLink(1))
        creations: list[int] = []
        open_new_logs = manager.log_manager.open_new_logs

        def counted(specs: list[Any]) -> Any:
            creations.append(len(specs))
            return open_new_logs(specs)

        manager.log_manager.open_new_logs = counted  # type: ignore[method-assign]

        # Epoch 0: broker 1 leads a third of the partitions, broker 2 the rest.
        first = states_at(0, lambda p: 1 if p % 3 == 0 else 2)
        await manager.become_leader_or_follower(topic_with(first), first)
        assert creations == [PARTITIONS]  # every log created in one go, off the loop
        for p in range(PARTITIONS):
            partition = manager.partition(TopicPartition("big", p))
            assert partition is not None and partition.leader_epoch == 0
            if p % 3 == 0:
                assert partition.is_leader
                assert (1, 0) not in checkpointed_epochs(manager, p)
            else:
                assert not partition.is_leader and partition.leader_id == 2
        assert followed(manager) == {TopicPartition("big", p): 2 for p in range(PARTITIONS) if p % 3}

        # Epoch 1: leadership moves by one broker; each new leader records epoch 1 first, in
        # memory (the log's flush writes the checkpoint: issue 18).
        second = states_at(1, lambda p: [3, 1, 2][p % 3])
        fsyncs: list[int] = []
        real_fsync = os.fsync
        os.fsync = lambda fd: (fsyncs.append(fd), real_fsync(fd))[1]  # type: ignore[assignment]
        try:
            await manager.become_leader_or_follower(topic_with(second), second)
        finally:
            os.fsync = real_fsync
        assert fsyncs == []
        assert creations == [PARTITIONS]
        for p in range(PARTITIONS):
            partition = manager.partition(TopicPartition("big", p))
            assert partition is not None and partition.leader_epoch == 1
            assert partition.is_leader == (p % 3 == 1)
            if p % 3 == 1:
                assert partition.log.leader_epoch_cache.entries[-1] == (1, 0)
                assert (1, 0) not in checkpointed_epochs(manager, p)
        assert followed(manager) == {
            TopicPartition("big", p): [3, 1, 2][p % 3] for p in range(PARTITIONS) if p % 3 != 1
        }

        # The epoch-0 states again (a late read): older than what is applied, ignored.
        await manager.become_leader_or_follower(topic_with(first), first)
        assert all(
            (partition := manager.partition(TopicPartition("big", p))) is not None
            and partition.leader_epoch == 1
            and partition.is_leader == (p % 3 == 1)
            for p in range(PARTITIONS)
        )
        await manager.shutdown()
        manager.log_manager.shutdown()

    asyncio.run(scenario())


def test_a_batch_of_partitions_is_logged_as_ranges() -> None:
    assert partition_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert partition_ranges([4]) == "4"
