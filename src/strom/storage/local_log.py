"""LocalLog: the segments of one partition's directory ``<topic>-<partition>`` (Kafka's LocalLog).

It appends batches whose offsets and leader epochs are already set, reads whole batches, rolls,
truncates and deletes segments, swaps in the cleaner's, renames the directory to delete it, and
keeps the recovery point (everything below it is fsynced). Which offsets are visible (the log
start offset), leader epochs and producer state are UnifiedLog's, which owns one LocalLog;
opening a directory is LogLoader's.

Threading: everything runs on the broker's event-loop thread except ``flush``, which a worker
thread may call while the loop appends, and the truncations the broker submits to the log's
serial I/O executor (UnifiedLog.io). ``flush`` only fsyncs file descriptors (each segment
serialises that with its own close) and reads the segment list under ``_lock``, the only lock
that list mutations take; truncation holds ``flush_lock`` so no flush moves the recovery point
past it.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from strom.records import batch as rb
from strom.storage.checkpoint import fsync_dir
from strom.storage.errors import CorruptRecordError, KafkaStorageError
from strom.storage.log_config import LogConfig
from strom.storage.log_dir_failure import LogDirFailureChannel
from strom.storage.log_segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    file_name,
    new_segment,
)
from strom.storage.transaction_index import TXN_INDEX_SUFFIX

log = logging.getLogger(__name__)

DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

# Inactive segments whose index entries reads loaded stay in memory up to this many per log,
# least recently read released first (a 1 GiB segment's indexes hold about 5 MiB of entries).
MAX_LOADED_INACTIVE_INDEXES = 8


def parse_topic_partition(dir_name: str) -> tuple[str, int]:
    """``my-topic-3`` -> ("my-topic", 3). Raises ValueError for other names."""
    topic, sep, partition = dir_name.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        raise ValueError(f"{dir_name!r} is not a <topic>-<partition> log directory name")
    return topic, int(partition)


# The longest file name Linux's file systems take, in bytes.
MAX_FILE_NAME_BYTES = 255
DELETE_SUFFIX = "-delete"
STRAY_SUFFIX = "-stray"


def renamed_dir_name(dir_name: str, suffix: str) -> str:
    """The name a log directory is renamed to before it is deleted or set aside:
    ``<topic>-<partition>.<unique id><suffix>``, the topic cut short (as Kafka's LocalLog does) so
    that the name fits a file name's 255 bytes even for a topic name of 249 characters."""
    try:
        topic, partition = parse_topic_partition(dir_name)
        tail = f"-{partition}.{uuid.uuid4().hex}{suffix}"
    except ValueError:
        topic, tail = dir_name, f".{uuid.uuid4().hex}{suffix}"
    room = MAX_FILE_NAME_BYTES - len(tail.encode())
    return topic.encode()[:room].decode(errors="ignore") + tail


@dataclass(frozen=True, slots=True)
class FetchDataInfo:
    fetch_offset: int
    records: bytes


@dataclass(frozen=True, slots=True)
class TimestampAndOffset:
    timestamp: int
    offset: int
    leader_epoch: int | None


def create_segment(dir: Path, base_offset: int, config: LogConfig, now_ms: int) -> LogSegment:
    """A new, empty segment at ``base_offset``, replacing any files left at that name."""
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
        (dir / file_name(base_offset, suffix)).unlink(missing_ok=True)
    return new_segment(
        dir,
        base_offset,
        index_interval_bytes=config.index_interval_bytes,
        max_index_size=config.segment_index_bytes,
        segment_jitter_ms=config.segment_jitter_ms,
        now_ms=now_ms,
    )


def open_segment(
    dir: Path, base_offset: int, config: LogConfig, now_ms: int, txn_index_exists: bool | None = None
) -> LogSegment:
    """The segment whose files are at ``base_offset`` in ``dir`` (``txn_index_exists``: see LogSegment)."""
    return LogSegment(
        dir,
        base_offset,
        index_interval_bytes=config.index_interval_bytes,
        max_index_size=config.segment_index_bytes,
        roll_jitter_ms=0,
        now_ms=now_ms,
        txn_index_exists=txn_index_exists,
    )


class LocalLog:
    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        segments: list[LogSegment],
        recovery_point: int,
        time_ms: Callable[[], int],
    ) -> None:
        if not segments:
            raise ValueError(f"log {dir.name} needs a segment")
        self.dir = dir
        self.log_dir = dir.parent
        self.topic, self.partition = parse_topic_partition(dir.name)
        self.config = config
        self.time_ms = time_ms
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        self._loaded_indexes: collections.OrderedDict[int, LogSegment] = collections.OrderedDict()
        self._lock = threading.Lock()
        # Held by truncations (UnifiedLog's hold it over their epoch and producer-state work too)
        # and by close, so that no flush moves the recovery point past them.
        self.flush_lock = threading.RLock()
        self.recovery_point = recovery_point
        self.last_flush_ms = time_ms()
        self._roll_flush_pending = False
        self._closed = False
        # (when due, path): files of deleted segments, renamed ``.deleted``, that
        # delete_pending_files unlinks off the loop once file.delete.delay.ms has passed.
        self._files_to_delete: list[tuple[int, Path]] = []
        # LogManager shares one channel between its logs; a log on its own has its own.
        self.log_dir_failure_channel = LogDirFailureChannel()

    def _new_segment(self, base_offset: int) -> LogSegment:
        return create_segment(self.dir, base_offset, self.config, self.time_ms())

    # --- basic properties ---------------------------------------------------------

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segments)

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    def _add_segment(self, segment: LogSegment) -> None:
        with self._lock:
            self._segments.append(segment)
            self._bases.append(segment.base_offset)

    def _floor_segment_index(self, offset: int) -> int:
        return max(bisect.bisect_right(self._bases, offset) - 1, 0)

    def segments_from(self, offset: int) -> list[LogSegment]:
        """The segment holding ``offset`` (the first, below it) and every later one."""
        return self._segments[self._floor_segment_index(offset) :]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def offline(self) -> bool:
        """The log's dir failed an I/O operation: nothing is read or written until a restart."""
        channel = self.log_dir_failure_channel
        return channel.any_offline and channel.is_offline(self.log_dir)

    def check_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log {self.dir.name} is closed")
        if self.offline:
            raise self.log_dir_failure_channel.offline_error(self.log_dir)

    def log_dir_failed(self, what: str, cause: OSError) -> KafkaStorageError:
        """Take the log's dir offline (once) for ``cause``; the error to raise."""
        return self.log_dir_failure_channel.maybe_add_offline_log_dir(
            self.log_dir, f"{what} on {self.dir.name}", cause
        )

    # --- appending ------------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview],
        headers: list[rb.BatchHeader],
    ) -> None:
        """Append whole batches to the active segment; their offsets continue the log end."""
        self.active_segment.append(data, headers)

    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset (no-op if the active one is empty)."""
        active = self.active_segment
        if active.size == 0:
            return active
        new_base = self.log_end_offset
        active.on_become_inactive()
        self._note_index_use(active)
        segment = self._new_segment(new_base)
        self._add_segment(segment)
        self._roll_flush_pending = True
        log.debug("rolled segment", extra={"log": self.dir.name, "base_offset": new_base})
        return segment

    # --- flushing -------------------------------------------------------------------

    @property
    def unflushed_messages(self) -> int:
        return self.log_end_offset - self.recovery_point

    @property
    def flush_messages_due(self) -> bool:
        """flush.messages unflushed records are waiting: flush before acknowledging them."""
        return self.unflushed_messages >= self.config.flush_messages

    def flush_due(self, now_ms: int) -> bool:
        """True when a rolled segment awaits its flush or flush.ms has passed with unflushed data."""
        if self._closed or self.offline:
            return False
        if self._roll_flush_pending:
            return True
        return self.unflushed_messages > 0 and now_ms - self.last_flush_ms >= self.config.flush_ms

    def flush(self, up_to: int | None = None) -> None:
        """fsync everything below ``up_to`` (default: the log end) and advance the recovery point.

        Safe to call from a worker thread while the event loop appends: it reads the
        log end before syncing, and only data written before that is counted.
        """
        with self.flush_lock:
            if self._closed:
                return
            log_end = self.log_end_offset
            target = log_end if up_to is None else min(up_to, log_end)
            if up_to is None or target >= self.active_segment.base_offset:
                self._roll_flush_pending = False
            if target <= self.recovery_point:
                return
            with self._lock:
                segments = [
                    s
                    for s in self._segments
                    if s.next_offset > self.recovery_point and s.base_offset < target
                ]
            for segment in segments:
                segment.flush()
            try:
                fsync_dir(self.dir)  # new segment files' directory entries
            except OSError as e:
                raise KafkaStorageError(f"error flushing {self.dir}: {e}") from e
            with self._lock:
                self.recovery_point = max(self.recovery_point, target)
            self.last_flush_ms = self.time_ms()

    # --- reading ----------------------------------------------------------------------

    def read(
        self, fetch_offset: int, max_bytes: int, max_offset: int | None = None, min_one_batch: bool = True
    ) -> FetchDataInfo:
        """Whole batches from the one containing ``fetch_offset``, below ``max_offset`` (the HW);
        nothing at or beyond the log end."""
        if fetch_offset >= self.log_end_offset or (max_offset is not None and fetch_offset >= max_offset):
            return FetchDataInfo(fetch_offset, b"")
        for segment in self._segments[self._floor_segment_index(fetch_offset) :]:
            max_position = segment.size
            if max_offset is not None and max_offset < segment.next_offset:
                max_position = segment.position_of(max_offset)
            data = segment.read(fetch_offset, max_bytes, max_position, min_one_batch)
            self._note_index_use(segment)
            if data is not None:
                return FetchDataInfo(fetch_offset, data)
        return FetchDataInfo(fetch_offset, b"")

    def _note_index_use(self, segment: LogSegment) -> None:
        """Keep the indexes of the few inactive segments read last in memory; release older ones."""
        if segment is self._segments[-1]:
            return
        loaded = self._loaded_indexes
        key = id(segment)  # the dict holds the segment, so its id stays its own
        if key in loaded:
            loaded.move_to_end(key)
            return
        loaded[key] = segment
        if len(loaded) > MAX_LOADED_INACTIVE_INDEXES:
            loaded.popitem(last=False)[1].release_indexes()

    def offset_for_timestamp(self, timestamp: int, log_start_offset: int) -> TimestampAndOffset | None:
        """The first record at or after ``log_start_offset`` whose timestamp is >= ``timestamp``."""
        for segment in self._segments:
            if segment.max_timestamp_so_far >= timestamp:
                # Compaction can leave a segment whose newest records (or batches emptied
                # down to their header) are gone: go on to the next segment then.
                found = self._search_segment(segment, timestamp, log_start_offset)
                if found is not None:
                    return found
        return None

    def max_timestamp_and_offset(self, log_start_offset: int) -> TimestampAndOffset | None:
        """The first record at or after ``log_start_offset`` with the log's largest timestamp."""
        segment = max(self._segments, key=lambda s: s.max_timestamp_so_far)
        if segment.max_timestamp_so_far < 0:
            return None
        return self._search_segment(segment, segment.max_timestamp_so_far, log_start_offset, exact=True)

    def _search_segment(
        self, segment: LogSegment, target: int, log_start_offset: int, exact: bool = False
    ) -> TimestampAndOffset | None:
        """First record in ``segment`` at or after log start with timestamp >= target (== target if exact)."""
        from strom.records import scanner

        start = max(segment.time_index.lookup(target).offset, log_start_offset)
        position = segment.offset_index.lookup(start).position
        self._note_index_use(segment)
        for batch in segment.scan(position):
            header = batch.header
            if header.max_timestamp < target or header.last_offset < log_start_offset:
                continue
            epoch = header.partition_leader_epoch if header.partition_leader_epoch >= 0 else None
            if header.timestamp_type == rb.TimestampType.LOG_APPEND_TIME:
                return TimestampAndOffset(
                    header.max_timestamp, max(header.base_offset, log_start_offset), epoch
                )
            try:
                # Decompression is bounded (compression.MAX_DECOMPRESSED_BATCH_BYTES); the layout
                # gives offsets and timestamps without copying values.
                data, begin, end = scanner.batch_records(batch.data, header, verify_crc=False, position=0)
                records = scanner.layout(data, begin, end, header.records_count, header.last_offset_delta)
            except (rb.InvalidBatchError, scanner.RecordError) as e:
                raise CorruptRecordError(f"cannot decode batch at offset {header.base_offset}: {e}") from e
            for record in records:
                offset = header.base_offset + record[4]
                timestamp = header.base_timestamp + record[5]
                if offset >= log_start_offset and (timestamp == target if exact else timestamp >= target):
                    return TimestampAndOffset(timestamp, offset, epoch)
        return None

    # --- deleting segments ----------------------------------------------------------------

    def deletable_segments(
        self, predicate: Callable[[LogSegment], bool], upper_bound: int
    ) -> list[LogSegment]:
        """The oldest segments, in order, for which ``predicate`` holds and that end at or below
        ``upper_bound``; never an empty active segment."""
        deletable = []
        for i, segment in enumerate(self._segments):
            is_last = i == len(self._segments) - 1
            if is_last and segment.size == 0:
                break
            if segment.next_offset > upper_bound or not predicate(segment):
                break
            deletable.append(segment)
        return deletable

    def delete_segments(self, deletable: list[LogSegment]) -> None:
        """Take ``deletable`` (not all of the log's segments) out of the log and rename their files
        ``.deleted``; delete_pending_files unlinks them after file.delete.delay.ms."""
        with self._lock:
            gone = {id(s) for s in deletable}
            self._segments = [s for s in self._segments if id(s) not in gone]
            self._bases = [s.base_offset for s in self._segments]
        renamed = [path for segment in deletable for path in segment.rename_to_deleted(DELETED_SUFFIX)]
        due_ms = self.time_ms() + self.config.file_delete_delay_ms
        with self._lock:
            self._files_to_delete.extend((due_ms, path) for path in renamed)

    def replace_segments(
        self, old: Sequence[LogSegment], sizes: Sequence[int]
    ) -> tuple[LogSegment, list[Path]] | None:
        """Swap in the cleaner's ``<base>.{log,index,timeindex}.cleaned`` files for ``old``.

        ``old`` are consecutive closed segments, the first at ``<base>``, and ``sizes`` their
        sizes when the cleaner read them. Returns the new segment and the replaced files, renamed
        ``.deleted``, for the caller to unlink off the event loop (unlinking a large file takes
        tens of milliseconds); startup removes any left behind. Returns None, touching nothing, if the log changed
        since (closed, retention or truncation removed or cut one of them); the caller then
        deletes its files. Runs on the event-loop thread, where reads run, so no read ever
        sees a segment closed under it.

        Crash safety: renaming the cleaned log to ``.log.swap`` commits the swap. Then the
        replaced segments' files are renamed ``.deleted`` (indexes before logs), the swap
        files take their final names; the caller removes the ``.deleted`` files. A crash before
        the commit leaves the old segments (startup deletes ``.cleaned`` files); after it,
        LogLoader finishes the job at startup.
        """
        if self._closed or not old:
            return None
        start = next((i for i, s in enumerate(self._segments) if s is old[0]), None)
        if start is None or start + len(old) >= len(self._segments):  # never the active segment
            return None
        current = self._segments[start : start + len(old)]
        if any(a is not b or a.size != size for a, b, size in zip(current, old, sizes, strict=True)):
            return None
        base = old[0].base_offset
        # The log last: its rename commits. The cleaner writes a transaction index for every
        # cleaned segment (startup tells by its .swap whether the one at ``base`` is new).
        suffixes = [INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX]
        if (self.dir / (file_name(base, TXN_INDEX_SUFFIX) + CLEANED_SUFFIX)).exists():
            suffixes.insert(2, TXN_INDEX_SUFFIX)
        final = {suffix: self.dir / file_name(base, suffix) for suffix in suffixes}
        deleted: list[Path] = []
        try:
            for suffix in suffixes:
                cleaned = final[suffix].with_name(final[suffix].name + CLEANED_SUFFIX)
                os.replace(cleaned, final[suffix].with_name(final[suffix].name + SWAP_SUFFIX))
            for segment in old:
                for suffix in (TXN_INDEX_SUFFIX, TIME_INDEX_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX):
                    path = self.dir / file_name(segment.base_offset, suffix)
                    doomed = path.with_name(path.name + DELETED_SUFFIX)
                    with contextlib.suppress(FileNotFoundError):  # an index never written
                        os.replace(path, doomed)
                        deleted.append(doomed)
            # The transaction index before the log: once the log's swap is gone, it is final too.
            for suffix in sorted(
                suffixes, key=(TXN_INDEX_SUFFIX, LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX).index
            ):
                os.replace(final[suffix].with_name(final[suffix].name + SWAP_SUFFIX), final[suffix])
            segment = open_segment(self.dir, base, self.config, self.time_ms())
            segment.rebuild_indexes_if_corrupt()
            segment.on_become_inactive()
        except OSError as e:
            # The old segments' open files still serve reads; startup completes the swap.
            raise KafkaStorageError(f"error swapping cleaned segment {base} into {self.dir}: {e}") from e
        with self._lock:
            self._segments[start : start + len(old)] = [segment]
            self._bases = [s.base_offset for s in self._segments]
        for replaced in old:
            replaced.close()  # not delete(): its paths now name the new segment's files
        return segment, deleted

    def delete_pending_files(self, now_ms: int | None = None) -> int:
        """Unlink the files of deleted segments whose ``file.delete.delay.ms`` has passed;
        returns how many.

        Safe on a worker thread: the files are already out of the segment list and renamed.
        """
        now = self.time_ms() if now_ms is None else now_ms
        with self._lock:
            due = [path for when, path in self._files_to_delete if when <= now]
            self._files_to_delete = [(when, path) for when, path in self._files_to_delete if when > now]
        for path in due:
            path.unlink(missing_ok=True)
        return len(due)

    # --- truncation -----------------------------------------------------------------------

    def truncate_to(self, offset: int) -> bool:
        """Remove every batch at or after the one containing ``offset``; below the first
        segment, start over empty at ``offset``. Returns False when nothing was removed.
        Unlinks segments: the broker runs it on UnifiedLog.io."""
        with self.flush_lock:
            if offset >= self.log_end_offset:
                return False
            if offset < self._segments[0].base_offset:
                self.truncate_fully_and_start_at(offset)
                return True
            with self._lock:
                keep = self._floor_segment_index(offset)
                removed = self._segments[keep + 1 :]
                self._segments = self._segments[: keep + 1]
                self._bases = self._bases[: keep + 1]
            for segment in removed:
                segment.delete()
            self.active_segment.truncate_to(offset)
            with self._lock:
                self.recovery_point = min(self.recovery_point, self.log_end_offset)
            return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and restart the log empty at ``offset``."""
        with self.flush_lock:
            # The list is replaced, never emptied: the loop may read the log end meanwhile.
            for segment in self._segments:
                segment.delete()
            segment = self._new_segment(offset)
            with self._lock:
                self._segments, self._bases = [segment], [offset]
                self.recovery_point = offset

    # --- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Release every file (the caller flushes first).

        Never raises for I/O: an error takes the log dir offline (logged once) and the files are
        released all the same (Kafka's closeHandlers: no final index entry on a failed dir).
        """
        with self.flush_lock:
            if self._closed:
                return
            self._closed = True
            for segment in self._segments:
                if self.offline:
                    segment.close_handles()
                    continue
                try:
                    segment.close()
                except OSError as e:
                    self.log_dir_failed("close", e)

    def delete(self) -> None:
        """Close the segments and remove the directory.

        The directory is renamed ``<name>.<id>-delete`` first (as Kafka does; startup finishes
        such deletions), so a cleaner thread still writing files by path cannot recreate any
        inside the tree being removed.
        """
        with self.flush_lock:
            self._closed = True
            for segment in self._segments:
                segment.close()
        doomed = self.dir.with_name(renamed_dir_name(self.dir.name, DELETE_SUFFIX))
        try:
            os.rename(self.dir, doomed)
        except OSError as e:
            # A rename that fails says nothing of the disk (a name too long, say): remove the
            # directory where it is; only a failure to remove it is the disk's.
            log.error(
                "could not rename a deleted log's directory; removing it in place",
                extra={"dir": str(self.dir), "error": str(e)},
            )
            doomed = self.dir
        shutil.rmtree(doomed)
