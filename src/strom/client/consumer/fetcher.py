"""The consumer's fetcher: Fetch requests on the I/O loop, record decoding in poll().

The I/O side keeps one Fetch in flight per leader broker and sends the next one as soon
as the previous response is in, as long as the undecoded bytes waiting in the buffer
stay under a bound (prefetching: the broker works while poll() decodes). It decodes
nothing: for each partition it queues the raw record bytes, learns from the batch
headers which offset to fetch next, and moves on. ``collect`` runs in the caller's
thread and decodes as many records as it returns (``strom.records.reader``).

Positions come from committed offsets (a group consumer) or ``auto.offset.reset``
(ListOffsets for the earliest or latest offset); OFFSET_OUT_OF_RANGE resets the same
way, or fails poll() when the strategy is ``none``. Leader errors refresh metadata
(or follow the new leader a NOT_LEADER_OR_FOLLOWER answer names).

Leader changes follow KIP-320: fetches and ListOffsets carry the leader epoch the
client knows, so a broker with another epoch refuses them (FENCED_LEADER_EPOCH when the
client's is older, UNKNOWN_LEADER_EPOCH when newer) rather than serving a stale log. When
a partition's leader changes, its position stops fetching until OffsetForLeaderEpoch on
the new leader, asked for the epoch of the last consumed record, confirms the log still
holds everything before the position; if the new leader's log ends that epoch below the
position, records the consumer returned were truncated away: it resets to the diverging
offset with a warning, or poll() raises LogTruncationError under ``auto.offset.reset``
``none`` (Kafka's SubscriptionState.maybeCompleteValidation).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import gc
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from strom.client.cluster import Cluster, TopicPartition
from strom.client.consumer.structs import (
    LogTruncationError,
    NoOffsetForPartitionError,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    OffsetOutOfRangeError,
)
from strom.client.consumer.subscription_state import (
    OffsetResetStrategy,
    SubscriptionState,
    TopicPartitionState,
)
from strom.client.errors import ErrorCode, KafkaException, KafkaTimeoutError
from strom.client.network_client import NetworkClient
from strom.network.connection import (
    BrokerConnection,
    KafkaConnectionError,
    RequestTimeoutError,
    UnsupportedVersionError,
)
from strom.network.fetch_session_handler import FetchSessionHandler, FetchSessionRequest
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.messages import build
from strom.records.batch import InvalidBatchError
from strom.records.reader import ConsumerRecord, FetchedBatch, FetchedRecords, scan_batches

log = logging.getLogger(__name__)

# Fetch v13+ names topics by id; v4 is the first with isolation levels and aborted transactions.
FETCH_MIN_VERSION = 4
FETCH_MAX_VERSION = 12
FETCH_SESSION_MIN_VERSION = 7  # KIP-227 incremental fetch sessions
# Top-level fetch errors after which the next fetch opens a new session, without a backoff.
_SESSION_ERRORS = frozenset({ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch})
LIST_OFFSETS_MIN_VERSION = 1
LIST_OFFSETS_MAX_VERSION = 10
# v3 is the first that takes the current leader epoch (fencing a stale leader), as Kafka's consumer needs.
OFFSET_FOR_LEADER_EPOCH_MIN_VERSION = 3
OFFSET_FOR_LEADER_EPOCH_MAX_VERSION = 4
CONSUMER_REPLICA_ID = -1
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1

# Fetch errors after which the leader may have moved: refresh metadata and fetch again.
_LEADER_ERRORS = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.leader_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.kafka_storage_error,
        ErrorCode.replica_not_available,
        ErrorCode.offset_not_available,
        ErrorCode.unknown_topic_id,
    }
)

# Answers to a leader change that name the new leader (KIP-951: Fetch v12+ carries current_leader).
_LEADER_HINT_ERRORS = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch})
# OffsetForLeaderEpoch errors after which the partition's leader must be looked up again.
_VALIDATION_METADATA_ERRORS = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.leader_not_available,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.kafka_storage_error,
        ErrorCode.replica_not_available,
    }
)

# Records decoded between two chances for the I/O thread to run (about half a millisecond).
_DECODE_CHUNK = 500

_UNASSIGNED = TopicPartitionState()

CommittedFetcher = Callable[[set[TopicPartition]], Awaitable[dict[TopicPartition, OffsetAndMetadata | None]]]


T = TypeVar("T", ConsumerRecord, FetchedBatch)
# How collect takes from a fetched record set: (what it returns, the records that holds).
_Take = Callable[[FetchedRecords, int], tuple[list[T], int]]


def _take_records(records: FetchedRecords, limit: int) -> tuple[list[ConsumerRecord], int]:
    taken = records.take(limit)
    return taken, len(taken)


def _take_batches(records: FetchedRecords, limit: int) -> tuple[list[FetchedBatch], int]:
    taken = records.take_batches(limit)
    return taken, sum(batch.count for batch in taken)


@dataclass(slots=True, eq=False)
class CompletedFetch:
    """One partition's part of a fetch response: records to decode, or an error for poll()."""

    tp: TopicPartition
    epoch: int
    fetch_offset: int
    records: FetchedRecords | None
    size: int
    error: ErrorCode = ErrorCode.none
    message: str = ""


