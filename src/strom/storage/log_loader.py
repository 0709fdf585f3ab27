"""LogLoader: what opening a partition's log directory does (Kafka's LogLoader).

It finishes or discards what a crash interrupted (``.swap`` files complete the cleaner's swap;
``.cleaned``, ``.deleted`` and ``.tmp`` files and orphaned indexes go), opens the segments,
rebuilds damaged indexes and, after an unclean shutdown, recovers every segment from the one
holding the recovery point on: each batch is checked and the log is cut at the first torn or
invalid one. Recovery replays producer state through those segments, from its state at the first
of them, so transactions left open are open again and the segments' transaction indexes are
rebuilt from their ABORT markers (Kafka's LogSegment.recover); a damaged transaction index is
rebuilt the same way, even after a clean shutdown. Then the leader-epoch cache is rebuilt if its
file was lost and truncated to the log's offsets, and producer state is loaded from its newest
snapshot at or below the log end and replayed from there (when nothing was recovered).
UnifiedLog starts from what ``load`` returns.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from strom.storage.leader_epoch_cache import LeaderEpochFileCache
from strom.storage.local_log import CLEANED_SUFFIX, DELETED_SUFFIX, SWAP_SUFFIX, create_segment, open_segment
from strom.storage.log_config import LogConfig
from strom.storage.log_segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    ScannedBatch,
    file_name,
    next_offset_of_file,
)
from strom.storage.producer_state import ProducerStateManager
from strom.storage.transaction_index import TXN_INDEX_SUFFIX

log = logging.getLogger(__name__)

# Kafka's marker, one per log directory, written on clean shutdown.
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


@dataclass(frozen=True, slots=True)
class LoadedLog:
    """What a log starts from: its segments (at least one) and the offsets recovery left."""

    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int


def rebuild_producer_state(
    state: ProducerStateManager, segments: Sequence[LogSegment], log_start_offset: int, log_end_offset: int
) -> int:
    """Load the latest producer snapshot and replay the batches after it; returns batches replayed.
    The segments' transaction indexes are whole already: markers only end transactions."""
    start = state.load(log_start_offset, log_end_offset)
    replayed = 0
    for segment in segments:
        if segment.next_offset <= start:
            continue
        position = segment.offset_index.lookup(start).position if start > segment.base_offset else 0
        for batch in segment.scan(position, headers_only=True):
            header = batch.header
            if header.last_offset >= start:
                segment.update_producer_state(state, header, position=batch.position, index=False)
                replayed += 1
    state.advance_map_end_offset(log_end_offset)
    return replayed


