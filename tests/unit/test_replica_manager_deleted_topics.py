"""Issue 17 item 18: what the replica manager keeps per partition and per topic goes with a
deleted topic (its applied states, its topic id), so that creating and deleting topics
for as long as a broker runs does not grow its memory."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from strom.broker.control_plane.metadata import PartitionState, TopicState
from strom.broker.partition import TopicPartition
from unit.test_replication_partition import Clock, FakeLink, make_manager


def test_a_deleted_topics_states_and_topic_id_are_dropped(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager = make_manager(tmp_path, Clock(), FakeLink(1))
        topics = []
        for n in range(20):
            states = [PartitionState(p, 1, 0, [1], [1]) for p in range(3)]
            topic = TopicState(f"t{n}", uuid.uuid4(), states)
            for state in states:
                await manager.become_leader_or_follower(topic, [state])
            topics.append(topic)
        assert len(manager._applied) == 60
        assert all(manager.topic_id(t.name) == t.topic_id for t in topics)

        for topic in topics:
            await manager.stop_replicas(topic)
        assert manager._applied == {}
        assert all(manager.topic_id(t.name) is None for t in topics)
        assert manager.log_manager.all_logs() == []

        # A topic created again under a deleted one's name is hosted as before.
        again = TopicState("t0", uuid.uuid4(), [PartitionState(0, 1, 0, [1], [1])])
        await manager.become_leader_or_follower(again, [again.partitions[0]])
        assert manager.topic_id("t0") == again.topic_id
        partition = manager.partition(TopicPartition("t0", 0))
        assert partition is not None and partition.is_leader
        await manager.shutdown()
        manager.log_manager.shutdown()

    asyncio.run(scenario())
