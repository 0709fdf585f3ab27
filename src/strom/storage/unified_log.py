"""UnifiedLog: one partition's log as Partition and the broker use it (Kafka's UnifiedLog).

It owns a LocalLog (the segments of the directory ``<topic>-<partition>``) and adds what is
about offsets rather than files: the log start offset (DeleteRecords, retention, a follower
following its leader's), leader epochs, producer state (idempotence), validation and offset
assignment of a leader's appends, the checks of a follower's, ListOffsets and truncation by epoch.
``open`` has LogLoader load or recover the directory and starts from what it returns. The
partition's high watermark is Partition's.

Transactions: producer state tracks each producer's ongoing transaction; the coordinator's
COMMIT/ABORT markers (``append_transaction_marker`` on a leader, control batches on a follower)
end them, and an aborted one enters the transaction index of the segment its marker lands in.
``last_stable_offset`` and ``collect_aborted_transactions`` are what a ``read_committed`` fetch
asks; both cost nothing much without transactions.

Threading: as LocalLog's module says; the file-mutating steps the broker submits to the log's
serial I/O executor (``io``) are truncation and leader-epoch checkpoint writes. While ``io`` is
busy, the loop's own mutations of the segment list (retention, the cleaner's swap) skip the log
until next time.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from strom.records import batch as rb
from strom.records.control import ControlRecordType, build_control_batch
from strom.storage.append_origin import AppendOrigin
from strom.storage.checkpoint import PARTITION_METADATA, PartitionMetadataFile
from strom.storage.errors import (
    CorruptRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
)
from strom.storage.file_cache import file_cache
from strom.storage.leader_epoch_cache import LeaderEpochFileCache
from strom.storage.local_log import FetchDataInfo, LocalLog, TimestampAndOffset, create_segment
from strom.storage.log_config import LogConfig
from strom.storage.log_dir_failure import LogDirFailureChannel, LogDirOfflineError
from strom.storage.log_io import SerialExecutor
from strom.storage.log_loader import CLEAN_SHUTDOWN_FILE, LogLoader, rebuild_producer_state
from strom.storage.log_segment import LogSegment
from strom.storage.log_validator import DecompressionBudget, ValidatedRecords, analyze
from strom.storage.producer_state import ProducerStateManager
from strom.storage.transaction_index import AbortedTxn

log = logging.getLogger(__name__)

# ListOffsets special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class LogAppendInfo:
    first_offset: int
    last_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    record_count: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FollowerRecords:
    """A leader's whole batches, checked for appending at ``first_offset`` (the log end then)."""

    data: memoryview
    headers: list[rb.BatchHeader]
    first_offset: int


