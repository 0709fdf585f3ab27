"""Sparse segment indexes laid out as Kafka's ``.index`` and ``.timeindex`` files.

Both are arrays of fixed-size big-endian entries; offsets are stored relative to the
segment's base offset (int32). A file holds exactly its entries: entries are written
with ``os.pwrite`` at the end of the file (never through a memory map, so a full disk
is an ``OSError`` and never a SIGBUS) and truncation cuts the file. Lookups run over an
in-memory copy of the entries.

Indexes are lazy (Kafka's LazyIndex): nothing is read or opened until the entries are
needed. The file descriptor is a ``CachedFile``: opened for a write, kept by the process's
file cache while there is room, and closed when the segment rolls (a later flush syncs the file
by path). An inactive segment therefore holds no index descriptor, and its entries only while
it is read (the log bounds how many).

The event-loop thread appends; a flushing worker thread may call ``flush``
concurrently. Anything that truncates the file or closes its descriptor is done under
the owning segment's lock, which ``flush`` also takes; ``release`` only drops entries,
which a lookup holding them keeps using.
"""

from __future__ import annotations

import operator
import os
import struct
import sys
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, NamedTuple

from strom.storage.checkpoint import fsync
from strom.storage.errors import KafkaStorageError
from strom.storage.file_cache import CachedFile, file_cache, open_fd

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


class CorruptIndexError(Exception):
    """An index file that fails its sanity check; the segment rebuilds it from the log."""


def _strictly_increasing(values: array[int]) -> bool:
    return all(map(operator.lt, values, values[1:]))


def _big_endian_ints(data: bytes | bytearray) -> array[int]:
    ints = array("i", bytes(data))
    if sys.byteorder == "little":
        ints.byteswap()
    return ints


