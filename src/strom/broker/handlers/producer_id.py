"""InitProducerId (22): producer ids and epochs for idempotent producers.

Without a transactional id, Kafka's coordinator always hands out a fresh producer id
with epoch 0, whatever producer id and epoch the request carries (KIP-360 lets an
idempotent producer send its old ones; the broker does not bump them): a client
cannot make the broker reuse an id it did not allocate to it.

A transactional id asks for transactions, which Strom does not implement yet: the
answer is a fatal error with a clear cause, never a retriable one that would make
the client wait forever.
"""

from __future__ import annotations

import logging
from typing import Any

from strom.broker.control_plane.plane import ZooKeeperUnavailableError
from strom.broker.dispatcher import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from strom.storage import KafkaStorageError

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1


async def handle_init_producer_id(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    if request.transactional_id is not None:
        return build(
            r.InitProducerIdResponse,
            error_code=ErrorCode.transactional_id_authorization_failed,
            producer_id=NO_PRODUCER_ID,
            producer_epoch=-1,
        )
    try:
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
