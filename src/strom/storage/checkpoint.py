"""Kafka's small text files: offset checkpoints, the leader-epoch checkpoint and partition.metadata.

Checkpoint files are ``<version>\\n<count>\\n`` followed by one entry per line and are
replaced atomically (write a temporary file, fsync it, rename it over the old one,
fsync the directory), so a crash leaves either the old or the new content.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import functools
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from strom.storage.errors import KafkaStorageError
from strom.storage.file_cache import open_fd

CHECKPOINT_VERSION = 0
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
# High watermarks of a log dir's partitions (a replicated broker's; read at startup).
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
# Strom's own: a copy of the topic's config overrides, next to partition.metadata.
TOPIC_CONFIGS = "topic-configs.json"


# Directories whose fsync a caller batches (deferred_dir_syncs), per thread; None: sync now.
_deferred = threading.local()


@contextlib.contextmanager
def deferred_dir_syncs() -> Iterator[set[Path]]:
    """Within the block, ``fsync_dir`` (and so ``write_atomically``) on this thread only collects
    the directory; the caller syncs each collected one once, before relying on any of the block's
    renames and new files (one fsync per log instead of one per file written in it)."""
    dirs: set[Path] = set()
    outer = getattr(_deferred, "dirs", None)
    _deferred.dirs = dirs
    try:
        yield dirs
    finally:
        _deferred.dirs = outer


@contextlib.contextmanager
def syncs_left_to_syncfs() -> Iterator[None]:
    """Within the block, ``fsync`` and ``fsync_dir`` on this thread do nothing: the caller syncs
    the whole file system (``syncfs``) before relying on anything written in the block, and before
    writing anything that vouches for it (a clean-shutdown marker). Until then a crash may leave
    files renamed over others with their content unwritten: only for files whose readers rebuild
    what a damaged one held (leader epochs, producer snapshots) and for segments, which a start
    without the marker recovers."""
    outer = getattr(_deferred, "to_syncfs", False)
    _deferred.to_syncfs = True
    try:
        yield
    finally:
        _deferred.to_syncfs = outer


def fsync(fd: int) -> None:
    """os.fsync, unless this thread is within ``syncs_left_to_syncfs``."""
    if not getattr(_deferred, "to_syncfs", False):
        os.fsync(fd)


def fsync_dir(path: Path) -> None:
    if getattr(_deferred, "to_syncfs", False):
        return
    dirs: set[Path] | None = getattr(_deferred, "dirs", None)
    if dirs is not None:
        dirs.add(path)
        return
    sync_dir_now(path)


def sync_dir_now(path: Path) -> None:
    fsync_path(path, os.O_RDONLY | os.O_DIRECTORY)


# From this many logs on, a shutdown leaves their fsyncs to one syncfs per file system
# (LogManager.shutdown): closing thousands of logs would otherwise cost a few fsyncs each.
SYNCFS_MIN_LOGS = 64


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    """libc's syncfs(2), where there is one (Linux)."""
    function = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    if function is None:
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


def fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    """fsync a file (its data) or a directory (its entries) by path."""
    fd = open_fd(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncfs_available() -> bool:
    return _syncfs() is not None


def syncfs(path: Path) -> None:
    """syncfs(2) of the file system holding ``path`` (see ``syncfs_available``): it returns once
    everything written to that file system before the call is on disk."""
    function = _syncfs()
    assert function is not None
    fd = open_fd(path, os.O_RDONLY)
    try:
        if function(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"syncfs: {os.strerror(error)}", str(path))
    finally:
        os.close(fd)


def write_fully(fd: int, content: bytes) -> None:
    """os.write until everything is written: on a full disk a write can be short before it fails."""
    view = memoryview(content)
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])


