"""FindCoordinator (10): which broker coordinates a consumer group.

On a single node that is always this broker. The first lookup creates
``__consumer_offsets`` (as Kafka creates it on first use), so a group can write
its state as soon as a client knows where to send it. Transactions do not exist
yet: a transactional key gets a fatal error with a clear message, never a
retriable one.
"""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from strom.storage import StorageError

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1


def _lookup(ctx: RequestContext, key_type: int) -> tuple[ErrorCode, str | None, int, str, int]:
    if key_type == TRANSACTION_KEY_TYPE:
        return (
            ErrorCode.transactional_id_authorization_failed,
            "Strom does not support transactions yet",
            -1,
            "",
            -1,
        )
    if key_type != GROUP_KEY_TYPE:
        return ErrorCode.invalid_request, f"Unsupported coordinator key type {key_type}", -1, "", -1
    host, port = ctx.broker.advertised_endpoint()
    return ErrorCode.none, None, ctx.broker.node_id, host, port


async def handle_find_coordinator(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    key_type = getattr(request, "key_type", GROUP_KEY_TYPE)
    error, message, node_id, host, port = _lookup(ctx, key_type)
    if key_type == GROUP_KEY_TYPE:
        # The coordinator's topic is created on first use; its creation runs off the event loop.
        try:
            await ctx.broker.ensure_offsets_topic()
        except StorageError as exc:
            error, message, node_id, host, port = ErrorCode.coordinator_not_available, str(exc), -1, "", -1
    if hasattr(request, "coordinator_keys"):  # v4+: batched lookups
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
            for key in request.coordinator_keys
        )
        return build(r.FindCoordinatorResponse, coordinators=coordinators)
    return build(
        r.FindCoordinatorResponse,
        error_code=error,
        error_message=message,
        node_id=node_id,
        host=host,
        port=port,
    )
