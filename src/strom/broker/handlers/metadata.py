"""Metadata (3): brokers, topics (with topic IDs) and partition leadership; auto-creates topics."""

from __future__ import annotations

import uuid
from typing import Any

from strom.broker.cluster.local import InvalidTopicError, validate_topic_name
from strom.broker.cluster.metadata import TopicState
from strom.broker.dispatcher import RequestContext
from strom.broker.partition import TopicPartition
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import AUTHORIZED_OPERATIONS_OMITTED, ZERO_UUID, build
from strom.storage import StorageError


def broker_entities(ctx: RequestContext, entity_type: type[Any]) -> tuple[Any, ...]:
    host, port = ctx.broker.advertised_endpoint()
    return (build(entity_type, node_id=ctx.broker.node_id, host=host, port=port, rack=None),)


def _topic_entity(ctx: RequestContext, topic: TopicState) -> Any:
    r = ctx.response
    replica_manager = ctx.broker.replica_manager
    partitions = tuple(
        # A partition on a failed log dir has no leader, as Kafka's controller reports it once the
        # broker's only replica is offline: LEADER_NOT_AVAILABLE, this node among the offline replicas.
        build(
            r.MetadataResponsePartition,
            error_code=ErrorCode.leader_not_available if offline else ErrorCode.none,
            partition_index=p.partition,
            leader_id=-1 if offline else p.leader,
            leader_epoch=p.leader_epoch,
            replica_nodes=tuple(p.replicas),
            isr_nodes=tuple(p.isr),
            offline_replicas=tuple(p.replicas) if offline else (),
        )
        for p in topic.partitions
        for offline in (replica_manager.is_offline(TopicPartition(topic.name, p.partition)),)
    )
    return build(
        r.MetadataResponseTopic,
        error_code=ErrorCode.none,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.internal,
        partitions=partitions,
        topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


def _error_topic(ctx: RequestContext, error: ErrorCode, name: str | None, topic_id: uuid.UUID | None) -> Any:
    return build(
        ctx.response.MetadataResponseTopic,
        error_code=error,
        name=name,
        topic_id=topic_id or ZERO_UUID,
        is_internal=False,
        partitions=(),
        topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


async def handle_metadata(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    image = broker.control_plane.image
    # v0 asks for all topics with an empty list; v1+ with null.
    all_topics = request.topics is None or (ctx.version == 0 and not request.topics)
    allow_auto_create = (
        getattr(request, "allow_auto_topic_creation", True) and broker.config.auto_create_topics_enable
    )
    topics: list[Any] = []
    if all_topics:
        topics = [_topic_entity(ctx, t) for t in image.topics()]
    else:
        for wanted in request.topics:
            name = getattr(wanted, "name", None)
            topic_id = getattr(wanted, "topic_id", None)
            if name is None and topic_id is not None and topic_id != ZERO_UUID:
                by_id = image.topic_by_id(topic_id)
                topics.append(
                    _topic_entity(ctx, by_id)
                    if by_id is not None
                    else _error_topic(ctx, ErrorCode.unknown_topic_id, None, topic_id)
                )
                continue
            if name is None:
                topics.append(_error_topic(ctx, ErrorCode.invalid_request, None, None))
                continue
            topic = image.topic(name)
            if topic is None:
                try:
                    validate_topic_name(name)
                except InvalidTopicError:
                    topics.append(_error_topic(ctx, ErrorCode.invalid_topic_exception, name, None))
                    continue
                if not allow_auto_create:
                    topics.append(_error_topic(ctx, ErrorCode.unknown_topic_or_partition, name, None))
                    continue
                try:
                    topic = await broker.auto_create_topic(name)
                except StorageError:
                    topics.append(_error_topic(ctx, ErrorCode.kafka_storage_error, name, None))
                    continue
            topics.append(_topic_entity(ctx, topic))
    r = ctx.response
    return build(
        r.MetadataResponse,
        brokers=broker_entities(ctx, r.MetadataResponseBroker),
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        topics=tuple(topics),
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        error_code=ErrorCode.none,
    )