class InconsistentTopicIdError(KafkaStorageError):
    """The directory's partition.metadata names another topic id (a stale directory)."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _log_dir_io(
    method: Callable[Concatenate[UnifiedLog, _P], _R],
) -> Callable[Concatenate[UnifiedLog, _P], _R]:
    """An OSError under ``method`` (raw, or wrapped in a KafkaStorageError by a segment) takes the
    log's dir offline through its failure channel and surfaces as KAFKA_STORAGE_ERROR, unless the
    log was closed meanwhile: a follower's append on the log's I/O executor that meets the files
    its deletion just closed (EBADF) says nothing of the disk."""

    @functools.wraps(method)
    def guarded(self: UnifiedLog, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except LogDirOfflineError:
            raise
        except OSError as e:
            if self.closed:
                raise KafkaStorageError(f"log {self.dir.name} closed during {method.__name__}") from e
            raise self.log_dir_failed(method.__name__, e) from e
        except KafkaStorageError as e:
            if isinstance(e.__cause__, OSError) and not self.closed:
                raise self.log_dir_failed(method.__name__, e.__cause__) from e
            raise

    return guarded


class UnifiedLog:
    def __init__(
        self,
        local_log: LocalLog,
        log_start_offset: int,
        leader_epoch_cache: LeaderEpochFileCache,
        producer_state: ProducerStateManager,
        topic_id: uuid.UUID | None = None,
    ) -> None:
        self._local = local_log
        self.dir = local_log.dir
        self.log_dir = local_log.log_dir
        self.topic, self.partition = local_log.topic, local_log.partition
        self.topic_id = topic_id
        self._time_ms = local_log.time_ms
        self.log_start_offset = log_start_offset
        self.leader_epoch_cache = leader_epoch_cache
        self.producer_state = producer_state
        # Set by LogManager: persists the log start offset when DeleteRecords moves it.
        self.log_start_offset_listener: Callable[[UnifiedLog], None] | None = None
        # File-mutating steps off the event loop, one at a time in order (see the module doc).
        self.io = SerialExecutor()

    # --- opening ------------------------------------------------------------------

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
    ) -> UnifiedLog:
        """Create or load the log in ``dir``; recover it if its log dir was not shut down cleanly.

        ``log_start_offset`` and ``recovery_point`` come from the log dir's checkpoint
        files (LogManager); ``had_clean_shutdown`` defaults to the presence of the
        log dir's clean-shutdown marker. Running out of descriptors gives cached ones back and
        tries again (the steps are idempotent: a new segment replaces any files at its name).
        """
        return file_cache().retry_out_of_descriptors(
            lambda: cls._open(
                dir,
                config,
                topic_id=topic_id,
                time_ms=time_ms,
                log_start_offset=log_start_offset,
                recovery_point=recovery_point,
                had_clean_shutdown=had_clean_shutdown,
            )
        )

    @classmethod
    def create(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        topic_id: uuid.UUID | None,
        time_ms: Callable[[], int],
        leader_epoch: int,
    ) -> UnifiedLog:
        """A new, empty log in a directory made here; FileExistsError if it exists (``open`` it).

        Nothing on disk needs loading or recovering, and nothing is synced: the caller syncs the
        new files and directory, then ``commit_topic_id`` (LogManager.open_new_logs batches both
        over many logs). ``leader_epoch`` (-1 for a follower, which learns its epochs from the
        leader's batches) is kept in memory until the log's first flush, as any new epoch.
        """
        dir.mkdir()
        try:
            if topic_id is not None:
                PartitionMetadataFile(dir / PARTITION_METADATA).write_unsynced(topic_id)
            segment = create_segment(dir, 0, config, time_ms())
        except OSError as e:
            raise KafkaStorageError(f"error creating log {dir}: {e}") from e
        leader_epoch_cache = LeaderEpochFileCache(dir, lambda: log_.log_end_offset)
        leader_epoch_cache.rebuild(())  # from no batches: nothing to write
        if leader_epoch >= 0:
            leader_epoch_cache.assign(leader_epoch, 0, flush=False)
        local_log = LocalLog(dir, config, [segment], 0, time_ms)
        log_ = cls(local_log, 0, leader_epoch_cache, ProducerStateManager(dir), topic_id)
        return log_

    def commit_topic_id(self) -> None:
        """Rename the partition.metadata that ``create`` wrote into place, once it is synced."""
        PartitionMetadataFile(self.dir / PARTITION_METADATA).commit()

    @classmethod
    def _open(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        topic_id: uuid.UUID | None,
        time_ms: Callable[[], int],
        log_start_offset: int | None,
        recovery_point: int | None,
        had_clean_shutdown: bool | None,
    ) -> UnifiedLog:
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
        # The cache answers for the log's end offset: the log it describes is built below.
        leader_epoch_cache = LeaderEpochFileCache(dir, lambda: log_.log_end_offset)
        producer_state = ProducerStateManager(dir)
        loader = LogLoader(
            dir,
            config,
            time_ms=time_ms,
            had_clean_shutdown=had_clean_shutdown,
            log_start_offset=log_start_offset,
            recovery_point=recovery_point or 0,
            leader_epoch_cache=leader_epoch_cache,
            producer_state=producer_state,
        )
        try:
            loaded = loader.load()
        except OSError as e:
            raise KafkaStorageError(f"error loading log {dir}: {e}") from e
        local_log = LocalLog(dir, config, loaded.segments, loaded.recovery_point, time_ms)
        log_ = cls(
            local_log, loaded.log_start_offset, leader_epoch_cache, producer_state, topic_id or stored_id
        )
        return log_

    # --- basic properties ---------------------------------------------------------

    @property
    def config(self) -> LogConfig:
        return self._local.config

    @property
    def recovery_point(self) -> int:
        return self._local.recovery_point

    @property
    def active_segment(self) -> LogSegment:
        return self._local.active_segment

    @property
    def segments(self) -> list[LogSegment]:
        return self._local.segments

    @property
    def log_end_offset(self) -> int:
        return self._local.log_end_offset

    @property
    def size_in_bytes(self) -> int:
        return self._local.size_in_bytes

    @property
    def num_segments(self) -> int:
        return self._local.num_segments

    @property
    def closed(self) -> bool:
        return self._local.closed

    @property
    def offline(self) -> bool:
        """The log's dir failed an I/O operation: nothing is read or written until a restart."""
        return self._local.offline

    @property
    def log_dir_failure_channel(self) -> LogDirFailureChannel:
        return self._local.log_dir_failure_channel

    @log_dir_failure_channel.setter
    def log_dir_failure_channel(self, channel: LogDirFailureChannel) -> None:
        """LogManager shares one channel between its logs; a log on its own has its own."""
        self._local.log_dir_failure_channel = channel

    def _check_open(self) -> None:
        self._local.check_open()

    def log_dir_failed(self, what: str, cause: OSError) -> KafkaStorageError:
        """Take the log's dir offline (once) for ``cause``; the error to raise."""
        return self._local.log_dir_failed(what, cause)

    # --- appending ------------------------------------------------------------------

    def analyze_for_append(
        self,
        records: bytes | bytearray | memoryview,
        budget: DecompressionBudget | None = None,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> ValidatedRecords:
        """Validate a client's record set (every record, see log_validator) and recompress it if
        the topic asks; ``budget``: its request's decompression allowance. Reads only the config
        and the clock: safe on a worker thread."""
        return analyze(
            records, self.config, self._time_ms(), f"{self.topic}-{self.partition}", budget, origin
        )

    @_log_dir_io
    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        validated: ValidatedRecords | None = None,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> LogAppendInfo:
        """Validate a client's record set (unless ``validated`` is analyze_for_append's answer
        for it), assign offsets and append it.

        ``origin`` COORDINATOR: a coordinator's own batches (transactional offset commits), whose
        producer epochs are checked but which carry no sequences. A writable buffer (bytearray,
        writable memoryview) is rewritten in place; of bytes, only the batch headers are copied.
        """
        self._check_open()
        config = self.config
        if validated is None:
            validated = self.analyze_for_append(records, origin=origin)
        records, headers = validated.records, validated.headers
        now = self._time_ms()
        duplicate = self.producer_state.check_append(headers, origin)
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
            self.roll()
        latest_epoch = self.leader_epoch_cache.latest_epoch
        if leader_epoch >= 0 and (latest_epoch is None or leader_epoch > latest_epoch):
            self.leader_epoch_cache.assign(leader_epoch, first_offset, flush=False)
        self._local.append(view if writable else parts, assigned)
        state = self.producer_state
        for header in assigned:
            state.update(header, header.base_offset, header.max_timestamp)
        # flush.messages: the caller flushes (off the event loop) when flush_messages_due says so.
        return LogAppendInfo(first_offset, last_offset, log_append_time, self.log_start_offset, record_count)

    @_log_dir_io
    def append_transaction_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        marker: ControlRecordType,
        leader_epoch: int,
    ) -> LogAppendInfo:
        """Append a transaction coordinator's COMMIT or ABORT marker for ``producer_id`` at the log
        end (Kafka's appendAsLeader of a marker, origin COORDINATOR).

        Raises InvalidProducerEpochError for an epoch older than the producer's and
        TransactionCoordinatorFencedError for a coordinator epoch older than its last marker's.
        A marker for a producer with no ongoing transaction is written all the same and ends
        nothing (how a hanging transaction is aborted). An ABORT enters the active segment's
        transaction index.
        """
        self._check_open()
        state = self.producer_state
        state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        config = self.config
        now = self._time_ms()
        first_offset = self.log_end_offset
        batch = bytearray(
            build_control_batch(
                marker,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                coordinator_epoch=coordinator_epoch,
                base_offset=first_offset,
                partition_leader_epoch=leader_epoch,
                timestamp=now,
            )
        )
        log_append_time = rb.NO_TIMESTAMP
        if config.message_timestamp_type == "LogAppendTime":
            log_append_time = now
            rb.set_log_append_time(batch, rb.read_header(batch), now)
        header = rb.read_header(batch)
        if self.active_segment.should_roll(
            config.segment_bytes, config.segment_ms, len(batch), now, first_offset, now
        ):
            self.roll()
        latest_epoch = self.leader_epoch_cache.latest_epoch
        if leader_epoch >= 0 and (latest_epoch is None or leader_epoch > latest_epoch):
            self.leader_epoch_cache.assign(leader_epoch, first_offset, flush=False)
        self._local.append(batch, [header])
        self.active_segment.update_producer_state(state, header, batch)
        return LogAppendInfo(first_offset, first_offset, log_append_time, self.log_start_offset, 1)

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
                headers.append(header)
                expected = header.next_offset
                position += header.size
        except rb.InvalidBatchError as e:
            raise CorruptRecordError(f"malformed record batch from the leader: {e}") from e
        if not headers:
            return None
        return FollowerRecords(view[:position], headers, first_offset)

    @_log_dir_io
    def append_analyzed_as_follower(self, analyzed: FollowerRecords) -> LogAppendInfo:
        """Append what ``analyze_follower_records`` checked; the log must still end where it did."""
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
            self.roll()
        cache = self.leader_epoch_cache
        for header in headers:
            latest = cache.latest_epoch
            epoch = header.partition_leader_epoch
            if epoch >= 0 and (latest is None or epoch > latest):
                # The follower's epoch cache mirrors the leader's: epochs start where their batches
                # do. Written by the log's next flush, before its recovery point passes the batch.
                cache.assign(epoch, header.base_offset, flush=False)
        self._local.append(data, headers)
        state = self.producer_state
        segment = self.active_segment
        for header in headers:
            # Producer state as on the leader, so this replica can lead with idempotence intact;
            # markers end transactions and fill the transaction index as on the leader.
            if header.attributes & rb.CONTROL_FLAG:
                segment.update_producer_state(
                    state, header, data[header.position : header.position + header.size]
                )
            else:
                state.update(header, header.base_offset, header.max_timestamp)
        record_count = sum(header.records_count for header in headers)
        return LogAppendInfo(first_offset, last_offset, rb.NO_TIMESTAMP, self.log_start_offset, record_count)

    @_log_dir_io
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset (no-op if the active one is empty)."""
        self._check_open()
        if self._local.active_segment.size == 0:
            return self._local.active_segment
        # Kafka snapshots producer state at every roll so startup only replays the last segment.
        self.producer_state.advance_map_end_offset(self.log_end_offset)
        self.producer_state.take_snapshot()
        return self._local.roll()

    # --- flushing -------------------------------------------------------------------

    @property
    def flush_messages_due(self) -> bool:
        """flush.messages unflushed records are waiting: flush before acknowledging them."""
        return self._local.flush_messages_due

    def flush_due(self, now_ms: int) -> bool:
        """True when a rolled segment awaits its flush or flush.ms has passed with unflushed data."""
        return self._local.flush_due(now_ms)

    @_log_dir_io
    def flush(self, up_to: int | None = None) -> None:
        """fsync everything below ``up_to`` (default: the log end) and advance the recovery point.
        Safe on a worker thread while the event loop appends (see LocalLog.flush). The epochs of
        the batches below the target, assigned before it is read, are written to the checkpoint
        first: the recovery point never passes a batch whose epoch a crash could lose."""
        log_end = self.log_end_offset
        target = log_end if up_to is None else min(up_to, log_end)
        if target > self._local.recovery_point and not self.closed:
            self.leader_epoch_cache.flush()
        self._local.flush(target)

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
        return self._local.read(fetch_offset, max_bytes, max_offset, min_one_batch)

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest transaction ongoing or ended above the high watermark
        (never below the log start offset); None when there is none."""
        first = self.producer_state.first_unstable_offset
        return None if first is None else max(first, self.log_start_offset)

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """The partition's high watermark moved: transactions whose markers are below it stop
        holding the first unstable offset (which the cleaner also respects). Call it on every
        move, leader or follower; ``last_stable_offset`` does it too."""
        self.producer_state.on_high_watermark_updated(high_watermark)

    def last_stable_offset(self, high_watermark: int) -> int:
        """The LSO: ``read_committed`` consumers read below it. Transactions whose markers are
        below ``high_watermark`` stop holding it; then the first unstable offset, capped at the
        high watermark. Two truth tests when there are no transactions (every fetch asks)."""
        state = self.producer_state
        state.on_high_watermark_updated(high_watermark)
        first = state.first_unstable_offset
        if first is None:
            return high_watermark
        return min(max(first, self.log_start_offset), high_watermark)

    def collect_aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [start_offset, upper_bound_offset) (last offset >=
        start, first offset < upper bound), from the transaction indexes of the segment holding
        ``start_offset`` and the later ones, as Kafka's LocalLog.collectAbortedTransactions.

        A transaction's entry is in the segment of its marker, which may lie far after the fetched
        range, so the walk stops at the first entry whose last stable offset reaches the upper
        bound (nothing starting below it was still open), not at a segment past the range; a
        segment without aborted transactions costs a truth test, and entries are in memory."""
        aborted: list[AbortedTxn] = []
        for segment in self._local.segments_from(start_offset):
            if segment.has_aborted_txns and segment.txn_index.collect(
                start_offset, upper_bound_offset, aborted
            ):
                break
        return aborted

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
            return self._local.max_timestamp_and_offset(self.log_start_offset)
        if timestamp < 0:
            return None
        return self._local.offset_for_timestamp(timestamp, self.log_start_offset)

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
                self._local.deletable_segments(lambda s: now - s.largest_timestamp > retention_ms, upper)
            )
        if self.config.retention_bytes >= 0:
            excess = self.size_in_bytes - self.config.retention_bytes

            def over_size(segment: LogSegment) -> bool:
                nonlocal excess
                if excess - segment.size < 0:
                    return False
                excess -= segment.size
                return True

            deleted += self._delete_segments(self._local.deletable_segments(over_size, upper))
        return deleted

    def _deletable_below_log_start(self) -> list[LogSegment]:
        segments = self._local.segments
        return [
            s
            for s, following in itertools.pairwise(segments)
            if following.base_offset <= self.log_start_offset
        ]

    def _delete_segments(self, deletable: list[LogSegment]) -> int:
        if not deletable:
            return 0
        if len(deletable) == self._local.num_segments:
            # A log always has a segment: roll a new one before deleting all of them.
            self.roll()
        self._local.delete_segments(deletable)
        first_base = self._local.segments[0].base_offset
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
        """The cleaner's swap (LocalLog.replace_segments); None, touching nothing, while ``io``
        is busy or when the log changed since the cleaner read ``old``."""
        if self.io.busy:
            return None
        replaced = self._local.replace_segments(old, sizes)
        if replaced is not None:
            for segment in old[1:]:
                # As in Kafka, a segment's producer snapshot goes with it; later snapshots still cover it.
                self.producer_state.delete_snapshot(segment.base_offset)
        return replaced

    @_log_dir_io
    def delete_pending_files(self, now_ms: int | None = None) -> int:
        """Unlink the files of segments deleted by retention or DeleteRecords whose
        ``file.delete.delay.ms`` has passed; returns how many. Safe on a worker thread."""
        return self._local.delete_pending_files(now_ms)

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
        local = self._local
        with local.flush_lock:
            if offset >= self.log_end_offset:
                return False
            if offset < local.segments[0].base_offset:
                self._truncate_fully_and_start_at(offset)
                return True
            local.truncate_to(offset)
            self._after_truncation()
            return True

    @_log_dir_io
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and restart it empty at ``offset`` (a follower far behind its leader's
        log start offset). Unlinks every segment: the broker runs it on ``io``."""
        self._check_open()
        with self._local.flush_lock:
            self._truncate_fully_and_start_at(offset)

    def _truncate_fully_and_start_at(self, offset: int) -> None:
        self._local.truncate_fully_and_start_at(offset)
        self.log_start_offset = offset
        # Every epoch started below the new start: none describes this log any more.
        self.leader_epoch_cache.clear()
        self._after_truncation()

    def _after_truncation(self) -> None:
        log_end = self.log_end_offset
        self.log_start_offset = min(self.log_start_offset, log_end)
        self.leader_epoch_cache.truncate_from_end(log_end)
        self.producer_state.truncate_and_reload(self.log_start_offset, log_end)
        rebuild_producer_state(self.producer_state, self._local.segments, self.log_start_offset, log_end)

    # --- lifecycle ----------------------------------------------------------------------

    def update_config(self, config: LogConfig) -> None:
        """New settings apply from the next append (and the next segment, for segment settings)."""
        self._local.config = config

    def close(self) -> None:
        """Flush, snapshot producer state at the log end and release every file.

        Never raises for I/O: an error takes the log dir offline (logged once), the files are
        released all the same (Kafka's closeHandlers: no flush, snapshot or final index entry
        on a failed dir) and the next start recovers the log.
        """
        if self.closed:
            return
        with contextlib.suppress(LogDirOfflineError):
            # Out of descriptors is retriable while the cache gives some back (then it is an
            # offline dir like any other I/O error).
            file_cache().retry_out_of_descriptors(self._flush_and_snapshot)
        self._local.close()

    @_log_dir_io
    def _flush_and_snapshot(self) -> None:
        if self.offline:
            return
        self.flush()
        self.leader_epoch_cache.flush()
        with self._local.flush_lock:
            self.producer_state.advance_map_end_offset(self.log_end_offset)
            self.producer_state.take_snapshot(sync=True)

    @_log_dir_io
    def delete(self) -> None:
        """Close the log and remove its directory (LocalLog.delete). Like Kafka's asyncDelete, it
        closes the files without the flush and producer snapshot of ``close``: their data is
        about to go."""
        self._local.delete()

    def __repr__(self) -> str:
        return (
            f"UnifiedLog({self.dir.name}, log_start_offset={self.log_start_offset}, "
            f"log_end_offset={self.log_end_offset}, segments={self.num_segments})"
        )
