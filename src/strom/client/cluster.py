"""What a client knows about the cluster: brokers, topics, partitions and their leaders.

Leader epochs never go back: a Metadata response from a broker that has not yet heard
of a leader change (brokers learn of it at different times) would otherwise send
requests back to the old leader. As Kafka's ``Metadata`` does, a partition whose answered
leader epoch is older than the newest one seen keeps what the client knew, and KIP-951's
leader hints (NOT_LEADER_OR_FOLLOWER answers naming the new leader) move a partition to
a newer epoch without a Metadata round trip.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from strom.network.pool import Node
from strom.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """A partition of a topic; ordered by topic name, then partition number."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    topic: str
    partition: int
    leader: int  # -1 when the partition has no leader
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID | None
    is_internal: bool
    error: ErrorCode
    partitions: dict[int, PartitionMetadata] = field(default_factory=dict)


@dataclass(slots=True)
class Cluster:
    """A snapshot of one Metadata response merged into what the client already knew."""

    cluster_id: str | None = None
    controller_id: int = -1
    brokers: dict[int, Node] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    # The newest leader epoch seen per partition, kept while a topic drops out of the requests.
    leader_epochs: dict[TopicPartition, int] = field(default_factory=dict)

    def partitions_for(self, topic: str) -> list[PartitionMetadata]:
        metadata = self.topics.get(topic)
        if metadata is None:
            return []
        return [metadata.partitions[p] for p in sorted(metadata.partitions)]

    def leader(self, tp: TopicPartition) -> Node | None:
        metadata = self.topics.get(tp.topic)
        if metadata is None:
            return None
        partition = metadata.partitions.get(tp.partition)
        if partition is None or partition.leader < 0:
            return None
        return self.brokers.get(partition.leader)

    def partition(self, tp: TopicPartition) -> PartitionMetadata | None:
        metadata = self.topics.get(tp.topic)
        return None if metadata is None else metadata.partitions.get(tp.partition)

    def leader_epoch(self, tp: TopicPartition) -> int:
        """The partition's current leader epoch as known here; -1 when unknown."""
        partition = self.partition(tp)
        return -1 if partition is None else partition.leader_epoch

    def update_leaders(self, leaders: dict[TopicPartition, tuple[int, int]], nodes: list[Node]) -> set[TopicPartition]:
        """Apply KIP-951 hints: each partition's (leader id, leader epoch) from an error answer.

        A hint is used only when it is newer than what is known and its leader's address is
        known (from ``nodes``, the answer's node_endpoints, or earlier metadata), as Kafka's
        ``Metadata.updatePartitionLeadership`` does. Returns the partitions that moved.
        """
        for node in nodes:
            self.brokers[node.node_id] = node
        moved: set[TopicPartition] = set()
        for tp, (leader_id, leader_epoch) in leaders.items():
            current = self.partition(tp)
            if leader_id < 0 or leader_epoch < 0 or current is None or leader_id not in self.brokers:
                continue
            if leader_epoch <= max(current.leader_epoch, self.leader_epochs.get(tp, -1)):
                continue
            topic = self.topics[tp.topic]
            partitions = dict(topic.partitions)
            partitions[tp.partition] = replace(current, leader=leader_id, leader_epoch=leader_epoch)
            self.topics[tp.topic] = replace(topic, partitions=partitions)
            self.leader_epochs[tp] = leader_epoch
            moved.add(tp)
        return moved

    def update(self, response: Any, requested_topics: list[str] | None) -> None:
        """Merge a Metadata response (any version). A full request replaces the topic list."""
        self.brokers = {
            int(b.node_id): Node(int(b.node_id), b.host, int(b.port), getattr(b, "rack", None))
            for b in response.brokers
        }
        self.cluster_id = getattr(response, "cluster_id", None)
        self.controller_id = int(getattr(response, "controller_id", -1))
        topics: dict[str, TopicMetadata] = {} if requested_topics is None else dict(self.topics)
        for topic in response.topics:
            name = topic.name
            if name is None:
                continue
            error = ErrorCode(topic.error_code)
            if error != ErrorCode.none and not topic.partitions:
                topics.pop(name, None)
                if error != ErrorCode.unknown_topic_or_partition:
                    topics[name] = TopicMetadata(name, None, False, error)
                continue
            raw_id = getattr(topic, "topic_id", None)
            topic_id = raw_id if raw_id and raw_id.int else None
            known = self.topics.get(name)
            if known is not None and None not in (known.topic_id, topic_id) and known.topic_id != topic_id:
                # Deleted and re-created: the new topic's epochs start again.
                for tp in [tp for tp in self.leader_epochs if tp.topic == name]:
                    del self.leader_epochs[tp]
            partitions: dict[int, PartitionMetadata] = {}
            for p in topic.partitions:
                answered = PartitionMetadata(
                    name,
                    int(p.partition_index),
                    int(p.leader_id),
                    int(getattr(p, "leader_epoch", -1)),
                    tuple(int(r) for r in p.replica_nodes),
                    tuple(int(r) for r in p.isr_nodes),
                    tuple(int(r) for r in getattr(p, "offline_replicas", ())),
                    ErrorCode(p.error_code),
                )
                partitions[answered.partition] = self._newest(answered, known)
            topics[name] = TopicMetadata(
                name, topic_id, bool(getattr(topic, "is_internal", False)), error, partitions
            )
        self.topics = topics

    def _newest(self, answered: PartitionMetadata, known: TopicMetadata | None) -> PartitionMetadata:
        """The answered partition, unless its leader epoch is older than one already seen."""
        if answered.leader_epoch < 0:
            return answered  # a broker without leader epochs (Metadata < v7): nothing to compare
        tp = TopicPartition(answered.topic, answered.partition)
        seen = self.leader_epochs.get(tp, -1)
        if answered.leader_epoch >= seen:
            self.leader_epochs[tp] = answered.leader_epoch
            return answered
        cached = known.partitions.get(answered.partition) if known is not None else None
        if cached is not None and cached.leader_epoch >= answered.leader_epoch:
            return cached
        return answered
