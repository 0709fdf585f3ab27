"""InitProducerId (22): producer ids and epochs for idempotent producers.

A transactional id asks for transactions, which Strom does not implement yet: the
answer is a fatal error with a clear cause, never a retriable one that would make
the client wait forever.
"""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build

NO_PRODUCER_ID = -1
MAX_EPOCH = 32767


async def handle_init_producer_id(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    if request.transactional_id is not None:
        return build(
            r.InitProducerIdResponse,
            error_code=ErrorCode.transactional_id_authorization_failed,
            producer_id=NO_PRODUCER_ID,
            producer_epoch=-1,
        )
    producer_id = getattr(request, "producer_id", NO_PRODUCER_ID)
    epoch = getattr(request, "producer_epoch", -1)
    if producer_id != NO_PRODUCER_ID and 0 <= epoch < MAX_EPOCH - 1:
        # KIP-360: an idempotent producer bumps its own epoch to reset its sequences.
        return build(
            r.InitProducerIdResponse,
            error_code=ErrorCode.none,
            producer_id=producer_id,
            producer_epoch=epoch + 1,
        )
    return build(
        r.InitProducerIdResponse,
        error_code=ErrorCode.none,
        producer_id=ctx.broker.producer_ids.generate(),
        producer_epoch=0,
    )
