"""Followers' replica fetchers (Kafka's AbstractFetcherThread/ReplicaFetcherThread, one per source
broker).

Each fetcher is a task on the broker's event loop that sees its leader only through a
``LeaderEndPoint`` (leader_endpoint.py: Fetch, OffsetForLeaderEpoch, ListOffsets; over the
inter-broker connection in a broker, a fake in unit tests) and the replica manager only through
``FollowerReplicas`` (the follower partitions), so it is tested in process and does not import the
replica manager.

Every partition it follows has a ``PartitionFetchState`` (Kafka's): its current leader epoch, its
fetch offset, and whether it is truncating or fetching; a partition is delayed (after an error, for
replica.fetch.backoff.ms) or failed (until a new state re-adds it). A partition added in a new
leader epoch first truncates (KIP-101/279): OffsetForLeaderEpoch for its latest epoch, truncation
to the leader's end offset of that epoch, again until the epochs agree. Then it fetches, sending
its last fetched epoch; a diverging epoch in the answer (KIP-320) truncates the log again, an
out-of-range answer truncates to the leader's log end or restarts the log at the leader's log
start. Fetched batches are appended with their offsets and leader epochs
(``Partition.append_records_as_follower``); the follower's HW is the leader's bounded by its LEO.

Errors stay where they happen, as in Kafka: one partition's failure to truncate or append marks
that partition failed (logged once, with its traceback) and the fetcher goes on with the others.
A failed request (a lost connection, a timeout) backs the whole fetcher off; its first failure in
a row is logged with the cause. A fetcher left without partitions is shut down (Kafka's
shutdownIdleFetcherThreads), closing its fetch session on the leader and its connection.

A round costs what changed, not how many partitions are followed (Kafka's buildFetch looks at
every partition each round; at a few thousand partitions a round of that in Python took longer
than the replication it served). The fetcher keeps each fetched partition's request between
rounds and rebuilds only those marked stale: partitions added or removed, answered (appended to,
truncated, their log start moved), delayed or back from a delay, failed. What no event tells
the fetcher -- its own log's retention moving the log start offset, a log dir gone offline --
is caught by a rescan of every partition every ``RESCAN_INTERVAL_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from strom.broker.leader_endpoint import (
    BrokerDirectory,
    EpochEndOffset,
    FetchedPartition,
    FetchPartition,
    LeaderEndPoint,
    RemoteLeaderEndPoint,
)
from strom.broker.partition import Partition, TopicPartition
from strom.protocol.errors import ErrorCode
from strom.records import batch as rb

if TYPE_CHECKING:
    from strom.broker.config import KafkaConfig

log = logging.getLogger(__name__)

# How often a fetcher rebuilds every partition's request (see the module's docstring).
RESCAN_INTERVAL_S = 5.0


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


class FollowerReplicas(BrokerDirectory, Protocol):
    """What the fetchers need of the replica manager: the partition a fetched partition is
    appended to, and (for the network endpoint) this broker's id and epoch and the brokers'
    addresses."""

    def partition(self, tp: TopicPartition) -> Partition | None: ...


class ReplicaState(enum.Enum):
    """Kafka's ReplicaState: a partition truncates (OffsetForLeaderEpoch) before it fetches."""

    TRUNCATING = "truncating"
    FETCHING = "fetching"


