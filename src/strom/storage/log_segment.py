"""LogSegment: one ``<base offset>.log`` file of whole batches plus its offset and time indexes,
and its transaction index (``.txnindex``, only once a transaction is aborted in it).

Bytes are written with ``os.pwrite`` at the segment's committed size, so a failed
or torn write is overwritten by the next append and cut off by recovery. Reads use
``os.pread`` bounded by that size and never see a partial append.

The files' descriptors are ``CachedFile``s (storage/file_cache.py): each use pins the
descriptor, and the process's file cache closes idle ones when too many are open, so a
segment nobody reads holds none and an idle log at most its active segment's ``.log``.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from strom.records import batch as rb
from strom.records.control import batch_end_txn_marker
from strom.storage.checkpoint import fsync
from strom.storage.errors import CorruptRecordError, KafkaStorageError
from strom.storage.file_cache import CachedFile
from strom.storage.index import CorruptIndexError, OffsetIndex, TimeIndex
from strom.storage.producer_state import ProducerStateManager
from strom.storage.transaction_index import TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
# Recovery and replay read the log in chunks of this size.
SCAN_CHUNK_BYTES = 4 * 1024 * 1024
INT32_MAX = 0x7FFFFFFF


def file_name(base_offset: int, suffix: str) -> str:
    """Kafka names segment files by their base offset, zero-padded to 20 digits."""
    return f"{base_offset:020d}{suffix}"


class InvalidBatchAt(Exception):
    """Scanning found bytes that are not a valid batch, starting at ``position``."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"invalid batch at position {position}: {reason}")
        self.position = position
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ScannedBatch:
    """A batch read back from a segment: its file position, header and bytes."""

    position: int
    header: rb.BatchHeader
    data: memoryview


# The most buffers one pwritev takes (Linux's IOV_MAX).
_IOV_MAX = 1024


def _pwrite_all(fd: int, parts: list[memoryview], position: int) -> None:
    """Write ``parts`` back to back at ``position``, resuming after short writes."""
    first = 0
    while first < len(parts):
        written = os.pwritev(fd, parts[first : first + _IOV_MAX], position)
        position += written
        while first < len(parts) and written >= parts[first].nbytes:
            written -= parts[first].nbytes
            first += 1
        if written:
            parts[first] = parts[first][written:]


