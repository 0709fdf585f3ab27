"""Coordinator work that runs to its end whoever waits for it.

The network layer cancels a connection's handler when its client goes away. A coordinator call
that has started a write to its log must still apply it in memory once written (or drop it once
failed), and what the write decides must still happen (a decided transaction's markers, a
group's assignment to its waiting members), as in Kafka, where the append's callback runs
whether or not anyone reads the answer. ``DetachedTasks`` runs such work in tasks of its own:
``run`` for a call a handler awaits, ``spawn`` for background work; a task that fails with
nobody awaiting it is logged rather than lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class DetachedTasks:
    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self.pending: set[asyncio.Task[Any]] = set()
        self._stopped = False

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Background work; nothing once stopped."""
        if self._stopped:
            coro.close()
            return
        self._track(coro).add_done_callback(self._log_failure)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s result; if the caller is cancelled meanwhile, ``coro`` still runs to its end."""
        if self._stopped:
            return await coro
        task = self._track(coro)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._log_failure)  # nobody else will see how it ends
            raise

    def cancel_all(self) -> None:
        """At shutdown: cancel what runs and start nothing more."""
        self._stopped = True
        for task in self.pending:
            task.cancel()

    def _track(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return task

    def _log_failure(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._log.error("a coordinator task failed", exc_info=error)
