"""Followers' replica fetchers (Kafka's ReplicaFetcherThread, one per source broker).

Each fetcher is a task on the broker's event loop with one connection (strom's own
``BrokerConnection``, bound to the broker's listener address) to the leader of the partitions it
follows. A partition added in a new leader epoch first truncates (KIP-101/279): OffsetForLeaderEpoch
for its latest epoch, truncation to the leader's end offset of that epoch, again until the epochs
agree. Then it fetches with the real Fetch API as replica ``node_id`` (``replica_id`` before v15,
``replica_state`` from v15), sending its last fetched epoch; a ``diverging_epoch`` answer
(KIP-320) truncates the log again. Fetched batches are appended with their offsets and leader
epochs (``Log.append_as_follower``); the follower's HW is the leader's bounded by its own LEO.

Errors stay where they happen, as in Kafka's AbstractFetcherThread: one partition's failure to
truncate or append marks that partition failed (logged once, with its traceback) and the fetcher
goes on with the others; the partition is fetched again when a new state re-adds it. A failed
request (a lost connection, a timeout) backs the whole fetcher off; its first failure in a row is
logged with the cause. A fetcher left without partitions is shut down (Kafka's
shutdownIdleFetcherThreads), closing its fetch session on the leader and its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import logging
import time
import uuid
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strom.broker.partition import Partition, TopicPartition
from strom.network.connection import BrokerConnection, KafkaConnectionError
from strom.network.fetch_session_handler import FINAL_EPOCH, INVALID_SESSION_ID, FetchSessionHandler
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from strom.records import batch as rb

if TYPE_CHECKING:
    from strom.broker.config import KafkaConfig
    from strom.broker.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
# Fetch v12 brings diverging_epoch (KIP-320), the oldest version a follower uses; v17 is the
# newest whose fields a follower fills (v15+ carries the replica in replica_state).
FETCH_MIN_VERSION = 12
FETCH_MAX_VERSION = 17
OFFSET_FOR_LEADER_EPOCH_VERSION = (3, 4)  # v3 brings replica_id
LIST_OFFSETS_VERSION = (1, 8)
ZERO_UUID = uuid.UUID(int=0)
# A partition of the follower's fetch session: the partition and its topic's id.
SessionPartition = tuple[TopicPartition, uuid.UUID]
# Top-level fetch errors after which the follower opens a new session at once.
SESSION_ERRORS = frozenset({ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch})


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    """The broker's replica.* settings (Kafka's names and defaults)."""

    replica_lag_time_max_ms: int = 30_000
    replica_fetch_max_bytes: int = 1_048_576
    replica_fetch_min_bytes: int = 1
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_backoff_ms: int = 1_000
    replica_fetch_response_max_bytes: int = 10_485_760
    replica_socket_timeout_ms: int = 30_000
    replica_high_watermark_checkpoint_interval_ms: int = 5_000
    num_replica_fetchers: int = 1
    # The address fetchers connect from: the broker's own listener host (None: any).
    bind_host: str | None = None

    @classmethod
    def from_kafka_config(cls, config: KafkaConfig) -> ReplicationConfig:
        hosts = [listener.host for listener in config.client_listeners()]
        bind_host = hosts[0] if hosts and hosts[0] not in ("", "0.0.0.0", "::") else None
        return cls(
            replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            replica_fetch_max_bytes=config.replica_fetch_max_bytes,
            replica_fetch_min_bytes=config.replica_fetch_min_bytes,
            replica_fetch_wait_max_ms=config.replica_fetch_wait_max_ms,
            replica_fetch_backoff_ms=config.replica_fetch_backoff_ms,
            replica_fetch_response_max_bytes=config.replica_fetch_response_max_bytes,
            replica_socket_timeout_ms=config.replica_socket_timeout_ms,
            replica_high_watermark_checkpoint_interval_ms=config.replica_high_watermark_checkpoint_interval_ms,
            num_replica_fetchers=config.num_replica_fetchers,
            bind_host=bind_host,
        )


@dataclass(frozen=True, slots=True)
class FetchPartitionRequest:
    """What a follower's fetch asks of one partition; the fetch session sends it again only
    when it changed (compared by value, the partition's fetch state by identity)."""

    state: PartitionFetchState = field(compare=False)
    topic_id: uuid.UUID
    leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int


@dataclass(slots=True)
class PartitionFetchState:
    topic_id: uuid.UUID
    leader_epoch: int
    # Truncating by OffsetForLeaderEpoch before the first fetch of the epoch.
    truncating: bool = True
    # monotonic time before which the partition is not fetched (after an error).
    delayed_until: float = 0.0
    # Truncating or appending failed: not fetched until a new state re-adds the partition.
    failed: bool = False


def truncation_offset(partition: Partition, leader_epoch: int, leader_end_offset: int) -> tuple[int, bool]:
    """Where a follower truncates given the leader's (epoch, end offset) for the follower's latest
    epoch (Kafka's getOffsetTruncationState); the bool says whether the epochs now agree."""
    log_end = partition.log_end_offset
    if leader_end_offset < 0:
        # The leader knows no such epoch: keep what is committed.
        return min(partition.high_watermark, log_end), True
    if leader_epoch < 0:
        return min(leader_end_offset, log_end), True
    epoch, end_offset = partition.log.leader_epoch_cache.end_offset_for(leader_epoch, log_end)
    if epoch < 0:
        return min(leader_end_offset, log_end), True
    if epoch != leader_epoch:
        # We have no entry for the leader's epoch: cut ours back to it and ask again.
        return min(end_offset, log_end), False
    return min(leader_end_offset, end_offset, log_end), True


class ReplicaFetcher:
    """Fetches every partition this broker follows from one leader broker."""

    def __init__(self, manager: ReplicaFetcherManager, leader_id: int) -> None:
        self._manager = manager
        self.leader_id = leader_id
        self.partitions: dict[TopicPartition, PartitionFetchState] = {}
        self._changed = asyncio.Event()
        self._connection: BrokerConnection | None = None
        self._task: asyncio.Task[None] | None = None
        # KIP-227: one fetch session with the leader, kept across reconnections as Kafka does.
        self._session: FetchSessionHandler[SessionPartition, FetchPartitionRequest] = FetchSessionHandler()
        self._session_uses_topic_ids = True
        # The address the connection was meant to come from (see _connect).
        self._wanted_local_host: str | None = None
        # Set when the manager shuts this fetcher down for following nothing any more.
        self._idle = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replica-fetcher-{self.leader_id}"
        )

    def wake(self) -> None:
        self._changed.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._disconnect()

    async def shutdown_idle(self) -> None:
        """Stop once the request in flight is answered (so the fetch session is the one the leader
        knows), close that session on the leader (KIP-227's final epoch: its slot in the leader's
        session cache is free at once; best effort), then the connection."""
        self._idle = True
        self.wake()
        try:
            if self._task is not None:
                await self._task
            connection, session_id = self._connection, self._session.session_id
            if connection is not None and connection.is_open and session_id != INVALID_SESSION_ID:
                await self._close_session(connection, session_id)
        except Exception as e:  # the leader may be gone: its sessions went with it
            log.debug("closing the fetch session failed", extra={"leader": self.leader_id, "error": repr(e)})
        finally:
            self._disconnect()

    async def _close_session(self, connection: BrokerConnection, session_id: int) -> None:
        version = connection.version(ApiKey.FETCH, FETCH_MAX_VERSION, FETCH_MIN_VERSION)
        module = request_module(ApiKey.FETCH, version)
        request = build(
            module.FetchRequest,
            max_wait=datetime.timedelta(0),
            min_bytes=0,
            max_bytes=0,
            isolation_level=0,
            session_id=session_id,
            session_epoch=FINAL_EPOCH,
            topics=(),
            forgotten_topics_data=(),
            rack_id="",
            **self._replica_fields(module, version),
        )
        await connection.send(request, timeout=self._manager.config.replica_socket_timeout_ms / 1000)

    def _replica_fields(self, module: Any, version: int) -> dict[str, Any]:
        """Who fetches: ``replica_id``, from v15 ``replica_state`` with this broker's epoch
        (KIP-903: the leader serves a replica fetch only with the broker's current epoch)."""
        node_id = self._replica_manager.node_id
        if version < 15:
            return {"replica_id": node_id}
        epoch = self._replica_manager.broker_epoch(node_id)
        return {
            "replica_state": module.ReplicaState(
                replica_id=node_id, replica_epoch=-1 if epoch is None else epoch
            )
        }

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    @property
    def _replica_manager(self) -> ReplicaManager:
        return self._manager.replica_manager

    async def _run(self) -> None:
        config = self._manager.config
        failures = 0
        while not self._idle:
            try:
                await self._do_work()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # Connection loss, timeouts, a leader gone: back off, reconnect, go on. The first
                # failure of a run is a warning (with the traceback if it is no network error);
                # the retries (every replica.fetch.backoff.ms, until a new leader is known) are
                # debug lines, so a dead leader does not flood the log.
                failures += 1
                log.log(
                    logging.WARNING if failures == 1 else logging.DEBUG,
                    "replica fetcher failed; retrying",
                    exc_info=failures == 1 and not isinstance(e, OSError | TimeoutError),
                    extra={
                        "leader": self.leader_id,
                        "error": f"{type(e).__name__}: {e}",
                        "failures": failures,
                    },
                )
                self._disconnect()
                await asyncio.sleep(config.replica_fetch_backoff_ms / 1000)

    async def _do_work(self) -> None:
        now = time.monotonic()
        ready = {
            tp: state
            for tp, state in self.partitions.items()
            if state.delayed_until <= now and not state.failed
        }
        if not ready:
            self._changed.clear()
            delays = [state.delayed_until - now for state in self.partitions.values() if not state.failed]
            try:
                async with asyncio.timeout(min(delays) if delays else None):
                    await self._changed.wait()
            except TimeoutError:
                pass
            return
        connection = await self._connect()
        truncating = {tp: state for tp, state in ready.items() if state.truncating}
        if truncating:
            await self._truncate(connection, truncating)
        else:
            await self._fetch(connection, ready)

    async def _connect(self) -> BrokerConnection:
        endpoint = self._replica_manager.peer_endpoint(self.leader_id)
        if endpoint is None:
            raise ConnectionError(f"broker {self.leader_id} is not registered")
        config = self._manager.config
        # Leaders serve replica fetches only from this broker's registered host: connect from it.
        # A wildcard listener has no address of its own; the registered (advertised) host then,
        # unless it is no address of this machine (behind NAT, say).
        own = self._replica_manager.broker_endpoint(self._replica_manager.node_id)
        local_host = config.bind_host or (own[0] if own is not None else None)
        connection = self._connection
        if (
            connection is not None
            and connection.is_open
            and (connection.host, connection.port) == endpoint
            and self._wanted_local_host == local_host
        ):
            return connection
        self._disconnect()
        self._wanted_local_host = local_host
        try:
            self._connection = await self._open(endpoint, local_host)
        except KafkaConnectionError as e:
            cause = e.__cause__
            if local_host == config.bind_host or not (
                isinstance(cause, OSError) and cause.errno == errno.EADDRNOTAVAIL
            ):
                raise
            self._connection = await self._open(endpoint, config.bind_host)
        return self._connection

    async def _open(self, endpoint: tuple[str, int], local_host: str | None) -> BrokerConnection:
        return await BrokerConnection.open(
            endpoint[0],
            endpoint[1],
            client_id=f"broker-{self._replica_manager.node_id}-fetcher-{self.leader_id}",
            timeout=self._manager.config.replica_socket_timeout_ms / 1000,
            local_host=local_host,
        )

    def _current(self, tp: TopicPartition, state: PartitionFetchState) -> Partition | None:
        """The follower partition if ``state`` is still how this fetcher follows it."""
        if self.partitions.get(tp) is not state:
            return None
        partition = self._replica_manager.partition(tp)
        if partition is None or partition.is_leader or partition.offline:
            return None
        return partition

    def _delay(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        state.delayed_until = time.monotonic() + self._manager.config.replica_fetch_backoff_ms / 1000

    def _fail(self, tp: TopicPartition, state: PartitionFetchState, what: str) -> None:
        """Mark ``tp`` failed (Kafka's markPartitionFailed), logged once with the exception being
        handled; the fetcher's other partitions go on. A partition that left this fetcher (or
        went offline with its log dir, logged there) while its I/O ran is not failed: its log
        was closed under the append or truncation (a deleted topic), and nothing is wrong."""
        if self._current(tp, state) is None:
            log.debug(
                "replica fetcher: partition left while its I/O ran",
                exc_info=True,
                extra={"partition": str(tp), "leader": self.leader_id, "while": what},
            )
            return
        state.failed = True
        log.error(
            "replica fetcher: partition failed; it is not fetched until its next state",
            exc_info=True,
            extra={"partition": str(tp), "leader": self.leader_id, "while": what},
        )

    # -- truncation (KIP-101/279) ---------------------------------------------------------------

    async def _truncate(
        self, connection: BrokerConnection, states: dict[TopicPartition, PartitionFetchState]
    ) -> None:
        asked: dict[TopicPartition, PartitionFetchState] = {}
        by_topic: dict[str, list[Any]] = defaultdict(list)
        low, high = OFFSET_FOR_LEADER_EPOCH_VERSION
        version = connection.version(ApiKey.OFFSET_FOR_LEADER_EPOCH, high, low)
        module = request_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, version)
        for tp, state in states.items():
            partition = self._current(tp, state)
            if partition is None:
                self._delay(tp, state)  # see _fetch
                continue
            latest = partition.log.leader_epoch_cache.latest_epoch
            if latest is None:
                # No epochs (an empty log, or one older than epochs): keep what is committed.
                try:
                    await partition.truncate_to(partition.high_watermark)
                except Exception:
                    self._fail(tp, state, "truncating")
                    continue
                state.truncating = False
                continue
            asked[tp] = state
            by_topic[tp.topic].append(
                build(
                    module.OffsetForLeaderPartition,
                    partition=tp.partition,
                    current_leader_epoch=state.leader_epoch,
                    leader_epoch=latest,
                )
            )
        if not by_topic:
            return
        request = build(
            module.OffsetForLeaderEpochRequest,
            replica_id=self._replica_manager.node_id,
            topics=tuple(
                build(module.OffsetForLeaderTopic, topic=topic, partitions=tuple(parts))
                for topic, parts in by_topic.items()
            ),
        )
        response = await connection.send(
            request, timeout=self._manager.config.replica_socket_timeout_ms / 1000
        )
        for topic in response.topics:
            for answer in topic.partitions:
                tp = TopicPartition(topic.topic, answer.partition)
                asked_state = asked.get(tp)
                if asked_state is None:
                    continue
                state = asked_state
                partition = self._current(tp, state)
                if partition is None:
                    continue
                if answer.error_code != ErrorCode.none:
                    log.info(
                        "OffsetForLeaderEpoch failed; retrying",
                        extra={"partition": str(tp), "error": ErrorCode(answer.error_code).name},
                    )
                    self._delay(tp, state)
                    continue
                try:
                    offset, done = truncation_offset(partition, answer.leader_epoch, answer.end_offset)
                    await self._truncate_partition(partition, offset)
                except Exception:
                    self._fail(tp, state, "truncating")
                    continue
                state.truncating = not done

    async def _truncate_partition(self, partition: Partition, offset: int) -> None:
        if offset < partition.log_end_offset:
            log.info(
                "truncating follower log",
                extra={"partition": str(partition.tp), "from": partition.log_end_offset, "to": offset},
            )
            await partition.truncate_to(offset)

    # -- fetching -------------------------------------------------------------------------------

    async def _fetch(
        self, connection: BrokerConnection, states: dict[TopicPartition, PartitionFetchState]
    ) -> None:
        config = self._manager.config
        version = connection.version(ApiKey.FETCH, FETCH_MAX_VERSION, FETCH_MIN_VERSION)
        module = request_module(ApiKey.FETCH, version)
        by_id = version >= 13
        # What this fetch asks of every partition; the session sends only what changed. A topic
        # deleted and created again under its name is another partition: keyed with its id.
        wanted: dict[SessionPartition, FetchPartitionRequest] = {}
        for tp, state in states.items():
            partition = self._current(tp, state)
            if partition is None:
                # Offline (its log dir failed with another partition's append) or no longer
                # followed from here: not ready again before the backoff, or a fetcher left with
                # nothing to ask would loop on the event loop without ever awaiting, and the broker
                # would stop answering anyone.
                self._delay(tp, state)
                continue
            latest = partition.log.leader_epoch_cache.latest_epoch
            wanted[(tp, state.topic_id)] = FetchPartitionRequest(
                state,
                state.topic_id,
                state.leader_epoch,
                partition.log_end_offset,
                -1 if latest is None else latest,
                partition.log_start_offset,
            )
        if not wanted:
            return
        session = self._session
        if by_id != self._session_uses_topic_ids:
            # A session is tied to whether it names topics by id: a new version needs a new one.
            session.close_existing()
            self._session_uses_topic_ids = by_id
        next_fetch = session.build(wanted)
        by_topic: dict[tuple[str, uuid.UUID], list[Any]] = defaultdict(list)
        for (tp, _), data in next_fetch.to_send.items():
            by_topic[(tp.topic, data.topic_id)].append(
                build(
                    module.FetchPartition,
                    partition=tp.partition,
                    current_leader_epoch=data.leader_epoch,
                    fetch_offset=data.fetch_offset,
                    last_fetched_epoch=data.last_fetched_epoch,
                    log_start_offset=data.log_start_offset,
                    partition_max_bytes=config.replica_fetch_max_bytes,
                )
            )
        forgotten: dict[tuple[str, uuid.UUID], list[int]] = defaultdict(list)
        for tp, topic_id in next_fetch.to_forget:
            forgotten[(tp.topic, topic_id)].append(tp.partition)
        names = {topic_id: tp.topic for tp, topic_id in wanted}
        topics = tuple(
            build(module.FetchTopic, topic=name, topic_id=topic_id, partitions=tuple(parts))
            for (name, topic_id), parts in by_topic.items()
        )
        forgotten_topics = tuple(
            build(module.ForgottenTopic, topic=name, topic_id=topic_id, partitions=tuple(parts))
            for (name, topic_id), parts in forgotten.items()
        )
        request = build(
            module.FetchRequest,
            max_wait=datetime.timedelta(milliseconds=config.replica_fetch_wait_max_ms),
            min_bytes=config.replica_fetch_min_bytes,
            max_bytes=config.replica_fetch_response_max_bytes,
            isolation_level=0,
            session_id=next_fetch.session_id,
            session_epoch=next_fetch.epoch,
            topics=topics,
            forgotten_topics_data=forgotten_topics,
            rack_id="",
            **self._replica_fields(module, version),
        )
        timeout = (config.replica_socket_timeout_ms + config.replica_fetch_wait_max_ms) / 1000
        try:
            response = await connection.send(request, timeout=timeout)
        except BaseException:
            session.handle_error()
            raise
        error = ErrorCode(response.error_code)
        if not session.handle_response(next_fetch, error, response.session_id):
            if error in SESSION_ERRORS:
                # The leader lost the session (evicted, restarted) or the epochs differ: the
                # next fetch is full and opens a new session, at once.
                log.info("fetch session reset", extra={"leader": self.leader_id, "error": error.name})
                return
            raise ConnectionError(f"fetch from broker {self.leader_id} failed: {error.name}")
        sent_ids = {} if by_id else {tp: topic_id for tp, topic_id in wanted}
        out_of_range: list[tuple[TopicPartition, PartitionFetchState]] = []
        for topic in response.responses:
            name = names.get(topic.topic_id) if by_id else topic.topic
            if name is None:
                continue
            for data in topic.partitions:
                tp = TopicPartition(name, data.partition_index)
                sent = wanted.get((tp, topic.topic_id if by_id else sent_ids.get(tp, ZERO_UUID)))
                if sent is None:
                    continue
                state = sent.state
                partition = self._current(tp, state)
                if partition is None or partition.log_end_offset != sent.fetch_offset:
                    # Removed, re-added or truncated since the request: this answer is dropped,
                    # and the leader, which thinks it was delivered, will not repeat its high
                    # watermark; a full fetch next time brings every partition's up to date.
                    session.close_existing()
                    continue
                partition_error = ErrorCode(data.error_code)
                if partition_error == ErrorCode.none:
                    try:
                        await self._process(partition, state, data)
                    except Exception:
                        self._fail(tp, state, "appending")
                elif partition_error == ErrorCode.offset_out_of_range:
                    out_of_range.append((tp, state))
                else:
                    # NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, ...: the leader's
                    # view differs from ours; a new partition state will come.
                    log.debug(
                        "replica fetch error; retrying",
                        extra={"partition": str(tp), "error": partition_error.name},
                    )
                    self._delay(tp, state)
        for tp, state in out_of_range:
            await self._handle_out_of_range(connection, tp, state)

    async def _process(self, partition: Partition, state: PartitionFetchState, data: Any) -> None:
        tp = partition.tp
        diverging = getattr(data, "diverging_epoch", None)
        if diverging is not None and (diverging.epoch >= 0 or diverging.end_offset >= 0):
            offset, _ = truncation_offset(partition, diverging.epoch, diverging.end_offset)
            await self._truncate_partition(partition, offset)
            return
        if data.records:
            await self._start_at_first_batch(partition, data.records)
            if self._current(tp, state) is not partition:
                return  # led here, removed or re-added while the restart ran off the loop
            await partition.append_records_as_follower(data.records)
            if self._current(tp, state) is not partition:
                return  # led here, removed or re-added while the append ran off the loop
        partition.update_follower_high_watermark(data.high_watermark)
        partition.log.follow_log_start_offset(data.log_start_offset, partition.high_watermark)

    @staticmethod
    async def _start_at_first_batch(partition: Partition, records: bytes) -> None:
        """An empty log whose start falls inside the leader's first batch restarts at that batch's
        first offset (as Kafka's follower does on UnexpectedAppendOffsetException): DeleteRecords
        moves the leader's log start to any offset, mid-batch too, and a follower restarted there
        is answered with the whole batch. Its log start then follows the leader's again."""
        log_ = partition.log
        end = log_.log_end_offset
        if end != log_.log_start_offset or len(records) < rb.HEADER_SIZE:
            return
        try:
            header = rb.read_header(records)
        except rb.InvalidBatchError:
            return  # the append reports it
        if header.base_offset < end <= header.last_offset:
            log.info(
                "follower log starts inside the leader's first batch: restarting it at the batch",
                extra={"partition": str(partition.tp), "log_start_offset": end, "to": header.base_offset},
            )
            await partition.truncate_fully_and_start_at(header.base_offset)

    async def _handle_out_of_range(
        self, connection: BrokerConnection, tp: TopicPartition, state: PartitionFetchState
    ) -> None:
        """The follower's LEO is outside the leader's log (Kafka's handleOutOfRangeError): above the
        leader's LEO, truncate to it; below the leader's log start, restart the log there."""
        leader_end = await self._leader_offset(connection, tp, state, LATEST_TIMESTAMP)
        leader_start = await self._leader_offset(connection, tp, state, EARLIEST_TIMESTAMP)
        partition = self._current(tp, state)
        if partition is None or leader_end is None or leader_start is None:
            self._delay(tp, state)
            return
        try:
            if leader_end < partition.log_end_offset:
                await self._truncate_partition(partition, leader_end)
            elif partition.log_end_offset < leader_start:
                log.info(
                    "follower behind the leader's log start: restarting its log there",
                    extra={
                        "partition": str(tp),
                        "log_end_offset": partition.log_end_offset,
                        "to": leader_start,
                    },
                )
                await partition.truncate_fully_and_start_at(leader_start)
        except Exception:
            self._fail(tp, state, "truncating to the leader's log")

    async def _leader_offset(
        self, connection: BrokerConnection, tp: TopicPartition, state: PartitionFetchState, timestamp: int
    ) -> int | None:
        version = connection.version(ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION[1], LIST_OFFSETS_VERSION[0])
        module = request_module(ApiKey.LIST_OFFSETS, version)
        request = build(
            module.ListOffsetsRequest,
            replica_id=self._replica_manager.node_id,
            isolation_level=0,
            topics=(
                build(
                    module.ListOffsetsTopic,
                    name=tp.topic,
                    partitions=(
                        build(
                            module.ListOffsetsPartition,
                            partition_index=tp.partition,
                            current_leader_epoch=state.leader_epoch,
                            timestamp=timestamp,
                            max_num_offsets=1,
                        ),
                    ),
                ),
            ),
        )
        response = await connection.send(
            request, timeout=self._manager.config.replica_socket_timeout_ms / 1000
        )
        for topic in response.topics:
            for answer in topic.partitions:
                if answer.error_code == ErrorCode.none:
                    return int(answer.offset)
        return None


