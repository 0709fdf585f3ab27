"""The synchronous face of the asyncio client: an event loop on a background thread.

Each synchronous client (Producer, Consumer, AdminClient) owns one I/O thread, as
Kafka's Java clients do; its calls hand coroutines to that loop and wait for them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


class EventLoopThread:
    def __init__(self, name: str) -> None:
        self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the loop and wait for its result (exceptions propagate)."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a synchronous client call from inside its own callback would deadlock")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @property
    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        """Stop the loop after what is scheduled now, and wait for the thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.is_current:
            self._thread.join()
