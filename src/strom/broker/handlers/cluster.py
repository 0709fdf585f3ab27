"""DescribeCluster (60): the cluster id, controller and brokers (one, here)."""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
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
    host, port = broker.advertised_endpoint()
    brokers = (
        build(
            r.DescribeClusterBroker,
            broker_id=broker.node_id,
            host=host,
            port=port,
            rack=None,
            is_fenced=False,
        ),
    )
    return build(
        r.DescribeClusterResponse,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=endpoint_type,
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        brokers=brokers,
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )
