"""What a client knows about the cluster: brokers, topics, partitions and their leaders."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
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
            topic_id = getattr(topic, "topic_id", None)
            topics[name] = TopicMetadata(
                name,
                topic_id if topic_id and topic_id.int else None,
                bool(getattr(topic, "is_internal", False)),
                error,
                {
                    int(p.partition_index): PartitionMetadata(
                        name,
                        int(p.partition_index),
                        int(p.leader_id),
                        int(getattr(p, "leader_epoch", -1)),
                        tuple(int(r) for r in p.replica_nodes),
                        tuple(int(r) for r in p.isr_nodes),
                        tuple(int(r) for r in getattr(p, "offline_replicas", ())),
                        ErrorCode(p.error_code),
                    )
                    for p in topic.partitions
                },
            )
        self.topics = topics
