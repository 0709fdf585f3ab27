"""The event loop's stall while a coordinator loads a big ``__consumer_offsets`` partition.

In one process: an offsets partition of N offset-commit records (batches of --per-batch records,
as one OffsetCommit of that many partitions writes them) is built on disk; then a group
coordinator that follows leadership is told it leads the partition, as a broker is after an
election, while a ticker task on the same event loop sleeps 1 ms at a time and records how late
each wake-up is. Reported: how long until the partition's groups are served, the longest tick gap
(the worst stall a client of that broker would see) and the gaps' p99, plus an idle baseline.
Runs against whichever strom is first on PYTHONPATH, so the same script measures old and new code.

    PYTHONPATH=src .venv/bin/python bench/coordinator_load.py [--records 200000] [--per-batch 10]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
import uuid
from pathlib import Path

from strom.broker.control_plane.metadata import PartitionState, TopicState
from strom.broker.coordinator import group_metadata_manager as gmm
from strom.broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from strom.broker.coordinator.records import OffsetCommitKey, OffsetCommitValue
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager
from strom.protocol.errors import ErrorCode
from strom.records.codec import RecordSpec, encode_batch
from strom.storage import LogConfig, LogManager

OFFSETS_TP = TopicPartition("__consumer_offsets", 0)
TICK_S = 0.001


def build(folder: Path, records: int, per_batch: int) -> tuple[LogManager, gmm.GroupMetadataManager]:
    log_manager = LogManager([folder])
    log_manager.startup(lambda _: LogConfig())
    replica_manager = ReplicaManager(log_manager, lambda topic: LogConfig(cleanup_policy="compact"))
    replica_manager.lead_on_single_node(
        TopicState("__consumer_offsets", uuid.UUID(int=1), [PartitionState(0, 0, 0, [0], [0])])
    )
    partition = replica_manager.partition(OFFSETS_TP)
    assert partition is not None
    written = 0
    while written < records:
        count = min(per_batch, records - written)
        specs = [
            RecordSpec(
                gmm.encode_offset_commit_key(
                    OffsetCommitKey(f"group-{(written + i) % 1000}", "topic", (written + i) % 100)
                ),
                gmm.encode_offset_commit_value(OffsetCommitValue(written + i, -1, "", 1, -1)),
            )
            for i in range(count)
        ]
        partition.append_records_to_leader(encode_batch(specs), required_acks=1)
        written += count
    return log_manager, gmm.GroupMetadataManager(replica_manager, 1)


async def ticks(stop: asyncio.Event, gaps: list[float]) -> None:
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(TICK_S)
        now = time.monotonic()
        gaps.append(now - last - TICK_S)
        last = now


def summary(gaps: list[float]) -> str:
    ordered = sorted(gaps)
    p99 = ordered[int(len(ordered) * 0.99)] if ordered else 0.0
    return f"max stall {max(ordered, default=0) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, {len(ordered)} ticks"


async def measure(manager: gmm.GroupMetadataManager, idle_s: float) -> None:
    config = GroupConfig(1000, 60_000, 0, 100, 7 * 24 * 3600 * 1000, 4096)
    coordinator = GroupCoordinator(config, manager, lambda: None, follows_leadership=True)
    coordinator.startup()
    stop = asyncio.Event()
    idle: list[float] = []
    ticker = asyncio.ensure_future(ticks(stop, idle))
    await asyncio.sleep(idle_s)
    stop.set()
    await ticker
    stop = asyncio.Event()
    loading: list[float] = []
    ticker = asyncio.ensure_future(ticks(stop, loading))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    coordinator.on_become_leader(OFFSETS_TP, 1)
    while coordinator.coordinator_error("group-1") != ErrorCode.none:
        await asyncio.sleep(0.001)
    served = time.monotonic() - started
    stop.set()
    await ticker
    groups = len(coordinator.list_groups(set(), set()))
    print(f"idle:    {summary(idle)}")
    print(f"loading: {summary(loading)}; groups served after {served * 1000:.0f} ms ({groups} groups)")
    coordinator.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--per-batch", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=1.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sys.setswitchinterval(0.001)  # as `strom serve` sets it
    with tempfile.TemporaryDirectory() as folder:
        started = time.monotonic()
        log_manager, manager = build(Path(folder), args.records, args.per_batch)
        print(
            f"{args.records} offset-commit records in batches of {args.per_batch} written in "
            f"{time.monotonic() - started:.1f} s ({gmm.__file__})"
        )
        asyncio.run(measure(manager, args.idle_seconds))
        log_manager.shutdown()


if __name__ == "__main__":
    main()