class Fetcher:
    def __init__(
        self,
        client: NetworkClient,
        subscriptions: SubscriptionState,
        config: Mapping[str, Any],
        *,
        request_metadata_update: Callable[[], None],
        notify: Callable[[], None],
    ) -> None:
        self.client = client
        self.subscriptions = subscriptions
        self.min_bytes: int = config["fetch.min.bytes"]
        self.max_bytes: int = config["fetch.max.bytes"]
        self.max_wait_ms: int = config["fetch.max.wait.ms"]
        self.partition_max_bytes: int = config["max.partition.fetch.bytes"]
        self.check_crcs: bool = config["check.crcs"]
        self.rack_id: str = config["client.rack"]
        self.isolation_level = (
            READ_COMMITTED if config["isolation.level"] == "read_committed" else READ_UNCOMMITTED
        )
        self.request_timeout: float = config["request.timeout.ms"] / 1000
        self._request_metadata_update = request_metadata_update
        self._notify = notify
        self.fetch_committed: CommittedFetcher | None = None
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wakeup = asyncio.Event()
        # Set whenever committed offsets or a reset gave partitions positions (position() waits on it).
        self.positions_updated = asyncio.Event()
        self._in_flight: set[int] = set()
        # When each partition last got records: requests list the longest-waiting partitions first,
        # since a broker fills a response in request order and the first partition gets at least a
        # batch. Without it one partition's backlog would take every response (Kafka's consumer
        # moves partitions to the end, and its brokers rotate fetch sessions, for the same reason).
        self._last_data: dict[TopicPartition, int] = {}
        self._responses = 0
        # KIP-227: a fetch session with each broker (partition -> (fetch offset, leader epoch)).
        self._sessions: dict[int, FetchSessionHandler[TopicPartition, tuple[int, int]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._initializing: set[TopicPartition] = set()
        self._resetting: set[TopicPartition] = set()
        self._validating: set[TopicPartition] = set()
        # Shared with the caller's thread, under subscriptions.lock.
        self._completed: collections.deque[CompletedFetch] = collections.deque()
        self._current: CompletedFetch | None = None
        self._queued_bytes = 0  # of the responses in _completed (not the one being decoded)
        self._pending_error: Exception | None = None
        self._closed = False
        # Set when poll() runs on another thread than the I/O loop (the synchronous Consumer).
        self.yield_gil = False

    @property
    def prefetch_limit(self) -> int:
        """Queued bytes (fetched, not yet being decoded) at or above which no fetch is sent.

        fetch.max.bytes, the most one response may carry: the fetcher keeps fetching while
        poll() decodes, and a broker's response may be far larger than
        max.partition.fetch.bytes (whole batches, or its own idea of the limit).
        """
        return self.max_bytes

    # -- the I/O loop -----------------------------------------------------------------------

    def wakeup(self) -> None:
        """Make the fetch loop look for work now (callable from any thread)."""
        if threading.get_ident() == self._loop_thread:
            self._wakeup.set()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wakeup.set)

    async def run(self) -> None:
        """The background loop: initialize positions, reset offsets, keep fetches in flight."""
        while not self._closed:
            self._wakeup.clear()
            self._initialize_positions()
            self._reset_positions()
            self._validate_positions()
            self._send_fetches()
            await self._wakeup.wait()

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._closed = True
        self._wakeup.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _initialize_positions(self) -> None:
        needing = {
            tp: epoch
            for tp, epoch in self.subscriptions.partitions_needing_position().items()
            if tp not in self._initializing
        }
        if not needing:
            return
        if self.fetch_committed is None:
            self.subscriptions.request_reset(needing, self.subscriptions.default_reset_strategy)
            self._notify()
            self.positions_updated.set()
            return
        self._initializing.update(needing)
        self._spawn(self._apply_committed(needing))

    async def _apply_committed(self, needing: dict[TopicPartition, int]) -> None:
        assert self.fetch_committed is not None
        try:
            committed = await self.fetch_committed(set(needing))
        except Exception as exc:  # retried on the next wakeup, after a backoff
            log.info("cannot fetch committed offsets: %s", exc)
            self._report_fatal(exc)
            await self.client.backoff(0)
            committed = None
        finally:
            self._initializing.difference_update(needing)
        if committed is not None:
            subscriptions = self.subscriptions
            with subscriptions.lock:
                for tp, epoch in needing.items():
                    state = subscriptions.assignment.get(tp)
                    if state is None or state.epoch != epoch or state.position is not None:
                        continue  # sought or revoked meanwhile
                    offset = committed.get(tp)
                    if offset is not None and offset.offset >= 0:
                        subscriptions.seek(tp, offset.offset, offset.leader_epoch)
                    else:
                        subscriptions.request_reset([tp], subscriptions.default_reset_strategy)
            self._notify()
            self.positions_updated.set()
        self._wakeup.set()

    def _report_fatal(self, error: Exception) -> None:
        """An error retrying cannot fix (authorization, an unknown group...): poll() raises it."""
        if isinstance(error, KafkaException) and error.error_code is not None and not error.retriable:
            self._pending_error = error
            self._notify()

    def _reset_positions(self) -> None:
        awaiting = {
            tp: request
            for tp, request in self.subscriptions.partitions_awaiting_reset().items()
            if tp not in self._resetting
        }
        if awaiting:
            self._resetting.update(awaiting)
            self._spawn(self._reset(awaiting))

    async def _reset(self, awaiting: dict[TopicPartition, tuple[OffsetResetStrategy, int]]) -> None:
        timestamps = {
            tp: EARLIEST_TIMESTAMP if strategy is OffsetResetStrategy.EARLIEST else LATEST_TIMESTAMP
            for tp, (strategy, _) in awaiting.items()
        }
        try:
            found = await self.list_offsets(timestamps, self.request_timeout)
        except Exception as exc:  # retried on the next wakeup, after a backoff
            log.info("cannot reset offsets: %s", exc)
            self._report_fatal(exc)
            await self.client.backoff(1)
            found = {}
        finally:
            self._resetting.difference_update(awaiting)
        subscriptions = self.subscriptions
        with subscriptions.lock:
            for tp, (_, epoch) in awaiting.items():
                state = subscriptions.assignment.get(tp)
                answer = found.get(tp)
                if state is None or state.epoch != epoch or answer is None:
                    continue
                subscriptions.seek(tp, answer.offset, answer.leader_epoch)
        self.positions_updated.set()
        self._wakeup.set()

    def _send_fetches(self) -> None:
        if (
            self._queued_bytes >= self.prefetch_limit
            and self._fetchable_queued_bytes() >= self.prefetch_limit
        ):
            return
        cluster = self.client.cluster
        requests: dict[int, dict[TopicPartition, tuple[int, int, int]]] = {}
        missing_leader = False
        with self.subscriptions.lock:
            for tp, state in self.subscriptions.assignment.items():
                self._follow_leader(tp, state, cluster)
                if not state.fetchable or state.fetch_position is None:
                    continue
                leader = cluster.leader(tp)
                if leader is None:
                    missing_leader = True
                    continue
                if leader.node_id in self._in_flight:
                    continue
                leader_epoch = state.current_leader[1] if state.current_leader is not None else -1
                requests.setdefault(leader.node_id, {})[tp] = (
                    state.fetch_position,
                    state.epoch,
                    leader_epoch,
                )
            if len(self._last_data) > len(self.subscriptions.assignment):
                assigned = self.subscriptions.assignment
                self._last_data = {tp: n for tp, n in self._last_data.items() if tp in assigned}
        if missing_leader:
            self._request_metadata_update()
        last_data = self._last_data
        for node_id, partitions in requests.items():
            self._in_flight.add(node_id)
            ordered = dict(sorted(partitions.items(), key=lambda item: last_data.get(item[0], -1)))
            self._spawn(self._fetch(node_id, ordered))

    # -- KIP-320: positions across leader changes --------------------------------------------------

    def on_metadata_update(self, cluster: Cluster) -> None:
        """After a metadata refresh: positions whose leader changed await validation."""
        with self.subscriptions.lock:
            for tp, state in self.subscriptions.assignment.items():
                self._follow_leader(tp, state, cluster)
        self.wakeup()

    def _follow_leader(self, tp: TopicPartition, state: TopicPartitionState, cluster: Cluster) -> None:
        """Kafka's maybeValidatePositionForCurrentLeader (under subscriptions.lock)."""
        if state.position is None:
            return
        partition = cluster.partition(tp)
        if partition is None or partition.leader < 0:
            return
        leader = (partition.leader, partition.leader_epoch)
        if leader == state.current_leader:
            return
        first = state.current_leader is None
        state.current_leader = leader
        if partition.leader_epoch < 0 or state.leader_epoch is None:
            # No epochs to compare (an old broker, or nothing consumed yet): nothing to validate.
            state.awaiting_validation = False
            return
        if first and not state.awaiting_validation:
            return  # the position was just set by this leader's own answers
        log.info(
            "%s: leader is now broker %d (epoch %d); validating position %d (epoch %d)",
            tp,
            partition.leader,
            partition.leader_epoch,
            state.position,
            state.leader_epoch,
        )
        state.awaiting_validation = True
        if state.fetch_position != state.position:
            # What was prefetched from the old leader is dropped, as Kafka drops buffered
            # records of a partition that is not fetchable: it is fetched again once validated.
            state.epoch += 1
            state.fetch_position = state.position

    def _validate_positions(self) -> None:
        cluster = self.client.cluster
        by_leader: dict[int, dict[TopicPartition, tuple[int, int, int, int]]] = {}
        missing_leader = False
        with self.subscriptions.lock:
            for tp, state in self.subscriptions.assignment.items():
                if not state.awaiting_validation or tp in self._validating or state.position is None:
                    continue
                self._follow_leader(tp, state, cluster)
                leader = cluster.leader(tp)
                if leader is None or state.current_leader is None or state.leader_epoch is None:
                    missing_leader = True
                    continue
                by_leader.setdefault(leader.node_id, {})[tp] = (
                    state.position,
                    state.epoch,
                    state.leader_epoch,
                    state.current_leader[1],
                )
        if missing_leader:
            self._request_metadata_update()
        for node_id, partitions in by_leader.items():
            self._validating.update(partitions)
            self._spawn(self._validate(node_id, partitions))

    async def _validate(
        self, node_id: int, partitions: dict[TopicPartition, tuple[int, int, int, int]]
    ) -> None:
        """OffsetForLeaderEpoch for positions awaiting validation, from their current leader."""
        retry = False
        try:
            try:
                answers = await self._offsets_for_leader_epoch(node_id, partitions)
            except UnsupportedVersionError as exc:
                # A broker without KIP-320 (OffsetForLeaderEpoch < v3) cannot validate: trust the position.
                log.debug("cannot validate positions on broker %d: %s", node_id, exc)
                answers = {tp: (ErrorCode.none, -1, -2) for tp in partitions}
            truncation = self._complete_validation(partitions, answers)
            retry = (
                truncation
                or len(answers) < len(partitions)
                or any(error != ErrorCode.none for error, _, _ in answers.values())
            )
        except (KafkaConnectionError, RequestTimeoutError, KafkaException) as exc:
            log.info("validating positions on broker %d failed: %s", node_id, exc)
            self._report_fatal(exc)
            self._request_metadata_update()
            retry = True
        finally:
            if retry:
                # Not straight back: a leader that is not one yet, or poll() raising the same truncation.
                try:
                    await self.client.backoff(0)
                finally:
                    self._validating.difference_update(partitions)
            else:
                self._validating.difference_update(partitions)
            self._wakeup.set()

    async def _offsets_for_leader_epoch(
        self, node_id: int, partitions: dict[TopicPartition, tuple[int, int, int, int]]
    ) -> dict[TopicPartition, tuple[ErrorCode, int, int]]:
        by_topic: dict[str, list[tuple[int, int, int]]] = {}
        for tp, (_, _, offset_epoch, current_epoch) in partitions.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, current_epoch, offset_epoch))

        def build_request(connection: BrokerConnection) -> Any:
            version = connection.version(
                ApiKey.OFFSET_FOR_LEADER_EPOCH,
                OFFSET_FOR_LEADER_EPOCH_MAX_VERSION,
                OFFSET_FOR_LEADER_EPOCH_MIN_VERSION,
            )
            module = request_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, version)
            return build(
                module.OffsetForLeaderEpochRequest,
                replica_id=CONSUMER_REPLICA_ID,
                topics=tuple(
                    build(
                        module.OffsetForLeaderTopic,
                        topic=topic,
                        partitions=tuple(
                            build(
                                module.OffsetForLeaderPartition,
                                partition=partition,
                                current_leader_epoch=current_epoch,
                                leader_epoch=offset_epoch,
                            )
                            for partition, current_epoch, offset_epoch in numbers
                        ),
                    )
                    for topic, numbers in by_topic.items()
                ),
            )

        response = await self.client.send(node_id, build_request)
        answers: dict[TopicPartition, tuple[ErrorCode, int, int]] = {}
        for topic in response.topics:
            for partition in topic.partitions:
                tp = TopicPartition(topic.topic, partition.partition)
                if tp in partitions:
                    answers[tp] = (
                        ErrorCode(partition.error_code),
                        int(partition.leader_epoch),
                        int(partition.end_offset),
                    )
        return answers

    def _complete_validation(
        self,
        partitions: dict[TopicPartition, tuple[int, int, int, int]],
        answers: Mapping[TopicPartition, tuple[ErrorCode, int, int]],
    ) -> bool:
        """Apply OffsetForLeaderEpoch answers; True when a truncation was reported to poll().

        An end offset of -2 (a broker that cannot validate) accepts the position as it is.
        """
        subscriptions = self.subscriptions
        truncated: dict[TopicPartition, int] = {}
        divergent: dict[TopicPartition, OffsetAndMetadata] = {}
        refresh = False
        with subscriptions.lock:
            for tp, (error, leader_epoch, end_offset) in answers.items():
                position, epoch, _, _ = partitions[tp]
                state = subscriptions.assignment.get(tp)
                if state is None or state.epoch != epoch or not state.awaiting_validation:
                    continue  # sought, reset or revoked meanwhile
                if error != ErrorCode.none:
                    if error in _VALIDATION_METADATA_ERRORS:
                        refresh = True
                    elif not error.retriable and error != ErrorCode.unknown_leader_epoch:
                        self._pending_error = KafkaException.from_code(
                            error, f"OffsetForLeaderEpoch for {tp}"
                        )
                    log.debug("validating %s: %s", tp, error.name)
                    continue
                if end_offset == -2:
                    state.awaiting_validation = False
                elif end_offset < 0 or leader_epoch < 0:
                    # The new leader knows no epoch at or before ours: everything from it is gone.
                    if subscriptions.default_reset_strategy is OffsetResetStrategy.NONE:
                        log.warning(
                            "%s: truncation detected at offset %d; no reset policy is set", tp, position
                        )
                        truncated[tp] = position
                    else:
                        log.warning(
                            "%s: truncation detected at offset %d; resetting the offset", tp, position
                        )
                        subscriptions.request_reset([tp], subscriptions.default_reset_strategy)
                elif end_offset < position:
                    if subscriptions.default_reset_strategy is OffsetResetStrategy.NONE:
                        log.warning(
                            "%s: truncation detected at offset %d (the leader's log diverges at %d); "
                            "no reset policy is set",
                            tp,
                            position,
                            end_offset,
                        )
                        truncated[tp] = position
                        divergent[tp] = OffsetAndMetadata(end_offset, "", leader_epoch)
                    else:
                        log.warning(
                            "%s: truncation detected at offset %d; resetting to %d, the first offset known "
                            "to diverge (epoch %d)",
                            tp,
                            position,
                            end_offset,
                            leader_epoch,
                        )
                        subscriptions.seek_validated(tp, end_offset, leader_epoch)
                else:
                    state.awaiting_validation = False
            if truncated:
                self._pending_error = LogTruncationError(truncated, divergent)
        if refresh:
            self._request_metadata_update()
        if truncated:
            self._notify()
        self.positions_updated.set()
        return bool(truncated)

    def _fetchable_queued_bytes(self) -> int:
        """Queued bytes less those of paused partitions, which wait for resume() and must not
        stop the fetches of the others (Kafka's consumer keeps fetching the partitions not paused)."""
        with self.subscriptions.lock:
            assignment = self.subscriptions.assignment
            return sum(
                fetch.size for fetch in self._completed if not assignment.get(fetch.tp, _UNASSIGNED).paused
            )

    def _build_fetch(
        self,
        partitions: dict[TopicPartition, tuple[int, int, int]],
        session: FetchSessionHandler[TopicPartition, tuple[int, int]],
        sent: list[FetchSessionRequest[TopicPartition, tuple[int, int]]],
    ) -> Callable[[BrokerConnection], Any]:
        """The Fetch of ``partitions``: through ``session`` from v7 (what it sent goes to ``sent``),
        else a sessionless full fetch."""

        def build_request(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.FETCH, FETCH_MAX_VERSION, FETCH_MIN_VERSION)
            module = request_module(ApiKey.FETCH, version)
            wanted = {tp: (offset, leader_epoch) for tp, (offset, _, leader_epoch) in partitions.items()}
            session_id, epoch = 0, -1  # a sessionless full fetch
            forgotten: dict[str, list[int]] = {}
            if version >= FETCH_SESSION_MIN_VERSION:
                next_fetch = session.build(wanted)
                sent.append(next_fetch)
                session_id, epoch, wanted = next_fetch.session_id, next_fetch.epoch, next_fetch.to_send
                for tp in next_fetch.to_forget:
                    forgotten.setdefault(tp.topic, []).append(tp.partition)
            by_topic: dict[str, list[tuple[int, int, int]]] = {}
            for tp, (offset, leader_epoch) in wanted.items():
                by_topic.setdefault(tp.topic, []).append((tp.partition, offset, leader_epoch))
            topics = tuple(
                build(
                    module.FetchTopic,
                    topic=topic,
                    partitions=tuple(
                        build(
                            module.FetchPartition,
                            partition=partition,
                            current_leader_epoch=leader_epoch,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,  # consumers validate with OffsetForLeaderEpoch instead
                            log_start_offset=-1,
                            partition_max_bytes=self.partition_max_bytes,
                        )
                        for partition, offset, leader_epoch in numbers
                    ),
                )
                for topic, numbers in by_topic.items()
            )
            return build(
                module.FetchRequest,
                replica_id=-1,
                max_wait=_timedelta_ms(self.max_wait_ms),
                min_bytes=self.min_bytes,
                max_bytes=self.max_bytes,
                isolation_level=self.isolation_level,
                session_id=session_id,
                session_epoch=epoch,
                topics=topics,
                forgotten_topics_data=tuple(
                    build(module.ForgottenTopic, topic=topic, partitions=tuple(numbers))
                    for topic, numbers in forgotten.items()
                ),
                rack_id=self.rack_id,
            )

        return build_request

    async def _fetch(self, node_id: int, partitions: dict[TopicPartition, tuple[int, int, int]]) -> None:
        queued = False
        session = self._sessions.get(node_id)
        if session is None:
            session = self._sessions[node_id] = FetchSessionHandler()
        sent: list[FetchSessionRequest[TopicPartition, tuple[int, int]]] = []
        try:
            try:
                response = await self.client.send(
                    node_id,
                    self._build_fetch(partitions, session, sent),
                    timeout=self.request_timeout + self.max_wait_ms / 1000,
                )
            except BaseException:
                session.handle_error()
                raise
            error = ErrorCode(response.error_code)
            if sent:
                session.handle_response(sent[0], error, response.session_id)
            if error in _SESSION_ERRORS:
                # The broker lost the session or the epochs differ: the next fetch, full, opens
                # a new one at once.
                log.info("fetch session with broker %s reset: %s", node_id, error.name)
            elif error != ErrorCode.none:
                raise KafkaException.from_code(error, f"Fetch from broker {node_id}")
            else:
                queued, retry = self._handle_fetch_response(response, partitions, session)
                if retry and not queued:
                    await self.client.backoff(0)  # not straight back to a broker that is not the leader
        except (KafkaConnectionError, RequestTimeoutError, KafkaException) as exc:
            log.info("fetch from broker %s failed: %s", node_id, exc)
            self._request_metadata_update()
            await self.client.backoff(0)
        finally:
            self._in_flight.discard(node_id)
            self._wakeup.set()
        if not self._closed:
            # The next fetch goes out before poll() hears of this one's records, so the broker
            # works while they are decoded (an AsyncConsumer's poll would not yield before).
            self._send_fetches()
        if queued:
            self._notify()

    def _handle_fetch_response(
        self,
        response: Any,
        requested: dict[TopicPartition, tuple[int, int, int]],
        session: FetchSessionHandler[TopicPartition, tuple[int, int]],
    ) -> tuple[bool, bool]:
        """Queue each partition's records (or error): whether poll() has something new, and
        whether a partition must be fetched again after a metadata refresh. A partition missing
        from the response (an incremental fetch's) has nothing new."""
        subscriptions = self.subscriptions
        queued = False
        leader_errors: set[TopicPartition] = set()
        hints: dict[TopicPartition, tuple[int, int]] = {}
        self._responses += 1
        with subscriptions.lock:
            for topic in response.responses:
                for data in topic.partitions:
                    tp = TopicPartition(topic.topic, data.partition_index)
                    sent = requested.get(tp)
                    state = subscriptions.assignment.get(tp)
                    if sent is None or state is None:
                        continue
                    fetch_offset, epoch, _ = sent
                    if state.epoch != epoch or state.fetch_position != fetch_offset:
                        # Sought, reset or revoked since the request was built. The broker's
                        # session takes this answer as delivered: a full fetch next brings back
                        # what it would not repeat (the high watermark).
                        session.close_existing()
                        continue
                    error = ErrorCode(data.error_code)
                    if error == ErrorCode.none:
                        state.high_watermark = data.high_watermark
                        state.last_stable_offset = data.last_stable_offset
                        state.log_start_offset = getattr(data, "log_start_offset", -1)
                        records = data.records
                        if not records:
                            continue
                        end, next_offset = scan_batches(records, fetch_offset)
                        if end == 0:
                            # Not even one whole batch although the broker must send one: stuck.
                            self._queue_error(
                                tp,
                                epoch,
                                fetch_offset,
                                ErrorCode.record_list_too_large,
                                f"cannot make progress fetching {tp} at offset {fetch_offset}: the batch there "
                                f"is larger than the {len(records)} bytes returned",
                            )
                            state.fetch_position = None
                        else:
                            aborted = None
                            if self.isolation_level == READ_COMMITTED:
                                aborted = [
                                    (t.producer_id, t.first_offset) for t in data.aborted_transactions or ()
                                ]
                            fetched = FetchedRecords(
                                tp.topic,
                                tp.partition,
                                records,
                                fetch_offset,
                                end=end,
                                end_offset=next_offset,
                                check_crcs=self.check_crcs,
                                aborted_transactions=aborted,
                            )
                            self._completed.append(CompletedFetch(tp, epoch, fetch_offset, fetched, end))
                            self._queued_bytes += end
                            state.fetch_position = next_offset
                            self._last_data[tp] = self._responses
                        queued = True
                    elif error in _LEADER_ERRORS:
                        leader = getattr(data, "current_leader", None)
                        if error in _LEADER_HINT_ERRORS and leader is not None and leader.leader_id >= 0:
                            hints[tp] = (int(leader.leader_id), int(leader.leader_epoch))
                        log.info("fetch of %s: %s; looking for its leader", tp, error.name)
                        leader_errors.add(tp)
                    else:
                        # Out of range, authorization, corruption...: poll() decides or raises, in order.
                        self._queue_error(tp, epoch, fetch_offset, error, "")
                        state.fetch_position = None
                        queued = True
            if hints:
                # KIP-951: follow the named leaders now (validating the positions), not after a refresh.
                cluster = self.client.cluster
                moved = cluster.update_leaders(hints, [])
                for tp in moved:
                    self._follow_leader(tp, subscriptions.assignment[tp], cluster)
                leader_errors -= moved
        refresh = bool(leader_errors)
        if refresh:
            self._request_metadata_update()
        return queued, refresh

    def _queue_error(
        self, tp: TopicPartition, epoch: int, offset: int, error: ErrorCode, message: str
    ) -> None:
        self._completed.append(CompletedFetch(tp, epoch, offset, None, 0, error, message))

    # -- ListOffsets ------------------------------------------------------------------------

    async def list_offsets(
        self, timestamps: Mapping[TopicPartition, int], timeout: float
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """The offset for each timestamp (-2 earliest, -1 latest) from each partition's leader,
        at the consumer's isolation level (the last stable offset is read_committed's end).

        None where no record has a timestamp at or after the one asked for. Retries
        leader errors with fresh metadata until ``timeout``, then raises KafkaTimeoutError.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        remaining = dict(timestamps)
        found: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        attempt = 0
        last_error: Exception | None = None
        refresh = False
        try:
            # The whole call keeps to timeout, a request to a broker that stopped answering included.
            async with asyncio.timeout(timeout):
                while remaining:
                    cluster = self.client.cluster
                    if refresh or any(cluster.leader(tp) is None for tp in remaining):
                        try:
                            cluster = await self.client.refresh_metadata(
                                self._metadata_topics({tp.topic for tp in remaining})
                            )
                        except (KafkaConnectionError, RequestTimeoutError) as exc:
                            last_error = exc
                    by_leader: dict[int, dict[TopicPartition, int]] = {}
                    for tp, timestamp in remaining.items():
                        leader = cluster.leader(tp)
                        if leader is not None:
                            by_leader.setdefault(leader.node_id, {})[tp] = timestamp
                    outcomes = await asyncio.gather(
                        *(self._list_offsets_from(node, wanted) for node, wanted in by_leader.items()),
                        return_exceptions=True,
                    )
                    for outcome in outcomes:
                        if isinstance(outcome, BaseException):
                            if not isinstance(
                                outcome, (KafkaConnectionError, RequestTimeoutError, KafkaException)
                            ):
                                raise outcome
                            if isinstance(outcome, KafkaException) and not outcome.retriable:
                                raise outcome
                            last_error = outcome
                            continue
                        for tp, answer in outcome.items():
                            found[tp] = answer
                            remaining.pop(tp, None)
                    if not remaining:
                        return found
                    if loop.time() >= deadline:
                        break
                    await self.client.backoff(min(attempt, 4))
                    attempt += 1
                    refresh = True  # the leaders may have moved
        except TimeoutError:
            pass
        if not remaining:
            return found
        raise KafkaTimeoutError(
            f"offsets of {', '.join(sorted(map(str, remaining)))} not found within {timeout * 1000:.0f} ms"
            + (f": {last_error}" if last_error else "")
        )

    def _metadata_topics(self, topics: set[str]) -> set[str]:
        # Keep what the consumer needs anyway in the same request.
        return topics | self.subscriptions.subscription | {tp.topic for tp in self.subscriptions.assignment}

    async def _list_offsets_from(
        self, node_id: int, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for tp, timestamp in timestamps.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, timestamp))

        def build_request(connection: BrokerConnection) -> Any:
            version = connection.version(
                ApiKey.LIST_OFFSETS, LIST_OFFSETS_MAX_VERSION, LIST_OFFSETS_MIN_VERSION
            )
            module = request_module(ApiKey.LIST_OFFSETS, version)
            return build(
                module.ListOffsetsRequest,
                replica_id=-1,
                isolation_level=self.isolation_level,
                timeout=_timedelta_ms(int(self.request_timeout * 1000)),
                topics=tuple(
                    build(
                        module.ListOffsetsTopic,
                        name=topic,
                        partitions=tuple(
                            build(
                                module.ListOffsetsPartition,
                                partition_index=partition,
                                current_leader_epoch=self.client.cluster.leader_epoch(
                                    TopicPartition(topic, partition)
                                ),
                                timestamp=timestamp,
                            )
                            for partition, timestamp in numbers
                        ),
                    )
                    for topic, numbers in by_topic.items()
                ),
            )

        response = await self.client.send(node_id, build_request)
        answers: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        retriable: ErrorCode | None = None
        for topic in response.topics:
            for partition in topic.partitions:
                tp = TopicPartition(topic.name, partition.partition_index)
                error = ErrorCode(partition.error_code)
                if error == ErrorCode.none:
                    if partition.offset < 0:
                        answers[tp] = None
                    else:
                        epoch = getattr(partition, "leader_epoch", -1)
                        answers[tp] = OffsetAndTimestamp(
                            int(partition.offset), int(partition.timestamp), epoch if epoch >= 0 else None
                        )
                elif error.retriable:
                    retriable = error
                else:
                    raise KafkaException.from_code(error, f"ListOffsets for {tp}")
        if retriable is not None and not answers:
            raise KafkaException.from_code(retriable, "ListOffsets")
        return answers

    # -- the caller's side: poll() --------------------------------------------------------------

    def collect(self, max_records: int) -> list[ConsumerRecord]:
        """Up to ``max_records`` fetched records, decoded here; positions advance past them.

        Raises the errors poll() reports: no offset with reset strategy ``none``, an offset
        out of range with it, a corrupt batch, a fetch error the consumer cannot handle.
        """
        return self._collect(max_records, _take_records, _DECODE_CHUNK)

    def collect_batches(self, max_records: int) -> list[FetchedBatch]:
        """As ``collect``, but whole batches left undecoded, at least ``max_records`` records' worth
        when that many are buffered."""
        # Nothing is decoded here: no chunks, no pauses for the I/O thread between them.
        return self._collect(max_records, _take_batches, max_records)

    def _collect(self, max_records: int, take: _Take[T], chunk: int) -> list[T]:
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        subscriptions = self.subscriptions
        without_offset = subscriptions.partitions_without_offset()
        if without_offset:
            raise NoOffsetForPartitionError(without_offset)
        out: list[T] = []
        count = 0  # records in out
        parked: list[CompletedFetch] = []
        # No garbage collection while decoding: every record is a new GC-tracked object that
        # stays alive, so the collector would run every 700 records and promote them through
        # the generations, with full collections of the whole heap (100k records in polls of
        # 10,000: 39 ms of GC, 1 ms with this). Records hold no references that form cycles.
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            while count < max_records:
                fetch = self._current
                if fetch is None:
                    fetch = self._next_completed(parked)
                    if fetch is None:
                        break
                    self._current = fetch
                records = fetch.records
                assert records is not None
                if subscriptions.assignment.get(fetch.tp, _UNASSIGNED).paused:
                    # Paused halfway: keep the rest for resume(), from where it stopped.
                    fetch.fetch_offset = records.next_offset
                    parked.append(fetch)
                    self._current = None
                    continue
                try:
                    taken, taken_count = take(records, min(max_records - count, chunk))
                except InvalidBatchError as exc:
                    self._rewind(fetch)
                    error = KafkaException(
                        f"cannot read the records of {fetch.tp} at offset {records.next_offset}: {exc}",
                        ErrorCode.corrupt_message,
                    )
                    if out:
                        self._pending_error = error
                        break
                    raise error from exc
                with subscriptions.lock:
                    state = subscriptions.assignment.get(fetch.tp)
                    if state is not None and state.epoch == fetch.epoch:
                        state.position = records.next_offset
                        if taken:
                            state.leader_epoch = records.last_leader_epoch
                            out += taken
                            count += taken_count
                    if records.exhausted or state is None or state.epoch != fetch.epoch:
                        self._current = None
                if self.yield_gil:
                    # Let the I/O thread take the GIL if it waits for it: a decoding thread would
                    # keep it for sys.getswitchinterval() (5 ms) while the next fetch response sits
                    # unread (1 KiB records: 280k/s without this, 410k/s with it).
                    time.sleep(0)
        finally:
            if collecting:
                gc.enable()
            if parked:
                with subscriptions.lock:
                    self._completed.extendleft(reversed(parked))
                    self._queued_bytes += sum(fetch.size for fetch in parked)
        return out

    def _next_completed(self, parked: list[CompletedFetch]) -> CompletedFetch | None:
        """The next queued fetch with records to return now; errors are handled on the way."""
        subscriptions = self.subscriptions
        with subscriptions.lock:
            while self._completed:
                fetch = self._completed.popleft()
                self._dequeued(fetch)
                state = subscriptions.assignment.get(fetch.tp)
                if state is None or state.epoch != fetch.epoch:
                    continue
                if state.paused:
                    parked.append(fetch)  # kept for resume(), as Kafka keeps it
                    continue
                if fetch.error != ErrorCode.none:
                    self._handle_error(fetch)
                    continue
                if state.position != fetch.fetch_offset:
                    continue
                return fetch
        return None

    def _handle_error(self, fetch: CompletedFetch) -> None:
        subscriptions = self.subscriptions
        state = subscriptions.assignment[fetch.tp]
        if fetch.error == ErrorCode.offset_out_of_range and state.position == fetch.fetch_offset:
            strategy = subscriptions.default_reset_strategy
            if strategy is OffsetResetStrategy.NONE:
                # Fetch again (and fail again) until the application seeks, as Kafka does.
                state.fetch_position = state.position
                self.wakeup()
                raise OffsetOutOfRangeError({fetch.tp: fetch.fetch_offset})
            log.info(
                "offset %d of %s is out of range; resetting to %s",
                fetch.fetch_offset,
                fetch.tp,
                strategy.value,
            )
            subscriptions.request_reset([fetch.tp], strategy)
            self.wakeup()
            return
        if fetch.error == ErrorCode.offset_out_of_range:
            state.fetch_position = state.position
            self.wakeup()
            return
        state.fetch_position = state.position
        self.wakeup()
        raise KafkaException.from_code(
            fetch.error, f"Fetch of {fetch.tp} at offset {fetch.fetch_offset}", fetch.message
        )

    def _rewind(self, fetch: CompletedFetch) -> None:
        """Drop a fetch that failed to decode: the next poll fetches from the position again."""
        with self.subscriptions.lock:
            state = self.subscriptions.assignment.get(fetch.tp)
            if state is not None and state.epoch == fetch.epoch and state.position is not None:
                awaiting = state.awaiting_validation  # the same position: no new reason to validate it
                self.subscriptions.seek(fetch.tp, state.position, state.leader_epoch)
                state.awaiting_validation = awaiting
            self._current = None

    def _dequeued(self, fetch: CompletedFetch) -> None:
        limit = self.prefetch_limit
        was_full = self._queued_bytes >= limit
        self._queued_bytes -= fetch.size
        if was_full and self._queued_bytes < limit:
            self.wakeup()  # the fetch loop stopped at the limit

    def discard(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Forget buffered data (of ``partitions``, or all of it).

        A partition that stays assigned fetches again from its position: what lay between
        it and the fetch position is gone, and a fetch in flight for it is stale now.
        """
        wanted = None if partitions is None else set(partitions)
        with self.subscriptions.lock:
            for tp, state in self.subscriptions.assignment.items():
                if (wanted is None or tp in wanted) and state.fetch_position != state.position:
                    state.epoch += 1
                    state.fetch_position = state.position
            kept: collections.deque[CompletedFetch] = collections.deque()
            for fetch in self._completed:
                if wanted is None or fetch.tp in wanted:
                    self._dequeued(fetch)
                else:
                    kept.append(fetch)
            self._completed = kept
            current = self._current
            if current is not None and (wanted is None or current.tp in wanted):
                self._current = None


def _timedelta_ms(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)
