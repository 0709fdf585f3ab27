"""ListOffsets (2): earliest, latest, max-timestamp and by-timestamp offset lookups."""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.broker.handlers.partition_view import unhosted_partition_error
from strom.broker.partition import TopicPartition
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
READ_COMMITTED = 1
CONSUMER_REPLICA_ID = -1
DEBUGGING_REPLICA_ID = -2


async def handle_list_offsets(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    replica_manager = ctx.broker.replica_manager
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    # A follower (replica_id >= 0) asks for the leader's LEO as "latest" (Kafka: no isolation);
    # -2 (debugging) may read a follower; consumers (-1) only the leader.
    replica_id = getattr(request, "replica_id", -1)
    topics = []
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            error, timestamp, offset, epoch = ErrorCode.none, -1, -1, -1
            tp = TopicPartition(topic.name, p.partition_index)
            partition = replica_manager.partition(tp)
            current_epoch = getattr(p, "current_leader_epoch", -1)
            if partition is None or replica_manager.is_offline(tp):
                error = unhosted_partition_error(replica_manager, ctx.broker.control_plane.image, tp)
            elif (epoch_error := partition.leader_epoch_error(current_epoch)) is not None:
                error = epoch_error
            elif not partition.is_leader and replica_id != DEBUGGING_REPLICA_ID:
                error = ErrorCode.not_leader_or_follower
            elif (
                p.timestamp == LATEST_TIMESTAMP
                and replica_id == CONSUMER_REPLICA_ID
                and partition.high_watermark_lags_epoch_start
            ):
                # As Kafka: right after an election the new leader's HW may be below the old
                # leader's, and a "latest" from it would move a consumer's end offsets back (a
                # stream source takes that for data loss). Retriable: the HW passes the epoch's
                # start once the ISR's followers have fetched.
                error = ErrorCode.offset_not_available
            elif p.timestamp == LATEST_TIMESTAMP:
                if replica_id >= 0:
                    offset = partition.log_end_offset
                else:
                    offset = partition.last_stable_offset if read_committed else partition.high_watermark
                latest = partition.log.leader_epoch_cache.latest_epoch
                epoch = partition.leader_epoch if latest is None else latest
            elif p.timestamp == LATEST_TIERED_TIMESTAMP:
                # No tiered storage: nothing has been tiered.
                pass
            else:
                lookup = EARLIEST_TIMESTAMP if p.timestamp == EARLIEST_LOCAL_TIMESTAMP else p.timestamp
                found = partition.fetch_offset_for_timestamp(lookup)
                if found is not None:
                    timestamp, offset = found.timestamp, found.offset
                    epoch = found.leader_epoch if found.leader_epoch is not None else -1
            partitions.append(
                build(
                    r.ListOffsetsPartitionResponse,
                    partition_index=p.partition_index,
                    error_code=error,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=epoch,
                )
            )
        topics.append(build(r.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(partitions)))
    return build(r.ListOffsetsResponse, topics=tuple(topics))