@dataclass(slots=True)
class PartitionFetchState:
    """One followed partition (Kafka's PartitionFetchState)."""

    topic_id: uuid.UUID
    current_leader_epoch: int
    # Where the next fetch starts: the log end, known once truncation is done.
    fetch_offset: int = -1
    state: ReplicaState = ReplicaState.TRUNCATING
    # monotonic time before which the partition is not fetched (after an error).
    delayed_until: float = 0.0
    # Truncating or appending failed: not fetched until a new state re-adds the partition.
    failed: bool = False
    # The last request built for the partition, reused while nothing changed: the fetch session
    # then finds it unchanged by identity, and a fetch of many idle partitions builds nothing.
    request: FetchPartition | None = None

    @property
    def truncating(self) -> bool:
        return self.state is ReplicaState.TRUNCATING

    def is_ready(self, now: float) -> bool:
        return not self.failed and self.delayed_until <= now

    def fetching_at(self, offset: int) -> None:
        """Truncation is done, or the log moved: the next fetch starts at ``offset``."""
        self.state = ReplicaState.FETCHING
        if offset != self.fetch_offset:
            self.fetch_offset = offset
            self.request = None


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

    def __init__(
        self, replicas: FollowerReplicas, endpoint: LeaderEndPoint, backoff_ms: Callable[[], int]
    ) -> None:
        self._replicas = replicas
        self.endpoint = endpoint
        self._backoff_ms = backoff_ms
        self.partitions: dict[TopicPartition, PartitionFetchState] = {}
        # The next fetch's request of each partition fetched now, with the state it was built
        # from; the partitions to rebuild before it, those to truncate and those delayed; and
        # the partitions whose request changed since the last fetch (for its session).
        self._requests: dict[TopicPartition, FetchPartition] = {}
        self._request_states: dict[TopicPartition, PartitionFetchState] = {}
        self._stale: set[TopicPartition] = set()
        self._truncating: set[TopicPartition] = set()
        self._delayed: set[TopicPartition] = set()
        self._unsent: set[TopicPartition] = set()
        self._rescan_at = 0.0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Set when the manager shuts this fetcher down for following nothing any more.
        self._idle = False

    @property
    def leader_id(self) -> int:
        return self.endpoint.leader_id

    def add_partition(self, tp: TopicPartition, topic_id: uuid.UUID, leader_epoch: int) -> None:
        self.partitions[tp] = PartitionFetchState(topic_id, leader_epoch)
        self._stale.add(tp)
        self.wake()

    def remove_partition(self, tp: TopicPartition) -> None:
        if self.partitions.pop(tp, None) is not None:
            self._stale.add(tp)

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
        self.endpoint.close()

    async def shutdown_idle(self) -> None:
        """Stop once the request in flight is answered (so the fetch session is the one the leader
        knows), close that session on the leader (best effort), then the connection."""
        self._idle = True
        self.wake()
        try:
            if self._task is not None:
                await self._task
            await self.endpoint.close_session()
        except Exception as e:  # the leader may be gone: its sessions went with it
            log.debug("closing the fetch session failed", extra={"leader": self.leader_id, "error": repr(e)})
        finally:
            self.endpoint.close()

    async def _run(self) -> None:
        failures = 0
        while not self._idle:
            try:
                await self.do_work()
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
                self.endpoint.close()
                await asyncio.sleep(self._backoff_ms() / 1000)

    async def do_work(self) -> None:
        """One round (Kafka's doWork): truncate the partitions that are truncating, else fetch the
        ready ones; with none ready, wait for a change or the end of the shortest delay."""
        now = time.monotonic()
        if now >= self._rescan_at:
            self._stale.update(self.partitions)
            self._rescan_at = now + RESCAN_INTERVAL_S
        if self._delayed:
            over = [tp for tp in self._delayed if (st := self.partitions.get(tp)) is None or st.delayed_until <= now]
            self._delayed.difference_update(over)
            self._stale.update(over)
        if self._stale:
            self._rebuild(now)
        if self._truncating:
            truncating = {tp: self.partitions[tp] for tp in self._truncating}
            self._truncating.clear()
            self._stale.update(truncating)  # truncated, fetching, delayed or failed: rebuilt next round
            await self._truncate(truncating)
            return
        if not self._requests:
            self._changed.clear()
            if self._stale:
                return  # changed while this round ran
            delays = [st.delayed_until - now for tp in self._delayed if (st := self.partitions.get(tp))]
            try:
                async with asyncio.timeout(max(0.0, min(delays)) if delays else None):
                    await self._changed.wait()
            except TimeoutError:
                pass
            return
        await self._fetch()

    def _rebuild(self, now: float) -> None:
        """Rebuild the stale partitions' requests (and drop those not fetched now)."""
        stale, self._stale = self._stale, set()
        self._unsent |= stale
        requests, request_states = self._requests, self._request_states
        for tp in stale:
            state = self.partitions.get(tp)
            if state is None or state.failed:
                state = None
            elif state.delayed_until > now:
                self._delayed.add(tp)
                state = None
            elif state.state is ReplicaState.TRUNCATING:
                self._truncating.add(tp)
                state = None
            if state is None:  # not fetched this round
                requests.pop(tp, None)
                request_states.pop(tp, None)
                continue
            partition = self._current(tp, state)
            if partition is None:
                # Offline (its log dir failed with another partition's append) or no longer
                # followed from here: not ready again before the backoff, or a fetcher left with
                # nothing to ask would loop on the event loop without ever awaiting, and the broker
                # would stop answering anyone.
                self._delay(tp, state)
                requests.pop(tp, None)
                request_states.pop(tp, None)
                continue
            request = state.request
            log_ = partition.log
            if (
                request is None
                or request.fetch_offset != log_.log_end_offset
                or request.log_start_offset != log_.log_start_offset
            ):
                # The log moved since (an append, or what the fetcher does not see: a retention or
                # a truncation on the log's own path): ask from where it ends now.
                state.fetch_offset = log_.log_end_offset
                latest = log_.leader_epoch_cache.latest_epoch
                request = state.request = FetchPartition(
                    state.topic_id,
                    state.current_leader_epoch,
                    state.fetch_offset,
                    -1 if latest is None else latest,
                    log_.log_start_offset,
                )
            requests[tp] = request
            request_states[tp] = state

    def _current(self, tp: TopicPartition, state: PartitionFetchState) -> Partition | None:
        """The follower partition if ``state`` is still how this fetcher follows it."""
        if self.partitions.get(tp) is not state:
            return None
        partition = self._replicas.partition(tp)
        # is_leader and offline, inlined: this runs for every partition of every fetch.
        if partition is None or partition.leader_id == partition.local_id or partition.log.offline:
            return None
        return partition

    def _delay(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        state.delayed_until = time.monotonic() + self._backoff_ms() / 1000
        self._stale.add(tp)

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
        self._stale.add(tp)
        log.error(
            "replica fetcher: partition failed; it is not fetched until its next state",
            exc_info=True,
            extra={"partition": str(tp), "leader": self.leader_id, "while": what},
        )

    # -- truncation (KIP-101/279) ---------------------------------------------------------------

    async def _truncate(self, states: dict[TopicPartition, PartitionFetchState]) -> None:
        asked: dict[TopicPartition, PartitionFetchState] = {}
        epochs: dict[TopicPartition, tuple[int, int]] = {}
        for tp, state in states.items():
            partition = self._current(tp, state)
            if partition is None:
                self._delay(tp, state)  # see _rebuild
                continue
            latest = partition.log.leader_epoch_cache.latest_epoch
            if latest is None:
                # No epochs (an empty log, or one older than epochs): keep what is committed.
                try:
                    await partition.truncate_to(partition.high_watermark)
                except Exception:
                    self._fail(tp, state, "truncating")
                    continue
                state.fetching_at(partition.log_end_offset)
                continue
            asked[tp] = state
            epochs[tp] = (state.current_leader_epoch, latest)
        if not epochs:
            return
        answers = await self.endpoint.fetch_epoch_end_offsets(epochs)
        for tp, state in asked.items():
            answer = answers.get(tp)
            partition = self._current(tp, state)
            if answer is None or partition is None:
                continue
            await self._truncate_by_epoch(tp, state, partition, answer)

    async def _truncate_by_epoch(
        self, tp: TopicPartition, state: PartitionFetchState, partition: Partition, answer: EpochEndOffset
    ) -> None:
        if answer.error != ErrorCode.none:
            log.info(
                "OffsetForLeaderEpoch failed; retrying",
                extra={"partition": str(tp), "error": answer.error.name},
            )
            self._delay(tp, state)
            return
        try:
            offset, done = truncation_offset(partition, answer.leader_epoch, answer.end_offset)
            await self._truncate_partition(partition, offset)
        except Exception:
            self._fail(tp, state, "truncating")
            return
        if done:
            state.fetching_at(partition.log_end_offset)

    async def _truncate_partition(self, partition: Partition, offset: int) -> None:
        if offset < partition.log_end_offset:
            log.info(
                "truncating follower log",
                extra={"partition": str(partition.tp), "from": partition.log_end_offset, "to": offset},
            )
            await partition.truncate_to(offset)

    # -- fetching -------------------------------------------------------------------------------

    async def _fetch(self) -> None:
        # What this fetch asks of every partition; the session sends only what changed.
        # Only this task changes them (in _rebuild), not while the fetch or an append awaits.
        wanted, states = self._requests, self._request_states
        changed, self._unsent = self._unsent, set()
        answers = await self.endpoint.fetch(wanted, changed)
        out_of_range: list[tuple[TopicPartition, PartitionFetchState]] = []
        for tp, answer in answers.items():
            state = states[tp]
            self._stale.add(tp)  # its log, or how it is fetched, may change now
            partition = self._current(tp, state)
            if partition is None or partition.log_end_offset != wanted[tp].fetch_offset:
                # Removed, re-added or truncated since the request: this answer is dropped,
                # and the leader, which thinks it was delivered, will not repeat its high
                # watermark; a full fetch next time brings every partition's up to date.
                self.endpoint.reset_session()
                continue
            error = answer.error
            if error == ErrorCode.none:
                try:
                    await self._process(partition, state, answer)
                except Exception:
                    self._fail(tp, state, "appending")
            elif error == ErrorCode.offset_out_of_range:
                out_of_range.append((tp, state))
            else:
                # NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, ...: the leader's
                # view differs from ours; a new partition state will come.
                log.debug("replica fetch error; retrying", extra={"partition": str(tp), "error": error.name})
                self._delay(tp, state)
        for tp, state in out_of_range:
            await self._handle_out_of_range(tp, state)

    async def _process(
        self, partition: Partition, state: PartitionFetchState, answer: FetchedPartition
    ) -> None:
        tp = partition.tp
        if answer.diverging_epoch is not None:
            epoch, end_offset = answer.diverging_epoch
            offset, _ = truncation_offset(partition, epoch, end_offset)
            await self._truncate_partition(partition, offset)
            return
        records = answer.records
        if records:
            log_ = partition.log
            if log_.log_end_offset == log_.log_start_offset:
                await self._start_at_first_batch(partition, records)
                if self._current(tp, state) is not partition:
                    return  # led here, removed or re-added while the restart ran off the loop
            await partition.append_records_as_follower(records)
            if self._current(tp, state) is not partition:
                return  # led here, removed or re-added while the append ran off the loop
        partition.update_follower_high_watermark(answer.high_watermark)
        partition.log.follow_log_start_offset(answer.log_start_offset, partition.high_watermark)

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

    async def _handle_out_of_range(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        """The follower's LEO is outside the leader's log (Kafka's handleOutOfRangeError): above the
        leader's LEO, truncate to it; below the leader's log start, restart the log there."""
        leader_end = await self.endpoint.fetch_latest_offset(tp, state.current_leader_epoch)
        leader_start = await self.endpoint.fetch_earliest_offset(tp, state.current_leader_epoch)
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


class ReplicaFetcherManager:
    """The fetchers of one broker: num.replica.fetchers per leader it follows, each partition
    with the one its topic and partition hash to (Kafka's getFetcherId). A fetcher left without
    partitions is shut down once the change that emptied it is done (a partition moving to a new
    epoch of the same leader is removed and added again at once: its fetcher stays)."""

    def __init__(
        self,
        replicas: FollowerReplicas,
        config: ReplicationConfig,
        endpoint_factory: Callable[[int], LeaderEndPoint] | None = None,
    ) -> None:
        self._replicas = replicas
        self.config = config
        # How a fetcher reaches leader ``leader_id``: over the network unless a test says otherwise.
        self._endpoint_factory = endpoint_factory or (
            lambda leader_id: RemoteLeaderEndPoint(leader_id, replicas, lambda: self.config)
        )
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
            fetcher = ReplicaFetcher(
                self._replicas,
                self._endpoint_factory(leader_id),
                lambda: self.config.replica_fetch_backoff_ms,
            )
            self._fetchers[key] = fetcher
            fetcher.start()
        fetcher.add_partition(tp, topic_id, leader_epoch)

    def remove_partitions(self, tps: list[TopicPartition]) -> None:
        for fetcher in self._fetchers.values():
            for tp in tps:
                fetcher.remove_partition(tp)
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
