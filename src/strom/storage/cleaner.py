"""LogCleaner: Kafka's log compaction, for logs whose ``cleanup.policy`` includes ``compact``.

A cleaning round of one log, as Kafka's Cleaner does it:

- The *dirty* section starts at the log's entry in the log dir's ``cleaner-offset-checkpoint``
  (the log start offset when there is none or it lies outside the log) and ends at the first
  uncleanable offset: the active segment's base, or the base of the first dirty segment holding a
  record younger than ``min.compaction.lag.ms``, whichever is lower. The active segment is never
  cleaned.
- A log is cleaned when dirty bytes / all bytes exceeds ``min.cleanable.dirty.ratio`` (Kafka
  compares with ">", so a ratio of 0 means "any dirty segment"), or, whatever the ratio, when
  the first batch of a dirty segment is older than ``max.compaction.lag.ms``.
- An offset map key -> last offset is built over the dirty section. It is bounded by
  ``log.cleaner.dedupe.buffer.size`` x ``log.cleaner.io.buffer.load.factor`` bytes, counted as
  the key's length plus an estimate of a Python dict entry's overhead; when it fills, the round
  ends there and the next round goes on from that offset (the new checkpoint).
- Every segment from the first one up to the end of the mapped section is rewritten, in groups
  that stay under ``segment.bytes``, ``segment.index.bytes`` and 2^31 offsets, each group into
  one segment that keeps the group's first base offset. A record is kept when it lies past the
  mapped section or its offset is >= the map's offset for its key (a key missing from the map
  keeps all its records). Keyless records are dropped, as Kafka drops them; control batches are
  kept.
- Offsets never change. A batch that keeps all its records is copied byte for byte; one that
  keeps some is re-encoded with its base offset, last offset delta (so producer sequence ranges
  survive), attributes, producer id/epoch/base sequence, partition leader epoch and codec, the
  kept records' bytes unchanged. A batch that keeps nothing disappears, unless it is its
  producer's last batch (idempotent producer state must survive a restart that replays the log)
  or the last batch of its group (so a cleaned segment covers exactly the offsets of the
  segments it replaces, which swap recovery relies on); those are kept as a 61-byte header with
  no records, the empty batch Kafka also writes and clients skip.

Tombstones (a key with a null value) follow KIP-534, Kafka's rule since 3.1: the first round that
keeps a tombstone stamps its batch with a delete horizon, the round's time + ``delete.retention.ms``
(attribute bit 6 set, the horizon in baseTimestamp, record timestamp deltas rewritten so record
timestamps do not change); a later round drops the tombstone once that horizon has passed. A
tombstone therefore stays readable for at least ``delete.retention.ms`` after the cleaner first
saw it, whatever timestamp its producer gave it. Unlike Kafka, a log whose earliest horizon has
passed is cleanable without new dirty data; the horizons are remembered only while the broker
runs (after a restart, the next ordinary round drops expired tombstones).

Transactions, as Kafka's cleaner (CleanedTransactionMetadata): nothing at or above the first
unstable offset is cleaned (the segment holding it is uncleanable, with every later one). The
batches of aborted transactions (from the transaction indexes) are removed, and never enter the
offset map. A COMMIT or ABORT marker stays while the round saw batches of its transaction; once
none are left it gets a delete horizon, as a tombstone does, and a round after the horizon drops
it. The aborted transactions whose markers stay are written to the cleaned segment's transaction
index (``.txnindex.cleaned``, always written, swapped in before the log).

Threads: planning and the segment swap run on the event-loop thread, which owns the UnifiedLog; reading
segments, building the map and writing the ``.cleaned`` files run on a worker thread through
their own file descriptors, so appends and fetches go on meanwhile. Only closed segments are
read. ``UnifiedLog.replace_segments`` re-checks that a group's segments are still the log's, unchanged,
and the round is abandoned otherwise (retention, DeleteRecords or a deletion got there first).
The worker pauses 0.2 ms after every 2 ms of work, so the event loop gets the GIL back at once
instead of after the interpreter's 5 ms switch interval; the replaced files are unlinked on the
worker too (a 128 MiB unlink takes ~30 ms). bench/cleaner_bench.py measures the cost: loop ticks
p99 3-10 ms while a round runs (small uncompressed records are the worst case), rounds up to ~40%
longer than without the pauses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

from strom.records import batch as rb
from strom.records import scanner
from strom.records.compression import CompressionError
from strom.records.control import ControlRecordType, batch_end_txn_marker
from strom.records.varint import write_varint
from strom.storage.checkpoint import OffsetCheckpointFile, fsync_dir
from strom.storage.errors import CorruptRecordError, KafkaStorageError, StorageError
from strom.storage.index import OffsetIndex, TimeIndex
from strom.storage.local_log import CLEANED_SUFFIX
from strom.storage.log_config import LogConfig
from strom.storage.log_segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, LogSegment, file_name
from strom.storage.transaction_index import TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex
from strom.storage.unified_log import UnifiedLog, wall_clock_ms

log = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
INT32_MAX = 0x7FFFFFFF
# Bytes a dict entry costs besides its key's bytes: the hash-table slot, the bytes object's
# header and the offset int (CPython 3.11, 64-bit; measured at ~100-130 as the table grows).
MAP_ENTRY_OVERHEAD = 120
# The header fields an empty batch keeps; no codec (Kafka writes empty headers uncompressed).
_EMPTY_BATCH_ATTRIBUTES = rb.TIMESTAMP_TYPE_MASK | rb.TRANSACTIONAL_FLAG | rb.CONTROL_FLAG
# The worker thread pauses GIL_PAUSE_S after each GIL_SLICE_S of work (see _yield_gil).
GIL_SLICE_S = 0.002
GIL_PAUSE_S = 0.0002
THROTTLE_SLICE_S = 0.5


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The broker's ``log.cleaner.*`` settings (Kafka 4.1 names and defaults)."""

    dedupe_buffer_size: int = 128 * 1024 * 1024
    io_buffer_load_factor: float = 0.9
    # Bytes read from a segment at a time, and written to a cleaned one.
    io_buffer_size: int = 512 * 1024
    io_max_bytes_per_second: float = sys.float_info.max
    backoff_ms: int = 15_000