class _Index:
    entry_size: ClassVar[int]

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._max_index_size = self._round(max_index_size)
        self._file = CachedFile(path, create=True)
        # The entries, read from the file on first use; None until then (or after release).
        self._data: bytearray | None = None
        # Bytes of the file when it was read (a torn or garbage file need not be whole entries).
        self._file_length = 0
        self._inactive = False
        self._dirty = False
        # Called after the entries are read from the file (the owning segment checks them).
        self.on_load: Callable[[], None] | None = None

    def _round(self, max_index_size: int) -> int:
        return max(self.entry_size, max_index_size // self.entry_size * self.entry_size)

    # --- loading and files ------------------------------------------------------

    def create(self) -> None:
        """Start an empty index file (a new segment's)."""
        self._close_fd()
        # No descriptor kept: an idle log's index needs none until its first (sparse) entry.
        os.close(open_fd(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC))
        self._data = bytearray()
        self._file_length = 0
        self._inactive = False
        self._invalidate_last()

    @property
    def loaded(self) -> bool:
        return self._data is not None

    def load(self) -> None:
        """Read the entries from the file (a missing file is an empty index)."""
        if self._data is not None:
            return
        try:
            raw = file_cache().retry_out_of_descriptors(self.path.read_bytes)
        except FileNotFoundError:
            raw = b""
        self._file_length = len(raw)
        whole = len(raw) // self.entry_size * self.entry_size
        self._data = bytearray(raw[:whole])
        self._invalidate_last()

    def _entries_data(self) -> bytearray:
        if self._data is None:
            self.load()
            if self.on_load is not None:
                self.on_load()  # may rebuild the entries
        data = self._data
        assert data is not None
        return data

    def _close_fd(self) -> None:
        self._file.close_descriptor()

    # --- sizing -----------------------------------------------------------------

    # The append path asks these for every batch: they read ``_data`` directly when loaded.

    @property
    def entries(self) -> int:
        data = self._data if self._data is not None else self._entries_data()
        return len(data) // self.entry_size

    @property
    def has_room(self) -> bool:
        """Another entry fits under ``segment.index.bytes``."""
        data = self._data if self._data is not None else self._entries_data()
        return len(data) < self._max_index_size

    @property
    def is_full(self) -> bool:
        return not self.has_room

    @property
    def size_in_bytes(self) -> int:
        if self._data is None:  # not worth loading: the file holds exactly the entries
            try:
                return self.path.stat().st_size // self.entry_size * self.entry_size
            except FileNotFoundError:
                return 0
        return len(self._data)

    def resize(self, max_index_size: int | None = None) -> None:
        """The (active segment's) index may hold up to ``max_index_size`` bytes of entries again."""
        if max_index_size is not None:
            self._max_index_size = self._round(max_index_size)
        self._inactive = False

    def trim_to_valid_size(self) -> None:
        """Cut anything after the entries (a torn write left by a failed append), through the
        descriptor this index writes with: by close time its path may name another file (a
        cleaned segment swapped in)."""
        if self._data is None or self._file_length == len(self._data):
            return
        fd = self._file.pin_if_open()
        if fd < 0:
            return  # closed since (by the cache): the write that tore it reopens it to overwrite
        try:
            os.ftruncate(fd, len(self._data))
            self._file_length = len(self._data)
        finally:
            self._file.unpin()

    def mark_inactive(self) -> None:
        """The segment rolled: no more appends, so no descriptor (a flush syncs the file by path)."""
        self.trim_to_valid_size()
        self._inactive = True
        self._close_fd()

    def flush(self) -> None:
        if not self._dirty:
            return
        # Cleared before the fsync: an append racing with it marks the index dirty again.
        self._dirty = False
        fd = self._file.pin_if_open()
        if fd >= 0:
            try:
                fsync(fd)
            finally:
                self._file.unpin()
            return
        # fsync syncs the file's dirty pages whichever descriptor wrote them.
        try:
            fd = file_cache().retry_out_of_descriptors(lambda: os.open(self.path, os.O_RDONLY))
        except FileNotFoundError:
            return  # deleted (retention) or swapped out (cleaner) meanwhile: nothing to keep
        try:
            fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.trim_to_valid_size()
        self._close_fd()

    def close_handles(self) -> None:
        self._close_fd()

    def release(self) -> None:
        """Forget the entries of an inactive index (read again on use)."""
        if self._inactive:
            self._close_fd()
            self._data = None
            self._invalidate_last()

    def delete(self) -> None:
        self._close_fd()
        self.path.unlink(missing_ok=True)

    def rename(self, path: Path) -> None:
        os.rename(self.path, path)
        self.path = path
        self._file.rename(path)

    def reset(self) -> None:
        """Drop every entry (before a rebuild from the log)."""
        with self._file as fd:
            os.ftruncate(fd, 0)
        self._data = bytearray()
        self._file_length = 0
        self._inactive = False
        self._invalidate_last()

    def _truncate_entries(self, entries: int) -> None:
        data = self._entries_data()
        size = entries * self.entry_size
        if size < len(data) or self._file_length != size:
            with self._file as fd:
                os.ftruncate(fd, size)
            del data[size:]
            self._file_length = size
        self._invalidate_last()

    def _invalidate_last(self) -> None:
        """Subclasses cache their last entry for the append path; entries changed under it."""

    def _append_entry(self, entry: bytes) -> None:
        data = self._entries_data()
        position = len(data)
        written = 0
        try:
            with self._file as fd:
                while written < len(entry):
                    written += os.pwrite(fd, entry[written:], position + written)
        except OSError:
            self._file_length = -1  # a torn entry may follow the entries: trim cuts it
            raise
        # Only a whole, written entry becomes visible to lookups.
        self._dirty = True
        data += entry
        self._file_length = len(data)

    def _relative(self, offset: int) -> int:
        relative = offset - self.base_offset
        if not 0 <= relative <= 0x7FFFFFFF:
            raise KafkaStorageError(
                f"offset {offset} does not fit in index with base offset {self.base_offset}"
            )
        return relative

    def _check_room(self) -> None:
        if not self.has_room:
            raise KafkaStorageError(f"index {self.path} is full ({self.entries} entries)")

    def _check_length(self) -> None:
        self._entries_data()
        if self._file_length % self.entry_size:
            raise CorruptIndexError(
                f"{self.path} has a size ({self._file_length}) that is not a multiple of {self.entry_size}"
            )

    def _ends(self) -> tuple[bytes, bytes, bytes]:
        """The first, second-to-last and last entries (b"" when there is none), read without
        loading the index: startup checks every segment's index this way, in O(1)."""
        size = self.entry_size
        data = self._data
        if data is not None:
            return self._pick_ends(self._file_length, lambda at: bytes(data[at : at + size]))
        try:
            with open(self.path, "rb") as f:
                fd = f.fileno()
                return self._pick_ends(os.fstat(fd).st_size, lambda at: os.pread(fd, size, at))
        except FileNotFoundError:
            return b"", b"", b""

    def _pick_ends(self, length: int, read: Callable[[int], bytes]) -> tuple[bytes, bytes, bytes]:
        size = self.entry_size
        if length % size:
            raise CorruptIndexError(f"{self.path} has a size ({length}) that is not a multiple of {size}")
        count = length // size

        def entry(n: int) -> bytes:
            return read(n * size) if 0 <= n < count else b""

        return entry(0), entry(count - 2), entry(count - 1)


class OffsetIndex(_Index):
    """Maps offsets to file positions: entry = relative offset (int32), position (int32)."""

    entry_size = 8

    def entry(self, n: int) -> OffsetPosition:
        relative, position = _OFFSET_ENTRY.unpack_from(self._entries_data(), n * 8)
        return OffsetPosition(self.base_offset + relative, position)

    _last_offset: int | None = None

    def _invalidate_last(self) -> None:
        self._last_offset = None

    @property
    def last_offset(self) -> int:
        if self._last_offset is None:
            entries = self.entries
            self._last_offset = self.entry(entries - 1).offset if entries else self.base_offset
        return self._last_offset

    def append(self, offset: int, position: int) -> None:
        self._check_room()
        if self.entries and offset <= self.last_offset:
            raise KafkaStorageError(
                f"index entry {offset} is not larger than the last one {self.last_offset}"
            )
        self._append_entry(_OFFSET_ENTRY.pack(self._relative(offset), position))
        self._last_offset = offset

    def _floor_slot(self, target: int, by_position: bool) -> int:
        """Index of the last entry whose offset (or position) is <= target, or -1."""
        data = self._entries_data()
        entries = len(data) // 8
        if entries == 0:
            return -1
        key = target if by_position else target - self.base_offset
        field = 1 if by_position else 0
        lo, hi = 0, entries - 1
        if _OFFSET_ENTRY.unpack_from(data, 0)[field] > key:
            return -1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if _OFFSET_ENTRY.unpack_from(data, mid * 8)[field] <= key:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def lookup(self, target_offset: int) -> OffsetPosition:
        """The last entry at or below ``target_offset``; (base offset, 0) when there is none."""
        slot = self._floor_slot(target_offset, by_position=False)
        return OffsetPosition(self.base_offset, 0) if slot < 0 else self.entry(slot)

    def lookup_by_position(self, position: int) -> OffsetPosition:
        """The last entry whose position is at or below ``position``; (base offset, 0) when none."""
        slot = self._floor_slot(position, by_position=True)
        return OffsetPosition(self.base_offset, 0) if slot < 0 else self.entry(slot)

    def truncate_to(self, offset: int) -> None:
        """Remove the entries for offsets >= ``offset``."""
        slot = self._floor_slot(offset, by_position=False)
        if slot >= 0 and self.entry(slot).offset == offset:
            slot -= 1
        self._truncate_entries(slot + 1)

    def check_ends(self, segment_size: int) -> OffsetPosition:
        """The startup check (O(1)): whole entries, a first entry at or after the base, and a last
        entry after the one before it and inside the log; returns the last entry."""
        first, previous, last = self._ends()
        if not last:
            return OffsetPosition(self.base_offset, 0)
        first_relative, first_position = _OFFSET_ENTRY.unpack(first)
        relative, position = _OFFSET_ENTRY.unpack(last)
        if first_relative < 0 or first_position < 0 or not 0 <= position < segment_size:
            raise CorruptIndexError(f"{self.path} has an entry outside its segment")
        if previous:
            previous_relative, previous_position = _OFFSET_ENTRY.unpack(previous)
            if relative <= previous_relative or position <= previous_position:
                raise CorruptIndexError(f"{self.path} has an invalid last entry")
        return OffsetPosition(self.base_offset + relative, position)

    def sanity_check(self, segment_size: int) -> None:
        """Kafka's checks, over every entry: whole entries, offsets and positions strictly
        increasing, offsets within the segment's int32 range, positions inside the log."""
        self._check_length()
        data = self._entries_data()
        if not data:
            return
        ints = _big_endian_ints(data)
        relative, positions = ints[0::2], ints[1::2]
        if relative[0] < 0 or positions[0] < 0:
            raise CorruptIndexError(f"{self.path} has a negative first entry {self.entry(0)}")
        if not (_strictly_increasing(relative) and _strictly_increasing(positions)):
            raise CorruptIndexError(f"{self.path} has entries that do not increase")
        if positions[-1] >= segment_size:
            raise CorruptIndexError(
                f"{self.path} has an entry at position {positions[-1]}, past the end of its "
                f"{segment_size}-byte segment"
            )


class TimeIndex(_Index):
    """Maps timestamps to offsets: entry = timestamp (int64), relative offset (int32).

    Timestamps only grow: an entry is added only when it exceeds the last one. One
    slot stays reserved for the final entry written when the segment rolls.
    """

    entry_size = 12

    def entry(self, n: int) -> TimestampOffset:
        timestamp, relative = _TIME_ENTRY.unpack_from(self._entries_data(), n * 12)
        return TimestampOffset(timestamp, self.base_offset + relative)

    @property
    def is_full(self) -> bool:
        data = self._data if self._data is not None else self._entries_data()
        return len(data) + self.entry_size >= self._max_index_size

    _last_entry: TimestampOffset | None = None

    def _invalidate_last(self) -> None:
        self._last_entry = None

    @property
    def last_entry(self) -> TimestampOffset:
        if self._last_entry is None:
            entries = self.entries
            self._last_entry = self.entry(entries - 1) if entries else TimestampOffset(-1, self.base_offset)
        return self._last_entry

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        if timestamp <= self.last_entry.timestamp:
            return
        if not skip_full_check and self.is_full:
            raise KafkaStorageError(f"time index {self.path} is full")
        self._check_room()
        self._append_entry(_TIME_ENTRY.pack(timestamp, self._relative(offset)))
        self._last_entry = TimestampOffset(timestamp, offset)

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """The last entry with timestamp <= target; (-1, base offset) when there is none."""
        data = self._entries_data()
        entries = len(data) // 12
        if entries == 0 or _TIME_ENTRY.unpack_from(data, 0)[0] > target_timestamp:
            return TimestampOffset(-1, self.base_offset)
        lo, hi = 0, entries - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if _TIME_ENTRY.unpack_from(data, mid * 12)[0] <= target_timestamp:
                lo = mid
            else:
                hi = mid - 1
        return self.entry(lo)

    def truncate_to(self, offset: int) -> None:
        """Remove the entries for offsets >= ``offset`` (offsets grow with timestamps)."""
        keep = self.entries
        while keep and self.entry(keep - 1).offset >= offset:
            keep -= 1
        self._truncate_entries(keep)

    def check_ends(self, segment_next_offset: int) -> TimestampOffset:
        """The startup check (O(1)): whole entries, and a last entry after the one before it and
        inside the segment; returns the last entry."""
        _first, previous, last = self._ends()
        if not last:
            return TimestampOffset(-1, self.base_offset)
        timestamp, relative = _TIME_ENTRY.unpack(last)
        if relative < 0 or self.base_offset + relative > max(segment_next_offset - 1, self.base_offset):
            raise CorruptIndexError(f"{self.path} points outside its segment")
        if previous:
            previous_timestamp, previous_relative = _TIME_ENTRY.unpack(previous)
            if timestamp <= previous_timestamp or relative < previous_relative:
                raise CorruptIndexError(f"{self.path} has an invalid last entry")
        return TimestampOffset(timestamp, self.base_offset + relative)

    def sanity_check(self, segment_next_offset: int) -> None:
        """Whole entries, timestamps strictly and offsets weakly increasing, all within the segment."""
        self._check_length()
        data = self._entries_data()
        if not data:
            return
        # Three big-endian int32 per entry: timestamp high and low words, relative offset.
        ints = _big_endian_ints(data)
        relative = ints[2::3]
        if relative[0] < 0 or not all(map(operator.le, relative, relative[1:])):
            raise CorruptIndexError(f"{self.path} has offsets that are negative or decrease")
        if self.base_offset + relative[-1] > max(segment_next_offset - 1, self.base_offset):
            raise CorruptIndexError(f"{self.path} points past the end of its segment")
        timestamps = list(map(operator.itemgetter(0), _TIME_ENTRY.iter_unpack(data)))
        if not all(map(operator.lt, timestamps, timestamps[1:])):
            raise CorruptIndexError(f"{self.path} has timestamps that do not increase")
