"""The controller's writes and reads of znodes: every write one multi-op behind
``Check(/controller_epoch, version)``, the read-decide-write loop of a partition's state, and the
znodes it cannot parse -- skipped, counted and logged once, so one garbage znode never stops it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.exceptions import BadVersionError

from strom.broker.zk import znodes
from strom.broker.zk.client import AsyncZooKeeper, Check, Create, Delete, MultiOpFailed, NoNodeError, SetData

log = logging.getLogger("strom.broker.control_plane.controller")

# Partition states written in one multi-op, and the bytes such a write may take: each multi-op
# stays well below ZooKeeper's 1 MiB request limit (jute.maxbuffer).
STATES_PER_WRITE = 500
WRITE_BUDGET_BYTES = 400 * 1024


class ControllerMovedError(Exception):
    """This broker is no longer the controller: a write failed the epoch check, or its session
    changed since it was elected."""


class UnparseableZnodes:
    """The znodes the controller skips because it cannot parse them, each logged once (again only
    after it parsed in between)."""

    def __init__(self) -> None:
        self._paths: set[str] = set()

    def __len__(self) -> int:
        return len(self._paths)

    def skip(self, path: str, error: Exception) -> None:
        if path not in self._paths:
            self._paths.add(path)
            log.error(
                "skipping a znode that cannot be parsed",
                extra={"path": path, "error": repr(error), "unparseable_znodes": len(self._paths)},
            )

    def parsed(self, path: str) -> None:
        self._paths.discard(path)

    def topic(self, topic: str, data: bytes) -> znodes.TopicZNode | None:
        path = znodes.topic_path(topic)
        try:
            znode = znodes.TopicZNode.decode(data)
        except znodes.MALFORMED as e:
            self.skip(path, e)
            return None
        self.parsed(path)
        return znode

    def state(self, path: str, data: bytes) -> znodes.LeaderAndIsr | None:
        try:
            state = znodes.LeaderAndIsr.decode(data)
        except znodes.MALFORMED as e:
            self.skip(path, e)
            return None
        self.parsed(path)
        return state


class FencedWriter:
    """The writes of one controller term: fenced by the version of /controller_epoch it won, on the
    session that won it. ``close`` ends the term (every later write raises ControllerMovedError)."""

    def __init__(
        self,
        zk: AsyncZooKeeper,
        epoch: int,
        epoch_zk_version: int,
        session_id: int,
        unparseable: UnparseableZnodes,
        stats: DutyStats,
    ) -> None:
        self.epoch = epoch
        self.stats = stats
        self.epoch_zk_version = epoch_zk_version
        self._zk = zk
        self._session_id = session_id
        self._unparseable = unparseable
        self._closed = False

    def close(self) -> None:
        self._closed = True

    async def write(self, ops: Sequence[Create | SetData | Delete]) -> list[Any]:
        """``ops`` in one multi-op after Check(/controller_epoch, our version). Raises
        ControllerMovedError when fenced, MultiOpFailed (index into ``ops``) for other failures."""
        if self._closed or self._zk.session_id != self._session_id:
            raise ControllerMovedError("not the controller of this session")
        try:
            return (await self._zk.multi([Check(znodes.CONTROLLER_EPOCH, self.epoch_zk_version), *ops]))[1:]
        except MultiOpFailed as e:
            if e.index == 0:
                raise ControllerMovedError(f"controller epoch check failed: {type(e.cause).__name__}") from e
            raise MultiOpFailed(e.index - 1, e.op, e.cause) from e

    async def update_states(
        self, decisions: Mapping[tuple[str, int], Decide], why: str
    ) -> dict[tuple[str, int], znodes.LeaderAndIsr | None]:
        """Read the states of the partitions ``decisions`` names (pipelined), decide each one's new
        state, and write the changes at the versions read, in fenced multi-ops of at most
        ``STATES_PER_WRITE`` states (each with its change notification). A state that failed its
        version (the leader changed its ISR meanwhile) is read and decided again; the other states of
        its multi-op are written without it. Returns each partition's state now in ZooKeeper (None:
        no such partition, or a state that cannot be parsed)."""
        results: dict[tuple[str, int], znodes.LeaderAndIsr | None] = {}
        pending = sorted(decisions)
        while pending:
            paths = [znodes.partition_state_path(topic, partition) for topic, partition in pending]
            self.stats.read += len(paths)
            changes: list[_StateChange] = []
            for key, path, got in zip(pending, paths, await self._zk.get_many(paths), strict=True):
                current = self._unparseable.state(path, got[0]) if got is not None else None
                new = decisions[key](current) if got is not None and current is not None else None
                if got is None or current is None or new is None:
                    results[key] = current  # None: skipped, as a partition without a state
                else:
                    changes.append(_StateChange(key, path, current, new, new.encode(), got[1].version))
            outcomes = await asyncio.gather(
                *(self._write_states(chunk, why) for chunk in chunked(changes, _change_size))
            )
            pending = []
            for written, gone, stale in outcomes:
                results.update(written)
                results.update(dict.fromkeys(gone))
                pending += stale
            self.stats.retried += len(pending)
        return results

    async def _write_states(
        self, changes: list[_StateChange], why: str
    ) -> tuple[dict[tuple[str, int], znodes.LeaderAndIsr], list[tuple[str, int]], list[tuple[str, int]]]:
        """``changes`` in one fenced multi-op, less each one that fails (its znode gone or at
        another version): (the states written, the partitions gone, the partitions to read again)."""
        gone: list[tuple[str, int]] = []
        stale: list[tuple[str, int]] = []
        while changes:
            ops: list[Create | SetData | Delete] = [SetData(c.path, c.data, c.version) for c in changes]
            try:
                await self.write([*ops, state_change_notification([c.key for c in changes])])
            except MultiOpFailed as e:
                if e.index >= len(changes) or not isinstance(e.cause, (BadVersionError, NoNodeError)):
                    raise
                failed = changes.pop(e.index)
                (stale if isinstance(e.cause, BadVersionError) else gone).append(failed.key)
                continue
            self.stats.multis += 1
            self.stats.written += len(changes)
            for c in changes:
                _log_change(c, why, self.epoch)
            return {c.key: c.new for c in changes}, gone, stale
        return {}, gone, stale


Decide = Callable[[znodes.LeaderAndIsr], znodes.LeaderAndIsr | None]


@dataclass
class DutyStats:
    """What one controller event did to partition states: read, written, in how many multi-ops,
    and how many it read again after a BadVersion."""

    read: int = 0
    written: int = 0
    multis: int = 0
    retried: int = 0


@dataclass(frozen=True, slots=True)
class _StateChange:
    key: tuple[str, int]
    path: str
    current: znodes.LeaderAndIsr
    new: znodes.LeaderAndIsr
    data: bytes  # ``new`` encoded
    version: int


def state_change_notification(partitions: Sequence[tuple[str, int]]) -> Create:
    """The /isr_change_notification/isr_change_<seq> znode created in the same multi-op as the
    states of ``partitions``: brokers re-read just those."""
    return Create(
        f"{znodes.ISR_CHANGE_NOTIFICATION}/{znodes.ISR_CHANGE_PREFIX}",
        znodes.encode_partition_list(list(partitions)),
        sequence=True,
    )


T = TypeVar("T")


def chunked(items: Sequence[T], size_of: Callable[[T], int]) -> list[list[T]]:
    """``items`` in runs of at most STATES_PER_WRITE, each of at most WRITE_BUDGET_BYTES as ``size_of``
    counts them (a multi-op must stay well below ZooKeeper's 1 MiB request limit, jute.maxbuffer)."""
    chunks: list[list[T]] = []
    size = 0
    for item in items:
        item_size = size_of(item)
        if not chunks or len(chunks[-1]) >= STATES_PER_WRITE or size + item_size > WRITE_BUDGET_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += item_size
    return chunks


def _change_size(change: _StateChange) -> int:
    # The SetData op (path, data, version, headers) and the partition's entry in the notification.
    return 2 * len(change.path) + len(change.data) + 64


def _log_change(change: _StateChange, why: str, controller_epoch: int) -> None:
    log.debug(
        "partition state changed",
        extra={
            "topic": change.key[0],
            "partition": change.key[1],
            "reason": why,
            "leader": change.new.leader,
            "previous_leader": change.current.leader,
            "leader_epoch": change.new.leader_epoch,
            "isr": change.new.isr,
            "controller_epoch": controller_epoch,
        },
    )
