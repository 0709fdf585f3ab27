"""Committed offsets: OffsetCommit (8), OffsetFetch (9), TxnOffsetCommit (28) and OffsetDelete (47).

TxnOffsetCommit writes a transaction's offsets, which stay pending in the group until the
transaction's marker lands; OffsetFetch with ``require_stable`` (v7+, KIP-447) answers
UNSTABLE_OFFSET_COMMIT for a partition with such a pending commit, so a consumer starting after
a transactional copier waits for its outcome instead of reading a stale offset.
"""

from __future__ import annotations

import time
from typing import Any

from strom.broker.coordinator.group import OffsetAndMetadata
from strom.broker.coordinator.group_metadata_manager import TransactionalProducer
from strom.broker.dispatcher import RequestContext
from strom.broker.partition import TopicPartition
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build, to_ms

NO_OFFSET = -1
NO_LEADER_EPOCH = -1


def _partition_errors(
    topics: Any, errors: dict[TopicPartition, ErrorCode], topic_type: Any, partition_type: Any
) -> tuple[Any, ...]:
    """Per-partition errors in the request's own topic and partition order."""
    return tuple(
        build(
            topic_type,
            name=t.name,
            partitions=tuple(
                build(
                    partition_type,
                    partition_index=p.partition_index,
                    error_code=errors[TopicPartition(t.name, p.partition_index)],
                )
                for p in t.partitions
            ),
        )
        for t in topics
    )


def _known_partition(ctx: RequestContext, tp: TopicPartition) -> bool:
    topic = ctx.broker.control_plane.image.topic(tp.topic)
    return topic is not None and 0 <= tp.partition < len(topic.partitions)


def _requested_offsets(
    ctx: RequestContext, request: Any, now: int, expire_timestamp: int = -1
) -> tuple[dict[TopicPartition, OffsetAndMetadata], dict[TopicPartition, ErrorCode]]:
    """An OffsetCommit's or TxnOffsetCommit's offsets, and UNKNOWN_TOPIC_OR_PARTITION for those of
    partitions that do not exist."""
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    errors: dict[TopicPartition, ErrorCode] = {}
    for topic in request.topics:
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p.partition_index)
            if not _known_partition(ctx, tp):
                errors[tp] = ErrorCode.unknown_topic_or_partition
                continue
            offsets[tp] = OffsetAndMetadata(
                offset=p.committed_offset,
                leader_epoch=getattr(p, "committed_leader_epoch", NO_LEADER_EPOCH),
                metadata=p.committed_metadata or "",
                commit_timestamp=now,
                expire_timestamp=expire_timestamp,
            )
    return offsets, errors


