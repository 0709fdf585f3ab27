"""LogCleaner on real segment files: what compaction keeps, when it runs, and crash safety of the swap."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from strom.records import batch as rb
from strom.records.codec import RecordBatch, RecordSpec, decode_batches, encode_batch
from strom.storage import (
    CleanerConfig,
    InvalidRecordError,
    LogCleaner,
    LogConfig,
    LogManager,
    UnifiedLog,
)
from strom.storage.checkpoint import OffsetCheckpointFile
from strom.storage.cleaner import CLEANER_OFFSET_CHECKPOINT

DAY_MS = 86_400_000
T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def compacted(**overrides: Any) -> LogConfig:
    settings: dict[str, Any] = {
        "cleanup_policy": ("compact",),
        "min_cleanable_dirty_ratio": 0.0,
        "segment_bytes": 1500,
        "index_interval_bytes": 100,
    }
    settings.update(overrides)
    return LogConfig(**settings)


def put(
    log: UnifiedLog, key: bytes | None, value: bytes | None, timestamp: int | None = None, **batch: Any
) -> int:
    """Append one record in its own batch; its offset."""
    info = log.append_as_leader(encode_batch([RecordSpec(key, value, timestamp=timestamp)], **batch), 0)
    return info.first_offset


def batches(log: UnifiedLog) -> list[RecordBatch]:
    """Every batch from the log start to the end, read the way a consumer does."""
    out: list[RecordBatch] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20).records
        assert data, f"no batch at {offset}"
        for batch in decode_batches(data):
            out.append(batch)
            offset = batch.header.next_offset
    return out


def records(log: UnifiedLog) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in batches(log) for r in b.records]


def latest_by_key(recs: list[tuple[int, bytes | None, bytes | None]]) -> dict[bytes | None, int]:
    latest: dict[bytes | None, int] = {}
    for offset, key, _ in recs:
        latest[key] = offset
    return latest


def fill_updates(log: UnifiedLog, updates: int, keys: int, clock: Clock | None = None) -> None:
    for i in range(updates):
        put(log, b"k%d" % (i % keys), b"v%d" % i, clock.now if clock else None)


def test_cleaning_keeps_the_latest_value_of_each_key_at_its_original_offset(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted())
    fill_updates(log, 300, 12)
    before = records(log)
    active_base = log.active_segment.base_offset
    active_bytes = log.active_segment.log_path.read_bytes()
    end = log.log_end_offset

    stats = LogCleaner().clean_log(log)

    assert stats is not None and stats.end_offset == active_base
    after = records(log)
    # Below the active segment: exactly the latest record of each key within that range.
    cleaned_range = [r for r in before if r[0] < active_base]
    expected = {offset for offset in latest_by_key(cleaned_range).values()}
    assert [r for r in after if r[0] < active_base] == [r for r in cleaned_range if r[0] in expected]
    # The active segment is untouched, byte for byte; offsets did not move.
    assert [r for r in after if r[0] >= active_base] == [r for r in before if r[0] >= active_base]
    assert log.active_segment.log_path.read_bytes() == active_bytes
    assert log.log_end_offset == end and log.log_start_offset == 0
    assert stats.records_removed == len(cleaned_range) - len(expected)
    assert stats.bytes_after < stats.bytes_before
    # Each key's final value is still the final value.
    assert {k: v for _, k, v in after} == {k: v for _, k, v in before}
    # Every offset that survived can be fetched directly, through the rebuilt indexes.
    for offset, key, value in after:
        found = [r for b in decode_batches(log.read(offset, 1).records) for r in b.records]
        assert (found[0].offset, found[0].key, found[0].value) == (offset, key, value)
    # The log reopens (clean shutdown) with the same content.
    log.close()
    reopened = UnifiedLog.open(tmp_path / "t-0", compacted(), had_clean_shutdown=True)
    assert records(reopened) == after


def test_a_second_round_merges_cleaned_segments_and_keeps_offsets(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted())
    cleaner = LogCleaner()
    fill_updates(log, 300, 5)
    assert cleaner.clean_log(log) is not None
    segments_after_first = log.num_segments
    fill_updates(log, 100, 5)
    second = cleaner.clean_log(log)
    assert second is not None and second.segments_after < second.segments_before
    assert log.num_segments < segments_after_first + 3
    after = records(log)
    active_base = log.active_segment.base_offset
    below = [r for r in after if r[0] < active_base]
    assert len({k for _, k, _ in below}) == len(below)  # one record per key below the active segment
    # Cleaned segments keep the base offset of the first segment they replaced.
    assert log.segments[0].base_offset == 0
    assert all(s.next_offset <= t.base_offset for s, t in zip(log.segments, log.segments[1:], strict=False))


def test_a_round_with_nothing_to_remove_rewrites_nothing(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted(segment_bytes=600))  # one segment per group
    fill_updates(log, 60, 60)  # every key once
    inodes = [os.stat(s.log_path).st_ino for s in log.segments]
    stats = LogCleaner().clean_log(log)
    assert stats is not None and stats.end_offset == log.active_segment.base_offset
    assert (stats.segments_before, stats.records_removed) == (0, 0)
    assert [os.stat(s.log_path).st_ino for s in log.segments] == inodes
    assert not [p for p in log.dir.iterdir() if p.name.endswith(".cleaned")]


def test_the_active_segment_is_never_cleaned(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted(segment_bytes=1 << 20))
    fill_updates(log, 100, 3)
    assert log.num_segments == 1
    before = log.active_segment.log_path.read_bytes()
    cleaner = LogCleaner()
    target = cleaner.log_to_clean(log)
    assert target is None  # nothing but the active segment
    assert cleaner.clean_log(log) is None
    assert log.active_segment.log_path.read_bytes() == before
    assert len(records(log)) == 100


def test_min_cleanable_dirty_ratio_is_respected(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted())
    cleaner = LogCleaner()
    fill_updates(log, 300, 300)  # distinct keys: cleaning keeps them all
    assert cleaner.clean_log(log) is not None  # ratio 0: clean everything once
    log.update_config(compacted(min_cleanable_dirty_ratio=0.5))
    # A little new dirty data: below half of the log.
    fill_updates(log, 40, 10)
    log.roll()
    target = cleaner.log_to_clean(log)
    assert target is not None and 0 < target.cleanable_ratio < 0.5 and not target.due
    assert cleaner.clean_log(log) is None
    # Much more: above half.
    fill_updates(log, 400, 10)
    log.roll()
    target = cleaner.log_to_clean(log)
    assert target is not None and target.cleanable_ratio > 0.5 and target.due
    assert cleaner.clean_log(log) is not None
    # The checkpoint moved to the end of what was cleaned: nothing is dirty now.
    target = cleaner.log_to_clean(log)
    assert target is not None and target.cleanable_bytes == 0 and not target.due


def test_min_compaction_lag_keeps_young_records_dirty(tmp_path: Path) -> None:
    clock = Clock()
    log = UnifiedLog.open(tmp_path / "t-0", compacted(min_compaction_lag_ms=60_000), time_ms=clock)
    cleaner = LogCleaner(time_ms=clock)
    fill_updates(log, 100, 4, clock)  # old enough by the time we clean
    old_end = log.log_end_offset
    clock.now += 120_000
    fill_updates(log, 100, 4, clock)  # young
    target = cleaner.log_to_clean(log)
    assert target is not None
    # The first segment holding a young record, and everything after it, is uncleanable.
    young = next(s for s in log.segments if s.largest_timestamp > clock.now - 60_000)
    assert target.first_uncleanable_offset == young.base_offset <= old_end
    stats = cleaner.clean_log(log)
    assert stats is not None and stats.end_offset == young.base_offset
    young_records = [r for r in records(log) if r[0] >= young.base_offset]
    assert len(young_records) == log.log_end_offset - young.base_offset  # none removed
    clock.now += 61_000
    assert cleaner.clean_log(log) is not None
    assert len([r for r in records(log) if r[0] >= young.base_offset]) < len(young_records)


def test_max_compaction_lag_cleans_a_log_whose_ratio_is_not_met(tmp_path: Path) -> None:
    clock = Clock()
    log = UnifiedLog.open(tmp_path / "t-0", compacted(max_compaction_lag_ms=DAY_MS), time_ms=clock)
    cleaner = LogCleaner(time_ms=clock)
    fill_updates(log, 300, 4, clock)
    assert cleaner.clean_log(log) is not None
    log.update_config(compacted(min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=DAY_MS))
    clock.now += 1000
    fill_updates(log, 60, 4, clock)
    log.roll()
    target = cleaner.log_to_clean(log)
    assert target is not None and target.cleanable_ratio < 0.99
    assert not target.need_compaction_now and cleaner.clean_log(log) is None
    clock.now += DAY_MS + 1  # the dirty records' first batch is now older than the lag
    target = cleaner.log_to_clean(log)
    assert target is not None and target.need_compaction_now and target.due
    assert cleaner.clean_log(log) is not None


def test_tombstones_are_removed_delete_retention_ms_after_the_first_round_that_kept_them(
    tmp_path: Path,
) -> None:
    clock = Clock()
    log = UnifiedLog.open(tmp_path / "t-0", compacted(delete_retention_ms=DAY_MS), time_ms=clock)
    cleaner = LogCleaner(time_ms=clock)
    fill_updates(log, 100, 4, clock)
    # An old timestamp: the horizon counts from the cleaner seeing it, not from the record.
    tombstone = put(log, b"k1", None, clock.now - 10 * DAY_MS)
    fill_updates(log, 40, 1, clock)  # k0 only: pushes the tombstone out of the active segment
    log.roll()

    assert cleaner.clean_log(log) is not None
    kept = [b for b in batches(log) if any(r.offset == tombstone for r in b.records)]
    assert len(kept) == 1
    header = kept[0].header
    assert header.attributes & rb.DELETE_HORIZON_FLAG
    assert header.base_timestamp == clock.now + DAY_MS  # the horizon
    assert kept[0].records[0].timestamp == clock.now - 10 * DAY_MS  # record timestamps unchanged
    assert all(k != b"k1" or v is None for _, k, v in records(log))  # k1's older values are gone

    clock.now += DAY_MS - 1
    assert cleaner.clean_log(log) is None  # not due: no dirty data and the horizon is ahead
    clock.now += 1
    target = cleaner.log_to_clean(log)
    assert target is not None and target.tombstones_due and target.cleanable_bytes == 0
    stats = cleaner.clean_log(log)
    assert stats is not None and stats.tombstones_removed == 1
    assert b"k1" not in {k for _, k, _ in records(log)}
    assert cleaner.log_to_clean(log) is not None and not cleaner.log_to_clean(log).due  # type: ignore[union-attr]


def test_tombstone_in_the_dirty_section_hides_older_values_but_survives_the_first_round(
    tmp_path: Path,
) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted())
    put(log, b"gone", b"1")
    put(log, b"gone", b"2")
    fill_updates(log, 100, 3)
    put(log, b"gone", None)
    fill_updates(log, 50, 3)
    log.roll()
    assert LogCleaner().clean_log(log) is not None
    assert [(k, v) for _, k, v in records(log) if k == b"gone"] == [(b"gone", None)]


def test_a_producers_last_batch_survives_as_an_empty_batch_and_restores_its_state(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = UnifiedLog.open(dir, compacted())
    producer = {"producer_id": 7, "producer_epoch": 3}
    for seq in range(5):
        log.append_as_leader(encode_batch([RecordSpec(b"p", b"%d" % seq)], base_sequence=seq, **producer), 0)
    last_batch = log.log_end_offset - 1
    fill_updates(log, 200, 3)
    put(log, b"p", b"from someone else")  # supersedes every record of producer 7
    fill_updates(log, 50, 3)
    log.roll()
    assert LogCleaner().clean_log(log) is not None

    mine = [b for b in batches(log) if b.header.producer_id == 7]
    assert [(b.header.base_offset, b.header.records_count) for b in mine] == [(last_batch, 0)]
    assert (mine[0].header.base_sequence, mine[0].header.producer_epoch) == (4, 3)
    log.close()
    # Without snapshots, the state must come from replaying the log, empty batch included.
    for snapshot in dir.glob("*.snapshot"):
        snapshot.unlink()
    reopened = UnifiedLog.open(dir, compacted(), had_clean_shutdown=False)
    entry = reopened.producer_state.last_entry(7)
    assert entry is not None and (entry.producer_epoch, entry.last_seq) == (3, 4)
    # A retry of the last batch is recognised, with its original offset.
    retry = encode_batch([RecordSpec(b"p", b"4")], base_sequence=4, **producer)
    info = reopened.append_as_leader(retry, 0)
    assert info.duplicate and info.first_offset == last_batch
    # And the next sequence is accepted.
    nxt = encode_batch([RecordSpec(b"p", b"5")], base_sequence=5, **producer)
    assert not reopened.append_as_leader(nxt, 0).duplicate


@pytest.mark.parametrize("codec", [rb.CompressionType.GZIP, rb.CompressionType.ZSTD, rb.CompressionType.NONE])
def test_partly_kept_batches_keep_their_offsets_codec_and_producer_fields(tmp_path: Path, codec: int) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted())
    specs = [RecordSpec(b"a", b"1"), RecordSpec(b"b", b"1"), RecordSpec(b"c", b"1"), RecordSpec(b"d", b"1")]
    batch = encode_batch(specs, compression=codec, producer_id=11, producer_epoch=2, base_sequence=0)
    log.append_as_leader(batch, 5)
    put(log, b"b", b"2")
    put(log, b"d", b"2")
    fill_updates(log, 100, 2)
    log.roll()
    assert LogCleaner().clean_log(log) is not None

    first = batches(log)[0]
    header = first.header
    assert (header.base_offset, header.last_offset_delta, header.records_count) == (0, 3, 2)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (11, 2, 0)
    assert header.compression == codec and header.partition_leader_epoch == 5
    assert [(r.offset, r.key, r.value) for r in first.records] == [(0, b"a", b"1"), (2, b"c", b"1")]


def test_keyless_records_are_rejected_by_a_compacted_log(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted())
    specs = [RecordSpec(b"k", b"v"), RecordSpec(None, b"v"), RecordSpec(b"k", b"v"), RecordSpec(None, b"v")]
    with pytest.raises(InvalidRecordError) as raised:
        log.append_as_leader(encode_batch(specs), 0)
    assert raised.value.error_code == 87
    message = "Compacted topic cannot accept message without key in topic partition t-0."
    assert raised.value.record_errors == [(1, message), (3, message)]
    assert "2 record errors" in raised.value.message
    assert log.log_end_offset == 0
    # The same batch is fine for a topic that is not compacted.
    log.update_config(LogConfig())
    assert log.append_as_leader(encode_batch(specs), 0).last_offset == 3


def test_keyless_records_already_in_a_log_are_dropped_by_cleaning(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1500))
    put(log, None, b"no key")
    fill_updates(log, 100, 3)
    log.update_config(compacted())  # cleanup.policy changed to compact
    log.roll()
    assert LogCleaner().clean_log(log) is not None
    assert None not in {k for _, k, _ in records(log)}


def test_the_cleaner_checkpoint_file_records_the_cleaned_end(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted())
    fill_updates(log, 200, 5)
    stats = LogCleaner().clean_log(log)
    assert stats is not None
    entries = OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT).read()
    assert entries == {("t", 0): stats.end_offset}
    # A new cleaner (a restart) starts from it: nothing is dirty.
    target = LogCleaner().log_to_clean(log)
    assert target is not None and target.first_dirty_offset == stats.end_offset and not target.due


def test_a_small_dedupe_buffer_cleans_in_several_rounds(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted())
    for i in range(400):
        put(log, b"key-%03d" % (i % 100), b"v%d" % i)
    log.roll()
    # Room for about 30 keys per round.
    cleaner = LogCleaner(CleanerConfig(dedupe_buffer_size=30 * 130, io_buffer_load_factor=1.0))
    rounds = 0
    while cleaner.clean_log(log) is not None:
        rounds += 1
        assert rounds < 50
    assert rounds > 1
    assert latest_by_key(records(log)) == {b"key-%03d" % k: 300 + k for k in range(100)}


def test_offsets_by_timestamp_skip_emptied_batches(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted())
    for i in range(100):
        put(log, b"k%d" % (i % 3), b"v%d" % i, T0 + i)
    log.roll()
    assert LogCleaner().clean_log(log) is not None
    found = log.fetch_offset_by_timestamp(T0 + 5)
    # The first surviving record at or after that time.
    expected = min(offset for offset, _, _ in records(log) if offset >= 5)
    assert found is not None and found.offset == expected


# --- concurrency ------------------------------------------------------------------------------------


def test_retention_deleting_segments_during_a_round_aborts_it(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted(cleanup_policy=("compact", "delete")))
    fill_updates(log, 300, 6)
    before = records(log)
    cleaner = LogCleaner()
    rounds = cleaner._round(log)
    offset_map = next(rounds)
    offset_map()  # the worker-thread steps, run inline
    clean_first_group = rounds.send(None)
    cleaned = clean_first_group()
    assert list(log.dir.glob("*.cleaned"))
    # Meanwhile, on the event loop: DeleteRecords removes the first segments.
    log.delete_records(log.segments[2].base_offset)
    with pytest.raises(StopIteration) as done:
        rounds.send(cleaned)
    assert done.value.value is None
    assert not list(log.dir.glob("*.cleaned")) and not list(log.dir.glob("*.swap"))
    start = log.log_start_offset
    assert records(log) == [r for r in before if r[0] >= start]
    # The next round cleans the log as it now is.
    assert cleaner.clean_log(log) is not None


def test_appends_and_reads_go_on_while_a_round_runs_in_a_worker_thread(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted(segment_bytes=8000))
    fill_updates(log, 1500, 50)
    final: dict[bytes | None, bytes | None] = {k: v for _, k, v in records(log)}

    async def run() -> None:
        cleaner = LogCleaner()
        task = asyncio.create_task(cleaner.clean_logs([log]))
        i = 0
        while not task.done():
            # Appends and full reads interleave with the round's swaps on this loop.
            key, value = b"k%d" % (i % 50), b"late%d" % i
            put(log, key, value)
            final[key] = value
            assert {k: v for _, k, v in records(log)} == final
            i += 1
            await asyncio.sleep(0.001)  # a busy loop, not a saturated one
        cleaned = task.result()
        assert len(cleaned) == 1 and cleaned[0].records_removed > 0
        assert i > 0

    asyncio.run(run())
    assert {k: v for _, k, v in records(log)} == final


def test_stopping_the_broker_mid_round_leaves_no_temporary_files(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", compacted(segment_bytes=8000))
    fill_updates(log, 3000, 50)
    final = {k: v for _, k, v in records(log)}
    # Throttled to ~1 s for the log's ~220 kB (read and written), so the cancel lands mid-round.
    cleaner = LogCleaner(CleanerConfig(io_max_bytes_per_second=300_000))

    async def run() -> None:
        task = asyncio.create_task(cleaner.clean_logs([log]))
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    names = [p.name for p in log.dir.iterdir()]
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
    assert {k: v for _, k, v in records(log)} == final


def test_a_log_deleted_during_a_round_is_left_alone(tmp_path: Path) -> None:
    manager = LogManager([tmp_path])
    cleaner = manager.start_cleaner(CleanerConfig())
    log = manager.get_or_create_log("t", 0, compacted())
    fill_updates(log, 200, 5)
    rounds = cleaner._round(log)
    next(rounds)()  # the offset map, on a worker thread
    clean_group = rounds.send(None)
    manager.delete_log("t", 0)  # on the event loop, between two worker steps
    with pytest.raises(Exception) as raised:
        clean_group()
    with pytest.raises(StopIteration) as done:
        rounds.throw(raised.value)
    assert done.value.value is None
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no log dir, no half-deleted one
    # Not marked uncleanable: a new log of that name is cleaned as usual.
    again = manager.get_or_create_log("t", 0, compacted())
    fill_updates(again, 200, 5)
    assert cleaner.clean_log(again) is not None


def test_deleting_a_log_forgets_its_checkpoint(tmp_path: Path) -> None:
    manager = LogManager([tmp_path])
    cleaner = manager.start_cleaner(CleanerConfig())
    log = manager.get_or_create_log("t", 0, compacted())
    fill_updates(log, 200, 5)
    assert cleaner.clean_log(log) is not None
    assert OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT).read()
    manager.delete_log("t", 0)
    assert OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT).read() == {}
    assert not (tmp_path / "t-0").exists()
    again = manager.get_or_create_log("t", 0, compacted())
    assert cleaner.checkpoint(again) is None


# --- crash safety of the swap -----------------------------------------------------------------------


class Crash(BaseException):
    """kill -9 at this point: nothing after it runs, nothing catches it."""


@pytest.fixture()
def crash_after() -> Iterator[Callable[[int], None]]:
    """Arm a crash at the n-th rename or unlink from now on (n = 0: the first one)."""
    real_replace, real_unlink = os.replace, os.unlink
    remaining = [-1]

    def step() -> None:
        if remaining[0] == 0:
            raise Crash()
        remaining[0] -= 1

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        step()
        real_replace(src, dst, **kwargs)

    def unlink(path: Any, **kwargs: Any) -> None:
        step()
        real_unlink(path, **kwargs)

    def arm(n: int) -> None:
        remaining[0] = n
        os.replace, os.unlink = replace, unlink  # type: ignore[assignment]

    try:
        yield arm
    finally:
        os.replace, os.unlink = real_replace, real_unlink  # type: ignore[assignment]


def build_time_rolled_log(dir: Path) -> UnifiedLog:
    """Small segments (rolled by time) that all fit one cleaning group."""
    clock = Clock()
    log = UnifiedLog.open(dir, compacted(segment_bytes=1 << 20, segment_ms=1000), time_ms=clock)
    for i in range(120):
        if i % 20 == 0:
            clock.now += 2000
        put(log, b"k%d" % (i % 7), b"v%d" % i, clock.now)
    log.roll()
    return log


def test_a_crash_at_any_step_of_the_swap_recovers_the_old_or_the_new_segments(
    tmp_path: Path, crash_after: Callable[[int], None]
) -> None:
    reference = build_time_rolled_log(tmp_path / "reference" / "t-0")
    old = records(reference)
    assert reference.num_segments > 4
    assert LogCleaner().clean_log(reference) is not None
    new = records(reference)
    assert new != old
    outcomes = set()
    step = 0
    while True:
        dir = tmp_path / f"crash{step}" / "t-0"
        log = build_time_rolled_log(dir)
        crash_after(step)
        try:
            finished = LogCleaner().clean_log(log) is not None
        except Crash:
            crash_after(-1)  # disarmed while the crashed round is still referenced from here
            finished = False
        crash_after(-1)
        # kill -9: the UnifiedLog object is abandoned as it is; start over from the files.
        recovered = UnifiedLog.open(dir, log.config, had_clean_shutdown=False)
        got = records(recovered)
        assert got in (old, new), f"crash at step {step}"
        outcomes.add("new" if got == new else "old")
        names = [p.name for p in dir.iterdir()]
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
        # The recovered log is whole: every offset is readable and appends go on.
        assert put(recovered, b"k0", b"after") == recovered.log_end_offset - 1
        if finished:
            break
        step += 1
    assert outcomes == {"old", "new"}
    assert step > 10  # every rename and unlink of the swap was a crash point
