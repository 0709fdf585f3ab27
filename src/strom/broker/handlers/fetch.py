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
from strom.protocol.messages import build, to_ms


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
                errors[tp] = FetchResult(unknown)
                continue
            epoch_error = partition.leader_epoch_error(getattr(p, "current_leader_epoch", -1))
            if epoch_error is not None:
                errors[tp] = FetchResult(epoch_error)
                continue
            reads.append(FetchRequestPartition(tp, p.fetch_offset, max(0, p.partition_max_bytes)))
        order.append((key, tps))

    max_wait_ms = to_ms(request.max_wait)
    max_bytes = max(0, min(getattr(request, "max_bytes", 0x7FFFFFFF), broker.config.fetch_max_bytes))
    if errors:
        max_wait_ms = 0  # answer errors at once, as Kafka completes such a fetch immediately
    results = await broker.replica_manager.fetch_messages(reads, max_wait_ms, request.min_bytes, max_bytes)
    results.update(errors)

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
            )
            for tp in tps
            for result in (results[tp],)
        )
        topic_key = {"topic_id": key} if by_id else {"topic": key}
        responses.append(build(r.FetchableTopicResponse, partitions=partitions, **topic_key))
    return build(r.FetchResponse, error_code=ErrorCode.none, session_id=0, responses=tuple(responses))