class LogSegment:
    def __init__(
        self,
        dir: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_size: int,
        roll_jitter_ms: int,
        now_ms: int,
        txn_index_exists: bool | None = None,
    ) -> None:
        """``txn_index_exists``: whether a ``.txnindex`` file is there, when the caller knows (a
        new segment has none; LogLoader lists the directory once); None asks the file system."""
        self.base_offset = base_offset
        self.log_path = dir / file_name(base_offset, LOG_SUFFIX)
        self.index_interval_bytes = index_interval_bytes
        self.roll_jitter_ms = roll_jitter_ms
        self.created_ms = now_ms
        index_path = dir / file_name(base_offset, INDEX_SUFFIX)
        time_index_path = dir / file_name(base_offset, TIME_INDEX_SUFFIX)
        existed = self.log_path.exists()
        # An existing log without its indexes must rebuild them (see load).
        self.indexes_missing = existed and not (index_path.exists() and time_index_path.exists())
        self._log_file = CachedFile(self.log_path, create=not existed, create_once=True)
        if existed:
            self.size = self.log_path.stat().st_size  # no descriptor until the segment is used
        else:
            with self._log_file as fd:
                self.size = os.fstat(fd).st_size
        # Lazy: an existing segment's indexes are read (and sanity-checked) on first use.
        self._offset_index = OffsetIndex(index_path, base_offset, max_index_size)
        self._time_index = TimeIndex(time_index_path, base_offset, max_index_size)
        if not existed:
            self._offset_index.create()
            self._time_index.create()
        # Made when a transaction is first aborted in the segment, or here for an existing file:
        # most segments never have one, and keep no object for it.
        self._txn_index: TransactionIndex | None = None
        if existed and txn_index_exists is not False:
            txn_index_path = dir / file_name(base_offset, TXN_INDEX_SUFFIX)
            if txn_index_exists or txn_index_path.exists():
                self._txn_index = TransactionIndex(txn_index_path, base_offset, exists=True)
        # Every entry of an existing segment's indexes is checked once, when first read (startup
        # checks only their ends, in O(1) per segment).
        self._indexes_checked = not existed
        self._checking_indexes = False
        self._offset_index.on_load = self._time_index.on_load = self._check_indexes
        self.next_offset = base_offset
        self.max_timestamp_so_far = rb.NO_TIMESTAMP
        self.offset_of_max_timestamp_so_far = base_offset
        # Max timestamp of the first batch: segment.ms counts from it (Kafka's rollingBasedTimestamp).
        self.rolling_based_timestamp: int | None = None
        self._bytes_since_last_index_entry = 0
        self._inactive = False
        # Serialises fsync with anything that closes or truncates the files; reentrant because a
        # lazy index load under it may rebuild the indexes, which marks the segment inactive again.
        self._lock = threading.RLock()
        self._closed = False

    # --- indexes ------------------------------------------------------------------

    @property
    def offset_index(self) -> OffsetIndex:
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        return self._time_index

    @property
    def txn_index(self) -> TransactionIndex:
        """The segment's transaction index, made empty (no file yet) on first use."""
        if self._txn_index is None:
            path = self.log_path.with_name(file_name(self.base_offset, TXN_INDEX_SUFFIX))
            self._txn_index = TransactionIndex(path, self.base_offset, exists=False)
        return self._txn_index

    @property
    def has_aborted_txns(self) -> bool:
        """Whether the transaction index holds an entry (without making one)."""
        return self._txn_index is not None and not self._txn_index.is_empty

    @property
    def txn_index_damage(self) -> CorruptIndexError | None:
        """Why the transaction index file read at opening is unusable; None when it is fine."""
        return None if self._txn_index is None else self._txn_index.damaged

    def _check_indexes(self) -> None:
        """An index was read from its file: the first time, check every entry of both and rebuild
        them from the log if they fail (a file damaged at rest)."""
        if self._indexes_checked or self._checking_indexes:
            return
        self._checking_indexes = True
        try:
            self._offset_index.sanity_check(self.size)
            self._time_index.sanity_check(self.next_offset)
            self._indexes_checked = True
        except CorruptIndexError as e:
            self._rebuild_indexes(e)
        finally:
            self._checking_indexes = False

    def _rebuild_indexes(self, cause: Exception) -> None:
        log.warning("%s: %s; rebuilding its indexes", self.log_path, cause)
        self.recover()
        if self._inactive:
            self.on_become_inactive()

    def release_indexes(self) -> None:
        """Drop an inactive segment's index entries and log descriptor until they are needed
        again (no lock: a flush holding it must not stall a read; pinned descriptors stay)."""
        self._offset_index.release()
        self._time_index.release()
        self._log_file.close_descriptor()

    # --- loading ------------------------------------------------------------------

    def load(self) -> None:
        """Initialise the in-memory state of an existing segment from the ends of its indexes,
        checked in O(1) (every entry is checked at first use)."""
        if self.indexes_missing and self.size:
            raise CorruptIndexError(f"{self.log_path} has no index files")
        last = self._offset_index.check_ends(self.size)
        next_offset = self.base_offset
        for batch in self.scan(last.position, headers_only=True):
            next_offset = batch.header.next_offset
        self.next_offset = next_offset
        entry = self._time_index.check_ends(self.next_offset)
        self.max_timestamp_so_far = entry.timestamp
        self.offset_of_max_timestamp_so_far = entry.offset
        self._load_first_batch_timestamp()

    def _load_first_batch_timestamp(self) -> None:
        if self.size >= rb.HEADER_SIZE:
            with self._log_file as fd:
                first = rb.read_header(os.pread(fd, rb.HEADER_SIZE, 0))
            self.rolling_based_timestamp = first.max_timestamp
        else:
            self.rolling_based_timestamp = None

    def recover(self, on_batch: Callable[[ScannedBatch], None] | None = None) -> int:
        """Validate every batch, rebuild the offset and time indexes and cut off invalid bytes;
        returns bytes cut. ``on_batch`` sees each valid batch (the transaction index is the
        caller's to rebuild: it needs producer state from before the segment)."""
        self._offset_index.reset()
        self._time_index.reset()
        self.next_offset = self.base_offset
        self.max_timestamp_so_far = rb.NO_TIMESTAMP
        self.offset_of_max_timestamp_so_far = self.base_offset
        self._bytes_since_last_index_entry = 0
        valid = 0
        try:
            for batch in self.scan(0, validate=True):
                header = batch.header
                if header.base_offset < self.next_offset or header.last_offset - self.base_offset > INT32_MAX:
                    raise InvalidBatchAt(batch.position, f"out-of-order base offset {header.base_offset}")
                self._index_batch(batch.position, header)
                self.next_offset = header.next_offset
                valid = batch.position + header.size
                if on_batch is not None:
                    on_batch(batch)
        except InvalidBatchAt as e:
            log.warning("%s: %s; truncating %d bytes", self.log_path, e, self.size - e.position)
        truncated = self.size - valid
        if truncated:
            with self._log_file as fd:
                os.ftruncate(fd, valid)
            self.size = valid
        self._append_final_time_entry()
        self._load_first_batch_timestamp()
        self._indexes_checked = True
        return truncated

    # --- appending ----------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview],
        headers: Sequence[rb.BatchHeader],
    ) -> None:
        """Append whole batches, in one buffer or in consecutive parts of one (a leader's rewritten
        batch headers and the records it did not copy: one pwritev); ``headers`` carry positions
        relative to ``data``."""
        position = self.size
        parts = (
            [memoryview(data)]
            if isinstance(data, bytes | bytearray | memoryview)
            else [memoryview(part) for part in data]
        )
        size = sum(part.nbytes for part in parts)
        try:
            with self._log_file as fd:
                _pwrite_all(fd, parts, position)
        except OSError as e:
            raise KafkaStorageError(f"error appending to {self.log_path}: {e}") from e
        if self.rolling_based_timestamp is None and headers:
            self.rolling_based_timestamp = headers[0].max_timestamp
        for header in headers:
            self._index_batch(position + header.position, header)
        self.size = position + size
        self.next_offset = headers[-1].next_offset

    def _index_batch(self, position: int, header: rb.BatchHeader) -> None:
        if header.max_timestamp > self.max_timestamp_so_far:
            self.max_timestamp_so_far = header.max_timestamp
            self.offset_of_max_timestamp_so_far = header.last_offset
        # Kafka's sparse indexing: an entry for the first batch after index.interval.bytes.
        # A full index only happens inside one multi-batch append (the next append rolls);
        # skipping entries there keeps lookups correct, just a little longer.
        if self._bytes_since_last_index_entry > self.index_interval_bytes and not (
            self.offset_index.is_full or self.time_index.is_full
        ):
            self.offset_index.append(header.base_offset, position)
            self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += header.size

    def _append_final_time_entry(self) -> None:
        """Record the segment's max timestamp in the slot the time index keeps for it."""
        if self.time_index.has_room:
            self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far, True)

    def should_roll(
        self,
        segment_bytes: int,
        segment_ms: int,
        messages_size: int,
        max_timestamp: int,
        last_offset: int,
        now_ms: int,
    ) -> bool:
        if self.size == 0:
            return False
        if self.size > segment_bytes - messages_size:
            return True
        if self.offset_index.is_full or self.time_index.is_full:
            return True
        if last_offset - self.base_offset > INT32_MAX:
            return True
        if self.rolling_based_timestamp is not None and self.rolling_based_timestamp >= 0:
            waited = max_timestamp - self.rolling_based_timestamp
        else:
            waited = now_ms - self.created_ms
        return waited > segment_ms - self.roll_jitter_ms

    def on_become_inactive(self) -> None:
        """Called at roll: record the final max timestamp, cut the indexes to their entries and
        close their descriptors (the next flush syncs them by path)."""
        with self._lock:
            self._inactive = True
            if self._time_index.loaded:  # one never loaded since startup has its final entry on disk
                self._append_final_time_entry()
            self._offset_index.mark_inactive()
            self._time_index.mark_inactive()
            self._log_file.close_descriptor()  # reopened by the next read or the roll's flush

    # --- producer state ------------------------------------------------------------

    def update_producer_state(
        self,
        state: ProducerStateManager,
        header: rb.BatchHeader,
        batch: bytes | bytearray | memoryview | None = None,
        *,
        position: int = -1,
        index: bool = True,
    ) -> None:
        """Record a batch of this segment in ``state`` (Kafka's LogSegment.updateProducerState).

        A control batch's marker (``batch``: its bytes, else read at ``position`` in the file)
        ends its producer's transaction; an aborted one enters this segment's transaction index
        with the LSO it leaves (``index``: False when replaying a segment whose index is whole).
        """
        if not header.attributes & rb.CONTROL_FLAG:
            state.update(header, header.base_offset, header.max_timestamp)
            return
        if batch is None:
            with self._log_file as fd:
                batch = os.pread(fd, header.size, position)
        try:
            marker = batch_end_txn_marker(batch)
        except rb.InvalidBatchError as e:
            raise CorruptRecordError(f"malformed control batch at offset {header.base_offset}: {e}") from e
        if marker is None:  # emptied by the cleaner, or no transaction marker
            state.advance_map_end_offset(header.next_offset)
            return
        completed = state.update_marker(header, marker)
        if completed is None:
            return
        if index and completed.is_aborted:
            self.txn_index.append(
                AbortedTxn(
                    completed.producer_id,
                    completed.first_offset,
                    completed.last_offset,
                    state.last_stable_offset(completed),
                )
            )
        state.complete_txn(completed)

    # --- reading ------------------------------------------------------------------

    def find_batch(self, offset: int, start_position: int = 0) -> tuple[int, rb.BatchHeader] | None:
        """Position and header of the first batch whose last offset >= ``offset``."""
        position = max(self.offset_index.lookup(offset).position, start_position)
        with self._log_file as fd:
            while position < self.size:
                header = rb.read_header(os.pread(fd, rb.HEADER_SIZE, position))
                if header.last_offset >= offset:
                    return position, header
                position += header.size
        return None

    def position_of(self, offset: int) -> int:
        """Position of the first batch whose base offset >= ``offset`` (size if none)."""
        found = self.find_batch(offset)
        if found is None:
            return self.size
        position, header = found
        return position if header.base_offset >= offset else position + header.size

    def read(self, offset: int, max_size: int, max_position: int, min_one_batch: bool) -> bytes | None:
        """Whole batches from the one containing ``offset``; None when the segment holds nothing there."""
        found = self.find_batch(offset)
        if found is None:
            return None
        start, first = found
        end = min(self.size, max_position)
        if start >= end:
            return b""
        want = min(max_size, end - start)
        if want < first.size:
            if not min_one_batch:
                return b""
            want = first.size
        with self._log_file as fd:
            data = os.pread(fd, want, start)
        if start + len(data) == end or len(data) == first.size:
            return data
        # Cut at the last whole batch: jump near the end with the index, then walk headers.
        cut = max(self.offset_index.lookup_by_position(start + len(data)).position - start, 0)
        while cut + rb.LOG_OVERHEAD <= len(data):
            size = (
                int.from_bytes(data[cut + rb.BATCH_LENGTH : cut + rb.BATCH_LENGTH + 4], "big")
                + rb.LOG_OVERHEAD
            )
            if cut + size > len(data):
                break
            cut += size
        return data[:cut] if cut < len(data) else data

    def scan(
        self, start_position: int = 0, *, validate: bool = False, headers_only: bool = False
    ) -> Iterator[ScannedBatch]:
        """Walk the batches from ``start_position`` to the end, reading in large chunks.

        With ``validate``, CRC mismatches and truncation raise InvalidBatchAt; without it,
        truncation still does (committed bytes are never truncated).
        """
        position = start_position
        need = rb.HEADER_SIZE
        while position < self.size:
            if headers_only:
                want = min(rb.HEADER_SIZE, self.size - position)
            else:
                want = min(max(SCAN_CHUNK_BYTES, need), self.size - position)
            with self._log_file as fd:
                buf = os.pread(fd, want, position)
            if len(buf) < want:
                raise InvalidBatchAt(position + len(buf), "log file is shorter than its recorded size")
            view = memoryview(buf)
            offset = 0
            while offset < len(buf):
                at = position + offset
                if len(buf) - offset < rb.HEADER_SIZE:
                    if at + rb.HEADER_SIZE > self.size:
                        raise InvalidBatchAt(at, "truncated batch header")
                    break
                try:
                    header = rb.read_header(view, offset)
                except rb.InvalidBatchError as e:
                    raise InvalidBatchAt(at, str(e)) from e
                if at + header.size > self.size:
                    raise InvalidBatchAt(at, f"batch of {header.size} bytes runs past the end of the log")
                if headers_only:
                    yield ScannedBatch(at, header, view[offset:])
                    offset += header.size
                    break
                if offset + header.size > len(buf):
                    need = header.size
                    break
                if validate and not rb.is_crc_valid(view, header):
                    raise InvalidBatchAt(at, f"CRC mismatch (stored {header.crc:#010x})")
                yield ScannedBatch(at, header, view[offset : offset + header.size])
                offset += header.size
            position += offset

    # --- maintenance --------------------------------------------------------------

    @property
    def largest_timestamp(self) -> int:
        """The largest record timestamp, or the file's mtime when no record has one (for retention)."""
        if self.max_timestamp_so_far >= 0:
            return self.max_timestamp_so_far
        return int(os.stat(self.log_path).st_mtime * 1000)

    def truncate_to(self, offset: int) -> int:
        """Remove the batch containing ``offset`` and all after it (as Kafka); returns bytes removed."""
        found = self.find_batch(offset)
        if found is None:
            return 0
        position, header = found
        removed = self.size - position
        with self._lock:
            self.offset_index.truncate_to(header.base_offset)
            self.time_index.truncate_to(header.base_offset)
            if self._txn_index is not None:
                self._txn_index.truncate_to(header.base_offset)
            with self._log_file as fd:
                os.ftruncate(fd, position)
            self.size = position
            # This segment becomes the active one: give its indexes room to grow again.
            self._inactive = False
            self._offset_index.resize()
            self._time_index.resize()
        # The next offset is the end of the new last batch (offsets may be sparse after compaction).
        self.next_offset = self.base_offset
        last = self.offset_index.lookup(header.base_offset)
        for batch in self.scan(last.position, headers_only=True):
            self.next_offset = batch.header.next_offset
        entry = self.time_index.last_entry
        self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far = entry.timestamp, entry.offset
        self._bytes_since_last_index_entry = 0
        if self.size == 0:
            self.rolling_based_timestamp = None
        return removed

    def resize_indexes(self, max_index_size: int) -> None:
        with self._lock:
            self._inactive = False
            self._offset_index.resize(max_index_size)
            self._time_index.resize(max_index_size)

    def flush(self) -> None:
        """fsync the log and its indexes; safe from a worker thread."""
        with self._lock:
            if self._closed:
                return
            try:
                try:
                    with self._log_file as fd:  # reopened if the cache closed it: fsync syncs the file
                        fsync(fd)
                except FileNotFoundError:
                    return  # renamed away meanwhile (retention, the cleaner's swap): nothing to keep
                self._offset_index.flush()
                self._time_index.flush()
                if self._txn_index is not None:
                    self._txn_index.flush()
            except OSError as e:
                raise KafkaStorageError(f"error flushing {self.log_path}: {e}") from e

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if not self._inactive:  # an inactive segment wrote its final entry at roll
                    self._append_final_time_entry()
                self._offset_index.close()
                self._time_index.close()
            finally:
                self._offset_index.close_handles()
                self._time_index.close_handles()
                self._log_file.close()

    def close_handles(self) -> None:
        """Release the descriptors without writing anything (a failed log dir's segments)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._offset_index.close_handles()
            self._time_index.close_handles()
            self._log_file.close()

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self._offset_index.path, self._time_index.path):
            path.unlink(missing_ok=True)
        if self._txn_index is not None:
            self._txn_index.delete()

    def rename_to_deleted(self, suffix: str) -> list[Path]:
        """Close the segment and rename its files with ``suffix``; returns the new paths.

        Unlinking a large file takes tens of milliseconds, so the event loop only renames
        (as Kafka does) and a worker thread unlinks later; startup removes any left over.
        """
        self.close()
        renamed = []
        txn_index = None if self._txn_index is None else self._txn_index.rename_to(suffix)
        if txn_index is not None:
            renamed.append(txn_index)
        for path in (self._time_index.path, self._offset_index.path, self.log_path):
            target = path.with_name(path.name + suffix)
            try:
                os.replace(path, target)
            except FileNotFoundError:
                continue
            renamed.append(target)
        return renamed

    def rebuild_indexes_if_corrupt(self) -> bool:
        """Load a segment that needs no recovery; rebuild from the log if its indexes are bad."""
        try:
            self.load()
            return False
        except (CorruptIndexError, InvalidBatchAt) as e:
            log.warning("%s: %s; rebuilding its indexes", self.log_path, e)
            self.recover()
            return True

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size}, next_offset={self.next_offset})"


def new_segment(
    dir: Path,
    base_offset: int,
    *,
    index_interval_bytes: int,
    max_index_size: int,
    segment_jitter_ms: int,
    now_ms: int,
) -> LogSegment:
    jitter = random.randrange(segment_jitter_ms) if segment_jitter_ms > 0 else 0
    return LogSegment(
        dir,
        base_offset,
        index_interval_bytes=index_interval_bytes,
        max_index_size=max_index_size,
        roll_jitter_ms=jitter,
        now_ms=now_ms,
    )


def next_offset_of_file(path: Path, base_offset: int) -> int:
    """Offset after the last whole batch of a log file that is not (yet) a segment, e.g. a ``.swap``."""
    next_offset = base_offset
    with open(path, "rb") as f:
        fd, size, position = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while position + rb.HEADER_SIZE <= size:
            try:
                header = rb.read_header(os.pread(fd, rb.HEADER_SIZE, position))
            except rb.InvalidBatchError:
                break
            if position + header.size > size:
                break
            next_offset = header.next_offset
            position += header.size
    return next_offset
