from __future__ import annotations

import threading
from pathlib import Path

from strom.records.batch import CompressionType, read_header
from strom.storage import LeaderEpochFileCache, LogConfig, TimestampAndOffset, UnifiedLog
from unit.storage.storage_batches import batch_offsets, make_batch


def test_leader_epoch_cache_assign_and_end_offsets(tmp_path: Path) -> None:
    leo = 100
    cache = LeaderEpochFileCache(tmp_path, lambda: leo)
    cache.assign(1, 0)
    cache.assign(1, 5)  # same epoch, later offset: ignored
    cache.assign(3, 10)
    cache.assign(5, 20)
    assert cache.entries == [(1, 0), (3, 10), (5, 20)]
    assert cache.end_offset_for(5) == (5, 100)  # the latest epoch ends at the log end
    assert cache.end_offset_for(3) == (3, 20)
    assert cache.end_offset_for(4) == (3, 20)  # unknown epoch between: previous epoch, next start
    assert cache.end_offset_for(0) == (0, 0)  # older than anything known
    assert cache.end_offset_for(6) == (-1, -1)
    assert cache.end_offset_for(-1) == (-1, -1)
    assert [cache.epoch_for_offset(o) for o in (0, 9, 10, 25)] == [1, 1, 3, 5]
    # Persisted in Kafka's checkpoint format.
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n3\n1 0\n3 10\n5 20\n"
    reloaded = LeaderEpochFileCache(tmp_path, lambda: leo)
    assert reloaded.entries == cache.entries
    # A lower epoch or start offset replaces the entries it contradicts.
    reloaded.assign(4, 15)
    assert reloaded.entries == [(1, 0), (3, 10), (4, 15)]
    reloaded.truncate_from_start(12)
    assert reloaded.entries == [(3, 12), (4, 15)]
    reloaded.truncate_from_end(15)
    assert reloaded.entries == [(3, 12)]


def test_log_records_epochs_and_survives_reopen(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, LogConfig())
    log.append_as_leader(make_batch(count=3), 0)
    log.append_as_leader(make_batch(count=2), 2)
    log.append_as_leader(make_batch(count=2), 2)
    assert log.leader_epoch_cache.entries == [(0, 0), (2, 3)]
    assert log.end_offset_for_epoch(0) == (0, 3)
    assert log.end_offset_for_epoch(2) == (2, 7)
    log.close()
    reopened = UnifiedLog.open(dir, LogConfig())
    assert reopened.leader_epoch_cache.entries == [(0, 0), (2, 3)]
    assert reopened.leader_epoch_cache.latest_epoch == 2


def test_epochs_beyond_a_recovered_tail_are_dropped(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, LogConfig())
    log.append_as_leader(make_batch(count=2), 1)
    log.append_as_leader(make_batch(count=2), 2)
    log.close()
    segment = dir / "00000000000000000000.log"
    size = segment.stat().st_size
    with open(segment, "r+b") as f:
        f.truncate(size - 5)
    reopened = UnifiedLog.open(dir, LogConfig())
    assert reopened.log_end_offset == 2
    assert reopened.leader_epoch_cache.entries == [(1, 0)]


def test_fetch_offset_by_timestamp(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=500, index_interval_bytes=100))
    base = 1_700_000_000_000
    for i in range(20):
        # Within a batch, timestamps are not ordered: the max is the middle record.
        log.append_as_leader(
            make_batch(count=3, timestamps=[base + i * 10, base + i * 10 + 5, base + i * 10 + 2]), 7
        )
    assert log.num_segments > 2
    assert log.fetch_offset_by_timestamp(base) == TimestampAndOffset(base, 0, 7)
    # The first record whose timestamp is >= target, found inside its batch.
    assert log.fetch_offset_by_timestamp(base + 53) == TimestampAndOffset(base + 55, 16, 7)
    assert log.fetch_offset_by_timestamp(base + 56) == TimestampAndOffset(base + 60, 18, 7)
    assert log.fetch_offset_by_timestamp(base + 1000) is None
    assert log.fetch_offset_by_timestamp(-2) == TimestampAndOffset(-1, 0, 7)
    assert log.fetch_offset_by_timestamp(-4) == TimestampAndOffset(-1, 0, 7)
    assert log.fetch_offset_by_timestamp(-1) == TimestampAndOffset(-1, 60, 7)
    # Max timestamp: the record holding it, not the batch's last offset (Kafka 3.8+).
    assert log.fetch_offset_by_timestamp(-3) == TimestampAndOffset(base + 195, 58, 7)
    log.delete_records(31)
    assert log.fetch_offset_by_timestamp(base) == TimestampAndOffset(base + 105, 31, 7)


