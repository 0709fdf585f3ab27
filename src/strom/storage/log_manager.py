"""LogManager: every partition log in the broker's log directories.

Each log dir holds ``<topic>-<partition>`` directories plus Kafka's per-dir files:
``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``, the log cleaner's
``cleaner-offset-checkpoint``, ``.lock`` (locked exclusively while a broker uses the dir, as Kafka's
LogManager does, so that a second broker on the same dir fails before touching anything) and,
after a clean shutdown, ``.kafka_cleanshutdown`` (removed at startup so a crash is noticed).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from strom.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    SYNCFS_MIN_LOGS,
    OffsetCheckpointFile,
    PartitionMetadataFile,
    deferred_dir_syncs,
    fsync_dir,
    fsync_path,
    sync_dir_now,
    syncfs,
    syncfs_available,
    syncs_left_to_syncfs,
)
from strom.storage.cleaner import CleanerConfig, CleanerStats, LogCleaner
from strom.storage.errors import KafkaStorageError, StorageError
from strom.storage.file_cache import file_cache
from strom.storage.future_log import FutureLog, resolve_interrupted_moves
from strom.storage.local_log import DELETE_SUFFIX, STRAY_SUFFIX, parse_topic_partition, renamed_dir_name
from strom.storage.log_config import LogConfig
from strom.storage.log_dir_failure import LogDirFailureChannel, LogDirOfflineError
from strom.storage.log_io import lower_thread_priority
from strom.storage.log_loader import CLEAN_SHUTDOWN_FILE
from strom.storage.unified_log import InconsistentTopicIdError, UnifiedLog, wall_clock_ms

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# Threads that create (or delete) a topic's logs together (niced: log_io.lower_thread_priority).
NEW_LOG_THREADS = 4

# Kafka's producer.id.expiration.ms default: idle producers' state is dropped after a day.
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000


def _background_pool(tasks: int, name: str) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(
        min(NEW_LOG_THREADS, tasks), thread_name_prefix=name, initializer=lower_thread_priority
    )


@dataclass(frozen=True, slots=True)
class NewLog:
    """A partition log to create: where, with which config, topic id and first leader epoch."""

    log_dir: Path
    topic: str
    partition: int
    config: LogConfig
    topic_id: uuid.UUID | None
    leader_epoch: int = 0  # -1: a follower's log, no epoch of its own


class LogDirInUseError(KafkaStorageError):
    """Another process holds a log dir's ``.lock``: most likely another broker runs on it."""


