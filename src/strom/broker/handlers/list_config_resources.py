"""ListConfigResources (74; KIP-1142, formerly KIP-714's ListClientMetricsResources).

v0 lists client-metrics subscriptions only. v1 lists the types the request names, or every type
Kafka 4.1 supports when it names none: groups with a config, client-metrics subscriptions, broker
loggers and brokers (one per live broker), and topics, in that order. A type outside those five
fails the whole request with UNSUPPORTED_VERSION, as Kafka does. Strom keeps no group configs
and no client-metrics subscriptions, so those two types list nothing.
"""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build

TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
# Kafka's order of the response's rows, whatever the request's order.
SUPPORTED_TYPES = (GROUP, CLIENT_METRICS, BROKER_LOGGER, BROKER, TOPIC)


def live_broker_ids(ctx: RequestContext) -> list[int]:
    """The brokers a client can address: the registered ones in a cluster, else this node."""
    return list(ctx.broker.control_plane.live_broker_ids)


def _names(ctx: RequestContext, resource_type: int) -> list[str]:
    if resource_type in (BROKER, BROKER_LOGGER):
        return [str(b) for b in sorted(live_broker_ids(ctx))]
    if resource_type == TOPIC:
        return sorted(t.name for t in ctx.broker.control_plane.image.topics())
    return []  # GROUP, CLIENT_METRICS: none stored


async def handle_list_config_resources(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    if ctx.version == 0:
        wanted: set[int] = {CLIENT_METRICS}
    else:
        wanted = set(request.resource_types) or set(SUPPORTED_TYPES)
        if not wanted <= set(SUPPORTED_TYPES):
            return build(
                r.ListConfigResourcesResponse, error_code=ErrorCode.unsupported_version, config_resources=()
            )
    resources = tuple(
        build(r.ConfigResource, resource_name=name, resource_type=resource_type)
        for resource_type in SUPPORTED_TYPES
        if resource_type in wanted
        for name in _names(ctx, resource_type)
    )
    return build(r.ListConfigResourcesResponse, error_code=ErrorCode.none, config_resources=resources)
