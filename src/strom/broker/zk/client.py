"""ZooKeeper for the broker's event loop: kazoo underneath, awaitables and loop callbacks on top.

kazoo runs its own threads. Every result and every watch event is handed to the event loop
with ``call_soon_threadsafe``; nothing a kazoo thread runs ever waits on the loop, and nothing
the loop runs ever waits on ZooKeeper except through an awaitable. Watches are kazoo's
``DataWatch``/``ChildrenWatch`` recipes, which re-arm themselves after every event and after a
reconnect (plain one-shot watches are lost when a connection drops).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError, RolledBackError
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry

log = logging.getLogger(__name__)

__all__ = [
    "AsyncZooKeeper",
    "Check",
    "Create",
    "Delete",
    "MultiOpFailed",
    "NoNodeError",
    "NodeExistsError",
    "SessionState",
    "SetData",
    "Watch",
    "ZnodeStat",
    "split_connect_string",
]


class SessionState:
    """What a session listener is told (from kazoo's KazooState)."""

    CONNECTED = "connected"  # connected, with the same session or, after EXPIRED, a new one
    SUSPENDED = "suspended"  # connection lost; the session may still be alive on the server
    EXPIRED = "expired"  # the session is gone: its ephemeral znodes and its watches with it


@dataclass(frozen=True, slots=True)
class Check:
    path: str
    version: int


@dataclass(frozen=True, slots=True)
class Create:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False  # ZooKeeper appends the parent's 10-digit counter to the name


@dataclass(frozen=True, slots=True)
class SetData:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class Delete:
    path: str
    version: int = -1


Op = Check | Create | SetData | Delete


class MultiOpFailed(Exception):
    """A multi-op failed as a whole; ``index`` is the operation that failed and ``cause`` why
    (kazoo reports the failures as values; the other operations are RolledBackError)."""

    def __init__(self, index: int, op: Op, cause: Exception) -> None:
        super().__init__(f"operation {index} ({op}) failed: {type(cause).__name__}")
        self.index = index
        self.op = op
        self.cause = cause


def split_connect_string(connect: str) -> tuple[str, str]:
    """``host:port,host:port/chroot`` -> (hosts, chroot); the chroot is "" when absent or "/"."""
    hosts, slash, chroot = connect.partition("/")
    chroot = f"/{chroot}".rstrip("/") if slash else ""
    return hosts, chroot


class Watch:
    """A data or children watch; ``cancel`` stops delivering events (kazoo drops it at the next one)."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class AsyncZooKeeper:
    def __init__(
        self,
        connect: str,
        session_timeout_ms: int,
        connection_timeout_ms: int,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        hosts, self.chroot = split_connect_string(connect)
        self._connection_timeout = connection_timeout_ms / 1000
        self._loop = loop or asyncio.get_running_loop()
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout_ms / 1000,
            # Reconnect forever, quickly: a broker without ZooKeeper serves nothing new.
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
            logger=logging.getLogger("kazoo.client"),
        )
        self._listeners: list[Callable[[str], None]] = []
        self._client.add_listener(self._on_kazoo_state)
        self._session_lost = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (raising TimeoutError after zookeeper.connection.timeout.ms), then create the
        chroot if it is missing, as Kafka does, and work below it from then on."""
        await self._loop.run_in_executor(None, self._start_blocking)

    def _start_blocking(self) -> None:
        self._client.start(timeout=self._connection_timeout)
        if self.chroot:
            self._client.ensure_path(self.chroot)
            self._client.chroot = self.chroot

    async def stop(self) -> None:
        """Close the session (its ephemeral znodes go at once) and stop kazoo's threads."""
        await self._loop.run_in_executor(None, self._stop_blocking)

    def _stop_blocking(self) -> None:
        with contextlib.suppress(Exception):
            self._client.stop()
        with contextlib.suppress(Exception):
            self._client.close()

    @property
    def session_id(self) -> int:
        client_id = self._client.client_id
        return int(client_id[0]) if client_id else 0

    @property
    def connected(self) -> bool:
        return bool(self._client.connected)

    def add_session_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(SessionState.X)`` runs on the event loop at every session change."""
        self._listeners.append(listener)

    def _on_kazoo_state(self, state: str) -> None:
        # A kazoo thread: hand the change to the loop and return at once.
        if state == KazooState.LOST:
            self._session_lost = True
            event = SessionState.EXPIRED
        elif state == KazooState.SUSPENDED:
            event = SessionState.SUSPENDED
        else:
            event = SessionState.CONNECTED
        self._post(self._notify, event)

    def _notify(self, event: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("ZooKeeper session listener failed", extra={"event": event})

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the broker is gone
            self._loop.call_soon_threadsafe(callback, *args)

    # -- operations ----------------------------------------------------------------------------

    def _await(self, async_result: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self._loop.create_future()

        def settle(result: Any) -> None:
            if future.done():
                return
            try:
                future.set_result(result.get_nowait())
            except Exception as e:
                future.set_exception(e)

        async_result.rawlink(lambda result: self._post(settle, result))
        return future

    async def get(self, path: str) -> tuple[bytes, ZnodeStat]:
        """Raises NoNodeError when ``path`` does not exist."""
        data, stat = await self._await(self._client.get_async(path))
        return data or b"", stat

    async def get_or_none(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        try:
            return await self.get(path)
        except NoNodeError:
            return None

    async def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """Every one of ``paths`` read in one pipeline (all requests sent before any answer is awaited,
        one hand-over to the loop for all the answers); None where a znode does not exist."""
        answers = await self._all([self._client.get_async(path) for path in paths])
        results: list[tuple[bytes, ZnodeStat] | None] = []
        for answer in answers:
            if isinstance(answer, NoNodeError):
                results.append(None)
            elif isinstance(answer, Exception):
                raise answer
            else:
                results.append((answer[0] or b"", answer[1]))
        return results

    async def get_children_many(self, paths: Sequence[str]) -> list[list[str] | None]:
        """The children of every one of ``paths``, pipelined as ``get_many``; None where there is no such znode."""
        answers = await self._all([self._client.get_children_async(path) for path in paths])
        results: list[list[str] | None] = []
        for answer in answers:
            if isinstance(answer, NoNodeError):
                results.append(None)
            elif isinstance(answer, Exception):
                raise answer
            else:
                results.append(list(answer))
        return results

    def _all(self, async_results: list[Any]) -> asyncio.Future[list[Any]]:
        """The values (or exceptions) of ``async_results``, once all are in: kazoo's threads collect
        them and wake the loop once, not once per answer."""
        future: asyncio.Future[list[Any]] = self._loop.create_future()
        values: list[Any] = [None] * len(async_results)
        remaining = [len(async_results)]
        lock = threading.Lock()
        if not async_results:
            future.set_result(values)
            return future

        def settle() -> None:
            if not future.done():
                future.set_result(values)

        def collect(index: int, result: Any) -> None:
            try:
                values[index] = result.get_nowait()
            except Exception as e:
                values[index] = e
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self._post(settle)

        for index, async_result in enumerate(async_results):
            async_result.rawlink(partial(collect, index))
        return future

    async def get_children(self, path: str) -> list[str]:
        children: list[str] = await self._await(self._client.get_children_async(path))
        return children

    async def exists(self, path: str) -> ZnodeStat | None:
        stat: ZnodeStat | None = await self._await(self._client.exists_async(path))
        return stat

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        """Create ``path``; returns the path created (with its sequence suffix). NodeExistsError if taken."""
        created: str = await self._await(
            self._client.create_async(path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath)
        )
        return created

    async def set(self, path: str, data: bytes, version: int = -1) -> ZnodeStat:
        """Write ``data``; with ``version`` >= 0 only if the znode is at that version (else BadVersionError)."""
        stat: ZnodeStat = await self._await(self._client.set_async(path, data, version))
        return stat

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        if recursive:
            await self._loop.run_in_executor(None, lambda: self._client.delete(path, recursive=True))
        else:
            await self._await(self._client.delete_async(path, version))

    async def ensure_path(self, path: str) -> None:
        await self._await(self._client.ensure_path_async(path))

    async def multi(self, ops: Sequence[Op]) -> list[Any]:
        """All of ``ops`` or none of them (ZooKeeper's multi). Raises MultiOpFailed naming the op
        that failed -- a failed Check is how a write is fenced by another znode's version."""
        transaction = self._client.transaction()
        for op in ops:
            if isinstance(op, Check):
                transaction.check(op.path, op.version)
            elif isinstance(op, Create):
                transaction.create(op.path, op.data, ephemeral=op.ephemeral, sequence=op.sequence)
            elif isinstance(op, SetData):
                transaction.set_data(op.path, op.data, op.version)
            else:
                transaction.delete(op.path, op.version)
        results: list[Any] = await self._await(transaction.commit_async())
        for index, result in enumerate(results):
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise MultiOpFailed(index, ops[index], result)
        return results

    # -- watches -------------------------------------------------------------------------------

    async def watch_data(
        self, path: str, callback: Callable[[bytes | None, ZnodeStat | None], None]
    ) -> Watch:
        """``callback(data, stat)`` on the loop now and at every change (None, None: no such znode).
        The first call has happened when this returns."""
        watch = Watch()
        first: asyncio.Future[None] = self._loop.create_future()

        def on_change(data: bytes | None, stat: ZnodeStat | None, *_: Any) -> bool | None:
            if watch.cancelled:
                return False
            self._post(deliver, data, stat)
            return None

        def deliver(data: bytes | None, stat: ZnodeStat | None) -> None:
            try:
                if not watch.cancelled:
                    callback(data if stat is not None else None, stat)
            finally:
                if not first.done():
                    first.set_result(None)

        await self._loop.run_in_executor(None, lambda: DataWatch(self._client, path, on_change))
        await first
        return watch

    async def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> Watch:
        """``callback(children)`` on the loop now and at every change of ``path``'s children
        (``path`` must exist). The first call has happened when this returns."""
        watch = Watch()
        first: asyncio.Future[None] = self._loop.create_future()

        def on_change(children: list[str]) -> bool | None:
            if watch.cancelled:
                return False
            self._post(deliver, list(children))
            return None

        def deliver(children: list[str]) -> None:
            try:
                if not watch.cancelled:
                    callback(children)
            finally:
                if not first.done():
                    first.set_result(None)

        await self._loop.run_in_executor(None, lambda: ChildrenWatch(self._client, path, on_change))
        await first
        return watch
