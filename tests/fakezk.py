"""An in-memory ZooKeeper for in-process tests of the controller (the subset of
``strom.broker.zk.client.AsyncZooKeeper`` it uses), with faults injected at chosen writes.

One ``FakeZooKeeperServer`` holds the tree: znodes with data, versions, czxid/mzxid, ctime,
ephemeral owners and sequential children. Each ``FakeZooKeeper`` is one session on it (closing
or expiring it deletes its ephemerals). Multi-ops are all-or-nothing, checked op by op against
the tree as the earlier ops left it, as ZooKeeper does. Watches behave as kazoo's DataWatch and
ChildrenWatch recipes: called once at once, then after every change, with the state current
when the call runs (several changes may arrive as one call).

Faults: ``session.fail_write(n, applied=...)`` makes the session's n-th write from now (create,
set, delete or multi) raise ConnectionLoss -- before it is applied, or after (the answer is lost
but the write happened, as when a connection drops between the request and its reply).
``session.before_write(n, action)`` runs ``action`` just before that write reaches the tree, as
another client's write that lands between this session's read and its write would.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from kazoo.protocol.states import ZnodeStat

from strom.broker.zk.client import Check, Create, Delete, MultiOpFailed, Op, SessionState, SetData, Watch


@dataclass
class _Node:
    data: bytes
    czxid: int
    mzxid: int
    ctime: int
    mtime: int
    ephemeral_owner: int = 0
    version: int = 0
    cversion: int = 0
    children: set[str] = field(default_factory=set)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _name(path: str) -> str:
    return path.rsplit("/", 1)[1]


class FakeZooKeeperServer:
    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {"/": _Node(b"", 0, 0, 0, 0)}
        self._zxid = itertools.count(1)
        self._session_ids = itertools.count(0x1000)
        self.sessions: dict[int, FakeZooKeeper] = {}
        self.clock_offset_ms = 0  # added to ctime/mtime of what is written from now on

    # -- the tree ------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(time.time() * 1000) + self.clock_offset_ms

    def stat(self, path: str) -> ZnodeStat:
        n = self.nodes[path]
        return ZnodeStat(
            n.czxid,
            n.mzxid,
            n.ctime,
            n.mtime,
            n.version,
            n.cversion,
            0,
            n.ephemeral_owner,
            len(n.data),
            len(n.children),
            n.mzxid,
        )

    def _apply(self, nodes: dict[str, _Node], op: Op, session: int, changed: set[tuple[str, str]]) -> Any:
        """Apply one op to ``nodes`` (raising ZooKeeper's error); ``changed`` collects what changed:
        ("data", path) for a znode created, set or deleted, ("children", path) for its parent."""
        if isinstance(op, Check):
            if op.path not in nodes:
                raise NoNodeError()
            if op.version != -1 and nodes[op.path].version != op.version:
                raise BadVersionError()
            return True
        if isinstance(op, Create):
            return self._create(nodes, op.path, op.data, op.ephemeral, op.sequence, session, changed)
        if isinstance(op, SetData):
            node = nodes.get(op.path)
            if node is None:
                raise NoNodeError()
            if op.version != -1 and node.version != op.version:
                raise BadVersionError()
            zxid = next(self._zxid)
            nodes[op.path] = _Node(
                op.data,
                node.czxid,
                zxid,
                node.ctime,
                self.now_ms(),
                node.ephemeral_owner,
                node.version + 1,
                node.cversion,
                set(node.children),
            )
            changed.add(("data", op.path))
            return None  # the stat is filled in once the whole op list applied
        node = nodes.get(op.path)
        if node is None:
            raise NoNodeError()
        if op.version != -1 and node.version != op.version:
            raise BadVersionError()
        if node.children:
            raise NotEmptyError()
        del nodes[op.path]
        parent = nodes[_parent(op.path)]
        nodes[_parent(op.path)] = _Node(
            parent.data,
            parent.czxid,
            parent.mzxid,
            parent.ctime,
            parent.mtime,
            parent.ephemeral_owner,
            parent.version,
            parent.cversion + 1,
            parent.children - {_name(op.path)},
        )
        changed |= {("data", op.path), ("children", _parent(op.path))}
        return True

    def _create(
        self,
        nodes: dict[str, _Node],
        path: str,
        data: bytes,
        ephemeral: bool,
        sequence: bool,
        session: int,
        changed: set[tuple[str, str]],
    ) -> str:
        parent_path = _parent(path)
        parent = nodes.get(parent_path)
        if parent is None:
            raise NoNodeError()
        if parent.ephemeral_owner:
            raise NoNodeError()  # ZooKeeper: NoChildrenForEphemerals; no caller tells them apart
        if sequence:
            path = f"{path}{parent.cversion:010d}"
        if path in nodes:
            raise NodeExistsError()
        zxid = next(self._zxid)
        now = self.now_ms()
        nodes[path] = _Node(data, zxid, zxid, now, now, session if ephemeral else 0)
        nodes[parent_path] = _Node(
            parent.data,
            parent.czxid,
            parent.mzxid,
            parent.ctime,
            parent.mtime,
            parent.ephemeral_owner,
            parent.version,
            parent.cversion + 1,
            parent.children | {_name(path)},
        )
        changed |= {("data", path), ("children", parent_path)}
        return path

    def commit(self, ops: Sequence[Op], session: int) -> list[Any]:
        """Apply ``ops`` all or none; raises MultiOpFailed as AsyncZooKeeper.multi does."""
        nodes = dict(self.nodes)
        changed: set[tuple[str, str]] = set()
        results: list[Any] = []
        for index, op in enumerate(ops):
            try:
                results.append(self._apply(nodes, op, session, changed))
            except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError) as e:
                raise MultiOpFailed(index, op, e) from None
        self.nodes = nodes
        for index, op in enumerate(ops):
            if isinstance(op, SetData):
                results[index] = self.stat(op.path)
        self._changed(changed)
        return results

    def single(self, op: Op, session: int, sequence: bool = False) -> Any:
        changed: set[tuple[str, str]] = set()
        if isinstance(op, Create):
            result: Any = self._create(
                self.nodes, op.path, op.data, op.ephemeral, sequence or op.sequence, session, changed
            )
        else:
            result = self._apply(self.nodes, op, session, changed)
            if isinstance(op, SetData):
                result = self.stat(op.path)
        self._changed(changed)
        return result

    def _changed(self, paths: set[tuple[str, str]]) -> None:
        for session in list(self.sessions.values()):
            session.notify(paths)

    def close_session(self, session_id: int) -> None:
        """The session ends: its ephemeral znodes go (watchers see it)."""
        self.sessions.pop(session_id, None)
        changed: set[tuple[str, str]] = set()
        for path in sorted(
            (p for p, n in self.nodes.items() if n.ephemeral_owner == session_id), reverse=True
        ):
            self._apply(self.nodes, Delete(path), session_id, changed)
        self._changed(changed)

    # -- helpers for tests ---------------------------------------------------------------------

    def ensure(self, path: str) -> None:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            p = "/" + "/".join(parts[:i])
            if p not in self.nodes:
                self.single(Create(p), 0)

    def put(self, path: str, data: bytes) -> None:
        """Create or overwrite ``path`` (parents too), as an operator's tool would."""
        if path in self.nodes:
            self.single(SetData(path, data), 0)
        else:
            self.ensure(_parent(path))
            self.single(Create(path, data), 0)

    def data(self, path: str) -> bytes | None:
        node = self.nodes.get(path)
        return node.data if node is not None else None

    def children(self, path: str) -> list[str]:
        return sorted(self.nodes[path].children) if path in self.nodes else []


class _Watcher:
    def __init__(self, kind: str, path: str, callback: Callable[..., None], watch: Watch) -> None:
        self.kind = kind
        self.path = path
        self.callback = callback
        self.watch = watch
        self.pending = False


class FakeZooKeeper:
    """One session on a FakeZooKeeperServer, with AsyncZooKeeper's interface."""

    def __init__(self, server: FakeZooKeeperServer) -> None:
        self.server = server
        self.session_id = next(server._session_ids)
        self.connected = True
        self.chroot = ""
        server.sessions[self.session_id] = self
        self._listeners: list[Callable[[str], None]] = []
        self._watchers: list[_Watcher] = []
        self._expired = False
        self.writes = 0  # writes attempted so far (a multi counts once)
        self.reads = 0  # znodes read by get_many and get_children_many
        self._faults: dict[int, bool] = {}  # write number -> applied before the ConnectionLoss
        self._interleaved: dict[int, Callable[[], None]] = {}  # write number -> another's write

    # -- faults --------------------------------------------------------------------------------

    def fail_write(self, nth_from_now: int, *, applied: bool = False) -> None:
        """The ``nth_from_now``-th next write (0: the very next) raises ConnectionLoss."""
        self._faults[self.writes + nth_from_now] = applied

    def before_write(self, nth_from_now: int, action: Callable[[], None]) -> None:
        """Run ``action`` just before the ``nth_from_now``-th next write (0: the very next) applies."""
        self._interleaved[self.writes + nth_from_now] = action

    def _write(self, apply: Callable[[], Any]) -> Any:
        number = self.writes
        self.writes += 1
        interleaved = self._interleaved.pop(number, None)
        if interleaved is not None:
            interleaved()
        applied = self._faults.pop(number, None)
        if applied is None:
            return apply()
        if applied:
            apply()
        raise ConnectionLoss()

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self._watchers.clear()
        self.server.close_session(self.session_id)

    def expire(self) -> None:
        """The server expires the session: ephemerals and watches go; listeners hear EXPIRED."""
        self._expired = True
        self._watchers.clear()
        self.server.close_session(self.session_id)
        for listener in list(self._listeners):
            asyncio.get_running_loop().call_soon(listener, SessionState.EXPIRED)

    def add_session_listener(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    async def _round_trip(self) -> None:
        await asyncio.sleep(0)
        if self._expired:
            raise SessionExpiredError()

    # -- reads ---------------------------------------------------------------------------------

    async def get(self, path: str) -> tuple[bytes, ZnodeStat]:
        await self._round_trip()
        if path not in self.server.nodes:
            raise NoNodeError()
        return self.server.nodes[path].data, self.server.stat(path)

    async def get_or_none(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        try:
            return await self.get(path)
        except NoNodeError:
            return None

    async def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """One round trip for all of ``paths`` (AsyncZooKeeper pipelines them)."""
        await self._round_trip()
        self.reads += len(paths)
        return [
            (self.server.nodes[p].data, self.server.stat(p)) if p in self.server.nodes else None
            for p in paths
        ]

    async def get_children_many(self, paths: Sequence[str]) -> list[list[str] | None]:
        await self._round_trip()
        self.reads += len(paths)
        return [sorted(self.server.nodes[p].children) if p in self.server.nodes else None for p in paths]

    async def get_children(self, path: str) -> list[str]:
        await self._round_trip()
        if path not in self.server.nodes:
            raise NoNodeError()
        return sorted(self.server.nodes[path].children)

    async def exists(self, path: str) -> ZnodeStat | None:
        await self._round_trip()
        return self.server.stat(path) if path in self.server.nodes else None

    # -- writes --------------------------------------------------------------------------------

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        await self._round_trip()

        def apply() -> str:
            if makepath:
                self.server.ensure(_parent(path))
            created: str = self.server.single(
                Create(path, data, ephemeral), self.session_id, sequence=sequence
            )
            return created

        result: str = self._write(apply)
        return result

    async def set(self, path: str, data: bytes, version: int = -1) -> ZnodeStat:
        await self._round_trip()
        stat: ZnodeStat = self._write(
            lambda: self.server.single(SetData(path, data, version), self.session_id)
        )
        return stat

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        await self._round_trip()

        def apply() -> None:
            if recursive:
                for child in sorted(self.server.nodes.get(path, _Node(b"", 0, 0, 0, 0)).children):
                    self._delete_tree(f"{path}/{child}")
            self.server.single(Delete(path, version), self.session_id)

        self._write(apply)

    def _delete_tree(self, path: str) -> None:
        for child in sorted(self.server.nodes[path].children):
            self._delete_tree(f"{path}/{child}")
        self.server.single(Delete(path), self.session_id)

    async def ensure_path(self, path: str) -> None:
        await self._round_trip()
        self.server.ensure(path)

    async def multi(self, ops: Sequence[Op]) -> list[Any]:
        await self._round_trip()
        results: list[Any] = self._write(lambda: self.server.commit(ops, self.session_id))
        return results

    # -- watches -------------------------------------------------------------------------------

    async def watch_data(
        self, path: str, callback: Callable[[bytes | None, ZnodeStat | None], None]
    ) -> Watch:
        await self._round_trip()
        watcher = _Watcher("data", path, callback, Watch())
        self._watchers.append(watcher)
        self._deliver(watcher)
        return watcher.watch

    async def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> Watch:
        await self._round_trip()
        if path not in self.server.nodes:
            raise NoNodeError()
        watcher = _Watcher("children", path, callback, Watch())
        self._watchers.append(watcher)
        self._deliver(watcher)
        return watcher.watch

    def notify(self, changed: set[tuple[str, str]]) -> None:
        for watcher in self._watchers:
            if watcher.pending or watcher.watch.cancelled:
                continue
            if (watcher.kind, watcher.path) in changed:
                watcher.pending = True
                asyncio.get_running_loop().call_soon(self._deliver, watcher)

    def _deliver(self, watcher: _Watcher) -> None:
        watcher.pending = False
        if watcher.watch.cancelled or watcher not in self._watchers:
            return
        node = self.server.nodes.get(watcher.path)
        if watcher.kind == "data":
            if node is None:
                watcher.callback(None, None)
            else:
                watcher.callback(node.data, self.server.stat(watcher.path))
        elif node is not None:
            watcher.callback(sorted(node.children))
