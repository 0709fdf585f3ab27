"""LeaderEpochFileCache: the first offset of each leader epoch, kept in ``leader-epoch-checkpoint``."""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from pathlib import Path

from strom.storage.checkpoint import LEADER_EPOCH_CHECKPOINT, LeaderEpochCheckpointFile

log = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochFileCache:
    """Ordered (epoch, start offset) entries; both columns strictly increase."""

    def __init__(self, log_dir: Path, log_end_offset: Callable[[], int]) -> None:
        self._file = LeaderEpochCheckpointFile(log_dir / LEADER_EPOCH_CHECKPOINT)
        self._log_end_offset = log_end_offset
        self._entries: list[tuple[int, int]] = self._file.read()

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1][0] if self._entries else None

    @property
    def earliest_entry(self) -> tuple[int, int] | None:
        return self._entries[0] if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset``, dropping entries it contradicts."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        if self._entries:
            last_epoch, last_offset = self._entries[-1]
            if epoch == last_epoch and start_offset >= last_offset:
                return
        removed = 0
        while self._entries and (self._entries[-1][0] >= epoch or self._entries[-1][1] >= start_offset):
            self._entries.pop()
            removed += 1
        if removed:
            log.warning(
                "leader epoch %d at offset %d replaced %d cached epochs", epoch, start_offset, removed
            )
        self._entries.append((epoch, start_offset))
        self._file.write(self._entries)

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
        """Forget epochs that start at or after ``end_offset`` (the log was truncated there)."""
        keep = len(self._entries)
        while keep and self._entries[keep - 1][1] >= end_offset:
            keep -= 1
        if keep != len(self._entries):
            del self._entries[keep:]
            self._file.write(self._entries)

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs wholly below ``start_offset``; the one containing it now starts there."""
        slot = bisect.bisect_right(self._entries, start_offset, key=lambda entry: entry[1])
        if slot == 0:
            return
        epoch, first = self._entries[slot - 1]
        if slot == 1 and first == start_offset:
            return
        self._entries[:slot] = [(epoch, start_offset)]
        self._file.write(self._entries)

    def clear(self) -> None:
        self._entries = []
        self._file.write(self._entries)
