"""A follower's disk work stays off the event loop: a new leader epoch's checkpoint (two fsyncs),
truncation (segments unlinked, the checkpoint rewritten, producer state replayed) and a full
restart of the log run on the log's serial I/O executor, never on the loop's thread."""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from strom.broker.control_plane.metadata import PartitionState
from strom.broker.partition import Partition, TopicPartition
from strom.storage import LogConfig, UnifiedLog
from unit.storage.test_storage_follower import leader_batch

TP = TopicPartition("t", 0)


async def _settle(result: Any) -> Any:
    # Awaits the step if it is a coroutine (this code), else it already ran on the caller's thread.
    return await result if inspect.isawaitable(result) else result


def test_follower_truncation_and_new_epochs_do_their_file_work_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=300))
    for base in range(0, 20, 4):
        log.append_as_follower(leader_batch(base, 4, 0))
    assert log.num_segments >= 3
    partition = Partition(TP, log, -1, [], local_id=1, replicated=True, high_watermark=0)
    partition.make_follower(PartitionState(0, 2, 1, [1, 2], [1, 2]))

    calls: list[tuple[str, int]] = []

    def recorded(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, threading.get_ident()))
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(os, "fsync", recorded("fsync", os.fsync))
    monkeypatch.setattr(os, "unlink", recorded("unlink", os.unlink))
    monkeypatch.setattr(os, "replace", recorded("replace", os.replace))

    def assert_off_loop(step: str, loop_thread: int) -> None:
        on_loop = [name for name, thread in calls if thread == loop_thread]
        assert calls, f"{step}: no file work recorded"
        assert on_loop == [], f"{step}: {len(on_loop)} of {len(calls)} fsync/unlink calls on the loop"
        calls.clear()

    async def follow() -> None:
        loop_thread = threading.get_ident()
        # The new leader's first batches, in a new epoch: appended inline, the epoch recorded in
        # memory (the log's next flush writes the checkpoint): no file work at all.
        await _settle(partition.append_records_as_follower(leader_batch(20, 2, 1)))
        assert log.leader_epoch_cache.entries == [(0, 0), (1, 20)]
        assert calls == []
        # Diverging epochs: back into the first segment (later segments unlinked).
        await _settle(partition.truncate_to(5))
        assert log.log_end_offset == 4 and log.leader_epoch_cache.entries == [(0, 0)]
        assert {name for name, _ in calls} == {"fsync", "unlink", "replace"}
        assert_off_loop("truncation", loop_thread)
        # Behind the leader's log start: the whole log restarts there.
        await _settle(partition.truncate_fully_and_start_at(100))
        assert (log.log_start_offset, log.log_end_offset, partition.high_watermark) == (100, 100, 100)
        assert_off_loop("a full truncation", loop_thread)

    asyncio.run(follow())
    log.close()
