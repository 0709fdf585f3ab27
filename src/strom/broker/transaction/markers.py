"""Transaction markers: how a coordinator has a COMMIT or ABORT written to a transaction's partitions.

``write_markers_locally`` is the partition leader's side, shared by the WriteTxnMarkers handler
and the coordinator when it leads the partition itself (always, on a single node): append the
marker (acks=all), wait for the ISR, then tell the group coordinator when the partition is one of
``__consumer_offsets`` (its pending transactional offsets are applied or dropped).
``TransactionMarkerChannel`` routes a transaction's markers by partition leader: in-process for
this broker, WriteTxnMarkers over the inter-broker listener for the others (Kafka's
TransactionMarkerChannelManager), one connection per broker; a partition leader's verification
requests to a coordinator (``verification``) use the same connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from strom.broker.coordinator.group_metadata_manager import OFFSETS_TOPIC
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager
from strom.network.connection import BrokerConnection
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode, ProtocolError
from strom.protocol.messages import build
from strom.records.control import ControlRecordType

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS_VERSION = 1


@dataclass(frozen=True, slots=True)
class TxnMarker:
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    result: ControlRecordType
    partitions: tuple[TopicPartition, ...]


class TransactionCompletionListener(Protocol):
    """The group coordinator: a marker landed in a ``__consumer_offsets`` partition."""

    def on_transaction_completed(self, offsets_partition: int, producer_id: int, committed: bool) -> None: ...


async def write_markers_locally(
    replica_manager: ReplicaManager,
    groups: TransactionCompletionListener,
    marker: TxnMarker,
    timeout_ms: int,
) -> dict[TopicPartition, ErrorCode]:
    """Write ``marker`` to its partitions led here; each partition's error once replicated."""
    results = replica_manager.append_transaction_markers(
        marker.producer_id,
        marker.producer_epoch,
        marker.coordinator_epoch,
        marker.result,
        list(marker.partitions),
    )
    if replica_manager.delays_produce(-1):
        await replica_manager.await_replication(results, timeout_ms)
    committed = marker.result == ControlRecordType.COMMIT
    for tp, result in results.items():
        if tp.topic == OFFSETS_TOPIC and result.error == ErrorCode.none:
            groups.on_transaction_completed(tp.partition, marker.producer_id, committed)
    return {tp: result.error for tp, result in results.items()}


class TransactionMarkerChannel:
    def __init__(
        self,
        node_id: int,
        replica_manager: ReplicaManager,
        groups: TransactionCompletionListener,
        peer_endpoint: Callable[[int], tuple[str, int] | None],
        *,
        request_timeout_ms: int,
    ) -> None:
        self._node_id = node_id
        self._replica_manager = replica_manager
        self._groups = groups
        self._peer_endpoint = peer_endpoint
        self._request_timeout_ms = request_timeout_ms
        self._connections: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Lock] = {}

    async def send(self, leader_id: int, marker: TxnMarker) -> dict[TopicPartition, ErrorCode]:
        """Write ``marker`` to its partitions, all led by ``leader_id``. A broker that cannot be
        reached answers NOT_LEADER_OR_FOLLOWER for every partition: the caller retries after
        looking the leaders up again."""
        if leader_id == self._node_id:
            return await write_markers_locally(
                self._replica_manager, self._groups, marker, self._request_timeout_ms
            )
        response = await self.request(leader_id, _request(marker))
        if response is None:
            return dict.fromkeys(marker.partitions, ErrorCode.not_leader_or_follower)
        errors: dict[TopicPartition, ErrorCode] = {}
        for result in response.markers:
            for topic in result.topics:
                for p in topic.partitions:
                    errors[TopicPartition(topic.name, p.partition_index)] = ErrorCode(p.error_code)
        # A partition the answer leaves out was not written.
        return {tp: errors.get(tp, ErrorCode.unknown_server_error) for tp in marker.partitions}

    async def request(self, broker_id: int, request: Any) -> Any | None:
        """Send ``request`` to another broker over its inter-broker listener; None when it cannot
        be reached, does not answer in time or answers unreadable bytes (the connection is then
        opened again next time)."""
        try:
            connection = await self._connection(broker_id)
            return await connection.send(request, timeout=self._request_timeout_ms / 1000 + 5)
        except (OSError, ProtocolError) as e:  # connection errors and timeouts are OSErrors
            self._close(broker_id)
            log.info("cannot reach a broker for a transaction", extra={"broker": broker_id, "error": str(e)})
            return None

    async def _connection(self, broker_id: int) -> BrokerConnection:
        lock = self._connecting.setdefault(broker_id, asyncio.Lock())
        async with lock:
            connection = self._connections.get(broker_id)
            endpoint = self._peer_endpoint(broker_id)
            if endpoint is None:
                raise ConnectionError(f"broker {broker_id} is not registered")
            if connection is not None and connection.is_open and (connection.host, connection.port) == endpoint:
                return connection
            self._close(broker_id)
            connection = self._connections[broker_id] = await BrokerConnection.open(
                endpoint[0],
                endpoint[1],
                client_id=f"broker-{self._node_id}-txn-markers",
                timeout=self._request_timeout_ms / 1000,
            )
            return connection

    def _close(self, broker_id: int) -> None:
        connection = self._connections.pop(broker_id, None)
        if connection is not None:
            connection.close()

    def close(self) -> None:
        for broker_id in list(self._connections):
            self._close(broker_id)


def _request(marker: TxnMarker) -> Any:
    m = request_module(ApiKey.WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION)
    by_topic: dict[str, list[int]] = {}
    for tp in marker.partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return build(
        m.WriteTxnMarkersRequest,
        markers=(
            build(
                m.WritableTxnMarker,
                producer_id=marker.producer_id,
                producer_epoch=marker.producer_epoch,
                transaction_result=marker.result == ControlRecordType.COMMIT,
                topics=tuple(
                    build(m.WritableTxnMarkerTopic, name=topic, partition_indexes=tuple(ps))
                    for topic, ps in by_topic.items()
                ),
                coordinator_epoch=marker.coordinator_epoch,
            ),
        ),
    )
