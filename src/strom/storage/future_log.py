"""A partition's log being copied to another log dir of the same broker (AlterReplicaLogDirs).

Kafka keeps a *future* replica (``<topic>-<partition>.<id>-future`` in the destination dir) that
catches up with the current one, then swaps the two. Strom copies files instead of records: the
``.log`` files only grow by appends (a rolled or retained segment is a new or a vanished file, a
cleaned one a new file under the old name), so rounds in a worker thread copy what each file
gained since the last round while the partition keeps serving. The last round runs where nothing
appends (the event loop, between requests), after the current log is closed; it copies the small
remaining tail and the mutable files (indexes, producer snapshots, the leader epoch checkpoint,
partition.metadata), renames the copy into place and opens it.

The switch is crash safe: the current directory is first renamed ``.<id>-moved``, then the
complete copy takes the partition's name. At startup (``resolve_interrupted_moves``) a
``-future`` directory whose partition still has a ``-moved`` one is that complete copy and is
kept; a lone ``-future`` is an unfinished copy and is removed; a ``-moved`` with no copy left is
renamed back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid
from pathlib import Path

from strom.storage.local_log import parse_topic_partition
from strom.storage.log_segment import LOG_SUFFIX
from strom.storage.unified_log import UnifiedLog

log = logging.getLogger(__name__)

FUTURE_SUFFIX = "-future"
MOVED_SUFFIX = "-moved"
_CHUNK = 1 << 20


def _partition_of(name: str, suffix: str) -> str | None:
    """``t-0.<id><suffix>`` -> ``t-0``; None for other names."""
    if not name.endswith(suffix):
        return None
    base, dot, _ = name[: -len(suffix)].rpartition(".")
    if not dot:
        return None
    try:
        parse_topic_partition(base)
    except ValueError:
        return None
    return base


def resolve_interrupted_moves(log_dirs: list[Path]) -> None:
    """Finish or undo the log dir moves a crash interrupted (before the logs are loaded)."""
    futures: dict[str, Path] = {}
    moved: dict[str, Path] = {}
    for log_dir in log_dirs:
        if not log_dir.is_dir():
            continue
        for child in log_dir.iterdir():
            if (name := _partition_of(child.name, FUTURE_SUFFIX)) is not None:
                futures[name] = child
            elif (name := _partition_of(child.name, MOVED_SUFFIX)) is not None:
                moved[name] = child
    for name, future in futures.items():
        old = moved.pop(name, None)
        if old is None:
            log.info("removing an unfinished log dir move", extra={"dir": str(future)})
            shutil.rmtree(future)
            continue
        os.rename(future, future.parent / name)
        shutil.rmtree(old)
        log.info("completed an interrupted log dir move", extra={"log": name, "log_dir": str(future.parent)})
    for name, old in moved.items():
        os.rename(old, old.parent / name)
        log.warning("undid an interrupted log dir move", extra={"log": name, "log_dir": str(old.parent)})


class FutureLog:
    """The copy of ``source`` being made in ``target_dir``."""

    def __init__(self, source: UnifiedLog, target_dir: Path) -> None:
        self.source = source
        self.target_dir = target_dir
        self.dir = target_dir / f"{source.dir.name}.{uuid.uuid4().hex}{FUTURE_SUFFIX}"
        # Per copied .log file: (inode, bytes copied). Another inode under the same name is a
        # rewritten (cleaned) segment, copied again from its start.
        self._copied: dict[str, tuple[int, int]] = {}
        self.cancelled = False
        # The current log's directory once the copy took its place (``-moved``, to be removed).
        self.retired: Path | None = None
        # The broker's task that drives the copy (kept here so that it is not collected).
        self.task: asyncio.Task[None] | None = None

    @property
    def size_in_bytes(self) -> int:
        return sum(size for _, size in self._copied.values())

    def offset_lag(self) -> int:
        """How far the copy is behind the current log, in offsets: from the first segment not yet
        copied whole (as the records are, not exactly) to the log end."""
        for segment in self.source.segments:
            copied = self._copied.get(segment.log_path.name)
            if copied is None or copied[1] < segment.size:
                return max(0, self.source.log_end_offset - segment.base_offset)
        return 0

    def copy_round(self) -> int:
        """Copy what the ``.log`` files gained since the last round; the bytes copied (a worker
        thread may run this while the partition is appended to)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        present = set()
        copied = 0
        for source in sorted(self.source.dir.glob(f"*{LOG_SUFFIX}")):
            present.add(source.name)
            copied += self._copy_log_file(source)
        for gone in set(self._copied) - present:  # deleted by retention or DeleteRecords meanwhile
            (self.dir / gone).unlink(missing_ok=True)
            del self._copied[gone]
        return copied

    def _copy_log_file(self, source: Path) -> int:
        try:
            with open(source, "rb") as src:
                stat = os.fstat(src.fileno())
                inode, done = self._copied.get(source.name, (stat.st_ino, 0))
                if inode != stat.st_ino:
                    done = 0
                size = stat.st_size
                if size <= done:
                    return 0
                src.seek(done)
                with open(self.dir / source.name, "r+b" if done else "wb") as dst:
                    dst.seek(done)
                    remaining = size - done
                    while remaining > 0:
                        chunk = src.read(min(_CHUNK, remaining))
                        if not chunk:
                            break
                        dst.write(chunk)
                        remaining -= len(chunk)
                    dst.truncate(size - remaining)
                self._copied[source.name] = (stat.st_ino, size - remaining)
                return size - remaining - done
        except FileNotFoundError:
            return 0  # retained away between the listing and the copy: the next round sees it gone

    def complete(self) -> Path:
        """The last round, with ``source`` closed (nothing appends): copy the tail and every other
        file, sync, and switch directories. Returns the partition's new directory."""
        assert self.source.closed, "the current log must be closed before its copy completes"
        self.copy_round()
        for source in self.source.dir.iterdir():
            if source.is_file() and not source.name.endswith(LOG_SUFFIX):
                shutil.copyfile(source, self.dir / source.name)
        for copy in self.dir.iterdir():
            with open(copy, "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(self.dir)
        final = self.target_dir / self.source.dir.name
        moved = self.source.dir.with_name(f"{self.source.dir.name}.{uuid.uuid4().hex}{MOVED_SUFFIX}")
        os.rename(self.source.dir, moved)
        try:
            os.rename(self.dir, final)
        except OSError:
            os.rename(moved, self.source.dir)  # the current log keeps the partition's name
            raise
        self.retired = moved
        _fsync_dir(final.parent)
        _fsync_dir(moved.parent)
        return final

    def discard(self) -> None:
        """Remove the copy (a cancelled or failed move)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
