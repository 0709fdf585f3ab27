"""Metadata (3): brokers, topics (with topic IDs) and partition leadership; auto-creates topics
(at most MAX_PARTITIONS_PER_REQUEST partitions per request, as Kafka's controller allows)."""

from __future__ import annotations

import uuid
from typing import Any

from strom.broker.control_plane.assignment import InvalidReplicationFactorError
from strom.broker.control_plane.local import InvalidTopicError, validate_topic_name
from strom.broker.control_plane.metadata import PartitionState, TopicState
from strom.broker.control_plane.plane import LeaderNotAvailableError
from strom.broker.dispatcher import RequestContext
from strom.broker.handlers.partition_view import partition_view
from strom.broker.handlers.topics import MAX_PARTITIONS_PER_REQUEST
from strom.broker.slices import ArrayBuilder, sliced
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import AUTHORIZED_OPERATIONS_OMITTED, ZERO_UUID, build
from strom.storage import StorageError


def live_brokers(ctx: RequestContext) -> list[tuple[int, str, int, str | None]]:
    """(id, host, port, rack) of every live broker: this one alone on a single node, every
    registration in ZooKeeper in a cluster."""
    plane = ctx.broker.control_plane
    brokers = []
    for broker_id, rack in sorted(plane.broker_racks().items()):
        endpoint = plane.broker_endpoint(broker_id)
        if endpoint is not None:
            brokers.append((broker_id, endpoint[0], endpoint[1], rack))
    return brokers


def controller_id(ctx: RequestContext) -> int:
    return ctx.broker.control_plane.controller_id


def broker_entities(ctx: RequestContext, entity_type: type[Any]) -> tuple[Any, ...]:
    return tuple(
        build(entity_type, node_id=node_id, host=host, port=port, rack=rack)
        for node_id, host, port, rack in live_brokers(ctx)
    )


def _partition_entity(ctx: RequestContext, topic: str, p: PartitionState) -> Any:
    view = partition_view(ctx.broker.replica_manager, ctx.broker.control_plane, topic, p)
    return build(
        ctx.response.MetadataResponsePartition,
        error_code=view.error,
        partition_index=p.partition,
        leader_id=view.leader,
        leader_epoch=p.leader_epoch,
        replica_nodes=tuple(p.replicas),
        isr_nodes=tuple(p.isr),
        offline_replicas=view.offline_replicas,
    )


def _topic_entity(ctx: RequestContext, topic: TopicState) -> Any:
    r = ctx.response
    partitions = tuple(_partition_entity(ctx, topic.name, p) for p in topic.partitions)
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


async def _within_creation_cap(ctx: RequestContext, wanted: Any) -> bool:
    """Whether the topics this request would auto-create have at most MAX_PARTITIONS_PER_REQUEST
    partitions together. Kafka's controller refuses a batch of more (auto-creation sends it one
    CreateTopics per Metadata request), so no topic of it is created; nor is one here, and each
    is answered as if auto-creation were off."""
    image = ctx.broker.control_plane.image
    missing: set[str] = set()
    async for topic in sliced(wanted):
        name = getattr(topic, "name", None)
        if name and name not in missing and image.topic(name) is None:
            try:
                validate_topic_name(name)
            except InvalidTopicError:
                continue
            missing.add(name)
    return len(missing) * ctx.broker.config.num_partitions <= MAX_PARTITIONS_PER_REQUEST


async def handle_metadata(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    image = broker.control_plane.image
    # v0 asks for all topics with an empty list; v1+ with null.
    all_topics = request.topics is None or (ctx.version == 0 and not request.topics)
    allow_auto_create = (
        getattr(request, "allow_auto_topic_creation", True) and broker.config.auto_create_topics_enable
    )
    if allow_auto_create and not all_topics:
        allow_auto_create = await _within_creation_cap(ctx, request.topics)
    # Kafka bounds the topics of one request only by its size: a request naming 400,000 topics
    # is answered a slice at a time, other clients served in between.
    r = ctx.response
    topics = ArrayBuilder(r.MetadataResponseTopic)
    if all_topics:
        async for t in sliced(image.topics()):
            await topics.add(_topic_entity(ctx, t))
    else:
        async for wanted in sliced(request.topics):
            name = getattr(wanted, "name", None)
            topic_id = getattr(wanted, "topic_id", None)
            if name is None and topic_id is not None and topic_id != ZERO_UUID:
                by_id = image.topic_by_id(topic_id)
                await topics.add(
                    _topic_entity(ctx, by_id)
                    if by_id is not None
                    else _error_topic(ctx, ErrorCode.unknown_topic_id, None, topic_id)
                )
                continue
            if name is None:
                # Neither a name nor an id. The answer's name is nullable only from v12, as the
                # request's is from v10: v10 and v11 are answered with an empty name, not a null
                # that the response cannot encode.
                unnamed = None if ctx.version >= 12 else ""
                await topics.add(_error_topic(ctx, ErrorCode.invalid_request, unnamed, None))
                continue
            topic = image.topic(name)
            if topic is None:
                try:
                    validate_topic_name(name)
                except InvalidTopicError:
                    await topics.add(_error_topic(ctx, ErrorCode.invalid_topic_exception, name, None))
                    continue
                if not allow_auto_create:
                    await topics.add(_error_topic(ctx, ErrorCode.unknown_topic_or_partition, name, None))
                    continue
                try:
                    topic = await broker.auto_create_topic(name)
                except StorageError:
                    await topics.add(_error_topic(ctx, ErrorCode.kafka_storage_error, name, None))
                    continue
                except (LeaderNotAvailableError, InvalidReplicationFactorError) as exc:
                    # In a cluster: being created, or more replicas asked than brokers are alive.
                    await topics.add(_error_topic(ctx, ErrorCode(exc.error_code), name, None))
                    continue
            await topics.add(_topic_entity(ctx, topic))
    return build(
        r.MetadataResponse,
        brokers=broker_entities(ctx, r.MetadataResponseBroker),
        cluster_id=broker.cluster_id,
        controller_id=controller_id(ctx),
        topics=topics.value(),
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        error_code=ErrorCode.none,
    )