def test_fetch_offset_by_timestamp_after_reopen(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, LogConfig(segment_bytes=500, index_interval_bytes=100))
    base = 1_700_000_000_000
    for i in range(20):
        log.append_as_leader(make_batch(count=2, timestamps=[base + i * 10, base + i * 10 + 1]), 1)
    log.close()
    reopened = UnifiedLog.open(
        dir, LogConfig(segment_bytes=500, index_interval_bytes=100), had_clean_shutdown=True
    )
    assert reopened.fetch_offset_by_timestamp(base + 101) == TimestampAndOffset(base + 101, 21, 1)
    assert reopened.fetch_offset_by_timestamp(-3) == TimestampAndOffset(base + 191, 39, 1)


def test_log_append_time_timestamp_lookup(tmp_path: Path) -> None:
    now = [0]
    log = UnifiedLog.open(
        tmp_path / "t-0", LogConfig(message_timestamp_type="LogAppendTime"), time_ms=lambda: now[0]
    )
    for t in (6000, 7000, 8000):
        now[0] = t
        log.append_as_leader(make_batch(count=2, timestamps=[1]), 0)
    # Every record of a LogAppendTime batch carries the batch's append time.
    assert log.fetch_offset_by_timestamp(6500) == TimestampAndOffset(7000, 2, 0)
    assert log.fetch_offset_by_timestamp(-3) == TimestampAndOffset(8000, 4, 0)


def test_flush_from_another_thread_while_appending(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=20_000))
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        while not stop.is_set():
            try:
                log.flush()
            except BaseException as e:
                errors.append(e)
                return

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        batch = make_batch(count=5, value_size=100)
        for _ in range(400):
            log.append_as_leader(batch, 0)
            assert log.recovery_point <= log.log_end_offset
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert log.num_segments > 5
    log.flush()
    assert log.recovery_point == log.log_end_offset == 2000
    log.close()


def test_flush_policy(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(flush_messages=5))
    log.append_as_leader(make_batch(count=3), 0)
    assert not log.flush_messages_due
    log.append_as_leader(make_batch(count=3), 0)
    # The broker flushes off the event loop before acknowledging.
    assert log.flush_messages_due and log.recovery_point == 0
    log.flush()
    assert log.recovery_point == 6 and not log.flush_messages_due
    now = [0]
    timed = UnifiedLog.open(tmp_path / "t-1", LogConfig(flush_ms=1000), time_ms=lambda: now[0])
    timed.append_as_leader(make_batch(timestamps=[0]), 0)
    assert not timed.flush_due(500)
    assert timed.flush_due(1000)
    timed.flush()
    assert timed.recovery_point == 1 and not timed.flush_due(5000)


def test_recompression_to_topic_codec(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(compression_type="gzip"))
    info = log.append_as_leader(make_batch(count=4, value_size=200), 0)
    assert (info.first_offset, info.last_offset) == (0, 3)
    data = log.read(0, 1 << 20).records
    header = read_header(data)
    assert header.compression == CompressionType.GZIP
    assert header.size < len(make_batch(count=4, value_size=200))
    assert batch_offsets(data) == [(0, 3)]
    # Compressed batches are searchable by timestamp (decompressed on that rare path).
    assert log.fetch_offset_by_timestamp(0) is not None
