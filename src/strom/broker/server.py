"""The broker process: storage, control plane, replica manager, listeners and schedulers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from strom.broker.cluster.local import LocalControlPlane
from strom.broker.cluster.metadata import TopicState
from strom.broker.config import KafkaConfig
from strom.broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from strom.broker.coordinator.group_metadata_manager import OFFSETS_TOPIC, GroupMetadataManager
from strom.broker.dispatcher import RequestDispatcher
from strom.broker.handlers import HANDLERS
from strom.broker.network import KafkaConnection
from strom.broker.replica_manager import ReplicaManager
from strom.storage import LogConfig, LogManager

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK_SIZE = 1000


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
            self._ensure_offsets_topic,
        )
        self._dispatcher = RequestDispatcher(self, HANDLERS)
        self._servers: list[asyncio.Server] = []
        self._connections: set[KafkaConnection] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.bound_ports: list[int] = []

    @property
    def cluster_id(self) -> str:
        return self.control_plane.cluster_id

    def log_config(self, topic: TopicState) -> LogConfig:
        return LogConfig.from_props(topic.configs, self.config.log_config_defaults())

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.control_plane.load()
        topics = {t.name: t for t in self.control_plane.image.topics()}
        await loop.run_in_executor(
            None,
            lambda: self.log_manager.startup(
                lambda name: self.log_config(topics[name]) if name in topics else LogConfig()
            ),
        )
        for topic in topics.values():
            self.replica_manager.become_leader(topic)
        for orphan in self.log_manager.all_logs():
            if orphan.topic not in topics:
                # A topic deleted from the control plane just before a crash: finish the deletion.
                log.warning("deleting the log of an unknown topic", extra={"log": str(orphan.dir)})
                self.log_manager.delete_log(orphan.topic, orphan.partition)
        self.group_coordinator.startup()
        max_request = self.config.socket_request_max_bytes
        for listener in self.config.client_listeners():
            server = await loop.create_server(
                lambda: KafkaConnection(self._dispatcher.handle, max_request, self._connections),
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
        await asyncio.get_running_loop().run_in_executor(None, self.log_manager.shutdown)
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

    def create_topic(self, name: str, num_partitions: int, configs: Mapping[str, str]) -> TopicState:
        topic = self.control_plane.create_topic(name, num_partitions, configs)
        self.replica_manager.become_leader(topic)
        log.info("created topic", extra={"topic": name, "partitions": num_partitions})
        return topic

    def _ensure_offsets_topic(self) -> None:
        """Create ``__consumer_offsets`` on first use, compacted, as Kafka does."""
        if self.control_plane.image.topic(OFFSETS_TOPIC) is None:
            self.create_topic(
                OFFSETS_TOPIC,
                self.config.offsets_topic_num_partitions,
                {
                    "cleanup.policy": "compact",
                    "compression.type": "producer",
                    "segment.bytes": str(self.config.offsets_topic_segment_bytes),
                },
            )

    def auto_create_topic(self, name: str) -> TopicState:
        if name == OFFSETS_TOPIC:
            # An internal topic is created with its own layout, never with the defaults of user topics.
            self._ensure_offsets_topic()
            topic = self.control_plane.image.topic(name)
            assert topic is not None
            return topic
        return self.create_topic(name, self.config.num_partitions, {})

    def delete_topic(self, name: str) -> TopicState | None:
        topic = self.control_plane.delete_topic(name)
        if topic is not None:
            self.replica_manager.stop_replicas(topic)
            self.group_coordinator.on_topic_deleted(name)
            log.info("deleted topic", extra={"topic": name})
        return topic

    def create_partitions(self, name: str, total: int) -> TopicState:
        topic = self.control_plane.create_partitions(name, total)
        self.replica_manager.become_leader(topic)
        return topic

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicState:
        topic = self.control_plane.set_topic_configs(name, configs)
        self.replica_manager.update_config(topic)
        return topic
