"""The transaction APIs: AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26),
WriteTxnMarkers (27), DescribeProducers (61), DescribeTransactions (65), ListTransactions (66).

The transaction coordinator (``strom.broker.transaction``) answers the producer's calls;
WriteTxnMarkers and DescribeProducers are a partition leader's. PRODUCER_FENCED (KIP-588) is
answered as INVALID_PRODUCER_EPOCH to the versions older than it, as Kafka does.
"""

from __future__ import annotations

import datetime
from typing import Any

from strom.broker.coordinator.group_metadata_manager import OFFSETS_TOPIC, partition_for
from strom.broker.dispatcher import RequestContext
from strom.broker.partition import TopicPartition
from strom.broker.transaction.log_records import TransactionState
from strom.broker.transaction.markers import TxnMarker, write_markers_locally
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from strom.records.control import ControlRecordType

# The first version of each API that knows PRODUCER_FENCED.
_PRODUCER_FENCED_SINCE = {"add_partitions": 2, "add_offsets": 2, "end_txn": 2}
# How long a marker waits for the ISR when a coordinator writes it over the wire.
MARKER_WRITE_TIMEOUT_MS = 30_000


def _fenced_for(version: int, api: str, error: ErrorCode) -> ErrorCode:
    if error == ErrorCode.producer_fenced and version < _PRODUCER_FENCED_SINCE[api]:
        return ErrorCode.invalid_producer_epoch
    return error


def _requested_partitions(ctx: RequestContext, topics: Any) -> tuple[set[TopicPartition], dict[TopicPartition, ErrorCode]]:
    """The partitions a request names, and an error for each that does not exist (Kafka answers
    UNKNOWN_TOPIC_OR_PARTITION for those, OPERATION_NOT_ATTEMPTED for the rest)."""
    image = ctx.broker.control_plane.image
    partitions: set[TopicPartition] = set()
    unknown: dict[TopicPartition, ErrorCode] = {}
    for topic in topics:
        state = image.topic(topic.name)
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p)
            partitions.add(tp)
            if state is None or not 0 <= p < len(state.partitions):
                unknown[tp] = ErrorCode.unknown_topic_or_partition
    return partitions, unknown


def _topic_results(r: Any, errors: dict[TopicPartition, ErrorCode]) -> tuple[Any, ...]:
    by_topic: dict[str, list[Any]] = {}
    for tp, error in errors.items():
        by_topic.setdefault(tp.topic, []).append(
            build(r.AddPartitionsToTxnPartitionResult, partition_index=tp.partition, partition_error_code=error)
        )
    return tuple(
        build(r.AddPartitionsToTxnTopicResult, name=topic, results_by_partition=tuple(results))
        for topic, results in by_topic.items()
    )


async def _add_partitions(
    ctx: RequestContext, transactional_id: str, producer_id: int, producer_epoch: int, topics: Any, verify_only: bool
) -> dict[TopicPartition, ErrorCode]:
    coordinator = ctx.broker.transaction_coordinator
    partitions, unknown = _requested_partitions(ctx, topics)
    if unknown:
        return {tp: unknown.get(tp, ErrorCode.operation_not_attempted) for tp in partitions}
    if verify_only:
        return coordinator.verify_partitions(transactional_id, producer_id, producer_epoch, partitions)
    error = await coordinator.add_partitions(transactional_id, producer_id, producer_epoch, partitions)
    return dict.fromkeys(partitions, _fenced_for(ctx.version, "add_partitions", error))


async def handle_add_partitions_to_txn(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    if ctx.version <= 3:
        errors = await _add_partitions(
            ctx,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            request.v3_and_below_topics,
            verify_only=False,
        )
        return build(r.AddPartitionsToTxnResponse, results_by_topic_v3_and_below=_topic_results(r, errors))
    # v4: the brokers' batch (KIP-890), several transactions at once, some only verified.
    results = []
    for txn in request.transactions:
        errors = await _add_partitions(
            ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.topics, txn.verify_only
        )
        results.append(
            build(r.AddPartitionsToTxnResult, transactional_id=txn.transactional_id, topic_results=_topic_results(r, errors))
        )
    return build(r.AddPartitionsToTxnResponse, error_code=ErrorCode.none, results_by_transaction=tuple(results))


async def handle_add_offsets_to_txn(ctx: RequestContext, request: Any) -> Any:
    """The group's ``__consumer_offsets`` partition joins the transaction: its offsets commit with it."""
    broker = ctx.broker
    await broker.prepare_offsets_topic()
    offsets = broker.control_plane.image.topic(OFFSETS_TOPIC)
    if offsets is None or not offsets.partitions:
        error = ErrorCode.coordinator_not_available
    else:
        tp = TopicPartition(OFFSETS_TOPIC, partition_for(request.group_id, len(offsets.partitions)))
        error = await broker.transaction_coordinator.add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch, {tp}
        )
    return build(ctx.response.AddOffsetsToTxnResponse, error_code=_fenced_for(ctx.version, "add_offsets", error))


async def handle_end_txn(ctx: RequestContext, request: Any) -> Any:
    error = await ctx.broker.transaction_coordinator.end_transaction(
        request.transactional_id, request.producer_id, request.producer_epoch, bool(request.committed)
    )
    return build(ctx.response.EndTxnResponse, error_code=_fenced_for(ctx.version, "end_txn", error))


