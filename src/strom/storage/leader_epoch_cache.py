"""LeaderEpochFileCache: the first offset of each leader epoch, kept in ``leader-epoch-checkpoint``.

A truncation from the end is written and synced at once, as Kafka's LeaderEpochFileCache does on
truncateFromEnd: a follower that truncates, appends in an older epoch and crashes must not
restart with a removed epoch starting inside the appended records (OffsetForLeaderEpoch would
then answer with it). A new epoch -- a new leader's, or one an append brings (a follower's first
batch of its leader's new epoch, a recovered batch) -- is kept in memory and written (and
synced) by ``flush``, which the log calls before its recovery point passes a batch: until then
a crash recovers the batches and assigns their epochs again, so the file may be stale only
where the log is recovered, or lack an epoch no batch was written in (which no replica can ask
about). Kafka writes and syncs each new epoch at once; thousands of partitions changing leader
or meeting a new epoch after a failover then cost a file replaced and two fsyncs each, most of
a failover's time here.
Truncations from the start are written by ``flush`` too (the log's next flush or its close), as
Kafka defers them since KAFKA-15046: a stale file then only holds entries below the log start
offset, which loading the log truncates again. These callers run off the event loop (the
log's I/O executor, or loading).
An unreadable or missing file is not fatal: the cache starts empty with ``rebuild_needed`` set,
and the log rebuilds it from its batches' partitionLeaderEpoch (Kafka only does so for the
segments it recovers, and takes a log dir offline for an unreadable file). An unreadable file is
replaced at once; the entries rebuilt for a missing one are written by the next ``flush``.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from strom.storage.checkpoint import LEADER_EPOCH_CHECKPOINT, LeaderEpochCheckpointFile
from strom.storage.errors import KafkaStorageError

log = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochFileCache:
    """Ordered (epoch, start offset) entries; both columns strictly increase."""

    def __init__(self, log_dir: Path, log_end_offset: Callable[[], int]) -> None:
        self._file = LeaderEpochCheckpointFile(log_dir / LEADER_EPOCH_CHECKPOINT)
        self._log_end_offset = log_end_offset
        # Held while a snapshot of the entries is taken and written: the loop and worker threads write.
        self._write_lock = threading.Lock()
        self._dirty = False
        # A missing file (a new log, or a deleted file) is rebuilt from the batches too, silently.
        self._damaged = False
        self.rebuild_needed = not self._file.path.exists()
        try:
            self._entries: list[tuple[int, int]] = self._file.read()
            if any(a[0] >= b[0] or a[1] >= b[1] for a, b in itertools.pairwise(self._entries)) or any(
                epoch < 0 or offset < 0 for epoch, offset in self._entries
            ):
                raise KafkaStorageError(f"epochs and offsets do not both increase in {self._file.path}")
        except KafkaStorageError as e:
            log.warning(
                "unreadable leader epoch checkpoint: rebuilding it from the log's batches",
                extra={"file": str(self._file.path), "error": str(e)},
            )
            self._entries = []
            self._damaged = self.rebuild_needed = True

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1][0] if self._entries else None

    @property
    def earliest_entry(self) -> tuple[int, int] | None:
        return self._entries[0] if self._entries else None

    def assign(self, epoch: int, start_offset: int, *, flush: bool = True) -> None:
        """Record that ``epoch`` starts at ``start_offset``, dropping entries it contradicts.
        Without ``flush`` (a new epoch, see the module's docstring) the file is written only by
        the next ``flush``."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        if self._entries:
            last_epoch, last_offset = self._entries[-1]
            if epoch == last_epoch and start_offset >= last_offset:
                return
        entries = list(self._entries)
        while entries and (entries[-1][0] >= epoch or entries[-1][1] >= start_offset):
            entries.pop()
        removed = self._entries[len(entries) :]
        entries.append((epoch, start_offset))
        if flush:
            self._write(entries)
        else:
            with self._write_lock:  # flush may be writing a snapshot of the entries meanwhile
                self._entries = entries
                self._dirty = True
        if any(e >= epoch for e, _ in removed):
            log.warning(
                "leader epoch %d at offset %d replaced %d cached epochs", epoch, start_offset, len(removed)
            )
        elif removed:
            # Older epochs without a record (a leadership that appended nothing): nothing conflicts.
            log.debug(
                "leader epoch %d at offset %d replaced %d empty epochs", epoch, start_offset, len(removed)
            )

    def rebuild(self, first_offsets: Iterable[tuple[int, int]]) -> None:
        """Replace the entries from (epoch, base offset) of every batch, in log order.

        A damaged file is replaced at once. A missing one is the usual state of a log whose
        epochs were never flushed (a crash soon after they were assigned): like new epochs, the
        rebuilt ones are written by the next ``flush``, and a crash before it rebuilds them again.
        """
        entries: list[tuple[int, int]] = []
        for epoch, offset in first_offsets:
            if epoch >= 0 and (not entries or epoch > entries[-1][0]):
                entries.append((epoch, offset))
        self.rebuild_needed = False
        if self._damaged:
            self._write(entries)
            self._damaged = False
            log.warning(
                "rebuilt leader epoch checkpoint", extra={"file": str(self._file.path), "epochs": len(entries)}
            )
            return
        with self._write_lock:
            self._entries = entries
            self._dirty = bool(entries)

    def _write(self, entries: list[tuple[int, int]]) -> None:
        """Write ``entries``, then make them the cache's: a failed write leaves the cache as it was.
        What is pending (see ``flush``) is written with them."""
        with self._write_lock:
            self._file.write(entries)
            self._entries = entries
            self._dirty = False

    def flush(self) -> None:
        """Write what is not yet in the file: truncations from the start and epochs assigned
        without ``flush`` (call off the event loop)."""
        if not self._dirty:
            return
        with self._write_lock:
            self._dirty = False
            try:
                self._file.write(list(self._entries))
            except BaseException:
                self._dirty = True
                raise

    def end_offset_for(self, requested_epoch: int, log_end_offset: int | None = None) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest epoch <= requested, start offset of the next epoch or LEO)."""
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self._entries[-1][0]:
            return requested_epoch, self._log_end_offset() if log_end_offset is None else log_end_offset
        higher = bisect.bisect_right(self._entries, requested_epoch, key=lambda entry: entry[0])
        if higher == len(self._entries):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        higher_start = self._entries[higher][1]
        if higher == 0:
            # Older than anything cached: the data is gone, point at the first epoch we know.
            return requested_epoch, higher_start
        return self._entries[higher - 1][0], higher_start

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that the record at ``offset`` was written in, if known."""
        slot = bisect.bisect_right(self._entries, offset, key=lambda entry: entry[1])
        return self._entries[slot - 1][0] if slot else None

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was truncated there), and
        write the file before anything is appended after the truncation."""
        keep = len(self._entries)
        while keep and self._entries[keep - 1][1] >= end_offset:
            keep -= 1
        if keep != len(self._entries):
            self._write(self._entries[:keep])

    def clear(self) -> None:
        """Forget every epoch (the log restarted empty at a new offset) and write the file."""
        if self._entries:
            self._write([])

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs wholly below ``start_offset``; the one containing it now starts there."""
        slot = bisect.bisect_right(self._entries, start_offset, key=lambda entry: entry[1])
        if slot == 0:
            return
        epoch, first = self._entries[slot - 1]
        if slot == 1 and first == start_offset:
            return
        self._entries[:slot] = [(epoch, start_offset)]
        self._dirty = True
