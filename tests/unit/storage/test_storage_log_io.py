"""The log's serial I/O executor: file-mutating steps run in order, one at a time, off the
caller's thread, and the loop's own segment-list mutations skip a log while it is busy."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from strom.storage import LogConfig, UnifiedLog
from strom.storage.log_io import SerialExecutor
from unit.storage.test_storage_follower import leader_batch


def test_the_serial_executor_runs_calls_in_order_one_at_a_time_off_the_caller() -> None:
    executor = SerialExecutor()
    caller = threading.get_ident()
    running = 0
    overlaps: list[int] = []
    order: list[int] = []
    threads: set[int] = set()

    def step(i: int) -> int:
        nonlocal running
        running += 1
        overlaps.append(running)
        threads.add(threading.get_ident())
        time.sleep(0.001)
        order.append(i)
        running -= 1
        return i * 2

    futures = [executor.submit(step, i) for i in range(50)]
    assert executor.busy
    assert [f.result(timeout=30) for f in futures] == [i * 2 for i in range(50)]
    assert order == list(range(50)) and max(overlaps) == 1
    assert caller not in threads
    deadline = time.monotonic() + 30
    while executor.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not executor.busy


def test_retention_and_the_cleaners_swap_skip_a_log_whose_executor_is_busy(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=200, retention_ms=0))
    for base in range(0, 12, 2):
        log.append_as_follower(leader_batch(base, 2, 0))
    assert log.num_segments > 2
    gate = threading.Event()
    blocked = log.io.submit(gate.wait, 30)
    try:
        # A truncation may be running on the executor: the loop leaves the segment list alone.
        assert log.delete_retention_segments(now_ms=10**13) == 0
        old = log.segments[:1]
        assert log.replace_segments(old, [s.size for s in old]) is None
    finally:
        gate.set()
    assert blocked.result(timeout=30)
    deadline = time.monotonic() + 30
    while log.io.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.delete_retention_segments(now_ms=10**13) > 0
    log.close()
