"""A bounded, least-recently-used cache of open segment and index file descriptors.

A broker may host tens of thousands of logs, each with a ``.log``, ``.index`` and ``.timeindex``
file per segment, while the process may hold only RLIMIT_NOFILE descriptors (sockets included).
Every segment and index file is therefore a ``CachedFile``: opened by path when used, pinned
while a call uses its descriptor, and closed by the process-wide ``FileCache`` when more than
``max_open`` files are open and it is the least recently used unpinned one. An idle log thus
holds at most its active segment's ``.log`` descriptor, and none once the cache needs the slot.

Pins make closes safe across threads: the cache never closes a descriptor a caller is using
(so a descriptor number is never reused under a read or write), and ``close`` of a pinned file
defers the ``os.close`` to its last unpin. Data written through a descriptor the cache closed
stays in the page cache; a later fsync through a new descriptor of the same file syncs it.

Opens that hit EMFILE/ENFILE close unpinned cached files and retry (``open_fd``), so running out
of descriptors is never a log dir failure while the cache could have given some back.
"""

from __future__ import annotations

import collections
import errno
import os
import resource
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

_T = TypeVar("_T")
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def default_max_open() -> int:
    """Three quarters of the soft descriptor limit (the rest for sockets, checkpoints, ZooKeeper);
    the broker sets it again after raising the limit at start."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(64, soft * 3 // 4)


class FileCache:
    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self._lock = threading.Lock()
        # Open files, least recently used first (pinned ones included: they count against the cap).
        self._open: collections.OrderedDict[CachedFile, None] = collections.OrderedDict()

    @property
    def open_count(self) -> int:
        return len(self._open)

    def _drop_locked(self, file: CachedFile) -> None:
        del self._open[file]
        fd, file._fd = file._fd, -1
        os.close(fd)

    def _close_unpinned_locked(self, count: int) -> int:
        """Close up to ``count`` least recently used unpinned files; returns how many."""
        victims = []
        if count > 0:
            for file in self._open:  # oldest first; pinned ones are in use
                if file._pins == 0:
                    victims.append(file)
                    if len(victims) >= count:
                        break
        for file in victims:
            self._drop_locked(file)
        return len(victims)

    def _shrink_locked(self) -> int:
        return self._close_unpinned_locked(max(16, len(self._open) // 8))

    def shrink(self) -> int:
        """Close some unpinned files (a descriptor is needed elsewhere); returns how many."""
        with self._lock:
            return self._shrink_locked()

    def retry_out_of_descriptors(self, call: Callable[[], _T]) -> _T:
        """Run ``call`` (which opens files); on EMFILE/ENFILE (raw, or the cause of a storage
        error) give back cached descriptors and retry, while there are any to give back."""
        while True:
            try:
                return call()
            except Exception as e:
                if not is_out_of_descriptors(e) or not self.shrink():
                    raise

    def _acquire(self, file: CachedFile) -> int:
        with self._lock:
            if file._closed:
                raise OSError(errno.EBADF, f"{file.path} is closed")
            if file._fd >= 0:
                self._open.move_to_end(file)
                file._pins += 1
                return file._fd
        # Opened outside the lock: an open that waits on the disk must not hold up every other
        # file's use. Two threads may open the same file; the later one closes its copy.
        fd = self.retry_out_of_descriptors(lambda: os.open(file.path, file._flags, 0o644))
        with self._lock:
            if file._closed:
                os.close(fd)
                raise OSError(errno.EBADF, f"{file.path} is closed")
            if file._fd >= 0:
                os.close(fd)
                self._open.move_to_end(file)
            else:
                if file._create_once:
                    file._flags &= ~os.O_CREAT
                file._fd = fd
                self._open[file] = None
            file._pins += 1
            self._close_unpinned_locked(len(self._open) - self.max_open)
            return file._fd

    def _release(self, file: CachedFile) -> None:
        with self._lock:
            file._pins -= 1
            if file._pins == 0 and file._closed and file._fd >= 0:
                self._drop_locked(file)

    def _close(self, file: CachedFile, final: bool) -> None:
        with self._lock:
            if final:
                file._closed = True
            if file._fd >= 0 and file._pins == 0:
                self._drop_locked(file)


def is_out_of_descriptors(error: BaseException) -> bool:
    """EMFILE/ENFILE, raw or as the cause of a wrapping error."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in _OUT_OF_DESCRIPTORS:
            return True
        cause = cause.__cause__
    return False


# One cache per process, like Kafka's per-broker limit; LogManager sizes it.
_cache = FileCache(default_max_open())


def file_cache() -> FileCache:
    return _cache


def open_fd(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` for a short-lived descriptor that gives back cached ones when the process has none."""
    return _cache.retry_out_of_descriptors(lambda: os.open(path, flags, mode))


class CachedFile:
    """A segment or index file whose descriptor the cache opens on use and may close when idle.

    ``with file as fd:`` pins the descriptor for the block (reentrant). ``create_once`` files
    (segment logs) are created by their first open only: a later reopen of a file deleted meanwhile
    fails instead of creating an empty one.
    """

    __slots__ = ("_cache", "_closed", "_create_once", "_fd", "_flags", "_pins", "path")

    def __init__(self, path: Path, *, create: bool, create_once: bool = False) -> None:
        self.path = path
        self._fd = -1
        self._pins = 0
        self._flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self._create_once = create_once
        self._closed = False
        self._cache = _cache

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> int:
        cache = self._cache
        with cache._lock:  # the common case inline: the append and read paths pin per call
            if self._fd >= 0 and not self._closed:
                self._pins += 1
                cache._open.move_to_end(self)
                return self._fd
        return cache._acquire(self)

    def __exit__(self, *_: object) -> None:
        cache = self._cache
        with cache._lock:
            self._pins -= 1
            if self._pins or not self._closed or self._fd < 0:
                return
            cache._drop_locked(self)

    def pin_if_open(self) -> int:
        """Pin and return the descriptor if one is open, else -1 (then nothing to unpin)."""
        with self._cache._lock:
            if self._fd < 0 or self._closed:
                return -1
            self._pins += 1
            return self._fd

    def unpin(self) -> None:
        self._cache._release(self)

    def close_descriptor(self) -> None:
        """Close the descriptor now unless it is pinned (the cache closes it later); the file
        reopens on next use."""
        self._cache._close(self, final=False)

    def close(self) -> None:
        """Close for good: later uses raise EBADF, as a closed descriptor would."""
        self._cache._close(self, final=True)

    def rename(self, path: Path) -> None:
        self.path = path
