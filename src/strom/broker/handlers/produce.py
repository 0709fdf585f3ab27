"""Produce (0): append record batches to partition leaders.

A transaction's first write to a partition is verified with its coordinator first (KIP-890 part
1, ``strom.broker.transaction.verification``).

The handler never looks inside a batch: the log validates every record (on a worker
thread when that may take long) and assigns offsets. With acks=0 nothing is answered; when such a produce fails the
connection is closed, which is the producer's only signal (as in Kafka). An acks=all produce in
a cluster is answered with a DelayedResponse once appended: it waits for the ISR while the
connection takes its next request.
"""

from __future__ import annotations

import datetime
from typing import Any

from strom.broker.dispatcher import DelayedResponse, RequestContext
from strom.broker.handlers.fetch import leader_hints, node_endpoints
from strom.broker.handlers.partition_view import unhosted_partition_error
from strom.broker.network import CloseConnection
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ProduceResult
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import ZERO_UUID, build, has_field, to_ms
from strom.records import batch as rb


def _append_time(ms: int) -> datetime.datetime | None:
    return None if ms < 0 else datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


async def handle_produce(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    image = broker.control_plane.image
    acks = request.acks
    entries: list[tuple[TopicPartition, bytes | None]] = []
    early: dict[TopicPartition, ProduceResult] = {}
    # (response key, partitions in request order) per topic, to answer in the request's shape.
    order: list[tuple[Any, list[TopicPartition]]] = []
    by_id = ctx.version >= 13
    for topic_data in request.topic_data:
        topic_id = topic_data.topic_id if by_id else None
        if by_id:
            # kio decodes the zero uuid as None: no topic has it.
            topic = image.topic_by_id(topic_id) if topic_id is not None else None
            name = topic.name if topic is not None else ""
            unknown = ErrorCode.unknown_topic_id
        else:
            name = topic_data.name
            topic = image.topic(name)
            unknown = ErrorCode.unknown_topic_or_partition
        tps = []
        for data in topic_data.partition_data:
            tp = TopicPartition(name or str(topic_id), data.index)
            tps.append(tp)
            if acks not in (0, 1, -1):
                early[tp] = ProduceResult(ErrorCode.invalid_required_acks)
            elif topic is None:
                early[tp] = ProduceResult(unknown)
            elif topic.internal:
                early[tp] = ProduceResult(
                    ErrorCode.invalid_topic_exception,
                    error_message=f"Producing to internal topic {name} is not allowed",
                )
            elif broker.replica_manager.partition(tp) is None:
                early[tp] = ProduceResult(unhosted_partition_error(broker.replica_manager, image, tp))
            else:
                entries.append((tp, data.records))
        order.append((topic_id or ZERO_UUID if by_id else name, tps))

    replica_manager = broker.replica_manager
    guards: dict[TopicPartition, tuple[int, object]] = {}
    if request.transactional_id is not None and entries:
        guards = await _verify_first_writes(ctx, request.transactional_id, entries, early)
        entries = [entry for entry in entries if entry[0] not in early]
    delayed = bool(entries) and replica_manager.delays_produce(acks)
    results = (
        await replica_manager.append(
            acks,
            entries,
            to_ms(request.timeout),
            await_replication=not delayed,
            verification_guards=guards,
        )
        if entries
        else {}
    )
    results.update(early)
    if acks == 0:
        if any(result.error != ErrorCode.none for result in results.values()):
            raise CloseConnection("acks=0 produce failed")
        return None
    if delayed:
        # Appended: the wait for the ISR lets the connection take its next request meanwhile.
        return DelayedResponse(_respond_when_replicated(ctx, request, results, order))
    return _produce_response(ctx, results, order)


async def _verify_first_writes(
    ctx: RequestContext,
    transactional_id: str,
    entries: list[tuple[TopicPartition, bytes | None]],
    early: dict[TopicPartition, ProduceResult],
) -> dict[TopicPartition, tuple[int, object]]:
    """KIP-890: ask the coordinator about each partition this transaction writes to here for the
    first time; a partition it does not confirm is answered its error (in ``early``). Returns the
    verification guards of the confirmed ones."""
    replica_manager = ctx.broker.replica_manager
    pending: dict[tuple[int, int], dict[TopicPartition, object]] = {}
    for tp, records in entries:
        partition = replica_manager.partition(tp)
        if partition is None or records is None or len(records) < rb.HEADER_SIZE:
            continue  # answered by the append itself
        header = rb.read_header(memoryview(records), 0)
        if not header.is_transactional or header.producer_id < 0:
            continue
        guard = partition.start_verification(header.producer_id)
        if guard is not None:
            pending.setdefault((header.producer_id, header.producer_epoch), {})[tp] = guard
    guards: dict[TopicPartition, tuple[int, object]] = {}
    for (producer_id, producer_epoch), tps in pending.items():
        errors = await ctx.broker.transaction_verifier.verify(transactional_id, producer_id, producer_epoch, set(tps))
        for tp, guard in tps.items():
            if errors[tp] == ErrorCode.none:
                guards[tp] = (producer_id, guard)
            else:
                early[tp] = ProduceResult(errors[tp], error_message="the partition is not in the producer's transaction")
    return guards


async def _respond_when_replicated(
    ctx: RequestContext,
    request: Any,
    results: dict[TopicPartition, ProduceResult],
    order: list[tuple[Any, list[TopicPartition]]],
) -> Any:
    await ctx.broker.replica_manager.await_replication(results, to_ms(request.timeout))
    return _produce_response(ctx, results, order)


def _produce_response(
    ctx: RequestContext,
    results: dict[TopicPartition, ProduceResult],
    order: list[tuple[Any, list[TopicPartition]]],
) -> Any:
    broker = ctx.broker
    r = ctx.response
    hints = leader_hints(
        broker.replica_manager,
        [tp for tp, result in results.items() if result.error == ErrorCode.not_leader_or_follower],
    )
    with_hints = has_field(r.PartitionProduceResponse, "current_leader")
    # Per-record errors exist from v8 (KIP-467); older answers carry the error code alone.
    with_record_errors = has_field(r.PartitionProduceResponse, "record_errors")
    responses = []
    for key, tps in order:
        partitions = []
        for tp in tps:
            result = results[tp]
            partitions.append(
                build(
                    r.PartitionProduceResponse,
                    index=tp.partition,
                    error_code=result.error,
                    base_offset=result.base_offset,
                    log_append_time=_append_time(result.log_append_time),
                    log_start_offset=result.log_start_offset,
                    record_errors=tuple(
                        build(r.BatchIndexAndErrorMessage, batch_index=i, batch_index_error_message=m)
                        for i, m in (result.record_errors if with_record_errors else ())
                    ),
                    error_message=result.error_message,
                    **(
                        {"current_leader": build(r.LeaderIdAndEpoch, leader_id=hint[0], leader_epoch=hint[1])}
                        if with_hints and (hint := hints.get(tp)) is not None
                        else {}
                    ),
                )
            )
        topic_key = {"topic_id": key} if not isinstance(key, str) else {"name": key}
        responses.append(build(r.TopicProduceResponse, partition_responses=tuple(partitions), **topic_key))
    return build(
        r.ProduceResponse,
        responses=tuple(responses),
        node_endpoints=node_endpoints(r, broker.replica_manager, hints),
    )
