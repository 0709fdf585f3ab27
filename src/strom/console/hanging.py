"""Hanging transactions, found as ``strom transactions find-hanging`` (Kafka's
``kafka-transactions find-hanging``) finds them, with the async admin client.

A transaction hangs on a partition when the partition's producer state holds it open (a
current transaction start offset) for longer than the longest transaction timeout, while
its coordinator does not list that partition in an ongoing or completing transaction: its
markers will never come, and ``read_committed`` consumers stay stuck at its start offset.
The CLI's version works on the blocking AdminClient inside its argparse handler, so the
console has this one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from strom.client.admin import AsyncAdminClient, ProducerState, TransactionDescription
from strom.client.cluster import TopicPartition
from strom.client.errors import ErrorCode, KafkaException

# Partitions asked about per DescribeTopics / DescribeProducers, so that no request is giant.
BATCH = 500


@dataclass(frozen=True, slots=True)
class Hanging:
    partition: TopicPartition
    state: ProducerState
    open_ms: int  # since the producer last wrote to the partition


async def partitions_of(admin: AsyncAdminClient, topics: Sequence[str]) -> list[TopicPartition]:
    found: list[TopicPartition] = []
    for start in range(0, len(topics), BATCH):
        for description in (await admin.describe_topics(topics[start : start + BATCH])).values():
            found += [TopicPartition(description.name, p.partition) for p in description.partitions]
    return found


async def find_hanging(
    admin: AsyncAdminClient,
    topics: Sequence[str] | None = None,
    *,
    max_transaction_timeout_ms: int = 15 * 60_000,
    now_ms: int | None = None,
) -> list[Hanging]:
    """The hanging transactions on the partitions of ``topics`` (every topic when None)."""
    names = list(topics) if topics is not None else await admin.list_topics()
    partitions = await partitions_of(admin, names)
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    open_transactions: list[tuple[TopicPartition, ProducerState]] = []
    for start in range(0, len(partitions), BATCH):
        described = await admin.describe_producers(partitions[start : start + BATCH])
        open_transactions += [
            (tp, s)
            for tp, states in described.items()
            for s in states
            if s.current_transaction_start_offset is not None
            and now - s.last_timestamp > max_transaction_timeout_ms
        ]
    if not open_transactions:
        return []
    producer_ids = {s.producer_id for _, s in open_transactions}
    transactional_ids = {
        t.producer_id: t.transactional_id
        for t in await admin.list_transactions(producer_ids=producer_ids)
        if t.producer_id in producer_ids
    }
    descriptions: dict[str, TransactionDescription] = {}
    for transactional_id in sorted(set(transactional_ids.values())):
        try:
            descriptions[transactional_id] = (await admin.describe_transactions([transactional_id]))[
                transactional_id
            ]
        except KafkaException as exc:
            if exc.error_code != ErrorCode.transactional_id_not_found:
                raise
    hanging = []
    for tp, state in open_transactions:
        known = transactional_ids.get(state.producer_id)
        description = descriptions.get(known) if known is not None else None
        # The coordinator lists the partitions of an ongoing transaction, and of one awaiting its
        # markers while it completes: any other open transaction is left hanging.
        if description is None or tp not in description.topic_partitions:
            hanging.append(Hanging(tp, state, now - state.last_timestamp))
    return sorted(hanging, key=lambda h: (h.partition.topic, h.partition.partition, h.state.producer_id))
