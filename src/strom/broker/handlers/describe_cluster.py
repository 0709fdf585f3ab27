"""DescribeCluster (60): the cluster id, the controller and the live brokers."""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.broker.handlers.metadata import controller_id, live_brokers
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import AUTHORIZED_OPERATIONS_OMITTED, build

BROKERS_ENDPOINT_TYPE = 1


async def handle_describe_cluster(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    broker = ctx.broker
    endpoint_type = getattr(request, "endpoint_type", BROKERS_ENDPOINT_TYPE)
    if endpoint_type != BROKERS_ENDPOINT_TYPE:
        # Strom has no KRaft controllers to describe.
        return build(
            r.DescribeClusterResponse,
            error_code=ErrorCode.unsupported_endpoint_type,
            error_message="Strom has no controller endpoints",
            endpoint_type=endpoint_type,
            cluster_id=broker.cluster_id,
            controller_id=-1,
            brokers=(),
            cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        )
    brokers = tuple(
        build(r.DescribeClusterBroker, broker_id=node_id, host=host, port=port, rack=rack, is_fenced=False)
        for node_id, host, port, rack in live_brokers(ctx)
    )
    return build(
        r.DescribeClusterResponse,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=endpoint_type,
        cluster_id=broker.cluster_id,
        controller_id=controller_id(ctx),
        brokers=brokers,
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )
