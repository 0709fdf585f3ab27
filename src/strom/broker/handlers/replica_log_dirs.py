"""AlterReplicaLogDirs (34): move a partition's log to another log dir of this broker.

As Kafka's ReplicaManager.alterReplicaLogDirs: a dir that is not one of the broker's log.dirs is
LOG_DIR_NOT_FOUND, an offline dir or partition KAFKA_STORAGE_ERROR, a partition without a log here
REPLICA_NOT_AVAILABLE; naming the dir the log is in already is a no-op (and cancels a move to
another dir), naming another dir than a move in progress restarts it there.

The move (``strom.storage.future_log``): worker-thread rounds copy the log's files into a
``-future`` directory while the partition keeps serving, until a round finds little new; the last
round runs on the event loop, where no append can happen meanwhile (appends run there): the log
is closed, the tail and the mutable files are copied, the directories switched and the copy
opened and served in the current log's place. DescribeLogDirs shows the copy (is_future_key)
until then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strom.broker.dispatcher import RequestContext
from strom.broker.partition import TopicPartition
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import ZERO_THROTTLE, build
from strom.storage import StorageError
from strom.storage.future_log import FutureLog

if TYPE_CHECKING:
    from strom.broker.broker import Broker

log = logging.getLogger(__name__)

# A round that copies less than this is followed by the last one, on the event loop.
LAST_ROUND_BYTES = 4 << 20
MAX_ROUNDS = 20


def _alter(broker: Broker, tp: TopicPartition, path: str) -> ErrorCode:
    log_manager = broker.log_manager
    target = next((d for d in log_manager.log_dirs if os.path.abspath(d) == os.path.abspath(path)), None)
    if target is None:
        return ErrorCode.log_dir_not_found
    if log_manager.log_dir_failure_channel.is_offline(target) or broker.replica_manager.is_offline(tp):
        return ErrorCode.kafka_storage_error
    current = log_manager.get_log(tp.topic, tp.partition)
    if current is None:
        return ErrorCode.replica_not_available
    key = (tp.topic, tp.partition)
    moving = log_manager.future_logs.get(key)
    if moving is not None:
        if moving.target_dir == target:
            return ErrorCode.none
        moving.cancelled = True
        del log_manager.future_logs[key]
    if current.log_dir == target:
        return ErrorCode.none
    future = log_manager.future_logs[key] = FutureLog(current, target)
    future.task = asyncio.get_running_loop().create_task(_move(broker, key, future))
    return ErrorCode.none


def _still_wanted(broker: Broker, key: tuple[str, int], future: FutureLog) -> bool:
    """The move was not cancelled and its log is still the partition's (not deleted, not moved)."""
    return (
        not future.cancelled
        and broker.log_manager.future_logs.get(key) is future
        and broker.log_manager.get_log(*key) is future.source
        and not future.source.closed
        and not future.source.offline
    )


async def _move(broker: Broker, key: tuple[str, int], future: FutureLog) -> None:
    loop = asyncio.get_running_loop()
    log_manager = broker.log_manager
    try:
        for _ in range(MAX_ROUNDS):
            if not _still_wanted(broker, key, future):
                break
            if await loop.run_in_executor(None, future.copy_round) < LAST_ROUND_BYTES:
                break
        if _still_wanted(broker, key, future):
            _complete(broker, key, future)
    except (OSError, StorageError) as e:
        log.error(
            "moving a log to another log dir failed", extra={"log": future.source.dir.name, "error": str(e)}
        )
    finally:
        if log_manager.future_logs.get(key) is future:
            del log_manager.future_logs[key]
        retired = future.retired
        if retired is None:
            await loop.run_in_executor(None, future.discard)
        else:
            await loop.run_in_executor(None, lambda: shutil.rmtree(retired, ignore_errors=True))


def _complete(broker: Broker, key: tuple[str, int], future: FutureLog) -> None:
    """The last round, synchronous on the event loop: no request touches the log meanwhile."""
    old = future.source
    old.close()
    try:
        new_dir: Path = future.complete()
    except OSError:
        if future.retired is not None:
            raise  # the copy holds the partition's name now: a restart finishes the move
        # Nothing was switched: serve the current log again.
        broker.log_manager.replace_log(old, old.dir)
        _serve(broker, key, broker.log_manager.get_log(*key))
        raise
    _serve(broker, key, broker.log_manager.replace_log(old, new_dir))


def _serve(broker: Broker, key: tuple[str, int], new: Any) -> None:
    partition = broker.replica_manager.partition_of(*key)
    if partition is not None and new is not None:
        partition.log = new


async def handle_alter_replica_log_dirs(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    results: dict[str, dict[int, ErrorCode]] = {}
    for d in request.dirs:
        for t in d.topics:
            for p in t.partitions:
                results.setdefault(t.name, {})[int(p)] = _alter(
                    ctx.broker, TopicPartition(t.name, int(p)), d.path
                )
    return build(
        r.AlterReplicaLogDirsResponse,
        throttle_time=ZERO_THROTTLE,
        results=tuple(
            build(
                r.AlterReplicaLogDirTopicResult,
                topic_name=name,
                partitions=tuple(
                    build(r.AlterReplicaLogDirPartitionResult, partition_index=p, error_code=code)
                    for p, code in sorted(partitions.items())
                ),
            )
            for name, partitions in results.items()
        ),
    )
