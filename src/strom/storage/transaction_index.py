"""TransactionIndex: a segment's aborted transactions, Kafka's ``<base offset>.txnindex`` file.

Each entry (34 bytes, big-endian) is one transaction aborted by a marker in this segment:
version int16 (0), producer id int64, first offset int64, last offset int64 (the marker's), and
the last stable offset int64 when it was aborted. Entries are appended in the order of their
markers, so their last offsets increase. A ``read_committed`` fetch asks the indexes of the
segments from its fetch offset on for the aborted transactions its records overlap.

The file exists only once the segment's first transaction is aborted (rare), so creating or
rolling a segment costs nothing here. Its entries are few and small: they are read once, when
the segment is opened, checked, and kept in memory; appends write through (``O_APPEND``), and
``flush`` syncs the file by path. It is derived data: a damaged file is rebuilt by recovering
its segment from the log (LogLoader), never dropped.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from strom.storage.checkpoint import fsync
from strom.storage.index import CorruptIndexError

TXN_INDEX_SUFFIX = ".txnindex"
CURRENT_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size  # 34
# Where the last offset (the key entries are ordered by) and the last stable offset lie in an entry.
_LAST_OFFSET = 18
_LAST_STABLE_OFFSET = 26
_INT64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction: its producer, its first offset, its marker's offset
    (``last_offset``) and the log's last stable offset once it was aborted."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    """The aborted transactions whose markers lie in the segment at ``base_offset``.

    ``exists``: whether the file is there, when the caller knows (LogLoader lists the directory
    once); None asks the file system. An existing file is read and checked here; one that is not
    whole entries of a known version with last offsets increasing from the segment's base offset
    is ``damaged`` (its entries are not used) until recovery rebuilds it.
    """

    def __init__(self, path: Path, base_offset: int, exists: bool | None = None) -> None:
        self.path = path
        self.base_offset = base_offset
        self._entries = bytearray()
        self._dirty = False
        self.damaged: CorruptIndexError | None = None
        # Serialises the file's writes and truncations with a worker thread's flush.
        self._lock = threading.Lock()
        if exists is None or exists:
            with contextlib.suppress(FileNotFoundError):
                self._entries = bytearray(path.read_bytes())
            try:
                self.sanity_check()
            except CorruptIndexError as e:
                self.damaged = e
                self._entries = bytearray()

    def __len__(self) -> int:
        return len(self._entries) // ENTRY_SIZE

    @property
    def is_empty(self) -> bool:
        return not self._entries

    @property
    def last_offset(self) -> int | None:
        """The last offset of the newest entry; None when there is none."""
        if not self._entries:
            return None
        return int(_INT64.unpack_from(self._entries, len(self._entries) - ENTRY_SIZE + _LAST_OFFSET)[0])

    def sanity_check(self) -> None:
        entries = self._entries
        if len(entries) % ENTRY_SIZE:
            raise CorruptIndexError(
                f"{self.path}: {len(entries)} bytes is no whole number of {ENTRY_SIZE}-byte entries"
            )
        previous = self.base_offset - 1
        for version, _, first_offset, last_offset, _ in _ENTRY.iter_unpack(entries):
            if version != CURRENT_VERSION:
                raise CorruptIndexError(f"{self.path}: entry of unknown version {version}")
            if last_offset <= previous or first_offset > last_offset:
                raise CorruptIndexError(
                    f"{self.path}: aborted transaction [{first_offset}, {last_offset}] out of order "
                    f"(after {previous}, segment base offset {self.base_offset})"
                )
            previous = last_offset

    def all(self) -> list[AbortedTxn]:
        return [AbortedTxn(*fields[1:]) for fields in _ENTRY.iter_unpack(self._entries)]

    # --- writing ----------------------------------------------------------------------

    def append(self, txn: AbortedTxn) -> None:
        """Add ``txn``, whose marker follows every indexed one (ValueError otherwise, as Kafka
        checks); creates the file on the segment's first aborted transaction."""
        last = self.last_offset
        if last is not None and txn.last_offset <= last:
            raise ValueError(
                f"{self.path}: the last offset of an appended transaction must increase, but "
                f"{txn.last_offset} is not above {last}"
            )
        entry = _ENTRY.pack(
            CURRENT_VERSION, txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset
        )
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                # One write of 34 bytes to a regular file is whole or fails.
                os.write(fd, entry)
            finally:
                os.close(fd)
            self._entries += entry
            self._dirty = True

    def truncate_to(self, offset: int) -> None:
        """Drop the transactions whose markers are at or after ``offset``."""
        keep = self._bisect_last_offset(offset) * ENTRY_SIZE
        if keep == len(self._entries):
            return
        with self._lock:
            os.truncate(self.path, keep)
            del self._entries[keep:]
            self._dirty = True

    def reset(self) -> None:
        """Drop every entry (recovery rebuilds them); the file goes, as it was never needed."""
        with self._lock:
            self._entries = bytearray()
            self._dirty = False
            self.damaged = None
            self.path.unlink(missing_ok=True)

    def flush(self) -> None:
        """fsync what was written since the last flush (a worker thread may call it)."""
        with self._lock:
            if not self._dirty:
                return
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return  # renamed away meanwhile (retention, the cleaner's swap)
            try:
                fsync(fd)
            finally:
                os.close(fd)
            self._dirty = False

    def delete(self) -> None:
        with self._lock:
            self._dirty = False
            self.path.unlink(missing_ok=True)

    def rename_to(self, suffix: str) -> Path | None:
        """Rename the file with ``suffix`` (a deleted segment's); the new path, None without a file."""
        target = self.path.with_name(self.path.name + suffix)
        with self._lock:
            self._dirty = False
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.path, target)
                return target
        return None

    # --- reading ----------------------------------------------------------------------

    def _bisect_last_offset(self, offset: int) -> int:
        """Index of the first entry whose last offset is >= ``offset``."""
        entries, low, high = self._entries, 0, len(self)
        while low < high:
            middle = (low + high) // 2
            if _INT64.unpack_from(entries, middle * ENTRY_SIZE + _LAST_OFFSET)[0] < offset:
                low = middle + 1
            else:
                high = middle
        return low

    def collect(self, fetch_offset: int, upper_bound_offset: int, into: list[AbortedTxn]) -> bool:
        """Add to ``into`` the transactions overlapping [fetch_offset, upper_bound_offset): last
        offset >= fetch_offset and first offset < upper_bound_offset. Returns True when no later
        segment can hold more: an entry's last stable offset reached the upper bound, so every
        transaction starting below it had ended by then (Kafka's TxnIndexSearchResult.isComplete).

        Entries before ``fetch_offset`` are skipped by a binary search on their last offsets; the
        last stable offsets grow with them, so the one before the first overlapping entry tells
        whether the search is complete already.
        """
        entries = self._entries
        start = self._bisect_last_offset(fetch_offset)
        if (
            start
            and _INT64.unpack_from(entries, (start - 1) * ENTRY_SIZE + _LAST_STABLE_OFFSET)[0]
            >= upper_bound_offset
        ):
            return True
        for position in range(start * ENTRY_SIZE, len(entries), ENTRY_SIZE):
            _, producer_id, first_offset, last_offset, last_stable_offset = _ENTRY.unpack_from(
                entries, position
            )
            if first_offset < upper_bound_offset:
                into.append(AbortedTxn(producer_id, first_offset, last_offset, last_stable_offset))
            if last_stable_offset >= upper_bound_offset:
                return True
        return False