class ReplicaFetcherManager:
    """The fetchers of one broker: num.replica.fetchers per leader it follows, each partition
    with the one its topic and partition hash to (Kafka's getFetcherId). A fetcher left without
    partitions is shut down once the change that emptied it is done (a partition moving to a new
    epoch of the same leader is removed and added again at once: its fetcher stays)."""

    def __init__(self, replica_manager: ReplicaManager, config: ReplicationConfig) -> None:
        self.replica_manager = replica_manager
        self.config = config
        self._fetchers: dict[tuple[int, int], ReplicaFetcher] = {}
        # Idle fetchers being shut down, and whether a check for idle fetchers is scheduled.
        self._stopping: set[asyncio.Task[None]] = set()
        self._idle_check: asyncio.Handle | None = None
        # Once shut down (the broker is leaving: a controlled shutdown), no partition is followed
        # again, so no leader takes this broker back into its ISR on its way out.
        self._closed = False

    @property
    def fetcher_count(self) -> int:
        return len(self._fetchers)

    @property
    def failed_partitions(self) -> list[TopicPartition]:
        """Partitions marked failed (Kafka's FailedPartitionsCount), until a new state re-adds them."""
        return [tp for f in self._fetchers.values() for tp, state in f.partitions.items() if state.failed]

    def add_partition(
        self, tp: TopicPartition, topic_id: uuid.UUID, leader_id: int, leader_epoch: int
    ) -> None:
        """Follow ``tp`` from ``leader_id`` in ``leader_epoch``, truncating first."""
        self.remove_partitions([tp])
        if self._closed:
            return
        # A stable hash (Python's str hash differs between processes).
        spread = zlib.crc32(tp.topic.encode()) * 31 + tp.partition
        key = (leader_id, spread % max(1, self.config.num_replica_fetchers))
        fetcher = self._fetchers.get(key)
        if fetcher is None:
            fetcher = self._fetchers[key] = ReplicaFetcher(self, leader_id)
            fetcher.start()
        fetcher.partitions[tp] = PartitionFetchState(topic_id, leader_epoch)
        fetcher.wake()

    def remove_partitions(self, tps: list[TopicPartition]) -> None:
        for fetcher in self._fetchers.values():
            for tp in tps:
                fetcher.partitions.pop(tp, None)
        if self._idle_check is None and not self._closed:
            self._idle_check = asyncio.get_running_loop().call_soon(self._shutdown_idle_fetchers)

    def _shutdown_idle_fetchers(self) -> None:
        """Kafka's shutdownIdleFetcherThreads: stop the fetchers that follow nothing any more."""
        self._idle_check = None
        for key, fetcher in list(self._fetchers.items()):
            if not fetcher.partitions:
                del self._fetchers[key]
                task = asyncio.get_running_loop().create_task(
                    fetcher.shutdown_idle(), name=f"replica-fetcher-{fetcher.leader_id}-shutdown"
                )
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)

    async def shutdown(self) -> None:
        self._closed = True
        if self._idle_check is not None:
            self._idle_check.cancel()
            self._idle_check = None
        fetchers, self._fetchers = self._fetchers, {}
        stopping = list(self._stopping)
        for task in stopping:
            task.cancel()  # no session to close on the way out: the connections close
        await asyncio.gather(
            *(fetcher.stop() for fetcher in fetchers.values()), *stopping, return_exceptions=True
        )