class CleaningAbortedError(Exception):
    """The round stopped without harm: the log changed or closed, or the cleaner is stopping."""


class OffsetMap:
    """Key -> offset of its last record in the dirty section, within a memory budget in bytes."""

    def __init__(self, memory: int, latest_offset: int) -> None:
        self.offsets: dict[bytes, int] = {}
        self._memory = memory
        self._used = 0
        # Every record at or below this offset was considered (the map "covers" it).
        self.latest_offset = latest_offset

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``offset`` for ``key``; False when a new key does not fit."""
        if key not in self.offsets:
            cost = len(key) + MAP_ENTRY_OVERHEAD
            if self._used + cost > self._memory:
                return False
            self._used += cost
        self.offsets[key] = offset
        return True

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True, slots=True)
class LogToClean:
    """A compacted log's dirty section and whether it is due for cleaning."""

    log: UnifiedLog
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    need_compaction_now: bool  # max.compaction.lag.ms passed for a dirty segment
    tombstones_due: bool  # a kept tombstone's delete horizon passed

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0

    @property
    def due(self) -> bool:
        if self.need_compaction_now and self.cleanable_bytes > 0:
            return True
        return self.tombstones_due or self.cleanable_ratio > self.log.config.min_cleanable_dirty_ratio


@dataclass(slots=True)
class CleanerStats:
    """What one round did to one log."""

    log: str
    first_dirty_offset: int
    end_offset: int = 0
    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_read: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    ms: int = 0


@dataclass(frozen=True, slots=True)
class _SegmentRef:
    """A closed segment as the round saw it on the event-loop thread."""

    segment: LogSegment
    base_offset: int
    next_offset: int
    size: int
    path: Path
    index_bytes: int
    time_index_bytes: int


@dataclass(slots=True)
class _Round:
    target: LogToClean
    config: LogConfig
    now: int
    segments: list[_SegmentRef]  # every segment below the first uncleanable offset
    dirty: list[_SegmentRef]
    dirty_start_position: int  # in dirty[0], from the offset index
    producer_last_offsets: dict[int, int]
    # Aborted transactions overlapping the segments below the first uncleanable offset.
    aborted: list[AbortedTxn]
    offset_map: OffsetMap
    stats: CleanerStats
    started: float
    groups: list[list[_SegmentRef]] = field(default_factory=list)
    created: list[Path] = field(default_factory=list)
    tombstone_deadline: int | None = None
    bytes_done: int = 0

    @property
    def log(self) -> UnifiedLog:
        return self.target.log


@dataclass(frozen=True, slots=True)
class _CleanedSegment:
    base_offset: int
    size: int


