"""The broker process: storage, control plane, replica manager, listeners and schedulers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from strom.broker import heap
from strom.broker.config import KafkaConfig
from strom.broker.control_plane.assignment import InvalidReplicationFactorError
from strom.broker.control_plane.controller import Controller, request_controlled_shutdown
from strom.broker.control_plane.local import (
    InvalidTopicError,
    LocalControlPlane,
    TopicExistsError,
    validate_topic_name,
)
from strom.broker.control_plane.metadata import TopicState
from strom.broker.control_plane.plane import (
    ADMIN_TIMEOUT_MS,
    ControlPlane,
    CoordinatorUnavailableError,
    LeaderNotAvailableError,
    MetadataWaitTimeout,
)
from strom.broker.control_plane.zookeeper import NO_STATE_EPOCH, ZkControlPlane
from strom.broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from strom.broker.coordinator.group_metadata_manager import OFFSETS_TOPIC, GroupMetadataManager
from strom.broker.dispatcher import RequestDispatcher
from strom.broker.dynamic_config import (
    DynamicBrokerConfig,
    DynamicBrokerConfigStore,
    LocalDynamicConfigStore,
    ZkDynamicConfigStore,
)
from strom.broker.fetch_session import FetchSessionCache
from strom.broker.handlers import HANDLERS
from strom.broker.metrics.service import BrokerMetrics
from strom.broker.metrics.stats import ListenerStats, RequestStats
from strom.broker.network import ConnectionQuotas, KafkaConnection, NetworkLimits, RequestMemory
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager, ReplicationConfig
from strom.broker.transaction.coordinator import TransactionConfig, TransactionCoordinator
from strom.broker.transaction.markers import TransactionMarkerChannel
from strom.broker.transaction.state_manager import TRANSACTION_STATE_TOPIC, TransactionStateManager
from strom.broker.transaction.verification import TransactionVerifier
from strom.storage import KafkaStorageError, LogConfig, LogManager, StorageError, UnifiedLog
from strom.storage.checkpoint import TOPIC_CONFIGS, TopicConfigsFile
from strom.storage.file_cache import default_max_open, file_cache

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK_SIZE = 1000
# How long Metadata's auto-creation of a topic waits for its leaders in a cluster.
AUTO_CREATE_WAIT_MS = 3_000

T = TypeVar("T")


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit and return it: the broker keeps a descriptor
    per active segment and caches others up to three quarters of the limit (storage/file_cache.py),
    and the usual soft limit is 1,024."""
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
    # The segment and index descriptor cache takes its share of the new limit.
    file_cache().max_open = default_max_open()
    log.info(
        "open file limit (RLIMIT_NOFILE)",
        extra={"soft": soft, "hard": hard, "cached_files": file_cache().max_open},
    )
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
    """Hands out producer ids from blocks reserved durably in the control plane (a file on a
    single node, /latest_producer_id_block in a cluster)."""

    def __init__(self, allocate_block: Callable[[], Awaitable[range]]) -> None:
        self._allocate_block = allocate_block
        self._block = range(0)
        self._next = 0
        self._lock = asyncio.Lock()

    async def generate(self) -> int:
        async with self._lock:  # one block at a time: concurrent requests would each take one
            if self._next >= self._block.stop:
                self._block = await self._allocate_block()
                self._next = self._block.start
            producer_id = self._next
            self._next += 1
            return producer_id


