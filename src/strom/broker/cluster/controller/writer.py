"""The controller's writes and reads of znodes: every write one multi-op behind
``Check(/controller_epoch, version)``, the read-decide-write loop of a partition's state, and the
znodes it cannot parse -- skipped, counted and logged once, so one garbage znode never stops it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.exceptions import BadVersionError

from strom.broker.zk import znodes
from strom.broker.zk.client import AsyncZooKeeper, Check, Create, Delete, MultiOpFailed, NoNodeError, SetData

log = logging.getLogger("strom.broker.cluster.controller")


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
    ) -> None:
        self.epoch = epoch
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

    async def update_state(
        self,
        topic: str,
        partition: int,
        decide: Callable[[znodes.LeaderAndIsr], znodes.LeaderAndIsr | None],
        why: str,
    ) -> znodes.LeaderAndIsr | None:
        """Read the partition's state, ``decide`` the new one, write it at the version read; after a
        BadVersion (the leader changed its ISR meanwhile) read and decide again. Returns the state
        now in ZooKeeper (None: no such partition, or a state that cannot be parsed)."""
        path = znodes.partition_state_path(topic, partition)
        while True:
            got = await self._zk.get_or_none(path)
            if got is None:
                return None
            current = self._unparseable.state(path, got[0])
            if current is None:
                return None  # skipped, as a partition without a state
            new = decide(current)
            if new is None:
                return current
            try:
                await self.write([SetData(path, new.encode(), got[1].version)])
            except MultiOpFailed as e:
                if isinstance(e.cause, BadVersionError):
                    continue
                if isinstance(e.cause, NoNodeError):
                    return None
                raise
            log_ = log.info if new.leader != current.leader else log.debug
            log_(
                "partition state changed",
                extra={
                    "topic": topic,
                    "partition": partition,
                    "reason": why,
                    "leader": new.leader,
                    "previous_leader": current.leader,
                    "leader_epoch": new.leader_epoch,
                    "isr": new.isr,
                    "controller_epoch": self.epoch,
                },
            )
            return new