async def handle_offset_commit(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    now = time.time_ns() // 1_000_000
    retention = getattr(request, "retention_time", None)
    retention_ms = to_ms(retention) if retention is not None else -1
    # v2-v4 may ask for their own retention; -1 means the broker's offsets.retention.minutes.
    expire_timestamp = now + retention_ms if retention_ms >= 0 else -1
    offsets, errors = _requested_offsets(ctx, request, now, expire_timestamp)
    if offsets:
        await ctx.broker.prepare_offsets_topic()  # off the event loop, on first use
        errors.update(
            await ctx.broker.group_coordinator.commit_offsets(
                request.group_id,
                getattr(request, "generation_id_or_member_epoch", -1),
                request.member_id,
                getattr(request, "group_instance_id", None),
                offsets,
                ctx.version,
            )
        )
    return build(
        r.OffsetCommitResponse,
        topics=_partition_errors(
            request.topics, errors, r.OffsetCommitResponseTopic, r.OffsetCommitResponsePartition
        ),
    )


async def handle_txn_offset_commit(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    now = time.time_ns() // 1_000_000
    offsets, errors = _requested_offsets(ctx, request, now)

    async def verify(offsets_tp: TopicPartition) -> ErrorCode:
        answered = await ctx.broker.transaction_verifier.verify(
            request.transactional_id, request.producer_id, request.producer_epoch, {offsets_tp}
        )
        return _verification_error(answered[offsets_tp])

    if offsets:
        await ctx.broker.prepare_offsets_topic()
        errors.update(
            await ctx.broker.group_coordinator.commit_transactional_offsets(
                request.group_id,
                TransactionalProducer(request.producer_id, request.producer_epoch),
                getattr(request, "generation_id", -1),
                getattr(request, "member_id", ""),
                getattr(request, "group_instance_id", None),
                offsets,
                verify,
            )
        )
    return build(
        r.TxnOffsetCommitResponse,
        topics=_partition_errors(
            request.topics, errors, r.TxnOffsetCommitResponseTopic, r.TxnOffsetCommitResponsePartition
        ),
    )


def _verification_error(error: ErrorCode) -> ErrorCode:
    """A KIP-890 verification's answer (a produce error) as TxnOffsetCommit gives it, as Kafka's
    group coordinator maps it: a coordinator that cannot answer is retriable for the client."""
    if error in (ErrorCode.not_enough_replicas, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    if error == ErrorCode.network_exception:
        return ErrorCode.coordinator_load_in_progress  # older clients retry it without a lookup
    return error


def _fetch_group_topics(
    ctx: RequestContext,
    group_id: str,
    requested: Any,
    topic_type: Any,
    partition_type: Any,
    require_stable: bool = False,
) -> tuple[Any, ...]:
    """One group's answer: the requested partitions, or (``requested`` None) every committed one."""
    coordinator = ctx.broker.group_coordinator
    if requested is None:
        found = coordinator.fetch_offsets(group_id, None)
    else:
        found = coordinator.fetch_offsets(
            group_id, [TopicPartition(t.name, i) for t in requested for i in t.partition_indexes]
        )
    unstable = coordinator.unstable_offsets(group_id, found) if require_stable else set()
    by_topic: dict[str, list[Any]] = {}
    for tp, offset in found.items():
        if tp in unstable:
            by_topic.setdefault(tp.topic, []).append(
                build(
                    partition_type,
                    partition_index=tp.partition,
                    committed_offset=NO_OFFSET,
                    committed_leader_epoch=NO_LEADER_EPOCH,
                    metadata="",
                    error_code=ErrorCode.unstable_offset_commit,
                )
            )
            continue
        by_topic.setdefault(tp.topic, []).append(
            build(
                partition_type,
                partition_index=tp.partition,
                committed_offset=offset.offset if offset is not None else NO_OFFSET,
                committed_leader_epoch=offset.leader_epoch if offset is not None else NO_LEADER_EPOCH,
                metadata=offset.metadata if offset is not None else "",
                error_code=ErrorCode.none,
            )
        )
    return tuple(build(topic_type, name=name, partitions=tuple(parts)) for name, parts in by_topic.items())


async def handle_offset_fetch(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    if hasattr(request, "groups"):  # v8+: several groups per request
        return build(
            r.OffsetFetchResponse,
            groups=tuple(
                build(
                    r.OffsetFetchResponseGroup,
                    group_id=group.group_id,
                    topics=_fetch_group_topics(
                        ctx,
                        group.group_id,
                        group.topics,
                        r.OffsetFetchResponseTopics,
                        r.OffsetFetchResponsePartitions,
                        request.require_stable,
                    )
                    if error == ErrorCode.none
                    else (),
                    error_code=error,
                )
                for group in request.groups
                for error in (ctx.broker.group_coordinator.coordinator_error(group.group_id),)
            ),
        )
    error = ctx.broker.group_coordinator.coordinator_error(request.group_id)
    return build(
        r.OffsetFetchResponse,
        topics=_fetch_group_topics(
            ctx,
            request.group_id,
            request.topics,
            r.OffsetFetchResponseTopic,
            r.OffsetFetchResponsePartition,
            getattr(request, "require_stable", False),
        )
        if error == ErrorCode.none
        else (),
        error_code=error,
    )


async def handle_offset_delete(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    requested = [TopicPartition(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    error, results = await ctx.broker.group_coordinator.delete_offsets(request.group_id, requested)
    if error != ErrorCode.none:
        return build(r.OffsetDeleteResponse, error_code=error, topics=())
    return build(
        r.OffsetDeleteResponse,
        error_code=ErrorCode.none,
        topics=_partition_errors(
            request.topics, results, r.OffsetDeleteResponseTopic, r.OffsetDeleteResponsePartition
        ),
    )
