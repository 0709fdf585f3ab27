"""DescribeTopicPartitions (75, KIP-966): Metadata's partition view, paginated.

Topics are described in name order (every topic when the request names none), starting at the
request's cursor. At most min(response_partition_limit, max.request.partition.size.limit)
partitions are returned; when more remain, ``next_cursor`` names the first one left out (a
topic's first partition when the limit ran out exactly at a topic's end). Unknown topics answer
UNKNOWN_TOPIC_OR_PARTITION and use none of the limit; nothing is auto-created. Strom has no
ELR (KIP-966's eligible leader replicas), so both ELR lists are empty.
"""

from __future__ import annotations

from typing import Any

from strom.broker.control_plane.metadata import TopicState
from strom.broker.dispatcher import RequestContext
from strom.broker.handlers.partition_view import partition_view
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import AUTHORIZED_OPERATIONS_OMITTED, ZERO_UUID, build


class _InvalidCursor(Exception):
    pass


def _topic(ctx: RequestContext, topic: TopicState, start: int, limit: int) -> tuple[Any, int | None]:
    """The topic's entity with its partitions from ``start`` (at most ``limit``), and the index of
    the first partition left out (None when none was)."""
    r = ctx.response
    ordered = sorted(topic.partitions, key=lambda p: p.partition)
    wanted = [p for p in ordered if p.partition >= start]
    taken, rest = wanted[:limit], wanted[limit:]
    partitions = []
    for p in taken:
        view = partition_view(ctx.broker.replica_manager, ctx.broker.control_plane, topic.name, p)
        partitions.append(
            build(
                r.DescribeTopicPartitionsResponsePartition,
                error_code=view.error,
                partition_index=p.partition,
                leader_id=view.leader,
                leader_epoch=p.leader_epoch,
                replica_nodes=tuple(p.replicas),
                isr_nodes=tuple(p.isr),
                eligible_leader_replicas=(),
                last_known_elr=(),
                offline_replicas=view.offline_replicas,
            )
        )
    entity = build(
        r.DescribeTopicPartitionsResponseTopic,
        error_code=ErrorCode.none,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.internal,
        partitions=tuple(partitions),
        topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )
    return entity, (rest[0].partition if rest else None)


def _unknown(ctx: RequestContext, name: str, error: ErrorCode) -> Any:
    return build(
        ctx.response.DescribeTopicPartitionsResponseTopic,
        error_code=error,
        name=name,
        topic_id=ZERO_UUID,
        is_internal=False,
        partitions=(),
        topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


def _check_cursor(requested: list[str], cursor: Any) -> None:
    if cursor is None:
        return
    if requested and cursor.topic_name not in requested:
        raise _InvalidCursor(
            f"DescribeTopicPartitionsRequest topic list should contain the cursor topic: {cursor.topic_name}"
        )
    if cursor.partition_index < 0:
        raise _InvalidCursor("Partition index in the cursor cannot be less than 0")


async def handle_describe_topic_partitions(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    image = ctx.broker.control_plane.image
    requested = [t.name for t in request.topics]
    cursor = request.cursor
    try:
        _check_cursor(requested, cursor)
    except _InvalidCursor:
        # As Kafka's error response: every requested topic carries the error.
        errors = tuple(_unknown(ctx, name, ErrorCode.invalid_request) for name in requested)
        return build(r.DescribeTopicPartitionsResponse, topics=errors, next_cursor=None)
    names = sorted(set(requested)) if requested else sorted(t.name for t in image.topics())
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
    remaining = max(
        0, min(request.response_partition_limit, ctx.broker.config.max_request_partition_size_limit)
    )
    topics: list[Any] = []
    next_cursor = None
    for name in names:
        if remaining == 0:
            # The limit ran out exactly at the previous topic's end: continue at this one.
            next_cursor = build(r.Cursor, topic_name=name, partition_index=0)
            break
        topic = image.topic(name)
        if topic is None:
            topics.append(_unknown(ctx, name, ErrorCode.unknown_topic_or_partition))
            continue
        start = cursor.partition_index if cursor is not None and cursor.topic_name == name else 0
        entity, left_out = _topic(ctx, topic, start, remaining)
        topics.append(entity)
        remaining -= len(entity.partitions)
        if left_out is not None:
            next_cursor = build(r.Cursor, topic_name=name, partition_index=left_out)
            break
    return build(r.DescribeTopicPartitionsResponse, topics=tuple(topics), next_cursor=next_cursor)
