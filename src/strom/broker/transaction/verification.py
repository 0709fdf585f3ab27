"""KIP-890 part 1 on a partition leader: a transaction's first write to a partition is appended
only once its coordinator confirms the partition is in the producer's ongoing transaction.

Without it, a write delayed past its transaction's end (a retry that arrives after the abort)
would open a transaction no coordinator knows of, holding the partition's LSO forever (a
"hanging" transaction). The leader asks with AddPartitionsToTxn v4 ``verify_only``, in-process
when it coordinates the transactional id itself. Between asking and appending, a marker for the
producer may land: the partition's verification guard, taken before asking and dropped by any
marker, tells the append whether the answer still holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strom.broker.partition import TopicPartition
from strom.broker.transaction.coordinator import TransactionCoordinator
from strom.broker.transaction.markers import TransactionMarkerChannel
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build

VERIFY_VERSION = 4
# What the producer is told when the coordinator cannot answer: retriable, as Kafka answers.
_UNAVAILABLE = ErrorCode.not_enough_replicas


def produce_error(error: ErrorCode) -> ErrorCode:
    """A verification's answer as a produce error (Kafka's AddPartitionsToTxnManager mapping)."""
    if error in (
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.concurrent_transactions,
    ):
        return _UNAVAILABLE
    if error == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch  # what producers expect from a produce
    return error


class TransactionVerifier:
    def __init__(
        self,
        node_id: int,
        coordinator: TransactionCoordinator,
        channel: TransactionMarkerChannel,
        coordinator_of: Callable[[str], int | None],
    ) -> None:
        self._node_id = node_id
        self._coordinator = coordinator
        self._channel = channel
        # The broker coordinating a transactional id (None or -1: none known right now).
        self._coordinator_of = coordinator_of

    async def verify(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: set[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """Each partition's produce error: NONE when it is in the ongoing transaction."""
        coordinator_id = self._coordinator_of(transactional_id)
        if coordinator_id is None or coordinator_id < 0:
            return dict.fromkeys(partitions, _UNAVAILABLE)
        if coordinator_id == self._node_id:
            answered = self._coordinator.verify_partitions(transactional_id, producer_id, producer_epoch, partitions)
        else:
            response = await self._channel.request(
                coordinator_id, _request(transactional_id, producer_id, producer_epoch, partitions)
            )
            answered = _errors(response, partitions)
        return {tp: produce_error(answered.get(tp, _UNAVAILABLE)) for tp in partitions}


def _request(transactional_id: str, producer_id: int, producer_epoch: int, partitions: set[TopicPartition]) -> Any:
    m = request_module(ApiKey.ADD_PARTITIONS_TO_TXN, VERIFY_VERSION)
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return build(
        m.AddPartitionsToTxnRequest,
        transactions=(
            build(
                m.AddPartitionsToTxnTransaction,
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                verify_only=True,
                topics=tuple(
                    build(m.AddPartitionsToTxnTopic, name=topic, partitions=tuple(ps)) for topic, ps in by_topic.items()
                ),
            ),
        ),
    )


def _errors(response: Any, partitions: set[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
    if response is None:
        return dict.fromkeys(partitions, _UNAVAILABLE)
    if response.error_code != ErrorCode.none:
        return dict.fromkeys(partitions, ErrorCode(response.error_code))
    return {
        TopicPartition(topic.name, p.partition_index): ErrorCode(p.partition_error_code)
        for result in response.results_by_transaction
        for topic in result.topic_results
        for p in topic.results_by_partition
    }
