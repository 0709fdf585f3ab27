"""OffsetForLeaderEpoch (23): the end offset of a leader epoch, for log truncation after leader changes."""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.broker.handlers.partition_view import unhosted_partition_error
from strom.broker.partition import TopicPartition
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build

DEBUGGING_REPLICA_ID = -2


async def handle_offset_for_leader_epoch(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    replica_id = getattr(request, "replica_id", DEBUGGING_REPLICA_ID)
    topics = []
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            error, epoch, end_offset = ErrorCode.none, -1, -1
            tp = TopicPartition(topic.topic, p.partition)
            partition = ctx.broker.replica_manager.partition(tp)
            current = p.current_leader_epoch
            if partition is None or ctx.broker.replica_manager.is_offline(tp):
                error = unhosted_partition_error(ctx.broker.replica_manager, ctx.broker.control_plane.image, tp)
            elif (epoch_error := partition.leader_epoch_error(current)) is not None:
                error = epoch_error
            elif not partition.is_leader and replica_id != DEBUGGING_REPLICA_ID:
                # Consumers and followers (replica_id >= 0) ask the leader only; before v3 the
                # request names no replica and counts as debugging, as in Kafka.
                error = ErrorCode.not_leader_or_follower
            else:
                epoch, end_offset = partition.log.leader_epoch_cache.end_offset_for(p.leader_epoch)
                if epoch == partition.leader_epoch:
                    # The current epoch ends where the log does; consumers may only see up to the HW.
                    end_offset = partition.log_end_offset
            partitions.append(
                build(
                    r.EpochEndOffset,
                    error_code=error,
                    partition=p.partition,
                    leader_epoch=epoch,
                    end_offset=end_offset,
                )
            )
        topics.append(build(r.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(partitions)))
    return build(r.OffsetForLeaderEpochResponse, topics=tuple(topics))
