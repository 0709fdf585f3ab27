"""The replica manager: every partition this broker hosts, and the produce and fetch paths over them.

Produce appends to each partition's leader log; fetch reads whole batches below the
high watermark (``read_from_local_log``; handlers/fetch.py drives a fetch). Every change a
fetch answers -- an append, a move of the high watermark or log start offset, a change of
leadership -- goes through ``_wake_fetchers``, Kafka's purgatory keyed by partition: it wakes
the delayed fetches waiting on that partition (``await_change``) and marks it ready in the
fetch sessions watching it, so a session's fetch reads only what changed.

With a ``ClusterLink`` (ZooKeeper mode) it is Kafka's ReplicaManager: partition states from the
control plane make this broker leader or follower of each replica it hosts, followers fetch
from their leaders (replica_fetcher), leaders answer those fetches up to their LEO, track the
followers, change the ISR through the link, and hold acks=all produces until the HW passes
them (a delayed produce). High watermarks are checkpointed to ``replication-offset-checkpoint``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from strom.broker.control_plane.metadata import ClusterLink, PartitionState, TopicState
from strom.broker.fetch_session import FetchSessionCache
from strom.broker.metrics.stats import BrokerTopicStats, IsrStats, delayed_fetch
from strom.broker.partition import NotEnoughReplicasError, Partition, TopicPartition
from strom.broker.replica_fetcher import ReplicaFetcherManager, ReplicationConfig
from strom.protocol.errors import ErrorCode
from strom.records.control import ControlRecordType
from strom.storage import KafkaStorageError, LogConfig, LogManager, NewLog, StorageError
from strom.storage.append_origin import AppendOrigin
from strom.storage.log_validator import DecompressionBudget, ValidatedRecords, needs_worker
from strom.storage.unified_log import wall_clock_ms

log = logging.getLogger(__name__)

__all__ = [
    "FetchRequestPartition",
    "FetchResult",
    "LeadershipListener",
    "ProduceResult",
    "ReplicaManager",
    "ReplicationConfig",
]


class LeadershipListener(Protocol):
    """Told, on the event loop, after this broker becomes leader or follower of a partition
    (the group coordinator loads and unloads its groups with ``__consumer_offsets`` leadership)."""

    def on_become_leader(self, tp: TopicPartition, leader_epoch: int) -> None: ...

    def on_become_follower(self, tp: TopicPartition) -> None: ...


@dataclass(slots=True)
class ProduceResult:
    error: ErrorCode = ErrorCode.none
    base_offset: int = -1
    last_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    record_errors: list[tuple[int, str]] = field(default_factory=list)


@dataclass(slots=True)
class FetchRequestPartition:
    tp: TopicPartition
    fetch_offset: int
    max_bytes: int
    # A follower's fetch (replica_id >= 0): its last fetched epoch (KIP-320) and log start offset.
    last_fetched_epoch: int = -1
    log_start_offset: int = -1


@dataclass(slots=True)
class FetchResult:
    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    # KIP-320: (epoch, end offset) where a follower's log diverges from the leader's.
    diverging_epoch: tuple[int, int] | None = None
    # Records were readable at the fetch offset (below the HW, or the LEO for a follower), read
    # or left for the byte limits: a fetch session reads the partition again at its next fetch.
    more_available: bool = False
    # read_committed: (producer id, first offset) of the aborted transactions the records overlap.
    aborted_transactions: list[tuple[int, int]] | None = None


# Partition states applied per step of a leadership change (their new logs created together).
LEADERSHIPS_PER_STEP = 500
# A registered host name is resolved again when a fetch does not match it after this long.
HOST_RESOLUTION_TTL_S = 60.0
# Refused replica fetches are logged as warnings at most this often (the rest at debug).
REFUSAL_LOG_INTERVAL_S = 60.0


def normalized_address(host: str) -> str | None:
    """``host`` as an IP address in canonical form (IPv4-mapped IPv6 as IPv4), None if no IP."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def partition_ranges(partitions: list[int]) -> str:
    """``[0, 1, 2, 5]`` as "0-2,5": a batch of thousands of partitions in one short log field."""
    ranges: list[str] = []
    ordered = sorted(partitions)
    start = 0
    for i, p in enumerate(ordered):
        if i + 1 == len(ordered) or ordered[i + 1] != p + 1:
            ranges.append(f"{ordered[start]}-{p}" if i > start else str(p))
            start = i + 1
    return ",".join(ranges)


def error_code_of(exc: BaseException) -> ErrorCode:
    code = getattr(exc, "error_code", None)
    return ErrorCode(code) if isinstance(code, int) else ErrorCode.unknown_server_error


