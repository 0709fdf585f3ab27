"""What a follower asks of its leader (Kafka's LeaderEndPoint), and its network implementation.

The replica fetcher sees its leader only through ``LeaderEndPoint``: a fetch of many partitions
(within a KIP-227 fetch session the endpoint keeps), the end offsets of leader epochs
(OffsetForLeaderEpoch, KIP-101/279) and the log start or end offset of a partition (ListOffsets).
``RemoteLeaderEndPoint`` does these over strom's own ``BrokerConnection`` to the leader's
inter-broker listener, as replica ``node_id`` (``replica_id`` before Fetch v15, ``replica_state``
with the broker's epoch from v15, KIP-903). Unit tests give the fetcher a fake endpoint instead.
"""

from __future__ import annotations

import datetime
import errno
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from strom.broker.partition import TopicPartition
from strom.network.connection import BrokerConnection, KafkaConnectionError
from strom.network.fetch_session_handler import FINAL_EPOCH, INVALID_SESSION_ID, FetchSessionHandler
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build

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
# Top-level fetch errors after which the follower opens a new session at once.
SESSION_ERRORS = frozenset({ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch})


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """What a follower's fetch asks of one partition; the fetch session sends it again only when
    it changed (compared by value)."""

    topic_id: uuid.UUID
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """The leader's answer for one partition of a fetch."""

    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes | None = None
    # KIP-320: the leader's (epoch, end offset) where the follower's last fetched epoch diverges.
    diverging_epoch: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """OffsetForLeaderEpoch's answer for one partition: the leader's end offset of ``leader_epoch``
    (the largest epoch it has at most the asked one), -1/-1 when it has none."""

    error: ErrorCode
    leader_epoch: int = -1
    end_offset: int = -1


class LeaderEndPoint(Protocol):
    """A follower's view of one leader broker (Kafka's LeaderEndPoint)."""

    @property
    def leader_id(self) -> int: ...

    async def fetch(
        self,
        partitions: Mapping[TopicPartition, FetchPartition],
        changed: Collection[TopicPartition] | None = None,
    ) -> dict[TopicPartition, FetchedPartition]:
        """Fetch ``partitions``; the answer holds those with news (an incremental fetch session
        leaves out the rest). ``changed``: the partitions whose request may differ from the last
        fetch's (added, changed or gone), None for all of them. Raises when the request fails as
        a whole; a session the leader lost is an empty answer (the next fetch opens a new one)."""
        ...

    def reset_session(self) -> None:
        """The next fetch is a full one (a partition's answer was dropped: its HW is not repeated
        by an incremental session)."""
        ...

    async def fetch_epoch_end_offsets(
        self, partitions: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, EpochEndOffset]:
        """For each partition, given (current leader epoch, the follower's latest epoch), the
        leader's end offset of that epoch."""
        ...

    async def fetch_earliest_offset(self, tp: TopicPartition, current_leader_epoch: int) -> int | None:
        """The leader's log start offset of ``tp``; None on a partition error."""
        ...

    async def fetch_latest_offset(self, tp: TopicPartition, current_leader_epoch: int) -> int | None:
        """The leader's log end offset of ``tp``; None on a partition error."""
        ...

    async def close_session(self) -> None:
        """Close the fetch session on the leader (best effort)."""
        ...

    def close(self) -> None:
        """Drop the connection, if any."""
        ...


class BrokerDirectory(Protocol):
    """What the network endpoint needs to know of the cluster: this broker's id and epoch, and
    where brokers listen (the replica manager provides it)."""

    @property
    def node_id(self) -> int: ...

    def broker_epoch(self, broker_id: int) -> int | None: ...

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None: ...

    def peer_endpoint(self, broker_id: int) -> tuple[str, int] | None: ...


class FetchSettings(Protocol):
    """The replica.* settings a follower's requests use (the broker's ReplicationConfig, read
    anew for every request: they change dynamically)."""

    @property
    def replica_fetch_max_bytes(self) -> int: ...
    @property
    def replica_fetch_min_bytes(self) -> int: ...
    @property
    def replica_fetch_wait_max_ms(self) -> int: ...
    @property
    def replica_fetch_response_max_bytes(self) -> int: ...
    @property
    def replica_socket_timeout_ms(self) -> int: ...
    @property
    def bind_host(self) -> str | None: ...


