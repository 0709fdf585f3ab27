"""FindCoordinator (10): which broker coordinates a consumer group or a transactional id.

On a single node that is always this broker. In a cluster it is the broker leading the key's
partition of ``__consumer_offsets`` (a group) or ``__transaction_state`` (a transactional id);
COORDINATOR_NOT_AVAILABLE while that partition has no live leader. The first lookup creates the
topic (as Kafka creates it on first use), so a coordinator can write its state as soon as a
client knows where to send it.
"""

from __future__ import annotations

from typing import Any

from strom.broker.control_plane.plane import CoordinatorUnavailableError
from strom.broker.coordinator.group_metadata_manager import OFFSETS_TOPIC, partition_for
from strom.broker.dispatcher import RequestContext
from strom.broker.transaction.state_manager import TRANSACTION_STATE_TOPIC
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from strom.storage import StorageError

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1

Lookup = tuple[ErrorCode, str | None, int, str, int]


def _not_available(message: str | None) -> Lookup:
    return ErrorCode.coordinator_not_available, message, -1, "", -1


def _coordinator(ctx: RequestContext, topic_name: str, key: str) -> Lookup:
    broker = ctx.broker
    plane = broker.control_plane
    if not plane.replicated:
        host, port = broker.advertised_endpoint()
        return ErrorCode.none, None, broker.node_id, host, port
    topic = plane.image.topic(topic_name)
    if topic is None or not topic.partitions:
        return _not_available("The coordinator is not available.")
    leader = topic.partitions[partition_for(key, len(topic.partitions))].leader
    endpoint = plane.broker_endpoint(leader) if leader >= 0 else None
    if endpoint is None:
        return _not_available("The coordinator is not available.")
    return ErrorCode.none, None, leader, endpoint[0], endpoint[1]


async def _lookup(ctx: RequestContext, key_type: int, keys: list[str]) -> list[Lookup]:
    if key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):
        return [
            (ErrorCode.invalid_request, f"Unsupported coordinator key type {key_type}", -1, "", -1)
            for _ in keys
        ]
    transactional = key_type == TRANSACTION_KEY_TYPE
    # The coordinator's topic is created on first use; its creation runs off the event loop.
    try:
        if transactional:
            await ctx.broker.ensure_transaction_topic()
        else:
            await ctx.broker.ensure_offsets_topic()
    except (StorageError, CoordinatorUnavailableError) as exc:
        return [_not_available(str(exc)) for _ in keys]
    if transactional:
        return [
            (ErrorCode.invalid_request, "The transactional id is empty", -1, "", -1)
            if not key
            else _coordinator(ctx, TRANSACTION_STATE_TOPIC, key)
            for key in keys
        ]
    return [_coordinator(ctx, OFFSETS_TOPIC, key) for key in keys]


async def handle_find_coordinator(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    key_type = getattr(request, "key_type", GROUP_KEY_TYPE)
    if hasattr(request, "coordinator_keys"):  # v4+: batched lookups
        keys = list(request.coordinator_keys)
        coordinators = tuple(
            build(
                r.Coordinator,
                key=key,
                node_id=node_id,
                host=host,
                port=port,
                error_code=error,
                error_message=message,
            )
            for key, (error, message, node_id, host, port) in zip(
                keys, await _lookup(ctx, key_type, keys), strict=True
            )
        )
        return build(r.FindCoordinatorResponse, coordinators=coordinators)
    ((error, message, node_id, host, port),) = await _lookup(ctx, key_type, [request.key])
    return build(
        r.FindCoordinatorResponse,
        error_code=error,
        error_message=message,
        node_id=node_id,
        host=host,
        port=port,
    )
