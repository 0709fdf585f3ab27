"""The log cleaner and transactions: aborted data goes, markers outlive their data by
delete.retention.ms, open transactions are never cleaned, the cleaned transaction index survives
a crash at any step of the swap."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from strom.records import batch as rb
from strom.records.codec import RecordSpec, encode_batch
from strom.records.control import ControlRecordType
from strom.storage import LogCleaner, UnifiedLog
from strom.storage.transaction_index import AbortedTxn
from unit.storage.test_cleaner import DAY_MS, Clock, batches, compacted, put, records

ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT


class Producer:
    """A transactional producer writing keyed records, one batch each."""

    def __init__(self, log: UnifiedLog, pid: int, clock: Clock) -> None:
        self.log, self.pid, self.clock, self.seq = log, pid, clock, 0

    def send(self, key: bytes, value: bytes) -> int:
        batch = encode_batch(
            [RecordSpec(key, value, timestamp=self.clock.now)],
            producer_id=self.pid,
            producer_epoch=0,
            base_sequence=self.seq,
            is_transactional=True,
        )
        self.seq += 1
        return self.log.append_as_leader(batch, 0).first_offset

    def end(self, marker: ControlRecordType) -> int:
        return self.log.append_transaction_marker(self.pid, 0, 0, marker, 0).first_offset


def control_batches(log: UnifiedLog) -> list[rb.BatchHeader]:
    return [b.header for b in batches(log) if b.header.is_control]


def data(log: UnifiedLog) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record outside control batches."""
    return [(r.key, r.value) for b in batches(log) if not b.header.is_control for r in b.records]


def test_aborted_data_goes_and_markers_outlive_their_data(tmp_path: Path) -> None:
    clock = Clock()
    log = UnifiedLog.open(tmp_path / "t-0", compacted(delete_retention_ms=DAY_MS), time_ms=clock)
    cleaner = LogCleaner(time_ms=clock)
    committed, aborted = Producer(log, 1, clock), Producer(log, 2, clock)
    committed.send(b"a", b"committed-a")
    first_aborted = aborted.send(b"b", b"aborted-b")
    aborted.send(b"c", b"aborted-c")
    commit = committed.end(COMMIT)
    abort = aborted.end(ABORT)
    put(log, b"b", b"plain-b", clock.now)
    log.roll()
    log.on_high_watermark_updated(log.log_end_offset)
    # Only the producer's last batch of the aborted transaction stays, emptied (its state).
    assert log.collect_aborted_transactions(0, abort) == [AbortedTxn(2, first_aborted, abort, abort + 1)]

    assert cleaner.clean_log(log) is not None
    assert data(log) == [(b"a", b"committed-a"), (b"b", b"plain-b")]
    # Both markers saw batches of their transactions this round: they stay as they were, and so
    # does the aborted transaction's index entry (now in the cleaned segment's index).
    assert [h.base_offset for h in control_batches(log)] == [commit, abort]
    assert not any(h.attributes & rb.DELETE_HORIZON_FLAG for h in control_batches(log))
    assert log.collect_aborted_transactions(0, abort) == [AbortedTxn(2, first_aborted, abort, abort + 1)]

    # The aborted transaction's last batch stays as an empty header while it is its producer's
    # last (producer state needs it), and keeps its marker; both producers write again.
    committed.send(b"a", b"newer-a")  # shadows the first transaction's only record
    second_commit = committed.end(COMMIT)
    aborted.send(b"d", b"later-d")
    third_commit = aborted.end(COMMIT)
    log.roll()
    log.on_high_watermark_updated(log.log_end_offset)
    # This round removes the first transactions' last batches; it saw them, so their markers stay
    # as they are once more (Kafka's rule: a marker goes only after a round that saw none).
    assert cleaner.clean_log(log) is not None
    assert data(log) == [(b"b", b"plain-b"), (b"a", b"newer-a"), (b"d", b"later-d")]
    assert not any(h.attributes & rb.DELETE_HORIZON_FLAG for h in control_batches(log))
    put(log, b"e", b"more", clock.now)
    log.roll()
    assert cleaner.clean_log(log) is not None
    # The first transactions' data is gone: their markers get a delete horizon, the aborted one
    # leaves the index; the later transactions' markers stay as they are.
    stamped = {
        h.base_offset: h.base_timestamp for h in control_batches(log) if h.attributes & rb.DELETE_HORIZON_FLAG
    }
    assert stamped == {commit: clock.now + DAY_MS, abort: clock.now + DAY_MS}
    assert [h.base_offset for h in control_batches(log)] == [commit, abort, second_commit, third_commit]
    assert log.collect_aborted_transactions(0, log.log_end_offset) == []

    clock.now += DAY_MS - 1
    assert cleaner.clean_log(log) is None  # not due yet
    clock.now += 1
    assert cleaner.clean_log(log) is not None
    assert [h.base_offset for h in control_batches(log)] == [second_commit, third_commit]
    assert data(log) == [(b"b", b"plain-b"), (b"a", b"newer-a"), (b"d", b"later-d"), (b"e", b"more")]


