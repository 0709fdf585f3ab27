"""What clients are told about one partition's leadership, shared by Metadata and the describe APIs.

On a single node, a partition on a failed log dir has no leader, as Kafka's controller reports it
once the broker's only replica is offline: LEADER_NOT_AVAILABLE, this node among the offline
replicas. In a cluster, as Kafka's metadata cache: replicas on brokers that are not alive are
offline, a leader that is not alive (the controller has yet to move leadership) is no leader,
and this broker names itself leader only once it has become leader in that epoch (Kafka applies
a leadership change before it publishes it), so a client that follows the answer is served.
"""

from __future__ import annotations

from dataclasses import dataclass

from strom.broker.control_plane.metadata import MetadataImage, PartitionState
from strom.broker.control_plane.plane import ControlPlane
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager
from strom.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class PartitionView:
    error: ErrorCode
    leader: int
    offline_replicas: tuple[int, ...]


def partition_view(
    replica_manager: ReplicaManager, plane: ControlPlane, topic: str, p: PartitionState
) -> PartitionView:
    tp = TopicPartition(topic, p.partition)
    if not plane.replicated:
        if replica_manager.is_offline(tp):
            return PartitionView(ErrorCode.leader_not_available, -1, tuple(p.replicas))
        return PartitionView(ErrorCode.none, p.leader, ())
    live = plane.live_broker_ids
    offline_replicas = tuple(b for b in p.replicas if b not in live)
    leader = p.leader if p.leader in live else -1
    if leader == replica_manager.node_id:
        local = replica_manager.partition(tp)
        if local is None or not local.is_leader or local.leader_epoch < p.leader_epoch:
            leader = -1
    error = ErrorCode.leader_not_available if leader == -1 else ErrorCode.none
    return PartitionView(error, leader, offline_replicas)


def unhosted_partition_error(
    replica_manager: ReplicaManager, image: MetadataImage, tp: TopicPartition
) -> ErrorCode:
    """The error for a partition this broker does not host, as Kafka's getPartitionOrError: a failed
    log dir's KAFKA_STORAGE_ERROR; NOT_LEADER_OR_FOLLOWER while the cluster's metadata has the
    partition (a leadership or replica this broker has yet to apply, as right after the topic was
    created: the client refreshes its metadata and retries); else UNKNOWN_TOPIC_OR_PARTITION."""
    if replica_manager.is_offline(tp):
        return ErrorCode.kafka_storage_error
    topic = image.topic(tp.topic)
    if topic is not None and 0 <= tp.partition < len(topic.partitions):
        return ErrorCode.not_leader_or_follower
    return ErrorCode.unknown_topic_or_partition
