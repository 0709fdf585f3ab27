"""What clients are told about one partition's leadership, shared by the describe APIs.

A partition on a failed log dir has no leader, as Kafka's controller reports it once the broker's
only replica is offline: LEADER_NOT_AVAILABLE, this node among the offline replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

from strom.broker.cluster.metadata import PartitionState, TopicState
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager
from strom.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class PartitionView:
    error: ErrorCode
    leader: int
    offline_replicas: tuple[int, ...]


def partition_view(replica_manager: ReplicaManager, topic: TopicState, p: PartitionState) -> PartitionView:
    if replica_manager.is_offline(TopicPartition(topic.name, p.partition)):
        return PartitionView(ErrorCode.leader_not_available, -1, tuple(p.replicas))
    return PartitionView(ErrorCode.none, p.leader, ())
