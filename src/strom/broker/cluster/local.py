"""The embedded control plane of a single-node broker.

It is the controller of a cluster of one: it assigns partitions to this node,
keeps topic IDs, leader epochs and topic configs, and persists them in the first
log directory (``__strom_metadata.json``, replaced atomically on every change),
so that a restart -- clean or ``kill -9`` -- finds the same topics with the same IDs.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path

from strom.broker.cluster.metadata import MetadataImage, PartitionState, TopicState

log = logging.getLogger(__name__)

METADATA_FILE = "__strom_metadata.json"
META_PROPERTIES = "meta.properties"

# Kafka's rule: legal characters, at most 249 of them, not "." or "..".
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249


class TopicExistsError(Exception):
    pass


class InvalidTopicError(ValueError):
    pass


def validate_topic_name(name: str) -> None:
    if not name:
        raise InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicError('Topic name cannot be "." or ".."')
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters"
        )
    if not _LEGAL_TOPIC.match(name):
        raise InvalidTopicError(
            f'Topic name "{name}" is illegal, it contains a character other than '
            "ASCII alphanumerics, '.', '_' and '-'"
        )


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class LocalControlPlane:
    def __init__(self, log_dirs: list[Path], node_id: int) -> None:
        self.node_id = node_id
        self.log_dirs = log_dirs
        self.image = MetadataImage()
        self.cluster_id = ""
        self._path = log_dirs[0] / METADATA_FILE
        self._next_producer_id_block = 0

    def load(self) -> None:
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
        self.cluster_id = self._load_or_create_meta_properties()
        if self._path.exists():
            data = json.loads(self._path.read_text(encoding="utf-8"))
            for topic in data.get("topics", []):
                self.image.put(TopicState.from_json(topic))
            self._next_producer_id_block = int(data.get("next_producer_id_block", 0))
        log.info(
            "control plane loaded", extra={"topics": len(self.image.topics()), "cluster_id": self.cluster_id}
        )

    def _load_or_create_meta_properties(self) -> str:
        """Each log dir records the cluster and node it belongs to, as Kafka's meta.properties does."""
        cluster_id = ""
        for log_dir in self.log_dirs:
            path = log_dir / META_PROPERTIES
            if path.exists():
                props = dict(
                    line.split("=", 1)
                    for line in path.read_text(encoding="utf-8").splitlines()
                    if "=" in line and not line.startswith("#")
                )
                found = props.get("cluster.id", "")
                if cluster_id and found and found != cluster_id:
                    raise RuntimeError(f"log dir {log_dir} belongs to cluster {found}, not {cluster_id}")
                cluster_id = cluster_id or found
        if not cluster_id:
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        for log_dir in self.log_dirs:
            path = log_dir / META_PROPERTIES
            if not path.exists():
                _write_atomically(path, f"version=1\ncluster.id={cluster_id}\nnode.id={self.node_id}\n")
        return cluster_id

    def _persist(self) -> None:
        data = {
            "topics": [t.to_json() for t in self.image.topics()],
            "next_producer_id_block": self._next_producer_id_block,
        }
        _write_atomically(self._path, json.dumps(data, indent=1, sort_keys=True))

    def create_topic(self, name: str, num_partitions: int, configs: Mapping[str, str]) -> TopicState:
        validate_topic_name(name)
        if name in self.image:
            raise TopicExistsError(f"Topic '{name}' already exists.")
        topic = TopicState(
            name=name,
            topic_id=self._new_topic_id(),
            partitions=[self._new_partition(p) for p in range(num_partitions)],
            configs=dict(configs),
        )
        self.image.put(topic)
        self._persist()
        return topic

    def _new_topic_id(self) -> uuid.UUID:
        # Kafka reserves the zero UUID and UUIDs whose first 8 bytes are zero-ish as sentinels.
        while True:
            topic_id = uuid.uuid4()
            if topic_id.int >> 64 and self.image.topic_by_id(topic_id) is None:
                return topic_id

    def _new_partition(self, partition: int) -> PartitionState:
        return PartitionState(partition, self.node_id, 0, [self.node_id], [self.node_id])

    def delete_topic(self, name: str) -> TopicState | None:
        topic = self.image.remove(name)
        if topic is not None:
            self._persist()
        return topic

    def create_partitions(self, name: str, total: int) -> TopicState:
        topic = self.image.topic(name)
        if topic is None:
            raise KeyError(name)
        topic.partitions.extend(self._new_partition(p) for p in range(len(topic.partitions), total))
        self._persist()
        return topic

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicState:
        topic = self.image.topic(name)
        if topic is None:
            raise KeyError(name)
        topic.configs = dict(configs)
        self._persist()
        return topic

    def allocate_producer_id_block(self, size: int) -> range:
        """Reserve ``size`` producer ids, durably, so that no id is handed out twice across restarts."""
        start = self._next_producer_id_block
        self._next_producer_id_block = start + size
        self._persist()
        return range(start, start + size)
