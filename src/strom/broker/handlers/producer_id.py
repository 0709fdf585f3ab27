"""InitProducerId (22): producer ids and epochs for idempotent and transactional producers.

Without a transactional id, Kafka's coordinator always hands out a fresh producer id
with epoch 0, whatever producer id and epoch the request carries (KIP-360 lets an
idempotent producer send its old ones; the broker does not bump them): a client
cannot make the broker reuse an id it did not allocate to it.

With one, the transaction coordinator answers: the id's producer id with its next epoch,
fencing older producers of the id (PRODUCER_FENCED is INVALID_PRODUCER_EPOCH before v4).
"""

from __future__ import annotations

import logging
from typing import Any

from strom.broker.control_plane.plane import ZooKeeperUnavailableError
from strom.broker.dispatcher import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build, to_ms
from strom.storage import KafkaStorageError

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
# KIP-588: the first version whose clients know PRODUCER_FENCED.
PRODUCER_FENCED_SINCE_VERSION = 4


async def handle_init_producer_id(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    try:
        if request.transactional_id is not None:
            return await _init_transactional(ctx, request)
        producer_id = await ctx.broker.producer_ids.generate()
    except (KafkaStorageError, ZooKeeperUnavailableError) as exc:
        # No new block of ids could be made durable (a full disk, ZooKeeper unreachable): Kafka answers
        # a retriable COORDINATOR_LOAD_IN_PROGRESS while its producer id manager has no block, and so do we.
        log.error("cannot allocate producer ids", extra={"error": str(exc)})
        return build(
            r.InitProducerIdResponse,
            error_code=ErrorCode.coordinator_load_in_progress,
            producer_id=NO_PRODUCER_ID,
            producer_epoch=-1,
        )
    return build(
        r.InitProducerIdResponse, error_code=ErrorCode.none, producer_id=producer_id, producer_epoch=0
    )


async def _init_transactional(ctx: RequestContext, request: Any) -> Any:
    producer_id = getattr(request, "producer_id", NO_PRODUCER_ID)
    producer_epoch = getattr(request, "producer_epoch", -1)
    expected = (producer_id, producer_epoch) if producer_id != NO_PRODUCER_ID else None
    result = await ctx.broker.transaction_coordinator.init_producer_id(
        request.transactional_id, to_ms(request.transaction_timeout), expected
    )
    error = result.error
    if error == ErrorCode.producer_fenced and ctx.version < PRODUCER_FENCED_SINCE_VERSION:
        error = ErrorCode.invalid_producer_epoch
    return build(
        ctx.response.InitProducerIdResponse,
        error_code=error,
        producer_id=result.producer_id,
        producer_epoch=result.producer_epoch,
    )
