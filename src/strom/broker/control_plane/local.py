"""The embedded control plane of a single-node broker.

It is the controller of a cluster of one: it assigns partitions to this node,
keeps topic IDs, leader epochs and topic configs, and persists them in the first
log directory (``__strom_metadata.json``, replaced atomically on every change),
so that a restart -- clean or ``kill -9`` -- finds the same topics with the same IDs.

Every change is written (and fsync'd) before the in-memory image changes, so a failed
write (a full disk) leaves the image as it was and the caller gets KAFKA_STORAGE_ERROR.
One writer thread writes the file in the order the changes were made; a change not yet
in the image is *staged*, and every write holds the image plus the staged changes.
The file also lists the ids of topics whose deletion is under way, so that a startup
after a crash finishes their deletion instead of taking their logs for lost topics.
If the file is lost, the broker rebuilds the topics from the partition directories
(see BrokerServer); it never deletes a log it cannot place.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from strom.broker.control_plane.metadata import MetadataImage, PartitionState, TopicState
from strom.broker.control_plane.plane import AdminTasks, Outcome, Reassignment
from strom.protocol.errors import ErrorCode
from strom.storage import KafkaStorageError
from strom.storage.checkpoint import write_atomically

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


def legal_topic_name(name: str) -> bool:
    """Kafka's legal topic name rules: only such a name may become a path (znode or directory)."""
    try:
        validate_topic_name(name)
    except InvalidTopicError:
        return False
    return True


def _write_atomically(path: Path, text: str) -> None:
    write_atomically(path, text.encode("utf-8"))


def _serialize(topics: list[TopicState], next_producer_id_block: int, deleting: list[uuid.UUID]) -> str:
    data = {
        "topics": [t.to_json() for t in topics],
        "next_producer_id_block": next_producer_id_block,
        "deleting_topic_ids": sorted(str(topic_id) for topic_id in deleting),
    }
    return json.dumps(data, indent=1, sort_keys=True)


def _write_metadata(
    path: Path, topics: list[TopicState], next_producer_id_block: int, deleting: list[uuid.UUID]
) -> None:
    _write_atomically(path, _serialize(topics, next_producer_id_block, deleting))


class Hosting(Protocol):
    """What the embedded control plane asks of the broker that hosts every partition: the file
    work of a topic change, done after the change is persisted and before clients see it."""

    async def create_replicas(self, topic: TopicState) -> None:
        """Create the logs of the topic's partitions not hosted yet (raises: nothing changed)."""

    async def delete_replicas(self, topic: TopicState) -> None:
        """Stop and delete the topic's replicas and forget its groups' offsets."""

    async def configs_changed(self, topic: TopicState) -> None:
        """Apply the topic's new configs to its logs."""


class LocalControlPlane:
    """The ControlPlane of a single node: every replica is on this broker, which leads them all.

    Its admin operations run one at a time (Kafka's controller is single-threaded too): each
    persists the change, has the broker do the file work (``Hosting``, in worker threads) and
    only then changes what clients see. A failed write raises KafkaStorageError, changing nothing.
    """

    def __init__(
        self, log_dirs: list[Path], node_id: int, endpoint: Callable[[], tuple[str, int]] = lambda: ("", 0)
    ) -> None:
        """``endpoint``: where clients reach this broker (known once it listens)."""
        self.node_id = node_id
        self._endpoint = endpoint
        self._hosting: Hosting | None = None
        self._admin = AdminTasks()
        self._admin_lock = asyncio.Lock()
        self._admin_stopped = False
        self.log_dirs = log_dirs
        # What the metadata file says: the topics clients see.
        self.image = MetadataImage()
        self.cluster_id = ""
        self._path = log_dirs[0] / METADATA_FILE
        self._next_producer_id_block = 0
        # Changes written or being written but not yet in the image: name -> new state (None: removed).
        self._staged: dict[str, TopicState | None] = {}
        # Topics whose logs are being deleted (their ids stay in the file until the logs are gone).
        self._deleting: set[uuid.UUID] = set()
        # True when the file was missing or unreadable at load: the topics are rebuilt from the logs.
        self.lost = False
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="strom-metadata")

    def load(self) -> None:
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
        self.cluster_id = self._load_or_create_meta_properties()
        data: dict[str, Any] | None = None
        try:
            data = json.loads(self._path.read_bytes().decode("utf-8"))
            for topic in data.get("topics", []):
                self.image.put(TopicState.from_json(topic))
            self._next_producer_id_block = int(data.get("next_producer_id_block", 0))
            self._deleting = {uuid.UUID(t) for t in data.get("deleting_topic_ids", [])}
        except FileNotFoundError:
            self.lost = True
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            # Keep the damaged file for a post-mortem; the topics are rebuilt from the logs.
            aside = self._path.with_name(f"{self._path.name}.{int(time.time())}-corrupt")
            os.replace(self._path, aside)
            log.error(
                "the control plane's metadata file is unreadable: moved aside, rebuilding from the logs",
                extra={"file": str(self._path), "moved_to": str(aside), "error": str(e)},
            )
            self.image = MetadataImage()
            self._next_producer_id_block = 0
            self._deleting = set()
            self.lost = True
        log.info(
            "control plane loaded", extra={"topics": len(self.image.topics()), "cluster_id": self.cluster_id}
        )

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    def attach(self, hosting: Hosting) -> None:
        self._hosting = hosting

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

    # --- persisting -------------------------------------------------------------------

    def _intended_topics(self) -> list[TopicState]:
        topics = {t.name: t for t in self.image.topics()}
        for name, topic in self._staged.items():
            if topic is None:
                topics.pop(name, None)
            else:
                topics[name] = topic
        return list(topics.values())

    def _submit_write(self) -> Future[None]:
        """Queue a write of the image plus every staged change (the writer thread serialises it)."""
        return self._writer.submit(
            _write_metadata,
            self._path,
            self._intended_topics(),
            self._next_producer_id_block,
            list(self._deleting),
        )

    async def _write(self) -> None:
        try:
            await asyncio.wrap_future(self._submit_write())
        except OSError as e:
            log.error(
                "cannot write the control plane's metadata", extra={"file": str(self._path), "error": str(e)}
            )
            raise KafkaStorageError(f"cannot write {self._path}: {e}") from e

    def write_now(self) -> None:
        """Write synchronously (startup, before the broker serves anyone)."""
        try:
            self._submit_write().result()
        except OSError as e:
            raise KafkaStorageError(f"cannot write {self._path}: {e}") from e

    async def stage(self, topic: TopicState) -> None:
        """Persist ``topic``'s new state without showing it yet (``apply`` shows it)."""
        previous = self._staged.get(topic.name, self.image.topic(topic.name))
        self._staged[topic.name] = topic
        try:
            await self._write()
        except BaseException:
            self._unstage(topic.name, previous)
            raise

    async def stage_removal(self, name: str) -> TopicState | None:
        """Persist the removal of ``name`` (its id kept until ``finish_deletion``); None if unknown."""
        topic = self.image.topic(name)
        if topic is None or name in self._staged:
            return None
        self._staged[name] = None
        self._deleting.add(topic.topic_id)
        try:
            await self._write()
        except BaseException:
            self._staged.pop(name, None)
            self._deleting.discard(topic.topic_id)
            raise
        return topic

    def _unstage(self, name: str, previous: TopicState | None) -> None:
        if previous is None or self.image.topic(name) is previous:
            self._staged.pop(name, None)
        else:
            self._staged[name] = previous

    def apply(self, name: str) -> None:
        """Show the staged change of ``name`` (already persisted)."""
        topic = self._staged.pop(name)
        if topic is None:
            self.image.remove(name)
        else:
            self.image.put(topic)

    async def abort(self, name: str) -> None:
        """Forget the staged change of ``name`` and write the file without it (best effort)."""
        self._staged.pop(name, None)
        try:
            await self._write()
        except KafkaStorageError:
            log.exception("cannot withdraw a failed change from the metadata file", extra={"topic": name})

    async def finish_deletion(self, topic_ids: list[uuid.UUID]) -> None:
        """The logs of these topics are gone: drop their ids from the file."""
        self._deleting.difference_update(topic_ids)
        try:
            await self._write()
        except KafkaStorageError:
            log.warning("cannot record a finished topic deletion; it is finished again at startup")

    # --- topics -----------------------------------------------------------------------

    @property
    def deleting_topic_ids(self) -> frozenset[uuid.UUID]:
        return frozenset(self._deleting)

    def exists(self, name: str) -> bool:
        """Known, or being created (a name being deleted is still taken until its logs are gone)."""
        return name in self.image or self._staged.get(name) is not None

    def new_topic(self, name: str, num_partitions: int, configs: Mapping[str, str]) -> TopicState:
        """A new topic's state (validated, not persisted: ``stage`` then ``apply`` it)."""
        validate_topic_name(name)
        if self.exists(name):
            raise TopicExistsError(f"Topic '{name}' already exists.")
        return TopicState(
            name=name,
            topic_id=self.new_topic_id(),
            partitions=[self.new_partition(p) for p in range(num_partitions)],
            configs=dict(configs),
        )

    def new_topic_id(self) -> uuid.UUID:
        # Kafka reserves the zero UUID and UUIDs whose first 8 bytes are zero-ish as sentinels.
        while True:
            topic_id = uuid.uuid4()
            if topic_id.int >> 64 and self.image.topic_by_id(topic_id) is None:
                return topic_id

    def new_partition(self, partition: int) -> PartitionState:
        return PartitionState(partition, self.node_id, 0, [self.node_id], [self.node_id])

    def with_partitions(self, name: str, total: int) -> TopicState:
        """``name`` grown to ``total`` partitions (a new state to stage)."""
        topic = self.image.topic(name)
        if topic is None:
            raise KeyError(name)
        more = [self.new_partition(p) for p in range(len(topic.partitions), total)]
        return dataclasses.replace(topic, partitions=[*topic.partitions, *more])

    def with_configs(self, name: str, configs: Mapping[str, str]) -> TopicState:
        topic = self.image.topic(name)
        if topic is None:
            raise KeyError(name)
        return dataclasses.replace(topic, configs=dict(configs))

    def rebuild_topic(self, topic: TopicState) -> None:
        """Startup only: put a topic rebuilt from its logs (written by ``write_now``)."""
        self.image.put(topic)

    def clear_deleting(self) -> None:
        """Startup only: the deletions recorded in the file are finished (written by ``write_now``)."""
        self._deleting.clear()

    def allocate_producer_id_block(self, size: int) -> range:
        """Reserve ``size`` producer ids, durably, so that no id is handed out twice across restarts.

        Synchronous (once per ``size`` producers): the write queues behind any other.
        """
        start = self._next_producer_id_block
        self._next_producer_id_block = start + size  # a failed write only skips ids, never reuses them
        try:
            self._submit_write().result()
        except OSError as e:
            raise KafkaStorageError(f"cannot write {self._path}: {e}") from e
        return range(start, start + size)

    def reserve_producer_ids_above(self, producer_id: int, block_size: int) -> None:
        """Startup after a lost file: never hand out an id that a log already holds state for."""
        floor = (producer_id // block_size + 1) * block_size
        self._next_producer_id_block = max(self._next_producer_id_block, floor)

    # --- the ControlPlane interface -----------------------------------------------------

    @property
    def replicated(self) -> bool:
        return False

    @property
    def controller_id(self) -> int:
        return self.node_id

    @property
    def live_broker_ids(self) -> Collection[int]:
        return (self.node_id,)

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return self._endpoint() if broker_id == self.node_id else None

    def broker_racks(self) -> dict[int, str | None]:
        return {self.node_id: None}

    @property
    def hosting(self) -> Hosting:
        assert self._hosting is not None, "the broker attaches itself before serving"
        return self._hosting

    def _refuse_if_stopped(self) -> None:
        if self._admin_stopped:
            raise KafkaStorageError("the broker is shutting down")

    async def create_topic(
        self,
        name: str,
        num_partitions: int,
        configs: Mapping[str, str],
        *,
        replication_factor: int = -1,
        assignment: Mapping[int, list[int]] | None = None,
        timeout_ms: int | None = None,
    ) -> uuid.UUID:
        """The request's validation bounds ``replication_factor`` and ``assignment`` to this node."""
        return (await self._admin.run(self._create_topic(name, num_partitions, configs))).topic_id

    async def _create_topic(self, name: str, num_partitions: int, configs: Mapping[str, str]) -> TopicState:
        async with self._admin_lock:
            self._refuse_if_stopped()
            topic = await self._stage_and_create_logs(self.new_topic(name, num_partitions, configs))
        log.info("created topic", extra={"topic": name, "partitions": num_partitions})
        return topic

    async def delete_topic(self, name: str, timeout_ms: int | None = None) -> TopicState | None:
        return await self._admin.run(self._delete_topic(name))

    async def _delete_topic(self, name: str) -> TopicState | None:
        async with self._admin_lock:
            self._refuse_if_stopped()
            topic = await self.stage_removal(name)
            if topic is None:
                return None
            self.apply(name)
            await self.hosting.delete_replicas(topic)
            await self.finish_deletion([topic.topic_id])
        log.info("deleted topic", extra={"topic": name})
        return topic

    async def create_partitions(
        self, name: str, total: int, assignment: list[list[int]] | None = None, timeout_ms: int | None = None
    ) -> None:
        await self._admin.run(self._create_partitions(name, total))

    async def _create_partitions(self, name: str, total: int) -> TopicState:
        async with self._admin_lock:
            self._refuse_if_stopped()
            return await self._stage_and_create_logs(self.with_partitions(name, total))

    async def _stage_and_create_logs(self, topic: TopicState) -> TopicState:
        # The metadata first: a crash before the logs exist recreates them at startup.
        await self.stage(topic)
        try:
            await self.hosting.create_replicas(topic)
        except BaseException:
            await self.abort(topic.name)
            raise
        self.apply(topic.name)
        return topic

    async def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicState:
        return await self._admin.run(self._set_topic_configs(name, configs))

    async def _set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicState:
        async with self._admin_lock:
            self._refuse_if_stopped()
            topic = self.with_configs(name, configs)
            await self.stage(topic)
            self.apply(name)
            await self.hosting.configs_changed(topic)
        return topic

    async def elect_preferred_leaders(
        self, partitions: list[tuple[str, int]], timeout_s: float
    ) -> dict[tuple[str, int], Outcome]:
        """The only replica leads already; a partition that does not (its log dir is offline)
        cannot get a leader."""
        refused: Outcome = (
            ErrorCode.preferred_leader_not_available,
            "The preferred leader was not available.",
        )
        return dict.fromkeys(partitions, refused)

    async def reassignment(self, topic: str, partition: int) -> Reassignment | None:
        state = self.image.topic(topic)
        p = next((s for s in state.partitions if s.partition == partition), None) if state else None
        return Reassignment(list(p.replicas), [], []) if p is not None else None

    async def reassignments(
        self, wanted: Mapping[str, set[int] | None] | None
    ) -> list[tuple[str, int, Reassignment]]:
        return []  # none is ever in progress

    async def reassign(
        self, targets: list[tuple[str, int, list[int]]], timeout_s: float
    ) -> dict[tuple[str, int], Outcome]:
        """A single node's only possible assignment is its own: validated, it holds already."""
        return {(topic, partition): (ErrorCode.none, None) for topic, partition, _ in targets}

    async def stop_admin(self) -> None:
        async with self._admin_lock:
            self._admin_stopped = True