class LogManager:
    def __init__(
        self,
        log_dirs: list[Path],
        time_ms: Callable[[], int] = wall_clock_ms,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> None:
        if not log_dirs:
            raise ValueError("at least one log directory is required")
        self.log_dirs = [Path(d) for d in log_dirs]
        self._time_ms = time_ms
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._logs: dict[tuple[str, int], UnifiedLog] = {}
        # Checkpoint files are written from the event loop (DeleteRecords) and worker threads.
        self._checkpoint_lock = threading.Lock()
        # Compaction of logs with cleanup.policy=compact; None until start_cleaner.
        self.cleaner: LogCleaner | None = None
        # Topics whose retention and compaction wait for an operator: their configs were lost,
        # and the defaults might delete what the real configs keep.
        self.held_topics: set[str] = set()
        # Descriptors of the locked ``.lock`` files, one per log dir (lock_log_dirs).
        self._lock_fds: list[int] = []
        # Log dirs whose log-start-offset checkpoint is behind a DeleteRecords.
        self._log_start_dirty: set[Path] = set()
        # Where an I/O error on a log dir takes it offline (shared by every log).
        self.log_dir_failure_channel = LogDirFailureChannel()
        # Partitions being moved to another log dir (AlterReplicaLogDirs), with their copies.
        self.future_logs: dict[tuple[str, int], FutureLog] = {}

    # --- the log dirs' locks ---------------------------------------------------------

    def lock_log_dirs(self) -> None:
        """Lock every log dir exclusively for this process's lifetime (before anything reads or writes it).

        Raises LogDirInUseError, having changed nothing, if another process holds one.
        """
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(log_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.unlock_log_dirs()
                raise LogDirInUseError(
                    f"log dir {log_dir} is in use by another process (it holds {log_dir / LOCK_FILE}); "
                    "is another broker running on it?"
                ) from None
            except OSError:
                os.close(fd)
                self.unlock_log_dirs()
                raise
            self._lock_fds.append(fd)

    def unlock_log_dirs(self) -> None:
        for fd in self._lock_fds:
            os.close(fd)  # closing the descriptor releases its flock
        self._lock_fds = []

    # --- startup --------------------------------------------------------------------

    def startup(
        self, config_for: Callable[[str], LogConfig], topic_ids: Mapping[str, uuid.UUID] | None = None
    ) -> None:
        """Load every partition directory, recovering those of a log dir that was not shut down cleanly."""
        try:
            resolve_interrupted_moves(self.log_dirs)
        except OSError as e:
            # The logs stay as they are (a duplicate is then reported by the load); say why.
            log.error("could not resolve an interrupted log dir move", extra={"error": str(e)})
        for log_dir in self.log_dirs:
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                self._load_log_dir(log_dir, config_for, topic_ids or {})
            except (OSError, KafkaStorageError) as e:
                cause = e if isinstance(e, OSError) else e.__cause__
                if not isinstance(cause, OSError):
                    raise
                # As Kafka: the broker starts without this dir; its partitions answer KAFKA_STORAGE_ERROR.
                self.log_dir_failure_channel.maybe_add_offline_log_dir(log_dir, "loading logs", cause)

    def _read_checkpoint(self, path: Path) -> dict[tuple[str, int], int]:
        try:
            return OffsetCheckpointFile(path).read()
        except KafkaStorageError as e:
            log.warning("ignoring unreadable checkpoint file", extra={"file": str(path), "error": str(e)})
            return {}

    def _load_log_dir(
        self, log_dir: Path, config_for: Callable[[str], LogConfig], topic_ids: Mapping[str, uuid.UUID]
    ) -> None:
        started = time.monotonic()
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        recovery_points = self._read_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT)
        log_start_offsets = self._read_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT)
        loaded = 0
        for child in sorted(log_dir.iterdir()):
            if not child.is_dir() or child.name.startswith("."):
                continue
            if child.name.endswith(DELETE_SUFFIX):
                # A deletion interrupted by a crash: finish it.
                shutil.rmtree(child)
                continue
            try:
                topic, partition = parse_topic_partition(child.name)
            except ValueError:
                log.debug("skipping directory that is not a partition log", extra={"dir": str(child)})
                continue
            key = (topic, partition)
            if key in self._logs:
                raise KafkaStorageError(
                    f"duplicate log directories for {topic}-{partition}: {self._logs[key].dir} and {child}"
                )
            try:
                log_ = UnifiedLog.open(
                    child,
                    config_for(topic),
                    topic_id=topic_ids.get(topic),
                    time_ms=self._time_ms,
                    log_start_offset=log_start_offsets.get(key),
                    recovery_point=recovery_points.get(key),
                    had_clean_shutdown=clean,
                )
            except InconsistentTopicIdError as e:
                stray = child.with_name(renamed_dir_name(child.name, STRAY_SUFFIX))
                # A previous topic of the same name, or a damaged metadata file: keep the data
                # aside (Kafka's stray logs) rather than serve or delete it.
                log.error(
                    "moving aside a log whose partition.metadata names another topic id than the "
                    "control plane; it is kept, renamed, for an operator to inspect",
                    extra={"dir": str(child), "to": stray.name, "error": str(e)},
                )
                os.rename(child, stray)
                continue
            self._register(log_)
            loaded += 1
        # From now on a crash must be detected at the next startup.
        marker.unlink(missing_ok=True)
        log.info(
            "loaded log dir",
            extra={
                "log_dir": str(log_dir),
                "logs": loaded,
                "clean_shutdown": clean,
                "ms": int((time.monotonic() - started) * 1000),
            },
        )

    def _register(self, log_: UnifiedLog) -> None:
        log_.log_start_offset_listener = self._on_log_start_offset_change
        log_.log_dir_failure_channel = self.log_dir_failure_channel
        self._logs[(log_.topic, log_.partition)] = log_

    def _on_log_start_offset_change(self, log_: UnifiedLog) -> None:
        # DeleteRecords moved the start: persist_log_start_offsets writes it before the answer.
        self._log_start_dirty.add(log_.dir.parent)

    def persist_log_start_offsets(self) -> None:
        """Write the log-start-offset checkpoint of every dir where DeleteRecords moved a start
        (call off the event loop, before acknowledging the DeleteRecords)."""
        dirty, self._log_start_dirty = self._log_start_dirty, set()
        try:
            for log_dir in dirty:
                self._checkpoint_dir(log_dir, recovery_points=False)
        except BaseException:
            self._log_start_dirty |= dirty
            raise

    # --- logs -----------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> UnifiedLog | None:
        return self._logs.get((topic, partition))

    def all_logs(self) -> list[UnifiedLog]:
        return list(self._logs.values())

    def get_or_create_log(
        self, topic: str, partition: int, config: LogConfig, topic_id: uuid.UUID | None = None
    ) -> UnifiedLog:
        existing = self._logs.get((topic, partition))
        if existing is not None:
            return existing
        channel = self.log_dir_failure_channel
        for offline in channel.offline_dirs():
            if (offline / f"{topic}-{partition}").exists():
                raise channel.offline_error(offline)  # never a fresh log in place of one we cannot read
        log_dir = self._next_log_dir()
        log_ = UnifiedLog.open(
            log_dir / f"{topic}-{partition}", config, topic_id=topic_id, time_ms=self._time_ms
        )
        self._register(log_)
        log.info("created log", extra={"log": log_.dir.name, "log_dir": str(log_dir)})
        return log_

    def _next_log_dir(self) -> Path:
        return self.assign_log_dirs(1)[0]

    def assign_log_dirs(self, count: int) -> list[Path]:
        """Like Kafka: each new log goes to the online log dir that holds the fewest partitions."""
        counts = {d: 0 for d in self.log_dirs if not self.log_dir_failure_channel.is_offline(d)}
        if not counts:
            raise LogDirOfflineError(f"every log dir is offline: {sorted(map(str, self.log_dirs))}")
        for log_ in self._logs.values():
            parent = log_.dir.parent
            if parent in counts:
                counts[parent] += 1
        chosen = []
        for _ in range(count):
            log_dir = min(counts, key=lambda d: counts[d])
            counts[log_dir] += 1
            chosen.append(log_dir)
        return chosen

    def open_new_logs(self, specs: list[NewLog]) -> list[UnifiedLog]:
        """Create the logs of new partitions (file work only: call off the event loop, then
        ``register_logs`` on it). If one fails, those created here are deleted again and
        KafkaStorageError is raised.

        A few threads create the files, then sync them together rather than log by log: the
        partition.metadata files (written unsynced), which are then renamed into place, then the new
        logs' directories and the log dirs holding them. Overlapping fsyncs are committed together
        by the file system. A new leader's first epoch stays in memory until the log's first
        flush, as every new epoch.
        """
        if not specs:
            return []
        with _background_pool(len(specs), "strom-new-log") as pool:
            futures = [pool.submit(self._open_new_log, spec) for spec in specs]
            opened = [f.result() for f in futures if f.exception() is None]
            failure = next((f.exception() for f in futures if f.exception() is not None), None)
            if failure is None:
                try:
                    with_id = [log_ for log_, new in opened if new and log_.topic_id is not None]
                    pending = [PartitionMetadataFile(log_.dir / PARTITION_METADATA).pending for log_ in with_id]
                    for _ in pool.map(fsync_path, pending):
                        pass
                    for log_ in with_id:
                        log_.commit_topic_id()
                    # Each log's directory (its files' entries), then the log dirs (the new directories').
                    for _ in pool.map(fsync_path, [log_.dir for log_, _ in opened]):
                        pass
                    for log_dir in {spec.log_dir for spec in specs}:
                        fsync_path(log_dir)
                except OSError as e:
                    failure = e
        if failure is not None:
            for log_, _ in opened:
                with contextlib.suppress(OSError, StorageError):
                    log_.delete()
            if isinstance(failure, StorageError):
                raise failure
            raise KafkaStorageError(f"error creating logs: {failure}") from failure
        log.info("created logs", extra={"logs": len(opened)})
        return [log_ for log_, _ in opened]

    def _open_new_log(self, spec: NewLog) -> tuple[UnifiedLog, bool]:
        """The log, and whether it is new (its partition.metadata still to be synced and committed).
        A directory already there (left by a failed deletion, say) is opened as it is."""
        dir = spec.log_dir / f"{spec.topic}-{spec.partition}"
        try:
            return (
                UnifiedLog.create(
                    dir,
                    spec.config,
                    topic_id=spec.topic_id,
                    time_ms=self._time_ms,
                    leader_epoch=spec.leader_epoch,
                ),
                True,
            )
        except FileExistsError:
            pass
        log_ = UnifiedLog.open(
            dir, spec.config, topic_id=spec.topic_id, time_ms=self._time_ms, had_clean_shutdown=False
        )
        if spec.leader_epoch >= 0 and log_.leader_epoch_cache.latest_epoch is None:
            log_.leader_epoch_cache.assign(spec.leader_epoch, log_.log_end_offset, flush=False)
        return log_, False

    def register_logs(self, logs: list[UnifiedLog]) -> None:
        """Make logs created by ``open_new_logs`` part of the broker (on the event loop)."""
        for log_ in logs:
            self._register(log_)

    def unregister_logs(self, keys: list[tuple[str, int]]) -> list[UnifiedLog]:
        """Take logs out of the broker (on the event loop) so that nothing appends to them any more;
        ``delete_logs`` then removes their files off the loop."""
        return [log_ for key in keys if (log_ := self._logs.pop(key, None)) is not None]

    def delete_logs(self, logs: list[UnifiedLog]) -> None:
        """Remove unregistered logs' directories, then checkpoint their log dirs once (off the loop)."""
        if logs:
            # Unlinking and removing directories wait on the disk: overlap them as for creation.
            with _background_pool(len(logs), "strom-del-log") as pool:
                for _ in pool.map(UnifiedLog.delete, logs):
                    pass
        if self.cleaner is not None:
            for log_ in logs:
                self.cleaner.forget(log_)
        for log_dir in {log_.dir.parent for log_ in logs}:
            self._checkpoint_dir(log_dir)
        if logs:
            log.info("deleted logs", extra={"logs": len(logs)})

    def delete_log(self, topic: str, partition: int) -> None:
        self.delete_logs(self.unregister_logs([(topic, partition)]))

    def replace_log(self, old: UnifiedLog, new_dir: Path) -> UnifiedLog:
        """Open the partition's log moved to ``new_dir`` (another log dir) and serve it in place
        of the closed ``old`` (on the event loop, so that nothing appends meanwhile)."""
        new = UnifiedLog.open(
            new_dir,
            old.config,
            topic_id=old.topic_id,
            time_ms=self._time_ms,
            log_start_offset=old.log_start_offset,
            recovery_point=old.recovery_point,
            had_clean_shutdown=True,  # closed (flushed, snapshotted) before it was copied
        )
        self._register(new)
        if self.cleaner is not None:
            self.cleaner.forget(old)
        log.info("moved log", extra={"log": new.dir.name, "from": str(old.log_dir), "to": str(new.log_dir)})
        return new

    def assign_topic_id(self, log_: UnifiedLog, topic_id: uuid.UUID) -> None:
        """Record the topic id of a log whose partition.metadata was missing."""
        PartitionMetadataFile(log_.dir / PARTITION_METADATA).write(topic_id)
        log_.topic_id = topic_id

    def move_aside(self, log_: UnifiedLog, reason: str) -> Path:
        """Startup: close an unregistered log and rename its directory ``...-stray``, as Kafka keeps a
        stray log: never deleted, no longer loaded."""
        log_.close()
        stray = log_.dir.with_name(renamed_dir_name(log_.dir.name, STRAY_SUFFIX))
        os.rename(log_.dir, stray)
        log.warning(
            "moved a stray log aside", extra={"log": log_.dir.name, "to": stray.name, "reason": reason}
        )
        return stray

    # --- background work ----------------------------------------------------------

    def cleanup_logs(self) -> int:
        """Retention over every log (and expiry of idle producers); returns segments deleted."""
        now = self._time_ms()
        deleted = 0
        for log_ in self.online_logs():
            if log_.topic in self.held_topics:
                continue
            if log_.io.busy:
                continue  # a truncation replays its producer state on the I/O executor: next time
            deleted += log_.delete_retention_segments(now)
            log_.producer_state.remove_expired_producers(now, self.producer_id_expiration_ms)
        return deleted

    def delete_pending_files(self) -> int:
        """Unlink deleted segments' files (call on a worker thread); returns how many."""
        return sum(log_.delete_pending_files() for log_ in self.online_logs())

    def start_cleaner(self, config: CleanerConfig) -> LogCleaner:
        """Create the log cleaner (log.cleaner.enable); the broker schedules ``clean_logs``."""
        self.cleaner = LogCleaner(config, self._time_ms)
        return self.cleaner

    async def clean_logs(self) -> list[CleanerStats]:
        """One cleaning pass over every compacted log (on the event loop; the work runs in threads)."""
        if self.cleaner is None:
            return []
        return await self.cleaner.clean_logs(
            log_ for log_ in self.online_logs() if log_.topic not in self.held_topics
        )

    def flush_dirty_logs(self) -> None:
        """Flush logs with a rolled segment to sync or whose flush.ms passed (call from a worker thread)."""
        now = self._time_ms()
        for log_ in self.all_logs():
            if log_.flush_due(now):
                try:
                    log_.flush()
                except LogDirOfflineError:
                    pass  # the failure channel logged it
                except KafkaStorageError:
                    log.exception("flush failed", extra={"log": log_.dir.name})

    def checkpoint(self) -> None:
        """Write every log dir's recovery-point and log-start-offset checkpoints (call off the
        event loop). Leader epochs not yet in their files wait for their log's flush or close: a
        recovery point only passes written epochs (see LeaderEpochFileCache), so writing them here
        -- a file and two fsyncs per log, thousands at once after a failover -- buys nothing."""
        for log_dir in self.log_dirs:
            with contextlib.suppress(LogDirOfflineError):  # logged by the failure channel
                self._checkpoint_dir(log_dir)

    def _checkpoint_dir(self, log_dir: Path, recovery_points: bool = True) -> None:
        if self.log_dir_failure_channel.is_offline(log_dir):
            return
        logs = [lg for lg in self.all_logs() if lg.dir.parent == log_dir]
        try:
            with self._checkpoint_lock:
                if recovery_points:
                    OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT).write(
                        {(lg.topic, lg.partition): lg.recovery_point for lg in logs}
                    )
                OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).write(
                    {(lg.topic, lg.partition): lg.log_start_offset for lg in logs}
                )
        except OSError as e:
            raise self.log_dir_failure_channel.maybe_add_offline_log_dir(
                log_dir, "writing checkpoints", e
            ) from e

    def read_high_watermarks(self) -> dict[tuple[str, int], int]:
        """Every online log dir's ``replication-offset-checkpoint`` (call off the event loop).
        An unreadable file counts as empty: the high watermarks then start at 0 and followers'
        fetches, leaders' ISR, move them up again."""
        high_watermarks: dict[tuple[str, int], int] = {}
        for log_dir in self.log_dirs:
            if not self.log_dir_failure_channel.is_offline(log_dir):
                high_watermarks.update(self._read_checkpoint(log_dir / REPLICATION_OFFSET_CHECKPOINT))
        return high_watermarks

    def checkpoint_high_watermarks(self, high_watermarks: Mapping[tuple[str, int], int]) -> None:
        """Write each online log dir's ``replication-offset-checkpoint`` with the high watermarks of
        the logs it holds (call off the event loop; Kafka's checkpointHighWatermarks)."""
        by_dir: dict[Path, dict[tuple[str, int], int]] = {d: {} for d in self.log_dirs}
        for key, high_watermark in high_watermarks.items():
            log_ = self._logs.get(key)
            if log_ is not None and log_.dir.parent in by_dir:
                by_dir[log_.dir.parent][key] = high_watermark
        for log_dir, entries in by_dir.items():
            if self.log_dir_failure_channel.is_offline(log_dir):
                continue
            try:
                with self._checkpoint_lock:
                    OffsetCheckpointFile(log_dir / REPLICATION_OFFSET_CHECKPOINT).write(entries)
            except OSError as e:
                # The failure channel takes the dir offline and logs it; the other dirs go on.
                self.log_dir_failure_channel.maybe_add_offline_log_dir(log_dir, "writing high watermarks", e)

    def online_logs(self) -> list[UnifiedLog]:
        return [log_ for log_ in self._logs.values() if not log_.offline]

    def _close_log(self, log_: UnifiedLog) -> None:
        """Close a log (flush, producer snapshot), syncing its directory once for both."""
        with deferred_dir_syncs() as dirs:
            log_.close()
        if log_.offline:
            return
        try:
            for dir in dirs:
                sync_dir_now(dir)
        except OSError as e:
            # No clean-shutdown marker for this dir then: the next start recovers it.
            self.log_dir_failure_channel.maybe_add_offline_log_dir(
                log_.log_dir, f"closing {log_.dir.name}", e
            )

    def _close_log_unsynced(self, log_: UnifiedLog) -> None:
        """Close a log without its fsyncs: ``shutdown`` syncs every file system once after."""
        with syncs_left_to_syncfs():
            log_.close()

    def shutdown(self) -> None:
        """Close every log, write the checkpoints and mark each log dir as cleanly shut down.

        Many logs are closed without fsyncs of their own (each would cost a few: the segment, its
        indexes, the leader-epoch checkpoint, the producer snapshot and the directory); each log
        dir's file system is then synced once (syncfs), before any clean-shutdown marker vouches
        for what the closes wrote.
        """
        for future in self.future_logs.values():
            future.cancelled = True  # its copy stays behind as -future: the next startup removes it
        logs = self.all_logs()
        batched = len(logs) >= SYNCFS_MIN_LOGS and syncfs_available()
        if logs:
            # Each close waits on the disk: overlap them as for creation.
            with _background_pool(len(logs), "strom-close-log") as pool:
                for _ in pool.map(self._close_log_unsynced if batched else self._close_log, logs):
                    pass
        for log_dir in self.log_dirs:
            if batched and not self.log_dir_failure_channel.is_offline(log_dir):
                try:
                    syncfs(log_dir)
                except OSError as e:
                    self.log_dir_failure_channel.maybe_add_offline_log_dir(log_dir, "shutdown", e)
            # An offline dir (or one that fails now) gets no marker: the next start recovers it.
            with contextlib.suppress(LogDirOfflineError):
                self._checkpoint_dir(log_dir)
                if not self.log_dir_failure_channel.is_offline(log_dir):
                    try:
                        file_cache().retry_out_of_descriptors((log_dir / CLEAN_SHUTDOWN_FILE).touch)
                        fsync_dir(log_dir)
                    except OSError as e:
                        self.log_dir_failure_channel.maybe_add_offline_log_dir(log_dir, "shutdown", e)
        self.unlock_log_dirs()
        log.info("log manager shut down", extra={"logs": len(self._logs)})