def write_atomically(path: Path, content: bytes) -> None:
    """Replace ``path`` with ``content``: the old file stays whole until the new one is on disk.
    On a failure (a full disk) the temporary file is removed and the OSError raised."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            write_fully(fd, content)
            fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _write_lines(path: Path, lines: list[str]) -> None:
    body = f"{CHECKPOINT_VERSION}\n{len(lines)}\n" + "".join(line + "\n" for line in lines)
    write_atomically(path, body.encode())


def _read_lines(path: Path, fields: int) -> list[list[str]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        # Garbage (a torn write, a disk error) must read as malformed, not escape as a decode error.
        lines = data.decode("ascii").splitlines()
        if int(lines[0]) != CHECKPOINT_VERSION:
            raise KafkaStorageError(f"unrecognised version {lines[0]} in checkpoint file {path}")
        count = int(lines[1])
        entries = [line.split() for line in lines[2 : 2 + count]]
    except (IndexError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raise KafkaStorageError(f"malformed checkpoint file {path}: {e}") from e
    if len(entries) != count or any(len(entry) != fields for entry in entries):
        raise KafkaStorageError(f"malformed checkpoint file {path}: expected {count} entries")
    return entries


class OffsetCheckpointFile:
    """``recovery-point-offset-checkpoint`` / ``log-start-offset-checkpoint`` /
    ``replication-offset-checkpoint``: ``topic partition offset``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, offsets: dict[tuple[str, int], int]) -> None:
        _write_lines(
            self.path, [f"{topic} {partition} {offset}" for (topic, partition), offset in offsets.items()]
        )

    def read(self) -> dict[tuple[str, int], int]:
        try:
            return {(t, int(p)): int(o) for t, p, o in _read_lines(self.path, 3)}
        except ValueError as e:
            raise KafkaStorageError(f"malformed checkpoint file {self.path}: {e}") from e


class LeaderEpochCheckpointFile:
    """``leader-epoch-checkpoint``: one ``epoch start_offset`` line per epoch."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, entries: list[tuple[int, int]]) -> None:
        _write_lines(self.path, [f"{epoch} {offset}" for epoch, offset in entries])

    def read(self) -> list[tuple[int, int]]:
        try:
            return [(int(e), int(o)) for e, o in _read_lines(self.path, 2)]
        except ValueError as e:
            raise KafkaStorageError(f"malformed checkpoint file {self.path}: {e}") from e


def topic_id_to_string(topic_id: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


def topic_id_from_string(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


class PartitionMetadataFile:
    """``partition.metadata``: the topic id a partition directory belongs to."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, topic_id: uuid.UUID) -> None:
        write_atomically(self.path, self._content(topic_id))

    def write_unsynced(self, topic_id: uuid.UUID) -> None:
        """The first step of a write that a caller batches with many others: the content goes to a
        temporary file, not synced; once it is (``fsync_path``), ``commit`` renames it into place."""
        fd = open_fd(self.pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            write_fully(fd, self._content(topic_id))
        finally:
            os.close(fd)

    @property
    def pending(self) -> Path:
        """The temporary file of ``write_unsynced``."""
        return self.path.with_name(self.path.name + ".tmp")

    def commit(self) -> None:
        """The second step: the synced temporary file becomes the file (sync its directory next)."""
        os.replace(self.pending, self.path)

    @staticmethod
    def _content(topic_id: uuid.UUID) -> bytes:
        return f"version: 0\ntopic_id: {topic_id_to_string(topic_id)}\n".encode()

    def read(self) -> uuid.UUID | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            text = data.decode("ascii")
            fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
            if fields.get("version") != "0":
                raise ValueError(f"unsupported version {fields.get('version')}")
            return topic_id_from_string(fields["topic_id"].strip())
        except (KeyError, ValueError) as e:
            raise KafkaStorageError(f"malformed {self.path}: {e}") from e


class TopicConfigsFile:
    """``topic-configs.json``: a copy of the topic's config overrides (what the control plane
    holds), so that a topic rebuilt from its logs keeps them (a compacted topic stays compacted)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, topic_id: uuid.UUID, configs: dict[str, str]) -> None:
        text = json.dumps({"version": 1, "topic_id": str(topic_id), "configs": configs}, sort_keys=True)
        write_atomically(self.path, text.encode())

    def read(self) -> tuple[uuid.UUID, dict[str, str]] | None:
        """The topic id and configs; None if there is no copy; KafkaStorageError if unreadable."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            parsed = json.loads(data.decode("utf-8"))
            if parsed.get("version") != 1:
                raise ValueError(f"unsupported version {parsed.get('version')}")
            configs = parsed["configs"]
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in configs.items()):
                raise ValueError("configs must map names to strings")
            return uuid.UUID(parsed["topic_id"]), dict(configs)
        except (KeyError, ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
            raise KafkaStorageError(f"malformed {self.path}: {e}") from e