class BrokerServer:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        log_dirs = [Path(d) for d in config.log_dirs]
        # Without zookeeper.connect the broker is a cluster of one with its embedded control plane.
        self.zk_plane: ZkControlPlane | None = None
        self._local: LocalControlPlane | None = None
        self.control_plane: ControlPlane
        # Dynamic broker configs (AlterConfigs on the BROKER resource): in ZooKeeper's
        # /config/brokers in a cluster, else beside the local metadata file.
        store: DynamicBrokerConfigStore
        if config.in_cluster:
            zk_plane = self.zk_plane = self.control_plane = ZkControlPlane(
                config, log_dirs, self._topic_changed, self._brokers_changed, self._leads_its_partitions
            )
            self.producer_ids = ProducerIdManager(zk_plane.allocate_producer_id_block)
            store = ZkDynamicConfigStore(lambda: zk_plane.zk)
        else:
            self._local = self.control_plane = LocalControlPlane(
                log_dirs, self.node_id, self.advertised_endpoint
            )
            self._local.attach(self)
            self.producer_ids = ProducerIdManager(self._allocate_local_producer_ids)
            store = LocalDynamicConfigStore(log_dirs[0])
        self.dynamic_config = DynamicBrokerConfig(self, store)
        self.log_manager = LogManager(log_dirs)
        # KIP-227 incremental fetch sessions of followers and consumers fetching from this broker.
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots)
        self.replica_manager = ReplicaManager(
            self.log_manager,
            self.log_config,
            node_id=self.node_id,
            link=self.zk_plane,
            replication=ReplicationConfig.from_kafka_config(config),
            fetch_sessions=self.fetch_sessions,
        )
        # A cluster's controller (the broker contends for /controller) and the topics this broker
        # applied (their partitions' states are the replica manager's).
        self.controller: Controller | None = None
        self._hosted: dict[str, TopicState] = {}
        # Topics whose znode could not be read at startup, whose logs were kept unplaced.
        self._withheld_at_startup: set[str] = set()
        self._dirty_topics: set[str] = set()
        self._dirty = asyncio.Event()
        self._cluster_ready = False
        group_metadata = GroupMetadataManager(
            self.replica_manager,
            config.offsets_topic_num_partitions,
            commit_timeout_ms=config.offsets_commit_timeout_ms,
        )
        self.group_coordinator = GroupCoordinator(
            GroupConfig(
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                max_size=config.group_max_size,
                offsets_retention_ms=config.offsets_retention_minutes * 60_000,
                offset_metadata_max_bytes=config.offset_metadata_max_bytes,
            ),
            group_metadata,
            self._request_offsets_topic,
            # In a cluster the coordinator owns the groups of the offsets partitions this broker leads.
            follows_leadership=config.in_cluster,
        )
        # The transaction coordinator loads its partitions with the group coordinator's loader.
        markers = TransactionMarkerChannel(
            self.node_id,
            self.replica_manager,
            self.group_coordinator,
            self.replica_manager.peer_endpoint,
            request_timeout_ms=config.request_timeout_ms,
        )
        self.transaction_coordinator = TransactionCoordinator(
            TransactionConfig(
                max_timeout_ms=config.transaction_max_timeout_ms,
                id_expiration_ms=config.transactional_id_expiration_ms,
            ),
            TransactionStateManager(
                self.replica_manager,
                config.transaction_state_log_num_partitions,
                group_metadata.loader,
                write_timeout_ms=config.request_timeout_ms,
            ),
            markers,
            self.producer_ids.generate,
            self._leader_of,
            follows_leadership=config.in_cluster,
        )
        self.transaction_verifier = TransactionVerifier(
            self.node_id, self.transaction_coordinator, markers, self._transaction_coordinator_of
        )
        self._transaction_topic_lock = asyncio.Lock()
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
        # Request and connection metrics, counted whether or not metrics.listener serves them.
        self.request_stats: Callable[[], list[RequestStats]] = self._dispatcher.request_stats
        self.listener_stats = [ListenerStats(listener.name) for listener in config.client_listeners()]
        # metrics.listener's registry and endpoint, when it is set (strom.broker.metrics).
        self.metrics: BrokerMetrics | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.bound_ports: list[int] = []
        self._bound_port_of: dict[str, int] = {}  # listener name -> its bound port
        self._offsets_topic_task: asyncio.Task[None] | None = None
        # Deleted topics' offsets being tombstoned (they wait for the ISR).
        self._deletions: set[asyncio.Future[Any]] = set()
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
            if self.zk_plane is not None:
                await self.zk_plane.start()
            await self.dynamic_config.load()
            await self._load_storage()
        except BaseException:
            # Storage half loaded: writing checkpoints now could lose entries of unloaded logs.
            self.log_manager.unlock_log_dirs()
            await self._close_control_plane()
            raise
        self._storage_loaded = True
        heap.freeze()  # the loaded logs live as long as the broker
        loop = asyncio.get_running_loop()
        self.group_coordinator.startup()
        if self.zk_plane is None:
            self._lead_transaction_log()
        if self.config.metrics_listener is not None:
            # Before the Kafka listeners: once a client can connect, the metrics can be scraped.
            self.metrics = BrokerMetrics(self)
            await self.metrics.start(*self.config.metrics_listener)
        listeners = self.config.client_listeners()
        for listener, listener_stats in zip(listeners, self.listener_stats, strict=True):
            protected = len(listeners) > 1 and listener.name == self.config.inter_broker_listener_name
            server = await loop.create_server(
                lambda protected=protected, stats=listener_stats: KafkaConnection(
                    self._dispatcher.handle, self.network, protected=protected, listener=stats
                ),
                host=listener.host or None,
                port=listener.port,
                reuse_address=True,
                backlog=1024,
            )
            self._servers.append(server)
            self._bound_port_of[listener.name] = server.sockets[0].getsockname()[1]
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
            loop.create_task(self._every(heap.FREEZE_INTERVAL_MS, self._freeze_heap)),
            loop.create_task(self._every(heap.FULL_COLLECTION_INTERVAL_MS, self._collect_heap)),
            loop.create_task(
                self._every(self.config.offsets_retention_check_interval_ms, self._expire_group_offsets)
            ),
            loop.create_task(
                self._every(self.config.transaction_abort_timed_out_interval_ms, self._abort_timed_out_transactions)
            ),
            loop.create_task(
                self._every(self.config.transaction_remove_expired_interval_ms, self._remove_expired_transactions)
            ),
        ]
        if self.config.log_cleaner_enable:
            self.log_manager.start_cleaner(self.config.cleaner_config)
            self._tasks.append(
                loop.create_task(self._every(self.config.cleaner_config.backoff_ms, self._clean_logs))
            )
        await self.replica_manager.start()
        if self.zk_plane is not None:
            # The coordinator owns the groups of the offsets partitions this broker leads.
            self.replica_manager.add_leadership_listener(self.group_coordinator)
            self.replica_manager.add_leadership_listener(self.transaction_coordinator)
            await self._join_cluster(self.zk_plane)
        log.info(
            "broker started",
            extra={"node_id": self.node_id, "ports": self.bound_ports, "cluster_id": self.cluster_id},
        )

    async def _load_storage(self) -> None:
        """Load the control plane and every log, and reconcile them (in a worker thread)."""
        await asyncio.get_running_loop().run_in_executor(None, self._load_storage_blocking)

    def _load_storage_blocking(self) -> None:
        if self.zk_plane is not None:
            self._load_cluster_storage_blocking(self.zk_plane)
            return
        self.local_plane.load()
        topics = {t.name: t for t in self.control_plane.image.topics()}
        self.log_manager.startup(
            lambda name: self.log_config(topics[name]) if name in topics else LogConfig(),
            {name: topic.topic_id for name, topic in topics.items()},
        )
        self._reconcile_logs(topics)
        for topic in self.control_plane.image.topics():
            self.replica_manager.lead_on_single_node(topic)

    def _reconcile_logs(self, topics: Mapping[str, TopicState]) -> None:
        """Place every loaded log that the control plane does not know. Nothing is deleted here
        except the logs of topics whose deletion the control plane recorded: a log of an unknown
        topic means the metadata file was lost, and the topic is rebuilt from its logs."""
        deleting = self.local_plane.deleting_topic_ids
        orphans: dict[str, list[UnifiedLog]] = defaultdict(list)
        for log_ in self.log_manager.all_logs():
            known = topics.get(log_.topic)
            if known is not None:
                if log_.partition >= len(known.partitions):
                    log.warning(
                        "keeping a log beyond its topic's partition count, unserved",
                        extra={"log": log_.dir.name, "partitions": len(known.partitions)},
                    )
                self._copy_topic_configs(log_, known, only_if_stale=True)
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
            self.local_plane.reserve_producer_ids_above(max_producer_id, PRODUCER_ID_BLOCK_SIZE)
            self.local_plane.clear_deleting()
            self.local_plane.write_now()
        elif self.local_plane.lost:
            self.local_plane.write_now()

    def _rebuild_topic(self, name: str, logs: list[UnifiedLog]) -> None:
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
            topic_id = self.local_plane.new_topic_id()
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
        copied, problem = self._read_topic_configs(kept, topic_id)
        if copied is not None:
            configs = copied
        elif name == OFFSETS_TOPIC:
            configs = self._offsets_topic_configs()
        else:
            configs = {}
        num_partitions = max(log_.partition for log_ in kept) + 1
        topic = TopicState(
            name=name,
            topic_id=topic_id,
            partitions=[self.local_plane.new_partition(p) for p in range(num_partitions)],
            configs=configs,
        )
        self.local_plane.rebuild_topic(topic)
        config = self.log_config(topic)
        for log_ in kept:
            log_.update_config(config)
        extra = {
            "topic": name,
            "topic_id": str(topic_id),
            "partitions": num_partitions,
            "logs_found": sorted(log_.partition for log_ in kept),
        }
        if copied is not None:
            log.warning(
                "rebuilt a topic missing from the control plane's metadata from its logs, with the "
                "configs copied in its partition directories",
                extra={**extra, "configs": configs},
            )
            return
        if name != OFFSETS_TOPIC:
            # The defaults could delete what the lost configs kept (a compacted topic would get
            # 7 days' retention): nothing is deleted until an operator says which configs hold.
            self.log_manager.held_topics.add(name)
        log.error(
            f"rebuilt topic {name} from its logs without its configs ({problem}); "
            + (
                "it has the internal topic's own configs"
                if name == OFFSETS_TOPIC
                else "retention and compaction of the topic are held until an operator sets its "
                "configs: kafka-configs.sh --alter --entity-type topics --entity-name "
                f"{name} with --add-config (its real configs) or --delete-config cleanup.policy "
                "(to confirm the defaults)"
            ),
            extra=extra,
        )

    @staticmethod
    def _read_topic_configs(logs: list[UnifiedLog], topic_id: uuid.UUID) -> tuple[dict[str, str] | None, str]:
        """The configs every partition directory's copy agrees on, else None and why not."""
        found: list[dict[str, str]] = []
        for log_ in logs:
            try:
                copy = TopicConfigsFile(log_.dir / TOPIC_CONFIGS).read()
            except KafkaStorageError as e:
                return None, str(e)
            if copy is None:
                return None, f"{log_.dir.name} has no {TOPIC_CONFIGS}"
            if copy[0] != topic_id:
                return None, f"the {TOPIC_CONFIGS} of {log_.dir.name} names topic id {copy[0]}"
            found.append(copy[1])
        if any(configs != found[0] for configs in found):
            return None, f"the {TOPIC_CONFIGS} copies of its partitions differ"
        return found[0], ""

    def _copy_topic_configs(
        self, log_: UnifiedLog, topic: TopicState, *, only_if_stale: bool = False
    ) -> None:
        """Keep the copy of the topic's configs in the log's directory current (blocking). A failed
        write costs only the copy: it is logged, and written again at the next change or start."""
        copy = TopicConfigsFile(log_.dir / TOPIC_CONFIGS)
        try:
            if only_if_stale and copy.read() == (topic.topic_id, dict(topic.configs)):
                return
            copy.write(topic.topic_id, dict(topic.configs))
        except (OSError, KafkaStorageError) as e:
            log.error(
                "cannot write the copy of a topic's configs", extra={"log": log_.dir.name, "error": str(e)}
            )

    async def _copy_topic_configs_of(self, topic: TopicState) -> None:
        logs = [log_ for log_ in self.log_manager.all_logs() if log_.topic == topic.name]

        def copy_all() -> None:
            for log_ in logs:
                self._copy_topic_configs(log_, topic)

        await asyncio.get_running_loop().run_in_executor(None, copy_all)

    def _load_cluster_storage_blocking(self, cluster: ZkControlPlane) -> None:
        """Load the logs; those ZooKeeper does not know for this broker are moved aside. The
        partitions are hosted later, as the broker applies their states (``_apply_topic``)."""
        topics = {t.name: t for t in cluster.image.topics()}

        def config_for(name: str) -> LogConfig:
            if name in topics:
                return self.log_config(topics[name])
            # A withheld topic's logs keep their configs (a compacted one is not retention-deleted).
            return LogConfig.from_props(cluster.topic_configs(name), self.config.log_config_defaults())

        self.log_manager.startup(config_for, {name: topic.topic_id for name, topic in topics.items()})
        for log_ in self.log_manager.all_logs():
            known = topics.get(log_.topic)
            if known is None and cluster.is_withheld(log_.topic):
                # Its znode is unreadable or awaits a topic id: unknown is not deleted, so the log
                # stays (unserved) until the topic reads well (``_place_withheld_logs``).
                log.warning(
                    "keeping the log of a topic whose znode cannot be read yet, unserved",
                    extra={"log": log_.dir.name},
                )
                self._withheld_at_startup.add(log_.topic)
            elif known is None:
                self._move_aside(log_, "its topic does not exist in the cluster")
            elif log_.topic_id is not None and log_.topic_id != known.topic_id:
                self._move_aside(log_, f"topic id {log_.topic_id}, not the cluster's {known.topic_id}")
            elif log_.partition >= len(known.partitions):
                self._move_aside(log_, f"its topic has {len(known.partitions)} partitions")
            elif self.node_id not in known.partitions[log_.partition].replicas:
                self._move_aside(log_, "this broker is not among the partition's replicas")
            elif log_.topic_id is None:
                self.log_manager.assign_topic_id(log_, known.topic_id)

    async def _place_withheld_logs(self, topic: TopicState) -> None:
        """The logs kept at startup for ``topic`` while its znode could not be read, now that it
        reads well: placed as at startup (a log of another topic id was an earlier topic's: kept
        aside, never served as this one's)."""
        aside: list[tuple[UnifiedLog, str]] = []
        unidentified: list[UnifiedLog] = []
        for log_ in self.log_manager.all_logs():
            if log_.topic != topic.name:
                continue
            if log_.topic_id is not None and log_.topic_id != topic.topic_id:
                aside.append((log_, f"topic id {log_.topic_id}, not the cluster's {topic.topic_id}"))
            elif log_.partition >= len(topic.partitions):
                aside.append((log_, f"its topic has {len(topic.partitions)} partitions"))
            elif self.node_id not in topic.partitions[log_.partition].replicas:
                aside.append((log_, "this broker is not among the partition's replicas"))
            elif log_.topic_id is None:
                unidentified.append(log_)
        # Out of the broker here, on the loop; the files are renamed and written in a worker.
        self.log_manager.unregister_logs([(log_.topic, log_.partition) for log_, _ in aside])

        def place() -> None:
            for log_, reason in aside:
                self.log_manager.move_aside(log_, reason)
            for log_ in unidentified:
                self.log_manager.assign_topic_id(log_, topic.topic_id)

        await asyncio.get_running_loop().run_in_executor(None, place)

    def _move_aside(self, log_: UnifiedLog, reason: str) -> None:
        self.log_manager.unregister_logs([(log_.topic, log_.partition)])
        self.log_manager.move_aside(log_, reason)

    async def stop(self) -> None:
        if self.metrics is not None:
            await self.metrics.stop()
            self.metrics = None
        if self.zk_plane is not None and self._cluster_ready:
            await self._leave_cluster()
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.transaction_coordinator.shutdown()
        self.group_coordinator.shutdown()
        if self.zk_plane is not None:
            # Deregisters: the controller moves on without this broker.
            await self._bounded(
                self.zk_plane.close(),
                max(self.config.controller_socket_timeout_ms, 0) / 1000,
                "leaving ZooKeeper",
            )
        await self.replica_manager.shutdown()
        self.replica_manager.wake_all_fetchers()
        # Admin operations in flight finish (or fail) before the logs close; later ones fail.
        await self.control_plane.stop_admin()
        if self._storage_loaded:
            await asyncio.get_running_loop().run_in_executor(None, self.log_manager.shutdown)
            self._storage_loaded = False
        await self.dynamic_config.store.close()
        await self._close_control_plane()
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
        """Kafka's connections.max.idle.ms: a connection without traffic for that long is closed
        (a negative value, as in Kafka's selector, closes none)."""
        limit = self.config.connections_max_idle_ms / 1000
        if limit < 0:
            return
        now = time.monotonic()
        for connection in list(self._connections):
            if connection.idle_since(now) > limit:
                log.debug("closing idle connection", extra={"peer": connection.peer})
                connection.close()

    async def _retention(self) -> None:
        deleted = self.log_manager.cleanup_logs()
        if deleted:
            log.info("retention deleted segments", extra={"segments": deleted})
        self.replica_manager.report_log_start_offsets()
        # Retention and DeleteRecords only rename segment files; unlinking them is slow.
        await asyncio.get_running_loop().run_in_executor(None, self.log_manager.delete_pending_files)

    async def _freeze_heap(self) -> None:
        heap.freeze()

    async def _collect_heap(self) -> None:
        heap.full_collection()

    async def _expire_group_offsets(self) -> None:
        await self.group_coordinator.expire_offsets()

    async def _abort_timed_out_transactions(self) -> None:
        self.transaction_coordinator.abort_timed_out_transactions()

    async def _remove_expired_transactions(self) -> None:
        await self.transaction_coordinator.remove_expired_transactional_ids()

    async def _flush(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.log_manager.flush_dirty_logs)

    async def _checkpoint(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.log_manager.checkpoint)

    async def _clean_logs(self) -> None:
        """Compaction: the cleaner reads and writes segments in worker threads, swaps them in here."""
        await self.log_manager.clean_logs()

    def _advertised_endpoints(self) -> list[tuple[str, str, int]]:
        """(listener name, host, port) of every advertised listener, clients' first: what the
        broker registers (peers connect to the inter-broker listener's)."""
        return [
            (
                listener.name,
                listener.host or socket.getfqdn(),
                listener.port or self._bound_port_of.get(listener.name, 0),
            )
            for listener in self.config.advertised_listeners
        ]

    def advertised_endpoint(self) -> tuple[str, int]:
        """The host and port clients are told to connect to (advertised.listeners, else listeners)."""
        listener = self.config.advertised_client_listener()
        host = listener.host or socket.getfqdn()
        port = listener.port or (self.bound_ports[0] if self.bound_ports else 0)
        return host, port

    # -- control planes ------------------------------------------------------------------------

    @property
    def local_plane(self) -> LocalControlPlane:
        """The single node's embedded control plane (never in a cluster)."""
        assert self._local is not None, "a cluster broker has no local control plane"
        return self._local

    async def _close_control_plane(self) -> None:
        if self.zk_plane is not None:
            await self.zk_plane.close()
        else:
            self.local_plane.close()

    async def _allocate_local_producer_ids(self) -> range:
        # Synchronous, as it always was: once per block, the write queues behind any other.
        return self.local_plane.allocate_producer_id_block(PRODUCER_ID_BLOCK_SIZE)

    # -- cluster membership (zookeeper.connect set) -------------------------------------------

    async def _join_cluster(self, cluster: ZkControlPlane) -> None:
        """Once the broker listens: register, contend for the controller, host the partitions
        ZooKeeper assigns to this broker (and follow every later change of their states)."""
        await cluster.register(cluster.registration(self._advertised_endpoints()))
        self._tasks.append(asyncio.get_running_loop().create_task(self._apply_cluster_changes(cluster)))
        for topic in cluster.image.topics():
            self._topic_changed(topic.name)
        self.controller = Controller(cluster.zk, self.node_id, self.config)
        await self.controller.start()
        self._cluster_ready = True

    async def _leave_cluster(self) -> None:
        """Kafka's controlled shutdown: ask the controller to move leadership off this broker,
        then stop contending for the controller. As Kafka: at most controlled.shutdown.max.retries
        attempts, each bounded by controller.socket.timeout.ms (ZooKeeper calls included: an
        unreachable ZooKeeper or controller costs one timeout), controlled.shutdown.retry.backoff.ms
        apart; then the broker stops anyway."""
        assert self.zk_plane is not None
        self._cluster_ready = False
        timeout_s = max(self.config.controller_socket_timeout_ms, 0) / 1000
        if self.config.controlled_shutdown_enable and self.controller is not None:
            zk = self.zk_plane.zk
            # Stop following first (Kafka's controller sends the leaving broker StopReplica): a
            # follower that fetched on would be taken back into an ISR the controller just left.
            if self.replica_manager.fetchers is not None:
                await self._bounded(self.replica_manager.fetchers.shutdown(), timeout_s, "stopping fetchers")
            done = False
            for attempt in range(1, self.config.controlled_shutdown_max_retries + 1):
                if attempt > 1:
                    await asyncio.sleep(max(self.config.controlled_shutdown_retry_backoff_ms, 0) / 1000)
                try:
                    done = await asyncio.wait_for(
                        request_controlled_shutdown(zk, self.node_id, timeout_s), timeout_s
                    )
                except Exception as e:  # a timeout, ZooKeeper unreachable, ...
                    log.warning("controlled shutdown failed", extra={"attempt": attempt, "error": repr(e)})
                if done:
                    break
            if not done:
                log.warning("controlled shutdown did not complete; shutting down anyway")
        if self.controller is not None:
            await self._bounded(self.controller.stop(), timeout_s, "stopping the controller")

    @staticmethod
    async def _bounded(step: Awaitable[object], timeout_s: float, what: str) -> None:
        """A shutdown step that may wait on ZooKeeper or a peer: given up after ``timeout_s``."""
        try:
            await asyncio.wait_for(step, timeout_s)
        except Exception as e:
            log.warning(f"{what} did not finish; shutting down anyway", extra={"error": repr(e)})

    def _topic_changed(self, name: str) -> None:
        """ZkControlPlane's notice: the topic's assignment, a partition state or its config
        changed, or it is gone. The changes are applied in order by one task."""
        self._dirty_topics.add(name)
        self._dirty.set()

    def _brokers_changed(self) -> None:
        # Nothing to apply: Metadata, FindCoordinator and the fetchers read live_brokers directly.
        pass

    async def _apply_cluster_changes(self, cluster: ZkControlPlane) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            while self._dirty_topics:
                name = self._dirty_topics.pop()
                try:
                    await self._apply_topic(name)
                    cluster.signal_change()  # create_topic waits for this broker's leaderships
                except Exception:
                    log.exception("applying a topic's state failed; retrying", extra={"topic": name})
                    self._dirty_topics.add(name)
                    await asyncio.sleep(1)
            heap.freeze()  # the partitions and logs just made live as long as they are hosted

    async def _apply_topic(self, name: str) -> None:
        """Make this broker host what ZooKeeper says of ``name``: every partition whose replicas
        include it, each at its newest state, in (leader epoch, partition epoch) order."""
        topic = self.control_plane.image.topic(name)
        hosted = self._hosted.get(name)
        if hosted is not None and (topic is None or topic.topic_id != hosted.topic_id):
            # Deleted (or deleted and created again): its replicas and offsets go.
            del self._hosted[name]
            # Its offsets' tombstones wait for the ISR: meanwhile partition states keep applying.
            task = asyncio.ensure_future(self.group_coordinator.on_topic_deleted(name))
            self._deletions.add(task)
            task.add_done_callback(self._deletion_done)
            await self.replica_manager.stop_replicas(hosted)
            log.info("deleted the replicas of a deleted topic", extra={"topic": name})
        if topic is None:
            return
        if name in self._withheld_at_startup:
            self._withheld_at_startup.discard(name)
            await self._place_withheld_logs(topic)
        if hosted is not None and hosted.configs != topic.configs:
            self.replica_manager.update_config(topic)
        pending = []
        for state in topic.partitions:
            tp = TopicPartition(name, state.partition)
            if state.partition_epoch == NO_STATE_EPOCH:
                continue  # the controller has not elected its first leader yet
            applied = self.replica_manager.applied_state(tp)
            if self.node_id not in state.replicas:
                if applied is not None:  # reassigned away from this broker
                    await self._stop_partition(tp)
                continue
            if applied is not None and applied >= (state.leader_epoch, state.partition_epoch):
                continue
            pending.append(state)
        if pending:
            # One pass through the replica manager for every changed partition of the topic.
            await self.replica_manager.become_leader_or_follower(topic, pending)
        self._hosted[name] = topic

    async def _stop_partition(self, tp: TopicPartition) -> None:
        await self.replica_manager.stop_partitions([tp], delete=True)

    def _deletion_done(self, task: asyncio.Future[Any]) -> None:
        self._deletions.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("forgetting a deleted topic's offsets failed", extra={"error": str(task.exception())})

    def _leads_its_partitions(self, name: str) -> bool:
        """Every partition of ``name`` that ZooKeeper says this broker leads, it leads already."""
        topic = self.control_plane.image.topic(name)
        if topic is None:
            return False
        for state in topic.partitions:
            if state.leader != self.node_id:
                continue
            local = self.replica_manager.partition(TopicPartition(name, state.partition))
            if local is None or not local.is_leader or local.leader_epoch < state.leader_epoch:
                return False
        return True

    def _offsets_topic_configs(self) -> dict[str, str]:
        return {
            "cleanup.policy": "compact",
            "compression.type": "producer",
            "segment.bytes": str(self.config.offsets_topic_segment_bytes),
        }

    async def ensure_offsets_topic(self) -> None:
        """Create ``__consumer_offsets`` on first use, compacted, as Kafka does.

        In a cluster it has offsets.topic.replication.factor replicas and min.insync.replicas 2
        (at most the factor); like Kafka, the broker refuses to create it with fewer live brokers
        than the factor (CoordinatorUnavailableError: clients see COORDINATOR_NOT_AVAILABLE and retry).
        """
        if self.control_plane.image.topic(OFFSETS_TOPIC) is not None:
            return
        if not self.control_plane.replicated:
            with contextlib.suppress(TopicExistsError):  # created meanwhile
                await self.control_plane.create_topic(
                    OFFSETS_TOPIC, self.config.offsets_topic_num_partitions, self._offsets_topic_configs()
                )
            return
        factor = self.config.offsets_topic_replication_factor
        live = len(self.control_plane.live_broker_ids)
        if live < factor:
            raise CoordinatorUnavailableError(
                f"Number of alive brokers '{live}' does not meet the required replication factor "
                f"'{factor}' for the offsets topic (configured via 'offsets.topic.replication.factor'). "
                "This error can be ignored if the cluster is starting up and not all brokers are up yet."
            )
        configs = {**self._offsets_topic_configs(), "min.insync.replicas": str(min(2, factor))}
        try:
            await self.control_plane.create_topic(
                OFFSETS_TOPIC,
                self.config.offsets_topic_num_partitions,
                configs,
                replication_factor=factor,
                timeout_ms=ADMIN_TIMEOUT_MS,
            )
        except TopicExistsError:  # created meanwhile, by this broker or another
            pass
        except (MetadataWaitTimeout, InvalidReplicationFactorError) as e:
            raise CoordinatorUnavailableError(str(e)) from e

    async def prepare_offsets_topic(self) -> None:
        """Before a group request (JoinGroup, OffsetCommit): create ``__consumer_offsets`` if needed.
        A failure is logged; the coordinator then answers COORDINATOR_NOT_AVAILABLE."""
        try:
            await self.ensure_offsets_topic()
        except (StorageError, CoordinatorUnavailableError) as e:
            log.error("cannot create the offsets topic", extra={"error": str(e)})

    def _transaction_topic_configs(self) -> dict[str, str]:
        return {
            "cleanup.policy": "compact",
            "compression.type": "uncompressed",
            "segment.bytes": str(self.config.transaction_state_log_segment_bytes),
            "unclean.leader.election.enable": "false",
        }

    async def ensure_transaction_topic(self) -> None:
        """Create ``__transaction_state`` on first use (FindCoordinator for a transactional id), as
        Kafka does: compacted; in a cluster with transaction.state.log.replication.factor replicas
        and transaction.state.log.min.isr, refused with fewer live brokers than the factor."""
        if self.control_plane.image.topic(TRANSACTION_STATE_TOPIC) is not None:
            if not self.control_plane.replicated:
                # Led from its creation on; again here in case the request that created it was
                # cancelled (its client went away) between the creation and the leading.
                self._lead_transaction_log()
            return
        num_partitions = self.config.transaction_state_log_num_partitions
        async with self._transaction_topic_lock:
            if self.control_plane.image.topic(TRANSACTION_STATE_TOPIC) is not None:
                return
            if not self.control_plane.replicated:
                with contextlib.suppress(TopicExistsError):
                    await self.control_plane.create_topic(
                        TRANSACTION_STATE_TOPIC, num_partitions, self._transaction_topic_configs()
                    )
                self._lead_transaction_log()
                return
            factor = self.config.transaction_state_log_replication_factor
            live = len(self.control_plane.live_broker_ids)
            if live < factor:
                raise CoordinatorUnavailableError(
                    f"Number of alive brokers '{live}' does not meet the required replication factor "
                    f"'{factor}' for the transactions state topic (configured via "
                    "'transaction.state.log.replication.factor'). This error can be ignored if the "
                    "cluster is starting up and not all brokers are up yet."
                )
            configs = {
                **self._transaction_topic_configs(),
                "min.insync.replicas": str(min(self.config.transaction_state_log_min_isr, factor)),
            }
            try:
                await self.control_plane.create_topic(
                    TRANSACTION_STATE_TOPIC,
                    num_partitions,
                    configs,
                    replication_factor=factor,
                    timeout_ms=ADMIN_TIMEOUT_MS,
                )
            except TopicExistsError:
                pass
            except (MetadataWaitTimeout, InvalidReplicationFactorError) as e:
                raise CoordinatorUnavailableError(str(e)) from e

    def _lead_transaction_log(self) -> None:
        """A single node coordinates every partition of ``__transaction_state`` it hosts."""
        topic = self.control_plane.image.topic(TRANSACTION_STATE_TOPIC)
        if topic is None:
            return
        for state in topic.partitions:
            self.transaction_coordinator.on_become_leader(
                TopicPartition(TRANSACTION_STATE_TOPIC, state.partition), state.leader_epoch
            )

    def _transaction_coordinator_of(self, transactional_id: str) -> int | None:
        state = self.transaction_coordinator.state
        return self._leader_of(state.topic_partition_of(transactional_id))

    def _leader_of(self, tp: TopicPartition) -> int | None:
        """The broker leading ``tp`` (-1 while none does), None when it does not exist."""
        topic = self.control_plane.image.topic(tp.topic)
        if topic is None or not 0 <= tp.partition < len(topic.partitions):
            return None
        if not self.control_plane.replicated:
            return self.node_id
        return topic.partitions[tp.partition].leader

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
        elif name == TRANSACTION_STATE_TOPIC:
            await self.ensure_transaction_topic()
        else:
            # Created meanwhile by another request; in a cluster, leaders not elected yet (the
            # partitions answer LEADER_NOT_AVAILABLE and the client asks again).
            with contextlib.suppress(TopicExistsError, MetadataWaitTimeout):
                await self.control_plane.create_topic(
                    name, self.config.num_partitions, {}, timeout_ms=AUTO_CREATE_WAIT_MS
                )
        topic = self.control_plane.image.topic(name)
        if topic is None:
            if self.control_plane.replicated:
                raise LeaderNotAvailableError(f"topic {name} is being created")
            raise KafkaStorageError(f"topic {name} could not be created")
        return topic

    # -- hosting the embedded control plane's changes (LocalControlPlane's Hosting) ----------

    async def create_replicas(self, topic: TopicState) -> None:
        await self.replica_manager.create_partitions(topic)
        await self._copy_topic_configs_of(topic)

    async def delete_replicas(self, topic: TopicState) -> None:
        await self.group_coordinator.on_topic_deleted(topic.name)
        await self.replica_manager.stop_replicas(topic)
        self.log_manager.held_topics.discard(topic.name)  # a new topic of that name has its own configs

    async def configs_changed(self, topic: TopicState) -> None:
        self.replica_manager.update_config(topic)
        await self._copy_topic_configs_of(topic)
        if topic.name in self.log_manager.held_topics:
            self.log_manager.held_topics.discard(topic.name)
            log.warning(
                "an operator set the configs of a rebuilt topic: its retention and compaction resume",
                extra={"topic": topic.name, "configs": dict(topic.configs)},
            )
