"""LogLoader on its own, over directories crafted file by file: torn and invalid tails, missing and
corrupt indexes, leftovers of interrupted swaps and deletions, producer snapshots and leader
epochs beyond the data."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from strom.records import batch as rb
from strom.storage import LeaderEpochFileCache, LocalLog, LogConfig, LogLoader, ProducerStateManager
from strom.storage.checkpoint import LEADER_EPOCH_CHECKPOINT, LeaderEpochCheckpointFile
from strom.storage.local_log import create_segment
from strom.storage.log_loader import LoadedLog
from strom.storage.producer_state import snapshot_offsets
from unit.storage.storage_batches import batch_offsets, make_batch

CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=100)
NOW = 1_700_000_000_000
PID = 7


def batch(base_offset: int, *, epoch: int = 0, count: int = 2, sequence: int = -1) -> bytearray:
    data = bytearray(
        make_batch(
            count=count,
            value_size=40,
            base_offset=base_offset,
            timestamps=[NOW],
            producer_id=PID if sequence >= 0 else -1,
            producer_epoch=0 if sequence >= 0 else -1,
            base_sequence=sequence,
        )
    )
    rb.set_partition_leader_epoch(data, 0, epoch)
    return data


def write_segments(
    dir: Path, batches_per_segment: list[int], *, epoch: int = 0, idempotent: bool = False
) -> None:
    """Segments of two-record batches, as a log leaves them on disk (no producer snapshot)."""
    dir.mkdir()
    local = LocalLog(dir, CONFIG, [create_segment(dir, 0, CONFIG, NOW)], 0, lambda: NOW)
    for i, batches in enumerate(batches_per_segment):
        if i:
            local.roll()
        for _ in range(batches):
            offset = local.log_end_offset
            data = batch(offset, epoch=epoch, sequence=offset if idempotent else -1)
            local.append(data, [rb.read_header(data, 0)])
    local.close()


def load(
    dir: Path, *, clean: bool, recovery_point: int = 0
) -> tuple[LoadedLog, LeaderEpochFileCache, ProducerStateManager]:
    cache = LeaderEpochFileCache(dir, lambda: 0)
    state = ProducerStateManager(dir)
    loader = LogLoader(
        dir,
        CONFIG,
        time_ms=lambda: NOW,
        had_clean_shutdown=clean,
        log_start_offset=None,
        recovery_point=recovery_point,
        leader_epoch_cache=cache,
        producer_state=state,
    )
    return loader.load(), cache, state


def read_all(dir: Path, loaded: LoadedLog) -> list[tuple[int, int]]:
    """Every batch, reading on from each read's end (a read stops at its segment's end)."""
    local = LocalLog(dir, CONFIG, loaded.segments, loaded.recovery_point, lambda: NOW)
    out: list[tuple[int, int]] = []
    offset = loaded.log_start_offset
    while offset < local.log_end_offset:
        out += batch_offsets(local.read(offset, 1 << 20).records)
        offset = out[-1][1] + 1
    return out


def test_an_unclean_torn_tail_is_cut_to_the_last_whole_batch(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    write_segments(dir, [3, 3], epoch=4)
    last = dir / "00000000000000000006.log"
    os.truncate(last, last.stat().st_size - 7)
    loaded, cache, _ = load(dir, clean=False)
    assert [s.base_offset for s in loaded.segments] == [0, 6]
    assert loaded.segments[-1].next_offset == 10
    assert loaded.recovery_point == 0  # nothing recovered counts as flushed
    assert read_all(dir, loaded) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert cache.latest_epoch == 4  # epochs come back from the recovered batches


def test_an_invalid_batch_ends_the_log_there_and_later_segments_go(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    write_segments(dir, [3, 3])
    first = dir / "00000000000000000000.log"
    size = first.stat().st_size
    with open(first, "r+b") as f:
        f.seek(size // 3 + 70)  # a record inside the second batch
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x55]))
    loaded, _, _ = load(dir, clean=False)
    assert [s.base_offset for s in loaded.segments] == [0]
    assert read_all(dir, loaded) == [(0, 1)]
    assert not (dir / "00000000000000000006.log").exists()


def test_a_clean_load_trusts_the_data_and_starts_flushed_at_the_log_end(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    write_segments(dir, [2, 2])
    loaded, _, _ = load(dir, clean=True)
    assert loaded.recovery_point == loaded.segments[-1].next_offset == 8
    assert loaded.log_start_offset == 0


def test_missing_and_corrupt_indexes_are_rebuilt_from_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dir = tmp_path / "t-0"
    write_segments(dir, [4, 4, 1])
    (dir / "00000000000000000000.index").unlink()
    (dir / "00000000000000000008.timeindex").write_bytes(b"\x00\x01\x02\x03\x04")
    with caplog.at_level(logging.WARNING, logger="strom.storage.log_segment"):
        loaded, _, _ = load(dir, clean=True)
    rebuilt = {
        r.getMessage().split(":")[0] for r in caplog.records if "rebuilding its indexes" in r.getMessage()
    }
    assert rebuilt == {str(dir / "00000000000000000000.log"), str(dir / "00000000000000000008.log")}
    assert (dir / "00000000000000000000.index").exists()
    assert (dir / "00000000000000000008.timeindex").stat().st_size % 12 == 0
    assert read_all(dir, loaded) == [(i, i + 1) for i in range(0, 18, 2)]
    # Reads from inside each segment go through the rebuilt indexes.
    local = LocalLog(dir, CONFIG, loaded.segments, loaded.recovery_point, lambda: NOW)
    assert batch_offsets(local.read(6, 200).records)[0] == (6, 7)
    assert batch_offsets(local.read(13, 200).records)[0] == (12, 13)


def test_leftovers_of_interrupted_work_are_removed_and_the_segments_kept(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    write_segments(dir, [2, 2])
    strays = [
        "00000000000000000000.log.cleaned",
        "00000000000000000000.index.cleaned",
        "00000000000000000002.log.deleted",
        "00000000000000000004.timeindex.swap",
        "00000000000000000000.index.tmp",
        "00000000000000000099.index",  # an index whose log is gone
        "00000000000000000099.timeindex",
    ]
    for name in strays:
        (dir / name).write_bytes(b"leftover")
    loaded, _, _ = load(dir, clean=True)
    assert not [name for name in strays if (dir / name).exists()]
    assert read_all(dir, loaded) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_a_committed_swap_replaces_the_segments_it_covers(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    write_segments(dir, [2, 2, 1])  # segments at 0, 4 and 8
    # The cleaner's output for segments 0 and 4, renamed .log.swap (its commit point) before a crash:
    # one batch covering offsets 0-7.
    (dir / "00000000000000000000.log.swap").write_bytes(batch(0, count=8))
    loaded, _, _ = load(dir, clean=False, recovery_point=8)
    assert [s.base_offset for s in loaded.segments] == [0, 8]
    assert read_all(dir, loaded) == [(0, 7), (8, 9)]
    assert sorted(p.name for p in dir.iterdir() if p.name.startswith("0000")) == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
        "00000000000000000008.index",
        "00000000000000000008.log",
        "00000000000000000008.timeindex",
    ]


def test_a_producer_snapshot_beyond_the_log_end_is_dropped_and_state_replayed(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    write_segments(dir, [3], idempotent=True)  # sequences 0-5 at offsets 0-5
    ahead = ProducerStateManager(dir)
    ahead.update(rb.read_header(batch(98, sequence=98), 0), 98, NOW)
    ahead.take_snapshot()  # at 100: data this log lost
    assert snapshot_offsets(dir) == [100]
    _, _, state = load(dir, clean=True)
    assert snapshot_offsets(dir) == []
    entry = state.last_entry(PID)
    assert entry is not None and entry.last_seq == 5 and entry.last_offset == 5
    assert state.map_end_offset == 6


def test_leader_epochs_beyond_the_log_end_are_truncated(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    write_segments(dir, [2], epoch=1)
    LeaderEpochCheckpointFile(dir / LEADER_EPOCH_CHECKPOINT).write([(1, 0), (5, 4), (6, 100)])
    _, cache, _ = load(dir, clean=True)
    assert cache.entries == [(1, 0)]
