"""DescribeLogDirs (35): each log dir with its error (KAFKA_STORAGE_ERROR when offline), its
partitions and their sizes, and (v4+) the volume's total and usable bytes. A partition being moved
here by AlterReplicaLogDirs shows its copy with is_future_key set."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build


async def handle_describe_log_dirs(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    broker = ctx.broker
    log_manager = broker.log_manager
    channel = log_manager.log_dir_failure_channel
    # A null topics array asks for every partition; otherwise only the named ones.
    wanted: set[tuple[str, int]] | None = None
    if request.topics is not None:
        wanted = {(t.topic, int(p)) for t in request.topics for p in t.partitions}
    results = []
    for log_dir in log_manager.log_dirs:
        path = os.path.abspath(log_dir)
        if channel.is_offline(log_dir):
            results.append(
                build(
                    r.DescribeLogDirsResult, error_code=ErrorCode.kafka_storage_error, log_dir=path, topics=()
                )
            )
            continue
        by_topic: dict[str, list[Any]] = defaultdict(list)
        for log_ in log_manager.all_logs():
            if log_.log_dir != log_dir or (wanted is not None and (log_.topic, log_.partition) not in wanted):
                continue
            partition = broker.replica_manager.partition_of(log_.topic, log_.partition)
            high_watermark = partition.high_watermark if partition is not None else log_.log_end_offset
            by_topic[log_.topic].append(
                build(
                    r.DescribeLogDirsPartition,
                    partition_index=log_.partition,
                    partition_size=log_.size_in_bytes,
                    offset_lag=max(0, log_.log_end_offset - high_watermark),
                    is_future_key=False,
                )
            )
        for (topic, index), future in log_manager.future_logs.items():
            # A move in progress to this dir: its copy, as Kafka's future replica.
            if future.target_dir == log_dir and (wanted is None or (topic, index) in wanted):
                by_topic[topic].append(
                    build(
                        r.DescribeLogDirsPartition,
                        partition_index=index,
                        partition_size=future.size_in_bytes,
                        offset_lag=future.offset_lag(),
                        is_future_key=True,
                    )
                )
        topics = tuple(
            build(
                r.DescribeLogDirsTopic,
                name=name,
                partitions=tuple(sorted(ps, key=lambda p: p.partition_index)),
            )
            for name, ps in sorted(by_topic.items())
        )
        try:
            volume = os.statvfs(log_dir)
            total, usable = volume.f_blocks * volume.f_frsize, volume.f_bavail * volume.f_frsize
        except OSError:
            total = usable = -1
        results.append(
            build(
                r.DescribeLogDirsResult,
                error_code=ErrorCode.none,
                log_dir=path,
                topics=topics,
                total_bytes=total,
                usable_bytes=usable,
            )
        )
    return build(r.DescribeLogDirsResponse, error_code=ErrorCode.none, results=tuple(results))