class ReplicaManager:
    def __init__(
        self,
        log_manager: LogManager,
        config_for: Callable[[TopicState], LogConfig],
        *,
        node_id: int | None = None,
        link: ClusterLink | None = None,
        replication: ReplicationConfig | None = None,
        time_ms: Callable[[], int] = wall_clock_ms,
        fetch_sessions: FetchSessionCache | None = None,
    ) -> None:
        self.log_manager = log_manager
        # The KIP-227 sessions fetching from this broker: told of every change a fetch answers.
        self.fetch_sessions = fetch_sessions
        self._config_for = config_for
        self.link = link
        self.node_id = node_id if node_id is not None else (link.node_id if link is not None else 0)
        self.replication = replication or ReplicationConfig()
        self._time_ms = time_ms
        self._partitions: dict[TopicPartition, Partition] = {}
        # Partitions whose log could not be opened because its log dir is offline (Kafka's
        # HostedPartition.Offline): they answer KAFKA_STORAGE_ERROR until a restart.
        self._offline_partitions: set[TopicPartition] = set()
        self._fetch_waiters: dict[TopicPartition, list[asyncio.Future[None]]] = defaultdict(list)
        # Cluster mode: the (leader epoch, partition epoch) applied per partition, older states ignored.
        self._applied: dict[TopicPartition, tuple[int, int]] = {}
        # Held while a batch of partition states is applied (Kafka's replicaStateChangeLock).
        self._leadership_lock = asyncio.Lock()
        self._topic_ids: dict[str, uuid.UUID] = {}
        self._listeners: list[LeadershipListener] = []
        self._alter_tasks: set[asyncio.Task[None]] = set()
        self._background: list[asyncio.Task[None]] = []
        self._checkpointed_high_watermarks: dict[tuple[str, int], int] | None = None
        self.fetchers = ReplicaFetcherManager(self, self.replication) if link is not None else None
        # Registered brokers' hosts resolved to addresses: (addresses, monotonic time resolved).
        self._resolved_hosts: dict[str, tuple[frozenset[str], float]] = {}
        self._last_refusal_logged = -REFUSAL_LOG_INTERVAL_S
        # (log start offset, offline) per partition at the last report_log_start_offsets.
        self._reported_log_states: dict[TopicPartition, tuple[int, bool]] = {}
        # Metrics: bytes and messages appended per topic, ISR changes of the partitions led here.
        self.topic_stats = BrokerTopicStats()
        self.isr_stats = IsrStats()

    # -- leadership ---------------------------------------------------------------------------

    def lead_on_single_node(self, topic: TopicState) -> None:
        """A single node: lead every partition of ``topic`` that is not yet hosted, creating missing
        logs inline (startup, before the broker serves anyone; later changes use ``create_partitions``)."""
        config = self._config_for(topic)
        for state in topic.partitions:
            tp = TopicPartition(topic.name, state.partition)
            if tp in self._partitions or tp in self._offline_partitions:
                continue
            try:
                log_ = self.log_manager.get_or_create_log(topic.name, state.partition, config, topic.topic_id)
                self._partitions[tp] = Partition(
                    tp, log_, state.leader_epoch, list(state.isr), local_id=self.node_id
                )
            except KafkaStorageError as exc:
                log.debug("partition %s is offline: %s", tp, exc)  # the failure channel logged the cause
                self._offline_partitions.add(tp)

    async def create_partitions(self, topic: TopicState) -> None:
        """Create the logs of ``topic``'s partitions not yet hosted, off the event loop, then host them.

        Raises KafkaStorageError (having created nothing) if the disk fails.
        """
        config = self._config_for(topic)
        missing = [
            state
            for state in topic.partitions
            if TopicPartition(topic.name, state.partition) not in self._partitions
            and self.log_manager.get_log(topic.name, state.partition) is None
        ]
        dirs = self.log_manager.assign_log_dirs(len(missing))
        specs = [
            NewLog(log_dir, topic.name, state.partition, config, topic.topic_id, state.leader_epoch)
            for log_dir, state in zip(dirs, missing, strict=True)
        ]
        logs = await asyncio.get_running_loop().run_in_executor(None, self.log_manager.open_new_logs, specs)
        self.log_manager.register_logs(logs)
        self.lead_on_single_node(topic)

    def update_config(self, topic: TopicState) -> None:
        config = self._config_for(topic)
        for state in topic.partitions:
            partition = self._partitions.get(TopicPartition(topic.name, state.partition))
            if partition is not None:
                partition.log.update_config(config)

    async def stop_replicas(self, topic: TopicState) -> None:
        """Stop hosting ``topic`` and delete its logs."""
        await self.stop_partitions(
            [TopicPartition(topic.name, state.partition) for state in topic.partitions], True
        )
        if self._topic_ids.get(topic.name) == topic.topic_id:
            del self._topic_ids[topic.name]
        self.topic_stats.remove(topic.name)

    async def stop_partitions(self, tps: list[TopicPartition], delete: bool) -> None:
        """Stop hosting ``tps`` (a deleted topic, or this broker left their replicas), deleting
        their logs if ``delete``.

        They leave the broker here, on the event loop, so no append, fetch or fetcher reaches
        their logs any more; the files are removed in a worker thread.
        """
        if self.fetchers is not None:
            self.fetchers.remove_partitions(tps)
        resigned = []
        for tp in tps:
            self._offline_partitions.discard(tp)
            self._applied.pop(tp, None)
            partition = self._partitions.pop(tp, None)
            if partition is not None:
                if partition.is_leader and self.link is not None:
                    resigned.append(tp)
                partition.leader_id = -1
                partition.fail_delayed_produces(ErrorCode.not_leader_or_follower)
            self._wake_fetchers(tp)
        for tp in resigned:
            self._notify_follower(tp)
        if delete:
            logs = self.log_manager.unregister_logs([(tp.topic, tp.partition) for tp in tps])
            await asyncio.get_running_loop().run_in_executor(None, self.log_manager.delete_logs, logs)

    # -- cluster mode: partition states from the control plane ------------------------------------

    def add_leadership_listener(self, listener: LeadershipListener) -> None:
        self._listeners.append(listener)

    def _notify_leader(self, tp: TopicPartition, leader_epoch: int) -> None:
        for listener in self._listeners:
            try:
                listener.on_become_leader(tp, leader_epoch)
            except Exception:
                log.exception("leadership listener failed", extra={"partition": str(tp)})

    def _notify_follower(self, tp: TopicPartition) -> None:
        for listener in self._listeners:
            try:
                listener.on_become_follower(tp)
            except Exception:
                log.exception("leadership listener failed", extra={"partition": str(tp)})

    def leader_hint(self, tp: TopicPartition) -> tuple[int, int] | None:
        """(leader id, leader epoch) as this broker knows them, for KIP-951's NOT_LEADER_OR_FOLLOWER hints."""
        partition = self._partitions.get(tp)
        if partition is None or partition.leader_id < 0:
            return None
        return partition.leader_id, partition.leader_epoch

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return self.link.broker_endpoint(broker_id) if self.link is not None else None

    def broker_epoch(self, broker_id: int) -> int | None:
        """A live broker's epoch (KIP-903), None if it is not registered (or on a single node)."""
        return self.link.broker_epoch(broker_id) if self.link is not None else None

    # -- who may fetch as a follower ------------------------------------------------------------

    async def accepts_replica_fetch(self, replica_id: int, replica_epoch: int, peer_host: str) -> bool:
        """Whether a Fetch claiming to come from broker ``replica_id``'s replica fetcher may be
        served as one (Kafka needs CLUSTER_ACTION for it; without ACLs the leader checks what it
        can): the broker is another live, registered broker; ``replica_epoch`` (KIP-903, Fetch
        v15+; -1 when the fetcher does not know it) is its registration's epoch; and the
        connection comes from an address of the broker's registered host (a fetcher connects
        from its listener's address, or its registered host). A single node has no followers."""
        if replica_id == self.node_id:
            return False
        endpoint = self.broker_endpoint(replica_id)
        epoch = self.broker_epoch(replica_id)
        if endpoint is None or epoch is None:
            reason = "not a live broker"
        elif replica_epoch not in (-1, epoch):
            reason = "stale or unknown broker epoch"
        elif normalized_address(peer_host) not in await self._addresses_of(endpoint[0], peer_host):
            reason = "connection not from the broker's host"
        else:
            return True
        now = time.monotonic()
        loud = now - self._last_refusal_logged >= REFUSAL_LOG_INTERVAL_S
        if loud:
            self._last_refusal_logged = now
        log.log(
            logging.WARNING if loud else logging.DEBUG,
            "refusing a replica fetch",
            extra={
                "replica": replica_id,
                "replica_epoch": replica_epoch,
                "broker_epoch": epoch,
                "peer": peer_host,
                "reason": reason,
            },
        )
        return False

    async def _addresses_of(self, host: str, peer_host: str) -> frozenset[str]:
        """The addresses ``host`` (a registered broker's) stands for; a name is resolved off the
        loop, cached, and resolved again when ``peer_host`` does not match a stale entry."""
        address = normalized_address(host)
        if address is not None:
            return frozenset({address})
        cached = self._resolved_hosts.get(host)
        now = time.monotonic()
        if cached is not None and (
            normalized_address(peer_host) in cached[0] or now - cached[1] < HOST_RESOLUTION_TTL_S
        ):
            return cached[0]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as e:
            log.warning("cannot resolve a broker's host", extra={"host": host, "error": str(e)})
            return cached[0] if cached is not None else frozenset()
        addresses = frozenset(a for info in infos if (a := normalized_address(str(info[4][0]))) is not None)
        if len(self._resolved_hosts) > 1024:
            self._resolved_hosts.clear()  # hosts of brokers long gone
        self._resolved_hosts[host] = (addresses, now)
        return addresses

    def peer_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        """The inter-broker listener of ``broker_id`` (where a replica fetcher connects)."""
        return self.link.peer_endpoint(broker_id) if self.link is not None else None

    def applied_state(self, tp: TopicPartition) -> tuple[int, int] | None:
        """The (leader epoch, partition epoch) of the partition's state applied here, if hosted."""
        return self._applied.get(tp)

    async def become_leader_or_follower(self, topic: TopicState, states: list[PartitionState]) -> None:
        """Kafka's becomeLeaderOrFollower for partitions of ``topic``, in steps of up to
        LEADERSHIPS_PER_STEP partitions: host the replicas not hosted yet (their logs created
        together, off the loop), then makeFollowers and makeLeaders for the step. A state not newer
        than the one applied, by (leader epoch, partition epoch), or of a partition with no replica
        here, is ignored."""
        async with self._leadership_lock:
            fresh: list[PartitionState] = []
            for state in states:
                tp = TopicPartition(topic.name, state.partition)
                applied = self._applied.get(tp)
                if applied is not None and (state.leader_epoch, state.partition_epoch) <= applied:
                    continue
                if self.node_id not in state.replicas:
                    log.debug(
                        "ignoring the state of a partition this broker holds no replica of",
                        extra={"partition": str(tp)},
                    )
                    continue
                fresh.append(state)
            if not fresh:
                return
            self._topic_ids[topic.name] = topic.topic_id
            # A step at a time: leaders of the first steps serve while later logs are created, and
            # a stop (which cancels this) waits for one step's files, not all of them.
            for first in range(0, len(fresh), LEADERSHIPS_PER_STEP):
                await self._apply_step(topic, fresh[first : first + LEADERSHIPS_PER_STEP])

    async def _apply_step(self, topic: TopicState, states: list[PartitionState]) -> None:
        await self._host(topic, states)
        leaders: list[tuple[Partition, PartitionState]] = []
        followers: list[tuple[Partition, PartitionState]] = []
        for state in states:
            tp = TopicPartition(topic.name, state.partition)
            partition = self._partitions.get(tp)
            if partition is None:
                continue  # offline
            self._applied[tp] = (state.leader_epoch, state.partition_epoch)
            (leaders if state.leader == self.node_id else followers).append((partition, state))
        self._make_followers(followers)
        await self._make_leaders(leaders)

    async def _host(self, topic: TopicState, states: list[PartitionState]) -> None:
        """Open the replicas of ``states`` not hosted yet, creating the missing logs together off the
        loop (a leader's log starts with its epoch written, so making it leader writes nothing)."""
        unhosted = [
            s
            for s in states
            if (tp := TopicPartition(topic.name, s.partition)) not in self._partitions
            and tp not in self._offline_partitions
        ]
        if not unhosted:
            return
        loop = asyncio.get_running_loop()
        missing = [s for s in unhosted if self.log_manager.get_log(topic.name, s.partition) is None]
        if missing:
            try:
                dirs = self.log_manager.assign_log_dirs(len(missing))
                config = self._config_for(topic)
                specs = [
                    NewLog(
                        log_dir,
                        topic.name,
                        s.partition,
                        config,
                        topic.topic_id,
                        s.leader_epoch if s.leader == self.node_id else -1,
                    )
                    for log_dir, s in zip(dirs, missing, strict=True)
                ]
                logs = await loop.run_in_executor(None, self.log_manager.open_new_logs, specs)
                self.log_manager.register_logs(logs)
            except KafkaStorageError as exc:
                log.warning(
                    "partitions are offline",
                    extra={
                        "topic": topic.name,
                        "partitions": partition_ranges([s.partition for s in missing]),
                        "error": str(exc),
                    },
                )
                self._offline_partitions.update(TopicPartition(topic.name, s.partition) for s in missing)
        if self._checkpointed_high_watermarks is None:
            self._checkpointed_high_watermarks = await loop.run_in_executor(
                None, self.log_manager.read_high_watermarks
            )
        for state in unhosted:
            tp = TopicPartition(topic.name, state.partition)
            log_ = self.log_manager.get_log(topic.name, state.partition)
            if log_ is None or tp in self._partitions:
                continue  # offline, or hosted meanwhile
            self._partitions[tp] = Partition(
                tp,
                log_,
                -1,
                [],
                local_id=self.node_id,
                replicated=self.link is not None,
                high_watermark=self._checkpointed_high_watermarks.get((tp.topic, tp.partition), 0),
            )

    async def _make_leaders(self, batch: list[tuple[Partition, PartitionState]]) -> None:
        """Kafka's makeLeaders: every new epoch of the batch is written to its leader epoch
        checkpoint first (all at once, each on its log's I/O executor after any truncation queued
        there) and only then led. Unsynced, as an epoch an append brings: no replica holds a
        record of an epoch before its leader appends one, and the log's flush syncs the file
        before its recovery point passes such a record (fsyncing 3,333 of them was most of a
        10,000-partition failover)."""
        now_ms = self._time_ms()
        # The ISRs of partitions led here already: a change the controller made (a follower died or
        # shut down) counts as a shrink or expansion too, unlike Kafka, which counts only the
        # leader's own (an operator sees the under-replication either way).
        led_before = {partition: partition.isr for partition, _ in batch if partition.is_leader}
        new_epochs: list[tuple[Partition, PartitionState]] = []
        for partition, state in batch:
            if partition.is_leader and partition.leader_epoch == state.leader_epoch:
                # The same epoch with a newer partition epoch: an ISR change (ours, or the controller's).
                # Woken even if the HW stays: see _isr_settled.
                partition.make_leader(state, now_ms)
                self.isr_stats.changed(led_before[partition], partition.isr)
                self._wake_fetchers(partition.tp)
            else:
                new_epochs.append((partition, state))
        if not new_epochs:
            return
        if self.fetchers is not None:
            self.fetchers.remove_partitions([p.tp for p, _ in new_epochs])
        writes: list[tuple[Partition, PartitionState, asyncio.Future[None] | None]] = []
        for partition, state in new_epochs:
            # No append until the new epoch is recorded, so none lands under the old one meanwhile.
            # Produces waiting from an earlier epoch of ours keep waiting: the records stay ours and
            # commit once the followers fetch in the new epoch.
            partition.leader_id = -1
            cache = partition.log.leader_epoch_cache
            write = None
            if cache.latest_epoch is None or cache.latest_epoch < state.leader_epoch:
                write = asyncio.wrap_future(
                    partition.log.io.submit(
                        functools.partial(cache.assign, flush=False),
                        state.leader_epoch,
                        partition.log.log_end_offset,
                    )
                )
            writes.append((partition, state, write))
        outcomes = await asyncio.gather(*(w for _, _, w in writes if w is not None), return_exceptions=True)
        failures = iter(outcomes)
        now_ms = self._time_ms()
        led: list[int] = []
        for partition, state, write in writes:
            tp = partition.tp
            error = next(failures) if write is not None else None
            if isinstance(error, OSError):
                partition.log.log_dir_failed("recording the leader epoch", error)
                partition.fail_delayed_produces(ErrorCode.kafka_storage_error)
                continue
            if isinstance(error, BaseException):
                log.error(
                    "recording the leader epoch failed", extra={"partition": str(tp), "error": repr(error)}
                )
                continue
            if (
                self._partitions.get(tp) is not partition
                or self._applied.get(tp, (-1, -1))[0] != state.leader_epoch
            ):
                continue  # stopped, or a newer state took over while the epoch was written
            partition.make_leader(state, now_ms)
            if partition in led_before:
                self.isr_stats.changed(led_before[partition], partition.isr)
            self._wake_fetchers(tp)
            self._notify_leader(tp, state.leader_epoch)
            led.append(tp.partition)
        if led:
            log.info(
                "became leader", extra={"topic": batch[0][0].tp.topic, "partitions": partition_ranges(led)}
            )

    def _make_followers(self, batch: list[tuple[Partition, PartitionState]]) -> None:
        """Kafka's makeFollowers: the fetchers are updated once for the batch."""
        moved: list[tuple[Partition, PartitionState]] = []
        for partition, state in batch:
            new_leadership = (
                partition.is_leader
                or partition.leader_id != state.leader
                or partition.leader_epoch != state.leader_epoch
            )
            partition.make_follower(state)
            self._wake_fetchers(partition.tp)  # consumers waiting on it are answered NOT_LEADER_OR_FOLLOWER
            if new_leadership:
                moved.append((partition, state))
        if not moved:
            return
        if self.fetchers is not None:
            self.fetchers.remove_partitions([p.tp for p, _ in moved])
            for partition, state in moved:
                if state.leader >= 0:
                    tp = partition.tp
                    self.fetchers.add_partition(
                        tp, self._topic_ids[tp.topic], state.leader, state.leader_epoch
                    )
        for partition, _ in moved:
            self._notify_follower(partition.tp)
        log.info(
            "became follower",
            extra={
                "topic": moved[0][0].tp.topic,
                "partitions": partition_ranges([p.tp.partition for p, _ in moved]),
                "leaders": sorted({s.leader for _, s in moved}),
            },
        )

    def topic_id(self, topic: str) -> uuid.UUID | None:
        return self._topic_ids.get(topic)

    # -- cluster mode: ISR changes ----------------------------------------------------------------

    def _maybe_alter_isr(self, partition: Partition, new_isr: list[int] | None) -> None:
        """Propose ``new_isr`` through the cluster link (one change in flight per partition)."""
        if new_isr is None or self.link is None or partition.pending_isr is not None:
            return
        proposed = PartitionState(
            partition=partition.tp.partition,
            leader=self.node_id,
            leader_epoch=partition.leader_epoch,
            replicas=list(partition.replicas),
            isr=new_isr,
            partition_epoch=partition.partition_epoch,
        )
        partition.pending_isr = new_isr
        task = asyncio.get_running_loop().create_task(self._alter_partition(partition, proposed))
        self._alter_tasks.add(task)
        task.add_done_callback(self._alter_tasks.discard)

    async def _alter_partition(self, partition: Partition, proposed: PartitionState) -> None:
        assert self.link is not None
        tp = partition.tp
        try:
            written = await self.link.alter_partition(tp.topic, proposed)
        except Exception as e:
            log.warning(
                # repr: kazoo's errors (SessionExpiredError, ConnectionLoss) have empty messages.
                "ISR change failed",
                extra={"partition": str(tp), "isr": proposed.isr, "error": repr(e)},
            )
            written = None
        if (
            self._partitions.get(tp) is not partition
            or not partition.is_leader
            or partition.leader_epoch != proposed.leader_epoch
        ):
            return
        key = (written.leader_epoch, written.partition_epoch) if written is not None else None
        if (
            written is None
            or key is None
            or key <= self._applied.get(tp, (-1, -1))
            or written.leader != self.node_id
        ):
            # Refused (a newer state is on its way) or already applied from the watch.
            partition.pending_isr = None
            self._isr_settled(tp)
            return
        self._applied[tp] = key
        log.info(
            "ISR changed",
            extra={"partition": str(tp), "isr": written.isr, "partition_epoch": written.partition_epoch},
        )
        self.isr_stats.changed(partition.isr, written.isr)
        partition.commit_isr(written)
        self._isr_settled(tp)

    def _isr_settled(self, tp: TopicPartition) -> None:
        """An ISR change was written or refused: the partition is read at the followers' next
        fetch. A follower's fetch session reads a quiet partition only when something marks it,
        and only a read records the follower's position and lets it (back) into the ISR: a
        follower dropped from it while the partition stays quiet (min.insync.replicas refusing
        every produce) would otherwise never rejoin, nor one whose expansion waited on this change."""
        self._wake_fetchers(tp)

    def _shrink_isrs(self) -> None:
        now = self._time_ms()
        lag_max = self.replication.replica_lag_time_max_ms
        for partition in list(self._partitions.values()):
            if partition.is_leader and not partition.offline:
                self._maybe_alter_isr(partition, partition.isr_shrink(now, lag_max))

    # -- cluster mode: lifecycle and high watermark checkpoints -----------------------------------

    async def start(self) -> None:
        """Start the ISR-shrink and HW-checkpoint schedulers (cluster mode; nothing on a single node)."""
        if self.link is None:
            return
        loop = asyncio.get_running_loop()
        self._background = [
            loop.create_task(self._every(self.replication.replica_lag_time_max_ms / 2, self._shrink_isrs)),
            loop.create_task(
                self._every(
                    self.replication.replica_high_watermark_checkpoint_interval_ms,
                    self.checkpoint_high_watermarks,
                )
            ),
        ]

    async def _every(self, interval_ms: float, job: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                outcome = job()
                if asyncio.iscoroutine(outcome):
                    await outcome
            except Exception:
                log.exception("replication job failed", extra={"job": getattr(job, "__name__", "?")})

    async def checkpoint_high_watermarks(self) -> None:
        """Write ``replication-offset-checkpoint`` in every log dir (the file work off the loop)."""
        high_watermarks = {
            (tp.topic, tp.partition): partition.high_watermark
            for tp, partition in self._partitions.items()
            if not partition.offline
        }
        await asyncio.get_running_loop().run_in_executor(
            None, self.log_manager.checkpoint_high_watermarks, high_watermarks
        )

    async def shutdown(self) -> None:
        """Stop fetchers and schedulers, fail waiting produces, and checkpoint the high watermarks
        (before the log manager closes the logs)."""
        if self.link is None:
            return
        for task in [*self._background, *self._alter_tasks]:
            task.cancel()
        for task in [*self._background, *self._alter_tasks]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._background = []
        if self.fetchers is not None:
            await self.fetchers.shutdown()
        for partition in self._partitions.values():
            partition.fail_delayed_produces(ErrorCode.not_leader_or_follower)
        self.wake_all_fetchers()
        try:
            await self.checkpoint_high_watermarks()
        except (OSError, StorageError) as e:
            log.error("could not checkpoint high watermarks at shutdown", extra={"error": str(e)})

    def partition(self, tp: TopicPartition) -> Partition | None:
        return self._partitions.get(tp)

    def partition_of(self, topic: str, partition: int) -> Partition | None:
        return self._partitions.get(TopicPartition(topic, partition))

    def partitions(self) -> list[Partition]:
        return list(self._partitions.values())

    def is_offline(self, tp: TopicPartition) -> bool:
        """The partition's log dir failed: produce and fetch answer KAFKA_STORAGE_ERROR."""
        if tp in self._offline_partitions:
            return True
        partition = self._partitions.get(tp)
        return partition is not None and partition.offline

    @property
    def offline_count(self) -> int:
        """Partitions not hosted because their log dir is offline."""
        return len(self._offline_partitions)

    def _missing_partition_error(self, tp: TopicPartition) -> ErrorCode:
        if tp in self._offline_partitions:
            return ErrorCode.kafka_storage_error
        return ErrorCode.unknown_topic_or_partition

    # -- produce ------------------------------------------------------------------------------

    async def append_records_async(
        self,
        required_acks: int,
        entries: list[tuple[TopicPartition, bytes | None]],
        origin: AppendOrigin = AppendOrigin.CLIENT,
        verification_guards: dict[TopicPartition, tuple[int, object]] | None = None,
    ) -> dict[TopicPartition, ProduceResult]:
        """append_records for the produce path: record sets whose validation may take long
        (compressed, recompressed or large: log_validator.needs_worker) are validated on a
        worker thread first, so the event loop never waits for a decompression; one after the
        other, sharing the request's DecompressionBudget."""
        validated: dict[TopicPartition, ValidatedRecords] = {}
        early: dict[TopicPartition, ProduceResult] = {}
        loop = asyncio.get_running_loop()
        budget = DecompressionBudget()
        for tp, records in entries:
            partition = self._partitions.get(tp)
            if partition is None or not records or not needs_worker(records, partition.log.config):
                continue
            try:
                validated[tp] = await loop.run_in_executor(
                    None, partition.log.analyze_for_append, records, budget, origin
                )
            except StorageError as exc:
                early[tp] = ProduceResult(
                    error_code_of(exc),
                    log_start_offset=partition.log_start_offset,
                    error_message=str(exc) or None,
                    record_errors=list(exc.record_errors),
                )
        results = self.append_records(
            required_acks,
            [entry for entry in entries if entry[0] not in early],
            validated,
            origin,
            verification_guards,
        )
        results.update(early)
        return results

    def append_records(
        self,
        required_acks: int,
        entries: list[tuple[TopicPartition, bytes | None]],
        validated: dict[TopicPartition, ValidatedRecords] | None = None,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        verification_guards: dict[TopicPartition, tuple[int, object]] | None = None,
    ) -> dict[TopicPartition, ProduceResult]:
        """``verification_guards``: the KIP-890 verification each transaction's first write to a
        partition passed; a marker for the producer since then voids it (INVALID_TXN_STATE)."""
        results: dict[TopicPartition, ProduceResult] = {}
        for tp, records in entries:
            partition = self._partitions.get(tp)
            if partition is None:
                results[tp] = ProduceResult(self._missing_partition_error(tp))
                continue
            if not records:
                results[tp] = ProduceResult(ErrorCode.invalid_record, error_message="empty record set")
                continue
            guard = verification_guards.get(tp) if verification_guards else None
            if guard is not None and not partition.end_verification(*guard):
                results[tp] = ProduceResult(
                    ErrorCode.invalid_txn_state,
                    error_message="the transaction ended while its write to this partition was verified",
                )
                continue
            try:
                info = partition.append_records_to_leader(
                    records, required_acks, validated.get(tp) if validated is not None else None, origin
                )
            except (StorageError, NotEnoughReplicasError) as exc:  # NotLeaderOrFollowerError too
                results[tp] = ProduceResult(
                    error_code_of(exc),
                    log_start_offset=partition.log_start_offset,
                    error_message=str(exc) or None,
                    record_errors=list(getattr(exc, "record_errors", [])),
                )
                continue
            results[tp] = ProduceResult(
                base_offset=info.first_offset,
                last_offset=info.last_offset,
                log_append_time=info.log_append_time,
                log_start_offset=info.log_start_offset,
            )
            if not info.duplicate:
                # Kafka's BytesInPerSec counts the record set as the producer sent it.
                stats = self.topic_stats.of(tp.topic)
                stats.bytes_in += len(records)
                stats.messages_in += info.record_count
                self._wake_fetchers(tp)
        # On a single node the HW moved with the append itself; in a cluster acks=-1 waits in
        # ``append`` (a delayed produce) until the HW passes each last offset.
        return results

    def append_transaction_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        marker: ControlRecordType,
        tps: list[TopicPartition],
    ) -> dict[TopicPartition, ProduceResult]:
        """Write one transaction's COMMIT or ABORT marker to each of ``tps`` led here; the caller
        waits for the ISR (``await_replication``) before the marker counts as written."""
        results: dict[TopicPartition, ProduceResult] = {}
        for tp in tps:
            partition = self._partitions.get(tp)
            if partition is None:
                results[tp] = ProduceResult(self._missing_partition_error(tp))
                continue
            try:
                info = partition.append_marker_to_leader(producer_id, producer_epoch, coordinator_epoch, marker)
            except (StorageError, NotEnoughReplicasError) as exc:
                results[tp] = ProduceResult(error_code_of(exc), error_message=str(exc) or None)
                continue
            results[tp] = ProduceResult(
                base_offset=info.first_offset, last_offset=info.last_offset, log_start_offset=info.log_start_offset
            )
            # The marker moves the LSO: consumers reading committed data may have more now.
            self._wake_fetchers(tp)
        return results

    def delays_produce(self, required_acks: int) -> bool:
        """Whether a produce with ``required_acks`` waits for replication (acks=-1 in a cluster)."""
        return required_acks == -1 and self.link is not None

    async def append(
        self,
        required_acks: int,
        entries: list[tuple[TopicPartition, bytes | None]],
        timeout_ms: int | None = None,
        *,
        await_replication: bool = True,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        verification_guards: dict[TopicPartition, tuple[int, object]] | None = None,
    ) -> dict[TopicPartition, ProduceResult]:
        """``append_records_async``, then the fsyncs that flush.messages asks for, off the event
        loop, before the caller acknowledges (a failed fsync answers KAFKA_STORAGE_ERROR); then,
        when ``delays_produce``, the wait for the ISR (``timeout_ms``: the request's timeout),
        unless the caller waits itself (``await_replication`` False: ``await_replication``)."""
        results = await self.append_records_async(required_acks, entries, origin, verification_guards)
        due = [
            (tp, partition)
            for tp, result in results.items()
            if result.error == ErrorCode.none
            and (partition := self._partitions.get(tp)) is not None
            and partition.log.flush_messages_due
        ]
        if due:
            loop = asyncio.get_running_loop()
            outcomes = await asyncio.gather(
                *(loop.run_in_executor(None, partition.log.flush) for _, partition in due),
                return_exceptions=True,
            )
            for (tp, _), outcome in zip(due, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    log.error("flush failed", extra={"partition": str(tp), "error": str(outcome)})
                    results[tp] = ProduceResult(ErrorCode.kafka_storage_error, error_message=str(outcome))
        if await_replication and self.delays_produce(required_acks):
            await self.await_replication(results, timeout_ms)
        return results

    async def await_replication(
        self, results: dict[TopicPartition, ProduceResult], timeout_ms: int | None
    ) -> None:
        """Kafka's DelayedProduce: wait until each appended partition's HW passes its last offset."""
        waits: dict[TopicPartition, asyncio.Future[ErrorCode]] = {}
        for tp, result in results.items():
            if result.error != ErrorCode.none:
                continue
            partition = self._partitions.get(tp)
            if partition is None:
                result.error = ErrorCode.not_leader_or_follower
                continue
            waits[tp] = partition.wait_for_high_watermark(result.last_offset + 1)
        pending = [future for future in waits.values() if not future.done()]
        if pending:
            await asyncio.wait(pending, timeout=None if timeout_ms is None else max(0, timeout_ms) / 1000)
        for tp, future in waits.items():
            if future.done():
                error = future.result()
            else:
                future.cancel()  # the partition drops cancelled waiters
                error = ErrorCode.request_timed_out
            if error != ErrorCode.none:
                results[tp].error = error

    # -- fetch --------------------------------------------------------------------------------

    def read_from_local_log(
        self,
        requests: list[FetchRequestPartition],
        max_bytes: int,
        replica_id: int = -1,
        record_follower_state: bool = False,
        min_one_batch: bool = True,
        read_committed: bool = False,
    ) -> tuple[dict[TopicPartition, FetchResult], int]:
        """Consumers (``replica_id`` < 0) read below the HW of partitions led here (below the LSO
        with ``read_committed``, with the aborted transactions their records overlap); a follower
        reads up to the LEO and, with ``record_follower_state``, its fetch offset counts as its LEO.
        With ``min_one_batch`` the first partition with data gets one batch whatever the limits
        (a fetch that reads again after waiting, and read records before, passes False)."""
        results: dict[TopicPartition, FetchResult] = {}
        remaining = max_bytes
        total = 0
        now = self._time_ms()
        for request in requests:
            partition = self._partitions.get(request.tp)
            if partition is None:
                results[request.tp] = FetchResult(self._missing_partition_error(request.tp))
                continue
            if not partition.is_leader:
                results[request.tp] = FetchResult(ErrorCode.not_leader_or_follower)
                continue
            # On a single node there are no followers: a replica id is read as a consumer, as before.
            follower = replica_id >= 0 and partition.replicated
            if follower and replica_id not in partition.followers:
                # As Kafka: the leader records no position for a broker outside the replica set.
                results[request.tp] = FetchResult(ErrorCode.not_leader_or_follower)
                continue
            if follower:
                diverging = partition.diverging_epoch(request.fetch_offset, request.last_fetched_epoch)
                if diverging is not None:
                    results[request.tp] = FetchResult(
                        high_watermark=partition.high_watermark,
                        last_stable_offset=partition.last_stable_offset,
                        log_start_offset=partition.log_start_offset,
                        diverging_epoch=diverging,
                    )
                    continue
            leader_log_end = partition.log_end_offset
            result = FetchResult()
            try:
                # The first partition with data gets at least one batch, even above the limits.
                data = partition.read_records(
                    request.fetch_offset,
                    min(request.max_bytes, remaining),
                    min_one_batch=min_one_batch and total == 0,
                    up_to_log_end=follower,
                    read_committed=read_committed,
                )
            except StorageError as exc:
                result.error = error_code_of(exc)
            else:
                result.records = data.records
                if read_committed and not follower:
                    result.aborted_transactions = (
                        partition.aborted_transactions(request.fetch_offset) if data.records else []
                    )
                total += len(data.records)
                remaining = max(0, remaining - len(data.records))
                if follower and record_follower_state:
                    self._record_follower_fetch(partition, replica_id, request, now, leader_log_end)
            result.high_watermark = partition.high_watermark
            result.last_stable_offset = partition.last_stable_offset
            result.log_start_offset = partition.log_start_offset
            result.more_available = request.fetch_offset < (
                partition.log_end_offset
                if follower
                else result.last_stable_offset
                if read_committed
                else partition.high_watermark
            )
            results[request.tp] = result
        return results, total

    def time_ms(self) -> int:
        """The clock follower fetch states are kept in."""
        return self._time_ms()

    def _record_follower_fetch(
        self,
        partition: Partition,
        replica_id: int,
        request: FetchRequestPartition,
        now: int,
        leader_log_end: int,
    ) -> None:
        if partition.update_follower_fetch_state(
            replica_id, request.fetch_offset, request.log_start_offset, now, leader_log_end
        ):
            # Consumers waiting at the old HW wake; followers' sessions carry the new HW on their
            # next answer (data elsewhere, or their wait's end), as Kafka's DelayedFetch completes
            # a follower's fetch for bytes, not for a HW: waking them too cost every record a
            # wake and a read of the partition in each follower's waiting fetch.
            self._wake_fetchers(partition.tp, wake_followers=False)
        # Only a live broker's replica joins the ISR (KIP-841: a fenced one is never eligible).
        if self.broker_epoch(replica_id) is not None:
            self._maybe_alter_isr(partition, partition.isr_expansion(replica_id))

    async def await_change(self, tps: list[TopicPartition], timeout: float) -> None:
        """A delayed fetch of ``tps``: until one of them changes (``_wake_fetchers``), or ``timeout`` s."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for tp in tps:
            self._fetch_waiters[tp].append(waiter)
        try:
            with delayed_fetch():
                await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            for tp in tps:
                waiters = self._fetch_waiters.get(tp)
                if waiters is not None:
                    if waiter in waiters:
                        waiters.remove(waiter)
                    if not waiters:
                        del self._fetch_waiters[tp]

    def _wake_fetchers(self, tp: TopicPartition, wake_followers: bool = True) -> None:
        """Something a fetch of ``tp`` answers may have changed (an append, the HW or log start
        offset, leadership): delayed fetches waiting on it wake, and fetch sessions read it at
        their next fetch. Without ``wake_followers`` a follower's waiting fetch keeps waiting."""
        if self.fetch_sessions is not None:
            for session in self.fetch_sessions.partition_changed(tp, wake_followers):
                if session.replica_id >= 0:
                    self._follower_was_caught_up(tp, session.replica_id, session.last_fetch_time_ms)
        for waiter in self._fetch_waiters.pop(tp, ()):
            if not waiter.done():
                waiter.set_result(None)

    def _follower_was_caught_up(self, tp: TopicPartition, replica_id: int, fetch_time_ms: int) -> None:
        """A follower's session has not read ``tp`` since it last was marked: the follower fetched
        it at every fetch since then at the same offset, and nothing changed it, so if it was
        caught up at the fetch it was last read in, it was at its session's last fetch too (what
        Kafka records by reading every partition of the session at every fetch)."""
        partition = self._partitions.get(tp)
        follower = partition.followers.get(replica_id) if partition is not None else None
        if follower is not None and follower.log_end_offset >= follower.last_fetch_leader_log_end_offset:
            follower.last_caught_up_time_ms = max(follower.last_caught_up_time_ms, fetch_time_ms)
            follower.last_fetch_time_ms = max(follower.last_fetch_time_ms, fetch_time_ms)

    def report_log_start_offsets(self, tps: Iterable[TopicPartition] | None = None) -> None:
        """Wake fetches of the partitions (``tps``, else all hosted) whose log start offset moved,
        or whose log dir went offline, outside the fetch and produce paths since the last report:
        the broker calls this after each retention pass and each DeleteRecords."""
        seen = self._reported_log_states
        for tp in self._partitions if tps is None else tps:
            partition = self._partitions.get(tp)
            if partition is None:
                continue
            state = (partition.log_start_offset, partition.offline)
            if seen.get(tp) != state:
                self._wake_fetchers(tp)
                seen[tp] = state
        if tps is None:
            for tp in [tp for tp in seen if tp not in self._partitions]:
                del seen[tp]

    def wake_all_fetchers(self) -> None:
        for tp in list(self._fetch_waiters):
            self._wake_fetchers(tp)
