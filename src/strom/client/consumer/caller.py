"""Work the I/O loop hands to the application's thread: rebalance and commit callbacks.

Kafka runs a consumer's rebalance listener and commit callbacks inside poll() (or
commit_sync, close) on the caller's thread, never on a background thread. The I/O loop
queues such work here and, for a rebalance, awaits it; the consumer's blocking calls run
what is queued whenever they wait. Changes to the assignment go through the same queue,
so they never race with poll() decoding records of a partition that is being revoked.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
from collections.abc import Callable
from typing import Any

_Work = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any] | None"]


class CallerTasks:
    def __init__(self, loop: asyncio.AbstractEventLoop, notify: Callable[[], None]) -> None:
        self._loop = loop
        self._notify = notify
        self._queue: collections.deque[_Work] = collections.deque()

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run ``function(*args)`` on the caller's thread and return its result (I/O loop side)."""
        future: asyncio.Future[Any] = self._loop.create_future()
        self._queue.append((function, args, future))
        self._notify()
        return await future

    def post(self, function: Callable[..., Any], *args: Any) -> None:
        """Queue ``function(*args)`` for the caller's thread without waiting for it."""
        self._queue.append((function, args, None))
        self._notify()

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def run_pending(self) -> None:
        """Run the queued work here (the synchronous consumer's thread)."""
        while self._queue:
            function, args, future = self._queue.popleft()
            if future is not None and future.done():
                continue  # its rebalance was cancelled (close, unsubscribe)
            try:
                result = function(*args)
                if inspect.isawaitable(result):
                    raise TypeError(
                        f"{function!r} returned an awaitable; use AsyncConsumer for coroutine callbacks"
                    )
            except Exception as exc:  # handed to the loop side, which decides
                self._resolve_threadsafe(future, None, exc)
            else:
                self._resolve_threadsafe(future, result, None)

    async def run_pending_async(self) -> None:
        """Run the queued work on the loop (AsyncConsumer), awaiting coroutine callbacks."""
        while self._queue:
            function, args, future = self._queue.popleft()
            if future is not None and future.done():
                continue
            try:
                result = function(*args)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                _resolve(future, None, exc)
            else:
                _resolve(future, result, None)

    def _resolve_threadsafe(
        self, future: asyncio.Future[Any] | None, result: Any, exc: BaseException | None
    ) -> None:
        if future is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_resolve, future, result, exc)

    def cancel_all(self) -> None:
        """Cancel the queued work the loop awaits (a closing consumer's rebalance callbacks). Posted
        callbacks (asynchronous commits finished during close) stay queued: the blocking call that
        is closing runs them before it returns, as Kafka's close() completes pending commits."""
        for _ in range(len(self._queue)):
            try:
                work = self._queue.popleft()
            except IndexError:  # the caller's thread ran the rest meanwhile
                return
            future = work[2]
            if future is None:
                self._queue.append(work)
            elif not future.done():
                future.cancel()


def _resolve(future: asyncio.Future[Any] | None, result: Any, exc: BaseException | None) -> None:
    if future is None or future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
