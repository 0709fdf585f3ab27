"""LogDirFailureChannel: the one place an I/O error on a log dir takes that dir offline.

As in Kafka, any ``OSError`` (but running out of descriptors while cached ones can be closed) while appending, rolling, writing an index, flushing,
snapshotting or checkpointing marks the log dir it happened on offline, once, with one
error line naming the dir and the cause. Every log in an offline dir then answers
KAFKA_STORAGE_ERROR and writes nothing more; the broker goes on serving the other dirs.
An offline dir comes back only with a restart (Kafka's rule too), which recovers it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from strom.storage.errors import KafkaStorageError
from strom.storage.file_cache import file_cache, is_out_of_descriptors

log = logging.getLogger(__name__)


class LogDirOfflineError(KafkaStorageError):
    """The log's dir is offline (it failed an I/O operation); a restart brings it back."""


class OutOfDescriptorsError(KafkaStorageError):
    """The process ran out of file descriptors; the file cache gave some back, so the dir stays
    online and the operation may be retried."""


class LogDirFailureChannel:
    """Offline log dirs and why; safe to use from the event loop and worker threads."""

    def __init__(self) -> None:
        self._offline: dict[Path, str] = {}
        self._lock = threading.Lock()
        # Checked on every append and read before anything else: one attribute while all is well.
        self.any_offline = False

    def is_offline(self, log_dir: Path) -> bool:
        return self.any_offline and log_dir in self._offline

    def offline_dirs(self) -> dict[Path, str]:
        """Each offline dir with the cause that took it offline."""
        with self._lock:
            return dict(self._offline)

    def maybe_add_offline_log_dir(self, log_dir: Path, what: str, cause: BaseException) -> KafkaStorageError:
        """Mark ``log_dir`` offline (logging it the first time only); returns the error to raise.

        Running out of descriptors says nothing of the disk: while the file cache can close some,
        the dir stays online and the error (OutOfDescriptorsError) is retriable."""
        reason = f"{what}: {cause}"
        if is_out_of_descriptors(cause) and file_cache().shrink():
            log.warning("out of file descriptors (%s); closed idle cached files", reason)
            return OutOfDescriptorsError(f"out of file descriptors: {reason}")
        with self._lock:
            first = log_dir not in self._offline
            if first:
                self._offline[log_dir] = reason
                self.any_offline = True
        if first:
            log.error(
                "log dir %s is offline after an I/O error (%s); its partitions answer "
                "KAFKA_STORAGE_ERROR until the broker restarts",
                log_dir,
                reason,
                extra={"log_dir": str(log_dir)},
            )
        return self.offline_error(log_dir)

    def offline_error(self, log_dir: Path) -> LogDirOfflineError:
        return LogDirOfflineError(f"log dir {log_dir} is offline: {self._offline.get(log_dir, '?')}")