async def handle_write_txn_markers(ctx: RequestContext, request: Any) -> Any:
    """A coordinator's markers for partitions this broker leads (or an operator's abort of a
    hanging transaction): appended and replicated before the answer."""
    r = ctx.response
    broker = ctx.broker
    results = []
    for m in request.markers:
        partitions = tuple(TopicPartition(t.name, p) for t in m.topics for p in t.partition_indexes)
        marker = TxnMarker(
            m.producer_id,
            m.producer_epoch,
            m.coordinator_epoch,
            ControlRecordType.COMMIT if m.transaction_result else ControlRecordType.ABORT,
            partitions,
        )
        errors = await write_markers_locally(
            broker.replica_manager, broker.group_coordinator, marker, MARKER_WRITE_TIMEOUT_MS
        )
        by_topic: dict[str, list[Any]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(
                build(r.WritableTxnMarkerPartitionResult, partition_index=tp.partition, error_code=errors[tp])
            )
        results.append(
            build(
                r.WritableTxnMarkerResult,
                producer_id=m.producer_id,
                topics=tuple(
                    build(r.WritableTxnMarkerTopicResult, name=topic, partitions=tuple(ps))
                    for topic, ps in by_topic.items()
                ),
            )
        )
    return build(r.WriteTxnMarkersResponse, markers=tuple(results))


def _time(ms: int) -> datetime.datetime:
    # The field is not nullable: "no transaction started" is -1 ms, as Kafka writes it.
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


async def handle_describe_transactions(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    state = ctx.broker.transaction_coordinator.state
    described = []
    for transactional_id in request.transactional_ids:
        error, _, metadata = state.get(transactional_id)
        if error == ErrorCode.none and (metadata is None or metadata.state == TransactionState.DEAD):
            error = ErrorCode.transactional_id_not_found
        if metadata is None or error != ErrorCode.none:
            # The fields an error leaves are the schema's defaults, as Kafka answers them.
            described.append(
                build(
                    r.TransactionState,
                    error_code=error,
                    transactional_id=transactional_id,
                    transaction_state="",
                    transaction_timeout=datetime.timedelta(0),
                    transaction_start_time=_time(0),
                    producer_id=0,
                    producer_epoch=0,
                    topics=(),
                )
            )
            continue
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(metadata.partitions):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        described.append(
            build(
                r.TransactionState,
                error_code=ErrorCode.none,
                transactional_id=transactional_id,
                transaction_state=metadata.state.display_name,
                transaction_timeout=datetime.timedelta(milliseconds=metadata.timeout_ms),
                transaction_start_time=_time(metadata.start_timestamp_ms),
                producer_id=metadata.producer_id,
                producer_epoch=metadata.producer_epoch,
                topics=tuple(build(r.TopicData, topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
            )
        )
    return build(r.DescribeTransactionsResponse, transaction_states=tuple(described))


async def handle_list_transactions(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    coordinator = ctx.broker.transaction_coordinator
    names = {s.display_name: s for s in TransactionState}
    unknown = tuple(name for name in request.state_filters if name not in names)
    states = {names[name] for name in request.state_filters if name in names}
    producer_ids = set(request.producer_id_filters)
    min_duration = getattr(request, "duration_filter", -1)
    now = coordinator.time_ms()
    listed = [
        build(
            r.TransactionState,
            transactional_id=metadata.transactional_id,
            producer_id=metadata.producer_id,
            transaction_state=metadata.state.display_name,
        )
        for _, metadata in coordinator.state.transactions()
        if metadata.state != TransactionState.DEAD
        and (not states or metadata.state in states)
        and (not producer_ids or metadata.producer_id in producer_ids)
        and (min_duration < 0 or (metadata.start_timestamp_ms >= 0 and now - metadata.start_timestamp_ms > min_duration))
    ]
    error = ErrorCode.coordinator_load_in_progress if coordinator.state.loading else ErrorCode.none
    return build(
        r.ListTransactionsResponse,
        error_code=error,
        unknown_state_filters=unknown,
        transaction_states=tuple(listed) if not unknown or states else (),
    )


async def handle_describe_producers(ctx: RequestContext, request: Any) -> Any:
    """The producers with state in partitions led here (``kafka-transactions.sh`` finds hanging
    transactions with it)."""
    r = ctx.response
    replica_manager = ctx.broker.replica_manager
    topics = []
    for topic in request.topics:
        partitions = []
        for index in topic.partition_indexes:
            partition = replica_manager.partition(TopicPartition(topic.name, index))
            if partition is None or not partition.is_leader:
                error = (
                    ErrorCode.unknown_topic_or_partition
                    if ctx.broker.control_plane.image.topic(topic.name) is None
                    else ErrorCode.not_leader_or_follower
                )
                partitions.append(build(r.PartitionResponse, partition_index=index, error_code=error, active_producers=()))
                continue
            producers = tuple(
                build(
                    r.ProducerState,
                    producer_id=entry.producer_id,
                    producer_epoch=entry.producer_epoch,
                    last_sequence=entry.last_seq,
                    last_timestamp=entry.last_timestamp,
                    coordinator_epoch=entry.coordinator_epoch,
                    current_txn_start_offset=entry.current_txn_first_offset,
                )
                for entry in partition.log.producer_state.active_producers.values()
            )
            partitions.append(
                build(r.PartitionResponse, partition_index=index, error_code=ErrorCode.none, active_producers=producers)
            )
        topics.append(build(r.TopicResponse, name=topic.name, partitions=tuple(partitions)))
    return build(r.DescribeProducersResponse, topics=tuple(topics))
