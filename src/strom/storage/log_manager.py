"""LogManager: every partition log in the broker's log directories.

Each log dir holds ``<topic>-<partition>`` directories plus Kafka's per-dir files:
``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``, the log cleaner's
``cleaner-offset-checkpoint`` and, after a clean shutdown, ``.kafka_cleanshutdown`` (removed at
startup so a crash is noticed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from strom.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    OffsetCheckpointFile,
    fsync_dir,
)
from strom.storage.cleaner import CleanerConfig, CleanerStats, LogCleaner
from strom.storage.errors import KafkaStorageError
from strom.storage.log import (
    CLEAN_SHUTDOWN_FILE,
    InconsistentTopicIdError,
    Log,
    parse_topic_partition,
    wall_clock_ms,
)
from strom.storage.log_config import LogConfig
from strom.storage.log_dir_failure import LogDirFailureChannel, LogDirOfflineError

log = logging.getLogger(__name__)

# Kafka's producer.id.expiration.ms default: idle producers' state is dropped after a day.
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000


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
        self._logs: dict[tuple[str, int], Log] = {}
        # Checkpoint files are written from the event loop (DeleteRecords) and worker threads.
        self._checkpoint_lock = threading.Lock()
        # Compaction of logs with cleanup.policy=compact; None until start_cleaner.
        self.cleaner: LogCleaner | None = None
        # Where an I/O error on a log dir takes it offline (shared by every log).
        self.log_dir_failure_channel = LogDirFailureChannel()

    # --- startup --------------------------------------------------------------------

    def startup(
        self, config_for: Callable[[str], LogConfig], topic_ids: Mapping[str, uuid.UUID] | None = None
    ) -> None:
        """Load every partition directory, recovering those of a log dir that was not shut down cleanly."""
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
            if child.name.endswith("-delete"):
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
                log_ = Log.open(
                    child,
                    config_for(topic),
                    topic_id=topic_ids.get(topic),
                    time_ms=self._time_ms,
                    log_start_offset=log_start_offsets.get(key),
                    recovery_point=recovery_points.get(key),
                    had_clean_shutdown=clean,
                )
            except InconsistentTopicIdError as e:
                stray = child.with_name(f"{child.name}.{uuid.uuid4().hex}-stray")
                log.warning(
                    "moving aside a log of a previous topic with the same name",
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

    def _register(self, log_: Log) -> None:
        log_.log_start_offset_listener = self._on_log_start_offset_change
        log_.log_dir_failure_channel = self.log_dir_failure_channel
        self._logs[(log_.topic, log_.partition)] = log_

    def _on_log_start_offset_change(self, log_: Log) -> None:
        # DeleteRecords was acknowledged: make the new start survive a crash now.
        self._checkpoint_dir(log_.dir.parent, recovery_points=False)

    # --- logs -----------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def all_logs(self) -> list[Log]:
        return list(self._logs.values())

    def get_or_create_log(
        self, topic: str, partition: int, config: LogConfig, topic_id: uuid.UUID | None = None
    ) -> Log:
        existing = self._logs.get((topic, partition))
        if existing is not None:
            return existing
        channel = self.log_dir_failure_channel
        for offline in channel.offline_dirs():
            if (offline / f"{topic}-{partition}").exists():
                raise channel.offline_error(offline)  # never a fresh log in place of one we cannot read
        log_dir = self._next_log_dir()
        log_ = Log.open(log_dir / f"{topic}-{partition}", config, topic_id=topic_id, time_ms=self._time_ms)
        self._register(log_)
        log.info("created log", extra={"log": log_.dir.name, "log_dir": str(log_dir)})
        return log_

    def _next_log_dir(self) -> Path:
        """Like Kafka: the log dir that holds the fewest partitions."""
        counts = {d: 0 for d in self.log_dirs if not self.log_dir_failure_channel.is_offline(d)}
        if not counts:
            raise LogDirOfflineError(f"every log dir is offline: {sorted(map(str, self.log_dirs))}")
        for log_ in self._logs.values():
            parent = log_.dir.parent
            if parent in counts:
                counts[parent] += 1
        return min(counts, key=lambda d: counts[d])

    def delete_log(self, topic: str, partition: int) -> None:
        log_ = self._logs.pop((topic, partition), None)
        if log_ is None:
            return
        log_.delete()
        self._checkpoint_dir(log_.dir.parent)
        if self.cleaner is not None:
            self.cleaner.forget(log_)
        log.info("deleted log", extra={"log": log_.dir.name})

    # --- background work ----------------------------------------------------------

    def cleanup_logs(self) -> int:
        """Retention over every log (and expiry of idle producers); returns segments deleted."""
        now = self._time_ms()
        deleted = 0
        for log_ in self.online_logs():
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
        return await self.cleaner.clean_logs(self.online_logs())

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
        """Write every log dir's recovery-point and log-start-offset checkpoints."""
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

    def online_logs(self) -> list[Log]:
        return [log_ for log_ in self._logs.values() if not log_.offline]

    def shutdown(self) -> None:
        """Close every log, write the checkpoints and mark each log dir as cleanly shut down."""
        for log_ in self.all_logs():
            log_.close()
        for log_dir in self.log_dirs:
            # An offline dir (or one that fails now) gets no marker: the next start recovers it.
            with contextlib.suppress(LogDirOfflineError):
                self._checkpoint_dir(log_dir)
                if not self.log_dir_failure_channel.is_offline(log_dir):
                    try:
                        (log_dir / CLEAN_SHUTDOWN_FILE).touch()
                        fsync_dir(log_dir)
                    except OSError as e:
                        self.log_dir_failure_channel.maybe_add_offline_log_dir(log_dir, "shutdown", e)
        log.info("log manager shut down", extra={"logs": len(self._logs)})
