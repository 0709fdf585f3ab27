"""The file cache bounds open descriptors over many logs, and logs stay correct under it."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.storage import LogConfig, UnifiedLog
from strom.storage.file_cache import file_cache
from unit.storage.storage_batches import batch_offsets, make_batch

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=200)


@pytest.fixture
def tiny_cache() -> Iterator[int]:
    cache = file_cache()
    saved = cache.max_open
    cache.max_open = 24
    try:
        yield cache.max_open
    finally:
        cache.max_open = saved


def fds_under(dir: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(dir)):
                count += 1
        except OSError:
            continue
    return count


def read_all(log: UnifiedLog) -> list[tuple[int, int]]:
    offset, seen = log.log_start_offset, []
    while offset < log.log_end_offset:
        batches = batch_offsets(log.read(offset, 1 << 20).records)
        seen.extend(batches)
        offset = batches[-1][1] + 1
    return seen


def test_many_logs_append_read_flush_and_recover_under_a_tiny_cache(tmp_path: Path, tiny_cache: int) -> None:
    logs = [UnifiedLog.open(tmp_path / f"t-{p}", CONFIG) for p in range(60)]
    for round_ in range(30):
        for log in logs:
            log.append_as_leader(make_batch(count=2, value_size=40), 0)
        if round_ % 4 == 3:
            for log in logs[::3]:
                log.flush()
        assert fds_under(tmp_path) <= tiny_cache
    for log in logs:
        assert log.num_segments > 1  # rolled: old segments are read back through reopened files
        assert read_all(log) == [(o, o + 1) for o in range(0, 60, 2)]
    for log in logs:
        log.flush()
    # kill -9 after the flush: every descriptor dropped, nothing closed cleanly.
    for log in logs:
        for segment in log.segments:
            segment.close_handles()
    reopened = [UnifiedLog.open(tmp_path / f"t-{p}", CONFIG, had_clean_shutdown=False) for p in range(60)]
    for log in reopened:
        assert log.log_end_offset == 60
        assert read_all(log) == [(o, o + 1) for o in range(0, 60, 2)]
        assert fds_under(tmp_path) <= tiny_cache
    for log in reopened:
        log.close()
    assert fds_under(tmp_path) == 0


def test_descriptors_stay_under_the_cap_with_2000_logs(tmp_path: Path) -> None:
    cache = file_cache()
    saved = cache.max_open
    cache.max_open = 300
    try:
        logs = [UnifiedLog.open(tmp_path / f"t-{p}", CONFIG) for p in range(2000)]
        for log in logs:
            log.append_as_leader(make_batch(count=2, value_size=40), 0)
        assert fds_under(tmp_path) <= 300
        for log in logs:
            log.flush()
        assert fds_under(tmp_path) <= 300
        for log in logs:
            assert read_all(log) == [(0, 1)]
        for log in logs:
            log.close()
        assert fds_under(tmp_path) == 0
    finally:
        cache.max_open = saved


def test_reading_an_old_segment_reopens_its_file(tmp_path: Path, tiny_cache: int) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", CONFIG)
    for _ in range(60):
        log.append_as_leader(make_batch(count=2, value_size=40), 0)
    first = log.segments[0]
    assert not first._log_file.is_open  # rolled: closed
    assert batch_offsets(log.read(0, 100).records)[0] == (0, 1)
    assert first._log_file.is_open
    log.close()


def test_running_out_of_descriptors_closes_cached_ones_instead_of_failing(tmp_path: Path) -> None:
    cache = file_cache()
    saved_cap = cache.max_open
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    logs: list[UnifiedLog] = []
    cache.max_open = 100_000  # the cap assumes more descriptors than the process has
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 60, hard))
    try:
        for p in range(100):  # 3 files each: far more than 60 descriptors
            log = UnifiedLog.open(tmp_path / f"t-{p}", CONFIG)
            log.append_as_leader(make_batch(count=2, value_size=40), 0)
            log.flush()
            logs.append(log)
        assert all(log.log_end_offset == 2 and not log.offline for log in logs)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        cache.max_open = saved_cap
        for log in logs:
            log.close()


def test_closing_an_idle_log_writes_no_new_producer_snapshot(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, CONFIG)
    log.append_as_leader(
        make_batch(count=2, value_size=40, producer_id=7, producer_epoch=0, base_sequence=0), 0
    )
    log.close()
    (snapshot,) = dir.glob("*.snapshot")
    os.utime(snapshot, ns=(0, 0))
    reopened = UnifiedLog.open(dir, CONFIG, had_clean_shutdown=True)
    reopened.close()  # nothing appended since: the durable snapshot stays as it was
    assert snapshot.stat().st_mtime_ns == 0
    reopened = UnifiedLog.open(dir, CONFIG, had_clean_shutdown=False)
    assert reopened.producer_state.last_entry(7) is not None
    reopened.close()  # after a recovery the snapshot is written (synced) again
    assert snapshot.stat().st_mtime_ns != 0