# A partition of the follower's fetch session: the partition and its topic's id.
SessionPartition = tuple[TopicPartition, uuid.UUID]


class RemoteLeaderEndPoint:
    """``LeaderEndPoint`` over one ``BrokerConnection`` to the leader's inter-broker listener,
    opened on first use and again after a failure; one KIP-227 session, kept across
    reconnections as Kafka does."""

    def __init__(
        self,
        leader_id: int,
        brokers: BrokerDirectory,
        settings: Callable[[], FetchSettings],
    ) -> None:
        self._leader_id = leader_id
        self._brokers = brokers
        self._settings = settings
        self._connection: BrokerConnection | None = None
        # The address the connection was meant to come from (see _connect).
        self._wanted_local_host: str | None = None
        self._session: FetchSessionHandler[SessionPartition, FetchPartition] = FetchSessionHandler()
        self._session_uses_topic_ids = True
        # The partitions of the last fetch by session key, each partition's key, and topic names
        # by id, kept up to date from what changed (a topic deleted and created again under its
        # name is another partition: keyed with its id).
        self._wanted: dict[SessionPartition, FetchPartition] = {}
        self._key_of: dict[TopicPartition, SessionPartition] = {}
        self._names: dict[uuid.UUID, str] = {}

    @property
    def leader_id(self) -> int:
        return self._leader_id

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def reset_session(self) -> None:
        self._session.close_existing()

    async def _connect(self) -> BrokerConnection:
        brokers = self._brokers
        endpoint = brokers.peer_endpoint(self._leader_id)
        if endpoint is None:
            raise ConnectionError(f"broker {self._leader_id} is not registered")
        # Leaders serve replica fetches only from this broker's registered host: connect from it.
        # A wildcard listener has no address of its own; the registered (advertised) host then,
        # unless it is no address of this machine (behind NAT, say).
        own = brokers.broker_endpoint(brokers.node_id)
        bind_host = self._settings().bind_host
        local_host = bind_host or (own[0] if own is not None else None)
        connection = self._connection
        if (
            connection is not None
            and connection.is_open
            and (connection.host, connection.port) == endpoint
            and self._wanted_local_host == local_host
        ):
            return connection
        self.close()
        self._wanted_local_host = local_host
        try:
            self._connection = await self._open(endpoint, local_host)
        except KafkaConnectionError as e:
            cause = e.__cause__
            if local_host == bind_host or not (
                isinstance(cause, OSError) and cause.errno == errno.EADDRNOTAVAIL
            ):
                raise
            self._connection = await self._open(endpoint, bind_host)
        return self._connection

    async def _open(self, endpoint: tuple[str, int], local_host: str | None) -> BrokerConnection:
        return await BrokerConnection.open(
            endpoint[0],
            endpoint[1],
            client_id=f"broker-{self._brokers.node_id}-fetcher-{self._leader_id}",
            timeout=self._settings().replica_socket_timeout_ms / 1000,
            local_host=local_host,
        )

    async def _send(self, connection: BrokerConnection, request: Any, extra_ms: int = 0) -> Any:
        try:
            timeout = (self._settings().replica_socket_timeout_ms + extra_ms) / 1000
            return await connection.send(request, timeout=timeout)
        except BaseException:
            # Whatever the failure, the connection is in doubt: the next call opens a new one.
            self.close()
            raise

    def _replica_fields(self, module: Any, version: int) -> dict[str, Any]:
        """Who fetches: ``replica_id``, from v15 ``replica_state`` with this broker's epoch
        (KIP-903: the leader serves a replica fetch only with the broker's current epoch)."""
        node_id = self._brokers.node_id
        if version < 15:
            return {"replica_id": node_id}
        epoch = self._brokers.broker_epoch(node_id)
        return {
            "replica_state": module.ReplicaState(
                replica_id=node_id, replica_epoch=-1 if epoch is None else epoch
            )
        }

    # -- Fetch ----------------------------------------------------------------------------------

    def _update_wanted(
        self, partitions: Mapping[TopicPartition, FetchPartition], changed: Collection[TopicPartition] | None
    ) -> list[SessionPartition] | None:
        """Bring the keyed partitions up to date; the session keys that changed (None: all)."""
        if changed is None:
            self._wanted = {(tp, data.topic_id): data for tp, data in partitions.items()}
            self._key_of = {key[0]: key for key in self._wanted}
            self._names = {data.topic_id: tp.topic for tp, data in partitions.items()}
            return None
        keys: list[SessionPartition] = []
        for tp in changed:
            old = self._key_of.pop(tp, None)
            if old is not None:
                del self._wanted[old]
                keys.append(old)
            data = partitions.get(tp)
            if data is not None:
                key = (tp, data.topic_id)
                self._wanted[key] = data
                self._key_of[tp] = key
                self._names[data.topic_id] = tp.topic
                if key != old:
                    keys.append(key)
        return keys

    async def fetch(
        self,
        partitions: Mapping[TopicPartition, FetchPartition],
        changed: Collection[TopicPartition] | None = None,
    ) -> dict[TopicPartition, FetchedPartition]:
        changed_keys = self._update_wanted(partitions, changed)
        try:
            connection = await self._connect()
        except BaseException:
            # The session did not see this fetch's changes: the next fetch is a full one.
            self._session.handle_error()
            raise
        settings = self._settings()
        version = connection.version(ApiKey.FETCH, FETCH_MAX_VERSION, FETCH_MIN_VERSION)
        module = request_module(ApiKey.FETCH, version)
        by_id = version >= 13
        session = self._session
        if by_id != self._session_uses_topic_ids:
            # A session is tied to whether it names topics by id: a new version needs a new one.
            session.close_existing()
            self._session_uses_topic_ids = by_id
        next_fetch = session.build(self._wanted, changed_keys)
        by_topic: dict[tuple[str, uuid.UUID], list[Any]] = defaultdict(list)
        fetch_partition = module.FetchPartition
        partition_max_bytes = settings.replica_fetch_max_bytes
        for (tp, topic_id), data in next_fetch.to_send.items():
            by_topic[(tp.topic, topic_id)].append(
                build(
                    fetch_partition,
                    partition=tp.partition,
                    current_leader_epoch=data.current_leader_epoch,
                    fetch_offset=data.fetch_offset,
                    last_fetched_epoch=data.last_fetched_epoch,
                    log_start_offset=data.log_start_offset,
                    partition_max_bytes=partition_max_bytes,
                )
            )
        forgotten: dict[tuple[str, uuid.UUID], list[int]] = defaultdict(list)
        for tp, topic_id in next_fetch.to_forget:
            forgotten[(tp.topic, topic_id)].append(tp.partition)
        request = build(
            module.FetchRequest,
            max_wait=datetime.timedelta(milliseconds=settings.replica_fetch_wait_max_ms),
            min_bytes=settings.replica_fetch_min_bytes,
            max_bytes=settings.replica_fetch_response_max_bytes,
            isolation_level=0,
            session_id=next_fetch.session_id,
            session_epoch=next_fetch.epoch,
            topics=tuple(
                build(module.FetchTopic, topic=name, topic_id=topic_id, partitions=tuple(parts))
                for (name, topic_id), parts in by_topic.items()
            ),
            forgotten_topics_data=tuple(
                build(module.ForgottenTopic, topic=name, topic_id=topic_id, partitions=tuple(parts))
                for (name, topic_id), parts in forgotten.items()
            ),
            rack_id="",
            **self._replica_fields(module, version),
        )
        try:
            response = await self._send(connection, request, settings.replica_fetch_wait_max_ms)
        except BaseException:
            session.handle_error()
            raise
        error = ErrorCode(response.error_code)
        if not session.handle_response(next_fetch, error, response.session_id):
            if error in SESSION_ERRORS:
                # The leader lost the session (evicted, restarted) or the epochs differ: the
                # next fetch is full and opens a new session, at once.
                log.info("fetch session reset", extra={"leader": self._leader_id, "error": error.name})
                return {}
            raise ConnectionError(f"fetch from broker {self._leader_id} failed: {error.name}")
        names = self._names
        answers: dict[TopicPartition, FetchedPartition] = {}
        for topic in response.responses:
            name = names.get(topic.topic_id) if by_id else topic.topic
            if name is None:
                continue
            for data in topic.partitions:
                tp = TopicPartition(name, data.partition_index)
                asked = partitions.get(tp)
                if asked is None or (by_id and asked.topic_id != topic.topic_id):
                    continue
                diverging = getattr(data, "diverging_epoch", None)
                answers[tp] = FetchedPartition(
                    ErrorCode(data.error_code),
                    data.high_watermark,
                    data.log_start_offset,
                    data.records,
                    (diverging.epoch, diverging.end_offset)
                    if diverging is not None and (diverging.epoch >= 0 or diverging.end_offset >= 0)
                    else None,
                )
        return answers

    async def close_session(self) -> None:
        """KIP-227's final epoch: the session's slot in the leader's cache is free at once. Only
        on the open connection (the session is the one the leader knows); best effort."""
        connection, session_id = self._connection, self._session.session_id
        if connection is None or not connection.is_open or session_id == INVALID_SESSION_ID:
            return
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
        await self._send(connection, request)

    # -- OffsetForLeaderEpoch and ListOffsets -----------------------------------------------------

    async def fetch_epoch_end_offsets(
        self, partitions: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, EpochEndOffset]:
        connection = await self._connect()
        low, high = OFFSET_FOR_LEADER_EPOCH_VERSION
        version = connection.version(ApiKey.OFFSET_FOR_LEADER_EPOCH, high, low)
        module = request_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, version)
        by_topic: dict[str, list[Any]] = defaultdict(list)
        for tp, (current_leader_epoch, epoch) in partitions.items():
            by_topic[tp.topic].append(
                build(
                    module.OffsetForLeaderPartition,
                    partition=tp.partition,
                    current_leader_epoch=current_leader_epoch,
                    leader_epoch=epoch,
                )
            )
        request = build(
            module.OffsetForLeaderEpochRequest,
            replica_id=self._brokers.node_id,
            topics=tuple(
                build(module.OffsetForLeaderTopic, topic=topic, partitions=tuple(parts))
                for topic, parts in by_topic.items()
            ),
        )
        response = await self._send(connection, request)
        answers: dict[TopicPartition, EpochEndOffset] = {}
        for topic in response.topics:
            for answer in topic.partitions:
                tp = TopicPartition(topic.topic, answer.partition)
                if tp in partitions:
                    answers[tp] = EpochEndOffset(
                        ErrorCode(answer.error_code), answer.leader_epoch, answer.end_offset
                    )
        return answers

    async def fetch_earliest_offset(self, tp: TopicPartition, current_leader_epoch: int) -> int | None:
        return await self._list_offset(tp, current_leader_epoch, EARLIEST_TIMESTAMP)

    async def fetch_latest_offset(self, tp: TopicPartition, current_leader_epoch: int) -> int | None:
        return await self._list_offset(tp, current_leader_epoch, LATEST_TIMESTAMP)

    async def _list_offset(self, tp: TopicPartition, current_leader_epoch: int, timestamp: int) -> int | None:
        connection = await self._connect()
        version = connection.version(ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION[1], LIST_OFFSETS_VERSION[0])
        module = request_module(ApiKey.LIST_OFFSETS, version)
        request = build(
            module.ListOffsetsRequest,
            replica_id=self._brokers.node_id,
            isolation_level=0,
            topics=(
                build(
                    module.ListOffsetsTopic,
                    name=tp.topic,
                    partitions=(
                        build(
                            module.ListOffsetsPartition,
                            partition_index=tp.partition,
                            current_leader_epoch=current_leader_epoch,
                            timestamp=timestamp,
                            max_num_offsets=1,
                        ),
                    ),
                ),
            ),
        )
        response = await self._send(connection, request)
        for topic in response.topics:
            for answer in topic.partitions:
                if answer.error_code == ErrorCode.none:
                    return int(answer.offset)
        return None
