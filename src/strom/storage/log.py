"""Log: one partition's log, a directory ``<topic>-<partition>`` of segments (Kafka's UnifiedLog).

Threading: everything runs on the broker's event-loop thread except ``flush``,
which a worker thread may call while the loop appends, and the file-mutating steps the broker
submits to the log's serial I/O executor (``io``: truncation, leader-epoch checkpoint writes).
``flush`` only fsyncs file descriptors (each segment serialises that with its own close) and
reads the segment list under ``_lock``, the only lock that list mutations take; truncation holds
``_flush_lock`` so no flush moves the recovery point past it. While ``io`` is busy, the loop's
own mutations of the segment list (retention, the cleaner's swap) skip the log until next time.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import itertools
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from strom.records import batch as rb
from strom.storage.checkpoint import PARTITION_METADATA, PartitionMetadataFile, fsync_dir
from strom.storage.errors import (
    CorruptRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
)
from strom.storage.leader_epoch_cache import LeaderEpochFileCache
from strom.storage.log_config import LogConfig
from strom.storage.log_dir_failure import LogDirFailureChannel, LogDirOfflineError
from strom.storage.log_io import SerialExecutor
from strom.storage.log_segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    file_name,
    new_segment,
    next_offset_of_file,
)
from strom.storage.log_validator import DecompressionBudget, ValidatedRecords, analyze
from strom.storage.producer_state import ProducerStateManager

log = logging.getLogger(__name__)

# Kafka's marker, one per log directory, written on clean shutdown.
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

# Inactive segments whose index entries reads loaded stay in memory up to this many per log,
# least recently read released first (a 1 GiB segment's indexes hold about 5 MiB of entries).
MAX_LOADED_INACTIVE_INDEXES = 8

# ListOffsets special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
class LogAppendInfo:
    first_offset: int
    last_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    record_count: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FetchDataInfo:
    fetch_offset: int
    records: bytes


@dataclass(frozen=True, slots=True)
class FollowerRecords:
    """A leader's whole batches, checked for appending at ``first_offset`` (the log end then)."""

    data: memoryview
    headers: list[rb.BatchHeader]
    first_offset: int
    # Appending them records a new leader epoch: a checkpoint write with two fsyncs.
    new_leader_epoch: bool


@dataclass(frozen=True, slots=True)
class TimestampAndOffset:
    timestamp: int
    offset: int
    leader_epoch: int | None


