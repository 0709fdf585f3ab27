"""The controller's event queue (Kafka's ControllerEventManager): ZooKeeper watches only put
events on it, and one task runs them one at a time. A failed event is handed back to its owner
with the number of times in a row it failed, to be retried after ``retry_backoff``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

Handler = Callable[[], Awaitable[None]]
# The owner's answer to a failure: (event name, handler, error, failures in a row, the term the
# event started in).
OnFailure = Callable[[str, Handler, Exception, int, int], Awaitable[None]]
# Told of every event that ran to the end: its name and how long it took (ms).
OnDone = Callable[[str, float], None]

RETRY_BACKOFF_MIN_S = 0.2
RETRY_BACKOFF_MAX_S = 5.0


def retry_backoff(failures: int) -> float:
    """The delay before running an event again after its ``failures``-th failure in a row."""
    return float(min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_MIN_S * 2 ** (failures - 1)))


class EventQueue:
    def __init__(self, on_failure: OnFailure, term: Callable[[], int], on_done: OnDone) -> None:
        self._on_failure = on_failure
        self._on_done = on_done
        self._term = term
        self._events: asyncio.Queue[tuple[str, Handler] | None] = asyncio.Queue()
        self._timers: set[asyncio.TimerHandle] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self, task_name: str) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=task_name)

    def put(self, name: str, handler: Handler) -> None:
        if not self._stopped:
            self._events.put_nowait((name, handler))

    def put_later(self, delay: float, name: str, handler: Handler) -> None:
        def fire() -> None:
            self._timers.discard(timer)
            self.put(name, handler)

        timer = asyncio.get_running_loop().call_later(delay, fire)
        self._timers.add(timer)

    async def stop(self, timeout_s: float) -> None:
        """No more events; the one running finishes (cancelled after ``timeout_s``)."""
        self._stopped = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if self._task is None:
            return
        self._events.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        failures: dict[str, int] = {}
        while True:
            event = await self._events.get()
            if event is None or self._stopped:
                return
            name, handler = event
            term = self._term()
            started = time.monotonic()
            try:
                await handler()
                failures.pop(name, None)
                self._on_done(name, (time.monotonic() - started) * 1000)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures[name] = failures.get(name, 0) + 1
                await self._on_failure(name, handler, e, failures[name], term)
