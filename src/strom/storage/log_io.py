"""A log's serial I/O executor: its file-mutating steps (truncation, leader-epoch checkpoint
writes) run off the event loop, one at a time and in submission order.

Every log's executor runs on one shared pool of niced threads of its own, not asyncio's default
executor, whose threads kazoo's watch recipes and ZooKeeper calls occupy: a slow disk must not
delay a ZooKeeper watch, nor a ZooKeeper call a truncation. A pool thread serves one log's queue
until it is empty, so steps of one log never overlap while different logs proceed in parallel.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

LOG_IO_THREADS = 4
# Niceness of background worker threads (log I/O, log creation and deletion, coordinator loads).
BACKGROUND_NICENESS = 10

_P = ParamSpec("_P")
_R = TypeVar("_R")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def lower_thread_priority() -> None:
    """A thread pool's initializer: Linux schedules threads, so a niced worker leaves the CPU to
    the event loop's thread when both are runnable and bulk file work costs clients little latency."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)


def log_io_pool() -> ThreadPoolExecutor:
    """The process's pool for log I/O (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                LOG_IO_THREADS, thread_name_prefix="strom-log-io", initializer=lower_thread_priority
            )
        return _pool


class SerialExecutor:
    """Runs submitted calls one at a time, in order, on the shared log I/O pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[Future[object], Callable[[], object]]] = collections.deque()
        # Calls submitted and not finished (queued or running).
        self._pending = 0

    @property
    def busy(self) -> bool:
        """A call is queued or running: a step that mutates the log elsewhere must wait or skip."""
        return self._pending > 0

    def submit(self, fn: Callable[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_R]:
        future: Future[_R] = Future()
        with self._lock:
            self._queue.append((future, functools.partial(fn, *args, **kwargs)))  # type: ignore[arg-type]
            self._pending += 1
            start = self._pending == 1
        if start:
            log_io_pool().submit(self._drain)
        return future

    def _drain(self) -> None:
        more = True
        while more:
            with self._lock:
                future, call = self._queue.popleft()  # _pending > 0 counts it
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as e:  # handed to the waiting caller
                    future.set_exception(e)
                else:
                    future.set_result(result)
            with self._lock:
                self._pending -= 1
                more = self._pending > 0