class _CleanedTransactions:
    """What a pass over a range of batches knows of their transactions (Kafka's
    CleanedTransactionMetadata): which batches belong to aborted transactions, and which markers
    still have batches of their transaction behind them."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._aborted = deque(sorted(aborted, key=lambda txn: txn.first_offset))
        # producer id -> [the aborted transaction under way, whether a batch of it was seen]
        self._ongoing_aborted: dict[int, list[Any]] = {}
        self._ongoing_committed: set[int] = set()
        # Aborted transactions whose markers stay: the cleaned segment's transaction index.
        self.index_entries: list[AbortedTxn] = []

    def _begin_aborted_up_to(self, offset: int) -> None:
        aborted = self._aborted
        while aborted and aborted[0].first_offset <= offset:
            txn = aborted.popleft()
            self._ongoing_aborted.setdefault(txn.producer_id, [txn, False])

    def on_batch(self, header: rb.BatchHeader) -> bool:
        """A data batch; True when it belongs to an aborted transaction (it goes)."""
        if self._aborted and self._aborted[0].first_offset <= header.last_offset:
            self._begin_aborted_up_to(header.last_offset)
        if not header.attributes & rb.TRANSACTIONAL_FLAG:
            return False
        ongoing = self._ongoing_aborted.get(header.producer_id)
        if ongoing is not None:
            ongoing[1] = True
            return True
        self._ongoing_committed.add(header.producer_id)
        return False

    def on_marker(self, header: rb.BatchHeader, marker: ControlRecordType | None) -> bool:
        """A control batch; True when no batch of its transaction was seen (it may go, once its
        delete horizon passes)."""
        self._begin_aborted_up_to(header.last_offset)
        producer_id = header.producer_id
        if marker is ControlRecordType.ABORT:
            ongoing = self._ongoing_aborted.pop(producer_id, None)
            if ongoing is not None and ongoing[1]:
                self.index_entries.append(ongoing[0])
                return False
            return True
        if marker is ControlRecordType.COMMIT:
            if producer_id in self._ongoing_committed:
                self._ongoing_committed.discard(producer_id)
                return False
            return True
        return False


# A record as the scanner lays it out (a plain tuple: there are millions), and its fields' indexes.
_ParsedRecord = scanner.RecordLayout
_START: Final = 0  # where the record (its length varint) starts in the payload
_BODY: Final = 1  # where its attributes byte is
_AFTER_TIMESTAMP: Final = 2  # where its timestamp delta ends
_END: Final = 3
_OFFSET_DELTA: Final = 4
_TIMESTAMP_DELTA: Final = 5
_KEY: Final = 6
_HAS_VALUE: Final = 7  # False for a tombstone


class LogCleaner:
    def __init__(
        self, config: CleanerConfig | None = None, time_ms: Callable[[], int] = wall_clock_ms
    ) -> None:
        self.config = config or CleanerConfig()
        self._time_ms = time_ms
        self._stopping = threading.Event()
        self._slice_started = time.monotonic()
        # Per log dir: (topic, partition) -> first dirty offset. Guarded by _checkpoint_lock:
        # worker threads write the files.
        self._checkpoints: dict[Path, dict[tuple[str, int], int]] = {}
        self._checkpoint_lock = threading.Lock()
        # Earliest delete horizon of a tombstone each log keeps (known since this process started).
        self._tombstone_deadlines: weakref.WeakKeyDictionary[UnifiedLog, int] = weakref.WeakKeyDictionary()
        # Logs a round failed on (corrupt data, I/O error): left alone until restart, as in Kafka.
        self._uncleanable: weakref.WeakSet[UnifiedLog] = weakref.WeakSet()
        # Kafka's LogCleaner metrics: the largest dirty ratio of a compacted log at the last pass,
        # the longest round of the last pass that cleaned, when a pass last ran (wall ms, 0: never).
        self.max_dirty_ratio = 0.0
        self.max_clean_ms = 0
        self.last_run_ms = 0

    @property
    def uncleanable_count(self) -> int:
        """Logs a round failed on, left alone until a restart."""
        return len(self._uncleanable)

    # --- checkpoints ------------------------------------------------------------------

    def _dir_checkpoints(self, log_dir: Path) -> dict[tuple[str, int], int]:
        """The log dir's checkpoint entries, read on first use (call with the lock held)."""
        entries = self._checkpoints.get(log_dir)
        if entries is None:
            try:
                entries = OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).read()
            except KafkaStorageError as e:
                log.warning(
                    "ignoring unreadable cleaner checkpoint", extra={"log_dir": str(log_dir), "error": str(e)}
                )
                entries = {}
            self._checkpoints[log_dir] = entries
        return entries

    def checkpoint(self, log_: UnifiedLog) -> int | None:
        """The log's first dirty offset from the last round, if any."""
        with self._checkpoint_lock:
            return self._dir_checkpoints(log_.dir.parent).get((log_.topic, log_.partition))

    def _write_checkpoint(self, log_: UnifiedLog, offset: int | None) -> None:
        log_dir = log_.dir.parent
        with self._checkpoint_lock:
            entries = self._dir_checkpoints(log_dir)
            key = (log_.topic, log_.partition)
            if offset is None:
                if entries.pop(key, None) is None:
                    return
            else:
                entries[key] = offset
            OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).write(entries)

    def forget(self, log_: UnifiedLog) -> None:
        """A log is being deleted: drop its checkpoint entry so a new log of that name starts dirty."""
        self._uncleanable.discard(log_)
        self._tombstone_deadlines.pop(log_, None)
        self._write_checkpoint(log_, None)

    # --- choosing logs ----------------------------------------------------------------

    def log_to_clean(self, log_: UnifiedLog, now_ms: int | None = None) -> LogToClean | None:
        """The log's dirty section, or None if the log is not compacted or has nothing closed."""
        config = log_.config
        if not config.compact or log_.closed or log_ in self._uncleanable:
            return None
        now = self._time_ms() if now_ms is None else now_ms
        segments = log_.segments
        closed = segments[:-1]
        if not closed:
            return None
        log_start = log_.log_start_offset
        checkpoint = self.checkpoint(log_)
        first_dirty = log_start
        if checkpoint is not None and log_start <= checkpoint <= log_.log_end_offset:
            first_dirty = checkpoint
        first_uncleanable = segments[-1].base_offset
        first_unstable = log_.first_unstable_offset
        if first_unstable is not None:
            # Undecided or unreplicated transactions are never cleaned: nor is their segment.
            first_uncleanable = min(
                first_uncleanable,
                next((s.base_offset for s in segments if s.next_offset > first_unstable), first_uncleanable),
            )
        # The first segment holding an offset >= first_dirty (earlier rounds keep each
        # segment's last batch, so a segment's next offset is where the next one starts).
        dirty_from = next(
            (i for i, s in enumerate(closed) if s.next_offset > first_dirty or s.base_offset >= first_dirty),
            len(closed),
        )
        dirty = closed[dirty_from:]
        if config.min_compaction_lag_ms > 0:
            # Records younger than the lag stay dirty, with everything after them.
            horizon = now - config.min_compaction_lag_ms
            young = next((s for s in dirty if s.largest_timestamp > horizon), None)
            if young is not None:
                first_uncleanable = young.base_offset
        first_uncleanable = max(first_dirty, first_uncleanable)
        dirty = [s for s in dirty if s.base_offset < first_uncleanable]
        first_batch_times = [
            s.rolling_based_timestamp
            for s in closed[dirty_from:]
            if s.rolling_based_timestamp is not None and s.rolling_based_timestamp > 0
        ]
        need_now = bool(first_batch_times) and min(first_batch_times) < now - max(
            config.max_compaction_lag_ms, 0
        )
        clean_bytes = sum(s.size for s in closed[:dirty_from])
        deadline = self._tombstone_deadlines.get(log_)
        return LogToClean(
            log_,
            first_dirty,
            first_uncleanable,
            clean_bytes,
            sum(s.size for s in dirty),
            need_now,
            deadline is not None and now >= deadline and clean_bytes > 0,
        )

    # --- drivers ----------------------------------------------------------------------

    def clean_log(self, log_: UnifiedLog) -> CleanerStats | None:
        """Run a round on ``log_`` in the calling thread if it is due; its stats, or None."""
        rounds = self._round(log_)
        resume: Callable[[Any], Callable[[], Any]] = rounds.send
        result: Any = None
        while True:
            try:
                step = resume(result)
            except StopIteration as done:
                stats: CleanerStats | None = done.value
                return stats
            try:
                result, resume = step(), rounds.send
            except Exception as e:
                result, resume = e, rounds.throw

    async def clean_logs(self, logs: Iterable[UnifiedLog]) -> list[CleanerStats]:
        """One pass over ``logs``: clean every due log, dirtiest first (call on the event loop)."""
        now = self.last_run_ms = self._time_ms()
        candidates = [c for log_ in logs if (c := self.log_to_clean(log_, now)) is not None]
        self.max_dirty_ratio = max((c.cleanable_ratio for c in candidates), default=0.0)
        due = [c for c in candidates if c.due]
        due.sort(key=lambda c: c.cleanable_ratio, reverse=True)
        cleaned = []
        for candidate in due:
            stats = await self._clean_log_async(candidate.log)
            if stats is not None:
                cleaned.append(stats)
        if cleaned:  # as Kafka's max-clean-time-secs: the last pass that cleaned something
            self.max_clean_ms = max(stats.ms for stats in cleaned)
        return cleaned

    async def _clean_log_async(self, log_: UnifiedLog) -> CleanerStats | None:
        loop = asyncio.get_running_loop()
        rounds = self._round(log_)
        resume: Callable[[Any], Callable[[], Any]] = rounds.send
        result: Any = None
        while True:
            try:
                step = resume(result)
            except StopIteration as done:
                stats: CleanerStats | None = done.value
                return stats
            future = loop.run_in_executor(None, step)
            try:
                result, resume = await asyncio.shield(future), rounds.send
            except asyncio.CancelledError:
                # The broker is stopping: let the worker notice, then clean up behind it.
                self._stopping.set()
                with contextlib.suppress(Exception):
                    await future
                rounds.close()
                raise
            except Exception as e:
                result, resume = e, rounds.throw

    def stop(self) -> None:
        """Make rounds in progress abort at their next chunk (shutdown)."""
        self._stopping.set()

    # --- a round ----------------------------------------------------------------------

    def _round(self, log_: UnifiedLog) -> Generator[Callable[[], Any], Any, CleanerStats | None]:
        """One round; the code between yields runs on the caller's (event-loop) thread, the
        yielded steps on a worker thread. Returns the round's stats, or None if nothing ran."""
        target = self.log_to_clean(log_)
        if target is None or not target.due:
            return None
        rnd = self._plan(target)
        try:
            yield partial(self._build_offset_map, rnd)
            for group in rnd.groups:
                cleaned: _CleanedSegment | None = yield partial(self._clean_group, rnd, group)
                if cleaned is None:
                    continue
                swapped = log_.replace_segments([r.segment for r in group], [r.size for r in group])
                if swapped is None:
                    raise CleaningAbortedError("the log changed under the cleaner")
                yield partial(_unlink_all, swapped[1])
                rnd.stats.segments_before += len(group)
                rnd.stats.segments_after += 1
                rnd.stats.bytes_before += sum(r.size for r in group)
                rnd.stats.bytes_after += cleaned.size
            yield partial(self._finish_round, rnd)
        except CleaningAbortedError as e:
            self._discard(rnd)
            log.debug("log cleaning aborted", extra={"log": log_.dir.name, "reason": str(e)})
            return None
        except GeneratorExit:
            self._discard(rnd)
            raise
        except Exception as e:
            self._discard(rnd)
            if log_.closed:
                log.debug("log cleaning aborted: the log closed", extra={"log": log_.dir.name})
                return None
            self._uncleanable.add(log_)
            log.error(
                "log cleaning failed; the log will not be cleaned again until restart",
                extra={"log": log_.dir.name, "error": f"{type(e).__name__}: {e}"},
                # A storage error explains itself; anything else is a bug worth its traceback.
                exc_info=not isinstance(e, StorageError | OSError | CompressionError),
            )
            return None
        if rnd.tombstone_deadline is None:
            self._tombstone_deadlines.pop(log_, None)
        else:
            self._tombstone_deadlines[log_] = rnd.tombstone_deadline
        stats = rnd.stats
        stats.ms = int((time.monotonic() - rnd.started) * 1000)
        log.log(
            logging.INFO if stats.segments_before else logging.DEBUG,  # quiet when nothing changed
            "cleaned log",
            extra={
                "log": log_.dir.name,
                "dirty": f"[{stats.first_dirty_offset},{stats.end_offset})",
                "segments": f"{stats.segments_before}->{stats.segments_after}",
                "bytes_before": stats.bytes_before,
                "bytes_after": stats.bytes_after,
                "records_removed": stats.records_removed,
                "tombstones_removed": stats.tombstones_removed,
                "ms": stats.ms,
            },
        )
        return stats

    def _plan(self, target: LogToClean) -> _Round:
        log_ = target.log
        refs = []
        for segment in log_.segments[:-1]:
            if segment.base_offset >= target.first_uncleanable_offset:
                break
            refs.append(
                _SegmentRef(
                    segment,
                    segment.base_offset,
                    segment.next_offset,
                    segment.size,
                    segment.log_path,
                    segment.offset_index.size_in_bytes,
                    segment.time_index.size_in_bytes,
                )
            )
        first_dirty = target.first_dirty_offset
        dirty = [r for r in refs if r.next_offset > first_dirty or r.base_offset >= first_dirty]
        start = 0
        if dirty and first_dirty > dirty[0].base_offset:
            start = dirty[0].segment.offset_index.lookup(first_dirty).position
        memory = int(self.config.dedupe_buffer_size * self.config.io_buffer_load_factor)
        return _Round(
            target=target,
            config=log_.config,
            now=self._time_ms(),
            segments=refs,
            dirty=dirty,
            dirty_start_position=start,
            producer_last_offsets={
                pid: entry.last_offset for pid, entry in log_.producer_state.active_producers.items()
            },
            aborted=(
                log_.collect_aborted_transactions(refs[0].base_offset, target.first_uncleanable_offset)
                if refs
                else []
            ),
            offset_map=OffsetMap(memory, first_dirty - 1),
            stats=CleanerStats(log_.dir.name, first_dirty),
            started=time.monotonic(),
        )

    def _discard(self, rnd: _Round) -> None:
        for path in rnd.created:
            with contextlib.suppress(OSError):
                os.unlink(path)

    # --- worker-thread steps ------------------------------------------------------------

    def _build_offset_map(self, rnd: _Round) -> None:
        offset_map = rnd.offset_map
        put = offset_map.put
        first_dirty = rnd.target.first_dirty_offset
        full = False
        transactions = _CleanedTransactions(txn for txn in rnd.aborted if txn.last_offset >= first_dirty)
        for i, ref in enumerate(rnd.dirty):
            start = rnd.dirty_start_position if i == 0 else 0
            for header, view in self._batches(rnd, ref, start):
                if header.last_offset < first_dirty:
                    continue
                if header.is_control:
                    transactions.on_marker(header, self._marker(header, view))
                elif not transactions.on_batch(header):  # aborted records shadow nothing
                    base = header.base_offset
                    for record in self._records(header, view)[1]:
                        key = record[_KEY]
                        offset = base + record[_OFFSET_DELTA]
                        if key is not None and offset >= first_dirty and not put(key, offset):
                            full = True
                            break
                    if full:
                        break
                offset_map.latest_offset = max(offset_map.latest_offset, header.last_offset)
            if full:
                break
            # Offsets after the segment's last batch (a gap left by earlier cleaning) are covered too.
            following = rnd.dirty[i + 1].base_offset if i + 1 < len(rnd.dirty) else None
            end = following if following is not None else rnd.target.first_uncleanable_offset
            offset_map.latest_offset = max(offset_map.latest_offset, end - 1)
        if full and offset_map.latest_offset < first_dirty:
            raise KafkaStorageError(
                f"log.cleaner.dedupe.buffer.size is too small to map one batch of {rnd.log.dir.name}"
            )
        rnd.stats.end_offset = offset_map.latest_offset + 1
        rnd.groups = self._group_segments(
            [r for r in rnd.segments if r.base_offset < rnd.stats.end_offset], rnd.config
        )

    @staticmethod
    def _group_segments(refs: list[_SegmentRef], config: LogConfig) -> list[list[_SegmentRef]]:
        """Consecutive segments whose sum stays under segment.bytes, the index size and 2^31 offsets."""
        groups: list[list[_SegmentRef]] = []
        i = 0
        while i < len(refs):
            group = [refs[i]]
            size, index_bytes, time_bytes = refs[i].size, refs[i].index_bytes, refs[i].time_index_bytes
            i += 1
            while i < len(refs):
                ref = refs[i]
                if (
                    size + ref.size > config.segment_bytes
                    or index_bytes + ref.index_bytes > config.segment_index_bytes
                    or time_bytes + ref.time_index_bytes > config.segment_index_bytes
                    or (ref.size and ref.next_offset - 1 - group[0].base_offset > INT32_MAX)
                ):
                    break
                group.append(ref)
                size, index_bytes, time_bytes = (
                    size + ref.size,
                    index_bytes + ref.index_bytes,
                    time_bytes + ref.time_index_bytes,
                )
                i += 1
            groups.append(group)
        return groups

    def _clean_group(self, rnd: _Round, group: list[_SegmentRef]) -> _CleanedSegment | None:
        """Write the group's kept batches to ``<base>.{log,index,timeindex}.cleaned``."""
        base = group[0].base_offset
        end = group[-1].next_offset
        log_path = rnd.log.dir / (file_name(base, LOG_SUFFIX) + CLEANED_SUFFIX)
        writer = _SegmentWriter(log_path, base, rnd.config, self.config.io_buffer_size)
        txn_index_path = rnd.log.dir / (file_name(base, TXN_INDEX_SUFFIX) + CLEANED_SUFFIX)
        rnd.created += [log_path, *writer.index_paths, txn_index_path]
        transactions = _CleanedTransactions(
            txn for txn in rnd.aborted if txn.last_offset >= base and txn.first_offset < end
        )
        try:
            last: tuple[rb.BatchHeader, memoryview] | None = None
            last_dropped = False
            changed = len(group) > 1
            for ref in group:
                for header, view in self._batches(rnd, ref, 0):
                    changed = changed or last_dropped  # a dropped batch that was not the last
                    last = header, view
                    kept = self._filter_batch(rnd, header, view, transactions)
                    last_dropped = kept is None
                    if kept is None:
                        continue
                    changed = changed or kept[0] is not view
                    writer.append(kept[0], header.base_offset, header.last_offset, kept[1])
                    self._throttle(rnd, len(kept[0]))
            if last is not None and last_dropped:
                # The group's last batch went: keep its header so the segment's range stays
                # whole (as it is, if it already was only a header).
                header, view = last
                emptied = _empty_batch(header) if header.records_count else view
                changed = changed or emptied is not view
                writer.append(emptied, header.base_offset, header.last_offset, header.max_timestamp)
            if not changed:
                # An empty segment, or one this round keeps as it is: no swap needed.
                writer.abandon()
                os.unlink(log_path)
                return None
            size = writer.finish()
            # Written even when empty: the swap protocol tells by its .swap which index is new.
            index = TransactionIndex(txn_index_path, base, exists=False)
            for txn in transactions.index_entries:
                index.append(txn)
            txn_index_path.touch()
            _fsync_path(txn_index_path)
        except BaseException:
            writer.abandon()
            raise
        # Like Kafka, the cleaned segment keeps the last replaced file's modification time
        # (retention falls back to it for segments without timestamps).
        with contextlib.suppress(FileNotFoundError):
            mtime = os.stat(group[-1].path).st_mtime_ns
            os.utime(log_path, ns=(mtime, mtime))
        return _CleanedSegment(base, size)

    def _finish_round(self, rnd: _Round) -> None:
        log_ = rnd.log
        if log_.closed:
            raise CleaningAbortedError("the log closed")
        fsync_dir(log_.dir)  # the swaps' renames
        self._write_checkpoint(log_, rnd.stats.end_offset)

    # --- reading and filtering batches ----------------------------------------------------

    def _check_running(self, rnd: _Round) -> None:
        if self._stopping.is_set():
            raise CleaningAbortedError("the cleaner is stopping")
        if rnd.log.closed:
            raise CleaningAbortedError("the log closed")

    def _yield_gil(self) -> None:
        """Step off the CPU briefly every GIL_SLICE_S of work, so the event loop never waits
        for the interpreter's 5 ms switch interval to take the GIL back from this thread."""
        now = time.monotonic()
        if now - self._slice_started >= GIL_SLICE_S:
            time.sleep(GIL_PAUSE_S)
            self._slice_started = time.monotonic()

    def _throttle(self, rnd: _Round, nbytes: int) -> None:
        """log.cleaner.io.max.bytes.per.second: sleep while reads and writes run ahead of the rate."""
        rnd.bytes_done += nbytes
        rate = self.config.io_max_bytes_per_second
        if rate >= sys.float_info.max:
            return
        # Waits in slices on the stopping event, re-reading the rate (a dynamic change applies at
        # once): whatever the rate, shutdown interrupts the wait within one slice.
        while True:
            self._check_running(rnd)
            rate = self.config.io_max_bytes_per_second
            ahead = rnd.bytes_done / rate - (time.monotonic() - rnd.started)
            if ahead <= 0.01 or rate >= sys.float_info.max:
                return
            self._stopping.wait(min(ahead, THROTTLE_SLICE_S))

    def _batches(
        self, rnd: _Round, ref: _SegmentRef, start: int
    ) -> Iterator[tuple[rb.BatchHeader, memoryview]]:
        """The batches of a closed segment from ``start``, read through the cleaner's own descriptor.

        Each batch comes as its header (``position`` is where it starts in a read buffer, so
        not of use) and its bytes. A file that is shorter than the
        round saw it (truncated meanwhile) aborts the round; the swap would refuse it anyway.
        """
        try:
            fd = os.open(ref.path, os.O_RDONLY)
        except FileNotFoundError:
            raise CleaningAbortedError(f"segment {ref.path.name} is gone") from None
        try:
            position, need = start, 0
            while position < ref.size:
                self._check_running(rnd)
                want = min(max(self.config.io_buffer_size, need), ref.size - position)
                buf = os.pread(fd, want, position)
                if len(buf) < want:
                    raise CleaningAbortedError(f"segment {ref.path.name} shrank")
                self._throttle(rnd, want)
                view = memoryview(buf)
                offset = 0
                while len(buf) - offset >= rb.HEADER_SIZE:
                    header = rb.read_header(view, offset)
                    end = offset + header.size
                    if end > len(buf):
                        need = header.size
                        break
                    yield header, view[offset:end]
                    offset = end
                    self._yield_gil()
                else:
                    need = rb.HEADER_SIZE
                if offset == 0 and want == ref.size - position:
                    raise CorruptRecordError(f"{ref.path.name}: truncated batch at position {position}")
                position += offset
        finally:
            os.close(fd)

    @staticmethod
    def _records(header: rb.BatchHeader, view: memoryview) -> tuple[scanner.BytesLike, list[_ParsedRecord]]:
        """The batch's (decompressed) record bytes and its records, parsed by the record scanner;
        checks the CRC."""
        try:
            data, start, end = scanner.batch_records(view, header, position=0)
            return data, scanner.layout(data, start, end, header.records_count, header.last_offset_delta)
        except (rb.InvalidBatchError, scanner.RecordError) as e:
            raise CorruptRecordError(f"malformed batch at offset {header.base_offset}: {e}") from e

    @staticmethod
    def _marker(header: rb.BatchHeader, view: memoryview) -> ControlRecordType | None:
        """The type of a control batch's marker; None for an emptied one or another type."""
        try:
            marker = batch_end_txn_marker(view)
        except rb.InvalidBatchError as e:
            raise CorruptRecordError(f"malformed control batch at offset {header.base_offset}: {e}") from e
        return None if marker is None else marker.type

    def _keep_horizon(self, rnd: _Round, horizon: int) -> None:
        """A batch kept until ``horizon``: the log is cleanable again once it passes."""
        if rnd.tombstone_deadline is None or horizon < rnd.tombstone_deadline:
            rnd.tombstone_deadline = horizon

    def _filter_marker(
        self, rnd: _Round, header: rb.BatchHeader, view: memoryview, transactions: _CleanedTransactions
    ) -> tuple[bytes | bytearray | memoryview, int] | None:
        """A transaction marker stays while batches of its transaction do; then it stays
        ``delete.retention.ms`` longer (a delete horizon, as tombstones get) and goes."""
        if not transactions.on_marker(header, self._marker(header, view)):
            return view, header.max_timestamp
        if header.attributes & rb.DELETE_HORIZON_FLAG:
            if rnd.now >= header.base_timestamp:
                return None
            self._keep_horizon(rnd, header.base_timestamp)
            return view, header.max_timestamp
        horizon = rnd.now + rnd.config.delete_retention_ms
        self._keep_horizon(rnd, horizon)
        data, records = self._records(header, view)
        return _rebuild_batch(header, data, records, horizon)

    def _filter_batch(
        self, rnd: _Round, header: rb.BatchHeader, view: memoryview, transactions: _CleanedTransactions
    ) -> tuple[bytes | bytearray | memoryview, int] | None:
        """The batch as it goes into the cleaned segment with its max timestamp, or None to drop it."""
        stats = rnd.stats
        if header.attributes & rb.CONTROL_FLAG:
            return self._filter_marker(rnd, header, view, transactions)
        if transactions.on_batch(header):
            # An aborted transaction's batch goes whole (its producer's last stays as a header).
            stats.records_read += header.records_count
            stats.records_removed += header.records_count
            if rnd.producer_last_offsets.get(header.producer_id) == header.last_offset:
                return (_empty_batch(header) if header.records_count else view), header.max_timestamp
            return None
        latest = rnd.offset_map.latest_offset
        if header.base_offset > latest:
            return view, header.max_timestamp
        data, records = self._records(header, view)
        stats.records_read += len(records)
        now = rnd.now
        offsets = rnd.offset_map.offsets
        has_horizon = bool(header.attributes & rb.DELETE_HORIZON_FLAG)
        horizon_passed = has_horizon and now >= header.base_timestamp
        base = header.base_offset
        kept = []
        tombstones = 0
        for record in records:
            offset = base + record[_OFFSET_DELTA]
            if offset <= latest:
                key = record[_KEY]
                if key is None or offset < offsets.get(key, -1):
                    continue
                if not record[_HAS_VALUE] and horizon_passed:
                    stats.tombstones_removed += 1
                    continue
            if not record[_HAS_VALUE]:
                tombstones += 1
            kept.append(record)
        stats.records_removed += len(records) - len(kept)
        stamp = tombstones > 0 and not has_horizon
        if tombstones:
            self._keep_horizon(rnd, now + rnd.config.delete_retention_ms if stamp else header.base_timestamp)
        if records and len(kept) == len(records) and not stamp:
            return view, header.max_timestamp
        if not kept:
            if (
                header.has_producer_id
                and rnd.producer_last_offsets.get(header.producer_id) == header.last_offset
            ):
                return (_empty_batch(header) if records else view), header.max_timestamp
            return None
        return _rebuild_batch(header, data, kept, now + rnd.config.delete_retention_ms if stamp else None)


