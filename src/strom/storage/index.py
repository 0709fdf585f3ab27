"""Sparse segment indexes laid out as Kafka's ``.index`` and ``.timeindex`` files.

Both are memory-mapped arrays of fixed-size big-endian entries, preallocated to
``segment.index.bytes`` while their segment is active and trimmed to the entries
in use when it rolls or closes. Offsets are stored relative to the segment's
base offset (int32).

The event-loop thread appends; a flushing worker thread may call ``flush``
concurrently. Anything that remaps the file (resize, trim, close) is done under
the owning segment's lock, which ``flush`` also takes.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import NamedTuple

from strom.storage.errors import KafkaStorageError

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


class _MmapIndex:
    entry_size: int

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._max_index_size = max(self.entry_size, max_index_size // self.entry_size * self.entry_size)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        length = os.fstat(self._fd).st_size
        # A file already on disk holds exactly its entries (it was trimmed on close).
        self._entries = length // self.entry_size
        self._mm: mmap.mmap | None = None
        if length == 0:
            self._remap(self._max_index_size)
        else:
            self._remap(length)

    # --- sizing -----------------------------------------------------------------

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def max_entries(self) -> int:
        return self._capacity // self.entry_size

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    @property
    def size_in_bytes(self) -> int:
        return self._entries * self.entry_size

    def _remap(self, length: int) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        os.ftruncate(self._fd, length)
        self._capacity = length
        if length > 0:
            self._mm = mmap.mmap(self._fd, length, access=mmap.ACCESS_WRITE)

    def resize(self, max_index_size: int | None = None) -> None:
        """Give the (active segment's) index room for ``max_index_size`` bytes of entries."""
        if max_index_size is not None:
            self._max_index_size = max(self.entry_size, max_index_size // self.entry_size * self.entry_size)
        self._remap(max(self._max_index_size, self.size_in_bytes))

    def trim_to_valid_size(self) -> None:
        self._remap(self.size_in_bytes)

    def flush(self) -> None:
        if self._mm is not None:
            self._mm.flush()

    def close(self) -> None:
        if self._fd < 0:
            return
        self.trim_to_valid_size()
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        os.close(self._fd)
        self._fd = -1

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def rename(self, path: Path) -> None:
        os.rename(self.path, path)
        self.path = path

    def reset(self) -> None:
        """Drop every entry and make room for a full index again."""
        self._truncate_entries(0)
        self._remap(self._max_index_size)

    def _truncate_entries(self, entries: int) -> None:
        self._entries = entries
        self._invalidate_last()

    def _invalidate_last(self) -> None:
        """Subclasses cache their last entry for the append path; entries changed under it."""

    def _relative(self, offset: int) -> int:
        relative = offset - self.base_offset
        if not 0 <= relative <= 0x7FFFFFFF:
            raise KafkaStorageError(
                f"offset {offset} does not fit in index with base offset {self.base_offset}"
            )
        return relative

    def _ensure_room(self) -> mmap.mmap:
        if self._mm is None or self._entries >= self.max_entries:
            raise KafkaStorageError(f"index {self.path} is full ({self._entries} entries)")
        return self._mm


class OffsetIndex(_MmapIndex):
    """Maps offsets to file positions: entry = relative offset (int32), position (int32)."""

    entry_size = 8

    def entry(self, n: int) -> OffsetPosition:
        assert self._mm is not None
        relative, position = _OFFSET_ENTRY.unpack_from(self._mm, n * 8)
        return OffsetPosition(self.base_offset + relative, position)

    _last_offset: int | None = None

    def _invalidate_last(self) -> None:
        self._last_offset = None

    @property
    def last_offset(self) -> int:
        if self._last_offset is None:
            self._last_offset = self.entry(self._entries - 1).offset if self._entries else self.base_offset
        return self._last_offset

    def append(self, offset: int, position: int) -> None:
        mm = self._ensure_room()
        if self._entries and offset <= self.last_offset:
            raise KafkaStorageError(
                f"index entry {offset} is not larger than the last one {self.last_offset}"
            )
        _OFFSET_ENTRY.pack_into(mm, self._entries * 8, self._relative(offset), position)
        self._entries += 1
        self._last_offset = offset

    def _floor_slot(self, target: int, by_position: bool) -> int:
        """Index of the last entry whose offset (or position) is <= target, or -1."""
        mm = self._mm
        if mm is None or self._entries == 0:
            return -1
        key = target if by_position else target - self.base_offset
        field = 1 if by_position else 0
        lo, hi = 0, self._entries - 1
        if _OFFSET_ENTRY.unpack_from(mm, 0)[field] > key:
            return -1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if _OFFSET_ENTRY.unpack_from(mm, mid * 8)[field] <= key:
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

    def sanity_check(self, segment_size: int) -> None:
        if self._capacity % self.entry_size:
            raise CorruptIndexError(f"{self.path} has a size that is not a multiple of {self.entry_size}")
        if self._entries > 1:
            last = self.entry(self._entries - 1)
            # A preallocated file left untrimmed by a crash ends in zero entries.
            if last.offset <= self.entry(self._entries - 2).offset or last.position > segment_size:
                raise CorruptIndexError(f"{self.path} has an invalid last entry {last}")
        elif self._entries == 1 and self.entry(0).position > segment_size:
            raise CorruptIndexError(f"{self.path} points past the end of its segment")


class TimeIndex(_MmapIndex):
    """Maps timestamps to offsets: entry = timestamp (int64), relative offset (int32).

    Timestamps only grow: an entry is added only when it exceeds the last one. One
    slot stays reserved for the final entry written when the segment rolls.
    """

    entry_size = 12

    def entry(self, n: int) -> TimestampOffset:
        assert self._mm is not None
        timestamp, relative = _TIME_ENTRY.unpack_from(self._mm, n * 12)
        return TimestampOffset(timestamp, self.base_offset + relative)

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries - 1

    _last_entry: TimestampOffset | None = None

    def _invalidate_last(self) -> None:
        self._last_entry = None

    @property
    def last_entry(self) -> TimestampOffset:
        if self._last_entry is None:
            self._last_entry = (
                self.entry(self._entries - 1) if self._entries else TimestampOffset(-1, self.base_offset)
            )
        return self._last_entry

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        if timestamp <= self.last_entry.timestamp:
            return
        if not skip_full_check and self.is_full:
            raise KafkaStorageError(f"time index {self.path} is full")
        mm = self._ensure_room()
        _TIME_ENTRY.pack_into(mm, self._entries * 12, timestamp, self._relative(offset))
        self._entries += 1
        self._last_entry = TimestampOffset(timestamp, offset)

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """The last entry with timestamp <= target; (-1, base offset) when there is none."""
        mm = self._mm
        if mm is None or self._entries == 0 or _TIME_ENTRY.unpack_from(mm, 0)[0] > target_timestamp:
            return TimestampOffset(-1, self.base_offset)
        lo, hi = 0, self._entries - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if _TIME_ENTRY.unpack_from(mm, mid * 12)[0] <= target_timestamp:
                lo = mid
            else:
                hi = mid - 1
        return self.entry(lo)

    def truncate_to(self, offset: int) -> None:
        """Remove the entries for offsets >= ``offset`` (offsets grow with timestamps)."""
        keep = self._entries
        while keep and self.entry(keep - 1).offset >= offset:
            keep -= 1
        self._truncate_entries(keep)

    def sanity_check(self, segment_next_offset: int) -> None:
        if self._capacity % self.entry_size:
            raise CorruptIndexError(f"{self.path} has a size that is not a multiple of {self.entry_size}")
        if self._entries > 1:
            last, previous = self.entry(self._entries - 1), self.entry(self._entries - 2)
            if last.timestamp <= previous.timestamp or last.offset < previous.offset:
                raise CorruptIndexError(f"{self.path} has an invalid last entry {last}")
        if self._entries and self.last_entry.offset > max(segment_next_offset - 1, self.base_offset):
            raise CorruptIndexError(f"{self.path} points past the end of its segment")
