"""FindCoordinator (10): which broker coordinates a consumer group.

Strom does not coordinate groups yet (no JoinGroup, OffsetCommit or OffsetFetch), yet it
serves FindCoordinator because clients probe it as a capability: librdkafka enables LZ4 only
on brokers that list it. Naming a coordinator whose APIs are missing would make clients call
them anyway (librdkafka 2.0 crashes on the missing OffsetFetch), so a group lookup answers
COORDINATOR_NOT_AVAILABLE, which clients retry quietly. A transactional key gets a fatal error
with a clear message, never a retriable one.
"""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build

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
    return ErrorCode.coordinator_not_available, "Strom does not coordinate consumer groups yet", -1, "", -1


async def handle_find_coordinator(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    key_type = getattr(request, "key_type", GROUP_KEY_TYPE)
    error, message, node_id, host, port = _lookup(ctx, key_type)
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