class LogLoader:
    """Loads ``dir``; ``log_start_offset`` and ``recovery_point`` come from the log dir's
    checkpoint files (None when they name no offset for this partition)."""

    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        *,
        time_ms: Callable[[], int],
        had_clean_shutdown: bool,
        log_start_offset: int | None,
        recovery_point: int,
        leader_epoch_cache: LeaderEpochFileCache,
        producer_state: ProducerStateManager,
    ) -> None:
        self.dir = dir
        self.config = config
        self._time_ms = time_ms
        self.had_clean_shutdown = had_clean_shutdown
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self.leader_epoch_cache = leader_epoch_cache
        self.producer_state = producer_state

    def _segment_bases_on_disk(self, suffix: str = LOG_SUFFIX) -> list[int]:
        bases = []
        for path in self.dir.glob(f"*{suffix}"):
            stem = path.name[: -len(suffix)]
            if stem.isdigit():
                bases.append(int(stem))
        return sorted(bases)

    def _remove_temp_files_and_complete_swaps(self) -> None:
        """Delete leftovers of interrupted operations; a ``.log.swap`` replaces the segments it covers."""
        for path in list(self.dir.iterdir()):
            name = path.name
            if name.endswith((DELETED_SUFFIX, CLEANED_SUFFIX, ".tmp")):
                log.debug("deleting stray file %s", path)
                path.unlink()
            elif name.endswith(SWAP_SUFFIX) and not name.endswith(
                (LOG_SUFFIX + SWAP_SUFFIX, TXN_INDEX_SUFFIX + SWAP_SUFFIX)
            ):
                path.unlink()  # swapped offset and time indexes are rebuilt from the log
        for swap in sorted(self.dir.glob(f"*{LOG_SUFFIX}{SWAP_SUFFIX}")):
            self._complete_swap(swap)
        # A swapped transaction index without its log was never committed.
        for path in self.dir.glob(f"*{TXN_INDEX_SUFFIX}{SWAP_SUFFIX}"):
            path.unlink()
        # Indexes whose log file is gone are orphans.
        bases = set(self._segment_bases_on_disk())
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            for path in self.dir.glob(f"*{suffix}"):
                stem = path.name[: -len(suffix)]
                if stem.isdigit() and int(stem) not in bases:
                    path.unlink()

    def _complete_swap(self, swap: Path) -> None:
        """Finish an interrupted swap: the (complete) swap file replaces the segments it covers.

        The swap covers the offsets from its base to its last batch's end (the cleaner keeps
        each group's last batch, if only as an empty header, so that range is exactly the
        replaced segments'). Every segment file in that range, indexes without their log
        included, is renamed ``.deleted`` first, so a crash at any step leaves either the old
        files or the swap file to finish with at the next startup.
        """
        stem = swap.name[: -len(LOG_SUFFIX + SWAP_SUFFIX)]
        if not stem.isdigit():
            swap.unlink()
            return
        base = int(stem)
        end = max(next_offset_of_file(swap, base), base + 1)
        # The transaction index is derived from more than this segment's batches: it is kept,
        # not rebuilt. The cleaner swaps it in before its log, so without its .swap the one at
        # the base offset is already the new one.
        txn_swap = self.dir / (file_name(base, TXN_INDEX_SUFFIX) + SWAP_SUFFIX)
        new_txn_index = None if txn_swap.exists() else file_name(base, TXN_INDEX_SUFFIX)
        replaced = []
        for path in sorted(self.dir.iterdir()):
            if path.name == new_txn_index:
                continue
            for suffix in (TXN_INDEX_SUFFIX, TIME_INDEX_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX):
                other = path.name[: -len(suffix)]
                if path.name.endswith(suffix) and other.isdigit() and base <= int(other) < end:
                    deleted = path.with_name(path.name + DELETED_SUFFIX)
                    os.replace(path, deleted)
                    replaced.append(deleted)
        if new_txn_index is None:
            os.replace(txn_swap, self.dir / file_name(base, TXN_INDEX_SUFFIX))
        os.replace(swap, self.dir / file_name(base, LOG_SUFFIX))
        for path in replaced:
            path.unlink()
        log.info("completed interrupted segment swap", extra={"log": self.dir.name, "base_offset": base})

    def load(self) -> LoadedLog:
        started = time.monotonic()
        had_clean_shutdown, recovery_point = self.had_clean_shutdown, self.recovery_point
        self._remove_temp_files_and_complete_swaps()
        # One listing tells which segments have a transaction index (only those with an abort).
        txn_indexes = set(self._segment_bases_on_disk(TXN_INDEX_SUFFIX))
        segments = [
            open_segment(self.dir, base, self.config, self._time_ms(), base in txn_indexes)
            for base in self._segment_bases_on_disk()
        ]
        recovered = truncated = 0
        if had_clean_shutdown:
            first_to_recover = len(segments)
        else:
            bases = [segment.base_offset for segment in segments]
            first_to_recover = max(bisect.bisect_right(bases, recovery_point) - 1, 0)
        for i in range(first_to_recover):
            damage = segments[i].txn_index_damage
            if damage is not None:
                log.warning("%s; recovering its segment and every later one to rebuild it", damage)
                first_to_recover = i
                break
        for segment in segments[:first_to_recover]:
            segment.rebuild_indexes_if_corrupt()
        # Producer state is replayed through the recovered segments (their markers rebuild the
        # transaction indexes), from where the segments before them leave it.
        replay_start = max(self.log_start_offset or 0, segments[0].base_offset) if segments else 0
        if first_to_recover < len(segments):
            rebuild_producer_state(
                self.producer_state,
                segments[:first_to_recover],
                replay_start,
                segments[first_to_recover].base_offset,
            )
        for i in range(first_to_recover, len(segments)):
            segment = segments[i]
            if segment.has_aborted_txns or segment.txn_index_damage is not None:
                segment.txn_index.reset()
            cut = segment.recover(functools.partial(self._on_recovered_batch, segment))
            recovered += 1
            log.debug("recovered segment %s: %d bytes valid, %d cut", segment.log_path, segment.size, cut)
            if cut:
                # Nothing after an invalid batch can be trusted.
                truncated += cut
                for later in segments[i + 1 :]:
                    truncated += later.size
                    later.delete()
                del segments[i + 1 :]
                break
        for segment in segments[:-1]:
            segment.on_become_inactive()
            # Lazy indexes: an inactive segment holds no index entries or descriptors until read.
            segment.release_indexes()
        if self.leader_epoch_cache.rebuild_needed:
            self.leader_epoch_cache.rebuild(
                (batch.header.partition_leader_epoch, batch.header.base_offset)
                for segment in segments
                for batch in segment.scan(headers_only=True)
            )
        if not segments:
            segments.append(
                create_segment(self.dir, self.log_start_offset or 0, self.config, self._time_ms())
            )
        segments[-1].resize_indexes(self.config.segment_index_bytes)

        log_end = segments[-1].next_offset
        log_start_offset = max(self.log_start_offset or 0, segments[0].base_offset)
        if log_start_offset > log_end:
            # A checkpoint beyond the data is damaged, not a reason to hide the whole log.
            log.warning(
                "ignoring a checkpointed log start offset beyond the log end",
                extra={
                    "log": self.dir.name,
                    "log_start_offset": self.log_start_offset,
                    "log_end_offset": log_end,
                },
            )
            log_start_offset = segments[0].base_offset
        recovery_point = log_end if had_clean_shutdown else min(recovery_point, log_end)
        self.leader_epoch_cache.truncate_from_end(log_end)
        self.leader_epoch_cache.truncate_from_start(log_start_offset)
        if recovered and log_start_offset == replay_start:
            replayed = 0
            self.producer_state.advance_map_end_offset(log_end)
        else:
            replayed = rebuild_producer_state(self.producer_state, segments, log_start_offset, log_end)
        if had_clean_shutdown:
            self.producer_state.mark_snapshot_durable()
        elapsed_ms = int((time.monotonic() - started) * 1000)
        fields = {
            "log": self.dir.name,
            "segments": len(segments),
            "log_start_offset": log_start_offset,
            "log_end_offset": log_end,
            "recovered_segments": recovered,
            "truncated_bytes": truncated,
            "replayed_batches": replayed,
            "ms": elapsed_ms,
        }
        if had_clean_shutdown:
            log.debug("loaded log", extra=fields)
        else:
            log.info("recovered log", extra=fields)
        return LoadedLog(segments, log_start_offset, recovery_point)

    def _on_recovered_batch(self, segment: LogSegment, batch: ScannedBatch) -> None:
        header = batch.header
        epoch = header.partition_leader_epoch
        latest = self.leader_epoch_cache.latest_epoch
        if epoch >= 0 and (latest is None or epoch > latest):
            # Written by the log's next flush: the recovery point stays below this batch until then.
            self.leader_epoch_cache.assign(epoch, header.base_offset, flush=False)
        state = self.producer_state
        if header.last_offset >= state.map_end_offset:  # not below the log start offset
            segment.update_producer_state(state, header, batch.data)