class _SegmentWriter:
    """Writes a cleaned segment's log file and, at the end, its offset and time indexes."""

    def __init__(self, path: Path, base_offset: int, config: LogConfig, buffer_size: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.next_offset = base_offset
        self.index_paths = [
            path.with_name(file_name(base_offset, suffix) + CLEANED_SUFFIX)
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
        ]
        self._interval = config.index_interval_bytes
        self._max_index_bytes = config.segment_index_bytes
        self._buffer_size = buffer_size
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._buffer = bytearray()
        self._position = 0
        self._since_index_entry = 0
        self._max_timestamp = rb.NO_TIMESTAMP
        self._offset_of_max_timestamp = base_offset
        self._offset_entries: list[tuple[int, int]] = []
        self._time_entries: list[tuple[int, int]] = []

    def append(
        self, data: bytes | bytearray | memoryview, base_offset: int, last_offset: int, max_timestamp: int
    ) -> None:
        # The same sparse indexing as LogSegment's appends.
        if max_timestamp > self._max_timestamp:
            self._max_timestamp, self._offset_of_max_timestamp = max_timestamp, last_offset
        if (
            self._since_index_entry > self._interval
            and (len(self._offset_entries) + 1) * 8 <= self._max_index_bytes
            and (len(self._time_entries) + 2) * 12 <= self._max_index_bytes
        ):
            self._offset_entries.append((base_offset, self._position))
            if not self._time_entries or self._max_timestamp > self._time_entries[-1][0]:
                self._time_entries.append((self._max_timestamp, self._offset_of_max_timestamp))
            self._since_index_entry = 0
        self._since_index_entry += len(data)
        self._buffer += data
        self._position += len(data)
        self.next_offset = last_offset + 1
        if len(self._buffer) >= self._buffer_size:
            self._flush_buffer()

    def _flush_buffer(self) -> None:
        view = memoryview(self._buffer)
        written = 0
        while written < len(view):
            written += os.write(self._fd, view[written:])
        del view
        self._buffer.clear()

    def finish(self) -> int:
        """Write out and fsync the log and its indexes; returns the log's size."""
        self._flush_buffer()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        if self._max_timestamp >= 0 and (
            not self._time_entries or self._max_timestamp > self._time_entries[-1][0]
        ):
            self._time_entries.append((self._max_timestamp, self._offset_of_max_timestamp))
        index_path, time_index_path = self.index_paths
        offset_index = OffsetIndex(index_path, self.base_offset, max(8, len(self._offset_entries) * 8))
        offset_index.create()
        for offset, position in self._offset_entries:
            offset_index.append(offset, position)
        time_index = TimeIndex(time_index_path, self.base_offset, (len(self._time_entries) + 1) * 12)
        time_index.create()
        for timestamp, offset in self._time_entries:
            time_index.maybe_append(timestamp, offset, skip_full_check=True)
        for index in (offset_index, time_index):
            index.flush()
            index.close()
            _fsync_path(index.path)
        return self._position

    def abandon(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _unlink_all(paths: Iterable[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- record-level encoding -----------------------------------------------------------------


def _assemble(
    header: rb.BatchHeader,
    records: bytes | bytearray,
    *,
    attributes: int,
    base_timestamp: int,
    max_timestamp: int,
    records_count: int,
) -> bytearray:
    """A v2 batch with ``header``'s offsets, producer fields and leader epoch around ``records``
    (compressed with the codec in ``attributes``)."""
    return scanner.assemble_batch(
        records,
        base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        records_count=records_count,
    )


def _empty_batch(header: rb.BatchHeader) -> bytearray:
    """The batch's header with no records: what a producer's state and offset ranges need of it."""
    return _assemble(
        header,
        b"",
        attributes=header.attributes & _EMPTY_BATCH_ATTRIBUTES,
        base_timestamp=header.max_timestamp,
        max_timestamp=header.max_timestamp,
        records_count=0,
    )


def _rebuild_batch(
    header: rb.BatchHeader, data: scanner.BytesLike, kept: list[_ParsedRecord], horizon: int | None
) -> tuple[bytearray, int]:
    """Re-encode a batch with only ``kept`` records (and a new delete horizon, if given)."""
    payload = bytearray()
    base_timestamp = header.base_timestamp
    if horizon is None:
        for record in kept:
            payload += data[record[_START] : record[_END]]
    else:
        # baseTimestamp becomes the horizon: re-express each record's timestamp against it.
        body = bytearray()
        for record in kept:
            del body[:]
            body.append(data[record[_BODY]])  # the record's attributes
            write_varint(body, base_timestamp + record[_TIMESTAMP_DELTA] - horizon)
            body += data[record[_AFTER_TIMESTAMP] : record[_END]]
            write_varint(payload, len(body))
            payload += body
    if header.timestamp_type == rb.TimestampType.LOG_APPEND_TIME:
        max_timestamp = header.max_timestamp
    else:
        max_timestamp = max(base_timestamp + record[_TIMESTAMP_DELTA] for record in kept)
    attributes = header.attributes | (rb.DELETE_HORIZON_FLAG if horizon is not None else 0)
    batch = _assemble(
        header,
        payload,
        attributes=attributes,
        base_timestamp=base_timestamp if horizon is None else horizon,
        max_timestamp=max_timestamp,
        records_count=len(kept),
    )
    return batch, max_timestamp
