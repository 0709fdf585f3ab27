"""Fetch (1): whole batches below the high watermark, long-polling up to max_wait.

A response holds at most the broker's fetch.max.bytes (KIP-541) or the request's
max_bytes, whichever is smaller -- except that the first partition with data always
gets one whole batch, as in Kafka, so a batch larger than the limits is not stuck.

Strom does not create incremental fetch sessions (KIP-227): every response carries
session id 0, so clients keep sending full requests, and every requested
partition appears in every response.
"""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import FetchRequestPartition, FetchResult
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build, has_field, to_ms

# Errors that tell a client to look for the leader elsewhere: answered with KIP-951 hints.
LEADER_ERRORS = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch})


def replica_id_of(version: int, request: Any) -> int:
    """The fetching follower's broker id, or -1 for a consumer (replica_state from v15)."""
    if version >= 15:
        return int(request.replica_state.replica_id)
    return int(getattr(request, "replica_id", -1))


async def handle_fetch(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    image = broker.control_plane.image
    r = ctx.response
    session_id = getattr(request, "session_id", 0)
    if session_id != 0:
        return build(
            r.FetchResponse, error_code=ErrorCode.fetch_session_id_not_found, session_id=0, responses=()
        )

    by_id = ctx.version >= 13
    replica_id = replica_id_of(ctx.version, request)
    reads: list[FetchRequestPartition] = []
    errors: dict[TopicPartition, FetchResult] = {}
    order: list[tuple[Any, list[TopicPartition]]] = []
    for fetch_topic in request.topics:
        if by_id:
            topic = image.topic_by_id(fetch_topic.topic_id)
            key: Any = fetch_topic.topic_id
            name = topic.name if topic is not None else str(fetch_topic.topic_id)
            unknown = ErrorCode.unknown_topic_id
        else:
            key = name = fetch_topic.topic
            topic = image.topic(name)
            unknown = ErrorCode.unknown_topic_or_partition
        tps = []
        for p in fetch_topic.partitions:
            tp = TopicPartition(name, p.partition)
            tps.append(tp)
            partition = broker.replica_manager.partition(tp) if topic is not None else None
            if partition is None:
                offline = topic is not None and broker.replica_manager.is_offline(tp)
                errors[tp] = FetchResult(ErrorCode.kafka_storage_error if offline else unknown)
                continue
            epoch_error = partition.leader_epoch_error(getattr(p, "current_leader_epoch", -1))
            if epoch_error is None and not partition.is_leader:
                # No fetch from followers (KIP-392 is not implemented): only the leader serves.
                epoch_error = ErrorCode.not_leader_or_follower
            if epoch_error is not None:
                errors[tp] = FetchResult(epoch_error)
                continue
            reads.append(
                FetchRequestPartition(
                    tp,
                    p.fetch_offset,
                    max(0, p.partition_max_bytes),
                    last_fetched_epoch=getattr(p, "last_fetched_epoch", -1),
                    log_start_offset=getattr(p, "log_start_offset", -1),
                )
            )
        order.append((key, tps))

    max_wait_ms = to_ms(request.max_wait)
    max_bytes = max(0, min(getattr(request, "max_bytes", 0x7FFFFFFF), broker.config.fetch_max_bytes))
    if errors:
        max_wait_ms = 0  # answer errors at once, as Kafka completes such a fetch immediately
    results = await broker.replica_manager.fetch_messages(
        reads, max_wait_ms, request.min_bytes, max_bytes, replica_id=replica_id
    )
    results.update(errors)
    hints = leader_hints(
        broker.replica_manager, [tp for tp, result in results.items() if result.error in LEADER_ERRORS]
    )

    responses = []
    for key, tps in order:
        partitions = tuple(
            build(
                r.PartitionData,
                partition_index=tp.partition,
                error_code=result.error,
                high_watermark=result.high_watermark,
                last_stable_offset=result.last_stable_offset,
                log_start_offset=result.log_start_offset,
                aborted_transactions=None,
                preferred_read_replica=-1,
                records=result.records,
                **_partition_hints(r, tp, result, hints),
            )
            for tp in tps
            for result in (results[tp],)
        )
        topic_key = {"topic_id": key} if by_id else {"topic": key}
        responses.append(build(r.FetchableTopicResponse, partitions=partitions, **topic_key))
    return build(
        r.FetchResponse,
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(responses),
        node_endpoints=node_endpoints(r, broker.replica_manager, hints),
    )


def leader_hints(replica_manager: Any, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
    """KIP-951: the leader (id, epoch) this broker knows for partitions it cannot serve."""
    return {tp: hint for tp in tps if (hint := replica_manager.leader_hint(tp)) is not None}


def node_endpoints(
    r: Any, replica_manager: Any, hints: dict[TopicPartition, tuple[int, int]]
) -> tuple[Any, ...]:
    """KIP-951's node_endpoints: where each hinted leader listens (only in versions that have it)."""
    if not hints or not hasattr(r, "NodeEndpoint"):
        return ()
    endpoints = []
    for leader_id in sorted({leader for leader, _ in hints.values()}):
        endpoint = replica_manager.broker_endpoint(leader_id)
        if endpoint is not None:
            endpoints.append(
                build(r.NodeEndpoint, node_id=leader_id, host=endpoint[0], port=endpoint[1], rack=None)
            )
    return tuple(endpoints)


def _partition_hints(
    r: Any, tp: TopicPartition, result: FetchResult, hints: dict[TopicPartition, tuple[int, int]]
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if result.diverging_epoch is not None and has_field(r.PartitionData, "diverging_epoch"):
        epoch, end_offset = result.diverging_epoch
        fields["diverging_epoch"] = build(r.EpochEndOffset, epoch=epoch, end_offset=end_offset)
    hint = hints.get(tp)
    if hint is not None and has_field(r.PartitionData, "current_leader"):
        fields["current_leader"] = build(r.LeaderIdAndEpoch, leader_id=hint[0], leader_epoch=hint[1])
    return fields
