"""The cluster metadata image: topics, their IDs, partition state and topic configs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class PartitionState:
    """Leadership state of one partition, as a controller records it."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    # The version of the partition's state znode in a cluster (Kafka's partition epoch): every
    # conditional write of the state names it. Always 0 on a single node (not persisted).
    partition_epoch: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "replicas": self.replicas,
            "isr": self.isr,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionState:
        return cls(
            partition=int(data["partition"]),
            leader=int(data["leader"]),
            leader_epoch=int(data["leader_epoch"]),
            replicas=[int(r) for r in data["replicas"]],
            isr=[int(r) for r in data["isr"]],
        )


# Kafka's internal topics: clients see them flagged in Metadata and cannot produce to them.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


@dataclass(slots=True)
class TopicState:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionState]
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic_id": str(self.topic_id),
            "partitions": [p.to_json() for p in self.partitions],
            "configs": self.configs,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicState:
        return cls(
            name=str(data["name"]),
            topic_id=uuid.UUID(data["topic_id"]),
            partitions=[PartitionState.from_json(p) for p in data["partitions"]],
            configs={str(k): str(v) for k, v in data.get("configs", {}).items()},
        )


class MetadataImage:
    """An in-memory, queryable view of every topic, by name and by topic ID."""

    def __init__(self) -> None:
        self._by_name: dict[str, TopicState] = {}
        self._by_id: dict[uuid.UUID, TopicState] = {}

    def put(self, topic: TopicState) -> None:
        self._by_name[topic.name] = topic
        self._by_id[topic.topic_id] = topic

    def remove(self, name: str) -> TopicState | None:
        topic = self._by_name.pop(name, None)
        if topic is not None:
            self._by_id.pop(topic.topic_id, None)
        return topic

    def topic(self, name: str) -> TopicState | None:
        return self._by_name.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicState | None:
        return self._by_id.get(topic_id)

    def topics(self) -> list[TopicState]:
        return list(self._by_name.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name


class ClusterLink(Protocol):
    """What the replication layer needs from a cluster's control plane (ZooKeeper mode).

    The replica manager and its fetchers see the cluster only through this: where a live broker
    listens and its epoch, and the leader's conditional write of a partition's ISR (Kafka's AlterPartition;
    in ZooKeeper mode the leader writes the state znode itself, fenced by its version).
    """

    node_id: int

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        """The host and port of a live broker's client listener; None if it is not registered."""
        ...

    def broker_epoch(self, broker_id: int) -> int | None:
        """A live broker's epoch (KIP-903: the creation zxid of its registration, new with every
        registration); None if it is not registered."""
        ...

    def peer_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        """The host and port of a live broker's inter-broker listener; None if it is not registered."""
        ...

    async def alter_partition(self, topic: str, state: PartitionState) -> PartitionState | None:
        """Write ``state`` (new ISR, same leader and leader epoch) if the partition's state is still
        at version ``state.partition_epoch``; returns the written state, whose ``partition_epoch`` is
        the new version, or None when the version no longer matches (a newer state is on its way
        through the watch, or the partition is gone)."""
        ...