class InconsistentTopicIdError(KafkaStorageError):
    """The directory's partition.metadata names another topic id (a stale directory)."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _log_dir_io(method: Callable[Concatenate[Log, _P], _R]) -> Callable[Concatenate[Log, _P], _R]:
    """An OSError under ``method`` (raw, or wrapped in a KafkaStorageError by a segment) takes the
    log's dir offline through its failure channel and surfaces as KAFKA_STORAGE_ERROR, unless the
    log was closed meanwhile: a follower's append on the log's I/O executor that meets the files
    its deletion just closed (EBADF) says nothing of the disk."""

    @functools.wraps(method)
    def guarded(self: Log, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except LogDirOfflineError:
            raise
        except OSError as e:
            if self._closed:
                raise KafkaStorageError(f"log {self.dir.name} closed during {method.__name__}") from e
            raise self.log_dir_failed(method.__name__, e) from e
        except KafkaStorageError as e:
            if isinstance(e.__cause__, OSError) and not self._closed:
                raise self.log_dir_failed(method.__name__, e.__cause__) from e
            raise

    return guarded


class Log:
    def __init__(
        self, dir: Path, config: LogConfig, topic_id: uuid.UUID | None, time_ms: Callable[[], int]
    ) -> None:
        self.dir = dir
        self.log_dir = dir.parent
        self.topic, self.partition = parse_topic_partition(dir.name)
        self.config = config
        self.topic_id = topic_id
        self._time_ms = time_ms
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._loaded_indexes: collections.OrderedDict[int, LogSegment] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self.log_start_offset = 0
        self.recovery_point = 0
        self.last_flush_ms = time_ms()
        self._roll_flush_pending = False
        self._closed = False
        # (when due, path): files of deleted segments, renamed ``.deleted``, that
        # delete_pending_files unlinks off the loop once file.delete.delay.ms has passed.
        self._files_to_delete: list[tuple[int, Path]] = []
        self.leader_epoch_cache = LeaderEpochFileCache(dir, lambda: self.log_end_offset)
        self.producer_state = ProducerStateManager(dir)
        # Set by LogManager: persists the log start offset when DeleteRecords moves it.
        self.log_start_offset_listener: Callable[[Log], None] | None = None
        # LogManager shares one channel between its logs; a log on its own has its own.
        self.log_dir_failure_channel = LogDirFailureChannel()
        # File-mutating steps off the event loop, one at a time in order (see the module doc).
        self.io = SerialExecutor()

    # --- opening and recovery -----------------------------------------------------

    @classmethod
    def open(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        topic_id: uuid.UUID | None = None,
        time_ms: Callable[[], int] = wall_clock_ms,
        log_start_offset: int | None = None,
        recovery_point: int | None = None,
        had_clean_shutdown: bool | None = None,
    ) -> Log:
        """Create or load the log in ``dir``; recover it if its log dir was not shut down cleanly.

        ``log_start_offset`` and ``recovery_point`` come from the log dir's checkpoint
        files (LogManager); ``had_clean_shutdown`` defaults to the presence of the
        log dir's clean-shutdown marker.
        """
        metadata = PartitionMetadataFile(dir / PARTITION_METADATA)
        try:
            dir.mkdir(parents=True, exist_ok=True)
            stored_id = metadata.read()
            if stored_id is not None and topic_id is not None and stored_id != topic_id:
                raise InconsistentTopicIdError(f"{dir} belongs to topic id {stored_id}, not {topic_id}")
            if stored_id is None and topic_id is not None:
                metadata.write(topic_id)
        except OSError as e:
            raise KafkaStorageError(f"error opening log {dir}: {e}") from e
        if had_clean_shutdown is None:
            had_clean_shutdown = (dir.parent / CLEAN_SHUTDOWN_FILE).exists()
        log_ = cls(dir, config, topic_id or stored_id, time_ms)
        try:
            log_._load(had_clean_shutdown, recovery_point or 0, log_start_offset)
        except OSError as e:
            raise KafkaStorageError(f"error loading log {dir}: {e}") from e
        return log_

    def _new_segment(self, base_offset: int) -> LogSegment:
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            (self.dir / file_name(base_offset, suffix)).unlink(missing_ok=True)
        return new_segment(
            self.dir,
            base_offset,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_size=self.config.segment_index_bytes,
            segment_jitter_ms=self.config.segment_jitter_ms,
            now_ms=self._time_ms(),
        )

    def _open_segment(self, base_offset: int) -> LogSegment:
        return LogSegment(
            self.dir,
            base_offset,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_size=self.config.segment_index_bytes,
            roll_jitter_ms=0,
            now_ms=self._time_ms(),
        )

    def _segment_bases_on_disk(self) -> list[int]:
        bases = []
        for path in self.dir.glob(f"*{LOG_SUFFIX}"):
            stem = path.name[: -len(LOG_SUFFIX)]
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
            elif name.endswith(SWAP_SUFFIX) and not name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
                path.unlink()  # swapped indexes are rebuilt from the log
        for swap in sorted(self.dir.glob(f"*{LOG_SUFFIX}{SWAP_SUFFIX}")):
            self._complete_swap(swap)
        # Indexes whose log file is gone are orphans.
        bases = set(self._segment_bases_on_disk())
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
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
        replaced = []
        for path in sorted(self.dir.iterdir()):
            for suffix in (TIME_INDEX_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX):
                other = path.name[: -len(suffix)]
                if path.name.endswith(suffix) and other.isdigit() and base <= int(other) < end:
                    deleted = path.with_name(path.name + DELETED_SUFFIX)
                    os.replace(path, deleted)
                    replaced.append(deleted)
        os.replace(swap, self.dir / file_name(base, LOG_SUFFIX))
        for path in replaced:
            path.unlink()
        log.info("completed interrupted segment swap", extra={"log": self.dir.name, "base_offset": base})

    def _load(self, had_clean_shutdown: bool, recovery_point: int, log_start_offset: int | None) -> None:
        started = time.monotonic()
        self._remove_temp_files_and_complete_swaps()
        segments = [self._open_segment(base) for base in self._segment_bases_on_disk()]
        recovered = truncated = 0
        if had_clean_shutdown:
            for segment in segments:
                segment.rebuild_indexes_if_corrupt()
        else:
            bases = [segment.base_offset for segment in segments]
            first_unflushed = max(bisect.bisect_right(bases, recovery_point) - 1, 0)
            for segment in segments[:first_unflushed]:
                segment.rebuild_indexes_if_corrupt()
            for i in range(first_unflushed, len(segments)):
                segment = segments[i]
                cut = segment.recover(self._on_recovered_batch)
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
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        if self.leader_epoch_cache.rebuild_needed:
            self.leader_epoch_cache.rebuild(
                (batch.header.partition_leader_epoch, batch.header.base_offset)
                for segment in segments
                for batch in segment.scan(headers_only=True)
            )
        if not segments:
            self._add_segment(self._new_segment(log_start_offset or 0))
        self.active_segment.resize_indexes(self.config.segment_index_bytes)

        log_end = self.log_end_offset
        self.log_start_offset = max(log_start_offset or 0, self._segments[0].base_offset)
        if self.log_start_offset > log_end:
            # A checkpoint beyond the data is damaged, not a reason to hide the whole log.
            log.warning(
                "ignoring a checkpointed log start offset beyond the log end",
                extra={"log": self.dir.name, "log_start_offset": log_start_offset, "log_end_offset": log_end},
            )
            self.log_start_offset = self._segments[0].base_offset
        self.recovery_point = log_end if had_clean_shutdown else min(recovery_point, log_end)
        self.leader_epoch_cache.truncate_from_end(log_end)
        self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
        replayed = self._rebuild_producer_state()
        elapsed_ms = int((time.monotonic() - started) * 1000)
        fields = {
            "log": self.dir.name,
            "segments": len(self._segments),
            "log_start_offset": self.log_start_offset,
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

    def _on_recovered_batch(self, header: rb.BatchHeader) -> None:
        epoch = header.partition_leader_epoch
        latest = self.leader_epoch_cache.latest_epoch
        if epoch >= 0 and (latest is None or epoch > latest):
            self.leader_epoch_cache.assign(epoch, header.base_offset)

    def _rebuild_producer_state(self) -> int:
        """Load the latest producer snapshot and replay the batches after it; returns batches replayed."""
        state = self.producer_state
        start = state.load(self.log_start_offset, self.log_end_offset)
        replayed = 0
        for segment in self._segments:
            if segment.next_offset <= start:
                continue
            position = segment.offset_index.lookup(start).position if start > segment.base_offset else 0
            for batch in segment.scan(position, headers_only=True):
                header = batch.header
                if header.last_offset >= start:
                    state.update(header, header.base_offset, header.max_timestamp)
                    replayed += 1
        state.advance_map_end_offset(self.log_end_offset)
        return replayed

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

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def offline(self) -> bool:
        """The log's dir failed an I/O operation: nothing is read or written until a restart."""
        channel = self.log_dir_failure_channel
        return channel.any_offline and channel.is_offline(self.log_dir)

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log {self.dir.name} is closed")
        if self.offline:
            raise self.log_dir_failure_channel.offline_error(self.log_dir)

    def log_dir_failed(self, what: str, cause: OSError) -> LogDirOfflineError:
        """Take the log's dir offline (once) for ``cause``; the error to raise."""
        return self.log_dir_failure_channel.maybe_add_offline_log_dir(
            self.log_dir, f"{what} on {self.dir.name}", cause
        )

    # --- appending ------------------------------------------------------------------

    def analyze_for_append(
        self, records: bytes | bytearray | memoryview, budget: DecompressionBudget | None = None
    ) -> ValidatedRecords:
        """Validate a client's record set (every record, see log_validator) and recompress it if
        the topic asks; ``budget``: its request's decompression allowance. Reads only the config
        and the clock: safe on a worker thread."""
        return analyze(records, self.config, self._time_ms(), f"{self.topic}-{self.partition}", budget)

    @_log_dir_io
    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        validated: ValidatedRecords | None = None,
    ) -> LogAppendInfo:
        """Validate a client's record set (unless ``validated`` is analyze_for_append's answer
        for it), assign offsets and append it.

        A writable buffer (bytearray, writable memoryview) is rewritten in place; of bytes, only
        the batch headers are copied.
        """
        self._check_open()
        config = self.config
        if validated is None:
            validated = self.analyze_for_append(records)
        records, headers = validated.records, validated.headers
        now = self._time_ms()
        duplicate = self.producer_state.check_append(headers)
        log_append_time = now if config.message_timestamp_type == "LogAppendTime" else rb.NO_TIMESTAMP
        if duplicate is not None:
            return LogAppendInfo(
                duplicate.first_offset,
                duplicate.last_offset,
                duplicate.timestamp if log_append_time >= 0 else rb.NO_TIMESTAMP,
                self.log_start_offset,
                duplicate.last_offset - duplicate.first_offset + 1,
                duplicate=True,
            )

        # A writable buffer is rewritten in place. Bytes are not copied: each batch's header is,
        # rewritten, and written ahead of the batch's records where they lie (one pwritev).
        writable = isinstance(records, bytearray) or (
            isinstance(records, memoryview) and not records.readonly
        )
        view = memoryview(records)
        parts: list[bytearray | memoryview] = []
        first_offset = next_offset = self.log_end_offset
        assigned: list[rb.BatchHeader] = []
        record_count = 0
        max_timestamp = rb.NO_TIMESTAMP
        for header in headers:
            position = header.position
            head: bytearray | memoryview
            batch: memoryview | None
            if writable:
                head, at, batch = view, position, None
            else:
                head, at, batch = bytearray(view[position : position + rb.HEADER_SIZE]), 0, view
            rb.set_base_offset(head, at, next_offset)
            rb.set_partition_leader_epoch(head, at, leader_epoch)
            if log_append_time >= 0:
                rb.set_log_append_time(head, header, log_append_time, batch)
            elif validated.max_timestamps[len(assigned)] != header.max_timestamp:
                # As Kafka, a CreateTime batch's maxTimestamp is its records' largest timestamp.
                rb.set_max_timestamp(head, header, validated.max_timestamps[len(assigned)], batch)
            final = rb.read_header(head, at)
            if not writable:
                final = replace(final, position=position)
                parts += (head, view[position + rb.HEADER_SIZE : position + header.size])
            assigned.append(final)
            record_count += final.records_count
            max_timestamp = max(max_timestamp, final.max_timestamp)
            next_offset = final.next_offset
        last_offset = next_offset - 1

        segment = self.active_segment
        if segment.should_roll(
            config.segment_bytes, config.segment_ms, len(view), max_timestamp, last_offset, now
        ):
            segment = self.roll()
        latest_epoch = self.leader_epoch_cache.latest_epoch
        if leader_epoch >= 0 and (latest_epoch is None or leader_epoch > latest_epoch):
            self.leader_epoch_cache.assign(leader_epoch, first_offset)
        segment.append(view if writable else parts, assigned)
        state = self.producer_state
        for header in assigned:
            state.update(header, header.base_offset, header.max_timestamp)
        # flush.messages: the caller flushes (off the event loop) when flush_messages_due says so.
        return LogAppendInfo(first_offset, last_offset, log_append_time, self.log_start_offset, record_count)

    @_log_dir_io
    def append_as_follower(self, records: bytes | bytearray | memoryview) -> LogAppendInfo | None:
        """Append batches fetched from the partition's leader, keeping their offsets and leader
        epochs: ``analyze_follower_records``, then ``append_analyzed_as_follower``. Returns None
        when ``records`` holds no whole batch."""
        analyzed = self.analyze_follower_records(records)
        return None if analyzed is None else self.append_analyzed_as_follower(analyzed)

    @_log_dir_io
    def analyze_follower_records(self, records: bytes | bytearray | memoryview) -> FollowerRecords | None:
        """Check a leader's batches for appending at the log end, writing nothing.

        The leader validated every record; a follower checks structure only, as Kafka's
        appendAsFollower does: batch framing, sizes and CRCs, and offsets contiguous from the log
        end. A trailing partial batch (a fetch response cut at its size limit) is left for the next
        fetch. Returns None when ``records`` holds no whole batch. Raises CorruptRecordError for a
        damaged batch and OffsetOutOfRangeError when the first offset is not the log end.
        """
        self._check_open()
        view = memoryview(records)
        headers: list[rb.BatchHeader] = []
        expected = first_offset = self.log_end_offset
        latest_epoch = self.leader_epoch_cache.latest_epoch
        new_leader_epoch = False
        position = 0
        try:
            while len(view) - position >= rb.HEADER_SIZE:
                header = rb.read_header(view, position)
                if position + header.size > len(view):
                    break  # partial last batch
                if not rb.is_crc_valid(view, header):
                    raise CorruptRecordError(
                        f"record batch at offset {header.base_offset} from the leader is corrupt "
                        f"(stored crc = {header.crc})"
                    )
                if header.last_offset_delta < 0:
                    raise CorruptRecordError(
                        f"record batch at {header.base_offset} has a negative offset delta"
                    )
                if header.base_offset != expected:
                    raise OffsetOutOfRangeError(
                        f"{self.topic}-{self.partition}: the leader's batch starts at offset "
                        f"{header.base_offset}, the log expects {expected}"
                    )
                epoch = header.partition_leader_epoch
                if epoch >= 0 and (latest_epoch is None or epoch > latest_epoch):
                    new_leader_epoch = True
                headers.append(header)
                expected = header.next_offset
                position += header.size
        except rb.InvalidBatchError as e:
            raise CorruptRecordError(f"malformed record batch from the leader: {e}") from e
        if not headers:
            return None
        return FollowerRecords(view[:position], headers, first_offset, new_leader_epoch)

    @_log_dir_io
    def append_analyzed_as_follower(self, analyzed: FollowerRecords) -> LogAppendInfo:
        """Append what ``analyze_follower_records`` checked; the log must still end where it did.
        With ``new_leader_epoch`` it writes the epoch checkpoint: the broker runs it on ``io``."""
        self._check_open()
        headers = analyzed.headers
        first_offset = analyzed.first_offset
        if first_offset != self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"{self.topic}-{self.partition}: the leader's batches start at offset {first_offset}, "
                f"the log now ends at {self.log_end_offset}"
            )
        data = analyzed.data
        max_timestamp = max(header.max_timestamp for header in headers)
        last_offset = headers[-1].next_offset - 1
        segment = self.active_segment
        now = self._time_ms()
        config = self.config
        if segment.should_roll(
            config.segment_bytes, config.segment_ms, len(data), max_timestamp, last_offset, now
        ):
            segment = self.roll()
        cache = self.leader_epoch_cache
        for header in headers:
            latest = cache.latest_epoch
            epoch = header.partition_leader_epoch
            if epoch >= 0 and (latest is None or epoch > latest):
                # The follower's epoch cache mirrors the leader's: epochs start where their batches do.
                cache.assign(epoch, header.base_offset)
        segment.append(data, headers)
        state = self.producer_state
        for header in headers:
            # Producer state as on the leader, so this replica can lead with idempotence intact.
            state.update(header, header.base_offset, header.max_timestamp)
        record_count = sum(header.records_count for header in headers)
        return LogAppendInfo(first_offset, last_offset, rb.NO_TIMESTAMP, self.log_start_offset, record_count)

    @_log_dir_io
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset (no-op if the active one is empty)."""
        self._check_open()
        active = self.active_segment
        if active.size == 0:
            return active
        new_base = self.log_end_offset
        # Kafka snapshots producer state at every roll so startup only replays the last segment.
        self.producer_state.advance_map_end_offset(new_base)
        self.producer_state.take_snapshot()
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

    @_log_dir_io
    def flush(self, up_to: int | None = None) -> None:
        """fsync everything below ``up_to`` (default: the log end) and advance the recovery point.

        Safe to call from a worker thread while the event loop appends: it reads the
        log end before syncing, and only data written before that is counted.
        """
        with self._flush_lock:
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
            self.last_flush_ms = self._time_ms()

    # --- reading ----------------------------------------------------------------------

    @_log_dir_io
    def read(
        self, fetch_offset: int, max_bytes: int, max_offset: int | None = None, min_one_batch: bool = True
    ) -> FetchDataInfo:
        """Whole batches from the one containing ``fetch_offset``, below ``max_offset`` (the HW)."""
        self._check_open()
        log_end = self.log_end_offset
        if fetch_offset < self.log_start_offset or fetch_offset > log_end:
            raise OffsetOutOfRangeError(
                f"offset {fetch_offset} is out of range for partition {self.topic}-{self.partition}: "
                f"log start offset {self.log_start_offset}, log end offset {log_end}"
            )
        if fetch_offset == log_end or (max_offset is not None and fetch_offset >= max_offset):
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

    @_log_dir_io
    def fetch_offset_by_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        """ListOffsets: the first offset whose record timestamp >= ``timestamp``, or a special one."""
        self._check_open()
        cache = self.leader_epoch_cache
        if timestamp == EARLIEST_TIMESTAMP:
            earliest = cache.earliest_entry
            epoch = earliest[0] if earliest is not None and earliest[1] <= self.log_start_offset else None
            return TimestampAndOffset(rb.NO_TIMESTAMP, self.log_start_offset, epoch)
        if timestamp == EARLIEST_LOCAL_TIMESTAMP:
            return TimestampAndOffset(
                rb.NO_TIMESTAMP, self.log_start_offset, cache.epoch_for_offset(self.log_start_offset)
            )
        if timestamp == LATEST_TIMESTAMP:
            return TimestampAndOffset(rb.NO_TIMESTAMP, self.log_end_offset, cache.latest_epoch)
        if timestamp == MAX_TIMESTAMP:
            return self._max_timestamp_and_offset()
        if timestamp < 0:
            return None
        for segment in self._segments:
            if segment.max_timestamp_so_far >= timestamp:
                # Compaction can leave a segment whose newest records (or batches emptied
                # down to their header) are gone: go on to the next segment then.
                found = self._search_segment(segment, timestamp)
                if found is not None:
                    return found
        return None

    def _max_timestamp_and_offset(self) -> TimestampAndOffset | None:
        segment = max(self._segments, key=lambda s: s.max_timestamp_so_far)
        if segment.max_timestamp_so_far < 0:
            return None
        return self._search_segment(segment, segment.max_timestamp_so_far, exact=True)

    def _search_segment(
        self, segment: LogSegment, target: int, exact: bool = False
    ) -> TimestampAndOffset | None:
        """First record in ``segment`` at or after log start with timestamp >= target (== target if exact)."""
        from strom.records import scanner

        start = max(segment.time_index.lookup(target).offset, self.log_start_offset)
        position = segment.offset_index.lookup(start).position
        self._note_index_use(segment)
        for batch in segment.scan(position):
            header = batch.header
            if header.max_timestamp < target or header.last_offset < self.log_start_offset:
                continue
            epoch = header.partition_leader_epoch if header.partition_leader_epoch >= 0 else None
            if header.timestamp_type == rb.TimestampType.LOG_APPEND_TIME:
                return TimestampAndOffset(
                    header.max_timestamp, max(header.base_offset, self.log_start_offset), epoch
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
                if offset >= self.log_start_offset and (
                    timestamp == target if exact else timestamp >= target
                ):
                    return TimestampAndOffset(timestamp, offset, epoch)
        return None

    def end_offset_for_epoch(self, requested_epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (epoch, end offset), or (-1, -1) when unknown."""
        return self.leader_epoch_cache.end_offset_for(requested_epoch, self.log_end_offset)

    # --- deleting data ------------------------------------------------------------------

    @_log_dir_io
    def delete_records(self, offset: int) -> int:
        """DeleteRecords: move the log start offset up to ``offset``; returns the new log start offset."""
        self._check_open()
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"cannot delete records of {self.topic}-{self.partition} below {offset}: "
                f"beyond the log end offset {self.log_end_offset}"
            )
        if offset > self.log_start_offset:
            self._increment_log_start_offset(offset, persist=True)
            self._delete_segments(self._deletable_below_log_start())
        return self.log_start_offset

    @_log_dir_io
    def delete_retention_segments(self, now_ms: int | None = None, high_watermark: int | None = None) -> int:
        """Apply retention.ms / retention.bytes and drop segments below the log start; returns count.

        As in Kafka, an expired active segment is deleted too (after rolling a new one),
        and nothing at or above the high watermark (default: log end) is deleted.
        """
        self._check_open()
        if self.io.busy:
            return 0  # a truncation is under way on the I/O executor: next time
        now = self._time_ms() if now_ms is None else now_ms
        upper = self.log_end_offset if high_watermark is None else high_watermark
        deleted = self._delete_segments(self._deletable_below_log_start())
        if "delete" not in self.config.cleanup_policy:
            return deleted
        retention_ms = self.config.retention_ms
        if retention_ms >= 0:
            deleted += self._delete_segments(
                self._deletable(lambda s: now - s.largest_timestamp > retention_ms, upper)
            )
        if self.config.retention_bytes >= 0:
            excess = self.size_in_bytes - self.config.retention_bytes

            def over_size(segment: LogSegment) -> bool:
                nonlocal excess
                if excess - segment.size < 0:
                    return False
                excess -= segment.size
                return True

            deleted += self._delete_segments(self._deletable(over_size, upper))
        return deleted

    def _deletable_below_log_start(self) -> list[LogSegment]:
        segments = self._segments
        return [
            s
            for s, following in itertools.pairwise(segments)
            if following.base_offset <= self.log_start_offset
        ]

    def _deletable(self, predicate: Callable[[LogSegment], bool], upper_bound: int) -> list[LogSegment]:
        deletable = []
        for i, segment in enumerate(self._segments):
            is_last = i == len(self._segments) - 1
            if is_last and segment.size == 0:
                break
            if segment.next_offset > upper_bound or not predicate(segment):
                break
            deletable.append(segment)
        return deletable

    def _delete_segments(self, deletable: list[LogSegment]) -> int:
        if not deletable:
            return 0
        if len(deletable) == len(self._segments):
            # A log always has a segment: roll a new one before deleting all of them.
            self.roll()
        with self._lock:
            gone = {id(s) for s in deletable}
            self._segments = [s for s in self._segments if id(s) not in gone]
            self._bases = [s.base_offset for s in self._segments]
        renamed = [path for segment in deletable for path in segment.rename_to_deleted(DELETED_SUFFIX)]
        due_ms = self._time_ms() + self.config.file_delete_delay_ms
        with self._lock:
            self._files_to_delete.extend((due_ms, path) for path in renamed)
        first_base = self._segments[0].base_offset
        if first_base > self.log_start_offset:
            self._increment_log_start_offset(first_base)
        self.producer_state.delete_snapshots_before(first_base)
        log.info(
            "deleted segments",
            extra={
                "log": self.dir.name,
                "segments": len(deletable),
                "log_start_offset": self.log_start_offset,
            },
        )
        return len(deletable)

    @_log_dir_io
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
        startup's ``_complete_swap`` finishes the job.
        """
        if self._closed or not old or self.io.busy:
            return None
        start = next((i for i, s in enumerate(self._segments) if s is old[0]), None)
        if start is None or start + len(old) >= len(self._segments):  # never the active segment
            return None
        current = self._segments[start : start + len(old)]
        if any(a is not b or a.size != size for a, b, size in zip(current, old, sizes, strict=True)):
            return None
        base = old[0].base_offset
        suffixes = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX)  # the log last: its rename commits
        final = {suffix: self.dir / file_name(base, suffix) for suffix in suffixes}
        deleted: list[Path] = []
        try:
            for suffix in suffixes:
                cleaned = final[suffix].with_name(final[suffix].name + CLEANED_SUFFIX)
                os.replace(cleaned, final[suffix].with_name(final[suffix].name + SWAP_SUFFIX))
            for segment in old:
                for suffix in (TIME_INDEX_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX):
                    path = self.dir / file_name(segment.base_offset, suffix)
                    doomed = path.with_name(path.name + DELETED_SUFFIX)
                    with contextlib.suppress(FileNotFoundError):  # an index never written
                        os.replace(path, doomed)
                        deleted.append(doomed)
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                os.replace(final[suffix].with_name(final[suffix].name + SWAP_SUFFIX), final[suffix])
            segment = self._open_segment(base)
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
        for replaced in old[1:]:
            # As in Kafka, a segment's producer snapshot goes with it; later snapshots still cover it.
            self.producer_state.delete_snapshot(replaced.base_offset)
        return segment, deleted

    @_log_dir_io
    def delete_pending_files(self, now_ms: int | None = None) -> int:
        """Unlink the files of segments deleted by retention or DeleteRecords whose
        ``file.delete.delay.ms`` has passed; returns how many.

        Safe on a worker thread: the files are already out of the segment list and renamed.
        """
        now = self._time_ms() if now_ms is None else now_ms
        with self._lock:
            due = [path for when, path in self._files_to_delete if when <= now]
            self._files_to_delete = [(when, path) for when, path in self._files_to_delete if when > now]
        for path in due:
            path.unlink(missing_ok=True)
        return len(due)

    @_log_dir_io
    def follow_log_start_offset(self, leader_log_start_offset: int, high_watermark: int) -> None:
        """A follower's log start offset follows its leader's (which DeleteRecords or retention
        moved), up to its own high watermark; the segments below it go."""
        self._check_open()
        offset = min(leader_log_start_offset, high_watermark, self.log_end_offset)
        if offset > self.log_start_offset:
            self._increment_log_start_offset(offset, persist=True)
            self._delete_segments(self._deletable_below_log_start())

    def _increment_log_start_offset(self, offset: int, persist: bool = False) -> None:
        """``persist``: tell the listener (DeleteRecords); a start at a segment base is implied by the files."""
        self.log_start_offset = offset
        self.leader_epoch_cache.truncate_from_start(offset)
        if persist and self.log_start_offset_listener is not None:
            self.log_start_offset_listener(self)

    @_log_dir_io
    def truncate_to(self, offset: int) -> bool:
        """Remove every batch at or after the one containing ``offset`` (follower truncation).

        Unlinks segments, fsyncs the leader-epoch checkpoint and replays producer state: the
        broker runs it on ``io``."""
        self._check_open()
        if offset < 0:
            raise ValueError(f"cannot truncate to a negative offset {offset}")
        with self._flush_lock:
            if offset >= self.log_end_offset:
                return False
            if offset < self._segments[0].base_offset:
                self._truncate_fully_and_start_at(offset)
                return True
            with self._lock:
                keep = self._floor_segment_index(offset)
                removed = self._segments[keep + 1 :]
                self._segments = self._segments[: keep + 1]
                self._bases = self._bases[: keep + 1]
            for segment in removed:
                segment.delete()
            self.active_segment.truncate_to(offset)
            self._after_truncation()
            return True

    @_log_dir_io
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and restart it empty at ``offset`` (a follower far behind its leader's
        log start offset). Unlinks every segment: the broker runs it on ``io``."""
        self._check_open()
        with self._flush_lock:
            self._truncate_fully_and_start_at(offset)

    def _truncate_fully_and_start_at(self, offset: int) -> None:
        # The list is replaced, never emptied: the loop may read the log end meanwhile.
        for segment in self._segments:
            segment.delete()
        segment = self._new_segment(offset)
        with self._lock:
            self._segments, self._bases = [segment], [offset]
        self.log_start_offset = offset
        with self._lock:
            self.recovery_point = offset
        # Every epoch started below the new start: none describes this log any more.
        self.leader_epoch_cache.clear()
        self._after_truncation()

    def _after_truncation(self) -> None:
        log_end = self.log_end_offset
        self.log_start_offset = min(self.log_start_offset, log_end)
        with self._lock:
            self.recovery_point = min(self.recovery_point, log_end)
        self.leader_epoch_cache.truncate_from_end(log_end)
        self.producer_state.truncate_and_reload(self.log_start_offset, log_end)
        self._rebuild_producer_state()

    # --- lifecycle ----------------------------------------------------------------------

    def update_config(self, config: LogConfig) -> None:
        """New settings apply from the next append (and the next segment, for segment settings)."""
        self.config = config

    def close(self) -> None:
        """Flush, snapshot producer state at the log end and release every file.

        Never raises for I/O: an error takes the log dir offline (logged once), the files are
        released all the same (Kafka's closeHandlers: no flush, snapshot or final index entry
        on a failed dir) and the next start recovers the log.
        """
        if self._closed:
            return
        with contextlib.suppress(LogDirOfflineError):
            self._flush_and_snapshot()
        with self._flush_lock:
            self._closed = True
            for segment in self._segments:
                if self.offline:
                    segment.close_handles()
                    continue
                try:
                    segment.close()
                except OSError as e:
                    self.log_dir_failed("close", e)

    @_log_dir_io
    def _flush_and_snapshot(self) -> None:
        if self.offline:
            return
        self.flush()
        self.leader_epoch_cache.flush()
        with self._flush_lock:
            self.producer_state.advance_map_end_offset(self.log_end_offset)
            self.producer_state.take_snapshot(sync=True)

    @_log_dir_io
    def delete(self) -> None:
        """Close the log and remove its directory.

        The directory is renamed ``<name>.<id>-delete`` first (as Kafka does; startup finishes
        such deletions), so a cleaner thread still writing files by path cannot recreate any
        inside the tree being removed. Like Kafka's asyncDelete, it closes the files without the
        flush and producer snapshot of ``close``: their data is about to go.
        """
        with self._flush_lock:
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

    def __repr__(self) -> str:
        return (
            f"Log({self.dir.name}, log_start_offset={self.log_start_offset}, "
            f"log_end_offset={self.log_end_offset}, segments={len(self._segments)})"
        )
