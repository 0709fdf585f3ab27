"""Kafka's ZooKeeper layout, byte for byte: the paths and the JSON of every znode a cluster uses.

Each codec encodes the JSON a Kafka 3.x broker in ZooKeeper mode writes and decodes what it
reads (tolerating the optional fields Kafka's readers tolerate), so tools that know Kafka's
layout read a Strom cluster's ZooKeeper as they read Kafka's. No I/O here.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

# -- paths (under the chroot of zookeeper.connect) -------------------------------------------

CLUSTER_ID = "/cluster/id"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
BROKER_IDS = "/brokers/ids"
BROKER_SEQID = "/brokers/seqid"
TOPICS = "/brokers/topics"
CONFIG_TOPICS = "/config/topics"
CONFIG_BROKERS = "/config/brokers"
CONFIG_CHANGES = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
DELETE_TOPICS = "/admin/delete_topics"
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
PREFERRED_REPLICA_ELECTION = "/admin/preferred_replica_election"
ISR_CHANGE_NOTIFICATION = "/isr_change_notification"
ISR_CHANGE_PREFIX = "isr_change_"
LOG_DIR_EVENT_NOTIFICATION = "/log_dir_event_notification"
LOG_DIR_EVENT_PREFIX = "log_dir_event_"
LATEST_PRODUCER_ID_BLOCK = "/latest_producer_id_block"
# Strom's own: a broker asks the controller to move leadership away before it exits (Kafka 4.x
# dropped the ControlledShutdown RPC together with ZooKeeper mode, so a znode carries the request).
CONTROLLED_SHUTDOWN = "/strom/controlled_shutdown"

# Created at startup by every broker, as Kafka's KafkaZkClient.createTopLevelPaths does.
PERSISTENT_PATHS = (
    BROKER_IDS,
    BROKER_SEQID,
    TOPICS,
    CONFIG_CHANGES,
    CONFIG_TOPICS,
    CONFIG_BROKERS,
    "/config/clients",
    "/config/users",
    "/config/ips",
    DELETE_TOPICS,
    ISR_CHANGE_NOTIFICATION,
    LATEST_PRODUCER_ID_BLOCK,
    LOG_DIR_EVENT_NOTIFICATION,
    CONTROLLED_SHUTDOWN,
)

DEFAULT_BROKER_ENTITY = "<default>"
PRODUCER_ID_BLOCK_SIZE = 1000


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic}"


def broker_config_path(entity: str) -> str:
    """``entity``: a broker id as a string, or DEFAULT_BROKER_ENTITY for the cluster default."""
    return f"{CONFIG_BROKERS}/{entity}"


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic}"


def controlled_shutdown_path(broker_id: int) -> str:
    return f"{CONTROLLED_SHUTDOWN}/{broker_id}"


# -- JSON ------------------------------------------------------------------------------------


def _dumps(data: Any) -> bytes:
    # Kafka's Json.encodeAsBytes: compact, no spaces.
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


def _loads(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"))


# What a decoder raises for a znode that is not what its path says (not JSON, a field missing or
# of the wrong type): JSONDecodeError and UnicodeDecodeError are ValueErrors.
MALFORMED = (ValueError, KeyError, TypeError, AttributeError)


def now_ms() -> int:
    return int(time.time() * 1000)


def encode_uuid(value: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")


def decode_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


@dataclass(frozen=True, slots=True)
class ClusterIdZNode:
    id: str

    def encode(self) -> bytes:
        return _dumps({"version": "1", "id": self.id})

    @classmethod
    def decode(cls, data: bytes) -> ClusterIdZNode:
        return cls(str(_loads(data)["id"]))


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """/brokers/ids/N (ephemeral). Its creation zxid is the broker epoch."""

    broker_id: int
    endpoints: tuple[str, ...]  # "PLAINTEXT://host:port", one per listener
    listener_security_protocol_map: dict[str, str]
    rack: str | None = None
    timestamp: int = 0
    features: dict[str, Any] = field(default_factory=dict)

    def endpoint(self, listener: str | None = None) -> tuple[str, int] | None:
        """The host and port of ``listener`` (None: the first endpoint)."""
        for endpoint in self.endpoints:
            name, _, address = endpoint.partition("://")
            if listener is None or name == listener:
                host, _, port = address.rpartition(":")
                return host.strip("[]"), int(port)
        return None

    def encode(self) -> bytes:
        plaintext = next(
            (
                e
                for e in self.endpoints
                if self.listener_security_protocol_map.get(e.split("://")[0]) == "PLAINTEXT"
            ),
            None,
        )
        host, port = (None, -1)
        if plaintext is not None:
            address = plaintext.partition("://")[2]
            host_text, _, port_text = address.rpartition(":")
            host, port = host_text.strip("[]"), int(port_text)
        data: dict[str, Any] = {
            "features": self.features,
            "listener_security_protocol_map": self.listener_security_protocol_map,
            "endpoints": list(self.endpoints),
            "jmx_port": -1,
            "port": port,
            "host": host,
            "version": 5,
            "timestamp": str(self.timestamp or now_ms()),
        }
        if self.rack is not None:
            data["rack"] = self.rack
        return _dumps(data)

    @classmethod
    def decode(cls, broker_id: int, data: bytes) -> BrokerRegistration:
        json_ = _loads(data)
        endpoints = json_.get("endpoints")
        if not endpoints:  # version 1-2 registrations: host and port only
            endpoints = [f"PLAINTEXT://{json_['host']}:{json_['port']}"]
        return cls(
            broker_id=broker_id,
            endpoints=tuple(str(e) for e in endpoints),
            listener_security_protocol_map={
                str(k): str(v)
                for k, v in (
                    json_.get("listener_security_protocol_map") or {"PLAINTEXT": "PLAINTEXT"}
                ).items()
            },
            rack=json_.get("rack"),
            timestamp=int(json_.get("timestamp", 0)),
            features=dict(json_.get("features") or {}),
        )


@dataclass(frozen=True, slots=True)
class ControllerZNode:
    """/controller (ephemeral): the broker that won the election."""

    broker_id: int
    timestamp: int = 0

    def encode(self) -> bytes:
        return _dumps(
            {"version": 1, "brokerid": self.broker_id, "timestamp": str(self.timestamp or now_ms())}
        )

    @classmethod
    def decode(cls, data: bytes) -> ControllerZNode:
        json_ = _loads(data)
        return cls(int(json_["brokerid"]), int(json_.get("timestamp", 0)))


def encode_controller_epoch(epoch: int) -> bytes:
    """/controller_epoch holds the bare number; its znode version fences controller writes."""
    return str(epoch).encode("ascii")


def decode_controller_epoch(data: bytes) -> int:
    return int(data.decode("ascii"))


@dataclass(frozen=True, slots=True)
class TopicZNode:
    """/brokers/topics/T: the replica assignment (version 3 adds the topic id; KIP-455's
    adding/removing replicas say which replicas a reassignment in progress adds and removes)."""

    topic_id: uuid.UUID | None
    partitions: dict[int, list[int]]
    adding_replicas: dict[int, list[int]] = field(default_factory=dict)
    removing_replicas: dict[int, list[int]] = field(default_factory=dict)

    def encode(self) -> bytes:
        data: dict[str, Any] = {
            "partitions": {str(p): r for p, r in sorted(self.partitions.items())},
            "adding_replicas": {str(p): r for p, r in sorted(self.adding_replicas.items())},
            "removing_replicas": {str(p): r for p, r in sorted(self.removing_replicas.items())},
            "version": 3 if self.topic_id is not None else 2,
        }
        if self.topic_id is not None:
            data["topic_id"] = encode_uuid(self.topic_id)
        return _dumps(data)

    @classmethod
    def decode(cls, data: bytes) -> TopicZNode:
        json_ = _loads(data)

        def replicas(key: str) -> dict[int, list[int]]:
            return {int(p): [int(b) for b in r] for p, r in (json_.get(key) or {}).items()}

        topic_id = json_.get("topic_id")
        partitions = replicas("partitions")
        # Kafka's partitions are 0..n-1, each with replicas; anything else is no topic Kafka wrote.
        if sorted(partitions) != list(range(len(partitions))) or not partitions:
            raise ValueError(f"partitions are not 0..n-1: {sorted(partitions)}")
        if not all(r and min(r) >= 0 and len(set(r)) == len(r) for r in partitions.values()):
            raise ValueError("a partition's replicas are empty, negative or repeated")
        return cls(
            topic_id=decode_uuid(str(topic_id)) if topic_id else None,
            partitions=partitions,
            adding_replicas=replicas("adding_replicas"),
            removing_replicas=replicas("removing_replicas"),
        )


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    """/brokers/topics/T/partitions/P/state. The znode's version is the partition epoch:
    every conditional write of the ISR or the leader names the version it read."""

    leader: int
    leader_epoch: int
    isr: list[int]
    controller_epoch: int
    leader_recovery_state: int = 0  # 0 RECOVERED, 1 RECOVERING (KIP-704)

    def encode(self) -> bytes:
        data: dict[str, Any] = {
            "controller_epoch": self.controller_epoch,
            "leader": self.leader,
            "version": 1,
            "leader_epoch": self.leader_epoch,
            "isr": self.isr,
        }
        if self.leader_recovery_state != 0:
            data["version"] = 2
            data["leader_recovery_state"] = self.leader_recovery_state
        return _dumps(data)

    @classmethod
    def decode(cls, data: bytes) -> LeaderAndIsr:
        json_ = _loads(data)
        return cls(
            leader=int(json_["leader"]),
            leader_epoch=int(json_["leader_epoch"]),
            isr=[int(b) for b in json_["isr"]],
            controller_epoch=int(json_["controller_epoch"]),
            leader_recovery_state=int(json_.get("leader_recovery_state", 0)),
        )


@dataclass(frozen=True, slots=True)
class EntityConfigZNode:
    """/config/topics/T and /config/brokers/N (or <default>): dynamic configs of one entity."""

    config: dict[str, str]

    def encode(self) -> bytes:
        return _dumps({"version": 1, "config": self.config})

    @classmethod
    def decode(cls, data: bytes | None) -> EntityConfigZNode:
        if not data:
            return cls({})
        return cls({str(k): str(v) for k, v in (_loads(data).get("config") or {}).items()})


def encode_config_change(entity_type: str, entity_name: str) -> bytes:
    """A /config/changes/config_change_NNNNNNNNNN (persistent sequential) notification, version 2."""
    return _dumps({"version": 2, "entity_path": f"{entity_type}/{entity_name}"})


def decode_config_change(data: bytes) -> tuple[str, str]:
    """(entity type, entity name) of a change notification (version 1: entity_type/entity_name)."""
    json_ = _loads(data)
    if "entity_path" in json_:
        entity_type, _, name = str(json_["entity_path"]).partition("/")
        return entity_type, name
    return str(json_["entity_type"]), str(json_["entity_name"])


@dataclass(frozen=True, slots=True)
class PartitionReplicas:
    topic: str
    partition: int
    replicas: list[int]


def encode_reassignment(partitions: list[PartitionReplicas]) -> bytes:
    """/admin/reassign_partitions (the pre-KIP-455 request znode; the controller deletes it when done)."""
    return _dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": p.topic, "partition": p.partition, "replicas": p.replicas} for p in partitions
            ],
        }
    )


def decode_reassignment(data: bytes) -> list[PartitionReplicas]:
    return [
        PartitionReplicas(str(p["topic"]), int(p["partition"]), [int(b) for b in p["replicas"]])
        for p in _loads(data).get("partitions", [])
    ]


def encode_partition_list(partitions: list[tuple[str, int]]) -> bytes:
    """/admin/preferred_replica_election and isr_change_ notifications: {"version":1,"partitions":[...]}."""
    return _dumps({"version": 1, "partitions": [{"topic": t, "partition": p} for t, p in partitions]})


def decode_partition_list(data: bytes) -> list[tuple[str, int]]:
    return [(str(p["topic"]), int(p["partition"])) for p in _loads(data).get("partitions", [])]


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """/latest_producer_id_block: the last block of producer ids any broker took (inclusive end)."""

    broker_id: int
    block_start: int
    block_end: int

    def encode(self) -> bytes:
        return _dumps(
            {
                "version": 1,
                "broker": self.broker_id,
                "block_start": str(self.block_start),
                "block_end": str(self.block_end),
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> ProducerIdBlock:
        json_ = _loads(data)
        return cls(int(json_["broker"]), int(json_["block_start"]), int(json_["block_end"]))

    def next(self, broker_id: int, size: int = PRODUCER_ID_BLOCK_SIZE) -> ProducerIdBlock:
        return ProducerIdBlock(broker_id, self.block_end + 1, self.block_end + size)
