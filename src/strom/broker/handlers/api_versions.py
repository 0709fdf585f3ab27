"""ApiVersions (18): the table of APIs and versions this broker speaks."""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.protocol.apis import SUPPORTED_VERSIONS
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build


async def handle_api_versions(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    keys = tuple(
        build(r.ApiVersion, api_key=key, min_version=versions.min, max_version=versions.max)
        for key, versions in sorted(SUPPORTED_VERSIONS.items())
    )
    # No feature flags: Strom is not a KRaft cluster, and the tagged fields stay at their
    # defaults so that they are not written at all (librdkafka < 2.2 mis-skips them).
    return build(r.ApiVersionsResponse, error_code=ErrorCode.none, api_keys=keys)
