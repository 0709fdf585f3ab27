"""The broker process: storage, control plane, replica manager, listeners and schedulers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import time
from collections import Counter, defaultdict
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from strom.broker.cluster.local import (
    InvalidTopicError,
    LocalControlPlane,
    TopicExistsError,
    validate_topic_name,
)
from strom.broker.cluster.metadata import TopicState
from strom.broker.config import KafkaConfig
from strom.broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from strom.broker.coordinator.group_metadata_manager import OFFSETS_TOPIC, GroupMetadataManager
from strom.broker.dispatcher import RequestDispatcher
from strom.broker.dynamic_config import DynamicBrokerConfig, LocalDynamicConfigStore
from strom.broker.handlers import HANDLERS
from strom.broker.network import ConnectionQuotas, KafkaConnection, NetworkLimits, RequestMemory
from strom.broker.replica_manager import ReplicaManager
from strom.storage import KafkaStorageError, Log, LogConfig, LogManager, StorageError

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK_SIZE = 1000

T = TypeVar("T")


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit and return it: the broker keeps a descriptor
    per segment (10,000 segments need 10,000), and the usual soft limit is 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            target = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as e:
            log.warning(
                "could not raise the open file limit", extra={"soft": soft, "hard": hard, "error": str(e)}
            )
    log.info("open file limit (RLIMIT_NOFILE)", extra={"soft": soft, "hard": hard})
    return soft


def set_socket_buffer_sizes(sock: socket.socket, send_bytes: int, receive_bytes: int) -> None:
    """Kafka's socket.send/receive.buffer.bytes (-1: the OS default, autotuned on Linux).

    Set on a listening socket, they hold for every connection it accepts (Linux and BSD copy a
    listener's buffer sizes to accepted sockets, and the receive window is scaled from them).
    """
    if send_bytes != -1:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_bytes)
    if receive_bytes != -1:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_bytes)


class ProducerIdManager:
    """Hands out producer ids from blocks reserved durably in the control plane."""

    def __init__(self, control_plane: LocalControlPlane) -> None:
        self._control_plane = control_plane
        self._block = range(0)
        self._next = 0

    def generate(self) -> int:
        if self._next >= self._block.stop:
            self._block = self._control_plane.allocate_producer_id_block(PRODUCER_ID_BLOCK_SIZE)
            self._next = self._block.start
        producer_id = self._next
        self._next += 1
        return producer_id


class BrokerServer:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        log_dirs = [Path(d) for d in config.log_dirs]
        self.control_plane = LocalControlPlane(log_dirs, self.node_id)
        # Dynamic broker configs (AlterConfigs on the BROKER resource), kept beside the metadata file.
        self.dynamic_config = DynamicBrokerConfig(self, LocalDynamicConfigStore(log_dirs[0]))
        self.log_manager = LogManager(log_dirs)
        self.replica_manager = ReplicaManager(self.log_manager, self.log_config)
        self.producer_ids = ProducerIdManager(self.control_plane)
        self.group_coordinator = GroupCoordinator(
            GroupConfig(
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                max_size=config.group_max_size,
                offsets_retention_ms=config.offsets_retention_minutes * 60_000,
                offset_metadata_max_bytes=config.offset_metadata_max_bytes,
            ),
            GroupMetadataManager(self.replica_manager, config.offsets_topic_num_partitions),
            self._request_offsets_topic,
        )
        self._dispatcher = RequestDispatcher(self, HANDLERS)
        self._servers: list[asyncio.Server] = []
        self.network = NetworkLimits(
            max_request_size=config.socket_request_max_bytes,
            queued_max_requests=config.queued_max_requests,
            memory=RequestMemory(config.queued_max_request_bytes),
            quotas=ConnectionQuotas(
                config.max_connections, config.max_connections_per_ip, config.max_connections_per_ip_overrides
            ),
        )
        self._connections = self.network.connections
        self._tasks: list[asyncio.Task[None]] = []
        self.bound_ports: list[int] = []
        # Serialises topic creation, deletion and changes (see "topic management").
        self._admin_lock = asyncio.Lock()
        self._offsets_topic_task: asyncio.Task[None] | None = None
        self._admin_tasks: set[asyncio.Future[Any]] = set()
        self._storage_loaded = False

    @property
    def cluster_id(self) -> str:
        return self.control_plane.cluster_id

    def log_config(self, topic: TopicState) -> LogConfig:
        return LogConfig.from_props(topic.configs, self.config.log_config_defaults())

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        raise_open_file_limit()
        # Before anything reads or writes a log dir: a second broker on it fails here, having
        # changed nothing (no recovery, no checkpoint, no clean-shutdown marker).
        self.log_manager.lock_log_dirs()
        try:
            await self.dynamic_config.load()
            await self._load_storage()
        except BaseException:
            # Storage half loaded: writing checkpoints now could lose entries of unloaded logs.
            self.log_manager.unlock_log_dirs()
            self.control_plane.close()
            raise
        self._storage_loaded = True
        loop = asyncio.get_running_loop()
        self.group_coordinator.startup()
        for listener in self.config.client_listeners():
            server = await loop.create_server(
                lambda: KafkaConnection(self._dispatcher.handle, self.network),
                host=listener.host or None,
                port=listener.port,
                reuse_address=True,
                backlog=1024,
            )
            self._servers.append(server)
            for sock in server.sockets:
                set_socket_buffer_sizes(
                    sock, self.config.socket_send_buffer_bytes, self.config.socket_receive_buffer_bytes
                )
                self.bound_ports.append(sock.getsockname()[1])
        self._tasks = [
            loop.create_task(self._every(self.config.log_retention_check_interval_ms, self._retention)),
            loop.create_task(self._every(self.config.log_flush_scheduler_interval_ms, self._flush)),
            loop.create_task(
                self._every(self.config.log_flush_offset_checkpoint_interval_ms, self._checkpoint)
            ),
            loop.create_task(self._every(self._idle_check_interval_ms(), self._close_idle_connections)),
            loop.create_task(
                self._every(self.config.offsets_retention_check_interval_ms, self._expire_group_offsets)
            ),
        ]
        if self.config.log_cleaner_enable:
            self.log_manager.start_cleaner(self.config.cleaner_config)
            self._tasks.append(
                loop.create_task(self._every(self.config.cleaner_config.backoff_ms, self._clean_logs))
            )
        log.info(
            "broker started",
            extra={"node_id": self.node_id, "ports": self.bound_ports, "cluster_id": self.cluster_id},
        )

    async def _load_storage(self) -> None:
        """Load the control plane and every log, and reconcile them (in a worker thread)."""
        await asyncio.get_running_loop().run_in_executor(None, self._load_storage_blocking)

    def _load_storage_blocking(self) -> None:
        self.control_plane.load()
        topics = {t.name: t for t in self.control_plane.image.topics()}
        self.log_manager.startup(
            lambda name: self.log_config(topics[name]) if name in topics else LogConfig(),
            {name: topic.topic_id for name, topic in topics.items()},
        )
        self._reconcile_logs(topics)
        for topic in self.control_plane.image.topics():
            self.replica_manager.become_leader(topic)

    def _reconcile_logs(self, topics: Mapping[str, TopicState]) -> None:
        """Place every loaded log that the control plane does not know. Nothing is deleted here
        except the logs of topics whose deletion the control plane recorded: a log of an unknown
        topic means the metadata file was lost, and the topic is rebuilt from its logs."""
        deleting = self.control_plane.deleting_topic_ids
        orphans: dict[str, list[Log]] = defaultdict(list)
        for log_ in self.log_manager.all_logs():
            known = topics.get(log_.topic)
            if known is not None:
                if log_.partition >= len(known.partitions):
                    log.warning(
                        "keeping a log beyond its topic's partition count, unserved",
                        extra={"log": log_.dir.name, "partitions": len(known.partitions)},
                    )
                continue
            if log_.topic_id is not None and log_.topic_id in deleting:
                # Deleted just before a crash: finish the deletion.
                self.log_manager.delete_logs(self.log_manager.unregister_logs([(log_.topic, log_.partition)]))
                continue
            orphans[log_.topic].append(log_)
        for name, logs in sorted(orphans.items()):
            self._rebuild_topic(name, logs)
        if orphans or deleting:
            max_producer_id = max(
                (pid for log_ in self.log_manager.all_logs() for pid in log_.producer_state.active_producers),
                default=-1,
            )
            self.control_plane.reserve_producer_ids_above(max_producer_id, PRODUCER_ID_BLOCK_SIZE)
            self.control_plane.clear_deleting()
            self.control_plane.write_now()
        elif self.control_plane.lost:
            self.control_plane.write_now()

    def _rebuild_topic(self, name: str, logs: list[Log]) -> None:
        """A topic with logs but no entry in the control plane: rebuild it from the logs' names and
        their partition.metadata topic ids. A log that does not fit (an illegal name, another
        topic id) is moved aside, never deleted."""
        ids = Counter(log_.topic_id for log_ in logs if log_.topic_id is not None)
        topic_id = ids.most_common(1)[0][0] if ids else None
        try:
            validate_topic_name(name)
        except InvalidTopicError as e:
            for log_ in logs:
                self._move_aside(log_, str(e))
            return
        if topic_id is not None and self.control_plane.image.topic_by_id(topic_id) is not None:
            for log_ in logs:
                self._move_aside(log_, f"its topic id {topic_id} belongs to another topic")
            return
        if topic_id is None:
            topic_id = self.control_plane.new_topic_id()
        kept = []
        for log_ in logs:
            if log_.topic_id is not None and log_.topic_id != topic_id:
                self._move_aside(log_, f"topic id {log_.topic_id}, not {topic_id} as the other partitions")
            else:
                if log_.topic_id is None:
                    self.log_manager.assign_topic_id(log_, topic_id)
                kept.append(log_)
        if not kept:
            return
        configs = self._offsets_topic_configs() if name == OFFSETS_TOPIC else {}
        num_partitions = max(log_.partition for log_ in kept) + 1
        topic = TopicState(
            name=name,
            topic_id=topic_id,
            partitions=[self.control_plane.new_partition(p) for p in range(num_partitions)],
            configs=configs,
        )
        self.control_plane.rebuild_topic(topic)
        config = self.log_config(topic)
        for log_ in kept:
            log_.update_config(config)
        log.warning(
            "rebuilt a topic missing from the control plane's metadata from its logs; its configs are "
            "the defaults (configs set on it were only in the lost metadata file)"
            + (" except the internal topic's own" if configs else ""),
            extra={
                "topic": name,
                "topic_id": str(topic_id),
                "partitions": num_partitions,
                "logs_found": sorted(log_.partition for log_ in kept),
            },
        )

    def _move_aside(self, log_: Log, reason: str) -> None:
        self.log_manager.unregister_logs([(log_.topic, log_.partition)])
        self.log_manager.move_aside(log_, reason)

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.group_coordinator.shutdown()
        self.replica_manager.wake_all_fetchers()
        # Admin operations in flight finish (or fail) before the logs close.
        async with self._admin_lock:
            if self._storage_loaded:
                await asyncio.get_running_loop().run_in_executor(None, self.log_manager.shutdown)
                self._storage_loaded = False
            self.control_plane.close()
        await self.dynamic_config.store.close()
        log.info("broker stopped", extra={"node_id": self.node_id})

    async def _every(self, interval_ms: int, job: object) -> None:
        assert callable(job)
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await job()
            except Exception:
                log.exception("background job failed", extra={"job": getattr(job, "__name__", "?")})

    def _idle_check_interval_ms(self) -> int:
        return max(50, min(self.config.connections_max_idle_ms // 4, 30_000))

    async def _close_idle_connections(self) -> None:
        """Kafka's connections.max.idle.ms: a connection without traffic for that long is closed."""
        limit = self.config.connections_max_idle_ms / 1000
        now = time.monotonic()
        for connection in list(self._connections):
            if connection.idle_since(now) > limit:
                log.debug("closing idle connection", extra={"peer": connection.peer})
                connection.close()

    async def _retention(self) -> None:
        deleted = self.log_manager.cleanup_logs()
        if deleted:
            log.info("retention deleted segments", extra={"segments": deleted})
        # Retention and DeleteRecords only rename segment files; unlinking them is slow.
        await asyncio.get_running_loop().run_in_executor(None, self.log_manager.delete_pending_files)

    async def _expire_group_offsets(self) -> None:
        self.group_coordinator.expire_offsets()

    async def _flush(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.log_manager.flush_dirty_logs)

    async def _checkpoint(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.log_manager.checkpoint)

    async def _clean_logs(self) -> None:
        """Compaction: the cleaner reads and writes segments in worker threads, swaps them in here."""
        await self.log_manager.clean_logs()

    def advertised_endpoint(self) -> tuple[str, int]:
        """The host and port clients are told to connect to (advertised.listeners, else listeners)."""
        listener = self.config.advertised_client_listener()
        host = listener.host or socket.getfqdn()
        port = listener.port or (self.bound_ports[0] if self.bound_ports else 0)
        return host, port

    # -- topic management (the embedded controller's operations) -----------------------------
    #
    # One at a time (Kafka's controller is single-threaded too): each persists the control plane's
    # change, does the file work in a worker thread and only then changes what clients see. The
    # event loop keeps serving meanwhile. A failed write raises KafkaStorageError, changing nothing.

    async def _create_topic(self, name: str, num_partitions: int, configs: Mapping[str, str]) -> TopicState:
        async with self._admin_lock:
            topic = await self._stage_and_create_logs(
                self.control_plane.new_topic(name, num_partitions, configs)
            )
        log.info("created topic", extra={"topic": name, "partitions": num_partitions})
        return topic

    async def _admin(self, operation: Coroutine[Any, Any, T]) -> T:
        """Run an admin operation to its end even if the requesting client goes away: a half-done
        change (metadata written, logs not yet created) must not be left behind by a cancellation."""
        task = asyncio.ensure_future(operation)
        self._admin_tasks.add(task)
        task.add_done_callback(self._admin_done)
        return await asyncio.shield(task)

    def _admin_done(self, task: asyncio.Future[Any]) -> None:
        self._admin_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Also retrieves it: the requester may be gone, and its handler answers the error.
            log.debug("admin operation failed", extra={"error": str(task.exception())})

    async def create_topic(self, name: str, num_partitions: int, configs: Mapping[str, str]) -> TopicState:
        return await self._admin(self._create_topic(name, num_partitions, configs))

    async def delete_topic(self, name: str) -> TopicState | None:
        return await self._admin(self._delete_topic(name))

    async def create_partitions(self, name: str, total: int) -> TopicState:
        return await self._admin(self._create_partitions(name, total))

    async def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicState:
        return await self._admin(self._set_topic_configs(name, configs))

    def _offsets_topic_configs(self) -> dict[str, str]:
        return {
            "cleanup.policy": "compact",
            "compression.type": "producer",
            "segment.bytes": str(self.config.offsets_topic_segment_bytes),
        }

    async def ensure_offsets_topic(self) -> None:
        """Create ``__consumer_offsets`` on first use, compacted, as Kafka does."""
        if self.control_plane.image.topic(OFFSETS_TOPIC) is not None:
            return
        with contextlib.suppress(TopicExistsError):  # created meanwhile
            await self.create_topic(
                OFFSETS_TOPIC, self.config.offsets_topic_num_partitions, self._offsets_topic_configs()
            )

    async def prepare_offsets_topic(self) -> None:
        """Before a group request (JoinGroup, OffsetCommit): create ``__consumer_offsets`` if needed.
        A failure is logged; the coordinator then answers COORDINATOR_NOT_AVAILABLE."""
        try:
            await self.ensure_offsets_topic()
        except StorageError as e:
            log.error("cannot create the offsets topic", extra={"error": str(e)})

    def _request_offsets_topic(self) -> None:
        """For the group coordinator's synchronous paths: start creating ``__consumer_offsets`` if it
        does not exist. Until it does, the coordinator answers COORDINATOR_NOT_AVAILABLE (as Kafka
        does while it creates the topic) and clients retry. FindCoordinator, JoinGroup and
        OffsetCommit await the creation first, so this is only a fallback."""
        if self.control_plane.image.topic(OFFSETS_TOPIC) is not None or self._offsets_topic_task is not None:
            return
        task = asyncio.get_running_loop().create_task(self.ensure_offsets_topic())

        def done(t: asyncio.Task[None]) -> None:
            self._offsets_topic_task = None
            if not t.cancelled() and t.exception() is not None:
                log.error("cannot create the offsets topic", extra={"error": str(t.exception())})

        task.add_done_callback(done)
        self._offsets_topic_task = task

    async def auto_create_topic(self, name: str) -> TopicState:
        if name == OFFSETS_TOPIC:
            # An internal topic is created with its own layout, never with the defaults of user topics.
            await self.ensure_offsets_topic()
        else:
            with contextlib.suppress(TopicExistsError):  # created meanwhile by another request
                return await self.create_topic(name, self.config.num_partitions, {})
        topic = self.control_plane.image.topic(name)
        if topic is None:
            raise KafkaStorageError(f"topic {name} could not be created")
        return topic

    async def _delete_topic(self, name: str) -> TopicState | None:
        async with self._admin_lock:
            topic = await self.control_plane.stage_removal(name)
            if topic is None:
                return None
            self.control_plane.apply(name)
            self.group_coordinator.on_topic_deleted(name)
            await self.replica_manager.stop_replicas(topic)
            await self.control_plane.finish_deletion([topic.topic_id])
        log.info("deleted topic", extra={"topic": name})
        return topic

    async def _create_partitions(self, name: str, total: int) -> TopicState:
        async with self._admin_lock:
            return await self._stage_and_create_logs(self.control_plane.with_partitions(name, total))

    async def _stage_and_create_logs(self, topic: TopicState) -> TopicState:
        # The metadata first: a crash before the logs exist recreates them at startup.
        await self.control_plane.stage(topic)
        try:
            await self.replica_manager.create_partitions(topic)
        except BaseException:
            await self.control_plane.abort(topic.name)
            raise
        self.control_plane.apply(topic.name)
        return topic

    async def _set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicState:
        async with self._admin_lock:
            topic = self.control_plane.with_configs(name, configs)
            await self.control_plane.stage(topic)
            self.control_plane.apply(name)
            self.replica_manager.update_config(topic)
        return topic