def test_aborted_records_do_not_shadow_older_committed_values(tmp_path: Path) -> None:
    clock = Clock()
    log = UnifiedLog.open(tmp_path / "t-0", compacted(), time_ms=clock)
    put(log, b"k", b"committed", clock.now)
    producer = Producer(log, 7, clock)
    producer.send(b"k", b"aborted")
    producer.end(ABORT)
    log.roll()
    log.on_high_watermark_updated(log.log_end_offset)
    assert LogCleaner(time_ms=clock).clean_log(log) is not None
    assert data(log) == [(b"k", b"committed")]


def test_an_open_transaction_is_never_cleaned(tmp_path: Path) -> None:
    clock = Clock()
    log = UnifiedLog.open(tmp_path / "t-0", compacted(segment_bytes=300), time_ms=clock)
    for i in range(6):
        put(log, b"k", b"old-%d" % i, clock.now)
    open_txn = Producer(log, 3, clock)
    first_open = open_txn.send(b"x", b"undecided")
    for i in range(30):
        put(log, b"k", b"new-%d" % i, clock.now)
    log.roll()
    unstable_segment = next(s for s in log.segments if s.next_offset > first_open)
    untouched = {
        s.base_offset: s.log_path.read_bytes()
        for s in log.segments
        if s.base_offset >= unstable_segment.base_offset
    }

    target = LogCleaner(time_ms=clock).log_to_clean(log)
    assert target is not None and target.first_uncleanable_offset == unstable_segment.base_offset
    LogCleaner(time_ms=clock).clean_log(log)
    after = {s.base_offset: s.log_path.read_bytes() for s in log.segments}
    assert {base: after[base] for base in untouched} == untouched
    assert (first_open, b"x", b"undecided") in records(log)


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


def build_log_with_an_abort(dir: Path) -> UnifiedLog:
    """Time-rolled segments of one cleaning group; an aborted transaction spans several of them."""
    clock = Clock()
    log = UnifiedLog.open(dir, compacted(segment_bytes=1 << 20, segment_ms=1000), time_ms=clock)
    producer = Producer(log, 9, clock)
    for i in range(60):
        if i % 15 == 0:
            clock.now += 2000
        if i in (10, 20):
            producer.send(b"t%d" % i, b"aborted")
        put(log, b"k%d" % (i % 5), b"v%d" % i, clock.now)
    producer.end(ABORT)
    clock.now += 2000
    put(log, b"k0", b"last", clock.now)
    log.roll()
    log.on_high_watermark_updated(log.log_end_offset)
    return log


def test_a_crash_at_any_step_of_the_swap_keeps_the_aborted_transaction_index(
    tmp_path: Path, crash_after: Callable[[int], None]
) -> None:
    reference = build_log_with_an_abort(tmp_path / "reference" / "t-0")
    aborted = reference.collect_aborted_transactions(0, reference.log_end_offset)
    assert len(aborted) == 1 and reference.num_segments > 3
    old = records(reference)
    assert LogCleaner().clean_log(reference) is not None
    new = records(reference)
    assert new != old and reference.collect_aborted_transactions(0, reference.log_end_offset) == aborted
    step = 0
    while True:
        dir = tmp_path / f"crash{step}" / "t-0"
        log = build_log_with_an_abort(dir)
        crash_after(step)
        try:
            finished = LogCleaner().clean_log(log) is not None
        except Crash:
            crash_after(-1)
            finished = False
        crash_after(-1)
        # Everything was flushed before the crash: no segment is recovered, so the transaction
        # indexes are the files the swap left (a recovered one would be rebuilt from the log).
        recovered = UnifiedLog.open(
            dir, log.config, had_clean_shutdown=False, recovery_point=log.log_end_offset
        )
        assert records(recovered) in (old, new), f"crash at step {step}"
        assert recovered.collect_aborted_transactions(0, recovered.log_end_offset) == aborted, step
        names = [p.name for p in dir.iterdir()]
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
        if finished:
            break
        step += 1
    assert step > 10
